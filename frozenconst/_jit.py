"""`frozenconst.jit`: `jax.jit` that passes every FrozenConst in as a parameter.

Closed-over arrays are embedded into the compiled program by JAX's default
constant pipeline (jax #3220, #16278, #14655, #21300, #10596) and copied per
use or per executable by the simplified one. Passing the array as an argument
avoids both, and is what every workaround converges on. `frozenconst.jit` does
that rewrite for you: every FrozenConst the function reaches, however it
reaches it, becomes a parameter fed from the constant's cached device buffer.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, overload

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ._cache import FED, STATE, FedArrays, Store, setting_key
from ._compat import (
    SIMPLIFIED_CONSTANTS,
    on_clear_caches,
    renew_shared_trace_context,
    shared_trace_context,
    trace_context,
    trace_identity,
    trace_isolation,
    unique_trace_context,
    warn_degraded,
)
from ._errors import FrozenConstWarning
from ._frozen import FrozenConst, source_of
from ._hoisting import BUFFER, PARAMETER, STOP, Frame, Rediscover, Source, enter, leave, tracing
from ._targets import mesh_of

# Under JAX's default constant pipeline, a FrozenConst of at most this many
# bytes is captured as its device buffer, which JAX embeds in the program, as
# `jax.jit` embeds a closed-over array: an executable parameter costs about
# 0.4 us per call (jax 0.10.2 and 0.12.0.1, CPU), so a function holding
# hundreds of small tables would pay more per call than their bytes are worth.
# `frozenconst.audit` gives no advice below the same size.
EMBED_MAX_BYTES = 1024

# A call meets at most this many rounds of new constants; each round adds all
# constants it met, so this bounds pathological code only.
_MAX_ROUNDS = 64

_NOTHING: tuple[jax.Array, ...] = ()


class JitWrapped:
    """A function compiled by [`frozenconst.jit`][frozenconst.jit]. Call it like the original.

    What it holds: the user's function; `_jitted`, `jax.jit` of that function
    with one parameter put first, the tuple of constants (`_make_traced`); and
    `_constants`, what it knows of its constants: for each static configuration
    a `_Group`, the constants that are parameters there, in order.

    What one call does (`__call__`): find the call's group, take each of its
    constants' cached device buffers (`_Group.arrays`), and call `_jitted` with
    them in front of the arguments (`_call`).

    How a newly met constant gets in: the trace that meets it lets it stand in
    as zeros (`_hoisting.resolve`) and notes it; at the end of the trace
    `Rediscover` is raised through `jax.jit`, so JAX caches nothing of that
    trace; the constant joins the group, and the call is made again
    (`_again`, then `_call`). A constant JAX takes as a closed-over buffer (`_Constants.captures`)
    never joins: the trace uses its buffer as `jax.jit` would.
    """

    def __init__(self, fun: Callable[..., Any], jit_kwargs: dict[str, Any]) -> None:
        self._fun = fun
        embed_max_bytes = jit_kwargs.pop("embed_max_bytes", EMBED_MAX_BYTES)
        if isinstance(embed_max_bytes, bool) or not isinstance(embed_max_bytes, int) or embed_max_bytes < 0:
            raise TypeError(
                "frozenconst.jit's `embed_max_bytes` takes a non-negative int (bytes), but received "
                f"{embed_max_bytes!r}. Pass 0 to pass every FrozenConst as a parameter."
            )
        self._donated = _Argnums.of(fun, jit_kwargs, "donate")
        # A function that donates arguments takes its constants as parameters
        # under the simplified pipeline too: a constant also passed as a donated
        # argument is then fed a copy (`_not_donated`), where some JAX versions
        # refuse a captured buffer donated in the same call (jax 0.9.2).
        capture_max = embed_max_bytes
        if SIMPLIFIED_CONSTANTS:
            capture_max = sys.maxsize if self._donated is None else -1
        self._constants = _Constants(fun, _Argnums.of(fun, jit_kwargs, "static"), capture_max)
        # Whether a call donated a buffer also fed as a constant (then every
        # call checks, and feeds a copy of such a constant instead).
        self._donation_clash = False
        kwargs = dict(jit_kwargs)
        for name in ("static_argnums", "donate_argnums"):
            if name in kwargs:
                kwargs[name] = _shift(kwargs[name])
        in_shardings = kwargs.get("in_shardings")
        if isinstance(in_shardings, (tuple, list)):
            kwargs["in_shardings"] = (None, *in_shardings)
        self._jit_kwargs = kwargs
        self._jitted = jax.jit(_make_traced(fun, self._constants), **kwargs)
        self._constants.renew = weakref.WeakMethod(self._renew)
        functools.update_wrapper(self, fun)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        group = self._constants.single or self._constants.group(args, kwargs)
        # Outside the `try`: inside another frozenconst.jit trace, feeding can stop
        # that trace (`Rediscover`), which is the outer call's to handle.
        consts = group.arrays(args, kwargs) if group.sources else _NOTHING
        # `_call`, inlined: as a call it made every call 3% slower (`python -m
        # benchmarks compare`, frozenconst.jit per call against jax.jit: a change
        # of 1.037 against 1.007 inlined, 9 pairs each; jax 0.10.2, CPU).
        if self._donation_clash:
            consts = self._not_donated(consts, args, kwargs)
        try:
            return self._jitted(consts, *args, **kwargs)
        except Rediscover:
            return self._again(lambda g, c: self._call(g, c, args, kwargs), args, kwargs)
        except RuntimeError as err:
            return self._jitted(self._refed(consts, err, group, args, kwargs), *args, **kwargs)

    def _call(self, group: _Group, consts: tuple[jax.Array, ...], args: Any, kwargs: Any) -> Any:
        """Run the compiled function with `consts` for `group`'s constants, then the arguments
        (the call made again after a trace met new constants; `__call__` inlines it)."""
        if self._donation_clash:
            consts = self._not_donated(consts, args, kwargs)
        try:
            return self._jitted(consts, *args, **kwargs)
        except RuntimeError as err:
            # XLA refuses a call before running it when a fed buffer was deleted
            # since (donated elsewhere) or is donated by this very call: feed
            # afresh, or a copy. Any other RuntimeError is the caller's.
            return self._jitted(self._refed(consts, err, group, args, kwargs), *args, **kwargs)

    def _again(self, step: Callable[[_Group, tuple[jax.Array, ...]], Any], args: Any, kwargs: Any) -> Any:
        """`step(group, arrays)` with the call's group and its arrays, until no trace meets a new constant."""
        for _ in range(_MAX_ROUNDS):
            group = self._constants.group(args, kwargs)
            try:
                return step(group, group.arrays(args, kwargs))
            except Rediscover:
                continue
        raise RuntimeError(
            f"frozenconst.jit traced {_MAX_ROUNDS} times and met FrozenConsts it did not know each "
            "time. This happens when `jax.clear_caches()` runs again and again during the call "
            "(each clears what the traces learned); otherwise it is a bug, please report it."
        )

    def _refed(
        self, consts: tuple[jax.Array, ...], err: RuntimeError, group: _Group, args: Any, kwargs: Any
    ) -> tuple[jax.Array, ...]:
        """The arrays to call again with after XLA refused `consts`; re-raises `err` if that is not why."""
        deleted = any(a.is_deleted() for a in consts)
        if deleted:
            group.forget()
            consts = group.arrays(args, kwargs)
        unclashed = self._not_donated(consts, args, kwargs)
        if unclashed is not consts:
            self._donation_clash = True
        elif not deleted:
            raise err
        return unclashed

    def _not_donated(self, consts: tuple[jax.Array, ...], args: Any, kwargs: Any) -> tuple[jax.Array, ...]:
        """`consts`, with a copy of each that this call also donates (`consts` itself if none)."""
        if self._donated is None:
            return consts
        donated = {id(leaf) for leaf in jax.tree_util.tree_leaves(self._donated.pick(args, kwargs))}
        if not any(id(c) in donated for c in consts):
            return consts
        # What jax.jit does with such a constant: the program reads a copy of
        # the data (embedded, or hoisted), never the donated buffer.
        return tuple(
            jax.device_put(c, c.sharding if c.committed else None, may_alias=False) if id(c) in donated else c
            for c in consts
        )

    def _renew(self) -> None:
        # A new traced function: JAX's caches of the old one (and the device
        # buffers they captured) go with it.
        self._jitted = jax.jit(_make_traced(self._fun, self._constants), **self._jit_kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Like `jax.jit(f).lower`: the constants are parameters of the lowered program."""
        lowered: Lowered = self._again(
            lambda g, c: Lowered(self._jitted.lower(c, *args, **kwargs), g.sources[: len(c)]),
            args,
            kwargs,
        )
        return lowered

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Like `jax.jit(f).trace`: the constants are parameters of the traced program."""
        traced: Traced = self._again(
            lambda g, c: Traced(self._jitted.trace(c, *args, **kwargs), g.sources[: len(c)]),
            args,
            kwargs,
        )
        return traced

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Like `jax.jit(f).eval_shape`: the output's shapes and dtypes, computing nothing."""
        return jax.eval_shape(self, *args, **kwargs)

    def clear_cache(self) -> None:
        """Like `jax.jit(f).clear_cache`: drop the compiled executables (the constants stay known)."""
        # Public on every supported jax.jit function, missing from jax 0.10's stubs.
        self._jitted.clear_cache()  # type: ignore[attr-defined,unused-ignore]

    @property
    def constants(self) -> int:
        """How many FrozenConsts this function passes as parameters, over its static configurations."""
        seen: list[Source] = []
        for group in list(self._constants.groups.values()):
            seen.extend(s for s in group.sources if s not in seen)
        return len(seen)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self, instance)


