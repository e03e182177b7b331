"""Constants inside nested traces, whatever compiles them: a user's error raised as `jax.jit`
raises it and changing nothing after it, constants reached every way inside every nested
trace, long-lived inner jits, nested frozenconst.jit functions, and `jax.disable_jit()`. Each
observed through JAX (results, programs, traces) against `jax.jit`."""

import gc
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    assert_float32_close,
    check_a_caught_stop_never_poisons_later_functions,
    program_parameters,
    unique_data,
)
from jax import lax

import frozenconst
from frozenconst import FrozenConst, FrozenConstWarning

# 256 KiB: a parameter under the default pipeline (a captured buffer under the simplified one).
BIG = FrozenConst(unique_data((256, 256)) / 256)


def _scanned(w):
    def body(carry, i):
        return carry + jnp.sum(BIG @ w) * i, None  # the user's line: a shape error for a bad `w`

    return lax.scan(body, 0.0, jnp.arange(3.0))[0]


def _as_argument(big, w):
    return lax.scan(lambda carry, i: (carry + jnp.sum(big @ w) * i, None), 0.0, jnp.arange(3.0))[0]


# -- a user's error, raised as jax.jit raises it, changes nothing after it ----------------------------


@pytest.mark.parametrize("first", ["bad call first", "good call first"])
def test_a_users_error_in_a_nested_trace_raises_as_under_jax_jit_and_moves_nothing(first):
    g = frozenconst.jit(_scanned)
    good = jnp.linspace(-1.0, 1.0, 256, dtype=jnp.float32)
    if first == "good call first":
        assert_float32_close(g(good), jax.jit(_scanned)(good), np.abs(np.asarray(BIG)).sum() * 3)
    with pytest.raises(TypeError) as theirs:
        jax.jit(_scanned)(jnp.ones(7))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no FrozenConstWarning, nor any other
        with pytest.raises(type(theirs.value)) as ours:
            g(jnp.ones(7))
        # What the user sees: JAX's message, the user's line, nothing of frozenconst's.
        assert str(ours.value) == str(theirs.value)
        frames = traceback.extract_tb(ours.value.__traceback__)
        assert any(f.filename == __file__ and f.name == "body" for f in frames), frames
        assert ours.value.__cause__ is None and ours.value.__context__ is None
        # Later programs, new shapes and dtypes included, keep the constant out.
        for w in (good, jnp.ones((256, 2), jnp.float32), jnp.ones(256, jnp.bfloat16)):
            hlo = len(g.lower(w).as_text())
            assert hlo <= 1.1 * len(jax.jit(_as_argument).lower(jnp.asarray(BIG), w).as_text()), hlo
            assert hlo < BIG.nbytes / 16, hlo
            np.testing.assert_allclose(np.asarray(g(w)), np.asarray(jax.jit(_scanned)(w)), rtol=1e-5)


def test_the_same_error_twice_moves_nothing_either():
    g = frozenconst.jit(_scanned)
    for _ in range(2):
        with pytest.raises(TypeError, match="dot_general requires contracting dimensions"):
            g(jnp.ones(7))
    assert len(g.lower(jnp.ones(256)).as_text()) < BIG.nbytes / 16


# An error that does not recur, and an interrupt, in functions that donate an argument.
_DONATED = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _is_parameter(x):
    """Whether `x`, inside a nested trace, is a value of the outer trace (the parameter form)."""
    return isinstance(jnp.asarray(x), jax.core.Tracer)


class _FailsOnce:
    """`_scanned`, whose next trace raises a transient error after the scan when `armed`."""

    def __init__(self):
        self.armed = False

    def __call__(self, w, donated):
        out = lax.scan(lambda carry, i: (carry + jnp.sum(BIG @ w) * i, None), 0.0, jnp.arange(3.0))[0]
        if self.armed:
            self.armed = False
            raise RuntimeError("transient: the model server went away")  # the user's line
        return out + jnp.sum(donated)


