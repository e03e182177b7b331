"""`frozenconst.strategies`' defaults: constants `jax.numpy` computes with; exotic dtypes on request.

docs/testing.md, "What the defaults generate", gives the reasons: XLA's CPU
backend aborts the process on `x + 0` for an empty float6 array, a float64
value beyond float32's range warns (`overflow encountered in cast`) when JAX
narrows it without x64, and XLA on CPU flushes subnormal floats to zero.
"""

import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import enable_x64, requires_cpu
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from frozenconst import FrozenConst, strategies

# The defaults are checked against the package's list of dtypes and of those this JAX holds.
from frozenconst._dtypes import SUPPORTED_DTYPES, supported
from frozenconst.strategies import frozen_consts, jax_dtypes

COMPUTABLE = {
    np.dtype(t)
    for t in (
        *(np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64),
        *(np.float16, np.float32, np.float64, np.complex64, np.complex128, ml_dtypes.bfloat16),
    )
}
EXOTIC = {d for d in SUPPORTED_DTYPES if d not in COMPUTABLE and supported(d)}

_DEFAULTS = {"frozen_consts()": frozen_consts, "st.from_type(FrozenConst)": lambda: st.from_type(FrozenConst)}
_TIMES_ONE = jax.jit(lambda c: c * 1)  # one function: compiled once per dtype and shape


def _uses(x):
    """What a suite does first with a constant: each result on the device, waited for."""
    for result in (x + 0, jnp.sum(x), jnp.asarray(x), _TIMES_ONE(x)):
        jax.block_until_ready(result)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("x64", [False, True], ids=["x64-off", "x64-on"])
@given(source=st.sampled_from(sorted(_DEFAULTS)), data=st.data())
def test_default_constants_take_jax_numpy_arithmetic_without_a_warning(x64, source, data):
    with enable_x64(x64), warnings.catch_warnings():
        warnings.simplefilter("error")
        x = data.draw(_DEFAULTS[source](), label="x")
        _uses(x)
        assert x.host_dtype in COMPUTABLE
        host = np.asarray(x)
        if host.dtype.kind in "fc" and host.size:
            # Finite, within the range of what JAX computes with (x.dtype).
            top = float(ml_dtypes.finfo(x.dtype).max)
            assert np.all(np.isfinite(host))
            assert np.all(np.abs(host.real) <= top) and np.all(np.abs(np.imag(host)) <= top)


@pytest.mark.filterwarnings("error")
@settings(max_examples=20)
@given(x=frozen_consts(dtype=st.sampled_from(["float64", "complex128"]), allow_nan=True))
def test_64_bit_floats_without_x64_stay_within_float32s_range_with_nan_too(x):
    host = np.asarray(x)
    finite = host[np.isfinite(host)]
    top = float(np.finfo(np.float32).max)
    assert np.all(np.abs(finite.real) <= top) and np.all(np.abs(np.imag(finite)) <= top)
    _uses(x)


def _drawn(strategy, n):
    seen = set()

    @settings(max_examples=n, database=None)
    @given(strategy)
    def collect(value):
        seen.add(np.dtype(value.dtype if isinstance(value, FrozenConst) else value))

    collect()
    return seen


def test_the_default_dtypes_are_the_ones_jax_computes_with():
    assert EXOTIC, "this JAX holds no exotic dtype: the check below checks nothing"
    assert _drawn(jax_dtypes(), 300) == COMPUTABLE & SUPPORTED_DTYPES
    # The constants: their host dtypes (x.dtype is the narrowed one without x64).
    hosts = set()

    @settings(max_examples=150, database=None)
    @given(frozen_consts())
    def collect(x):
        hosts.add(x.host_dtype)

    collect()
    assert hosts <= COMPUTABLE


def test_exotic_dtypes_come_when_asked_for():
    assert _drawn(jax_dtypes(exotic=True), 400) == COMPUTABLE & SUPPORTED_DTYPES | EXOTIC
    exotic = sorted(EXOTIC, key=str)[0]
    assert _drawn(frozen_consts(dtype=exotic), 5) == {exotic}
    assert _drawn(frozen_consts(dtype=jax_dtypes(exotic=True)), 400) & EXOTIC