# -- the constants, per static configuration ------------------------------------


class _Group(FedArrays):
    """The constants met by the traces of one static configuration, and the arrays fed last.

    Each constant is a parameter of those traces, in this order. The list only
    grows, so a trace in progress in another thread still finds its prefix.
    """

    __slots__ = ("fed", "lock", "reusable", "sources")

    def __init__(self, sources: list[Source]) -> None:
        self.sources: list[Source] = []
        self.lock = threading.Lock()
        # Whether the arrays fed can be fed again while the settings and the
        # device caches stay the same (not where a mesh is followed, which
        # depends on the arguments).
        self.reusable = True
        # The arrays fed last, kept for the next call where `reusable`.
        self.fed: _Fed | None = None
        if sources:
            self.add(sources)

    def add(self, pending: list[Source]) -> None:
        """Make `pending` parameters of the traces to come."""
        with self.lock:
            self.sources.extend(s for s in pending if s not in self.sources)
            self.reusable = not _multi_device() or all(p is not None for _, p in self.sources)
            self.fed = None

    def arrays(self, args: Any, kwargs: Any) -> tuple[jax.Array, ...]:
        """The arrays to pass for this group's constants in a call with these arguments.

        The arrays fed last are fed again while no device buffer was made or
        evicted since (`STATE.epoch`) and the settings are the same: one check
        instead of a `Store.array` hit per constant. A call takes 0.75x the time
        it takes with a hit per constant, with 100 constants of 4 KiB as
        parameters, and 0.94x with one (84 against 112 us, and 15.1 against
        15.7 us; jax 0.10.2, CPU, interleaved A/B medians). Their hits are
        counted here, as `Store.array` would count them.
        """
        fed, key = self.fed, setting_key(None)
        if fed is not None and fed.epoch == STATE.epoch and fed.key == key and not tracing():
            if STATE.accounting:
                for store, _ in self.sources:
                    store.hits += 1
            return fed.arrays
        epoch = STATE.epoch
        arrays = arrays_for(self.sources, args, kwargs)
        if self.reusable and not tracing():
            self.fed = _Fed(arrays, key, epoch)
            FED.add(self)
        return arrays

    def forget(self, store: Store | None = None) -> None:
        """Drop the arrays fed last (an eviction, or the end of this group)."""
        self.fed = None


