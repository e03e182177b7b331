"""Donating a state that holds a FrozenConst breaks none of the constant's later uses.

A jitted call that donates a state holding a constant donates everything in it but the
constant: frozenconst takes the constant's buffer out of the donation where the program is
lowered, so it is never deleted, transferred again, nor said. Where the
donating call cannot be seen (a program compiled ahead of time, `.lower(...).compile()`), or
the buffer is deleted through `jnp.asarray(x).delete()`, JAX deletes it: every later use
must still compute with the constant, eagerly and in every compiled program, traced before
or after, that took the old buffer as a parameter, whatever jit compiled it. frozenconst sees
the loss at the constant's next use: it says so once, programs that held the buffer are
compiled again (`jax.clear_caches()`), and from then on they embed the constant, as JAX
embeds any array (docs/training.md).
"""

import threading
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import JAX_EMBED_MAX_BYTES, SIMPLIFIED, assert_float32_close, live_copies, on_device, unique_data

import frozenconst
from frozenconst import FrozenConst, FrozenConstWarning

LOST = "The device buffer of FrozenConst .* was deleted"


def _donate(state, ahead=False):
    """Donate `state` to a jitted step; `ahead`: to the step compiled ahead of time, which JAX
    runs without the call frozenconst reads, so every buffer in it is deleted."""
    with warnings.catch_warnings():
        # The CPU backend may not reuse the memory ("Some donated buffers were not usable").
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        # (`u`, of the constant's shape and dtype: a donated buffer JAX can use, so deletes.)
        step = jax.jit(lambda s: {"w": s["w"] + jnp.sum(s["t"]), "u": s["t"] * 2}, donate_argnums=0)
        out = step.lower(state).compile()(state) if ahead else step(state)
    jax.block_until_ready(out)
    return out


def _deleted(x):
    return any(a.is_deleted() for a in x._store._made.values())


def _donating(jit):
    # `u` has the constant's shape and dtype: its donated buffer is one XLA can use for it, so
    # without frozenconst JAX would delete it (checked by the ahead-of-time form below).
    step = lambda s: {"w": s["w"] * 0.5 + jnp.sum(s["t"]), "u": s["t"] * 2}
    if jit == "jax.jit":
        return jax.jit(step, donate_argnums=0)
    if jit == "frozenconst.jit":
        return frozenconst.jit(step, donate_argnums=0)
    import equinox as eqx

    return eqx.filter_jit(step, donate="all")


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.parametrize("jit", ["jax.jit", "frozenconst.jit", "eqx.filter_jit"])
def test_a_jitted_call_donating_a_state_donates_all_but_the_constant(jit):
    data = unique_data((64, 64))
    x = FrozenConst(data)
    buffer = jnp.asarray(x)
    pointer = buffer.unsafe_buffer_pointer()
    reader = jax.jit(lambda v: v + x)  # compiled before, holding the buffer as a parameter
    reader(jnp.ones((64, 64)))
    step = _donating(jit)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)  # nothing to say
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        for _ in range(5):
            w = jnp.ones(())
            out = step({"w": w, "t": x})
            jax.block_until_ready(out)
            assert w.is_deleted()  # JAX's donation of the rest stands
        np.testing.assert_allclose(np.asarray(reader(jnp.ones((64, 64)))), 1 + data, rtol=1e-6)
    # The constant's one buffer, never deleted, never transferred again: observed through JAX.
    assert not buffer.is_deleted() and jnp.asarray(x).unsafe_buffer_pointer() == pointer
    assert x.stats().transfers == 1 and live_copies(data) == 1
    # A sum of random signs may nearly cancel: its rounding is bounded by the sum of magnitudes.
    magnitude = float(np.sum(np.abs(on_device(data))))
    np.testing.assert_allclose(float(out["w"]), 0.5 + np.sum(on_device(data)), rtol=0, atol=1e-6 * magnitude)


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_the_nnx_freeze_recipe_with_a_donating_step_transfers_each_constant_once():
    # `frozenconst.nnx.freeze` with `nnx.jit(donate_argnums=(0, 1))`, 10 steps: the frozen kernel
    # is transferred once, and no frozen variable warns.
    import optax
    from flax import nnx

    model = nnx.Sequential(nnx.Linear(64, 64, rngs=nnx.Rngs(0)), nnx.Linear(64, 2, rngs=nnx.Rngs(1)))
    frozenconst.nnx.freeze(model.layers[0])
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit(donate_argnums=(0, 1))
    def step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    kernel = model.layers[0].kernel
    before = frozenconst.stats().transfers
    pointer = jnp.asarray(kernel.get_value()).unsafe_buffer_pointer()
    trained = model.layers[1].kernel.get_value()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        losses = [float(step(model, optimizer, jnp.ones((8, 64)))) for _ in range(10)]
    assert frozenconst.stats().transfers == before  # transferred once, before the steps
    assert jnp.asarray(kernel.get_value()).unsafe_buffer_pointer() == pointer
    assert trained.is_deleted()  # the trained part was donated, as asked
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("size", [(4, 4), (64, 64)], ids=["captured", "parameter"])
def test_every_later_use_of_a_deleted_constant_computes_with_the_constant(size):
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
    step = jax.jit(lambda s: s["t"] * 2, donate_argnums=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        jax.block_until_ready(step.lower({"t": x}).compile()({"t": x}))
    assert _deleted(x)  # JAX deleted the constant's cached buffer
    with pytest.warns(FrozenConstWarning, match=LOST):  # said where the loss is met
        np.testing.assert_array_equal(np.asarray(x + 0), data)  # eager: transferred again
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # told once, above
        for name, f in uses.items():
            np.testing.assert_allclose(np.asarray(f(v)), expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    late = frozenconst.jit(lambda v: v - x)  # traced after
    np.testing.assert_allclose(np.asarray(late(v)), 1 - data, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x), data)  # the host data never changed


@pytest.mark.parametrize("size", [(4, 4), (64, 64)], ids=["captured", "parameter"])
def test_functions_called_after_a_jitted_donation_run_with_the_kept_buffer(size):
    # A user donates a state holding a library's table; the library's functions, compiled by
    # `frozenconst.jit` or by the user's own `jax.jit`, before or after, keep running, never
    # "Buffer has been deleted or donated" (under either pipeline).
    data = unique_data(size)
    x = FrozenConst(data)
    f = frozenconst.jit(lambda v: v + x)
    g = jax.jit(lambda v: v + x)
    f(jnp.ones(size))
    g(jnp.ones(size))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)
        for _ in range(3):
            _donate({"t": x, "w": jnp.zeros(3)})
        late = jax.jit(lambda v: v * x)
        for h, want in ((f, data + 1), (g, data + 1), (late, data)):
            np.testing.assert_allclose(np.asarray(h(jnp.ones(size))), want, rtol=1e-6, atol=1e-6)
    assert not _deleted(x) and x.stats().transfers == 1 and live_copies(data) <= 1