@_DONATED
def test_an_error_that_does_not_recur_is_raised_as_under_jax_jit_and_moves_nothing():
    f = _FailsOnce()
    g = frozenconst.jit(f, donate_argnums=1)
    good = jnp.linspace(-1.0, 1.0, 256, dtype=jnp.float32)
    assert_float32_close(
        g(good, jnp.zeros(1)),
        jax.jit(_as_argument)(jnp.asarray(BIG), good),
        np.abs(np.asarray(BIG)).sum() * 3,
    )
    f.armed = True
    with pytest.raises(RuntimeError, match="transient") as theirs:
        jax.jit(f, donate_argnums=1)(good.astype(jnp.bfloat16), jnp.zeros(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)  # nothing said of a refusal
        f.armed = True
        with pytest.raises(RuntimeError, match="transient") as ours:
            g(good.astype(jnp.bfloat16), jnp.zeros(1))  # a new dtype: traced anew
        assert str(ours.value) == str(theirs.value)
        assert ours.value.__cause__ is None and ours.value.__context__ is None
        frames = traceback.extract_tb(ours.value.__traceback__)
        assert any(f.filename == __file__ and f.name == "__call__" for f in frames), frames
        # The constant stays a parameter: out of this program and the next.
        for w in (good.astype(jnp.bfloat16), jnp.ones((256, 2), jnp.float32)):
            hlo = len(g.lower(w, jnp.zeros(1)).as_text())
            assert hlo < BIG.nbytes / 16, hlo
            np.testing.assert_allclose(
                np.asarray(g(w, jnp.zeros(1))),
                np.asarray(jax.jit(_as_argument)(jnp.asarray(BIG), w)),
                rtol=1e-2,
            )


class _InterruptedRetry:
    """A scan body that, when `armed`, is interrupted (`KeyboardInterrupt`, the user's Ctrl-C)
    while it is traced."""

    def __init__(self):
        self.armed = False

    def __call__(self, w, donated):
        def body(carry, _):
            if self.armed:
                if _is_parameter(BIG):
                    raise RuntimeError("fails where the constant is a parameter")
                self.armed = False
                raise KeyboardInterrupt
            return carry + jnp.sum(BIG @ w), None

        return lax.scan(body, 0.0, None, length=2)[0] + jnp.sum(donated)


@_DONATED
def test_an_interrupt_during_the_retry_moves_nothing():
    f = _InterruptedRetry()
    g = frozenconst.jit(f, donate_argnums=1)
    g(jnp.ones(256), jnp.zeros(1))  # a good first call: the constant a parameter
    f.armed = True
    with pytest.raises(KeyboardInterrupt):
        g(jnp.ones(256, jnp.bfloat16), jnp.zeros(1))
    assert not f.armed  # interrupted while traced
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)  # nothing said of a refusal
        w = jnp.ones((256, 2), jnp.float32)  # a new shape: traced anew
        out = g(w, jnp.zeros(1))
        assert len(g.lower(w, jnp.zeros(1)).as_text()) < BIG.nbytes / 16
    expected = jax.jit(lambda big, w: 2 * jnp.sum(big @ w))(jnp.asarray(BIG), w)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5)


# -- constants reached every way inside nested traces ------------------------------------------------


class _Model:
    def __init__(self, table, nested):
        self.table, self.nested = table, nested

    def __call__(self, x):
        return self.nested(lambda: self.table, x)


class _TwoTables:
    """Two attributes, both used in the nested trace: two parameters."""

    def __init__(self, table, nested):
        self.table, self.other, self.nested = table, FrozenConst(np.asarray(table) + 1), nested

    def __call__(self, x):
        return self.nested(lambda: self.table * 0.5 + self.other * 0.5, x)


def _in_scan(get, x):
    return lax.scan(lambda c, _: (c + jnp.sum(get() * x), None), 0.0, None, length=3)[0]


def _in_jit(get, x):
    return jax.jit(lambda y: jnp.sum(get() * y))(x)


