"""A user's value checked, and every decision of its construction made once (`host_plan`).

`to_numpy` refuses what JAX could not hold or would change silently: traced
values, masked arrays, strings, arrays other processes hold, Python ints beyond
int64, ragged sequences. `host_plan` asks `_dtypes.conversion`, once, for the
dtype the host holds and the checks its copy runs, and decides the weak type:
all in one `_host.HostPlan`, which `_host.freeze` carries out. The copy never
asks back.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from numpy.typing import DTypeLike

from ._compat import WEAK_TYPES, Tracer
from ._dtypes import conversion, narrowing_check
from ._errors import FrozenConstTypeError, FrozenConstValueError, TracedValueError
from ._host import HostPlan, freeze

# NumPy refuses deeper nesting anyway; the scan of nested sequences stops there.
_MAX_NESTING = 64
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def host_plan(obj: Any, dtype: DTypeLike | None = None, what: str | None = None) -> HostPlan:
    """Every decision of `FrozenConst(obj, dtype)`, made once, before anything is copied.

    `obj` is validated (`to_numpy`). The host holds `dtype`, or without it the dtype
    `jnp.asarray(obj)` holds under the x64 setting now (float64 as float32 without
    x64), so the host holds what JAX computes with; a Python scalar without `dtype`
    is weakly typed, as in `jnp.asarray(0.5)`. Refused, block by block as `freeze`
    copies: a conversion that would change a value's integer (out of the dtype's
    range, NaN or infinite to an integer type), and integers JAX would wrap on the
    device under the current `jax_enable_x64`. Python data (scalars, nested
    sequences) is converted element by element, as `np.asarray(obj, dtype=dtype)`
    and `jnp.asarray` do (a Python int goes to float32 through a Python float),
    once every value is known to fit.

    Examples:
        >>> import numpy as np
        >>> host_plan([1.5, 2.5], np.int8).source
        array([1, 2], dtype=int8)
        >>> host_plan([300], np.uint8)
        Traceback (most recent call last):
        ...
        frozenconst.FrozenConstValueError: FrozenConst cannot convert the `list` it received to `uint8`: ...
    """
    what = f"the `{type(obj).__name__}` it received" if what is None else what
    array = to_numpy(obj, dtype, what)
    held, check, held_check = conversion(array.dtype, None if dtype is None else np.dtype(dtype), what)
    if held != array.dtype and isinstance(obj, (list, tuple, int, float, complex)):
        if check is not None:
            check(array)
        try:
            array, check = np.asarray(obj, dtype=held), None
        except (OverflowError, ValueError, TypeError) as err:  # pragma: no cover - checked above
            message = f"FrozenConst cannot convert {what} to `{held}` ({err})."
            raise FrozenConstValueError(message) from err
    weak = dtype is None and type(obj) in WEAK_TYPES
    return HostPlan(array, held, weak, check, held_check)


def frozen_copy(obj: Any, dtype: DTypeLike | None = None, what: str | None = None) -> np.ndarray[Any, Any]:
    """What `FrozenConst(obj, dtype)` holds: planned (`host_plan`), then copied once and frozen."""
    return freeze(host_plan(obj, dtype, what))


def check_narrowing(host: np.ndarray[Any, Any], device_dtype: DTypeLike, what: str = "its host data") -> None:
    """Raise unless JAX can transfer `host` as `device_dtype` without changing a value's integer
    (`narrowing_check`, run on the whole of `host`).

    Examples:
        >>> import numpy as np
        >>> check_narrowing(np.array([1, 2**40]), np.int64)
        >>> check_narrowing(np.array([1, 2**40]), np.int32)
        Traceback (most recent call last):
        ...
        frozenconst.FrozenConstValueError: FrozenConst cannot put its host data on a device as int32: ...
    """
    check = narrowing_check(host.dtype, np.dtype(device_dtype), what)
    if check is not None:
        check(host)


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
    """Turn a user's value into a NumPy array of its own dtype (a view where possible), refusing
    what NumPy would lose or JAX refuses of its kind. A bad `dtype` is refused in its turn;
    whether JAX holds the dtypes is `host_plan`'s question. `what` names the value in messages
    (default: its type).
    """
    what = f"the `{type(obj).__name__}` it received" if what is None else what
    if type(obj) is np.ndarray and dtype is None:
        return obj  # the common case, without the checks that cannot apply to it
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
    if dtype is not None:
        as_dtype(dtype)
    if isinstance(obj, (list, tuple)):
        _check_leaves(obj, what)
    elif isinstance(obj, int) and not isinstance(obj, np.integer):
        _check_python_int(obj, what)
    try:
        return np.asarray(obj)
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


def as_dtype(dtype: DTypeLike) -> np.dtype[Any]:
    """`np.dtype(dtype)`, or a `FrozenConstTypeError` that says what was received."""
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError) as err:
        raise FrozenConstTypeError(
            f"FrozenConst needs a NumPy or JAX dtype for `dtype`, such as `np.float32`, `'int8'` "
            f"or `jnp.bfloat16`, but received {dtype!r} ({err})."
        ) from err
