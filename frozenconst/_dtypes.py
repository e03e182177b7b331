"""Which dtypes the installed JAX holds, in which it holds data now, and what numbers a dtype holds.

The candidates are the dtypes `jax.numpy` names; whether this JAX can hold one
is decided once per dtype (`supported`), by a transfer to its default device
for any dtype beyond NumPy's numeric ones and bfloat16. `check_dtype` turns a
refusal into a message that says what was received and what to pass instead;
`numeric_kind` tells bool, integer, floating and complex apart (ml_dtypes' types too).
`conversion` answers a construction's every dtype question at once: the dtype the
host holds, and the range checks its copy runs (`value_check` for a conversion by
`dtype=`, `narrowing_check` for JAX's narrowing of 64-bit integers without x64).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

from ._compat import eval_context
from ._errors import FrozenConstTypeError, FrozenConstValueError


def _jax_dtypes() -> frozenset[np.dtype[Any]]:
    # Every scalar type that `jax.numpy` exposes (float32, bfloat16, float8_*,
    # int4, ...): a sweep over the namespace rather than a hand-kept list, so a
    # dtype added by a newer JAX is a candidate without a change here.
    named = [getattr(jnp, name, None) for name in dir(jnp)]
    dtypes = [getattr(obj, "dtype", None) for obj in named if isinstance(obj, type)]
    return frozenset(np.dtype(dtype) for dtype in dtypes if isinstance(dtype, np.dtype))


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


class _Probes:
    """What each probed dtype answered, probed once per process under the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.found: dict[np.dtype[Any], bool] = {}


_PROBES = _Probes()


@contextlib.contextmanager
def _held_stderr() -> Generator[Callable[[], None]]:
    """Hold what is written to file descriptor 2 meanwhile; the caller may `release()` it.

    XLA logs its refusal of a dtype (`E... INVALID_ARGUMENT: ... RuntimeProgramInputMismatch`
    for int1 on jax 0.12) from C++ straight to the process's stderr before raising,
    and no Python setting reaches that logger after start-up. A probe that finds a
    dtype unusable drops that line, its expected answer; one that succeeds passes
    on whatever was written meanwhile (by any thread), so nothing else is lost.
    Without a usable descriptor 2 nothing is held.
    """
    try:
        saved = os.dup(2)
    except OSError:
        yield lambda: None
        return
    released = threading.Event()
    with tempfile.TemporaryFile() as held:
        try:
            sys.stderr.flush()
            os.dup2(held.fileno(), 2)
            yield released.set
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if released.is_set():
                held.seek(0)
                os.write(2, held.read())


def _probe(dtype: np.dtype[Any]) -> bool:
    # Two elements to the default device, through a compiled function, and back:
    # what every use of a constant needs. jax 0.10 names float6 types its CPU
    # client cannot transfer; int1 arrays transfer but no compiled program takes
    # them. Run eagerly even inside a trace, whatever the transfer guard says.
    sample = np.zeros(2, dtype)
    try:
        jax.local_devices()  # the backend starts outside the hold: its own messages go through
    except Exception:  # no backend at all: nothing can be held
        return False
    with _held_stderr() as release:
        try:
            with eval_context(), jax.transfer_guard("allow"):
                on_device = jax.device_put(sample)
                back = np.asarray(on_device)
                reversed_back = np.asarray(jax.jit(lambda v: v[::-1])(on_device))
        except Exception:  # XLA's refusals are runtime errors of its own; any failure means "cannot hold"
            return False
        release()
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
    found = _PROBES.found.get(dtype)
    if found is None:
        with _PROBES.lock:
            found = _PROBES.found.get(dtype)
            if found is None:
                found = _PROBES.found[dtype] = _probe(dtype)
    return found


# Conversions a backend's compiler aborts the whole process on, rather than raising: by
# platform, the dtypes converted into. XLA's TPU compiler dies with SIGILL compiling a
# conversion into a 2-bit integer (`jnp.asarray(a, dtype=jnp.int2)`, `x.astype(jnp.uint2)`;
# measured on a TPU v5e, jax 0.10.2, libtpu 0.0.42.1), where holding such data and computing
# with it works. frozenconst converts on the host (`FrozenConst(x, dtype=...)`), and refuses
# to hand such a conversion to the device (`FrozenConst.astype`).
_ABORTING_CONVERSIONS: dict[str, frozenset[np.dtype[Any]]] = {
    "tpu": frozenset(np.dtype(name) for name in ("int2", "uint2") if hasattr(jnp, name)),
}


