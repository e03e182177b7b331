"""The constants of a `frozenconst.jit` function, per static configuration, and what a call feeds.

`Constants` holds a `Group` per static configuration: the constants that are
parameters of its traces, in order. A group starts with the constants the
function's code reaches without tracing (`visible_constants`: closed over, or
module globals its bytecode names); tracing adds the rest (`_hoisting`).

A call's arrays come from two cache tiers. The first is `Store.array`: one
device buffer per placement, a hit one dict lookup. The second is here:
`Group.arrays` feeds the tuple it fed last (`Fed`) again while no device buffer
was made or evicted since and the settings are the same, one check for the
whole tuple; it counts each constant's hit through `Store.count_hits`, the
first tier's own accounting.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from . import _hoisting
from ._argnums import Argnums
from ._cache import FED, STATE, FedArrays, Store, Use, owner_of
from ._compat import (
    DEFAULT_DEVICE,
    SIMPLIFIED_CONSTANTS,
    X64,
    Tracer,
    captured_arrays,
    on_clear_caches,
    trace_identity,
    user_stacklevel,
    warn_degraded,
)
from ._errors import FrozenConstWarning
from ._frozen import FrozenConst, use_of
from ._hoisting import Frame, Protocol, tracing
from ._targets import mesh_of

# Set while `frozenconst.audit` traces a function: the audit reports each large array a trace
# closes over as a problem of its own, so the warning of `Constants.warn_embedded` would only say
# it twice (and, under `-W error`, stop the audit that was asked to find it).
AUDITING: contextvars.ContextVar[bool] = contextvars.ContextVar("frozenconst_auditing", default=False)


class Group(FedArrays):
    """The constants met by the traces of one static configuration, and the arrays fed last.

    Each constant is a parameter of those traces, in this order. The list only
    grows, so a trace in progress in another thread still finds its prefix.
    """

    __slots__ = ("fed", "lock", "reusable", "uses")

    def __init__(self, uses: list[Use]) -> None:
        self.uses: list[Use] = []
        self.lock = threading.Lock()
        # Whether the arrays fed can be fed again while the settings and the
        # device caches stay the same (not where a mesh is followed, which
        # depends on the arguments, nor where a buffer of a constant was
        # donated before, and may be again between two calls: `Store.volatile`).
        self.reusable = True
        # The arrays fed last, kept for the next call where `reusable`.
        self.fed: Fed | None = None
        if uses:
            self.add(uses)

    def add(self, pending: list[Use]) -> None:
        """Make `pending` parameters of the traces to come."""
        with self.lock:
            self.uses.extend(s for s in pending if s not in self.uses)
            follows_mesh = _multi_device() and any(p is None for _, p in self.uses)
            self.reusable = not follows_mesh and not any(_volatile(s) for s, _ in self.uses)
            self.fed = None

    def arrays(self, args: Any, kwargs: Any) -> tuple[jax.Array, ...]:
        """The arrays to pass for this group's constants in a call with these arguments.

        The second cache tier: the arrays fed last are fed again while no
        device buffer was made or evicted since (`STATE.epoch`) and the settings
        are the same, one check instead of a `Store.array` hit per constant (a
        call is faster with it, the more so the more constants it feeds:
        `python -m benchmarks compare`, row "frozenconst.jit per call: ratio to
        jax.jit"). Their hits are counted by `Store.count_hits`, as the first
        tier counts its own.
        """
        # The check, inlined (no `setting_key` tuple to build and compare, no `tracing()` call
        # while no trace runs anywhere) and read off slots: it was most of what a call with a
        # constant as a parameter cost beyond `jax.jit` with it as an argument (issue #26,
        # `python -m benchmarks constants`, 1 MiB constants).
        fed = self.fed
        if (
            fed is not None
            and fed.epoch == STATE.epoch
            and fed.device is DEFAULT_DEVICE.value
            and fed.x64 is X64.value
            and not (_hoisting.active and tracing())
        ):
            Store.count_hits(self.uses)
            return fed.arrays
        epoch, device, x64 = STATE.epoch, DEFAULT_DEVICE.value, X64.value
        arrays = arrays_for(self.uses, args, kwargs)
        if self.reusable and not tracing():
            self.fed = Fed(arrays, device, x64, epoch)
            FED.add(self)
        return arrays

    def forget(self, store: Store | None = None) -> None:
        """Drop the arrays fed last (an eviction, a lost buffer, or the end of this group)."""
        self.fed = None
        if store is not None and _volatile(store) and any(s is store for s, _ in self.uses):
            # A buffer of it was deleted behind our back (donated), and likely will be again:
            # every call asks `Store.array`, which sees a deleted buffer and makes it again,
            # where the arrays fed last would send XLA a deleted one (issue #37).
            self.reusable = False


class Fed:
    """The arrays a `Group` fed last, and the settings and device caches they were fed under:
    the `jax_default_device` setting (compared by identity: an equal setting of another
    identity only feeds afresh), the x64 setting and `STATE.epoch`."""

    __slots__ = ("arrays", "device", "epoch", "x64")

    def __init__(self, arrays: tuple[jax.Array, ...], device: Any, x64: bool, epoch: int) -> None:
        self.arrays = arrays
        self.device = device
        self.x64 = x64
        self.epoch = epoch


def arrays_for(uses: Sequence[Use], args: Any, kwargs: Any) -> tuple[jax.Array, ...]:
    """The arrays to pass for `uses` in a call with these arguments (inside another
    `frozenconst.jit` trace: its parameters, through `Store.array`)."""
    if _multi_device() and any(p is None for _, p in uses) and not tracing():
        # A constant with no declared sharding follows the computation's mesh,
        # replicated: passing a single-device buffer into a sharded computation
        # would make JAX move it on every call.
        mesh = mesh_of((args, kwargs))
        if mesh is not None:
            replicated = NamedSharding(mesh, _REPLICATED)
            return tuple([store.array(replicated if p is None else p) for store, p in uses])
    return tuple([store.array(p) for store, p in uses])


# PartitionSpec's constructor is unannotated in jax 0.10.
_REPLICATED: PartitionSpec = PartitionSpec()  # type: ignore[no-untyped-call,unused-ignore]


@functools.cache
def _multi_device() -> bool:
    return jax.device_count() > 1


# The group of calls whose static arguments cannot be hashed (`jax.jit` refuses
# them with its own error, which the call then raises).
_UNHASHABLE = object()


class Constants(FedArrays):
    """What a `frozenconst.jit` function knows of its constants: a `Group` per static configuration.

    Shared by the wrapper (which feeds the constants) and its traced function
    (which meets them), without the traced function holding the wrapper.
    `jax.clear_caches()` empties it, as it empties `jax.jit`'s executables, so
    a constant reached only through a static argument is freed with them.
    """

    def __init__(self, fun: Callable[..., Any], static: Argnums | None, capture_max: int) -> None:
        self._fun = fun
        self._lock = threading.Lock()
        self.static = static
        self.capture_max = capture_max
        # Stores whose buffers a trace captured: JAX's caches of this function
        # hold them, so evicting one of them renews the function (`forget`).
        self.captured: weakref.WeakSet[Store] = weakref.WeakSet()
        # The wrapper's `_renew`, held weakly (the wrapper holds this object).
        self.renew: weakref.WeakMethod[Callable[[], None]] | None = None
        self.groups: dict[Any, Group] = {}
        # The group of a function without static arguments, read by every call.
        self.single: Group | None = None
        # How a constant used inside a nested trace resolves, moved by the traces
        # (`_hoisting.Protocol`).
        self.protocol = Protocol(capture_max)
        # Whether a trace warned of large arrays it closed over (`warn_embedded`): once.
        self.warned_embedding = False
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

    def group(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Group:
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
                    visible = visible_constants(self._fun)
                    found = self.groups[key] = Group([s for s in visible if not self.captures(s)])
                    if self.static is None:
                        self.single = found
        return found

    def learn(self, frame: Frame[Store], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Keep what a trace of a call with these arguments met: the constants it captured, and
        those it met for the first time, parameters from the next trace on."""
        if frame.captured:
            self.captured.update(frame.captured)
            FED.add(self)
        if frame.pending:
            # To the group in the table now (`jax.clear_caches()` may have
            # replaced the one this trace started with).
            self.group(args, kwargs).add(frame.pending)

    def cache_clear(self) -> None:
        """Forget every group (called by `jax.clear_caches()`)."""
        with self._lock:
            for group in self.groups.values():
                group.forget()
            self.groups.clear()
            self.single = None

    def captures(self, use: Use) -> bool:
        """Whether a trace takes this constant's device buffer, as `jax.jit` takes a closed-over
        array, rather than making it a parameter (see `EMBED_MAX_BYTES`, `SIMPLIFIED_CONSTANTS`)."""
        store, sharding = use
        if math.prod(store.shape) * store.dtype.itemsize > self.capture_max:
            return False
        if _volatile(store):
            # Its buffer was deleted behind our back once (donated): a parameter, fed the
            # buffer made again, where a captured one would retrace at every donation.
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

    def warn_embedded(self) -> None:
        """Say, once per function, which large concrete arrays the trace in progress closed over
        without frozenconst keeping them out (a `jax.Array`, a NumPy array): JAX's default
        pipeline embeds each in the program (issue #25). Called at the end of a trace."""
        if self.warned_embedding or SIMPLIFIED_CONSTANTS or AUDITING.get():
            return
        large = [
            a
            for a in captured_arrays()
            if _nbytes(a) > self.capture_max and owner_of(a) is None and not isinstance(a, Tracer)
        ]
        if not large:
            return
        self.warned_embedding = True
        names = ", ".join(
            f"{_kind(a)} {np.dtype(a.dtype)}{list(a.shape)} ({_found(self._fun, a)})" for a in large
        )
        warnings.warn(
            f"frozenconst.jit: `{getattr(self._fun, '__qualname__', self._fun)!s}` closes over {names}, "
            "which JAX's default constant pipeline embeds in the compiled program, as jax.jit "
            f"does (frozenconst.jit keeps out FrozenConsts above {self.capture_max} bytes, "
            "`embed_max_bytes`). Wrap each once in `frozenconst.FrozenConst`, or pass it as an "
            "argument.",
            FrozenConstWarning,
            stacklevel=user_stacklevel(),
        )

    def lost_captured(self) -> list[Store]:
        """The constants whose device buffer a trace captured and which was deleted since
        (donated elsewhere): empty, false, where there are none."""
        return [store for store in list(self.captured) if store.lost_buffer()]

    def cache_info(self) -> int:
        """How many static configurations are known (for JAX's cache listings)."""
        return len(self.groups)


def _volatile(store: Any) -> bool:
    """Whether a buffer of the constant was deleted behind our back (`Store.volatile`); a value
    derived from one (`_derived.Derived`, also met by traces) never is."""
    return bool(getattr(store, "volatile", False))


def visible_constants(fun: Callable[..., Any]) -> list[Use]:
    """The FrozenConsts `fun` closes over or names as globals (nested code included)."""
    unwrapped: Any = inspect.unwrap(fun)
    code = getattr(unwrapped, "__code__", None)
    if code is None:
        return []
    values: list[Any] = [
        cell.cell_contents for cell in (getattr(unwrapped, "__closure__", None) or ()) if _filled(cell)
    ]
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if inspect.iscode(c))
    module_globals = getattr(unwrapped, "__globals__", {})
    values += [module_globals[n] for n in names if n in module_globals]
    found: list[Use] = []
    for value in values:
        if isinstance(value, FrozenConst) and value.is_concrete:
            use = use_of(value)
            if use not in found:
                found.append(use)
    return found


