"""Where it is decided that a compiled program keeps a FrozenConst out, or embeds it and says so.

Every program JAX compiles (`jax.jit` and all built on it, eager `jax.numpy` calls, `pmap`,
`jax.export`) is lowered through one function, which `lower` wraps (`_install`): each FrozenConst
buffer the program uses above `EMBED_MAX_BYTES` becomes a parameter of the executable, through
JAX's own machinery for hoisted constants (passed at each call, on the C++ fast path). Under
JAX's default pipeline `hoist` first turns such a buffer into a literal; under the simplified
one JAX hoists literals itself, and `const_args` passes a constant once, not once per use.

What cannot be kept out is embedded, as JAX embeds any array, and a `FrozenConstWarning` says so
once per constant, case and line, with the case's fix (`_FIXES`). A jitted call that donates a
state holding a constant keeps the constant's buffer (`_undonated`). A program without a
FrozenConst lowers exactly as JAX lowers it.

A program that holds a constant's buffer must never outlive it: where the buffer is dropped
(`x.evict()`, a budget's eviction), `dropped` drops the programs and traces of the jitted
functions whose programs held it, made again at their next call with the constant's new buffer;
where that does not free the buffer, or it was lost (donated, deleted), it clears JAX's caches.
A constant that dies before its trace is lowered (made inside the jitted function) leaves its
buffers known to that lowering while anything holds them (`RELICS`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import jax
import numpy as np

from ._cache import OWNER_REFS, Store
from ._compat import frame_at
from ._compat_lowering import (
    HOISTING,
    SIMPLIFIED_CONSTANTS,
    Literal,
    clear_caches,
    closed_parts,
    device_mismatch,
    donated_arguments,
    hoisted_by_jax,
    hoisted_values,
    jax_embed_max_bytes,
    jit_entry,
    mutates,
    numpy_of,
    release_jitted,
    rewire_hoisted,
)
from ._derived import COPY_REFS, Derived, buffer_owner
from ._errors import FrozenConstRuntimeError, FrozenConstWarning
from ._frames import Told, user_stacklevel
from ._host import human_bytes
from ._jaxprs import hoist, sub_programs, walk, where
from ._plan import Buffer, Decision, Lowering, plan

# A FrozenConst of at most this many bytes stays embedded under JAX's default pipeline, as JAX
# embeds any small array: each parameter adds to every call (`python -m benchmarks anyjit`), an
# embedded small table only its bytes. `frozenconst.jit(f, embed_max_bytes=N)` sets another.
EMBED_MAX_BYTES = 4096


class Options:
    """What a frozenconst wrapper on the stack asks of the programs lowered for it (JAX shares them
    between the jits of one function: the first wrapper's options are the program's)."""

    __slots__ = ("embed_max_bytes", "fun", "named")

    def __init__(self, embed_max_bytes: int, fun: Callable[..., Any] | None = None) -> None:
        self.embed_max_bytes = embed_max_bytes
        # The wrapped function (None: no wrapper), and whether the other large arrays its
        # programs embed were named (`_name_embedded`, once per function).
        self.fun = fun
        self.named = False


_DEFAULT = Options(EMBED_MAX_BYTES)
# The frames of frozenconst's own wrappers (`JitWrapped.__call__`, `.lower`, `.trace`), each
# with how to read its options off it: a program lowered below such a frame is that wrapper's.
# Found by walking up the stack, at lowering only (never on a cached call).
WRAPPER_FRAMES: dict[types.CodeType, Callable[[types.FrameType], Options | None]] = {}


class _Lowering(threading.local):
    """The lowering in progress in this thread: which buffers are kept out, and what
    `const_args` answered for each program of it."""

    def __init__(self) -> None:
        self.keep_out: dict[int, Any] | None = None
        self.answers: dict[int, tuple[Any, list[tuple[Any, Any]]]] = {}
        # `frozenconst.export` in progress: each constant's buffer (by id) to its position among
        # the exported program's constant inputs (`export_inputs`); None otherwise.
        self.exporting: dict[int, int] | None = None
        # The kept-out buffers (by id) a level with effects on its inputs kept embedded (`hoist`).
        self.stuck: set[int] = set()


_lowering = _Lowering()


class _Jitted(NamedTuple):
    """A jitted function whose programs hold a constant's buffer: weakly, with its options."""

    fun: weakref.ref[Any]
    info: Any


