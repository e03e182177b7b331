"""A value derived from a constant inside a transformation: what a `FrozenConst` holds there.

A FrozenConst rebuilt from a leaf that is not a constant's own device buffer (a tracer, a
gradient, whatever `tree_map` produced) holds a `Derived` where a constant holds its
`_cache.Store`: the type stays, as a `Tracer` stands where a `jax.Array` stood, but it never
claims the original's host data. A concrete copy holds its `jax.Array` alone until something
asks for more (`FrozenConst._held`): a step rebuilds many.

Why not a subclass of FrozenConst: JAX keys pytree nodes by exact type, so a
subclass is a node of its own, and `jax.tree.map(f, model, grads)` over a model
and its gradients would fail on the structure mismatch (tests/test_training.py).
The handle stays one type; what it holds is one of two classes with the same
methods, reached through `FrozenConst._held`, and neither branches on which kind it is.
"""

# pyright: reportPrivateUsage=false
# (`rebuild` fills a new FrozenConst handle's private slots, as the class's own methods do.)

from __future__ import annotations

import threading
import types
import warnings
import weakref
from typing import Any, Protocol, TypeVar

import jax
import numpy as np
from jax.sharding import Sharding
from numpy.typing import DTypeLike

from ._cache import OWNER_REFS, Store, owner_of
from ._compat import DEBUG_CALLBACKS, DIFFERENTIATED, ArrayImpl, Tracer, frame_at
from ._convert import frozen_copy, to_numpy
from ._errors import FrozenConstTypeError, FrozenConstWarning
from ._frames import Said, find_user, raise_in
from ._host import HostPlan, freeze, human_bytes
from ._host_memory import HostMemory, Residency

# Taken by a derived value making its frozen copy (`Derived.frozen`).
_FROZEN_LOCK = threading.Lock()


class Derived:
    """A transformation's value in a FrozenConst's place: a leaf, and, on request, a frozen copy of it.

    To autodiff it is a constant, as the constant it stands for is: a value
    being differentiated reaches it only through `lax.stop_gradient`
    (`FrozenConst.tree_unflatten`), so `jax.grad` with respect to a tree holding
    a FrozenConst gives it a zero gradient (docs/jax.md, "Transformations"). A
    concrete leaf (a jitted function's output, an optimizer's update) is a
    `jax.Array` to a compiled program that closes over it.
    """

    __slots__ = ("__weakref__", "copy_store", "leaf")

    concrete = False
    # What a compiled program asks of what it keeps out (`_hoist`), as of a constant: a
    # derived value is no library's own table, and its leaf, used as it is, is never
    # transferred again behind anyone's back.
    origin = ""
    volatile = False

    # Served from `leaf`, never from a cache slot (`Store.hot`), whose hit checks what a cached
    # buffer can lose: so no hit is ever counted. Only `leaf` is set where one is made
    # (`copy_record`); `copy_store` on request.
    hot: None = None
    hits = 0
    leaf: Any
    copy_store: Store | None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.leaf.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = np.dtype(self.leaf.dtype)
        return dtype

    def device_dtype(self) -> np.dtype[Any]:
        """The leaf's dtype: a transformation's value is JAX's already."""
        return self.dtype

    def array(self, sharding: Sharding | None = None) -> Any:
        """The leaf (a derived value has no declared sharding)."""
        return self.leaf

    def frozen(self) -> Store:
        """A store of a frozen copy of the leaf, made once: no path hands out memory that
        JAX or anyone else could still write."""
        store: Store | None = getattr(self, "copy_store", None)  # unset until asked
        if store is None:
            with _FROZEN_LOCK:  # one copy, whichever thread asks first
                store = getattr(self, "copy_store", None)
                if store is None:
                    array = to_numpy(self.leaf, None)  # as it is: nothing to convert or check
                    store = self.copy_store = Store(freeze(HostPlan(array, array.dtype)))
        return store

    def whole(self, what: str) -> np.ndarray[Any, Any]:
        return self.frozen().host

    @property
    def fingerprint(self) -> str:
        return self.frozen().fingerprint

    def constant(self, what: str) -> Store:
        raise FrozenConstTypeError(
            f"`{what}` needs the constant itself, but this FrozenConst is a value derived from "
            f"one ({describe_leaf(self.leaf)}): what a transformation, a jitted function's output or "
            "an optimizer put in a constant's place. Call it on the original constant, and keep "
            "constants out of what you train and return (docs: Training)."
        )

    def remade(
        self,
        dtype: DTypeLike | None,
        choice: HostMemory,
        host_memory: HostMemory | None,
        residency: Residency | None,
    ) -> Store:
        """The store of `FrozenConst(x, dtype, ...)`: a frozen copy of the leaf, on the device
        unless asked."""
        host = frozen_copy(self.leaf, dtype, "the `FrozenConst` it received")
        return Store(host, choice, residency=residency or "device")

    def describe(self) -> str:
        return f"FrozenConst(derived from {self.leaf!r})"

    def arrays(self) -> list[jax.Array]:
        """None cached: a derived value has no device buffers of its own."""
        return []

    def evict(self, sharding: Sharding | None = None) -> None:
        """Nothing to evict."""


