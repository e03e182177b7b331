"""Code that `jax.jit` runs, `frozenconst.jit` runs too, with the same results."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import frozenconst
from frozenconst import FrozenConst

WRAPS = [pytest.param(jax.jit, id="jax.jit"), pytest.param(frozenconst.jit, id="frozenconst.jit")]

# These tests donate constants on purpose; that each donation is said is tests/test_donation.py's.
pytestmark = [
    pytest.mark.filterwarnings("ignore:The device buffer of FrozenConst:frozenconst.FrozenConstWarning"),
]


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("how", ["position", "name"])
def test_a_constant_closed_over_and_donated_in_the_same_call(wrap, how):
    # Where JAX itself refuses to donate a closed-over `jax.Array` (jax 0.9 under the simplified
    # pipeline, `jax_donates_closed_over_buffers`), a FrozenConst donated so is embedded instead,
    # under every jit: the call runs.
    x = FrozenConst(np.arange(4.0, dtype=np.float32))
    kwargs = {"donate_argnums": 0} if how == "position" else {"donate_argnames": "a"}
    f = wrap(lambda a: a * 0 - 1 + x * 0, **kwargs)
    with warnings.catch_warnings():
        # The CPU backend may not use the donated buffer ("Some donated buffers were not usable").
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        for _ in range(2):
            out = f(x) if how == "position" else f(a=x)
            np.testing.assert_array_equal(np.asarray(out), -np.ones(4))
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), np.arange(4.0))  # still the constant
    np.testing.assert_array_equal(np.asarray(x + 1), np.arange(4.0) + 1)


def test_a_donated_constant_that_is_also_closed_over_twice_after_other_donations():
    c = FrozenConst(np.full(4, 3.0, np.float32))
    x = jnp.ones(4)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        other = frozenconst.jit(lambda w: w + c, donate_argnums=0)
        np.testing.assert_array_equal(np.asarray(other(jnp.ones(4))), 4.0)
        f = frozenconst.jit(lambda a, w: a + w + c, donate_argnums=0)
        reference = jax.jit(lambda a, w: a + w + c, donate_argnums=0)
        for _ in range(3):
            np.testing.assert_array_equal(np.asarray(reference(c, x)), np.full(4, 7.0))  # 3 + 1 + 3
            np.testing.assert_array_equal(np.asarray(f(c, x)), np.full(4, 7.0))
    np.testing.assert_array_equal(np.asarray(c + 0), 3.0)


def test_eval_shape_as_on_a_jax_jit_function():
    c = FrozenConst(np.ones((4, 3), np.float32))
    f = frozenconst.jit(lambda w: c @ w)
    expected = jax.jit(lambda w: c @ w).eval_shape(jnp.ones(3))
    assert f.eval_shape(jnp.ones(3)) == expected == jax.eval_shape(f, jnp.ones(3))


def test_an_inner_function_that_catches_every_exception_never_poisons_another_function():
    # An inner trace that catches the stop of a nested use goes on and is
    # cached; no later frozenconst.jit trace may reuse it.
    c = FrozenConst(np.full(2, 10.0, np.float32))

    @jax.jit
    def helper(v):
        try:
            return v + c
        except Exception:
            return v * 0

    x = jnp.ones(2)
    expected = np.full(2, 11.0)
    np.testing.assert_array_equal(np.asarray(helper(x)), expected)
    np.testing.assert_array_equal(np.asarray(frozenconst.jit(lambda v: helper(v))(x)), expected)
    np.testing.assert_array_equal(np.asarray(frozenconst.jit(lambda v: helper(v) + 0.0)(x)), expected)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: helper(v) * 1.0)(x)), expected)


def test_a_constant_met_only_by_tracing_and_donated_in_the_first_call():
    # The trace meets the constant (held in a list, so not visible before), and the
    # call is made again with it as a parameter: that call donates its buffer too,
    # and is fed a copy, as every later call is.
    x = FrozenConst(np.arange(4096.0, dtype=np.float32))
    holder = [x]
    f = frozenconst.jit(lambda a: a * 0 - 1 + holder[0] * 0, donate_argnums=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        for _ in range(2):
            np.testing.assert_array_equal(np.asarray(f(x)), -np.ones(4096))
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), np.arange(4096.0))  # still the constant