class _Holders:
    """The constants some compiled program holds as a parameter, each with the jitted functions
    whose programs hold it (None: a program of another caller), until those programs are dropped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stores: weakref.WeakKeyDictionary[Store, list[_Jitted] | None] = weakref.WeakKeyDictionary()

    def add(self, owners: list[Owner], entry: tuple[Any, Any] | None) -> None:
        jitted = _jitted(entry)
        with self.lock:
            for store in (o for o in owners if isinstance(o, Store)):
                known = self.stores.get(store, [])
                self.stores[store] = None if known is None or jitted is None else _joined(known, jitted)

    def release(self, store: Store, held: bool) -> tuple[bool, list[_Jitted] | None]:
        """Whether a program may hold `store`'s buffer (or a trace: `held`, something besides the
        store still holds it), and the jitted functions whose programs do (None: not all known)."""
        with self.lock:
            if store not in self.stores:
                return held, None
            return True, self.stores.pop(store)

    def forget(self) -> None:
        """Every program was dropped."""
        with self.lock:
            self.stores.clear()


HOLDERS = _Holders()


def _jitted(entry: tuple[Any, Any] | None) -> _Jitted | None:
    """The jitted function `jit_entry` found, or None (none, or one that takes no weak reference)."""
    if entry is None:
        return None
    try:
        return _Jitted(weakref.ref(entry[0]), entry[1])
    except TypeError:
        return None


def _joined(known: list[_Jitted], new: _Jitted) -> list[_Jitted]:
    """`known` and `new`, each function with its options once, the dead ones left out."""
    fun = new.fun()
    return [j for j in known if j.fun() is not None and not (j.fun() is fun and j.info == new.info)] + [new]


class _Relic:
    """A device buffer of a constant that died while something else still held it (a trace of a
    function that made the constant): its lowering keeps the buffer out as a live constant's."""

    __slots__ = ("__weakref__", "buffer", "origin", "placed")
    # Never deleted behind our back as far as anyone can tell: no constant serves it any more.
    volatile = False
    # A constant's buffer, warned of where embedded as a live constant's is.
    concrete = True

    def __init__(self, buffer: weakref.ref[jax.Array], origin: str) -> None:
        self.buffer, self.origin = buffer, origin
        self.placed: dict[Any, jax.Array] = {}

    def array(self, sharding: Any) -> jax.Array:
        """The buffer's data placed with `sharding`, copied from the buffer once."""
        found = self.placed.get(sharding)
        if found is None:
            found = self.placed[sharding] = jax.device_put(self.buffer(), sharding)
        return found


class _Relics:
    """The buffers of dead constants something else still holds, by id, until the buffer dies. Told
    from a store's `__del__`, which runs anywhere: hence a reentrant lock, and no global read."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.found: dict[int, _Relic] = {}
        self.make, self.ref, self.partial = _Relic, weakref.ref, functools.partial

    def outlived(self, buffers: list[jax.Array], origin: str) -> None:
        for buffer in buffers:
            if buffer.is_deleted():
                continue
            key = id(buffer)
            relic = self.make(self.ref(buffer, self.partial(self.forget, key)), origin)
            with self.lock:
                self.found[key] = relic

    def forget(self, key: int, _dead: object = None) -> None:
        with self.lock:
            self.found.pop(key, None)

    def of(self, value: Any) -> _Relic | None:
        """The relic whose buffer `value` is (the very object), if any."""
        relic = self.found.get(id(value))
        return relic if relic is not None and relic.buffer() is value else None


RELICS = _Relics()
# What a program's FrozenConst buffer belongs to: a constant's store, a copy's record, or a relic.
Owner = Store | Derived | _Relic


def store_of(value: object) -> Owner | None:
    """Whose buffer `value` is: a constant's or a copy's (`buffer_owner`), or a dead constant's
    still held (`RELICS`); None for any other. (`_derived.rebuild` inlines it, marked there.)"""
    owner: Owner | None = buffer_owner(value)
    return owner if owner is not None else RELICS.of(value)


def none_known() -> bool:
    """Whether no array is a constant's buffer now: every program lowers as JAX lowers it."""
    return not OWNER_REFS and not COPY_REFS and not RELICS.found


