"""Partial constants: each process freezes only the slices its own devices address.

A constant whose sharding spans several processes, built from a source that can
be read by slice without loading it whole (a memory-mapped array, or a callback
`index -> array`), holds one frozen host buffer per distinct index that this
process's devices address: devices that replicate a slice share one buffer.
Each slice is frozen as a whole constant is (`_host.freeze`: an owned copy,
64-byte aligned, read-only down to its owner), so on JAX's CPU backend each
device buffer aliases its slice instead of copying it (jax #37830). The global
`jax.Array` is assembled from the per-device buffers with the public
`jax.make_array_from_single_device_arrays`: nothing moves between processes.
"""

from __future__ import annotations

import mmap
import operator
from collections.abc import Callable
from typing import Any, TypeAlias

import jax
import numpy as np
from jax.sharding import Sharding
from numpy.typing import DTypeLike

from ._cache import STATE, Store
from ._compat import Device, single_device_sharding
from ._convert import as_dtype, check_narrowing, frozen_copy
from ._dtypes import check_dtype, native
from ._errors import FrozenConstTypeError, FrozenConstValueError, NotAddressableError
from ._frames import warn_degraded
from ._host import HostPlan, freeze, freeze_parts, human_bytes
from ._host_memory import HostMemory, Residency
from ._targets import Target

# An index as (start, stop) per axis: hashable, and the same for equal slices
# however JAX spelled them (`slice(None)` or `slice(0, n)`).
Bounds: TypeAlias = tuple[tuple[int, int], ...]
# What `jax.make_array_from_callback` passes its callback: one slice per axis.
Index: TypeAlias = tuple[slice, ...]

_GATHER = "jax.experimental.multihost_utils.process_allgather(x.on(x.declared_sharding), tiled=True)"


def _key(index: Index, shape: tuple[int, ...]) -> Bounds:
    # JAX's shardings give contiguous slices (step 1) along every axis.
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def describe(key: Bounds, shape: tuple[int, ...]) -> str:
    """An index in NumPy's words: `[0:32, :]`."""
    parts = [":" if (a, b) == (0, n) else f"{a}:{b}" for (a, b), n in zip(key, shape, strict=True)]
    return f"[{', '.join(parts)}]"


def lazily_sliceable(obj: object) -> bool:
    """Whether `obj` is a NumPy array backed by a memory map (`np.memmap`, `np.load(..., mmap_mode=...)`
    or a view of either): a slice of it reads only that slice's pages."""
    seen = 0
    while isinstance(obj, np.ndarray) and seen < 64:
        if isinstance(obj, np.memmap):
            return True
        obj = obj.base
        seen += 1
    return isinstance(obj, mmap.mmap)


def spans_processes(sharding: Sharding) -> bool:
    """Whether some of `sharding`'s devices are in other processes. (Not
    `not sharding.is_fully_addressable`: jax 0.6.2 says a `SingleDeviceSharding`
    on another process's device is fully addressable.)"""
    here = jax.process_index()
    devices: set[Device] = sharding.device_set
    return any(d.process_index != here for d in devices)


def _indices(sharding: Sharding, shape: tuple[int, ...]) -> dict[Device, Index]:
    # Filtered by process: jax 0.6.2 counts a `SingleDeviceSharding`'s device
    # as addressable wherever it is.
    indices: dict[Device, Index] = sharding.addressable_devices_indices_map(shape)  # type: ignore[assignment]
    here = jax.process_index()
    return {device: index for device, index in indices.items() if device.process_index == here}


def _distinct(sharding: Sharding, shape: tuple[int, ...]) -> dict[Bounds, Index]:
    # Each slice this process's devices address, once, with the index JAX gives its first device.
    found: dict[Bounds, Index] = {}
    for index in _indices(sharding, shape).values():
        found.setdefault(_key(index, shape), index)
    return found


