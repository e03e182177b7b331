"""Property tests over every JAX dtype, shapes (0-d and zero-size included) and call forms."""

import pickle
import warnings

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EMBED_LIMIT, SIMPLIFIED, enable_x64
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import frozenconst
from frozenconst import FrozenConst
from frozenconst.strategies import frozen_consts, jax_dtypes


def _bits(a: np.ndarray) -> np.ndarray:
    """Raw bytes, so NaN payloads and -0.0 compare exactly."""
    return np.ascontiguousarray(a).view(np.uint8)


# Round trips cover every dtype the backend holds, the exotic ones included.
EVERY_DTYPE = jax_dtypes(exotic=True)


@given(frozen_consts(EVERY_DTYPE, allow_nan=True))
def test_host_round_trip_is_exact_and_frozen(x):
    host = np.asarray(x)
    assert host.shape == x.shape and host.dtype == x.host_dtype
    assert not host.flags.writeable
    again = FrozenConst(host, dtype=x.host_dtype)  # as held (without it, float64 is held as float32)
    np.testing.assert_array_equal(_bits(np.asarray(again)), _bits(host))


@given(frozen_consts(EVERY_DTYPE, allow_nan=True))
def test_device_round_trip_matches_jnp_asarray_of_the_host_data(x):
    device = jnp.asarray(x)
    expected = jnp.asarray(np.asarray(x))
    assert device.dtype == expected.dtype and device.shape == expected.shape
    np.testing.assert_array_equal(_bits(np.asarray(device)), _bits(np.asarray(expected)))
    assert jnp.asarray(x) is device  # cache identity


@given(frozen_consts(EVERY_DTYPE, allow_nan=True))
def test_pickle_round_trip(x):
    y = pickle.loads(pickle.dumps(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(_bits(np.asarray(y)), _bits(np.asarray(x)))
    assert not np.asarray(y).flags.writeable


@given(hnp.arrays(hnp.scalar_dtypes().filter(lambda d: d.kind in "biufc"), hnp.array_shapes(min_dims=0)))
def test_source_mutation_is_never_seen(source):
    # Under x64, so 64-bit integers beyond 32 bits are held (without it they are
    # refused: JAX would wrap them on the device; see test_bad_input.py).
    with enable_x64(True):
        x = FrozenConst(source)
    assert x.host_dtype == source.dtype.newbyteorder("=")  # stored in native byte order
    snapshot = source.copy()
    source.fill(1)
    np.testing.assert_array_equal(np.asarray(x), snapshot)


_OPS = {
    "add": lambda a, b: a + b,
    "radd": lambda a, b: b + a,
    "mul": lambda a, b: a * b,
    "sub": lambda a, b: b - a,
    "eq": lambda a, b: a == b,
    "neg": lambda a, b: -a,
    "getitem": lambda a, b: a[..., :1],
    "sum": lambda a, b: jnp.sum(a),
    "where": lambda a, b: jnp.where(a > b, a, b),
    "jit": lambda a, b: jax.jit(lambda u, v: u * 2 + v)(a, b),
}


@given(
    frozen_consts(dtype=st.sampled_from(["float32", "int32", "bfloat16", "float16"]), shape=(2, 3)),
    st.sampled_from(sorted(_OPS)),
)
def test_operators_match_jax_array(x, name):
    ref = jnp.asarray(np.asarray(x))
    other = jnp.ones((2, 3), ref.dtype)
    got, expected = _OPS[name](x, other), _OPS[name](ref, other)
    assert isinstance(got, jax.Array) and got.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


@given(EVERY_DTYPE)
def test_every_jax_dtype_transfers(dtype):
    x = FrozenConst(np.zeros((2, 2), dtype))
    assert jnp.asarray(x).shape == (2, 2)


def test_shrinking_produces_small_examples():
    found = find(frozen_consts(), lambda x: x.size >= 3)
    assert found.size == 3 and found.ndim == 1
    assert not np.asarray(found).astype(np.float32).any()  # zeros
    found2 = find(frozen_consts(dtype="float32"), lambda x: x.ndim >= 2 and bool(np.any(np.asarray(x) > 1)))
    assert found2.shape in {(1, 1)}
    assert np.asarray(found2).max() < 3.0


def test_from_type_is_registered():
    @given(st.from_type(FrozenConst))
    def check(x):
        assert isinstance(x, FrozenConst) and x.is_concrete

    check()


@pytest.mark.subprocess
def test_strategies_need_hypothesis(tmp_path):
    import os
    import subprocess
    import sys

    blocker = tmp_path / "hypothesis.py"
    blocker.write_text("raise ImportError('hypothesis is not installed (simulated)')\n")
    out = subprocess.run(
        [sys.executable, "-c", "import frozenconst.strategies"],
        # The blocker first; then what this process imports from (a machine may keep JAX and
        # frozenconst on PYTHONPATH alone, as the lent TPU's image does).
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path[1:]]), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "pip install hypothesis" in out.stderr


@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (1,), (2, 0, 2)])
def test_zero_size_and_0d(shape):
    x = FrozenConst(np.zeros(shape, np.float32))
    assert jnp.asarray(x).shape == shape
    assert np.asarray(x).shape == shape
    assert repr(x).startswith("FrozenConst(")