def check_conversion(platform: str, dtype: np.dtype[Any], what: str) -> None:
    """Raise a `FrozenConstTypeError` where converting into `dtype` on `platform`'s devices would
    abort the process (`what`: the call, in words)."""
    if native(dtype) in _ABORTING_CONVERSIONS.get(platform, frozenset()):
        raise FrozenConstTypeError(
            f"`{what}` would convert into {dtype} on a {platform.upper()} device, and XLA's "
            f"{platform.upper()} compiler aborts the process on that conversion (it does not raise). "
            f"Convert on the host instead: `FrozenConst(x, dtype=jnp.{dtype})`, which JAX holds and "
            "computes with on that device."
        )


# Dtypes a backend's compiler aborts the whole process on when a program computes with them,
# by platform, the dtype on the device. XLA's TPU compiler dies with SIGABRT compiling `x + 0`
# of a complex128 `jax.Array` under x64 ("Unsupported CVT X{64|128} expansion from s64[] to
# c128[]": the Python int's conversion; every shape, eager and jitted; `tools/dtype-probe` on a
# TPU v5e, jax 0.10.2), where transferring it works; JAX's own tests hold no 64-bit type on a TPU
# (`jax._src.test_util.supported_dtypes`). frozenconst refuses to transfer a constant of such a
# dtype to such a device, so that no later use can end the process.
_ABORTING_DTYPES: dict[str, frozenset[np.dtype[Any]]] = {
    "tpu": frozenset({np.dtype(np.complex128)}),
}


def check_computes_on(platform: str, dtype: np.dtype[Any]) -> None:
    """Raise a `FrozenConstTypeError` where computing with `dtype` on `platform`'s devices would
    abort the process."""
    if aborts_on(platform, dtype):
        name = platform.upper()
        raise FrozenConstTypeError(
            f"FrozenConst cannot move {dtype} data to a {name} device: XLA's {name} compiler aborts "
            f"the process (it does not raise) on arithmetic in {dtype}, such as `x + 0`. Hold it in "
            f"a dtype the {name} computes with, such as `FrozenConst(x, dtype=np.complex64)`, or "
            "keep it on a CPU device (`x.on(jax.devices('cpu')[0])`)."
        )


def aborts_on(platform: str, dtype: np.dtype[Any]) -> bool:
    """Whether computing with `dtype` on `platform`'s devices aborts the process (see
    `check_computes_on`)."""
    return native(dtype) in _ABORTING_DTYPES.get(platform, frozenset())


def native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """`dtype` in this machine's byte order (JAX holds nothing else); the copy converts."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


# The dtypes JAX narrows without x64 (`jax.dtypes.canonicalize_dtype`: int64 to
# int32, uint64 to uint32, float64 to float32, complex128 to complex64), the
# same table from jax 0.8.1 to 0.12.0.1; every other dtype is JAX's under both
# settings (tests/test_cache.py checks the table against JAX's own answer).
_NARROWED_WITHOUT_X64: frozenset[np.dtype[Any]] = frozenset(
    np.dtype(t) for t in (np.int64, np.uint64, np.float64, np.complex128)
)


def follows_x64(dtype: np.dtype[Any]) -> bool:
    """Whether JAX holds data of `dtype` in another dtype when x64 is off than when it is on."""
    return dtype in _NARROWED_WITHOUT_X64


def held_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype JAX holds data of `dtype` in under the x64 setting now (`jnp.asarray`'s, and a
    constant's on the device), in this machine's byte order: without x64, float64 as float32,
    int64 as int32, uint64 as uint32, complex128 as complex64. Read at each call, so it follows
    `jax.enable_x64`.

    Examples:
        >>> import numpy as np
        >>> held_dtype(np.dtype(np.float64)), held_dtype(np.dtype(np.float16))   # x64 off
        (dtype('float32'), dtype('float16'))
    """
    # `canonicalize_dtype` narrows only the native byte order (`>f8` stays `>f8` without x64).
    return np.dtype(jax.dtypes.canonicalize_dtype(native(dtype)))