class _Fed(NamedTuple):
    """The arrays a `_Group` fed last, and the settings and device caches they were fed under."""

    arrays: tuple[jax.Array, ...]
    key: Any
    epoch: int


def arrays_for(sources: Sequence[Source], args: Any, kwargs: Any) -> tuple[jax.Array, ...]:
    """The arrays to pass for `sources` in a call with these arguments (inside another
    `frozenconst.jit` trace: its parameters, through `Store.array`)."""
    if _multi_device() and any(p is None for _, p in sources) and not tracing():
        # A constant with no declared sharding follows the computation's mesh,
        # replicated: passing a single-device buffer into a sharded computation
        # would make JAX move it on every call.
        mesh = mesh_of((args, kwargs))
        if mesh is not None:
            replicated = NamedSharding(mesh, _REPLICATED)
            return tuple([store.array(replicated if p is None else p) for store, p in sources])
    return tuple([store.array(p) for store, p in sources])


# PartitionSpec's constructor is unannotated in jax 0.10.
_REPLICATED: PartitionSpec = PartitionSpec()  # type: ignore[no-untyped-call,unused-ignore]


@functools.cache
def _multi_device() -> bool:
    return jax.device_count() > 1


# The group of calls whose static arguments cannot be hashed (`jax.jit` refuses
# them with its own error, which the call then raises).
_UNHASHABLE = object()


