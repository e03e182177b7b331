"""Donating a state that holds a FrozenConst breaks none of the constant's later uses.

JAX deletes a donated buffer; the constant's cached buffer is among them when the
donated state holds the constant. Every later use must still compute with the
constant: eagerly, and in every compiled program, traced before or after, that
took the old buffer as a parameter, whatever jit compiled it. frozenconst sees the
donation where the donating program is compiled: it says so once, programs that
held the buffer are compiled again (`jax.clear_caches()`), and from then on they
embed the constant, as JAX embeds any array (docs/training.md).
"""

import threading
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, live_copies, on_device, unique_data

import frozenconst
from frozenconst import FrozenConst, FrozenConstWarning

DONATES = "A jitted function donates the device buffer of FrozenConst"


def _donate(state):
    with warnings.catch_warnings():
        # The CPU backend may not reuse the memory ("Some donated buffers were not usable").
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        warnings.filterwarnings("ignore", ".*put a copy of FrozenConst", FrozenConstWarning)  # the output
        warnings.filterwarnings("ignore", DONATES, FrozenConstWarning)  # said where it is compiled
        out = jax.jit(lambda s: {"t": s["t"] * 2, "w": s["w"] + 1}, donate_argnums=0)(state)
    jax.block_until_ready(out)
    return out


def _deleted(x):
    return any(a.is_deleted() for a in x._store._made.values())


@pytest.mark.parametrize("size", [(4, 4), (64, 64)], ids=["captured", "parameter"])
def test_every_later_use_of_a_donated_constant_computes_with_the_constant(size):
    data = unique_data(size)
    x = FrozenConst(data)
    v = jnp.ones(size)
    inner = jax.jit(lambda v: v * x)
    uses = {
        "frozenconst.jit": frozenconst.jit(lambda v: v + x),
        "inner jax.jit": frozenconst.jit(lambda v: inner(v) + 1),
        "scan": frozenconst.jit(lambda v: jax.lax.scan(lambda c, _: (c + x, None), v, None, length=2)[0]),
    }
    expected = {
        "frozenconst.jit": data + 1,
        "inner jax.jit": data + 1,
        "scan": 1 + 2 * data,
    }
    uses["jax.jit"] = jax.jit(lambda v: v + x)
    expected["jax.jit"] = data + 1
    for name, f in uses.items():  # traced before the donation
        np.testing.assert_allclose(np.asarray(f(v)), expected[name], rtol=1e-6, atol=1e-6)
    with pytest.warns(FrozenConstWarning, match=DONATES):  # said where the donating step compiles
        jax.block_until_ready(jax.jit(lambda s: s["t"] * 2, donate_argnums=0)({"t": x}))
    assert _deleted(x)  # JAX deleted the constant's cached buffer
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # told once, above
        np.testing.assert_array_equal(np.asarray(x + 0), data)  # eager: transferred again
    for name, f in uses.items():
        np.testing.assert_allclose(np.asarray(f(v)), expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    late = frozenconst.jit(lambda v: v - x)  # traced after
    np.testing.assert_allclose(np.asarray(late(v)), 1 - data, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x), data)  # the host data never changed


@pytest.mark.parametrize("size", [(4, 4), (64, 64)], ids=["captured", "parameter"])
def test_a_function_called_first_after_the_donation_feeds_the_constant_again(size):
    # No eager use in between: the function meets the deleted buffer it fed or captured.
    data = unique_data(size)
    x = FrozenConst(data)
    f = frozenconst.jit(lambda v: v + x)
    g = jax.jit(lambda v: v + x)
    f(jnp.ones(size))
    g(jnp.ones(size))
    _donate({"t": x, "w": jnp.zeros(3)})
    for h in (f, g):
        np.testing.assert_allclose(np.asarray(h(jnp.ones(size))), data + 1, rtol=1e-6, atol=1e-6)
    assert live_copies(data) <= 1  # embedded now, with at most the buffer of an earlier use


@pytest.mark.parametrize("size", [(4, 4), (64, 64)], ids=["embedded", "parameter"])
def test_a_plain_jax_jit_closure_keeps_working_after_a_state_holding_the_constant_is_donated(size):
    # A library's function compiled by the user's own `jax.jit`: the program that held the old
    # buffer is compiled again, never "Buffer has been deleted or donated", also for a function
    # made after the donation.
    data = unique_data(size)
    x = FrozenConst(data)
    h = jax.jit(lambda v: v - x)
    h(jnp.ones(size))
    _donate({"t": x, "w": jnp.zeros(3)})
    np.testing.assert_allclose(np.asarray(h(jnp.ones(size))), 1 - data, rtol=1e-6, atol=1e-6)
    late = jax.jit(lambda v: v * x)
    np.testing.assert_allclose(np.asarray(late(jnp.ones(size))), data, rtol=1e-6)