# What a refused dtype could be converted to, by `numeric_kind` (anything else: the default).
_SUGGESTIONS = {
    "f": "float32, bfloat16 or float8_e4m3fn (for example `dtype=np.float32`)",
    "i": "int8, int32 or uint8 (for example `dtype=np.int8`)",
}


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
    suggestion = _SUGGESTIONS.get(numeric_kind(dtype), "float32, int32, bool or bfloat16")
    raise FrozenConstTypeError(
        f"FrozenConst cannot hold {what}: {subject} `{dtype}` is {kind}. "
        f"Convert it to a numeric dtype that JAX supports, such as {suggestion}."
    )


def numeric_kind(dtype: np.dtype[Any]) -> str:
    """The kind of numbers: `b` bool, `i` integer, `f` floating, `c` complex (ml_dtypes'
    types too), or an empty string for anything else."""
    if dtype.kind == "b":
        return "b"
    if dtype.fields is not None or (dtype.kind in "OUSaVmM" and dtype.type.__module__ == "numpy"):
        return ""
    for kind, numbers in (("i", jnp.integer), ("f", jnp.floating), ("c", jnp.complexfloating)):
        if jnp.issubdtype(dtype, numbers):
            return kind
    return _ml_dtypes_kind(dtype)  # a type this JAX's `jnp` does not know


def _ml_dtypes_kind(dtype: np.dtype[Any]) -> str:
    # `f` or `i` for a floating or integer ml_dtypes type, else "". `jnp.issubdtype` places an
    # ml_dtypes number type (float6_e2m3fn, int2, ...) among the floats or integers only from the
    # JAX release that names it: jax 0.6.2 answers neither for float6 (kind "V"), so frozenconst
    # would take float6 data for non-numbers and refuse to convert it (`dtype=np.float32`). The
    # public alternative is ml_dtypes' own `finfo`/`iinfo` (ml_dtypes >= 0.4, which every JAX
    # from 0.4.38 requires), asked only when JAX does not know the type.
    if getattr(dtype.type, "__module__", "") != "ml_dtypes":
        return ""
    import ml_dtypes

    for kind, info in (("f", ml_dtypes.finfo), ("i", ml_dtypes.iinfo)):
        try:
            info(dtype)
        except (TypeError, ValueError):
            continue
        return kind
    return ""


# `jnp.iinfo` (ml_dtypes' `iinfo`) knows int4, int2 and friends too; it is untyped.
_iinfo: Callable[[Any], Any] = jnp.iinfo


def int_range(dtype: np.dtype[Any]) -> tuple[int, int]:
    info = _iinfo(dtype)
    return int(info.min), int(info.max)


# A check of a block of values: raises where one would not survive.
Check: TypeAlias = Callable[[np.ndarray[Any, Any]], None]


class Conversion(NamedTuple):
    """What the host holds (`conversion`): the dtype, and the checks its copy runs."""

    dtype: np.dtype[Any]
    check: Check | None
    held_check: Check | None


def conversion(from_dtype: np.dtype[Any], dtype: np.dtype[Any] | None, what: str) -> Conversion:
    """What the host holds of `from_dtype` data asked for as `dtype` (None: the dtype JAX holds
    it in now), and its copy's checks: `check` on the values before they are converted (by
    `dtype=`, `value_check`; else JAX's narrowing, said as such), `held_check` on the values as
    held (`narrowing_check`). Raises where JAX cannot hold a dtype or NumPy cannot convert.

    Examples:
        >>> import numpy as np
        >>> conversion(np.dtype(np.float64), None, "data")   # x64 off
        Conversion(dtype=dtype('float32'), check=None, held_check=None)
    """
    if dtype is None:
        check_dtype(from_dtype, what)
        held = held_dtype(from_dtype)
    else:
        # Data converted by `dtype=` need not be of a dtype JAX holds (float6 data to float32
        # is fine), but it must be numbers.
        if numeric_kind(from_dtype) == "":
            check_dtype(from_dtype, what)
        check_dtype(dtype, what, requested=True)
        held = native(dtype)
    check = None
    if held != from_dtype:
        if not np.can_cast(from_dtype, held, casting="unsafe"):  # some pairs of ml_dtypes types
            raise FrozenConstTypeError(
                f"FrozenConst cannot convert {what}, of dtype `{from_dtype}`, to `{held}`: NumPy has no "
                "such conversion. Convert it in two steps, through float32."
            )
        check = (value_check if dtype is not None else narrowing_check)(from_dtype, held, what)
    # Without `dtype=` the host holds JAX's own dtype, which narrows no further.
    held_check = None if dtype is None else narrowing_check(held, held_dtype(held), what)
    return Conversion(held, check, held_check)


