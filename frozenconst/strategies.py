"""Hypothesis strategies for `FrozenConst`, built on `hypothesis.extra.numpy`.

`FrozenConst` is registered with `st.from_type`, so
`@given(x=st.from_type(FrozenConst))` and `@given` with a `FrozenConst`
annotation just work: by `import frozenconst` when hypothesis is imported
already, by hypothesis's entry point when frozenconst is, and by importing
this module.

Examples:
    >>> from hypothesis import given, strategies as st
    >>> from frozenconst import FrozenConst
    >>> from frozenconst.strategies import frozen_consts
    >>> @given(frozen_consts(dtype="float32", shape=(2, 3)))
    ... def test_shape(x):
    ...     assert x.shape == (2, 3) and x.dtype == "float32"
    >>> test_shape()
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

try:
    import hypothesis.extra.numpy as hnp
    from hypothesis import strategies as st
except ImportError as err:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "frozenconst.strategies needs hypothesis. Install it with `pip install hypothesis` "
        "or `pip install 'frozenconst[test]'`."
    ) from err

import jax
import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

from ._compat import X64
from ._dtypes import SUPPORTED_DTYPES, aborts_on, held_dtype, supported
from ._frozen import FrozenConst

__all__ = ["frozen_consts", "jax_dtypes"]

# ml_dtypes ships no annotations; these two are all we use of it.
_iinfo: Callable[[Any], Any] = ml_dtypes.iinfo
_finfo: Callable[[Any], Any] = ml_dtypes.finfo


# The dtypes `jax.numpy` computes with on every backend: NumPy's numeric ones and bfloat16.
# XLA's support for the others is partial (its CPU backend aborts the process on `x + 0` for an
# empty float6 array, "Unhandled primitive type F6E2M3FN"): property tests ask (`exotic=True`).
_COMPUTABLE: frozenset[np.dtype[Any]] = frozenset(
    np.dtype(t)
    for t in (
        *(np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64),
        *(np.float16, np.float32, np.float64, np.complex64, np.complex128, ml_dtypes.bfloat16),
    )
)


@functools.cache
def _usable_dtypes(exotic: bool) -> tuple[np.dtype[Any], ...]:
    # Every dtype the default backend can hold and read back (`_dtypes.supported`): jax 0.10's
    # CPU backend offers float6 types it cannot transfer. Only the exotic ones are probed.
    candidates = SUPPORTED_DTYPES if exotic else SUPPORTED_DTYPES & _COMPUTABLE
    return tuple(d for d in sorted(candidates, key=lambda d: d.name) if supported(d))


def jax_dtypes(*, exotic: bool = False) -> st.SearchStrategy[np.dtype[Any]]:
    """The dtypes JAX computes with: bool, integers, float16, bfloat16, float32/64, complex64/128.

    Arguments:
        exotic: also every other dtype the default backend holds: the float8,
            float6 and float4 types, int2/int4 and uint2/uint4 (XLA computes
            with them partially: its CPU backend aborts the process on
            `x + 0` for an empty float6 array). Either way, a dtype whose
            arithmetic the default backend aborts the process on is left out
            (complex128 under x64 on a TPU).

    Returns:
        A strategy for NumPy dtypes, shrinking towards `bfloat16`.

    Examples:
        >>> from hypothesis import find
        >>> find(jax_dtypes(), lambda d: d.kind == "c")
        dtype('complex128')
    """
    # Deferred: probing the backend starts it, which must not happen when the
    # strategy is merely built (at import, or in a decorator). Filtered at each draw: whether
    # the default backend aborts on a dtype's arithmetic follows the x64 setting of the draw.
    return st.deferred(lambda: st.sampled_from(_usable_dtypes(exotic)).filter(_computes_here))


def _computes_here(dtype: np.dtype[Any]) -> bool:
    """Whether the default backend computes with `dtype` as JAX holds it now, rather than abort
    the process (`_dtypes.aborts_on`: complex128 under x64 on a TPU)."""
    return not aborts_on(jax.default_backend(), held_dtype(dtype))


def _is_numpy_builtin(dtype: np.dtype[Any]) -> bool:
    # ml_dtypes types report NumPy kinds too (float8_e5m2 says "f"), so ask
    # where the scalar type comes from instead.
    return dtype.type.__module__ == "numpy"


def _not_subnormal_in(dtype: Any) -> Callable[[float], bool]:
    """Whether a value, rounded into `dtype`, is zero or normal there: not a subnormal."""
    tiny = float(_finfo(dtype).tiny)

    def keep(value: float) -> bool:
        return not 0 < abs(float(np.asarray(value).astype(dtype))) < tiny

    return keep


def _whole_float64_range() -> bool:
    """Whether JAX computes with float64 in its whole range now: x64 on, and a default backend
    that keeps a float64 below float32's range in arithmetic (XLA's TPU backend computes with
    float64 in float32's exponent range: there `FrozenConst(1e-300) + 0` is 0)."""
    return bool(X64.value) and _keeps_float64_range(jax.default_backend())


@functools.cache
def _keeps_float64_range(platform: str) -> bool:
    # Asked of the backend itself, once per platform (called under x64 only).
    return float(jax.device_put(np.float64(1e-300), jax.devices(platform)[0]) + 0) != 0.0