def test_a_training_step_that_donates_its_state_leaves_the_model_constant_working():
    data = unique_data((8, 8))
    table = FrozenConst(data)
    apply = frozenconst.jit(lambda w, v: (table @ v) * w)
    state = {"w": jnp.ones(()), "table": table}

    @jax.jit
    def loss(state, v):
        return jnp.sum(state["table"] @ v * state["w"])

    step = jax.jit(
        lambda s, v: {"w": s["w"] - 0.1 * jax.grad(loss)(s, v)["w"], "table": s["table"]}, donate_argnums=0
    )
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            warnings.filterwarnings("ignore", category=FrozenConstWarning)
            state = step(state, jnp.ones(8))
            out = apply(state["w"], jnp.ones(8))
    # Relative to the terms' size, not to each entry: a row of `data` can cancel to 0.003 among
    # terms of about 1 (seen on jax 0.12.0.1: 3.2e-5 off relative to that entry, 1e-7 absolute).
    w = np.asarray(state["w"])
    assert_float32_close(out, on_device(data) @ np.ones(8) * w, np.abs(data) @ np.ones(8) * np.abs(w))
    np.testing.assert_array_equal(np.asarray(table), data)


def test_a_constant_donated_every_step_costs_one_retrace_of_its_functions_and_nothing_else():
    # Each function traces again at most once: where a program held the buffer as a parameter,
    # JAX's caches are cleared once, at the first donation; from then on the constant is
    # embedded, and a donation each step traces nothing again.
    data = unique_data((4, 4))  # small: captured by both pipelines, as jax.jit captures it
    x, other = FrozenConst(data), FrozenConst(unique_data((4, 4)))
    traces = {"g": 0, "inner": 0, "bystander": 0}

    def count(name):
        traces[name] += 1

    @jax.jit
    def inner(v):  # long-lived, as a library's jitted function is; it never meets `x`
        count("inner")
        return v * 2

    @frozenconst.jit
    def g(v):
        count("g")
        return v + x

    def bystander(v):
        count("bystander")
        return inner(v) + other

    v = jnp.ones((4, 4))
    refs = []  # weak references to the constant's store: what keeps an entry per buffer ever made
    for _ in range(6):
        refs.append(weakref.getweakrefcount(x._store))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The device buffer of FrozenConst", FrozenConstWarning)
            warnings.filterwarnings("ignore", DONATES, FrozenConstWarning)
            _donate({"t": x, "w": jnp.zeros(3)})
            np.testing.assert_allclose(np.asarray(g(v)), data + 1, rtol=1e-6)
        # A wrapper made afresh each step, as in a loop that builds its step function: JAX's
        # caches of the function are shared with the last one's.
        out = frozenconst.jit(bystander)(v)
        np.testing.assert_allclose(np.asarray(out), 2 + np.asarray(other), rtol=1e-6)
        assert traces["bystander"] <= 2
    assert traces["inner"] <= 2, traces  # once more at most, where the caches were cleared
    assert traces["g"] <= 2, traces
    # The buffers made again hold no more than the first (the table of buffers' owners kept an
    # entry for every buffer ever made: about 0.7 KiB a step, issue #37).
    assert refs[-1] <= refs[2], refs


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.filterwarnings("ignore::frozenconst.FrozenConstWarning")  # each donation is said once
def test_two_threads_donating_the_constant_to_a_donating_step_never_see_its_buffer_deleted():
    # Issue #37: 17-32 of 1,000 calls raised "Buffer has been deleted or donated" from
    # frozenconst's own code: a copy made of a buffer the other thread had just donated, a
    # refeed that gave up, the call made again. Each use of a constant gets a buffer made for
    # it; a call refused for one that another thread donated since is fed afresh and made again.
    data = unique_data((64, 64))
    x = FrozenConst(data)
    step = frozenconst.jit(lambda s: {"w": s["w"] + jnp.sum(x), "t": s["t"] * 1}, donate_argnums=0)
    expected = float(np.sum(on_device(data)))
    failures, results = [], []

    def worker():
        for _ in range(300):
            try:
                out = step({"w": jnp.zeros(()), "t": x})
                results.append((float(out["w"]), np.array_equal(np.asarray(out["t"]), data)))
            except Exception as err:  # the defect: any error at all
                failures.append(repr(err))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [], (len(failures), failures[:3])
    assert len(results) == 600
    assert all(same for _, same in results)
    np.testing.assert_allclose([w for w, _ in results], expected, rtol=1e-5)