def value_check(from_dtype: np.dtype[Any], to_dtype: np.dtype[Any], what: str) -> Check | None:
    """How to check, block by block, that converting `from_dtype` data to `to_dtype` keeps
    every value (None when every value converts), or raise when no value would."""
    s, t = numeric_kind(from_dtype), numeric_kind(to_dtype)
    if s == "c" and t == "b":
        raise FrozenConstTypeError(
            f"FrozenConst will not convert {what}, of dtype `{from_dtype}`, to `bool`: NumPy and "
            "`jnp.asarray` make each value True wherever its real or imaginary part is non-zero, "
            "which is rarely what a constant means. Pass `obj != 0` explicitly if that is what "
            "you want, or ask for a complex dtype."
        )
    if s == "c" and t != "c":
        raise FrozenConstTypeError(
            f"FrozenConst will not convert {what}, of dtype `{from_dtype}`, to `{to_dtype}`: that "
            "discards the imaginary parts (NumPy's cast drops them with a ComplexWarning, and "
            "`jnp.asarray` refuses a complex Python value there with a TypeError). Pass "
            "`np.real(obj)` explicitly, or ask for a complex dtype."
        )
    if t != "i" or s == "b":
        # To bool, floats and complex: NumPy's and `jnp.asarray`'s conversion,
        # rounding to nearest (values beyond a float type's range become inf,
        # or NaN for the float8 types without inf).
        return None
    lo, hi = int_range(to_dtype)
    if s == "i":
        src_lo, src_hi = int_range(from_dtype)
        if lo <= src_lo and src_hi <= hi:
            return None
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

    return _range_check(
        lo,
        hi,
        lambda bad: (
            f"FrozenConst cannot convert {what} to `{to_dtype}`: it holds {bad!r}, which "
            f"`{to_dtype}` cannot hold (its range is {lo} to {hi}; NaN and infinities have no integer "
            "value). " + others
        ),
    )


def narrowing_check(held: np.dtype[Any], device: np.dtype[Any], what: str) -> Check | None:
    """How to check, block by block, that JAX can transfer data held as `held` as `device`
    without changing a value's integer (None when every value transfers as it is).

    Without `jax_enable_x64`, JAX narrows int64 data to int32 and uint64 to
    uint32 on the device, wrapping every value outside the narrow range
    (`jax.device_put(np.array([2**40]))` holds 0). Float narrowing (float64 to
    float32) is allowed: it rounds, as `jnp.asarray` does, and values beyond
    float32's range become infinities.
    """
    if device == held or numeric_kind(device) != "i" or numeric_kind(held) != "i":
        return None
    lo, hi = int_range(device)
    src_lo, src_hi = int_range(held)
    if lo <= src_lo and src_hi <= hi:
        return None

    return _range_check(
        lo,
        hi,
        lambda bad: (
            f"FrozenConst cannot put {what} on a device as {device}: it holds the {held} "
            f"value {bad}, outside {device}'s range ({lo} to {hi}). JAX narrows {held} to {device} while "
            "`jax_enable_x64` is off, and would wrap that value silently (`jnp.asarray` raises "
            "OverflowError for such a Python int). Turn x64 on (`jax.config.update('jax_enable_x64', "
            "True)`), or convert the data to a dtype that holds it on the device (for example "
            "`dtype=np.float32`, which rounds)."
        ),
    )


def _range_check(lo: int, hi: int, refusal: Callable[[Any], str]) -> Check:
    """A check that every value of a block truncates into `[lo, hi]`, raising a
    FrozenConstValueError with `refusal(value)` for the first that does not."""

    def check(block: np.ndarray[Any, Any]) -> None:
        bad = _out_of_range(block, lo, hi)
        if bad is not None:
            raise FrozenConstValueError(refusal(bad))

    return check


def _out_of_range(values: np.ndarray[Any, Any], lo: int, hi: int) -> Any:
    """A value of `values` that does not truncate into `[lo, hi]` (NaN and infinities never do), or None."""
    if values.size == 0:
        return None
    with np.errstate(all="ignore"):  # NaN in a reduction of ml_dtypes floats warns
        smallest, largest = values.min(), values.max()
    if numeric_kind(values.dtype) == "i":
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
