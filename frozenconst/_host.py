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

import contextlib
import math
import mmap
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import DTypeLike

from ._compat import Tracer, eval_context, ml_dtypes_category
from ._errors import FrozenConstTypeError, FrozenConstValueError, TracedValueError

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
# NumPy refuses deeper nesting anyway; the scan of nested sequences stops there.
_MAX_NESTING = 64
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _jax_dtypes() -> frozenset[np.dtype[Any]]:
    # Every scalar type that `jax.numpy` exposes (float32, bfloat16, float8_*,
    # int4, ...): a sweep over the namespace rather than a hand-kept list, so a
    # dtype added by a newer JAX is a candidate without a change here.
    found: set[np.dtype[Any]] = set()
    for name in dir(jnp):
        obj = getattr(jnp, name, None)
        dtype: Any = getattr(obj, "dtype", None)
        if isinstance(obj, type) and isinstance(dtype, np.dtype):
            found.add(np.dtype(dtype))
    return frozenset(found)


# The dtypes `jax.numpy` names: the candidates. Naming one is not holding it
# (jax 0.10 names float6_e2m3fn, and its CPU client refuses to transfer it), so
# whether the installed JAX can hold one is `supported(dtype)`.
SUPPORTED_DTYPES: frozenset[np.dtype[Any]] = _jax_dtypes()

# NumPy's own numeric dtypes and bfloat16: every JAX backend holds them, so they
# are never probed (and building a constant of them does not start a backend).
_ALWAYS_SUPPORTED: frozenset[np.dtype[Any]] = SUPPORTED_DTYPES & frozenset(
    np.dtype(t)
    for t in (
        *(np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64),
        *(np.float16, np.float32, np.float64, np.complex64, np.complex128, jnp.bfloat16),
    )
)
_PROBED: dict[np.dtype[Any], bool] = {}
_PROBE_LOCK = threading.Lock()


def _probe(dtype: np.dtype[Any]) -> bool:
    # Two elements to the default device, through a compiled function, and back:
    # what every use of a constant needs. jax 0.10 names float6 types its CPU
    # client cannot transfer; int1 arrays transfer but no compiled program takes
    # them. Run eagerly even inside a trace, whatever the transfer guard says.
    sample = np.zeros(2, dtype)
    try:
        with eval_context(), jax.transfer_guard("allow"):
            on_device = jax.device_put(sample)
            back = np.asarray(on_device)
            reversed_back = np.asarray(jax.jit(lambda v: v[::-1])(on_device))
    except Exception:  # XLA's refusals are runtime errors of its own; any failure means "cannot hold"
        return False
    return all(a.dtype == dtype and a.tobytes() == sample.tobytes() for a in (back, reversed_back))


def supported(dtype: np.dtype[Any]) -> bool:
    """Whether the installed JAX can hold `dtype` (in any byte order) on its default backend.

    Decided once per dtype: NumPy's numeric dtypes and bfloat16 always; any other
    dtype `jax.numpy` names by transferring two elements of it, through a
    compiled function, and back (which starts JAX's default backend, once).
    """
    dtype = native(dtype)
    if dtype in _ALWAYS_SUPPORTED:
        return True
    if dtype not in SUPPORTED_DTYPES:
        return False
    found = _PROBED.get(dtype)
    if found is None:
        with _PROBE_LOCK:
            found = _PROBED.get(dtype)
            if found is None:
                found = _PROBED[dtype] = _probe(dtype)
    return found