def _subnormal(x):
    """Whether a constant holds a float (or a complex part) that is subnormal in `x.dtype`."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):  # ml_dtypes' floats have kind "V"
        return False
    tiny = float(ml_dtypes.finfo(x.dtype).tiny)
    complex_ = jnp.issubdtype(x.dtype, jnp.complexfloating)
    # The data drawn, in the dtype JAX computes with, read on the host: a device's copy need
    # not keep a subnormal (on a TPU, none of float64's came back).
    held = np.asarray(x).astype(x.dtype).astype(np.complex128 if complex_ else np.float64)
    return any(bool(np.any((np.abs(p) > 0) & (np.abs(p) < tiny))) for p in (held.real, np.imag(held)))


@pytest.mark.parametrize("x64", [False, True], ids=["x64-off", "x64-on"])
@settings(max_examples=150)
@given(data=st.data())
def test_no_subnormals_by_default_so_jax_computes_with_the_values_drawn(x64, data):
    # A property compared with NumPy: `x + 0` is the value drawn, exactly (XLA on CPU would
    # flush a subnormal to zero). Exotic dtypes too, where a subnormal of theirs is asked for.
    with enable_x64(x64):
        x = data.draw(frozen_consts(dtype=jax_dtypes(exotic=data.draw(st.booleans()))), label="x")
        assert not _subnormal(x), x
        if np.dtype(x.dtype) in COMPUTABLE and x.size:
            held = np.asarray(jnp.asarray(x))
            np.testing.assert_array_equal(np.asarray(x + 0).astype(held.dtype), held)


def _beyond_float32(x):
    """Whether a constant holds a float (or a complex part) that float32 holds as a subnormal, or
    that is beyond float32's range."""
    held = np.asarray(x).astype(np.complex128)
    parts = np.abs(np.concatenate([held.real.ravel(), held.imag.ravel()]))
    finfo = np.finfo(np.float32)
    return bool(np.any(((parts > 0) & (parts < finfo.tiny)) | (parts > finfo.max)))


@pytest.mark.parametrize("keeps", [True, False], ids=["whole-range", "float32-range"])
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_float64_drawn_in_the_range_the_default_backend_computes_with(monkeypatch, keeps, dtype):
    # XLA's TPU backend computes with float64 in float32's exponent range: on the chip, under
    # x64, `FrozenConst(1.4e-45) + 0` was 0. Where the backend says so (simulated here: the
    # answer the strategy asks it for), the default draws float64 as without x64.
    monkeypatch.setattr(strategies, "_keeps_float64_range", lambda platform: keeps)
    with enable_x64(True):
        if keeps:
            assert find(frozen_consts(dtype=dtype), _beyond_float32).dtype == dtype
        else:
            with pytest.raises(NoSuchExample):
                find(frozen_consts(dtype=dtype), _beyond_float32)


def test_the_backends_answer_on_float64s_range():
    # Measured: XLA on CPU keeps a float64 below float32's range in arithmetic, XLA's TPU backend
    # does not (the chip's run of the property above found `1.4e-45 + 0` to be 0).
    platform = jax.default_backend()
    if platform not in ("cpu", "tpu"):
        pytest.skip(f"no measured answer for the {platform} backend")
    with enable_x64(True):
        assert strategies._keeps_float64_range(platform) is (platform == "cpu")
        assert (float(jnp.asarray(np.float64(1e-300)) + 0) == 1e-300) is (platform == "cpu")


def test_no_dtype_the_default_backend_aborts_on_by_default(cpu_aborts_on_complex128):
    # The CPU standing in for a TPU, whose compiler aborts on complex128 arithmetic: under x64
    # no default draws it (a suite's first `x + 0` would end the process); asked for, it comes.
    with enable_x64(True):
        with pytest.raises(NoSuchExample):
            find(jax_dtypes(), lambda d: d == np.complex128)
        with pytest.raises(NoSuchExample):
            find(frozen_consts(), lambda x: x.dtype == np.complex128)
        assert find(jax_dtypes(), lambda d: d.kind == "c") == np.complex64
        assert find(frozen_consts(dtype="complex128"), lambda x: True).dtype == np.complex128
    # Without x64 JAX computes with it as complex64, and the default draws it.
    assert find(jax_dtypes(), lambda d: d == np.complex128) == np.complex128


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"])
def test_subnormals_come_when_asked_for(dtype):
    for x64 in (False, True):
        with enable_x64(x64):
            found = find(frozen_consts(dtype=dtype, allow_subnormal=True), _subnormal)
            assert _subnormal(found) and found.size == 1, found


def test_why_subnormals_are_left_out_xla_on_cpu_flushes_them():
    requires_cpu("subnormal flush")
    x = FrozenConst(np.float32(4.16e-43))  # docs/testing.md's example
    assert float(np.asarray(x)) == np.float32(4.16e-43) and float(x + 0) == 0.0
