"""Annotations see what JAX sees: the dtype a FrozenConst reports is the one JAX computes with.

Runtime annotation checkers (jaxtyping with beartype), `np.dtype(x)` and
`jnp.issubdtype(x.dtype, ...)` judge a FrozenConst as they judge the cached
`jax.Array` it stands for, under x64 off and on; the host data's dtype stays
reachable as `x.host_dtype`. Without `dtype=`, the host holds what
`jnp.asarray(obj)` holds under the x64 setting at construction (float64 data as
float32 without x64), and keeps it, as such a `jax.Array` does; `dtype=np.float64`
keeps float64 on the host, and then `x.dtype` follows the x64 setting.
"""

import pickle
import sys
import textwrap

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import enable_x64, run_bounded, subprocess_env
from hypothesis import given
from hypothesis import strategies as st

import frozenconst
from frozenconst import FrozenConst

jaxtyping = pytest.importorskip("jaxtyping")
beartype = pytest.importorskip("beartype").beartype
Array = jax.Array

# One dtype of every family JAX holds, narrow and wide.
FAMILIES = [
    np.bool_,
    *(np.int8, np.int16, np.int32, np.int64),
    *(np.uint8, np.uint16, np.uint32, np.uint64),
    *(np.float16, jnp.bfloat16, np.float32, np.float64),
    *(np.complex64, np.complex128),
]

# The annotations a library writes, each with the union that admits a FrozenConst.
_NAMES = [
    *("Bool", "Int", "Int8", "Int16", "Int32", "Int64", "UInt", "UInt8", "UInt32", "UInt64"),
    *("Float", "Float16", "BFloat16", "Float32", "Float64", "Complex", "Complex64", "Complex128"),
    *("Inexact", "Num", "Real", "Integer", "Shaped"),
]
ANNOTATIONS = [getattr(jaxtyping, n)[Array | FrozenConst, "*dims"] for n in _NAMES if hasattr(jaxtyping, n)]


def _checker(annotation):
    def f(a):
        return a

    f.__annotations__ = {"a": annotation, "return": annotation}
    return jaxtyping.jaxtyped(typechecker=beartype)(f)


CHECKERS = [(annotation, _checker(annotation)) for annotation in ANNOTATIONS]


def _accepts(check, value) -> bool:
    try:
        check(value)
    except jaxtyping.TypeCheckError:
        return False
    return True


def _verdicts(value):
    return {str(annotation): _accepts(check, value) for annotation, check in CHECKERS}


def _data(dtype, shape):
    return (np.arange(int(np.prod(shape))) % 2).reshape(shape).astype(dtype)


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("dtype", FAMILIES, ids=lambda d: np.dtype(d).name)
def test_annotation_checkers_judge_a_constant_as_its_jax_array(dtype, x64):
    x = FrozenConst(_data(dtype, (2, 3)))
    with enable_x64(x64):
        array = x.on(jax.devices()[0])  # the cached buffer every use computes with
        assert x.dtype == array.dtype == jnp.asarray(x).dtype == np.dtype(x)
        assert _verdicts(x) == _verdicts(array)
        assert _accepts(_checker(jaxtyping.Shaped[Array | FrozenConst, "2 3"]), x)


@given(
    dtype=st.sampled_from(FAMILIES),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3),
    x64=st.booleans(),
)
def test_annotation_verdicts_follow_jax_over_dtypes_shapes_and_x64(dtype, shape, x64):
    x = FrozenConst(_data(dtype, shape))
    with enable_x64(x64):
        array = jnp.asarray(x)
        assert (x.dtype, x.shape) == (array.dtype, array.shape)
        assert _verdicts(x) == _verdicts(array)
        for kind in (jnp.bool_, jnp.integer, jnp.unsignedinteger, jnp.floating, jnp.complexfloating):
            assert jnp.issubdtype(x.dtype, kind) == jnp.issubdtype(array.dtype, kind)


