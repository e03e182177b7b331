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
a 4 KiB page (rounded down to 64 bytes): a destination a few bytes *ahead* of
the source modulo 4 KiB makes the copy's loads wait on its own stores (4K
aliasing) and halved the copy's speed on this machine class (1.6 against
4.0 GB/s for 256 MiB).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import DTypeLike

from ._compat import Tracer
from ._errors import FrozenConstTypeError, FrozenConstValueError, TracedValueError

ALIGNMENT = 64
_PAGE = 4096
# Below this, matching the source's page offset is not worth the extra page
# (the copy of a few MiB is dominated by fixed costs).
_PAGE_MATCH_MIN_BYTES = 4 << 20


def _jax_dtypes() -> frozenset[np.dtype[Any]]:
    # Every scalar type that `jax.numpy` exposes (float32, bfloat16, float8_*,
    # int4, ...): a sweep over the namespace rather than a hand-kept list, so a
    # dtype added by a newer JAX is accepted without a change here.
    found: set[np.dtype[Any]] = set()
    for name in dir(jnp):
        obj = getattr(jnp, name, None)
        dtype: Any = getattr(obj, "dtype", None)
        if isinstance(obj, type) and isinstance(dtype, np.dtype):
            found.add(np.dtype(dtype))
    return frozenset(found)


SUPPORTED_DTYPES: frozenset[np.dtype[Any]] = _jax_dtypes()


def native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """`dtype` in this machine's byte order (JAX holds nothing else); the copy converts."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def check_dtype(dtype: np.dtype[Any], what: str) -> None:
    """Raise unless JAX can hold `dtype` (in any byte order)."""
    if native(dtype) in SUPPORTED_DTYPES:
        return
    if dtype.fields is not None:
        kind = "a structured dtype"
    elif dtype.kind == "O":
        kind = "an object dtype"
    elif dtype.kind in "USa":
        kind = "a string or bytes dtype"
    elif dtype.kind in "mM":
        kind = "a datetime dtype"
    else:
        kind = "a dtype JAX does not support"
    raise FrozenConstTypeError(
        f"FrozenConst cannot hold {what} of dtype `{dtype}` ({kind}). "
        "Convert it to a numeric dtype that JAX supports, such as float32, "
        "int32, bool or bfloat16."
    )


def to_numpy(obj: Any, dtype: DTypeLike | None) -> np.ndarray[Any, Any]:
    """Turn a user's value into a NumPy array (a view where possible), validated."""
    if type(obj) is np.ndarray and dtype is None:
        # The common case, without the checks that cannot apply to it.
        check_dtype(obj.dtype, "the `ndarray` it received")
        return obj
    if isinstance(obj, Tracer):
        aval: Any = getattr(obj, "aval", None)
        raise TracedValueError(
            f"FrozenConst needs a concrete value, but received a traced value "
            f"{type(obj).__name__ if aval is None else aval.str_short()} "
            "(this happens when it is built inside `jax.jit`, `jax.grad`, "
            "`jax.vmap` and similar). Build the FrozenConst outside the "
            "transformation and close over it, or pass it in as an argument."
        )
    if isinstance(obj, np.ma.MaskedArray):
        raise FrozenConstTypeError(
            "FrozenConst does not accept masked arrays: the mask would be lost. "
            "Pass `arr.filled(value)` or `np.asarray(arr.data)` explicitly."
        )
    if isinstance(obj, (str, bytes, bytearray)):
        raise FrozenConstTypeError(
            f"FrozenConst needs numeric data, but received a `{type(obj).__name__}`. "
            "Decode it to numbers first, for example with `np.frombuffer(data, dtype)`."
        )
    if isinstance(obj, jax.Array) and not obj.is_fully_addressable:
        raise FrozenConstValueError(
            "FrozenConst received a `jax.Array` that is not fully addressable from "
            "this process. Gather it first, for example with "
            "`jax.experimental.multihost_utils.process_allgather`."
        )
    want = None if dtype is None else _as_dtype(dtype)
    try:
        arr = np.asarray(obj)
    except ValueError as err:
        raise FrozenConstValueError(
            f"FrozenConst could not turn the `{type(obj).__name__}` it received into "
            f"a rectangular array ({err}). Nested sequences must be rectangular: "
            "every row the same length."
        ) from err
    except TypeError as err:
        raise FrozenConstTypeError(
            f"FrozenConst could not turn the `{type(obj).__name__}` it received into "
            f"an array ({err}). Pass a NumPy array, a `jax.Array`, a scalar or a "
            "nested sequence of numbers."
        ) from err
    check_dtype(arr.dtype, f"the `{type(obj).__name__}` it received")
    if want is not None:
        check_dtype(want, "the requested `dtype`")
    return arr


def _as_dtype(dtype: DTypeLike) -> np.dtype[Any]:
    try:
        return np.dtype(dtype)
    except TypeError as err:
        raise FrozenConstTypeError(f"`dtype` must be a NumPy or JAX dtype, but received {dtype!r}.") from err


def _address(array: np.ndarray[Any, Any]) -> int:
    # `__array_interface__` is several times cheaper than `array.ctypes.data`.
    address: int = array.__array_interface__["data"][0]
    return address


def freeze(src: np.ndarray[Any, Any], dtype: np.dtype[Any] | None = None) -> np.ndarray[Any, Any]:
    """Copy `src` (converted to `dtype`) once into a new, 64-byte aligned, read-only buffer."""
    dtype = native(src.dtype if dtype is None else dtype)
    nbytes = src.size * dtype.itemsize
    if nbytes >= _PAGE_MATCH_MIN_BYTES and src.flags.c_contiguous and src.dtype == dtype:
        # Same offset within a page as the source, rounded down to 64 bytes.
        source = _address(src)
        raw = np.empty(nbytes + _PAGE, np.uint8)
        offset = (source - source % ALIGNMENT - _address(raw)) % _PAGE
    else:
        raw = np.empty(nbytes + ALIGNMENT, np.uint8)
        offset = -_address(raw) % ALIGNMENT
    window = raw[offset : offset + nbytes]
    if nbytes:
        np.copyto(window.view(dtype).reshape(src.shape), src, casting="unsafe")
    # Hand the bytes over read-only through DLPack (as uint8, which every DLPack
    # version supports, whatever the dtype), then drop every writable reference.
    window.flags.writeable = False
    owned = np.from_dlpack(window)
    del raw, window
    return owned.view(dtype).reshape(src.shape)