# -- a Python scalar promotes as JAX promotes it --------------------------------------------------
# `FrozenConst(0.5) * bf16` is bfloat16 and `FrozenConst(3) + int8` int8, as with
# `jnp.asarray(0.5)` and `jnp.asarray(3)`: JAX types a Python scalar weakly, not as float32 or
# int32. Each call form below combines a constant (`c`) with an array (`y`), and is run twice:
# on `FrozenConst(s)`, and on `jnp.asarray(s)` in its place.

_OTHER_DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.int32,
    jnp.bfloat16,
    np.float16,
    np.float32,
    np.complex64,
]


def _call_forms(c):
    return {
        "operator": lambda y: c * y,
        "reflected operator": lambda y: y - c,
        "jnp.multiply": lambda y: jnp.multiply(c, y),
        "jax.jit, an argument": lambda y: jax.jit(lambda c, y: c * y)(c, y),
        "jax.jit, closed over": lambda y: jax.jit(lambda y: y + c)(y),
        "frozenconst.jit, an argument": lambda y: frozenconst.jit(lambda c, y: c * y)(c, y),
        "frozenconst.jit, closed over": lambda y: frozenconst.jit(lambda y: y + c)(y),
        "frozenconst.jit, a parameter": lambda y: frozenconst.jit(lambda y: c * y, embed_max_bytes=0)(y),
    }


def _outcome(form, y):
    try:
        with warnings.catch_warnings():
            # frozenconst.jit says that it leaves a closed-over jax.Array in the program (the
            # reference's `embed_max_bytes=0` form); a FrozenConst it keeps out says nothing.
            warnings.filterwarnings("ignore", "frozenconst.jit: .* closes over a jax.Array")
            out = form(y)
    except Exception as err:  # the same error as JAX's, or none
        return type(err).__name__
    return (np.dtype(out.dtype), out.weak_type, np.asarray(out).tolist())


@given(
    st.one_of(
        st.booleans(),
        st.integers(-300, 300),
        st.floats(-1e3, 1e3, allow_nan=False, width=32),
        st.complex_numbers(max_magnitude=1e3, allow_nan=False, allow_infinity=False, width=64),
    ),
    st.sampled_from(_OTHER_DTYPES),
    st.sampled_from(sorted(_call_forms(None))),
)
def test_a_python_scalar_promotes_as_jnp_asarray_of_it(scalar, dtype, name):
    x, a = FrozenConst(scalar), jnp.asarray(scalar)
    assert (x.dtype, x.weak_type, jnp.asarray(x).weak_type) == (a.dtype, a.weak_type, a.weak_type)
    y = jnp.asarray(np.arange(1, 4) % 2, dtype=dtype)
    assert _outcome(_call_forms(x)[name], y) == _outcome(_call_forms(a)[name], y), (scalar, dtype, name)