def lowering_here(threshold: int = EMBED_MAX_BYTES, **how: bool) -> Lowering:
    """A lowering in this process under JAX's constant pipeline, with `threshold` (`_plan`)."""
    return Lowering(SIMPLIFIED_CONSTANTS, threshold, jax_embed_max_bytes(), **how)


def buffer_found(value: Any, owner: Owner | None = None, nbytes: int | None = None) -> Buffer:
    """What `_plan` reads of `value`, a buffer of `owner` (or another array a program uses)."""
    return Buffer(
        _nbytes(value) if nbytes is None else nbytes,
        not getattr(value, "shape", ()),
        owner is not None and owner.volatile,
        bool(getattr(value, "committed", False)),
    )


def meet_losses() -> bool:
    """Make again each buffer a compiled program holds that was deleted behind our back (the
    programs compiled again at their next call): True where there was one."""
    return any([store.meet_losses() for store in list(HOLDERS.stores)])


def dropped(store: Store, held: bool, left: list[weakref.ref[jax.Array]] | None) -> None:
    """Buffers of `store` were evicted (`left`: weak references to them) or lost (None): the
    programs that took one as a parameter are dropped, those of its jitted functions alone where
    they are known and that frees the buffers; else JAX's caches are cleared, as they are where
    something else holds one (`held`: a trace the next `jax.jit` would lower with it)."""
    holds, jitted = HOLDERS.release(store, held)
    if not holds:
        return
    if jitted is not None and left is not None:
        for each in jitted:
            fun = each.fun()
            if fun is not None:
                release_jitted(fun, each.info)
            del fun
        if not any(ref() is not None for ref in left):
            return
    # A program of another caller, a trace of an inner `jax.jit` the next trace reuses, or the
    # user's own reference: only clearing every cache is sure to let go.
    HOLDERS.forget()
    clear_caches()


# -- the lowering ---------------------------------------------------------------------------


def lower(original: Callable[..., Any], closed: Any, *args: Any, **kwargs: Any) -> Any:
    """JAX's `lower_sharding_computation(closed, ...)`, with the FrozenConsts kept out."""
    outer_keep, outer_answers, outer_stuck = _lowering.keep_out, _lowering.answers, _lowering.stuck
    _lowering.keep_out, _lowering.answers = None, {}  # a lowering inside this one starts clean
    try:
        if HOISTING is None:
            return original(closed, *args, **kwargs)
        options = _options()
        if options.fun is not None and not options.named and not SIMPLIFIED_CONSTANTS:
            _name_embedded(closed, options)
        if none_known():
            return original(closed, *args, **kwargs)
        found = _owned(closed)
        if HOISTING.donates(args, kwargs):
            args, kwargs = _undonated(args, kwargs)
        if not found:
            return original(closed, *args, **kwargs)
        return _lower_owned(original, found, options, closed, args, kwargs)
    finally:
        _lowering.keep_out, _lowering.answers, _lowering.stuck = outer_keep, outer_answers, outer_stuck


class _Use:
    """A FrozenConst buffer a program uses: its store (a known copy's record), and the first line
    of user code using it."""

    __slots__ = ("line", "store", "value")

    def __init__(self, value: Any, store: Owner, line: str | None) -> None:
        self.value, self.store, self.line = value, store, line


def _owned(closed: Any, literals: bool = SIMPLIFIED_CONSTANTS) -> dict[int, _Use]:
    """Each FrozenConst buffer `closed` uses (a constant's, or a known copy's: `buffer_owner`), at
    every level, with its first recorded line."""
    found: dict[int, _Use] = {}
    try:
        for value, eqn in walk(closed, literals=literals):
            key = id(value)
            use = found.get(key)
            if use is None:
                owner = store_of(value)
                if owner is None:
                    continue
                found[key] = _Use(value, owner, where(eqn))
            elif use.line is None:
                use.line = where(eqn)
    except Exception:  # a program this walk does not understand: lowered as JAX lowers it
        return {}
    return found