def describe_leaf(leaf: Any) -> str:
    """What `leaf` is, in words, without its data: kind, dtype, shape and size."""
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        return f"a `{type(leaf).__name__}`"
    kind = (
        "a traced value"
        if isinstance(leaf, Tracer)
        else "a jax.Array"
        if isinstance(leaf, jax.Array)
        else f"a `{type(leaf).__name__}`"
    )
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return f"{kind}, {np.dtype(dtype)}{list(shape)}, {human_bytes(nbytes)}"


# The advice of the derived-copy warning, by the library closest to the user's line on the
# stack when the copy was made: "jit" where JAX rebuilt a jitted function's outputs straight
# from the user's call, none where JAX's own functions of pytrees did (`jax.tree.map`,
# `vmap`, a collective).
_ADVICE = {
    "optax": "Give the optimizer only what it trains: `opt.init(frozenconst.partition(params)[0])`, "
    "and `opt.update` on that half.",
    "equinox": "Train `eqx.partition(model, frozenconst.is_trainable, is_leaf=frozenconst.is_frozen)[0]` "
    "and compile with `frozenconst.filter_jit`, which hands the constant itself back.",
    "flax": "In flax NNX, freeze the pretrained part with `frozenconst.nnx.freeze(module)`; in linen, "
    "give `optax` only the trainable params.",
    "jit": "Return only what the step changes (`frozenconst.partition(state)[0]`), or compile it "
    "with `frozenconst.filter_jit`, which hands the constant itself back.",
    "numpyro": "numpyro's `jit_model_args=True` carries the model's arguments through its sampling "
    "loop: close over the constant in the model instead, or leave `jit_model_args` off.",
    "": "Where an array is meant, pass `jnp.asarray(x)` (the constant's buffer, no copy); where "
    "training maps over parameters, keep constants out with `frozenconst.partition`.",
}
# Who put the copy there, by the same key; any other library by its name.
_WHO = {"jit": "A jitted function", "": "A JAX function of pytrees"}


def copy_record(leaf: Any) -> Derived:
    """A `Derived` around `leaf` (a copy's record, or what a trace rebuilds). `Derived` has no
    `__init__`, so the class call makes one without a Python frame, faster than `object.__new__`."""
    derived = Derived()
    derived.leaf = leaf
    return derived


class _CopyRef(weakref.ref):  # type: ignore[type-arg]  # (subscripted only when type checking)
    """A weak reference to a copy's buffer, in `COPY_REFS` under `key`, its id while it lived."""

    __slots__ = ("key",)
    key: int


# The device buffers of the copies `rebuild` made, by id, held weakly: a program that reads one
# takes it as a parameter, as a constant's (`buffer_owner`). Filed where the handle hands its buffer
# out as an array (`FrozenConst.__jax_array__`), not at a pytree flatten: a training loop passes
# copies on at every step. An entry goes as its array dies. No lock: one dict operation at a
# time, and an id is not reused before the weak references to its array were told it died.
COPY_REFS: dict[int, _CopyRef] = {}


