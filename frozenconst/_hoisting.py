"""Where a FrozenConst resolves to while `frozenconst.jit` traces a function.

While `frozenconst.jit` traces, each constant it already knows resolves to a
parameter of the compiled program (a tracer), so its data never enters the
program. A constant it meets for the first time is noted and stands in as
zeros of its type for the rest of that trace; the trace is then thrown away
and redone with every constant it met as a parameter, before anything is
lowered or compiled. One extra trace finds them all.

The zeros are always made in this trace (`placeholder`), a tracer of it, also
where the constant is met inside a trace nested in ours (a `scan` body, an
inner `jax.jit`, a `cond` branch): the nested trace closes over them as it
closes over a parameter, so whatever JAX caches of it holds this trace, and
the trace-context value is not used again while it does. Zeros made inside the
nested trace would be that trace's own: an inner `jax.jit` cached them holding
nothing of ours, and a later trace reusing the value computed with them. Where
this trace is not isolated yet (`STOP`, below), or this JAX cannot make values
in it from inside a nested one (`_compat.trace_handle`), a constant met first
inside a nested trace stops the trace there instead (`Rediscover`, before JAX
caches the nested trace), and the redo knows it: one trace per such constant.

A constant made while the trace runs belongs to that trace: it resolves to its
device buffer, which JAX treats as any `jax.Array` made inside a traced
function, and nothing outlives the trace.

A constant the frame `captures` also resolves to its device buffer, as a
closed-over `jax.Array` does under `jax.jit`: under JAX's simplified constant
pipeline, every constant (JAX itself passes such buffers to the executable, at
a fraction of an argument's cost per call, and embeds none over 32 bytes);
under the default pipeline, small constants (JAX embeds them, which costs less
per call than a parameter). Under `jax.disable_jit()` nothing is traced, and
every constant is its own buffer, concrete.

A constant used inside a trace nested in ours (a `scan` body, an inner
`jax.jit`, `grad`) would leave our tracer in JAX's cache of that inner trace.
The first such use stops the trace (before JAX caches anything), and the
function is traced again, and from then on always, in a trace context of its
own (`_compat.trace_context`). On a JAX without that hook, such uses stay
concrete buffers (correct, embedded by JAX's default pipeline). A context
value goes back to a pool once its trace is gone (`_compat.unique_trace_context`):
what JAX cached under it holds no value of ours but our tracers (parameters
and stand-ins), which hold the trace. The stop also notes the constant it
stopped on, if it was met first, so the isolated trace knows it. Except where
user code caught a stop and the inner trace went on (`except Exception:`
around the use): JAX may have cached that inner trace without the constant, so
the value is never used again (the shared one is renewed, a unique one retired).

A constant captured as its buffer inside a nested trace (or resolved to its
buffer there, `BUFFER` below) leaves that buffer in what JAX caches of the
nested trace under the trace-context value; a later trace under that value
would reuse it. Each such capture is noted per value (`note_buffer`); when the
buffer is deleted behind our back (donated, `delete()`d), `buffer_lost` retires
exactly those values (renews the shared one), and no other: a lost buffer
costs the traces of the functions that captured it, nothing of anyone else's.

How a use inside a nested trace resolves is a per-function state,
`NestedUse`, which only `Protocol.trace` moves, at the end of a trace, on
these events and no others:

| state       | a use inside a nested trace    | moves to, when                                             |
|-------------|--------------------------------|------------------------------------------------------------|
| `STOP`      | stops the trace (`Rediscover`) | `PARAMETER`: a trace returned, or raised an `Exception`,   |
|             |                                | with such a use                                            |
| `PARAMETER` | the parameter, closed over     | `BUFFER`: JAX refused the parameter, as a call's diagnosis |
|             |                                | (below) showed, warned once                                |
| `BUFFER`    | the buffer, as under `jax.jit` | nothing: final                                             |

A trace in `PARAMETER` with such a use that raises an `Exception` `E` starts a
diagnosis, which belongs to that call (`Diagnosis`, carried by `Rediscover` to
the call's next trace, `diagnosed`) and ends with it; it moves no state but the
one above:

| phase     | the call's next trace                          | then                                         |
|-----------|------------------------------------------------|----------------------------------------------|
| `BUFFERS` | with buffers in nested traces (`TRYING`), as   | raised: `E` is raised (the user's error);    |
|           | `jax.jit` captures them                        | returned with such a use: `CONFIRM`;         |
|           |                                                | returned without: `E` is raised              |
| `CONFIRM` | with parameters again                          | raised `E` again (type, first line): JAX's   |
|           |                                                | refusal: `BUFFER`, and the call traces once  |
|           |                                                | more, with buffers; anything else: `E` is    |
|           |                                                | raised (it did not recur)                    |

So an error that does not recur is raised as `jax.jit` raises it, and the
function keeps its parameters. An exception that is not an `Exception`
(`KeyboardInterrupt`, `SystemExit`) ends the trace, the call and its diagnosis
where it is, and moves nothing. `E` is raised from inside the call's last
trace, so JAX caches no program of it, with its own traceback (the user's line).

A trace that met constants first (or was stopped) is redone whatever else
happened in it (a stand-in can fail where the parameter would not), in the same
phase, and moves no state but `STOP`'s: an error there is raised by the redo, if
it happens again.

A function starts in `STOP`, or in `BUFFER` on a JAX that cannot isolate
traces (`_compat.trace_isolation`).

The frames are per thread: JAX traces on the calling thread.
"""