def _in_grad(get, x):
    return jnp.sum(jax.grad(lambda y: jnp.sum(jnp.sin(get() * y)))(x))


def _in_cond(get, x):
    return lax.cond(x.ravel()[0] > 0, lambda y: jnp.sum(get() * y), lambda y: jnp.sum(y), x)


NESTED = {"scan": _in_scan, "jit": _in_jit, "grad": _in_grad, "cond": _in_cond}
_GLOBAL = FrozenConst(unique_data((32, 64)))


def _reach(reach, table, nested):
    if reach == "closure":
        return lambda x: nested(lambda: table, x)
    if reach == "attribute":
        return _Model(table, nested)
    if reach == "attributes":
        return _TwoTables(table, nested)
    if reach == "dict":
        tables = {"t": table}
        return lambda x: nested(lambda: tables["t"], x)
    return lambda x: nested(lambda: _GLOBAL, x)  # the module global


@pytest.mark.parametrize("nested", sorted(NESTED))
@pytest.mark.parametrize("reach", ["closure", "attribute", "attributes", "dict", "global"])
def test_every_way_to_reach_a_constant_in_every_nested_trace_computes_and_keeps_it_out(reach, nested):
    table = _GLOBAL if reach == "global" else FrozenConst(unique_data((32, 64)))
    fun = _reach(reach, table, NESTED[nested])
    x = jnp.linspace(0.5, 1.5, 32 * 64, dtype=jnp.float32).reshape(32, 64)
    expected = np.asarray(jax.jit(fun)(x))
    for ours in (frozenconst.jit(lambda v: fun(v), embed_max_bytes=0), jax.jit(lambda v: fun(v))):
        np.testing.assert_allclose(np.asarray(ours(x)), expected, rtol=2e-5)
        # The program holds none of the table's data (8 KiB, two hex digits a byte as text): a
        # parameter, once however many tables (`attributes` reaches two), beside `x`.
        lowered = ours.lower(jnp.ones((32, 64), jnp.float32))
        assert len(lowered.as_text()) < table.nbytes, reach
        assert program_parameters(lowered) == (3 if reach == "attributes" else 2)


def test_a_module_level_inner_jit_over_a_constant_met_late_computes_with_it():
    # A long-lived inner `jax.jit` closing over a constant it is the first to meet (the
    # composition property test's form is `frozenconst.jit(partial(jax.jit(f)))`).
    table = FrozenConst(unique_data((32, 64)))
    helper = jax.jit(lambda y: jnp.sum(table * y))
    x = jnp.linspace(0.5, 1.5, 32 * 64, dtype=jnp.float32).reshape(32, 64)
    want = np.asarray(jax.jit(lambda v: helper(v))(x))
    for scale in (1.0, 2.0, 3.0):
        fun = frozenconst.jit(lambda v, s=scale: helper(v) * s, embed_max_bytes=0)
        np.testing.assert_allclose(np.asarray(fun(x)), want * scale, rtol=2e-5)
        del fun
        gc.collect()


def test_a_long_lived_inner_jit_and_one_made_per_trace_compute_with_their_constants():
    # A module-level `jax.jit` that JAX keeps traced, beside one made and dropped with each trace
    # of the outer function, each closing over a constant of its own: every new function gets
    # the constants' values.
    first = {"t": FrozenConst(unique_data((32, 64)))}
    second = FrozenConst(unique_data((32, 64)))
    helper = jax.jit(lambda y: jnp.sum(second * y))  # lives on, and closes over `second`

    def fun(v):
        inner = jax.jit(lambda y: jnp.sum(first["t"] * y))  # made and dropped with each trace
        return inner(v) + helper(v)

    x = jnp.linspace(0.5, 1.5, 32 * 64, dtype=jnp.float32).reshape(32, 64)
    want = np.asarray(jax.jit(fun)(x))
    made = []
    for _ in range(3):
        made.append(frozenconst.jit(fun, embed_max_bytes=0))
        np.testing.assert_allclose(np.asarray(made[-1](x)), want, rtol=2e-5)
        gc.collect()