class PartialStore(Store):
    """The frozen slices of a constant that this process's devices address, and the
    device buffers made from them. A process holds the constant whole only where its
    devices address all of it (a sharding replicated across processes); it may hold
    no slice at all (none of the sharding's devices is in this process).

    Attributes:
        home: the declared sharding the slices were chosen by.
        slices: the frozen host buffer of each distinct addressable index.
        built_from: where the data came from, in words, for messages.
    """

    __slots__ = ("_home", "built_from", "slices")

    partial = True

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        home: Sharding,
        slices: dict[Bounds, np.ndarray[Any, Any]],
        built_from: str,
    ) -> None:
        self._home = home
        self.slices = slices
        self.built_from = built_from
        self._setup(shape, dtype)
        STATE.live.add(self)

    @property
    def home(self) -> Sharding:
        """The declared sharding, which every use gets."""
        return self._home

    # -- the host side: slices only ---------------------------------------------

    @property
    def host(self) -> np.ndarray[Any, Any]:
        """The whole frozen host buffer, where this process holds it (a sharding replicated
        across processes); refused otherwise."""
        return self.whole("its whole host buffer")

    def whole(self, what: str, extra: str = "") -> np.ndarray[Any, Any]:
        """The whole host buffer, which `what` (an operation, in words) needs; refused, with
        `extra` said after the advice, where this process holds only slices."""
        # Under a sharding replicated across processes every process's devices
        # address the whole constant: each holds it whole, as one slice.
        part = self.slices.get(tuple((0, n) for n in self.shape))
        if part is not None:
            return part
        raise NotAddressableError(
            f"`{what}` needs the whole constant ({self.dtype}{list(self.shape)}), but process "
            f"{jax.process_index()} of {jax.process_count()} holds only the slices its devices address "
            f"under {self.home}: {self.held()} ({self.host_nbytes} bytes). It was built from "
            f"{self.built_from} with a sharding that spans several processes, so no process holds it "
            f"whole. Gather it with a collective that every process calls, `{_GATHER}` (each "
            "process then holds the whole constant), or work on this process's slices: "
            f"`[(s.index, s.data) for s in x.on(x.declared_sharding).addressable_shards]`.{extra}"
        )

    @property
    def fingerprint(self) -> str:
        """The content digest where this process holds the whole constant; refused otherwise."""
        self.whole(
            "x.fingerprint",
            " A fingerprint is a SHA-256 over the whole data in order, which digests of "
            "separate slices cannot be combined into; fingerprint the gathered array "
            "(`FrozenConst(gathered).fingerprint`, the same value on every process).",
        )
        return super().fingerprint

    def host_buffers(self) -> tuple[np.ndarray[Any, Any], ...]:
        return tuple(self.slices.values())

    def check_device_dtype(self, dtype: np.dtype[Any]) -> None:
        for part in self.slices.values():
            check_narrowing(part, dtype)

    def in_host_memory(self, host_memory: HostMemory) -> Store:
        """This store: its slices stay in pageable memory (`pageable` says so once for "pinned")."""
        pageable(host_memory)
        return self

    def held(self) -> str:
        """The slices held, in words."""
        if not self.slices:
            return "no slice (none of its devices is in this process)"
        return ", ".join(describe(k, self.shape) for k in self.slices)

    def describe(self) -> str:
        """The constant's `repr`: what this process holds."""
        return (
            f"FrozenConst(shape={self.shape}, dtype={self.dtype}, process {jax.process_index()} "
            f"holds {self.held()}, {human_bytes(self.host_nbytes)})"
        )

    # -- the device side ---------------------------------------------------------

    def declare(self, target: Target) -> Sharding:
        """As `Store.declare`, and refused now where the sharding needs slices not held here."""
        sharding = super().declare(target)
        self.parts(sharding)
        return sharding

    def parts(self, sharding: Sharding) -> dict[Device, np.ndarray[Any, Any]]:
        """The host data for each of this process's devices under `sharding`: a held
        slice, or a view of one that contains it. Raises if some are not held."""
        found: dict[Device, np.ndarray[Any, Any]] = {}
        missing: list[str] = []
        for device, index in _indices(sharding, self.shape).items():
            key = _key(index, self.shape)
            part = self.slices[key] if key in self.slices else self._within(key)
            if part is None:
                missing.append(f"{describe(key, self.shape)} for {device}")
            else:
                found[device] = part
        if missing:
            raise NotAddressableError(
                f"`x.on({sharding})` needs slices this process does not hold: {', '.join(missing)}. "
                f"Process {jax.process_index()} holds only {self.held()}, the slices its devices "
                f"address under the declared sharding {self.home}; the constant was built from "
                f"{self.built_from}, and no process holds it whole. Reshard the array it holds with a "
                "collective every process calls, `jax.jit(lambda a: a, out_shardings=target)"
                "(x.on(x.declared_sharding))`, or build the constant with the sharding you need."
            )
        return found

    def _within(self, key: Bounds) -> np.ndarray[Any, Any] | None:
        # A finer sharding (8 slices where 4 are held) is served by views.
        for held, part in self.slices.items():
            if all(h0 <= k0 and k1 <= h1 for (h0, h1), (k0, k1) in zip(held, key, strict=True)):
                view: np.ndarray[Any, Any] = part[
                    tuple(slice(k0 - h0, k1 - h0) for (h0, _), (k0, k1) in zip(held, key, strict=True))
                ]
                return view
        return None

    def _transfer(self, sharding: Sharding | None, dtype: np.dtype[Any]) -> jax.Array:
        # `Store._fill` gives a use without a sharding the declared one, `home`.
        sharding = self.home if sharding is None else sharding
        parts = self.parts(sharding)
        convert = self.dtype != dtype
        arrays = []
        for device, part in parts.items():
            target = single_device_sharding(device, memory_kind=sharding.memory_kind)
            arrays.append(jax.device_put(part.astype(dtype) if convert else part, target))
            self.transfers += 1  # called under the lock, once per addressable device
        # `dtype=`: with none of the sharding's devices in this process there is
        # no buffer to take it from, and JAX then needs it (as `jax.device_put`
        # to another process's device gives an array with no addressable shards).
        return jax.make_array_from_single_device_arrays(self.shape, sharding, arrays, dtype=dtype)


