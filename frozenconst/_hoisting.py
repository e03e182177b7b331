"""Where a FrozenConst resolves to while `frozenconst.jit` traces a function.

While `frozenconst.jit` traces, each constant it already knows resolves to a
parameter of the compiled program (a tracer), so its data never enters the
program. A constant it meets for the first time is noted and stands in as
zeros of its type for the rest of that trace; the trace is then thrown away and
redone with every constant it met as a parameter, before anything is lowered
or compiled. One extra trace finds them all.

Each trace runs in a trace context of its own (`_compat.isolated_trace`), so
inner functions traced during it (a nested `jax.jit`, a `scan` body) are
cached for that trace alone and never reused with a stale tracer or a concrete
buffer. On a JAX without that hook, uses inside nested traces stay concrete
buffers (correct, embedded by JAX's default pipeline).

The frames are per thread: JAX traces on the calling thread.
"""

from __future__ import annotations

import threading
from typing import Any, TypeAlias

import jax
from jax.sharding import Sharding

from ._cache import Store
from ._compat import current_trace, trace_isolation


class Rediscover(Exception):
    """Internal: the trace met constants it did not know, so it is redone with them as parameters."""


# A constant as frozenconst.jit passes it: its store, and its declared placement
# (None: the default, or the computation's mesh; see `JitWrapped.__call__`).
Source: TypeAlias = tuple[Store, Sharding | None]


def source_array(source: Source) -> jax.Array:
    """The cached array for `source` outside any trace."""
    store, placement = source
    return store.default_array() if placement is None else store.placed(placement)


class Frame:
    """One `frozenconst.jit` trace in progress."""

    __slots__ = ("known", "pending", "trace")

    def __init__(self, known: dict[Source, Any]) -> None:
        self.known = known
        self.pending: list[Source] = []
        self.trace = current_trace()


class _Scope(threading.local):
    def __init__(self) -> None:
        self.frames: list[Frame] = []


scope = _Scope()
# How many frozenconst.jit traces are in progress, in all threads. The cache-hit
# path reads this plain integer and consults the thread-local frames only when
# it is not zero.
active = 0
_active_lock = threading.Lock()


def enter(frame: Frame) -> None:
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


def resolve(store: Store, placement: Sharding | None) -> jax.Array:
    """The value a constant stands for in the innermost `frozenconst.jit` trace."""
    frame = scope.frames[-1]
    source = (store, placement)
    if not trace_isolation and current_trace() is not frame.trace:
        return source_array(source)
    value = frame.known.get(source)
    if value is not None:
        return value  # type: ignore[no-any-return]
    if source not in frame.pending:
        frame.pending.append(source)
    return placeholder(store)


def placeholder(store: Store) -> jax.Array:
    """Zeros of the constant's shape and device dtype, made inside the current trace.

    A trace that meets a new constant is thrown away and redone, so what the
    constant stands for there only has to have the right type. Not the buffer
    itself: JAX keeps an abandoned trace alive while a constant it captured is
    referenced (its `finalize_const` registration), and with it the buffer.
    """
    dtype = jax.dtypes.canonicalize_dtype(store.host.dtype)
    zeros: jax.Array = jax.lax.full(store.host.shape, 0, dtype)
    return zeros


def array_for(source: Source) -> jax.Array:
    """A constant's device value here: a trace parameter inside `frozenconst.jit`, else its buffer."""
    if scope.frames:
        return resolve(*source)
    return source_array(source)
