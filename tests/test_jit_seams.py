"""Code that `jax.jit` runs, `frozenconst.jit` runs too, with the same results."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import frozenconst
from frozenconst import FrozenConst

WRAPS = [pytest.param(jax.jit, id="jax.jit"), pytest.param(frozenconst.jit, id="frozenconst.jit")]


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("how", ["position", "name"])
def test_a_constant_closed_over_and_donated_in_the_same_call(wrap, how):
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