def _copy_died(ref: _CopyRef) -> None:
    if COPY_REFS.get(ref.key) is ref:  # (the same buffer filed twice is filed by its latest)
        COPY_REFS.pop(ref.key, None)


def know_copy(array: Any) -> Any:
    """`array`, the buffer of a copy (`rebuild`), filed in `COPY_REFS` where it is not yet."""
    copy = COPY_REFS.get(id(array))
    if copy is None or copy() is not array:
        copy = _CopyRef(array, _copy_died)
        copy.key = id(array)
        COPY_REFS[copy.key] = copy
    return array


def buffer_owner(value: object) -> Store | Derived | None:
    """Whose buffer `value` is: a constant's (the very object), or a live copy's record (`rebuild`);
    None for any other value. The one answer to which arrays a compiled program keeps out."""
    key = id(value)
    ref = OWNER_REFS.get(key)
    if ref is not None:
        store = ref()
        # `sharding_of` confirms the very object (an id can be reused after an array dies).
        if store is not None and store.sharding_of(value) is not None:
            return store
    copy = COPY_REFS.get(key)
    array = None if copy is None else copy()
    # Alive, it is `value` (two live objects never share an id).
    if array is not None and not array.is_deleted():
        return copy_record(array)
    return None


# The record of every FrozenConst rebuilt around `None` (`eqx.partition`'s placeholder, made per
# frozen array per call): nothing about it is a copy's own, so one serves all.
NO_LEAF = copy_record(None)


class _Told(Said):
    """What the derived-copy warning has said since Python's warning filters last changed (`Said`).

    A call site is `(id(code), instruction)`: Python hashes a code object by its contents at every
    lookup; `codes` keeps each alive, so its id is not reused. `lines`: the user lines warned of.
    `sites`: each site of JAX's tree functions met, with the user lines it was reached from (the
    last last), as frames up (0: the site is the user's line) and that frame's call site, so that
    a copy made there again is decided by a lookup and a frame read, before any stack walk.
    """

    __slots__ = ("codes", "last", "lines", "site", "sites")

    def forget(self) -> None:
        """Forget everything said: Python's warning filters changed."""
        super().forget()
        self.lines: set[tuple[int, int]] = set()
        self.sites: dict[tuple[int, int], list[tuple[int, tuple[int, int]]]] = {}
        self.codes: dict[int, types.CodeType] = {}
        # The call site last found to be the user's line itself, as its code object (kept in
        # `codes`) and instruction: a loop's copies are made there again and again, decided
        # by two comparisons. Never the frame: that would keep its locals alive.
        self.last: tuple[object, int] = (None, -1)
        # The library's call site met last, as its code object and instruction, with its entry
        # of `sites` (frames up, the user's code's id and instruction): a tree's copies are
        # made there one after another, each decided by two comparisons and a frame read.
        self.site: tuple[object, int, int, int, int] = (None, -1, 0, 0, -1)


# The user lines kept per call site of JAX's tree functions (`_Told.sites`), the latest last.
_LINES_PER_SITE = 8

# What the warning has said: one object, forgotten in place where the filters changed.
TOLD = _Told()


def note_derived_copy(leaf: Any, caller: types.FrameType, node: type) -> None:
    """Warn, once per line of user code, that a FrozenConst was rebuilt around a new concrete
    array, a copy; `caller` called JAX's tree function. Called where `rebuild`'s inlined checks
    of `TOLD` did not decide the copy."""
    told = TOLD
    if told.stale():
        told.forget()
    site = (id(caller.f_code), caller.f_lasti)
    # A site reached from several user lines in turn (`jax.tree.map` called from two helpers,
    # two `eqx.filter_jit` steps): each line it was reached from is kept, and found again by
    # a frame read per line, without the stack walk.
    for depth, (code, lasti) in reversed(told.sites.get(site, ())):
        frame: types.FrameType | None = caller
        for _ in range(depth):
            frame = None if frame is None else frame.f_back
        if frame is not None and id(frame.f_code) == code and frame.f_lasti == lasti:
            if depth:
                told.site = (caller.f_code, caller.f_lasti, depth, code, lasti)
            else:
                told.last = (caller.f_code, caller.f_lasti)
            return
    _tell(told, caller, site, leaf, node)