def _lower_owned(
    original: Callable[..., Any],
    found: dict[int, _Use],
    options: Options,
    closed: Any,
    args: Any,
    kwargs: Any,
) -> Any:
    assert HOISTING is not None
    own = HOISTING.own_lowering(kwargs)
    if own is not None:
        inputs = _lowering.exporting
        if own == "export" and inputs is not None:
            return _lower_for_export(original, found, inputs, closed, args, kwargs)
        # Someone's own lowering (`jax.export`: a serialized program carries its constants).
        _warn(list(found.values()), own)
        return original(closed, *args, **kwargs)
    mesh = HOISTING.devices_of(args, kwargs)
    keep_out, placed, donated = _planned(
        found, lowering_here(options.embed_max_bytes, mesh=mesh is not None), mesh
    )
    if not keep_out and not (SIMPLIFIED_CONSTANTS and donated):
        # (Under the simplified pipeline JAX would hoist a donated constant: `const_args` embeds it.)
        return original(closed, *args, **kwargs)
    try:
        return _held(original, found, closed, keep_out, placed, args, kwargs)
    except Exception as err:  # JAX refused the parameters (a device mismatch), or the user's error
        refused, mismatch = _first_line(err), device_mismatch(err)
        del err  # its traceback holds this frame
    target = HOISTING.devices_of(args, kwargs, single=True) if mismatch else None
    if target is not None:
        with contextlib.suppress(Exception):  # not the placement, then: embedded below, or the user's error
            kept, moved = _moved(found, keep_out, placed, target)
            return _held(original, found, closed, kept, moved, args, kwargs)
    # Every FrozenConst embedded, as JAX's default pipeline embeds any array; where that fails
    # too, the program as JAX lowers it, whose error (the user's own) is raised as it is.
    try:
        lowered = _held(original, found, closed, {}, {}, args, kwargs)
    except Exception:
        return original(closed, *args, **kwargs)
    _warn([u for u in found.values() if not u.store.volatile], "refused", refused)
    return lowered


def _planned(
    found: dict[int, _Use], lowering: Lowering, mesh: Any
) -> tuple[dict[int, Any], dict[int, Any], bool]:
    """The buffers `lowering` keeps out (by id), those placed over `mesh` first (by the id of the
    buffer each stands for), and whether a `volatile` constant is embedded (told at `Store._lost`)."""
    keep_out: dict[int, Any] = {}
    placed: dict[int, Any] = {}
    donated = False
    for key, use in found.items():
        decision = plan(buffer_found(use.value, use.store), lowering)
        donated = donated or use.store.volatile
        if decision is Decision.EMBED:
            continue
        value = use.value
        if decision is Decision.PLACE:  # made once per constant and mesh (`Store.array`)
            value = placed[key] = _placed(use.store, mesh)
        keep_out[id(value)] = value
    return keep_out, placed, donated


def _moved(
    found: dict[int, _Use], keep_out: dict[int, Any], placed: dict[int, Any], target: Any
) -> tuple[dict[int, Any], dict[int, Any]]:
    """`keep_out` and `placed` (`_planned`) with each constant committed elsewhere than the program
    runs (`x.on(d1)` in a program on d0) placed where it runs: a parameter, not embedded."""
    moved = dict(placed)
    for key, use in found.items():
        value = placed.get(key, use.value)
        if id(value) in keep_out and value.sharding.device_set != target.device_set:
            moved[key] = _placed(use.store, target)
    kept = {
        id(moved.get(k, u.value)): moved.get(k, u.value)
        for k, u in found.items()
        if id(placed.get(k, u.value)) in keep_out
    }
    return kept, moved


@contextlib.contextmanager
def export_inputs(positions: dict[int, int]) -> Generator[None, None, None]:
    """Within: the program `jax.export` lowers in this thread takes each buffer in `positions`
    (by id) from its constant input at that position (`frozenconst.export`, `_export`)."""
    outer = _lowering.exporting
    _lowering.exporting = positions
    try:
        yield
    finally:
        _lowering.exporting = outer