def _nbytes(array: Any) -> int:
    shape, dtype = getattr(array, "shape", None), getattr(array, "dtype", None)
    if shape is None or dtype is None:
        return 0
    nbytes: int = math.prod(shape) * np.dtype(dtype).itemsize
    return nbytes


def _kind(array: Any) -> str:
    return "a jax.Array" if isinstance(array, jax.Array) else "a NumPy array"


def _same(array: Any, value: Any) -> bool:
    if value is array:
        return True
    # jax >= 0.9 records a NumPy constant as a view of it (`TypedNdArray`).
    return isinstance(value, np.ndarray) and isinstance(array, np.ndarray) and array.base is value


def _found(fun: Callable[..., Any], array: Any) -> str:
    """Where `fun` reaches `array`, in words: closed over, a global, or only by tracing."""
    unwrapped: Any = inspect.unwrap(fun)
    code = getattr(unwrapped, "__code__", None)
    cells = getattr(unwrapped, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, cells, strict=False):
            if _filled(cell) and _same(array, cell.cell_contents):
                return f"closed over as `{name}`"
        module_globals = getattr(unwrapped, "__globals__", {})
        for name in code.co_names:
            if name in module_globals and _same(array, module_globals[name]):
                return f"the global `{name}`"
    return "reached while tracing: an attribute, an entry, a derived FrozenConst's value"


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True
