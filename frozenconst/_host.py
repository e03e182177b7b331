"""The frozen host buffer: one copy of the caller's data that nobody can write again.

What is copied, into which dtype and with which checks is decided before, once,
into a `HostPlan` (`_convert.host_plan`); `freeze` carries it out and decides
nothing about dtypes.

NumPy lets whoever reaches the *owner* of a buffer switch `WRITEABLE` back on,
and every view leads to its owner through `.base`. So the data is copied once
into a fresh NumPy allocation, which is then handed over, read-only, through
DLPack: the arrays we give out are views of `np.from_dlpack`'s result, whose
owner is an opaque DLPack capsule. Python offers no way from a capsule back to
the writable allocation, and NumPy refuses `flags.writeable = True` on every
array in the chain.

The data starts on a 64-byte boundary: JAX's CPU backend aliases such buffers
instead of copying them (jax #37830), which makes a CPU "device" copy free.
For large arrays the destination is also placed at the source's offset within
a page (rounded down to 64 bytes): a destination a few bytes *ahead* of the
source modulo the page size makes the copy's loads wait on its own stores (4K
aliasing), which slows the copy of large arrays well below `np.copy`'s
(`python -m benchmarks core`, table "Construction", rows of 64 MiB and more;
the figures are in `docs/results/performance-results.md`).
"""

from __future__ import annotations

import contextlib
import math
import mmap
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

ALIGNMENT = 64
_PAGE = 4096


# Memory-mapped sources are copied in blocks of this size, each block's source
# pages handed back once copied (see `_copy_blocks`).
_RELEASE_BLOCK_BYTES = 8 << 20


# Below this, matching the source's page offset is not worth the extra page
# (the copy of a few MiB is dominated by fixed costs).
_PAGE_MATCH_MIN_BYTES = 4 << 20


# A checked copy goes in blocks of about this size, each checked while it is in
# the cache; what is checked is what is held, however the caller's array changes
# meanwhile (see `HostPlan`).
_CHECKED_BLOCK_BYTES = 1 << 20


class HostPlan(NamedTuple):
    """A construction, decided before anything is copied (`_convert.host_plan`): what `freeze` copies.

    `source` is copied once into `dtype`. `check` refuses a value the conversion
    would change: run on a snapshot of each block of `source` before it is
    converted, so a caller writing `source` meanwhile cannot slip an unchecked
    value in. `held_check` refuses a value JAX would change on the device (64-bit
    integers without x64): run on each block as held, which nobody else can write.
    `weak`: a Python scalar, weakly typed as `jnp.asarray` types one.
    """

    source: np.ndarray[Any, Any]
    dtype: np.dtype[Any]
    weak: bool = False
    check: Callable[[np.ndarray[Any, Any]], None] | None = None
    held_check: Callable[[np.ndarray[Any, Any]], None] | None = None


def _address(array: np.ndarray[Any, Any]) -> int:
    # `__array_interface__` is several times cheaper than `array.ctypes.data`.
    address: int = array.__array_interface__["data"][0]
    return address


def freeze(plan: HostPlan) -> np.ndarray[Any, Any]:
    """Copy `plan.source`, converted to `plan.dtype` and checked as `plan` says, once into a new,
    64-byte aligned, read-only buffer."""
    source, dtype = plan.source, plan.dtype
    nbytes = source.size * dtype.itemsize
    src_address = None
    if nbytes >= _PAGE_MATCH_MIN_BYTES and source.flags.c_contiguous and source.dtype == dtype:
        src_address = _address(source)
    raw, window = _aligned(nbytes, src_address)
    if nbytes:
        dest = window.view(dtype).reshape(source.shape)
        mapped = _read_only_map(source) if source.ndim and source.flags.c_contiguous else None
        if mapped is None and plan.check is None and plan.held_check is None:
            np.copyto(dest, source, casting="unsafe")
        else:
            _copy_blocks(dest, plan, mapped)
    del raw
    return _hand_over(window, dtype, source.shape)


