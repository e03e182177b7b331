"""Accounting: what every constant holds and costs, in total and per constant."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import jax

from ._cache import STATE, Store
from ._compat import Device


@dataclasses.dataclass(frozen=True)
class ConstStats:
    """Accounting for one constant (`x.stats()`).

    Attributes:
        host_bytes: bytes of host memory held for the constant: its frozen NumPy
            buffer (of a constant bigger than one host: the slices this process
            holds) and, with `host_memory="pinned"` or `residency="host"`, its
            page-locked buffers once made.
        host_memory: what transfers read: `"pinned"` (a page-locked copy) or `"pageable"`.
        residency: where it lives between uses: `"device"`, or `"host"` (page-locked,
            moved onto the device by each use).
        device_bytes: bytes of cached device buffers, per device (device memory:
            page-locked buffers are host memory, counted in `host_bytes`).
        transfers: host-to-device transfers made so far: one per device buffer
            filled from the host data (a placement on N devices counts N,
            replicated or sharded); for a host-resident constant, one per
            page-locked buffer made (what each use moves in is not counted).
        hits: requests for a device buffer served from the cache. JAX may ask
            more than once per operation (`jnp.asarray` asks twice on jax 0.10).
        evictions: device buffers a device budget evicted to make room for others.
        retransfers: transfers of a placement that a device budget had evicted.
        placements: how many placements are cached.
        zero_copy: whether the default-device buffer aliases the frozen host
            buffer (on JAX's CPU backend), `False` if it is a copy, `None` if
            there is no default-device buffer yet. For a constant bigger than
            one host: whether every device buffer of its declared sharding
            aliases its frozen slice (`None` before the first use).
    """

    host_bytes: int
    host_memory: str
    device_bytes: Mapping[Device, int]
    transfers: int
    hits: int
    placements: int
    zero_copy: bool | None
    residency: str = "device"
    evictions: int = 0
    retransfers: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (devices as strings)."""
        return _json_dict(self)


@dataclasses.dataclass(frozen=True)
class Stats:
    """Accounting for every live constant in this process (`frozenconst.stats()`).

    Attributes:
        live_constants: constants alive now (constants sharing one buffer count once).
        host_bytes: bytes of host memory held for them in this process: frozen
            buffers (a constant bigger than one host counts the slices this process
            holds) and page-locked copies.
        pinned_bytes: of those, bytes of page-locked memory: copies (`host_memory="pinned"`)
            and host-resident constants' buffers (`residency="host"`).
        device_bytes: bytes of their cached device buffers, per device.
        aliased_bytes: of those, bytes that alias the host buffers (CPU zero-copy).
        transfers: host-to-device transfers made, by these and by constants
            already garbage-collected.
        hits: uses served from a cache, likewise.
        evictions: device buffers a device budget evicted, likewise
            (`frozenconst.set_device_budget`).
        retransfers: transfers of placements a device budget had evicted, likewise.
    """

    live_constants: int
    host_bytes: int
    pinned_bytes: int
    device_bytes: Mapping[Device, int]
    aliased_bytes: int
    transfers: int
    hits: int
    evictions: int = 0
    retransfers: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (devices as strings)."""
        return _json_dict(self)


def _json_dict(report: ConstStats | Stats) -> dict[str, Any]:
    out = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    out["device_bytes"] = {str(d): n for d, n in report.device_bytes.items()}
    return out


# A device buffer: its device and address. A committed view of the default
# buffer on the same device is the same memory, counted once.
_Buffer: TypeAlias = tuple[Device, int]


def _buffers(arrays: Iterable[jax.Array]) -> dict[_Buffer, int]:
    """Each distinct device buffer under `arrays`, with its bytes: the larger of those at one
    address (on CPU a sharded placement's first shard and the default buffer alias one start)."""
    found: dict[_Buffer, int] = {}
    for array in arrays:
        for shard in array.addressable_shards:
            key = (shard.device, shard.data.unsafe_buffer_pointer())
            found[key] = max(found.get(key, 0), shard.data.nbytes)
    return found


def _per_device(buffers: dict[_Buffer, int]) -> dict[Device, int]:
    per_device: dict[Device, int] = {}
    for (device, _), nbytes in buffers.items():
        per_device[device] = per_device.get(device, 0) + nbytes
    return per_device


def _aliasing(store: Store, arrays: list[jax.Array], buffers: dict[_Buffer, int]) -> tuple[bool | None, int]:
    """(zero_copy, aliased bytes): whether the default buffer (a partial constant's: every buffer
    of its declared sharding) aliases its host buffer, and the bytes of device buffers that do."""
    if store.partial:
        addresses = {b.ctypes.data for b in store.host_buffers() if b.nbytes}
        home = [a for a in arrays if a.sharding == store.home]
        zero_copy = (
            None
            if not home
            else all(s.data.unsafe_buffer_pointer() in addresses for a in home for s in a.addressable_shards)
        )
        return zero_copy, sum(n for (_, address), n in buffers.items() if address in addresses)
    host_address = store.host.ctypes.data
    defaults = [a for a in arrays if not a.committed]
    zero_copy = None if not defaults else any(a.unsafe_buffer_pointer() == host_address for a in defaults)
    aliased = sum(a.nbytes for a in defaults if a.unsafe_buffer_pointer() == host_address)
    return zero_copy, aliased


def const_stats(store: Store) -> ConstStats:
    """The accounting of one constant (`x.stats()`)."""
    arrays = store.arrays(device=True)
    buffers = _buffers(arrays)
    return ConstStats(
        host_bytes=store.host_nbytes,
        host_memory=store.host_memory,
        device_bytes=types.MappingProxyType(_per_device(buffers)),
        transfers=store.transfers,
        hits=store.hits,
        placements=len(store.arrays()),
        zero_copy=_aliasing(store, arrays, buffers)[0],
        residency=store.residency,
        evictions=store.evictions,
        retransfers=store.retransfers,
    )


def stats() -> Stats:
    """Accounting for every live constant: bytes on host and devices, transfers and cache hits.

    Counting hits costs one integer increment per use; switch it off with
    [`set_accounting`][frozenconst.set_accounting].

    Examples:
        >>> import numpy as np, jax.numpy as jnp, frozenconst
        >>> before = frozenconst.stats()
        >>> x = frozenconst.FrozenConst(np.zeros(1024, np.float32))
        >>> _ = [jnp.asarray(x) for _ in range(3)]
        >>> after = frozenconst.stats()
        >>> after.transfers - before.transfers, after.live_constants - before.live_constants
        (1, 1)
    """
    stores = list(STATE.live)
    buffers: dict[_Buffer, int] = {}
    aliased = 0
    for store in stores:
        arrays = store.arrays(device=True)
        own = _buffers(arrays)
        for key, nbytes in own.items():
            buffers[key] = max(buffers.get(key, 0), nbytes)
        aliased += _aliasing(store, arrays, own)[1]
    return Stats(
        live_constants=len(stores),
        host_bytes=sum(s.host_nbytes for s in stores),
        pinned_bytes=sum(s.memory.nbytes + sum(a.nbytes for a in s.arrays(device=False)) for s in stores),
        device_bytes=types.MappingProxyType(_per_device(buffers)),
        aliased_bytes=aliased,
        transfers=STATE.retired_transfers + sum(s.transfers for s in stores),
        hits=STATE.retired_hits + sum(s.hits for s in stores),
        evictions=STATE.retired_evictions + sum(s.evictions for s in stores),
        retransfers=STATE.retired_retransfers + sum(s.retransfers for s in stores),
    )