from __future__ import annotations

import enum
import itertools
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar
from typing import Protocol as Protocol_

import jax
import numpy as np
from jax.sharding import Sharding

from ._compat import (
    Tracer,
    current_trace,
    in_trace,
    renew_shared_trace_context,
    retire_trace_context,
    shared_trace_context,
    trace_context,
    trace_handle,
    trace_isolation,
    unique_trace_context,
    user_stacklevel,
    warn_degraded,
)
from ._errors import FrozenConstWarning


class Rediscover(Exception):
    """Internal: the trace is redone, with the constants it met as parameters, or isolated; or,
    carrying a `Diagnosis`, as the next step of the call's diagnosis (module docstring)."""

    def __init__(self, diagnosis: Diagnosis | None = None) -> None:
        super().__init__()
        self.diagnosis = diagnosis


class StoreLike(Protocol_):
    """What the trace protocol reads of a constant's store. The store (`_cache.Store`) asks
    this module what a constant is inside a trace, so this module sits below it and names
    only these attributes."""

    @property
    def serial(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...


# A store: `_cache.Store` where the protocol is used, read only through `StoreLike` here.
S = TypeVar("S", bound=StoreLike)

# Constants are numbered in order of creation: a trace takes a number when it
# starts, and a constant numbered above it was made by that trace.
_SERIALS = itertools.count(1)

# A number above that of every constant made so far: the counter's own `__next__`, a call
# with no Python frame (a derived copy takes one on every rebuild, issue #35).
next_serial: Callable[[], int] = _SERIALS.__next__


class NestedUse(enum.Enum):
    """How a constant used inside a trace nested in a `frozenconst.jit` trace resolves
    (the table in this module's docstring says when each moves to the next)."""

    STOP = "stop"  # the trace is not isolated: stop it, to be redone isolated
    PARAMETER = "parameter"  # the trace is isolated: the parameter, closed over by the inner trace
    # Only a trace's, never a function's: a diagnosis's trace with buffers (`BUFFERS`), to tell
    # JAX's refusal of the parameter from the user's error.
    TRYING = "trying"
    BUFFER = "buffer"  # JAX refused that: the device buffer, as `jax.jit` would capture it


STOP, PARAMETER, TRYING, BUFFER = NestedUse.STOP, NestedUse.PARAMETER, NestedUse.TRYING, NestedUse.BUFFER


class Phase(enum.Enum):
    """Where a call's diagnosis stands (the second table in the module docstring)."""

    BUFFERS = "buffers"  # the next trace takes buffers in nested traces
    CONFIRM = "confirm"  # buffers worked: the next trace takes parameters again


class Diagnosis:
    """One call's diagnosis of an error `E` that a trace with parameters used in nested traces
    raised: JAX's refusal of the parameter, or the user's error (module docstring).

    It lives as long as the call: `Rediscover` carries it out of a trace, and the call hands it
    to its next trace (`diagnosed`). Nothing of it outlives the call, so an interrupt anywhere
    leaves the function's state as it was.

    Attributes:
        protocol: the function's `Protocol`.
        error: `E`, raised as it is where the diagnosis finds no refusal.
        reason: `E`'s type and first line: a refusal raises it again, word for word.
        phase: what the next trace does (`Phase`).
    """

    __slots__ = ("error", "phase", "protocol", "reason")

    def __init__(self, protocol: Protocol, error: Exception) -> None:
        self.protocol = protocol
        self.error = error
        self.reason = _first_line(error)
        self.phase = Phase.BUFFERS


class Frame(Generic[S]):
    """One `frozenconst.jit` trace in progress.

    Attributes:
        known: each known constant's parameter in this trace.
        captures: which constants resolve to their buffers.
        captured: the stores of the constants that did.
        inner: how a constant used inside a nested trace resolves (`NestedUse`).
        pending: constants met for the first time, to be parameters next time.
        nested: the constants used inside nested traces.
        stops: how many times a nested trace was stopped (`Rediscover`).
        eager: nothing is traced (`jax.disable_jit()`): every constant is its own buffer.
        handle: the trace itself (`_compat.trace_handle`), to make stand-ins in.
        context: the trace-context value it runs under (None: eager).
    """

    __slots__ = (
        "captured",
        "captures",
        "context",
        "eager",
        "handle",
        "inner",
        "known",
        "nested",
        "pending",
        "serial",
        "stops",
        "trace",
    )

    def __init__(
        self,
        known: dict[tuple[S, Sharding | None], Any],
        inner: NestedUse,
        captures: Callable[[tuple[S, Sharding | None]], bool],
        eager: bool = False,
    ) -> None:
        self.eager = eager
        self.known = known
        self.inner = inner
        # Which constants resolve to their device buffers, as a closed-over
        # `jax.Array` does under `jax.jit` (`_groups.Constants.captures`).
        self.captures = captures
        self.captured: list[S] = []
        self.pending: list[tuple[S, Sharding | None]] = []
        self.nested: list[tuple[S, Sharding | None]] = []
        self.stops = 0
        self.context: int | None = None
        self.trace = current_trace()
        # This trace itself, to make stand-ins in (None where JAX cannot).
        self.handle = None if eager else trace_handle()
        # Constants numbered above this were made during the trace.
        self.serial = next_serial()

    @property
    def redo(self) -> bool:
        """Whether this trace must be thrown away and done again."""
        return bool(self.pending) or (self.inner is STOP and bool(self.nested))


class Protocol:
    """What one `frozenconst.jit` function's traces learned of nested uses: the one owner of
    its `NestedUse` state, which only `trace` moves (the tables in the module docstring).

    Attributes:
        inner: how a constant used inside a nested trace resolves in this function's traces
            (`STOP`, `PARAMETER` or `BUFFER`; `TRYING` is a diagnosis's trace's, never this).
        capture_max: the largest constant (bytes) the function's traces capture as its buffer;
            with `inner`, what makes two isolated traces resolve constants alike, so that
            they may share a trace-context value (`_compat.unique_trace_context`).
    """

    __slots__ = ("capture_max", "inner")

    def __init__(self, capture_max: int) -> None:
        self.inner = STOP if trace_isolation else BUFFER
        self.capture_max = capture_max

    def trace(
        self,
        body: Callable[[], Any],
        known: dict[tuple[S, Sharding | None], Any],
        captures: Callable[[tuple[S, Sharding | None]], bool],
        learned: Callable[[Frame[S]], None],
    ) -> Any:
        """`body()` traced with `known` constants as parameters; `learned(frame)` is told what the
        trace met. Raises `Rediscover` where the trace must be redone (with the call's
        `Diagnosis` where that is its next step), and the diagnosed error where it ends there."""
        if _nothing_traced():
            # `jax.disable_jit()`: each constant is its own device buffer, as a
            # closed-over `jax.Array` is under `jax.jit` there.
            enter(Frame(known, BUFFER, captures, eager=True))
            try:
                return body()
            finally:
                leave()
        diagnosis = self._diagnosis()
        inner = self.inner
        if diagnosis is not None and inner is PARAMETER and diagnosis.phase is Phase.BUFFERS:
            inner = TRYING
        frame = Frame(known, inner, captures)
        context = shared_trace_context() if inner is STOP else unique_trace_context((inner, self.capture_max))
        frame.context = context
        failed: Exception | None = None
        ended = False  # returned, or raised an `Exception`: not interrupted
        enter(frame)
        try:
            with trace_context(context):
                out = body()
            ended = True
        except Exception as err:
            failed, ended, out = err, True, None
        finally:
            leave()
            learned(frame)
            stopped = int(isinstance(failed, Rediscover))  # stops that reached this function
            if ended and frame.inner is STOP and frame.nested and self.inner is STOP:
                self.inner = PARAMETER
            if frame.stops > stopped:
                # User code caught a stop (`except Exception:` around a nested
                # use) and the inner trace went on: JAX may have cached it with
                # this trace's tracer inside, or without the constant. Nothing
                # traced later reuses it.
                retire(context)
        # Decided here, outside the handler: an error raised below is raised as it is, not
        # "during handling" of another.
        try:
            if frame.redo:
                # Stopped, or met constants first: redone whatever else went wrong, in the same phase.
                raise Rediscover(diagnosis)
            if failed is not None and stopped:
                raise failed  # not this trace's: an outer trace stopped from inside this function
            if diagnosis is None or self.inner is not PARAMETER:
                if failed is None:
                    return out
                if frame.inner is PARAMETER and frame.nested:
                    # JAX may refuse a parameter closed over by an inner trace
                    # (`shard_map` over `Explicit` mesh axes refuses closed-over
                    # sharded inputs), or the user's code failed: the call traces
                    # again with what jax.jit would give those uses, their buffers, to tell.
                    raise Rediscover(Diagnosis(self, failed))
                raise failed
            if diagnosis.phase is Phase.BUFFERS:
                if failed is None and frame.nested:
                    diagnosis.phase = Phase.CONFIRM  # buffers work: does the parameter fail again?
                    raise Rediscover(diagnosis)
                raise diagnosis.error  # the user's error (or one that did not recur)
            if failed is not None and frame.nested and _first_line(failed) == diagnosis.reason:
                # Parameters fail, twice, where buffers do not: JAX's refusal, for good.
                self.inner = BUFFER
                _warn_refused(frame.nested, diagnosis.reason)
                raise Rediscover
            raise diagnosis.error  # it did not recur, or another error came: the user's, as it was
        finally:
            failed = diagnosis = None

    def _diagnosis(self) -> Diagnosis | None:
        """The diagnosis of this thread's call of this function, if the trace starting is that
        call's own (not a call of the same function nested inside it)."""
        if scope.diagnoses:
            found, depth = scope.diagnoses[-1]
            if found.protocol is self and depth == len(scope.frames):
                return found
        return None


def _nothing_traced() -> bool:
    """Whether the function runs as it is, on concrete values: under `jax.disable_jit()`, except
    where JAX traces it anyway (`.lower()`, or inside `jax.make_jaxpr`)."""
    if not getattr(jax.config, "jax_disable_jit", False):
        return False
    return not isinstance(jax.lax.full((), 0, np.int8), Tracer)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _warn_refused(uses: Sequence[tuple[StoreLike, Sharding | None]], reason: str) -> None:
    names = ", ".join(f"FrozenConst {s.dtype}{list(s.shape)}" for s, _ in uses)
    warnings.warn(
        f"frozenconst.jit: JAX refused this program with {names} as a parameter used inside a "
        f"nested trace ({reason}; raised again where its device buffer worked). It is captured "
        "there as jax.jit would capture it: its device buffer, embedded in the program by JAX's "
        "default constant pipeline. Pass it to the inner function as an argument to keep it out.",
        FrozenConstWarning,
        stacklevel=user_stacklevel(),
    )


class _Scope(threading.local):
    def __init__(self) -> None:
        self.frames: list[Frame[Any]] = []
        # The diagnosis of each call in progress that has one, innermost last, with how many
        # frames were active when the call began (`diagnosed`).
        self.diagnoses: list[tuple[Diagnosis, int]] = []


scope = _Scope()
# How many frozenconst.jit traces are in progress, in all threads. The cache-hit
# path (`_cache.Store.array`) reads this plain integer and consults the
# thread-local frames only when it is not zero.
active = 0
_active_lock = threading.Lock()


def tracing() -> bool:
    """Whether this thread is tracing a function for `frozenconst.jit`.

    The one predicate for it; `_cache.Store.array` inlines it (see there).
    """
    return active > 0 and bool(scope.frames)


def enter(frame: Frame[Any]) -> None:
    """Start resolving constants for `frame` in this thread."""
    global active
    with _active_lock:
        active += 1
    scope.frames.append(frame)


def leave() -> None:
    """Stop resolving constants for the innermost frame of this thread."""
    global active
    scope.frames.pop()
    with _active_lock:
        active -= 1


_R = TypeVar("_R")


def diagnosed(diagnosis: Diagnosis | None, call: Callable[[], _R]) -> _R:
    """`call()`, in which this call's next trace of the diagnosed function takes `diagnosis`'s
    step. The diagnosis ends with `call`, whatever it raises (`KeyboardInterrupt` included)."""
    if diagnosis is None:
        return call()
    scope.diagnoses.append((diagnosis, len(scope.frames)))
    try:
        return call()
    finally:
        scope.diagnoses.pop()


# Trace-context values under which a nested trace captured a constant's device buffer (a
# closed-over buffer in a `scan` body, an inner `jax.jit`): what JAX cached of that trace holds
# the buffer, and a later trace under the value would reuse it. Kept per value, each with the
# constants' stores (held weakly), so that a buffer deleted behind our back retires exactly
# the values that hold it (`buffer_lost`).
_buffers_under: dict[int, weakref.WeakSet[Any]] = {}
_buffers_lock = threading.Lock()


def note_buffer(frame: Frame[Any], store: StoreLike) -> None:
    """Note that a trace nested in `frame`'s captured `store`'s device buffer."""
    if frame.context is None:
        return
    with _buffers_lock:
        stores = _buffers_under.get(frame.context)
        if stores is None:
            stores = _buffers_under[frame.context] = weakref.WeakSet()
        stores.add(store)


def buffer_lost(store: StoreLike) -> None:
    """A device buffer of `store` was deleted behind our back: no trace reuses what JAX cached
    under a trace-context value where a nested trace captured it. Other values stay."""
    with _buffers_lock:
        values = [value for value, stores in _buffers_under.items() if store in stores]
    for value in values:
        retire(value)


def retire(value: int) -> None:
    """Use `value` in no later trace: the shared one is renewed, a unique one never handed out
    again once its trace is gone."""
    with _buffers_lock:
        _buffers_under.pop(value, None)
    if value == shared_trace_context():
        renew_shared_trace_context()
    else:
        retire_trace_context(value)


def resolve(store: StoreLike, sharding: Sharding | None) -> jax.Array | None:
    """The value a constant stands for in this thread's innermost `frozenconst.jit` trace,
    or None where that is its own device buffer (which `Store.array` then serves)."""
    frame = scope.frames[-1]
    if store.serial > frame.serial or frame.eager:
        return None  # made by this trace (one of its own constants), or nothing is traced
    use = (store, sharding)
    nested = current_trace() != frame.trace
    if frame.captures(use):
        frame.captured.append(store)
        if nested:
            note_buffer(frame, store)  # JAX's cache of the nested trace holds the buffer
        return None
    if nested:
        if use not in frame.nested:
            frame.nested.append(use)
        if frame.inner is BUFFER or frame.inner is TRYING:
            if not trace_isolation:
                _warn_embedded_once()
            # The buffer, captured there as under `jax.jit`: the program holds it too.
            frame.captured.append(store)
            note_buffer(frame, store)
            return None
        value = frame.known.get(use)
        if frame.inner is PARAMETER:
            if value is not None:
                return value  # type: ignore[no-any-return]
            if frame.handle is not None:
                # Met first here: zeros made in this trace, not in the nested
                # one, so what JAX caches of the nested trace holds this trace.
                if use not in frame.pending:
                    frame.pending.append(use)
                with in_trace(frame.handle):
                    return placeholder(store)
        # Stop the nested trace before JAX caches it: with this trace's tracer
        # inside, under the context all `STOP` traces share, or (where this JAX
        # cannot make values in this trace) with a stand-in that would not hold
        # this trace. The redo knows the constant.
        if value is None and use not in frame.pending:
            frame.pending.append(use)
            if frame.inner is PARAMETER:
                _warn_stopped_once()
        frame.stops += 1
        raise Rediscover
    value = frame.known.get(use)
    if value is not None:
        return value  # type: ignore[no-any-return]
    if use not in frame.pending:
        frame.pending.append(use)
    return placeholder(store)


def _warn_stopped_once() -> None:
    warn_degraded(
        "frozenconst.jit cannot make values in its own trace from inside a nested one on this JAX "
        "(no `set_current_trace`), so each FrozenConst met for the first time inside a nested "
        "trace (a `scan` body, an inner `jax.jit`, `grad`) costs one trace more. Results are "
        "correct. Close over the constant, or pass it as an argument, to save those traces."
    )


def _warn_embedded_once() -> None:
    warn_degraded(
        "frozenconst.jit cannot isolate traces on this JAX (no trace-context config states), "
        "so a FrozenConst used inside a nested trace (a `scan` body, an inner `jax.jit`, `grad`) "
        "is captured as its device buffer, which JAX's default constant pipeline embeds in the "
        "compiled program. Results are correct. Pass the constant to the inner function as an "
        "argument to keep it out of the program."
    )


def placeholder(store: StoreLike) -> jax.Array:
    """Zeros of the constant's shape and device dtype, made inside the current trace.

    A trace that meets a new constant is thrown away and redone, so what the
    constant stands for there only has to have the right type. Not the buffer
    itself: JAX keeps an abandoned trace alive while a constant it captured is
    referenced (its `finalize_const` registration), and with it the buffer.
    """
    dtype = jax.dtypes.canonicalize_dtype(store.dtype)
    zeros: jax.Array = jax.lax.full(store.shape, 0, dtype)
    return zeros