def native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """`dtype` in this machine's byte order (JAX holds nothing else); the copy converts."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def _suggestion(dtype: np.dtype[Any]) -> str:
    category = _category(dtype)
    if category == "f":
        return "float32, bfloat16 or float8_e4m3fn (for example `dtype=np.float32`)"
    if category == "i":
        return "int8, int32 or uint8 (for example `dtype=np.int8`)"
    return "float32, int32, bool or bfloat16"


def check_dtype(dtype: np.dtype[Any], what: str, requested: bool = False) -> None:
    """Raise unless the installed JAX can hold `dtype` (in any byte order)."""
    if supported(dtype):
        return
    if dtype.fields is not None:
        kind = "a structured dtype"
    elif dtype.kind == "O":
        kind = "an object dtype"
    elif dtype.kind in "USa":
        kind = "a string or bytes dtype"
    elif dtype.kind in "mM":
        kind = "a datetime dtype"
    elif native(dtype) in SUPPORTED_DTYPES:
        kind = f"named by `jax.numpy`, but JAX {jax.__version__} cannot transfer it to its default device"
    else:
        kind = "not a dtype JAX supports"
    subject = "the requested dtype" if requested else "its dtype"
    raise FrozenConstTypeError(
        f"FrozenConst cannot hold {what}: {subject} `{dtype}` is {kind}. "
        f"Convert it to a numeric dtype that JAX supports, such as {_suggestion(dtype)}."
    )


def _check_numeric(dtype: np.dtype[Any], what: str) -> None:
    # A source converted by `dtype=` need not be a dtype JAX holds (float6 data
    # to float32 is fine), but it must be numbers.
    if _category(dtype) == "" and not supported(dtype):
        check_dtype(dtype, what)


def _category(dtype: np.dtype[Any]) -> str:
    """The kind of numbers: `b` bool, `i` integer, `f` floating, `c` complex (ml_dtypes'
    types too), or an empty string for anything else."""
    if dtype.kind == "b":
        return "b"
    if dtype.fields is not None or (dtype.kind in "OUSaVmM" and dtype.type.__module__ == "numpy"):
        return ""
    if jnp.issubdtype(dtype, jnp.integer):
        return "i"
    if jnp.issubdtype(dtype, jnp.floating):
        return "f"
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return "c"
    return ml_dtypes_category(dtype)  # a type this JAX's `jnp` does not know


# `jnp.iinfo` (ml_dtypes' `iinfo`) knows int4, int2 and friends too; it is untyped.
_iinfo: Callable[[Any], Any] = jnp.iinfo


def _int_range(dtype: np.dtype[Any]) -> tuple[int, int]:
    info = _iinfo(dtype)
    return int(info.min), int(info.max)


def _out_of_range(values: np.ndarray[Any, Any], lo: int, hi: int) -> Any:
    """A value of `values` that does not truncate into `[lo, hi]` (NaN and infinities never do), or None."""
    if values.size == 0:
        return None
    with np.errstate(all="ignore"):  # NaN in a reduction of ml_dtypes floats warns
        smallest, largest = values.min(), values.max()
    if _category(values.dtype) == "i":
        small, large = int(smallest), int(largest)
        if small < lo:
            return small
        return large if large > hi else None
    # Floats truncate towards zero: anything strictly between lo - 1 and hi + 1
    # lands in range. Python compares its ints and floats exactly.
    low, high = float(smallest), float(largest)
    if low != low:  # NaN: `min` propagates it
        return low
    if not low > lo - 1:
        return low
    return high if not high < hi + 1 else None


def _value_check(
    source: np.dtype[Any], target: np.dtype[Any], what: str
) -> Callable[[np.ndarray[Any, Any]], None] | None:
    """How to check, block by block, that converting `source` data to `target` keeps
    every value (None when every value converts), or raise when no value would."""
    s, t = _category(source), _category(target)
    if s == "c" and t == "b":
        raise FrozenConstTypeError(
            f"FrozenConst will not convert {what}, of dtype `{source}`, to `bool`: NumPy and "
            "`jnp.asarray` make each value True wherever its real or imaginary part is non-zero, "
            "which is rarely what a constant means. Pass `obj != 0` explicitly if that is what "
            "you want, or ask for a complex dtype."
        )
    if s == "c" and t != "c":
        raise FrozenConstTypeError(
            f"FrozenConst will not convert {what}, of dtype `{source}`, to `{target}`: that "
            "discards the imaginary parts (NumPy's cast drops them with a ComplexWarning, and "
            "`jnp.asarray` refuses a complex Python value there with a TypeError). Pass "
            "`np.real(obj)` explicitly, or ask for a complex dtype."
        )
    if t != "i" or s == "b":
        # To bool, floats and complex: NumPy's and `jnp.asarray`'s conversion,
        # rounding to nearest (values beyond a float type's range become inf,
        # or NaN for the float8 types without inf).
        return None
    lo, hi = _int_range(target)
    if s == "i":
        src_lo, src_hi = _int_range(source)
        if lo <= src_lo and src_hi <= hi:
            return None

    if s == "i":
        # Checked: `np.array([300]).astype(np.uint8)` is [44], without a warning;
        # `jnp.asarray([300], jnp.uint8)` raises OverflowError.
        others = (
            "NumPy's cast would wrap it silently, and `jnp.asarray` refuses such a Python int "
            "(OverflowError). Convert the data yourself first (for example `np.clip`, or "
            "`arr.astype(dtype)` if wrapping is what you want), or choose a wider dtype."
        )
    else:
        # Checked: NumPy casts NaN or 1e10 to int32 as -2**31 (with a RuntimeWarning
        # for NumPy's own floats); `jnp.asarray` raises OverflowError or ValueError.
        others = (
            "NumPy's cast would give an arbitrary integer for it, and `jnp.asarray` refuses such "
            "a Python float (OverflowError, or ValueError for NaN). Convert the data yourself "
            "first (for example `np.clip`, `np.nan_to_num`), or choose a wider dtype."
        )

    def check(block: np.ndarray[Any, Any]) -> None:
        bad = _out_of_range(block, lo, hi)
        if bad is not None:
            raise FrozenConstValueError(
                f"FrozenConst cannot convert {what} to `{target}`: it holds {bad!r}, which `{target}` "
                f"cannot hold (its range is {lo} to {hi}; NaN and infinities have no integer value). "
                + others
            )

    return check


def check_narrowing(host: np.ndarray[Any, Any], device_dtype: DTypeLike, what: str = "its host data") -> None:
    """Raise unless JAX can transfer `host` as `device_dtype` without changing a value's integer.

    Without `jax_enable_x64`, JAX narrows int64 data to int32 and uint64 to
    uint32 on the device, wrapping every value outside the narrow range
    (`jax.device_put(np.array([2**40]))` holds 0). Float narrowing (float64 to
    float32) is allowed: it rounds, as `jnp.asarray` does, and values beyond
    float32's range become infinities. Cheap when nothing narrows; otherwise
    one pass over the data (for 64-bit integers only).

    Example:
        >>> import numpy as np
        >>> check_narrowing(np.array([1, 2**40]), np.int64)
        >>> check_narrowing(np.array([1, 2**40]), np.int32)
        Traceback (most recent call last):
        ...
        frozenconst.FrozenConstValueError: FrozenConst cannot put its host data on a device as int32: ...
    """
    device = np.dtype(device_dtype)
    if device == host.dtype or _category(device) != "i" or _category(host.dtype) != "i":
        return
    lo, hi = _int_range(device)
    src_lo, src_hi = _int_range(host.dtype)
    if lo <= src_lo and src_hi <= hi:
        return
    bad = _out_of_range(host, lo, hi)
    if bad is None:
        return
    raise FrozenConstValueError(
        f"FrozenConst cannot put {what} on a device as {device}: it holds the {host.dtype} value "
        f"{bad}, outside {device}'s range ({lo} to {hi}). JAX narrows {host.dtype} to {device} "
        "while `jax_enable_x64` is off, and would wrap that value silently (`jnp.asarray` raises "
        "OverflowError for such a Python int). Turn x64 on (`jax.config.update('jax_enable_x64', "
        "True)`), or convert the data to a dtype that holds it on the device (for example "
        "`dtype=np.float32`, which rounds)."
    )


_PLAIN = frozenset({float, bool, complex})


def _check_leaves(obj: list[Any] | tuple[Any, ...], what: str) -> None:
    # What `np.asarray` would lose or `jnp.asarray` refuses inside nested
    # sequences: a masked array (NumPy keeps the data and drops the mask), and
    # Python ints outside int64 (JAX holds Python ints as int64 at most). The
    # common rows (all floats, all ints, all rows) are checked at C speed.
    stack: list[tuple[list[Any] | tuple[Any, ...], int]] = [(obj, 0)]
    while stack:
        sequence, depth = stack.pop()
        kinds = set(map(type, sequence))
        if kinds <= _PLAIN:
            continue
        if kinds == {int}:
            if sequence and not (min(sequence) >= _INT64_MIN and max(sequence) <= _INT64_MAX):
                _check_python_int(next(v for v in sequence if not _INT64_MIN <= v <= _INT64_MAX), what)
            continue
        for item in sequence:
            if type(item) in _PLAIN:
                continue
            if isinstance(item, int) and not isinstance(item, np.integer):
                _check_python_int(item, what)
            elif isinstance(item, (list, tuple)):
                if depth < _MAX_NESTING:
                    stack.append((item, depth + 1))
            elif isinstance(item, np.ma.MaskedArray):
                raise _masked(f"{what} holds one")


def _check_python_int(value: int, what: str) -> None:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise FrozenConstValueError(
            f"FrozenConst cannot hold {what}: it holds the Python int {value}, outside the int64 "
            "range JAX holds Python ints in (`jnp.asarray` raises OverflowError for it). Pass it as "
            "a float (`float(value)`), or as a NumPy array with an explicit dtype (`np.uint64`)."
        )


def _masked(what: str) -> FrozenConstTypeError:
    return FrozenConstTypeError(
        f"FrozenConst does not accept masked arrays ({what}): the mask would be lost. "
        "Pass `arr.filled(value)` or `np.asarray(arr.data)` explicitly."
    )


def to_numpy(obj: Any, dtype: DTypeLike | None, what: str | None = None) -> np.ndarray[Any, Any]:
    """Turn a user's value into a NumPy array of its own dtype (a view where possible), validated.

    With `dtype`, that dtype must be one JAX holds and the array must hold
    numbers (of any dtype NumPy converts from); `freeze` converts. `what` names
    the value in messages (default: its type).
    """
    what = f"the `{type(obj).__name__}` it received" if what is None else what
    if type(obj) is np.ndarray and dtype is None:
        # The common case, without the checks that cannot apply to it.
        check_dtype(obj.dtype, what)
        return obj
    if not isinstance(obj, (np.ndarray, jax.Array)) and hasattr(type(obj), "__jax_array__"):
        # As `jnp.asarray(obj)` takes it (JEP 28661): the array it stands for,
        # frozen. One that stands for a traced value is refused below.
        obj = obj.__jax_array__()
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
        raise _masked(f"{what} is one")
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
    want = None if dtype is None else as_dtype(dtype)
    if isinstance(obj, (list, tuple)):
        _check_leaves(obj, what)
    elif isinstance(obj, int) and not isinstance(obj, np.integer):
        _check_python_int(obj, what)
    try:
        arr = np.asarray(obj)
    except (ValueError, OverflowError) as err:
        raise FrozenConstValueError(
            f"FrozenConst could not turn {what} into a rectangular array of numbers ({err}). "
            "Nested sequences must be rectangular (every row the same length) and hold numbers "
            "NumPy can represent."
        ) from err
    except TypeError as err:
        raise FrozenConstTypeError(
            f"FrozenConst could not turn {what} into an array ({err}). Pass a NumPy array, a "
            "`jax.Array`, a scalar or a nested sequence of numbers."
        ) from err
    if want is None:
        check_dtype(arr.dtype, what)
    else:
        _check_numeric(arr.dtype, what)
        check_dtype(want, what, requested=True)
    return arr


def as_dtype(dtype: DTypeLike) -> np.dtype[Any]:
    """`np.dtype(dtype)`, or a `FrozenConstTypeError` that says what was received."""
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError) as err:
        raise FrozenConstTypeError(
            f"FrozenConst needs a NumPy or JAX dtype for `dtype`, such as `np.float32`, `'int8'` "
            f"or `jnp.bfloat16`, but received {dtype!r} ({err})."
        ) from err


def frozen_copy(obj: Any, dtype: DTypeLike | None = None, what: str | None = None) -> np.ndarray[Any, Any]:
    """What `FrozenConst(obj, dtype)` holds: validated, copied once, frozen.

    Refused (with a `FrozenConstTypeError` or `FrozenConstValueError` naming what
    was received): anything `to_numpy` refuses, a conversion that would change a
    value's integer (out of the target's range, NaN or infinite to an integer
    type) or drop imaginary parts, and integers JAX would wrap on the device
    under the current `jax_enable_x64`. Python data (scalars, nested sequences)
    converted by `dtype=` is converted element by element, as
    `np.asarray(obj, dtype=dtype)` and `jnp.asarray` do (a Python int goes to
    float32 through a Python float), once every value is known to fit.

    Example:
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
    want = None if dtype is None else native(as_dtype(dtype))
    if want is not None and want != array.dtype and isinstance(obj, (list, tuple, int, float, complex)):
        _check_castable(array.dtype, want, what)
        check = _value_check(array.dtype, want, what)
        if check is not None:
            check(array)
        try:
            array = np.asarray(obj, dtype=want)
        except (OverflowError, ValueError, TypeError) as err:  # pragma: no cover - checked above
            raise FrozenConstValueError(f"FrozenConst cannot convert {what} to `{want}` ({err}).") from err
    host = freeze(array, want, what)
    check_narrowing(host, jax.dtypes.canonicalize_dtype(host.dtype), what)
    return host