def _tell(told: _Told, caller: types.FrameType, site: tuple[int, int], leaf: Any, node: type) -> None:
    """Find the user's line above `caller`, note where `site` was reached from, and warn if
    the line is new."""
    user, depth, library = find_user(caller)
    if user is caller:
        library, depth = "jit", 0  # no Python frame between: JAX's jit rebuilt its outputs in C++
    line = (id(user.f_code), user.f_lineno)
    if line not in told.lines:
        module_globals = user.f_globals
        count = _constants_rebuilt(caller, node)
        among = (
            "" if count is None else f"; the tree rebuilt there holds {count} FrozenConst{'s' * (count != 1)}"
        )
        try:
            warnings.warn_explicit(
                f"{_WHO.get(library, library)} put a copy of FrozenConst values "
                f"({describe_leaf(leaf)}"
                f"{among}) where the constant was, not the constant's own buffer: a second device buffer, "
                "and no constant (an optimizer may change it; weight decay does). "
                f'{_ADVICE.get(library, _ADVICE[""])} Said once per line (docs: "Training").',
                FrozenConstWarning,
                user.f_code.co_filename,
                user.f_lineno,
                module=module_globals.get("__name__", "<string>"),
                # As `warnings.warn` passes them (not `module_globals`: its source lookup fails on
                # code built by `exec`, where `warnings.warn` works).
                registry=module_globals.setdefault("__warningregistry__", {}),
            )
        except FrozenConstWarning as error:
            # Made an error by the filters: not told, so said (raised) again next time, and
            # raised once the library's rebuild has returned (`_frames.raise_in`).
            if not raise_in(user, error):
                raise
            return
        told.lines.add(line)
    # Told: the site and the line it was reached from are recorded, and decided without a walk.
    entry = (depth, (id(user.f_code), user.f_lasti))
    known = told.sites.setdefault(site, [])
    if entry not in known:
        known.append(entry)
        del known[:-_LINES_PER_SITE]
    if depth:
        told.site = (caller.f_code, caller.f_lasti, depth, id(user.f_code), user.f_lasti)
    told.codes.setdefault(id(caller.f_code), caller.f_code)
    told.codes.setdefault(id(user.f_code), user.f_code)


def _constants_rebuilt(caller: types.FrameType, node: type) -> int | None:
    """How many FrozenConsts (nodes of type `node`) the tree being rebuilt holds, read from the
    `PyTreeDef` JAX's tree function holds in a local; None where it holds none (jit's C++ path)."""
    for value in caller.f_locals.values():
        if isinstance(value, jax.tree_util.PyTreeDef):
            count, pending = 0, [value]
            while pending:
                tree = pending.pop()
                data = tree.node_data()
                count += data is not None and data[0] is node
                pending += tree.children()
            return count
    return None


# -- what a rebuilt leaf becomes ---------------------------------------------------------------