def _lower_for_export(
    original: Callable[..., Any],
    found: dict[int, _Use],
    inputs: dict[int, int],
    closed: Any,
    args: Any,
    kwargs: Any,
) -> Any:
    """The exported program `g(constants, *args)` lowered with the FrozenConst buffers hoisted as
    parameters, each wired to the input of `g` carrying it; every other array embedded."""
    assert HOISTING is not None
    keep_out = {id(u.value): u.value for u in found.values() if id(u.value) in inputs}
    if not keep_out:
        return original(closed, *args, **kwargs)
    program = closed if SIMPLIFIED_CONSTANTS else hoist(closed, keep_out)
    kwargs = HOISTING.hoisting(HOISTING.keeping_inputs(kwargs))
    _lowering.keep_out, _lowering.stuck = keep_out, set()
    try:
        lowering = original(program, *args, **kwargs)
    finally:
        _lowering.keep_out, _lowering.answers = None, {}
    values = hoisted_values(lowering)
    wired = None if values is None else [inputs.get(id(v), -1) for v in values]
    if wired is None or -1 in wired or not rewire_hoisted(lowering, wired):
        raise FrozenConstRuntimeError(
            f"frozenconst.export cannot keep FrozenConsts out of the exported program on jax "
            f"{jax.__version__} (its lowering did not hoist them as parameters). Pass the constants "
            "to the function as arguments and export it with `jax.export`."
        )
    return lowering


def _held(
    original: Callable[..., Any],
    found: dict[int, _Use],
    closed: Any,
    keep_out: dict[int, Any],
    placed: dict[int, Any],
    args: Any,
    kwargs: Any,
) -> Any:
    """`closed` lowered with the buffers in `keep_out` as parameters (each use of a buffer in
    `placed` given the buffer it maps to), their owners recorded as held by a program, and every
    other FrozenConst buffer embedded; those in `keep_out` that a level with effects on its
    inputs kept embedded are said."""
    assert HOISTING is not None
    stuck: set[int] = set()
    program = closed
    if placed:
        program = hoist(closed, {} if SIMPLIFIED_CONSTANTS else keep_out, placed, stuck)
    if not SIMPLIFIED_CONSTANTS:
        if not keep_out:
            return original(closed, *args, **kwargs)
        if not placed:
            program = hoist(closed, keep_out, stuck=stuck)
        if HOISTING.discharge is None and mutates(closed_parts(closed)[0]):
            stuck.update(keep_out)  # JAX's tracing it again (`discharged`) embeds them all
        kwargs = HOISTING.hoisting(kwargs)
    _lowering.keep_out, _lowering.stuck = keep_out, stuck
    try:
        lowered = original(program, *args, **kwargs)
    finally:
        _lowering.keep_out, _lowering.answers = None, {}
    HOLDERS.add([u.store for k, u in found.items() if id(placed.get(k, u.value)) in keep_out], jit_entry())
    if stuck:
        _warn(
            [u for k, u in found.items() if id(placed.get(k, u.value)) in stuck], "effects", jax.__version__
        )
    return lowered


def discharged(original: Callable[..., Any], closed: Any, *args: Any) -> Any:
    """JAX's `_discharge_refs_jaxpr(closed, ...)` in `lower`, the kept-out buffers hoisted again:
    its tracing a program with mutable references again embeds the literals `hoist` made."""
    out = original(closed, *args)
    keep_out = _lowering.keep_out
    if not keep_out or SIMPLIFIED_CONSTANTS or out[0] is closed:
        return out
    stuck: set[int] = set()
    program = hoist(out[0], keep_out, stuck=stuck)
    _lowering.stuck.clear()  # what the program before was left holding, superseded
    _lowering.stuck.update(stuck)
    return (program, *out[1:])


def _placed(owner: Owner, sharding: Any) -> jax.Array:
    """The constant's data placed with `sharding` (once per placement): a transfer of frozenconst's
    own, which no `jax.transfer_guard` of the user's refuses (JAX would embed a `jax.Array`)."""
    with jax.transfer_guard("allow"):
        return owner.array(sharding)