def test_an_inner_function_catching_every_error_never_poisons_a_later_function():
    check_a_caught_stop_never_poisons_later_functions()  # the scenario: tests/helpers.py


# -- a nested frozenconst.jit inside an outer trace ------------------------------------------------


def test_a_nested_frozenconst_jit_leaves_jaxs_cached_traces_of_other_functions_alone():
    # A module-level jax.jit traced once stays traced once, whatever frozenconst.jit functions
    # (nested in a scan body of another) trace around it.
    traced = []

    @jax.jit
    def shared_helper(v):
        traced.append(1)
        return v * 2

    x = jnp.ones(64, jnp.float32)
    frozenconst.jit(lambda v: shared_helper(v))(x)
    assert len(traced) == 1

    box = {"u": FrozenConst(unique_data((64, 64)))}
    inner = frozenconst.jit(lambda v: box["u"] @ v, embed_max_bytes=0)

    def outer(w):
        return lax.scan(lambda c, _: (c + inner(w), None), jnp.zeros(64), None, length=2)[0]

    np.testing.assert_allclose(
        np.asarray(frozenconst.jit(outer, embed_max_bytes=0)(x)), np.asarray(jax.jit(outer)(x)), rtol=2e-5
    )
    frozenconst.jit(lambda v: shared_helper(v) + 1)(x)
    assert len(traced) == 1  # JAX's cached trace found again


# -- jax.disable_jit() --------------------------------------------------------------------------------


@pytest.mark.parametrize("nested", ["top level", "scan"])
def test_under_disable_jit_a_constant_met_late_is_its_own_values_from_the_first_run(nested):
    # Nothing is traced there: a Python check on a constant's values runs, once, on its values,
    # as under jax.jit.
    table = FrozenConst(np.ones((64, 64), np.float32))  # 16 KiB: above `embed_max_bytes`
    box = {"t": table}

    def fun(w, seen):
        def use():
            t = box["t"]
            seen.append(float(t[0, 0]))
            if float(t[0, 0]) != 1.0:
                raise ValueError(f"the table reads {float(t[0, 0])}")
            return t @ w

        if nested == "scan":
            return lax.scan(lambda c, _: (c + use(), None), jnp.zeros(64), None, length=1)[0]
        return use()

    w = jnp.ones(64, jnp.float32)
    ours, theirs = [], []
    with jax.disable_jit():
        got = frozenconst.jit(lambda v: fun(v, ours))(w)
        want = jax.jit(lambda v: fun(v, theirs))(w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert ours == theirs == [1.0]


def test_under_disable_jit_lowering_still_keeps_the_constant_out():
    # `.lower()` traces under `jax.disable_jit()` too: there a constant is what it is in any
    # trace, a parameter (default pipeline) or a captured buffer, never embedded.
    box = {"t": FrozenConst(unique_data((256, 256)))}
    f = frozenconst.jit(lambda w: jnp.sum(box["t"] @ w))
    w = jnp.ones(256)
    with jax.disable_jit():
        lowered = len(f.lower(w).as_text())
        grads = jax.grad(f)(w)  # run as it is: the constant's own values
    assert lowered < box["t"].nbytes / 16, lowered
    np.testing.assert_allclose(np.asarray(grads), np.asarray(jax.grad(lambda v: jnp.sum(box["t"] @ v))(w)))


def test_under_disable_jit_a_returned_constant_is_what_jax_jit_returns():
    table = FrozenConst(unique_data((32, 32)))
    box = {"t": table}
    with jax.disable_jit():
        got = frozenconst.jit(lambda w: (box["t"], box["t"] @ w))(jnp.ones(32))
        want = jax.jit(lambda w: (box["t"], box["t"] @ w))(jnp.ones(32))
    assert type(got[0]) is type(want[0])
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(table))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