def test_float64_host_data_is_float32_without_x64_and_float64_with_it():
    x = FrozenConst(np.arange(4.0), dtype=np.float64)  # asked for: float64 stays on the host
    float32 = _checker(jaxtyping.Float32[Array | FrozenConst, "4"])
    float64 = _checker(jaxtyping.Float64[Array | FrozenConst, "4"])
    with enable_x64(False):
        assert (x.dtype, x.host_dtype, x.nbytes) == (np.float32, np.float64, 16)
        assert _accepts(float32, x) and not _accepts(float64, x)
        assert repr(x) == "FrozenConst([0., 1., 2., 3.], dtype=float32, host_dtype=float64)"
    with enable_x64(True):
        assert (x.dtype, x.host_dtype, x.nbytes) == (np.float64, np.float64, 32)
        assert _accepts(float64, x) and not _accepts(float32, x)
        assert repr(x) == "FrozenConst([0., 1., 2., 3.], dtype=float64)"


@pytest.mark.parametrize("x64", [False, True])
def test_without_dtype_the_host_holds_what_jnp_asarray_holds_and_keeps_it(x64):
    data = np.arange(4.0)
    with enable_x64(x64):
        x, array = FrozenConst(data), jnp.asarray(data)
        assert x.host_dtype == x.dtype == array.dtype == (np.float64 if x64 else np.float32)
        assert np.asarray(x).dtype == array.dtype and x.nbytes == x.stats().host_bytes == array.nbytes
    with enable_x64(not x64):
        if x64:  # float64 on the host: on devices JAX's rules apply at the time of use
            assert x.dtype == jnp.asarray(x).dtype == np.float32 != array.dtype
        else:  # float32 on the host: like that jax.Array, the constant keeps what it holds
            assert x.dtype == array.dtype == jnp.asarray(x).dtype == np.float32
            assert _verdicts(x) == _verdicts(array)


def test_the_host_side_keeps_the_host_dtype():
    data = np.arange(4.0)
    x = FrozenConst(data, dtype=np.float64)
    with enable_x64(False):
        assert np.asarray(x).dtype == np.float64  # the frozen host view, no copy, no narrowing
        assert pickle.loads(pickle.dumps(x)).host_dtype == np.float64
        assert x.fingerprint == FrozenConst(data, np.float64).fingerprint != FrozenConst(data).fingerprint
        assert frozenconst.intern(x, dtype=np.float64) is frozenconst.intern(x)
        # `dtype=` asks for a host dtype: float64 is what x holds, so no copy.
        assert FrozenConst(x, dtype=np.float64)._store is x._store
        assert x.astype(np.float16).dtype == np.float16


def test_runtime_checkers_need_the_union_not_array_like():
    # jaxtyping checks `ArrayLike` against its runtime members (jax.Array, NumPy
    # arrays and scalars), which FrozenConst is not; docs/typing.md says so.
    x = FrozenConst(np.ones((2, 3), np.float32))
    assert _accepts(_checker(jaxtyping.Float[Array | FrozenConst, "n m"]), x)
    assert not _accepts(_checker(jaxtyping.Float[jax.typing.ArrayLike, "n m"]), x)
    assert not _accepts(_checker(jaxtyping.Float[Array | FrozenConst, "n"]), x)


@pytest.mark.subprocess
def test_dtype_follows_a_config_change_as_the_buffers_do():
    code = """
        import jax, jax.numpy as jnp, numpy as np
        from frozenconst import FrozenConst
        x = FrozenConst(np.arange(4.0), dtype=np.float64)
        held = FrozenConst(np.arange(4.0))  # held as jnp.asarray holds it: float32, and kept
        array = jnp.asarray(np.arange(4.0))
        assert x.dtype == jnp.asarray(x).dtype == held.dtype == array.dtype == np.float32, x.dtype
        jax.config.update("jax_enable_x64", True)
        assert x.dtype == jnp.asarray(x).dtype == np.float64, x.dtype
        assert held.dtype == jnp.asarray(held).dtype == array.dtype == np.float32, held.dtype
        print("followed")
        """
    rc, out = run_bounded([sys.executable, "-c", textwrap.dedent(code)], env=subprocess_env())
    assert rc == 0 and "followed" in out, out