def _elements(dtype: np.dtype[Any], allow_nan: bool, allow_subnormal: bool) -> st.SearchStrategy[Any]:
    if _is_numpy_builtin(dtype):
        if dtype.itemsize == 8 and dtype.kind in "iu" and not X64.value:
            # Without x64 JAX holds 64-bit integers in 32 bits, and FrozenConst
            # refuses values it would wrap: draw from the range it holds.
            narrow = np.iinfo(np.int32 if dtype.kind == "i" else np.uint32)
            return hnp.from_dtype(dtype, min_value=int(narrow.min), max_value=int(narrow.max))
        if (dtype.kind, dtype.itemsize) in {("f", 8), ("c", 16)} and not _whole_float64_range():
            # JAX computes with float64 (complex128) within float32's range: without x64 it
            # holds float32, and a value beyond the range becomes inf in the cast, with
            # `RuntimeWarning: overflow encountered in cast` at the first device use, an error
            # under `filterwarnings = error`. Draw (each part) within the range.
            top = float(np.finfo(np.float32).max)
            part = st.floats(-top, top, allow_nan=False, allow_infinity=False)
            if not allow_subnormal:  # none that float32's exponents hold as a subnormal
                tiny = float(np.finfo(np.float32).tiny)
                part = part.filter(lambda value: value == 0 or abs(value) >= tiny)
            if allow_nan:
                part |= st.sampled_from([math.nan, math.inf, -math.inf])
            return part if dtype.kind == "f" else st.builds(complex, part, part)
        if dtype.kind in "fc":
            # XLA on CPU flushes subnormals to zero (`FrozenConst(4.16e-43) + 0` is 0):
            # none unless asked for.
            return hnp.from_dtype(
                dtype, allow_nan=allow_nan, allow_infinity=allow_nan, allow_subnormal=allow_subnormal
            )
        return hnp.from_dtype(dtype)
    # ml_dtypes types: draw in a wider NumPy type, then round into the narrow one.
    if _is_integer(dtype):
        info = _iinfo(dtype)
        return st.integers(int(info.min), int(info.max))
    finfo = _finfo(dtype)
    floats = st.floats(float(finfo.min), float(finfo.max), allow_nan=False, allow_infinity=False, width=32)
    step, tiny = float(finfo.smallest_subnormal), float(finfo.tiny)
    if not allow_subnormal:
        floats = floats.filter(_not_subnormal_in(dtype))
    elif step < tiny:  # the narrow type's subnormals, which float32 draws seldom reach
        below = round(tiny / step)
        floats |= st.integers(1 - below, below - 1).map(lambda k: k * step)
    return floats | (st.just(float("nan")) if allow_nan else st.nothing())


def frozen_consts(
    dtype: DTypeLike | st.SearchStrategy[np.dtype[Any]] | None = None,
    shape: int | tuple[int, ...] | st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    elements: st.SearchStrategy[Any] | None = None,
    allow_nan: bool = False,
    allow_subnormal: bool = False,
    max_dims: int = 3,
    max_side: int = 5,
) -> st.SearchStrategy[FrozenConst]:
    """A strategy for `FrozenConst`s.

    Arguments:
        dtype: a dtype, or a strategy for one. Default: the dtypes JAX computes
            with (`jax_dtypes()`); `jax_dtypes(exotic=True)` adds float8,
            float6, float4, int2/int4 and their unsigned kin.
        shape: a shape, or a strategy for one. Default: 0 to `max_dims`
            dimensions of 0 to `max_side` elements, so 0-d and zero-size arrays
            appear.
        elements: a strategy for the values. Default: every finite value of the
            dtype that JAX computes with under the x64 setting of the draw
            (`x.dtype`: without x64, float64 data within float32's range and
            int64 data within int32's; float64 data within float32's range on a
            TPU, whose float64 arithmetic has float32's exponents) except
            subnormal floats, NaN and infinities too if `allow_nan`, subnormals
            too if `allow_subnormal`.
        allow_nan: whether the default elements include NaN and infinities.
        allow_subnormal: whether the default elements include subnormal floats
            (of the dtype JAX computes with). Off by default: XLA on CPU flushes
            them to zero (`FrozenConst(4.16e-43) + 0` is `0.0`), so a property
            compared with NumPy fails on them. hypothesis's own parameter name.
        max_dims: the most dimensions of a default shape.
        max_side: the longest side of a default shape.

    Returns:
        A strategy that shrinks towards small shapes and zeros.
    """
    if not isinstance(dtype, st.SearchStrategy):
        dtype = jax_dtypes() if dtype is None else st.just(np.dtype(dtype))
    if not isinstance(shape, st.SearchStrategy):
        shape = (
            hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=max_side)
            if shape is None
            else st.just((shape,) if isinstance(shape, int) else tuple(shape))
        )

    @st.composite
    def build(draw: st.DrawFn) -> FrozenConst:
        dt = np.dtype(draw(dtype))
        native = _is_numpy_builtin(dt)
        values = elements if elements is not None else _elements(dt, allow_nan, allow_subnormal)
        drawn_dtype = dt if native else (np.int64 if _is_integer(dt) else np.float32)
        data = draw(hnp.arrays(drawn_dtype, draw(shape), elements=values))
        # `dtype=`: the drawn dtype on the host, float64 too without x64 (where `FrozenConst(data)`
        # would hold float32, as `jnp.asarray` does).
        return FrozenConst(data if native else data.astype(dt), dtype=dt)

    return build()


def _is_integer(dtype: np.dtype[Any]) -> bool:
    try:
        _iinfo(dtype)
    except (ValueError, TypeError):
        return False
    return True


# `st.from_type(FrozenConst)`, and `@given` on a `FrozenConst` annotation.
st.register_type_strategy(FrozenConst, frozen_consts())
