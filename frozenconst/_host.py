"""The frozen host buffer: one copy of the caller's data that nobody can write again.

NumPy lets whoever reaches the *owner* of a buffer switch `WRITEABLE` back on,
and every view exposes its owner through `.base`. So the owner here is a
`bytes` object: Python offers no way to make it writable, and a NumPy view of
it refuses `flags.writeable = True`.

The bytes object is allocated 64 bytes larger than the data so that the data
can start on a 64-byte boundary: JAX's CPU backend aliases such buffers instead
of copying them (jax #37830), which makes a CPU "device" copy free. The data is
copied in exactly once, through a short-lived writable view of the freshly
allocated, not yet shared bytes object.
"""

from __future__ import annotations

import ctypes
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import DTypeLike

from ._compat import Tracer
from ._errors import FrozenConstTypeError, FrozenConstValueError, TracedValueError

ALIGNMENT = 64


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
    if isinstance(obj, Tracer):
        raise TracedValueError(
            f"FrozenConst needs a concrete value, but received a traced value "
            f"{obj.aval.str_short() if hasattr(obj, 'aval') else type(obj).__name__} "
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


def freeze(src: np.ndarray[Any, Any], dtype: np.dtype[Any] | None = None) -> np.ndarray[Any, Any]:
    """Copy `src` (converted to `dtype`) once into a new, 64-byte aligned, read-only buffer."""
    dtype = native(src.dtype if dtype is None else dtype)
    nbytes = src.size * dtype.itemsize
    # bytes(n) is calloc'd by CPython: for large n the pages are mapped lazily
    # and touched once, by the copy below.
    owner = bytes(nbytes + ALIGNMENT)
    address = np.frombuffer(owner, np.uint8).ctypes.data
    offset = -address % ALIGNMENT
    if nbytes:
        # A writable window onto the new, still private bytes object. It is
        # dropped before this function returns, so the only references left
        # are read-only ones.
        window = memoryview((ctypes.c_char * nbytes).from_address(address + offset)).cast("B")
        target = np.frombuffer(window, dtype=dtype).reshape(src.shape)
        np.copyto(target, src, casting="unsafe")
        del target, window
    frozen = np.frombuffer(owner, dtype=dtype, count=src.size, offset=offset)
    return frozen.reshape(src.shape)


def is_frozen_buffer(arr: np.ndarray[Any, Any]) -> bool:
    """Whether `arr` is a view of a `freeze` buffer (read-only all the way down)."""
    base: Any = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, bytes)