def pageable(host_memory: HostMemory) -> None:
    """Say once, where "pinned" was asked for, that a partial constant's slices stay pageable.

    Each slice would need its own page-locked buffer on the device that reads it,
    and the finer placements served by views of a slice (`PartialStore.parts`)
    would need JAX to slice page-locked memory; neither is built (docs/host-memory.md).
    """
    if host_memory == "pinned":
        warn_degraded(
            "`host_memory='pinned'` was asked for a constant whose sharding spans several processes: "
            "its slices stay in pageable memory, and transfers read them at pageable speed "
            "(docs/host-memory.md)."
        )


def frozen_store(
    plan: HostPlan, home: Sharding | None, host_memory: HostMemory, residency: Residency
) -> Store:
    """The store `plan` is frozen into, declared on `home`: where the source is memory-mapped (a
    slice reads only its pages) and `home` spans several processes, the slices this process's
    devices address, each frozen as `plan` says; else the whole, in `host_memory` and `residency`."""
    view = plan.source
    if home is not None and lazily_sliceable(view) and spans_processes(home):
        pageable(host_memory)
        indices = _distinct(home, view.shape)
        return PartialStore(
            view.shape,
            plan.dtype,
            home,
            {key: freeze(plan._replace(source=view[index])) for key, index in indices.items()},
            "a memory-mapped array",
        )
    host = freeze(plan)
    return Store(host, host_memory, weak=plan.weak, residency=residency)


def as_shape(shape: Any) -> tuple[int, ...]:
    """`shape` as a tuple of non-negative ints, refused as NumPy and JAX refuse it
    (`np.zeros((8.9, 4))` raises TypeError): never truncated."""
    try:
        dims = (operator.index(shape),) if not hasattr(shape, "__iter__") else tuple(shape)
        full = tuple(operator.index(n) for n in dims)
    except TypeError as err:
        raise FrozenConstTypeError(
            f"FrozenConst.from_callback needs `shape` as a tuple of ints, but received {shape!r} "
            f"({err}). Pass whole numbers, for example `(8, 4)`: a float is never rounded."
        ) from err
    if any(n < 0 for n in full):
        raise FrozenConstValueError(
            f"FrozenConst.from_callback needs `shape` of non-negative ints, but received {full}."
        )
    return full


def from_callback(
    shape: tuple[int, ...],
    sharding: Sharding,
    data_callback: Callable[[Index], Any],
    dtype: DTypeLike | None,
    host_memory: HostMemory = "pageable",
) -> Store:
    """The store of `FrozenConst.from_callback`: partial where `sharding` spans several processes.

    With `dtype` None, the dtype of the first slice returned (as `jnp.asarray` holds
    it: float64 as float32 without x64), as `jax.make_array_from_callback` takes
    it; every slice must then have it. `host_memory` places a whole constant.
    """
    full = as_shape(shape)
    requested = want = None if dtype is None else native(as_dtype(dtype))
    if requested is not None:
        check_dtype(requested, "the data `data_callback` returns", requested=True)
    slices: dict[Bounds, np.ndarray[Any, Any]] = {}
    indices = _distinct(sharding, full)
    for key, index in indices.items():
        where = describe(key, full)
        # Frozen (copied) at once: what the callback returned stays the caller's.
        part = frozen_copy(
            data_callback(index), requested, f"the value `data_callback` returned for index {where}"
        )
        expected = tuple(b - a for a, b in key)
        if part.shape != expected:
            raise FrozenConstValueError(
                f"`data_callback` returned an array of shape {part.shape} for index {where}, which "
                f"selects shape {expected} of the constant's {full}. Return the slice itself, "
                "`whole[index]` (or the same data read from storage), not the whole array or a reshaped one."
            )
        if want is None:
            want = part.dtype
        elif part.dtype != want:
            raise FrozenConstTypeError(
                f"`data_callback` returned {part.dtype} data for index {where} and {want} data "
                f"for index {describe(next(iter(slices)), full)}: without `dtype=`, every slice "
                "must have the dtype of the first (as `jax.make_array_from_callback` requires). "
                "Pass `dtype=` to convert every slice to one dtype."
            )
        slices[key] = part
    if want is None:
        raise FrozenConstValueError(
            f"FrozenConst.from_callback needs `dtype=` here: none of the devices of {sharding} is in "
            f"process {jax.process_index()}, so `data_callback` is never called and no slice tells "
            "the dtype (`jax.make_array_from_callback` needs it in the same case). Pass the dtype "
            "every process uses, for example `dtype=np.float32`."
        )
    if not spans_processes(sharding):
        # Every slice is here: one whole buffer, as `FrozenConst(array)` holds.
        return Store(freeze_parts(full, want, [(indices[k], p) for k, p in slices.items()]), host_memory)
    pageable(host_memory)
    return PartialStore(full, want, sharding, slices, "`FrozenConst.from_callback`")