def _undonated(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """`lower`'s arguments with every FrozenConst buffer the call donates kept, else deleted and
    transferred again at every call. Where no call is found (`.lower()`), `Store._lost` meets it."""
    kept = {index for index, value in donated_arguments() if store_of(value) is not None}
    if not kept:
        return args, kwargs
    assert HOISTING is not None
    return HOISTING.undonated(args, kwargs, kept)


def _name_embedded(closed: Any, options: Options) -> None:
    """Name, once per frozenconst wrapper, the large arrays other than FrozenConsts (a
    `jax.Array`, a NumPy array) that its program closes over: JAX's default pipeline embeds them."""
    large: list[Any] = []
    seen: set[int] = set()
    try:
        for value, _ in walk(closed, literals=False):
            if id(value) in seen or store_of(value) is not None:
                continue
            seen.add(id(value))
            array: Any = numpy_of(value)
            if array is None and isinstance(value, jax.Array):
                array = value
            if array is not None and _nbytes(array) > options.embed_max_bytes:
                large.append(array)
    except Exception:  # a program this walk does not understand: nothing said
        return
    if not large:
        return
    fun = options.fun
    names = ", ".join(f"{_kind(a)} {np.dtype(a.dtype)}{list(a.shape)} ({_found(fun, a)})" for a in large)
    warnings.warn(
        f"frozenconst.jit: `{getattr(fun, '__qualname__', fun)!s}` closes over {names}, which JAX's "
        "default constant pipeline embeds in the compiled program, as jax.jit does (frozenconst "
        f"keeps out FrozenConsts above {options.embed_max_bytes} bytes, `embed_max_bytes`). Wrap "
        "each once in `frozenconst.FrozenConst`, or pass it as an argument.",
        FrozenConstWarning,
        stacklevel=user_stacklevel(),
    )
    options.named = True  # after the warning: one raised as an error is said again


def _kind(array: Any) -> str:
    return "a jax.Array" if isinstance(array, jax.Array) else "a NumPy array"


def _same(array: Any, value: Any) -> bool:
    if value is array:
        return True
    # JAX records a NumPy constant as a view of it (`TypedNdArray`, from jax 0.9).
    return isinstance(value, np.ndarray) and isinstance(array, np.ndarray) and array.base is value


def _found(fun: Any, array: Any) -> str:
    """Where `fun` reaches `array`, in words: closed over, a global, or only by tracing."""
    unwrapped: Any = inspect.unwrap(fun)
    code = getattr(unwrapped, "__code__", None)
    cells = getattr(unwrapped, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, cells, strict=False):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if _same(array, contents):
                return f"closed over as `{name}`"
        module_globals = getattr(unwrapped, "__globals__", {})
        for name in code.co_names:
            if name in module_globals and _same(array, module_globals[name]):
                return f"the global `{name}`"
    return "reached while tracing: an attribute, an entry, a derived FrozenConst's value"


def const_args(jaxpr: Any) -> list[tuple[Any, Any]]:
    """JAX's `core.jaxpr_const_args(jaxpr)`, in the lowering `lower` runs: the buffers kept out,
    one entry per buffer however many uses, beside whatever JAX itself hoists; elsewhere, JAX's."""
    assert HOISTING is not None
    keep_out = _lowering.keep_out
    if keep_out is None:
        return HOISTING.const_args(jaxpr)
    answers = _lowering.answers
    known = answers.get(id(jaxpr))
    if known is not None:
        return known[1]
    found: dict[Any, tuple[Any, Any]] = {}
    if SIMPLIFIED_CONSTANTS:
        exporting = _lowering.exporting is not None
        for value, aval in HOISTING.const_args(jaxpr):
            if keep_out.get(id(value)) is value:  # a constant's (or a known copy's) buffer kept out
                found.setdefault((id(value), aval), (value, aval))
            elif not exporting and store_of(value) is None:
                # JAX's own, as JAX hoists it (an exported program embeds every other array, as
                # jax.export does)
                found[("jax", len(found))] = (value, aval)
            # else a FrozenConst that must not be held (donated): embedded
    else:
        for value, aval in _literals(jaxpr, keep_out):
            found.setdefault((id(value), aval), (value, aval))
    answer = list(found.values())
    answers[id(jaxpr)] = (jaxpr, answer)  # the program kept, so that its id stays its own
    return answer


def _literals(jaxpr: Any, keep_out: dict[int, Any]) -> list[tuple[Any, Any]]:
    """The kept-out literals of `jaxpr` and of the programs nested in it (their order fixed by
    the walk, so that a nested program's parameters come in the same order at every level)."""
    out = [(var.val, var.aval) for var in jaxpr.outvars if _kept(var, keep_out)]
    for eqn in jaxpr.eqns:
        out.extend((var.val, var.aval) for var in eqn.invars if _kept(var, keep_out))
        for param in eqn.params.values():
            # The open programs, as JAX hands them to `jaxpr_const_args`.
            for sub in sub_programs(param):
                out.extend(const_args(closed_parts(sub)[0]))
    return out


def _kept(var: Any, keep_out: dict[int, Any]) -> bool:
    return isinstance(var, Literal) and keep_out.get(id(var.val)) is var.val


def _options() -> Options:
    """The options of the innermost frozenconst wrapper this lowering runs under, else the default."""
    if WRAPPER_FRAMES:
        frame: types.FrameType | None = frame_at(2)
        while frame is not None:
            read = WRAPPER_FRAMES.get(frame.f_code)
            if read is not None:
                found = read(frame)
                if found is not None:
                    return found
            frame = frame.f_back
    return _DEFAULT


def _nbytes(value: Any) -> int:
    nbytes: int = getattr(value, "nbytes", 0)
    return nbytes


def _first_line(err: BaseException) -> str:
    if device_mismatch(err):
        return "it is committed to other devices than the program's"
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


# -- what is said ---------------------------------------------------------------------------


# What the embedding warning said, per constant: once per case and line of user code.
_told = Told()

_FIXES = {
    "export": "An exported program carries its constants (jax.export serializes no arrays): "
    "`frozenconst.export` keeps them out and stores them beside the program",
    "lowering": "This program is lowered with lowering parameters of its own, which JAX's hoisting "
    "does not serve: pass the constant to the function as an argument to keep it out",
    "refused": "JAX refused it as a parameter of this program ({reason}). Place the constant where "
    "the program runs (`x.placed(device)`), or pass it as an argument",
    "effects": "The program reads or writes a mutable reference (`jax.new_ref`), and on jax {reason} "
    "frozenconst cannot keep the constant out of the pure program JAX makes of it: pass the constant "
    "to the function as an argument to keep it out",
    "unsupported": "frozenconst cannot reach JAX's lowering on jax {reason}, so every program embeds "
    "it, as JAX embeds any array: pass it to the function as an argument to keep it out",
}


def observe_unhoisted(program: Any, kwargs: dict[str, Any]) -> None:
    """Where this JAX offers no hoisting (`HOISTING` is None): warn of each large FrozenConst a
    program lowered with `kwargs` embeds (any JAX does not pass as an argument itself)."""
    if none_known() or program is None:
        return
    hoisted = hoisted_by_jax(program, kwargs)
    uses = [u for key, u in _owned(program, literals=True).items() if key not in hoisted]
    _warn(uses, "unsupported", jax.__version__)


def _warn(uses: list[_Use], why: str, reason: str = "") -> None:
    """Warn once per constant, case (`why`) and line that these constants are embedded, and why.
    (Of a known copy, the step that made it has told.)"""
    big = [u for u in uses if u.store.concrete and _nbytes(u.value) > EMBED_MAX_BYTES]
    if not big:
        return
    keys = [f"{why}|{u.line}" for u in big]
    new = [(u, k) for u, k in zip(big, keys, strict=True) if _told.new(u.store, k)]
    if not new:
        return
    first = new[0][0]
    more = ""
    if len(new) > 1:
        total = sum(_nbytes(u.value) for u, _ in new)
        more = f" and {len(new) - 1} more FrozenConst(s), {human_bytes(total)} in all,"
    value = first.value
    # No line recorded for the use (inside `shard_map`): the warning's own location names it.
    used = "" if first.line is None else f", used at {_tail(first.line, 160)}"
    made = f", made in `{first.store.origin}`" if first.store.origin else ""
    message = (
        f"FrozenConst {np.dtype(value.dtype)}{list(value.shape)} ({human_bytes(_nbytes(value))}{made}){more} "
        f"is embedded in the compiled program{used}. "
        f'{_FIXES[why].format(reason=_tail(reason, 200))} (docs: "Which jit").'
    )
    # Recorded once shown: one raised as an error is said again the next time.
    warnings.warn(message, FrozenConstWarning, stacklevel=user_stacklevel())
    for use, key in new:
        _told.record(use.store, key)


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[len(text) - limit + 3 :]