def _check_castable(source: np.dtype[Any], target: np.dtype[Any], what: str) -> None:
    if not np.can_cast(source, target, casting="unsafe"):
        raise FrozenConstTypeError(
            f"FrozenConst cannot convert {what}, of dtype `{source}`, to `{target}`: NumPy has no "
            "such conversion. Convert it in two steps, through float32."
        )


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
        _check_castable(src.dtype, dtype, what)  # some pairs of ml_dtypes types have no conversion
        check = _value_check(src.dtype, dtype, what)
    nbytes = src.size * dtype.itemsize
    source = None
    if nbytes >= _PAGE_MATCH_MIN_BYTES and src.flags.c_contiguous and src.dtype == dtype:
        source = _address(src)
    raw, window = _aligned(nbytes, source)
    if nbytes:
        target = window.view(dtype).reshape(src.shape)
        mapped = _read_only_map(src) if check is None and src.ndim and src.flags.c_contiguous else None
        if mapped is not None:
            _copy_releasing(target, src, mapped)
        elif check is None:
            np.copyto(target, src, casting="unsafe")
        else:
            _checked_copy(target, src, check)
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
    target: np.ndarray[Any, Any], src: np.ndarray[Any, Any], mapped: tuple[mmap.mmap, int]
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
        np.copyto(target[start : start + step], src[start : start + step], casting="unsafe")
        begin = start_address + start * row_bytes - base
        end = min(begin + step * row_bytes, len(mm))
        first = begin - begin % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a kernel without madvise
            mm.madvise(mmap.MADV_DONTNEED, first, end - first)


