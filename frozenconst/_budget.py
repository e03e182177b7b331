"""A device-memory budget: a bound on the bytes of frozenconst's device buffers per device.

While one is in force (`set_device_budget`, `device_budget`), every use of a constant comes to
`Store._fill`, which notes when it was last used; before a transfer would take a device above
the budget, `DeviceBudget.make_room` evicts the device buffers of the least recently used
other constants until the new one fits. They transfer again at their next use (from the
page-locked copy where the constant keeps one).

What is counted is every device buffer a constant caches. An evicted buffer leaves the cache,
and programs holding it let go (`STATE.dropped`); one still held elsewhere (the program being
traced, the user's `jnp.asarray(x)`) stays on the device, so it is taken back, and the next is
tried. JAX returns memory an enqueued program reads only once it has run: the transfer waits
for that work first (`_drain`).
"""

from __future__ import annotations

import contextlib
import numbers
import threading
import weakref
from collections.abc import Generator, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ._cache import STATE, Store
from ._compat import Device
from ._errors import FrozenConstRuntimeError, FrozenConstTypeError, FrozenConstValueError
from ._host import human_bytes


class DeviceBudget:
    """The budget in force (`STATE.budget`): its limit, and the lock taken before any store's
    while it makes room (it evicts other constants, each under its own lock)."""

    __slots__ = ("_limits", "limit", "lock")

    def __init__(self, limit: int | float) -> None:
        self.limit = limit
        self.lock = threading.RLock()
        # Each device's limit in bytes, where `limit` is a fraction of its memory.
        self._limits: dict[Device, int] = {}

    def bytes_on(self, device: Device) -> int:
        """The budget on `device`, in bytes."""
        if isinstance(self.limit, int):
            return self.limit
        if device not in self._limits:
            self._limits[device] = int(self.limit * _memory_of(device))
        return self._limits[device]

    def make_room(self, store: Store | None, incoming: Mapping[Device, int], strict: bool = True) -> None:
        """Evict the least recently used constants' device buffers (never `store`'s) until
        `incoming` more bytes per device fit; raise where they cannot (unless not `strict`)."""
        with self.lock:
            for device, nbytes in incoming.items():
                if nbytes > self.bytes_on(device):
                    raise FrozenConstValueError(
                        f"{_what(store)} needs {human_bytes(nbytes)} on {device}, more than the whole device "
                        f"budget of {human_bytes(self.bytes_on(device))} there "
                        "(`frozenconst.set_device_budget`). Raise the budget, or keep the constant in host "
                        "memory, moved onto the device by each program that uses it: "
                        '`FrozenConst(a, residency="host")`.'
                    )
            held = held_bytes(store)
            over = {d: held.get(d, 0) + n - self.bytes_on(d) for d, n in incoming.items()}
            over = {d: n for d, n in over.items() if n > 0}
            if not over:
                return
            freed = _evict(store, over)
            if freed:
                _drain(freed)
            short = {d: n for d, n in over.items() if n > 0}
            if short and strict:
                device, lacking = next(iter(short.items()))
                raise FrozenConstRuntimeError(
                    f"{_what(store)} needs {human_bytes(incoming[device])} on {device}, but the device "
                    f"budget of {human_bytes(self.bytes_on(device))} there holds "
                    f"{human_bytes(held_bytes(store).get(device, 0))} of constants in use, which cannot be "
                    f"evicted ({human_bytes(lacking)} short): held by the program being traced, or by your "
                    "own code (`jnp.asarray(x)` kept). Raise the budget "
                    "(`frozenconst.set_device_budget`), or keep large constants in host memory: "
                    '`FrozenConst(a, residency="host")`.'
                )


def _what(store: Store | None) -> str:
    return "A constant" if store is None else f"FrozenConst {store.dtype}{list(store.shape)}"


def held_bytes(holding: Store | None = None) -> dict[Device, int]:
    """Bytes of the device buffers every live constant caches, per device, each buffer once
    (`holding`: the store whose lock the caller holds)."""
    buffers: dict[tuple[Any, int], int] = {}
    for store in list(STATE.live):
        for _, array in store.device_buffers(locked=store is holding):
            for device, pointer, nbytes in _pieces(array):
                buffers[(device, pointer)] = max(buffers.get((device, pointer), 0), nbytes)
    per_device: dict[Device, int] = {}
    for (device, _), nbytes in buffers.items():
        per_device[device] = per_device.get(device, 0) + nbytes
    return per_device


def _pieces(array: jax.Array) -> list[tuple[Any, int, int]]:
    """Each of `array`'s buffers in this process: its device, address and bytes. (A
    single-device array is its own: its shards' views are arrays JAX keeps for its life.)"""
    devices = array.devices()
    if len(devices) == 1:
        (device,) = devices
        return [(device, array.unsafe_buffer_pointer(), array.nbytes)]
    return [(s.device, s.data.unsafe_buffer_pointer(), s.data.nbytes) for s in array.addressable_shards]