@pytest.mark.parametrize("size", [(4, 4), (64, 64)], ids=["captured", "parameter"])
def test_after_a_loss_no_one_saw_programs_run_again_once_the_constant_is_next_used(size):
    # Donated to a program compiled ahead of time: JAX deletes the buffer. `frozenconst.jit`
    # meets the loss at its own call and feeds the constant again; a plain `jax.jit` program
    # holding the old buffer raises JAX's error until the constant is next used (JAX calls
    # nothing of frozenconst's on its C++ fast path), then is compiled again and runs.
    data = unique_data(size)
    # A parameter of the programs, not embedded data: above JAX's own threshold when simplified.
    held = size == (64, 64) or (SIMPLIFIED and 4 * np.prod(size) > JAX_EMBED_MAX_BYTES)
    x = FrozenConst(data)
    f = frozenconst.jit(lambda v: v + x)
    g = jax.jit(lambda v: v + x)
    f(jnp.ones(size))
    g(jnp.ones(size))
    _donate({"t": x, "w": jnp.zeros(3)}, ahead=True)
    assert _deleted(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for h in (f, g):  # `f` first: it meets the loss, and `g` is compiled again
            np.testing.assert_allclose(np.asarray(h(jnp.ones(size))), data + 1, rtol=1e-6, atol=1e-6)
    told = [w for w in caught if issubclass(w.category, FrozenConstWarning)]
    assert len(told) == held and all("was deleted" in str(w.message) for w in told), [
        (w.lineno, str(w.message)[:200]) for w in told
    ]
    assert live_copies(data) <= 1  # embedded now, with at most the buffer of an earlier use
    # A plain jax.jit program alone, the buffer deleted through the array.
    y_data = unique_data(size)
    y = FrozenConst(y_data)
    h = jax.jit(lambda v: v - y)
    h(jnp.ones(size))
    jnp.asarray(y).delete()
    if held:
        with pytest.raises(Exception, match="has been deleted"):
            h(jnp.ones(size))
    with pytest.warns(FrozenConstWarning, match=LOST):
        y + 0  # the constant's next use
    np.testing.assert_allclose(np.asarray(h(jnp.ones(size))), 1 - y_data, rtol=1e-6, atol=1e-6)


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
    # terms of about 1.
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
            _donate({"t": x, "w": jnp.zeros(3)})
            np.testing.assert_allclose(np.asarray(g(v)), data + 1, rtol=1e-6)
        # A wrapper made afresh each step, as in a loop that builds its step function: JAX's
        # caches of the function are shared with the last one's.
        out = frozenconst.jit(bystander)(v)
        np.testing.assert_allclose(np.asarray(out), 2 + np.asarray(other), rtol=1e-6)
        assert traces["bystander"] <= 2
    assert traces["inner"] <= 2, traces  # once more at most, where the caches were cleared
    assert traces["g"] <= 2, traces
    # The buffers made again hold no more than the first: the table of buffers' owners keeps no
    # entry per buffer ever made, so a donation each step grows nothing.
    assert refs[-1] <= refs[2], refs


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.filterwarnings("ignore::frozenconst.FrozenConstWarning")  # each donation is said once
def test_two_threads_donating_the_constant_to_a_donating_step_never_see_its_buffer_deleted():
    # No call may raise "Buffer has been deleted or donated" from frozenconst's own code (a copy
    # made of a buffer the other thread had just donated, a refeed that gave up). Each use of a
    # constant gets a buffer made for it; a call refused for one that another thread donated
    # since is fed afresh and made again.
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