def _aligned(nbytes: int, source: int | None = None) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A fresh allocation and, inside it, a 64-byte aligned window of `nbytes` bytes.

    With `source` (the address of the data to be copied in), the window sits at
    the source's offset within a 4 KiB page, rounded down to 64 bytes.
    """
    if source is not None:
        raw = np.empty(nbytes + _PAGE, np.uint8)
        offset = (source - source % ALIGNMENT - _address(raw)) % _PAGE
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
        target = window.view(dtype).reshape(shape)
        for index, data in parts:
            np.copyto(target[index], data)
    del raw
    return _hand_over(window, dtype, shape)


def _checked_copy(
    target: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    check: Callable[[np.ndarray[Any, Any]], None],
) -> None:
    # Block by block along the first axis: a snapshot of each block is checked,
    # then converted, so a caller writing `src` meanwhile cannot slip an
    # unchecked value in.
    if src.ndim == 0:
        block = np.array(src)
        check(block)
        np.copyto(target, block, casting="unsafe")
        return
    row_bytes = max(1, src.itemsize * (src.size // src.shape[0]))
    step = max(1, _CHECKED_BLOCK_BYTES // row_bytes)
    for start in range(0, src.shape[0], step):
        block = np.array(src[start : start + step])
        check(block)
        np.copyto(target[start : start + step], block, casting="unsafe")


def human_bytes(nbytes: int) -> str:
    """`nbytes` in the largest binary unit up to GiB it reaches: `1.5 KiB`, `512 B`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
