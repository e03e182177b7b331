"""The frozen host buffer: one copy of the caller's data that nobody can write again.

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
from typing import Any

import jax
import numpy as np
from numpy.typing import DTypeLike

from ._convert import as_dtype, check_castable, check_narrowing, held_dtype, to_numpy, value_check
from ._dtypes import native
from ._errors import FrozenConstValueError

ALIGNMENT = 64
_PAGE = 4096


# Memory-mapped sources are copied in blocks of this size (see `_copy_releasing`).
_RELEASE_BLOCK_BYTES = 8 << 20


# Below this, matching the source's page offset is not worth the extra page
# (the copy of a few MiB is dominated by fixed costs).
_PAGE_MATCH_MIN_BYTES = 4 << 20


# A checked conversion copies the source in blocks of about this size: each
# block is snapshotted, checked, then converted, so what is checked is what is
# held, however the caller's array changes meanwhile.
_CHECKED_BLOCK_BYTES = 1 << 20


def frozen_copy(obj: Any, dtype: DTypeLike | None = None, what: str | None = None) -> np.ndarray[Any, Any]:
    """What `FrozenConst(obj, dtype)` holds: validated, copied once, frozen.

    Refused (with a `FrozenConstTypeError` or `FrozenConstValueError` naming what
    was received): anything `to_numpy` refuses, a conversion that would change a
    value's integer (out of the requested dtype's range, NaN or infinite to an integer
    type) or drop imaginary parts, and integers JAX would wrap on the device
    under the current `jax_enable_x64`. Python data (scalars, nested sequences)
    converted by `dtype=` is converted element by element, as
    `np.asarray(obj, dtype=dtype)` and `jnp.asarray` do (a Python int goes to
    float32 through a Python float), once every value is known to fit.

    Examples:
        >>> import numpy as np
        >>> frozen_copy([1.5, 2.5], np.int8)
        array([1, 2], dtype=int8)
        >>> frozen_copy([300], np.uint8)
        Traceback (most recent call last):
        ...
        frozenconst.FrozenConstValueError: FrozenConst cannot convert the `list` it received to `uint8`: ...
    """
    what = f"the `{type(obj).__name__}` it received" if what is None else what
    array = to_numpy(obj, dtype, what)
    if dtype is None:
        # No dtype asked for: held as `jnp.asarray(obj)` holds it under the x64
        # setting now (float64 as float32 without x64), so the host holds what JAX
        # computes with, once. Integers JAX would wrap are refused, with the x64 advice.
        want = held_dtype(array.dtype)
        check_narrowing(array, want, what)
    else:
        want = native(as_dtype(dtype))
    if want != array.dtype and isinstance(obj, (list, tuple, int, float, complex)):
        check_castable(array.dtype, want, what)
        check = value_check(array.dtype, want, what)
        if check is not None:
            check(array)
        try:
            array = np.asarray(obj, dtype=want)
        except (OverflowError, ValueError, TypeError) as err:  # pragma: no cover - checked above
            raise FrozenConstValueError(f"FrozenConst cannot convert {what} to `{want}` ({err}).") from err
    host = freeze(array, want, what)
    check_narrowing(host, jax.dtypes.canonicalize_dtype(host.dtype), what)
    return host


def _address(array: np.ndarray[Any, Any]) -> int:
    # `__array_interface__` is several times cheaper than `array.ctypes.data`.
    address: int = array.__array_interface__["data"][0]
    return address


def freeze(
    src: np.ndarray[Any, Any], dtype: np.dtype[Any] | None = None, what: str = "its data"
) -> np.ndarray[Any, Any]:
    """Copy `src` (converted to `dtype`) once into a new, 64-byte aligned, read-only buffer.

    A conversion that could change a value's integer (to a narrower integer type,
    floats to integers) checks each block it converts and raises instead.
    """
    dtype = native(src.dtype if dtype is None else dtype)
    check = None
    if dtype != src.dtype:
        check_castable(src.dtype, dtype, what)  # some pairs of ml_dtypes types have no conversion
        check = value_check(src.dtype, dtype, what)
    nbytes = src.size * dtype.itemsize
    src_address = None
    if nbytes >= _PAGE_MATCH_MIN_BYTES and src.flags.c_contiguous and src.dtype == dtype:
        src_address = _address(src)
    raw, window = _aligned(nbytes, src_address)
    if nbytes:
        dest = window.view(dtype).reshape(src.shape)
        mapped = _read_only_map(src) if check is None and src.ndim and src.flags.c_contiguous else None
        if mapped is not None:
            _copy_releasing(dest, src, mapped)
        elif check is None:
            np.copyto(dest, src, casting="unsafe")
        else:
            _checked_copy(dest, src, check)
    del raw
    return _hand_over(window, dtype, src.shape)


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


def _copy_releasing(
    dest: np.ndarray[Any, Any], src: np.ndarray[Any, Any], mapped: tuple[mmap.mmap, int]
) -> None:
    # Block by block, handing each block's source pages back to the kernel once
    # copied (`MADV_DONTNEED` on a read-only file map drops them from this
    # process; they stay in the page cache and fault back in if read again).
    # Without it the copied file pages stay resident while the map lives, and
    # the build peaks at twice the constant's size.
    mm, base = mapped
    row_bytes = max(1, src.itemsize * (src.size // src.shape[0]))
    step = max(1, _RELEASE_BLOCK_BYTES // row_bytes)
    start_address = _address(src)
    for start in range(0, src.shape[0], step):
        np.copyto(dest[start : start + step], src[start : start + step], casting="unsafe")
        begin = start_address + start * row_bytes - base
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


def _checked_copy(
    dest: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    check: Callable[[np.ndarray[Any, Any]], None],
) -> None:
    # Block by block along the first axis: a snapshot of each block is checked,
    # then converted, so a caller writing `src` meanwhile cannot slip an
    # unchecked value in.
    if src.ndim == 0:
        block = np.array(src)
        check(block)
        np.copyto(dest, block, casting="unsafe")
        return
    row_bytes = max(1, src.itemsize * (src.size // src.shape[0]))
    step = max(1, _CHECKED_BLOCK_BYTES // row_bytes)
    for start in range(0, src.shape[0], step):
        block = np.array(src[start : start + step])
        check(block)
        np.copyto(dest[start : start + step], block, casting="unsafe")


def human_bytes(nbytes: int) -> str:
    """`nbytes` in the largest binary unit up to GiB it reaches: `1.5 KiB`, `512 B`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