class CopyMark:
    """The `_sharding` of a handle on a copy `rebuild` made: its `_store` is the copy's
    `jax.Array` itself (`FrozenConst._held`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "COPY"


COPY = CopyMark()
# `object.__new__`, bound once: a handle is made per pytree rebuild (`FrozenConst._of` too).
new_handle = object.__new__


def _in_debug_callback(caller: types.FrameType) -> bool:
    """Whether JAX's tree function was called by a callback's rebuild of its arguments
    (`jax.debug.print`, `pure_callback`, ...): there the new array is the value it receives, no copy."""
    if caller.f_globals.get("__name__") in DEBUG_CALLBACKS:
        return True
    above = caller.f_back
    return above is not None and above.f_globals.get("__name__") in DEBUG_CALLBACKS


class Handle(Protocol):
    """What `rebuild` fills: a FrozenConst handle (`_frozen`, above this module), by its slots."""

    _store: Store | Derived
    _sharding: Sharding | CopyMark | None

    @classmethod
    def _of(cls: type[_H], store: Store | Derived, sharding: Sharding | None = None) -> _H: ...


_H = TypeVar("_H", bound=Handle)


def rebuild(cls: type[_H], aux_data: None, children: Any) -> _H | np.ndarray[Any, Any]:
    """Rebuild a FrozenConst from a leaf (`FrozenConst.tree_unflatten`): from the constant's own
    buffer, the constant; from NumPy data, that array; from anything else, a derived value (a
    differentiated one stopped: no gradient), which warns once per user line where it is a new
    concrete array: nothing else tells a user their model no longer holds the constant
    (docs/training.md, "What each idiom does")."""
    (leaf,) = children
    # `owner_of`, the derived-copy warning's checks and `_of`, inlined, and a concrete
    # array's case first: a jitted step returning many FrozenConsts rebuilds each one per
    # call (`python -m benchmarks training`; eqx partition/combine, NNX split/merge).
    if type(leaf) is ArrayImpl:
        ref = OWNER_REFS.get(id(leaf))
        if ref is not None:
            store = ref()
            if store is not None:
                if leaf is store.hot:
                    # The default placement's buffer (served only where a use without a
                    # sharding gets none, `Store._serve`): what `sharding_of` finds,
                    # without its lock and walk.
                    handle = new_handle(cls)
                    handle._store = store
                    handle._sharding = None
                    return handle
                owner = store.sharding_of(leaf)
                if owner is not None:
                    return cls._of(*owner)
        # A new concrete array: a copy.
        caller = frame_at(1)  # the code that called JAX's tree function
        if _in_debug_callback(caller):
            return leaf  # type: ignore[return-value]  # the value `jax.debug.print` shows, as a `jax.Array`
        told = TOLD
        code, lasti = told.last
        if caller.f_code is not code or caller.f_lasti != lasti or told.stale():
            # A site reached through a library's code (`eqx.combine`'s `tree_map`), decided where
            # the user's line it was last reached from reaches it now: `told.site`, then `told.sites`.
            site_code, site_lasti, depth, user_code, user_lasti = told.site
            if caller.f_code is not site_code or caller.f_lasti != site_lasti:
                known = told.sites.get((id(caller.f_code), caller.f_lasti))
                if known is None:
                    depth = -1  # a site not met before
                else:
                    depth, (user_code, user_lasti) = known[-1]
                    if depth:
                        told.site = (caller.f_code, caller.f_lasti, depth, user_code, user_lasti)
            if depth < 0 or told.stale():
                note_derived_copy(leaf, caller, cls)
            elif not depth:
                told.last = (caller.f_code, caller.f_lasti)  # the user's own line, told before
            else:
                try:
                    user = frame_at(1 + depth)  # this frame, then `caller`'s, then up
                except ValueError:
                    # The stack is shallower than where this site was reached from before:
                    # another user line.
                    user = None
                if user is None or user.f_lasti != user_lasti or id(user.f_code) != user_code:
                    note_derived_copy(leaf, caller, cls)
        # The array itself, its record made where first asked for (`_held`), and the array
        # known for what it is once the handle hands it out as an array (`know_copy`).
        handle = new_handle(cls)
        handle._store = leaf  # type: ignore[assignment]  # the array, not a record: `COPY` says so
        handle._sharding = COPY
        return handle
    elif leaf is None:
        # The placeholder `eqx.partition` leaves in the half without arrays (equinox's
        # `filter_jit` makes one per constant per call): one shared record.
        derived: Derived = NO_LEAF
    else:
        if isinstance(leaf, DIFFERENTIATED):
            # A constant to autodiff: the value without its tangent (where JAX's
            # autodiff flattened the constant itself, that is its own buffer again).
            leaf = jax.lax.stop_gradient(leaf)
        elif type(leaf) is np.ndarray:
            # NumPy data in the constant's place (`jax.device_get(x)`): that array, as for a
            # `jax.Array` leaf.
            return leaf
        elif ArrayImpl is None:  # a JAX without `ArrayImpl` (`_compat`): owners by lookup
            owner = owner_of(leaf)
            if owner is not None:
                return cls._of(*owner)
        derived = copy_record(leaf)  # a tracer: what a trace rebuilds
    handle = new_handle(cls)
    handle._store = derived
    handle._sharding = None
    return handle