def _read_only_map(src: np.ndarray[Any, Any]) -> tuple[mmap.mmap, int] | None:
    """The read-only file map `src` lies in (`np.load(..., mmap_mode="r")`, `np.memmap(mode="r")`)
    and the address where the map starts, or None."""
    obj: Any = src
    for _ in range(64):
        mm = getattr(obj, "_mmap", None) if isinstance(obj, np.memmap) and obj.mode == "r" else None
        if isinstance(mm, mmap.mmap):
            return mm, _address(np.frombuffer(mm, np.uint8))
        if not isinstance(obj, np.ndarray):
            return None
        obj = obj.base
    return None


def _copy_blocks(dest: np.ndarray[Any, Any], plan: HostPlan, mapped: tuple[mmap.mmap, int] | None) -> None:
    # Block by block along the first axis (a scalar is one block): a block to check
    # is snapshotted, checked, then converted; its held values are checked in
    # `dest`. A read-only file map's copied pages are handed back to the kernel
    # (`MADV_DONTNEED` drops them from this process; they stay in the page cache):
    # without it they stay resident while the map lives, and the build peaks at
    # twice the constant's size.
    src = plan.source.reshape(1) if plan.source.ndim == 0 else plan.source
    dest = dest.reshape(src.shape)
    checked = plan.check is not None or plan.held_check is not None
    row_bytes = max(1, src.itemsize * (src.size // src.shape[0]))
    step = max(1, (_CHECKED_BLOCK_BYTES if checked else _RELEASE_BLOCK_BYTES) // row_bytes)
    mm, offset = (None, 0) if mapped is None else (mapped[0], _address(src) - mapped[1])
    for start in range(0, src.shape[0], step):
        block, held = src[start : start + step], dest[start : start + step]
        if plan.check is not None:
            block = np.array(block)
            plan.check(block)
        np.copyto(held, block, casting="unsafe")
        if plan.held_check is not None:
            plan.held_check(held)
        if mm is not None:
            begin = offset + start * row_bytes
            end = min(begin + step * row_bytes, len(mm))
            first = begin - begin % mmap.PAGESIZE
            with contextlib.suppress(OSError, ValueError, AttributeError):  # a kernel without madvise
                mm.madvise(mmap.MADV_DONTNEED, first, end - first)


def _aligned(
    nbytes: int, src_address: int | None = None
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A fresh allocation and, inside it, a 64-byte aligned window of `nbytes` bytes.

    With `src_address` (the address of the data to be copied in), the window sits at
    the source's offset within a 4 KiB page, rounded down to 64 bytes.
    """
    if src_address is not None:
        raw = np.empty(nbytes + _PAGE, np.uint8)
        offset = (src_address - src_address % ALIGNMENT - _address(raw)) % _PAGE
    else:
        raw = np.empty(nbytes + ALIGNMENT, np.uint8)
        offset = -_address(raw) % ALIGNMENT
    return raw, raw[offset : offset + nbytes]


def _hand_over(
    window: np.ndarray[Any, Any], dtype: np.dtype[Any], shape: tuple[int, ...]
) -> np.ndarray[Any, Any]:
    # Hand the bytes over read-only through DLPack (as uint8, which every DLPack
    # version supports, whatever the dtype); the caller drops every writable reference.
    window.flags.writeable = False
    owned = np.from_dlpack(window)
    del window
    return owned.view(dtype).reshape(shape)


def freeze_parts(
    shape: tuple[int, ...], dtype: np.dtype[Any], parts: list[tuple[tuple[slice, ...], np.ndarray[Any, Any]]]
) -> np.ndarray[Any, Any]:
    """One frozen buffer of `shape` and `dtype` filled from `(index, data)` parts, each
    already of `dtype` and of its index's shape, that together cover it."""
    raw, window = _aligned(math.prod(shape) * dtype.itemsize)
    if window.size:
        dest = window.view(dtype).reshape(shape)
        for index, data in parts:
            np.copyto(dest[index], data)
    del raw
    return _hand_over(window, dtype, shape)


def human_bytes(nbytes: int) -> str:
    """`nbytes` in the largest binary unit up to GiB it reaches: `1.5 KiB`, `512 B`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