class _Constants(FedArrays):
    """What a `frozenconst.jit` function knows of its constants: a `_Group` per static configuration.

    Shared by the wrapper (which feeds the constants) and its traced function
    (which meets them), without the traced function holding the wrapper.
    `jax.clear_caches()` empties it, as it empties `jax.jit`'s executables, so
    a constant reached only through a static argument is freed with them.
    """

    def __init__(self, fun: Callable[..., Any], static: _Argnums | None, capture_max: int) -> None:
        self._fun = fun
        self._lock = threading.Lock()
        self.static = static
        self.capture_max = capture_max
        # Stores whose buffers a trace captured: JAX's caches of this function
        # hold them, so evicting one of them renews the function (`forget`).
        self.captured: weakref.WeakSet[Store] = weakref.WeakSet()
        # The wrapper's `_renew`, held weakly (the wrapper holds this object).
        self.renew: weakref.WeakMethod[Callable[[], None]] | None = None
        self.groups: dict[Any, _Group] = {}
        # The group of a function without static arguments, read by every call.
        self.single: _Group | None = None
        # How a constant used inside a nested trace resolves (see `_hoisting`):
        # first `STOP` (the trace is redone isolated), then `PARAMETER`, and
        # `BUFFER` where JAX refused the program with the parameter.
        self.inner = STOP if trace_isolation else BUFFER
        # Why JAX refused the program with a parameter in a nested trace, until warned.
        self.refusal: Exception | None = None
        if not on_clear_caches(self, "frozenconst.jit constants"):
            warn_degraded(
                "`jax.clear_caches()` cannot reach frozenconst.jit's constants on this JAX, so a "
                "constant reached only through a static argument lives as long as the function."
            )
        if not trace_identity:
            warn_degraded(
                "frozenconst.jit cannot tell which trace is active on this JAX (no "
                "`get_opaque_trace_state`), so it traces every function twice, the second time "
                "isolated. Results are correct."
            )
        if static is None:
            self.group((), {})  # the visible constants, before any trace

    def group(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Group:
        """The group for a call with these arguments (made on first need)."""
        key = () if self.static is None else self.static.pick(args, kwargs)
        try:
            found = self.groups.get(key)
        except TypeError:
            key, found = _UNHASHABLE, self.groups.get(_UNHASHABLE)
        if found is None:
            with self._lock:
                found = self.groups.get(key)
                if found is None:
                    # Constants visible without tracing (closed over, or module
                    # globals the code names) are parameters from the first
                    # trace on, which saves that trace's redo; anything else is
                    # found by tracing.
                    visible = _visible_constants(self._fun)
                    found = self.groups[key] = _Group([s for s in visible if not self.captures(s)])
                    if self.static is None:
                        self.single = found
        return found

    def cache_clear(self) -> None:
        """Forget every group (called by `jax.clear_caches()`)."""
        with self._lock:
            for group in self.groups.values():
                group.forget()
            self.groups.clear()
            self.single = None

    def captures(self, source: Source) -> bool:
        """Whether a trace takes this constant's device buffer, as `jax.jit` takes a closed-over
        array, rather than making it a parameter (see `EMBED_MAX_BYTES`, `SIMPLIFIED_CONSTANTS`)."""
        store, sharding = source
        if math.prod(store.shape) * store.dtype.itemsize > self.capture_max:
            return False
        if sharding is not None:
            # JAX refuses to close over an array that spans other processes.
            return bool(sharding.is_fully_addressable)
        # Under the simplified pipeline JAX passes a captured buffer as it is: one
        # without a declared sharding must still follow a multi-device
        # computation's mesh (`arrays_for`), so it stays a parameter there.
        return not SIMPLIFIED_CONSTANTS or not _multi_device()

    def forget(self, store: Store | None = None) -> None:
        """An eviction: drop what JAX compiled with `store`'s buffers captured."""
        if store is None or store in self.captured:
            self.captured.clear()
            renew = None if self.renew is None else self.renew()
            if renew is not None:
                renew()

    def cache_info(self) -> int:
        """How many static configurations are known (for JAX's cache listings)."""
        return len(self.groups)


# -- finding constants, and the arguments jax.jit is told about -------------------


def _shift(argnums: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    # The compiled function takes the constants as an extra first parameter, so
    # non-negative argument numbers move up by one. Negative ones count from the
    # end and stay.
    if argnums is None:
        return None
    if isinstance(argnums, int):
        return argnums + 1 if argnums >= 0 else argnums
    return tuple(i + 1 if i >= 0 else i for i in argnums)


def _visible_constants(fun: Callable[..., Any]) -> list[Source]:
    """The FrozenConsts `fun` closes over or names as globals (nested code included)."""
    target: Any = inspect.unwrap(fun)
    code = getattr(target, "__code__", None)
    if code is None:
        return []
    values: list[Any] = [
        cell.cell_contents for cell in (getattr(target, "__closure__", None) or ()) if _filled(cell)
    ]
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if inspect.iscode(c))
    module_globals = getattr(target, "__globals__", {})
    values += [module_globals[n] for n in names if n in module_globals]
    found: list[Source] = []
    for value in values:
        if isinstance(value, FrozenConst) and value.is_concrete:
            source = source_of(value)
            if source not in found:
                found.append(source)
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


class _Argnums(NamedTuple):
    """Where some of a call's arguments are (the static ones, the donated ones): positions and
    keyword names, as `jax.jit` infers them."""

    argnums: tuple[int, ...]
    argnames: tuple[str, ...]
    # These arguments of a call made without keywords (the common case, one
    # C call), as a tuple.
    positional: Callable[[tuple[Any, ...]], Any]

    @classmethod
    def of(cls, fun: Callable[..., Any], jit_kwargs: dict[str, Any], kind: str) -> _Argnums | None:
        """The `kind` (`"static"`, `"donate"`) arguments, from `jit_kwargs`; None if there are none."""
        nums, names = jit_kwargs.get(f"{kind}_argnums"), jit_kwargs.get(f"{kind}_argnames")
        if nums is None and names is None:
            return None
        argnums = (nums,) if isinstance(nums, int) else tuple(nums or ())
        argnames = (names,) if isinstance(names, str) else tuple(names or ())
        try:
            parameters = list(inspect.signature(fun).parameters.values())
        except (TypeError, ValueError):
            parameters = []
        # As `jax.jit` does (`api_util.infer_argnums_and_argnames`): given only
        # positions, the names of those positions are static too, and the other way round.
        either = [(i, p.name) for i, p in enumerate(parameters) if p.kind is p.POSITIONAL_OR_KEYWORD]
        if nums is None:
            argnums = tuple(i for i, name in either if name in argnames)
        elif names is None:
            argnames = tuple(name for i, name in either if i in argnums)
        return cls(argnums, argnames, _getter(argnums))

    def pick(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """These arguments of a call (for the static ones: what tells a configuration from another)."""
        if not kwargs:
            try:
                return self.positional(args)
            except IndexError:
                pass
        n = len(args)
        return (
            tuple([args[i] for i in self.argnums if -n <= i < n]),
            tuple([(name, kwargs[name]) for name in self.argnames if name in kwargs]),
        )


def _getter(indices: tuple[int, ...]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    if not indices:
        return lambda _: ()
    get = operator.itemgetter(*indices)
    return (lambda args: (get(args),)) if len(indices) == 1 else get


# -- the traced function, and jax's stage objects with the constants bound -------


def _warn_refused(sources: list[Source], err: Exception) -> None:
    names = ", ".join(f"FrozenConst {s.dtype}{list(s.shape)}" for s, _ in sources)
    reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
    warnings.warn(
        f"frozenconst.jit: JAX refused this program with {names} as a parameter used inside a "
        f"nested trace ({type(err).__name__}: {reason}). It is captured there as jax.jit would "
        "capture it: its device buffer, embedded in the program by JAX's default constant "
        "pipeline. Pass it to the inner function as an argument to keep it out.",
        FrozenConstWarning,
        stacklevel=4,
    )


def _make_traced(fun: Callable[..., Any], constants: _Constants) -> Callable[..., Any]:
    """The function `jax.jit` traces: the constants as its first parameter, then `fun`'s."""

    def traced(consts: tuple[Any, ...], /, *args: Any, **kwargs: Any) -> Any:
        group = constants.group(args, kwargs)
        frame = Frame(dict(zip(group.sources, consts, strict=False)), constants.inner, constants.captures)
        context = (
            shared_trace_context()
            if frame.inner == STOP
            else unique_trace_context((frame.inner, constants.capture_max))
        )
        stopped = 0  # stops that reached this function (not caught on the way)
        enter(frame)
        try:
            with trace_context(context):
                out = fun(*args, **kwargs)
        except Exception as err:
            stopped = int(isinstance(err, Rediscover))
            if frame.inner == STOP and frame.nested:
                out = None  # the nested trace was stopped: redone isolated, below
            elif frame.inner == PARAMETER and frame.nested and not frame.pending:
                # JAX may refuse a parameter closed over by an inner trace
                # (`shard_map` over `Explicit` mesh axes refuses closed-over
                # sharded inputs): give those constants what jax.jit would.
                constants.inner, constants.refusal = BUFFER, err
                raise Rediscover from err
            else:
                raise
        finally:
            leave()
            if frame.captured:
                constants.captured.update(frame.captured)
                FED.add(constants)
            if frame.pending:
                # To the group in the table now (`jax.clear_caches()` may have
                # replaced the one this trace started with).
                constants.group(args, kwargs).add(frame.pending)
            if frame.inner == STOP and frame.nested:
                constants.inner = PARAMETER
            if frame.stops > stopped:
                # User code caught a stop (`except Exception:` around a nested
                # use) and the inner trace went on: JAX may have cached it with
                # this trace's tracer inside. Nothing traced later reuses it.
                renew_shared_trace_context()
        if frame.redo:
            raise Rediscover
        if frame.inner == BUFFER and frame.nested and constants.refusal is not None:
            _warn_refused(frame.nested, constants.refusal)
            constants.refusal = None
        return out

    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        # jax.jit maps `static_argnames`/`donate_argnames` to positions through
        # the signature, so give it the user's, behind the constants.
        consts = inspect.Parameter("_frozenconst_consts", inspect.Parameter.POSITIONAL_ONLY)
        params = list(signature.parameters.values())
        traced.__signature__ = signature.replace(parameters=[consts, *params])  # type: ignore[attr-defined]
    traced.__name__ = getattr(fun, "__name__", "traced")
    traced.__qualname__ = getattr(fun, "__qualname__", traced.__name__)
    return traced


class _Stage:
    """A jax stage object with the constants bound, so it is used like the original's."""

    def __init__(self, stage: Any, sources: list[Source]) -> None:
        self._stage = stage
        self._sources = list(sources)

    def __getattr__(self, name: str) -> Any:
        # The stage's public attributes (`jaxpr`, `cost_analysis`, `out_info`, ...).
        if name.startswith("_"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return getattr(self._stage, name)


class Traced(_Stage):
    """`jax.stages.Traced` with the constants bound as parameters."""

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lower the traced program."""
        return Lowered(self._stage.lower(*args, **kwargs), self._sources)


class Lowered(_Stage):
    """`jax.stages.Lowered` with the constants bound as parameters."""

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """The lowered program's text (no FrozenConst data appears in it)."""
        text: str = self._stage.as_text(*args, **kwargs)
        return text

    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        """Compile the lowered program."""
        return Compiled(self._stage.compile(*args, **kwargs), self._sources)


class Compiled(_Stage):
    """`jax.stages.Compiled`, called with the original arguments."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._stage(arrays_for(self._sources, args, kwargs), *args, **kwargs)


@overload
def jit(fun: Callable[..., Any], /, **jit_kwargs: Any) -> JitWrapped: ...
@overload
def jit(fun: None = None, /, **jit_kwargs: Any) -> Callable[[Callable[..., Any]], JitWrapped]: ...
def jit(
    fun: Callable[..., Any] | None = None, /, **jit_kwargs: Any
) -> JitWrapped | Callable[[Callable[..., Any]], JitWrapped]:
    """`jax.jit`, with the data of every FrozenConst the function reaches kept out of the program.

    Takes the same keyword arguments as `jax.jit`. A FrozenConst closed over,
    read from a global, held by a static argument, or used inside a nested
    `jax.jit`, `lax.scan`, `lax.cond`, `jax.grad` or `jax.vmap` is fed from its
    cached device buffer: as a parameter of the compiled program under JAX's
    default constant pipeline, or as the buffer itself, which JAX passes to the
    executable, under the simplified one. The program holds none of its data,
    and every function shares one device buffer per constant.

    Inside the traced function a FrozenConst that is a parameter is abstract,
    like an argument: Python control flow on its values (`if x[0] > 0:`) needs
    `jax.lax.cond`.

    Arguments:
        fun: the function to compile. Omit it to use `jit(...)` as a decorator factory.
        **jit_kwargs: anything `jax.jit` accepts (`static_argnums`, `donate_argnums`, ...),
            and `embed_max_bytes` (default 1024): under JAX's default pipeline, a
            FrozenConst of at most this many bytes is embedded, as `jax.jit` embeds
            it, which costs less per call than a parameter; 0 makes every one a parameter.

    Returns:
        A callable with `lower` and `trace` like a `jax.jit` function.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> import frozenconst
        >>> table = frozenconst.FrozenConst(np.ones((512, 512), np.float32))
        >>> @frozenconst.jit
        ... def f(w):
        ...     return jnp.sum(table @ w)
        >>> f(jnp.ones(512))
        Array(262144., dtype=float32)
        >>> len(f.lower(jnp.ones(512)).as_text()) < 2_000   # no 1 MiB constant inside
        True
    """
    if fun is None:
        return functools.partial(jit, **jit_kwargs)
    if not callable(fun):
        raise TypeError(f"frozenconst.jit needs a callable, but received a `{type(fun).__name__}`.")
    return JitWrapped(fun, jit_kwargs)