def test_a_python_scalar_stays_weak_where_it_travels_and_strong_with_a_dtype():
    x = FrozenConst(0.5)
    assert repr(x) == "FrozenConst(0.5, dtype=float32, weak_type=True)"
    for again in (FrozenConst(x), pickle.loads(pickle.dumps(x))):
        assert (again * jnp.ones(2, jnp.bfloat16)).dtype == jnp.bfloat16
    # A dtype asked for is strong, as in `jnp.asarray(0.5, dtype=jnp.float32)`.
    for strong in (
        FrozenConst(0.5, dtype=np.float32),
        FrozenConst(x, dtype=np.float32),
        FrozenConst(np.float32(0.5)),
    ):
        assert (strong * jnp.ones(2, jnp.bfloat16)).dtype == jnp.float32
        assert not jnp.asarray(strong).weak_type
    # Placed on a device: the committed buffer is weak too.
    assert jnp.asarray(x.placed(jax.devices()[0])).weak_type


# -- bit for bit what the argument form computes ---------------------------------------------------
# A FrozenConst kept out of a program is a parameter, as the table passed as an argument is: the
# program is the argument form's, so its results are too, bit for bit, where an embedded table lets
# XLA fold it and round otherwise. One at or below the size JAX itself embeds (under JAX's default
# pipeline frozenconst's `embed_max_bytes`, 4 KiB; under the simplified one JAX's own rule) is
# embedded as a closed-over `jax.Array` is, and computes what that computes. The shapes drawn reach
# both sides of either limit for every dtype.

_TABLE_DTYPES = ["float32", "float16", "bfloat16", "float64", "int32", "int8", "uint8", "bool", "complex64"]


def _uses(t, x):
    """Mixed, non-linear arithmetic on the table, whose rounding folding it could change."""
    real = jnp.abs(t) if jnp.iscomplexobj(t) else t
    f = real.astype(jnp.float32)
    return jnp.tanh(f * x + jnp.sin(f) * 1.1).sum(axis=0) + jnp.exp(-jnp.abs(f[0]))


_TRANSFORMS = {
    "plain": lambda g: g,
    "nested jit": lambda g: lambda x: jax.jit(g)(x) * 2.0,
    "grad": lambda g: jax.grad(lambda x: jnp.sum(g(x))),
    "vmap": lambda g: lambda x: jax.vmap(g)(jnp.stack([x, -x])),
    "scan": lambda g: lambda x: jax.lax.scan(lambda c, _: (c + g(c), None), x, None, length=2)[0],
}
_JITS = {
    "jax.jit": (jax.jit, EMBED_LIMIT),
    "frozenconst.jit": (frozenconst.jit, EMBED_LIMIT),
    "frozenconst.jit(embed_max_bytes=0)": (lambda f: frozenconst.jit(f, embed_max_bytes=0), 0),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(_TABLE_DTYPES),
    shape=st.one_of(st.tuples(st.integers(1, 5000)), st.tuples(st.integers(1, 24), st.integers(1, 400))),
    transform=st.sampled_from(sorted(_TRANSFORMS)),
    jit=st.sampled_from(sorted(_JITS)),
    seed=st.integers(0, 2**16),
)
def test_results_are_bit_for_bit_the_argument_forms(dtype, shape, transform, jit, seed):
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal(shape) * 3).astype(jnp.dtype(dtype))
    table = FrozenConst(data)
    x = jnp.asarray(rng.standard_normal(shape[-1:]).astype(np.float32))
    wrap, embed_max_bytes = _JITS[jit]
    form = _TRANSFORMS[transform]
    ours = np.asarray(wrap(form(lambda y: _uses(table, y)))(x))
    array = jnp.asarray(data)
    # JAX's own rule under the simplified pipeline: above `jax_embedded_constants_max_bytes` from
    # jax 0.10; every non-scalar array (all drawn here) on 0.8 and 0.9, which lack the option.
    limit = getattr(jax.config, "jax_embedded_constants_max_bytes", 0) if SIMPLIFIED else embed_max_bytes
    if table.nbytes > limit:
        expected = jax.jit(lambda t, x: form(lambda y: _uses(t, y))(x))(array, x)  # the argument form
    else:
        expected = jax.jit(form(lambda y: _uses(array, y)))(x)  # embedded, as JAX embeds a small array
    np.testing.assert_array_equal(_bits(ours), _bits(np.asarray(expected)))