def _evict(keep: Store | None, over: dict[Device, int]) -> set[Device]:
    """Evict other constants' buffers on the devices in `over`, least recently used first,
    taking each device's figure down by what is freed, until none is above zero. The devices
    where something was freed."""
    freed: set[Device] = set()
    for store in sorted((s for s in list(STATE.live) if s is not keep), key=lambda s: s.used):
        if all(n <= 0 for n in over.values()):
            break
        found = [
            (made, array)
            for made, array in store.device_buffers()
            if any(over.get(d, 0) > 0 for d in array.devices())
        ]
        if not found:
            continue
        # For each buffer dropped from the cache: its key, a weak reference that tells whether
        # it went, and what it frees, by device and address.
        dropped = [(made, weakref.ref(array), _pieces(array)) for made, array in found]
        for made, _, _ in dropped:
            store.release(made)
        del found  # the last strong references: from now on only what holds them elsewhere
        # Programs holding them let go (JAX compiles them again at their next call). A buffer still
        # held elsewhere is cached again below, the same buffer: nothing else need let go of it.
        refs = [ref for _, ref, _ in dropped]
        for hook in STATE.dropped:
            hook(store, False, refs)
        gone: dict[tuple[Any, int], tuple[Any, int]] = {}
        kept: set[tuple[Any, int]] = set()
        for made, ref, shards in dropped:
            alive = ref()
            if alive is not None:
                # Still held elsewhere, so still on the device: cached again, in use.
                store.readopt(made, alive)
                kept.update((d, p) for d, p, _ in shards)
                del alive
                continue
            store.evictions += 1
            store.evicted.add(made)
            for device, pointer, nbytes in shards:
                gone[(device, pointer)] = (device, max(nbytes, gone.get((device, pointer), (device, 0))[1]))
        for key, (device, nbytes) in gone.items():
            if key not in kept and device in over:
                over[device] -= nbytes
                freed.add(device)
    return freed


def _drain(devices: set[Device]) -> None:
    """Wait for the work enqueued on `devices` so far (which may read the buffers just evicted): a
    device runs its programs in order, so a trivial one enqueued now finishes after them."""
    for device in devices:
        with jax.transfer_guard("allow"):
            jnp.zeros((), jnp.int8, device=device).block_until_ready()


def _memory_of(device: Device) -> int:
    """The device's memory in bytes, as `memory_stats()` reports it (`bytes_limit`)."""
    reader: Any = device
    stats = reader.memory_stats()
    limit = None if not stats else stats.get("bytes_limit")
    if not limit:
        raise FrozenConstValueError(
            f"A device budget given as a fraction of device memory needs the device's size, which "
            f"{device.platform} devices do not report on jax {jax.__version__} (`memory_stats()` has no "
            "'bytes_limit'). Give the budget in bytes: `frozenconst.set_device_budget(2 * 2**30)`."
        )
    size: int = int(limit)
    return size


def _checked(limit: object) -> int | float | None:
    """`limit` as `set_device_budget` takes it, refused where it is none of the three forms."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        raise FrozenConstTypeError(
            "frozenconst.set_device_budget needs bytes (an int), a fraction of each device's memory "
            f"(a float in (0, 1]) or None, but received a `{type(limit).__name__}`."
        )
    if isinstance(limit, numbers.Integral):
        if int(limit) <= 0:
            raise FrozenConstValueError(
                f"frozenconst.set_device_budget needs a positive number of bytes, but received {int(limit)}. "
                "Pass None for no budget."
            )
        return int(limit)
    fraction = float(limit)
    if not 0.0 < fraction <= 1.0:
        raise FrozenConstValueError(
            f"frozenconst.set_device_budget takes a float as a fraction of each device's memory, in "
            f"(0, 1], but received {fraction!r}. Give bytes as an int (`2 * 2**30`)."
        )
    for device in jax.local_devices():
        _memory_of(device)  # refused now, where the devices cannot say their size
    return fraction


def set_device_budget(limit: int | float | None) -> None:
    """Bound the device memory frozenconst's cached buffers take, per device.

    Before a transfer would take a device's constants above the budget, the device
    buffers of the least recently used constants are evicted; they transfer again at
    their next use. A buffer still in use (by the program being traced, or held by your
    code) is never evicted, and memory a running or enqueued program still reads is
    waited for. A compiled program that held an evicted constant is compiled again at its
    next call. `frozenconst.stats()` counts `evictions` and `retransfers`. Process-wide;
    `with frozenconst.device_budget(...):` sets one for a block.

    Arguments:
        limit: bytes per device (an int), a fraction of each device's memory (a float
            in (0, 1], where the device reports its size: accelerators do, JAX's CPU
            backend does not), or None: no budget (the default).

    Raises:
        FrozenConstTypeError: `limit` is not an int, a float or None.
        FrozenConstValueError: not positive, a fraction above 1, or a fraction where a
            device does not report its memory.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, frozenconst
        >>> a = frozenconst.FrozenConst(np.zeros(1024, np.float32))   # 4 KiB each
        >>> b = frozenconst.FrozenConst(np.ones(1024, np.float32))
        >>> frozenconst.set_device_budget(6 * 1024)
        >>> float(jnp.sum(a)), float(jnp.sum(b))                     # b's transfer evicts a
        (0.0, 1024.0)
        >>> [x.stats().device_bytes != {} for x in (a, b)]
        [False, True]
        >>> frozenconst.set_device_budget(None)
    """
    checked = _checked(limit)
    if checked is None:
        STATE.budget = None
        return
    budget = DeviceBudget(checked)
    # Every use from now on comes to `Store._fill`, which notes it for the least recently used.
    for store in list(STATE.live):
        store.unserve()
    STATE.budget = budget
    budget.make_room(None, {d: 0 for d in held_bytes()}, strict=False)


@contextlib.contextmanager
def device_budget(limit: int | float | None) -> Generator[None, None, None]:
    """`set_device_budget(limit)` within the block, the budget before it restored after.

    The budget is process-wide: threads running meanwhile are bound by it too.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, frozenconst
        >>> table = frozenconst.FrozenConst(np.ones((256, 256), np.float32))   # 256 KiB
        >>> with frozenconst.device_budget(2**20):
        ...     float(jnp.sum(table))
        65536.0
    """
    previous = STATE.budget
    set_device_budget(limit)
    try:
        yield
    finally:
        set_device_budget(None if previous is None else previous.limit)
