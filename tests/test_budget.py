"""A device-memory budget (`frozenconst.set_device_budget`, `device_budget`): least recently
used constants evicted to make room, never one in use, and what it costs compiled programs.

Observed through JAX: `jax.live_arrays()` (a constant's device copies, `live_copies`), the
values programs compute, and `memory_stats()` where the backend keeps it (the CPU's does not).
The budget is per device and process-wide, so each test starts from a cache that holds nothing
(`_empty_cache`) and leaves no budget behind.
"""

import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import live_copies, unique_data

import frozenconst
from benchmarks._harness import compiles  # JAX's compiles, counted as `benchmarks residency` counts them
from frozenconst import FrozenConst, FrozenConstRuntimeError, FrozenConstTypeError, FrozenConstValueError

# Nothing public lists every live constant: the fixture empties their caches through the
# cache's own list, so that a budget counts only what a test makes.
from frozenconst._cache import STATE

N = 2048  # float32 elements: 8 KiB per constant, above `embed_max_bytes` (a parameter)
KIB8 = 4 * N


@pytest.fixture(autouse=True)
def _empty_cache():
    gc.collect()
    for store in list(STATE.live):
        store.evict()
    yield
    frozenconst.set_device_budget(None)


def _constants(n, shape=(N,)):
    data = [unique_data(shape) for _ in range(n)]
    return data, [FrozenConst(d) for d in data]


def _on_device(constants):
    """Which constants hold a device buffer now, as JAX sees it."""
    return [live_copies(np.asarray(x)) == 1 for x in constants]


def _use(x):
    jnp.sum(x).block_until_ready()


# -- the order ------------------------------------------------------------------------


@pytest.mark.host_memory
def test_the_least_recently_used_constant_is_evicted_first():
    _, (a, b, c, d) = _constants(4)
    frozenconst.set_device_budget(3 * KIB8)
    for x in (a, b, c):
        _use(x)
    assert _on_device([a, b, c, d]) == [True, True, True, False]
    _use(a)  # b is now the least recently used
    _use(d)
    assert _on_device([a, b, c, d]) == [True, False, True, True]
    _use(b)  # transferred again, evicting c
    assert _on_device([a, b, c, d]) == [True, True, False, True]
    assert (b.stats().evictions, b.stats().retransfers, c.stats().evictions) == (1, 1, 1)
    assert (a.stats().evictions, d.stats().evictions) == (0, 0)


def test_the_values_are_the_constants_own_after_any_number_of_evictions():
    data, constants = _constants(5)
    frozenconst.set_device_budget(2 * KIB8)
    w = jnp.arange(N, dtype=jnp.float32)
    for _ in range(3):
        for d, x in zip(data, constants, strict=True):
            np.testing.assert_array_equal(np.asarray(x @ w), np.asarray(jnp.asarray(d) @ w))
    assert sum(_on_device(constants)) == 2


def test_stats_count_evictions_retransfers_and_hits():
    _, (a, b) = _constants(2)
    before = frozenconst.stats()
    frozenconst.set_device_budget(KIB8)
    _use(a)
    _use(a)  # a hit
    _use(b)  # evicts a
    _use(a)  # a re-transfer, evicting b
    after = frozenconst.stats()
    assert after.evictions - before.evictions == 2
    assert after.retransfers - before.retransfers == 1
    assert after.transfers - before.transfers == 3
    assert after.hits - before.hits >= 1
    assert a.stats().retransfers == 1 and a.stats().evictions == 1 and b.stats().evictions == 1
    # JAX agrees: one of the two on the device, the other's buffer gone.
    assert _on_device([a, b]) == [True, False]
    assert sum(after.device_bytes.values()) <= KIB8


def test_setting_a_smaller_budget_evicts_at_once_and_none_lifts_it():
    _, constants = _constants(4)
    for x in constants:
        _use(x)
    assert sum(_on_device(constants)) == 4
    frozenconst.set_device_budget(2 * KIB8)
    assert _on_device(constants) == [False, False, True, True]
    frozenconst.set_device_budget(None)
    for x in constants:
        _use(x)
    assert sum(_on_device(constants)) == 4


def test_a_with_block_sets_a_budget_and_restores_the_one_before():
    _, (a, b, c) = _constants(3)
    frozenconst.set_device_budget(2 * KIB8)
    with frozenconst.device_budget(KIB8):
        _use(a)
        _use(b)
        assert _on_device([a, b]) == [False, True]
    _use(a)
    _use(c)  # the budget of two again: b, the least recently used, goes
    assert _on_device([a, b, c]) == [True, False, True]
    frozenconst.set_device_budget(None)
    with frozenconst.device_budget(KIB8):
        _use(a)
    _use(b)
    _use(c)
    assert sum(_on_device([a, b, c])) == 3  # no budget after the block


# -- never what is in use ---------------------------------------------------------------


def test_a_buffer_held_elsewhere_is_never_evicted_and_the_next_one_goes():
    _, (a, b, c) = _constants(3)
    frozenconst.set_device_budget(2 * KIB8)
    _use(a)
    held = jnp.asarray(a)  # the user's own reference: a stays on the device whatever we do
    _use(b)
    _use(c)  # a is the least recently used, but in use: b goes
    assert _on_device([a, b, c]) == [True, False, True]
    assert held is jnp.asarray(a)  # still the cached buffer, not a second copy
    assert a.stats().evictions == 0


def test_constants_in_use_that_leave_no_room_raise_naming_the_sizes():
    _, (a, b, c) = _constants(3)
    frozenconst.set_device_budget(2 * KIB8)
    held = [jnp.asarray(a), jnp.asarray(b)]
    with pytest.raises(
        FrozenConstRuntimeError, match=r"needs 8\.0 KiB.*budget of 16\.0 KiB.*16\.0 KiB of constants in use"
    ):
        _use(c)
    assert _on_device([a, b, c]) == [True, True, False]
    del held
    _use(c)  # room once they are let go
    assert _on_device([a, b, c]).count(True) == 2


def test_a_program_needing_more_than_the_budget_raises_and_never_evicts_its_own_constants():
    _, constants = _constants(3)
    frozenconst.set_device_budget(2 * KIB8)
    f = jax.jit(lambda v: v + sum(constants))
    with pytest.raises(FrozenConstRuntimeError, match="held by the program being traced"):
        f(jnp.zeros(N))
    frozenconst.set_device_budget(3 * KIB8)
    np.testing.assert_allclose(np.asarray(f(jnp.zeros(N))), sum(np.asarray(x) for x in constants), rtol=1e-6)


def test_evicting_right_after_an_enqueued_program_leaves_its_result_right():
    data, (a, b) = _constants(2, shape=(256, 256))
    frozenconst.set_device_budget(256 * 256 * 4)
    f = jax.jit(lambda v: jnp.tanh(v @ a) @ a)
    v = jnp.ones((64, 256))
    want = np.asarray(jnp.tanh(v @ jnp.asarray(data[0])) @ jnp.asarray(data[0]))
    outs = [f(v) for _ in range(4)]  # enqueued, not waited for
    _use(b)  # evicts a (and drops f's program) while they may still run
    for out in outs:
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    assert _on_device([a, b]) == [False, True]


def test_threads_using_constants_under_a_budget_never_exceed_it():
    data, constants = _constants(6)
    frozenconst.set_device_budget(3 * KIB8)
    # What plain JAX computes from the same data: a sum of numbers that nearly cancel has no
    # useful relative tolerance against NumPy's summation order, and needs none against JAX's.
    wants = [float(jnp.sum(jnp.asarray(d))) for d in data]
    errors = []

    def work(k):
        try:
            for i in range(20):
                j = (k + i) % len(constants)
                assert float(jnp.sum(constants[j])) == wants[j]
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(frozenconst.stats().device_bytes.values()) <= 3 * KIB8


# -- compiled programs ------------------------------------------------------------------


def test_a_program_holding_an_evicted_constant_is_compiled_again_with_the_right_values():
    data, (a, b) = _constants(2)
    frozenconst.set_device_budget(KIB8)
    f = jax.jit(lambda v: v * a)
    g = jax.jit(lambda v: v * b)
    v = jnp.full(N, 2.0, jnp.float32)
    np.testing.assert_array_equal(np.asarray(f(v)), 2 * data[0])
    np.testing.assert_array_equal(np.asarray(g(v)), 2 * data[1])  # evicts a, held by f's program
    assert live_copies(data[0]) == 0  # gone from the device: f's program let go of it
    np.testing.assert_array_equal(np.asarray(f(v)), 2 * data[0])  # compiled again, a transferred again
    assert a.stats().retransfers == 1 and live_copies(data[1]) == 0
    # The program text is the one without a budget: the constant a parameter, not embedded.
    text = f.lower(v).as_text()
    frozenconst.set_device_budget(None)
    assert f.lower(v).as_text() == text


def test_a_trace_evicting_a_compiled_programs_constant_leaves_both_right():
    data, (a, b, c) = _constants(3)
    frozenconst.set_device_budget(2 * KIB8)
    f = jax.jit(lambda v: v + a + b)
    v = jnp.zeros(N)
    np.testing.assert_allclose(np.asarray(f(v)), data[0] + data[1], rtol=1e-6)
    # Tracing g needs room for c: a and b, held by f's program, are the least recently used.
    g = jax.jit(lambda v: v + c)
    np.testing.assert_array_equal(np.asarray(g(v)), data[2])
    np.testing.assert_allclose(np.asarray(f(v)), data[0] + data[1], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(g(v)), data[2])


MODEL_BYTES = 2 * 32 * 64 * 4  # one model's two float32 tables


def _models(jit):
    """Three models of two (32, 64) constants each, `model0` to `model2`, wrapped in `jit`
    (`"jax.jit"` or `"frozenconst.jit"`), each with the data of its constants and what it must
    compute from `v`.

    The wanted results come from the argument form, jitted: the program each model's is (its
    constants are parameters), so rounding does not depend on the data drawn, as it does
    against eager, unfused arithmetic."""
    wrap = jax.jit if jit == "jax.jit" else frozenconst.jit
    argument_form = jax.jit(lambda v, a, b: jnp.tanh(v @ a) @ b.T)
    v = jnp.ones((4, 32))
    models = []
    for k in range(3):
        data, cs = _constants(2, shape=(32, 64))

        def model(v, cs=cs):
            return jnp.tanh(v @ cs[0]) @ cs[1].T

        model.__name__ = model.__qualname__ = f"model{k}"  # the program's name, `jit(model0)`
        want = np.asarray(argument_form(v, jnp.asarray(data[0]), jnp.asarray(data[1])))
        models.append((data, wrap(model), want))
    return v, models


@pytest.mark.parametrize("jit", ["jax.jit", "frozenconst.jit"])
def test_a_loop_over_models_bigger_than_the_budget_runs_within_it(jit):
    v, models = _models(jit)
    frozenconst.set_device_budget(MODEL_BYTES)
    before = frozenconst.stats()
    for _ in range(3):
        for data, model, want in models:
            np.testing.assert_allclose(np.asarray(model(v)), want, rtol=1e-5, atol=1e-6)
            assert sum(frozenconst.stats().device_bytes.values()) <= MODEL_BYTES
            # JAX agrees: of the six tables, the two of the model just run are on the device.
            on_device = [live_copies(d) for data, _, _ in models for d in data]
            assert sum(on_device) == 2 and live_copies(data[0]) == live_copies(data[1]) == 1
    after = frozenconst.stats()
    assert after.retransfers - before.retransfers == 2 * 3 * 2  # each model's two, every round but the first


@pytest.mark.parametrize("jit", ["jax.jit", "frozenconst.jit"])
def test_a_switch_compiles_again_only_the_model_whose_constants_were_evicted(jit):
    v, models = _models(jit)

    def unrelated(v):
        return jnp.sin(v) * 2.0

    unrelated = jax.jit(unrelated)
    frozenconst.set_device_budget(MODEL_BYTES)
    unrelated_want = np.asarray(unrelated(v))
    for _, model, _ in models:
        model(v).block_until_ready()
    with compiles() as compiled:
        for _ in range(2):
            for _, model, want in models:
                np.testing.assert_allclose(np.asarray(model(v)), want, rtol=1e-5, atol=1e-6)
                np.testing.assert_array_equal(np.asarray(unrelated(v)), unrelated_want)
    # Each call after a switch compiles its model again (its tables were evicted); nothing else
    # compiles: not the function that holds no constant, not the budget's own work.
    assert dict(compiled) == {f"jit(model{k})": 2 for k in range(3)}


def test_where_jax_lacks_the_names_an_eviction_clears_every_cache(monkeypatch):
    # The fallback of `_compat_lowering.jit_entry`: no jitted function found, every program dropped.
    from frozenconst import _compat_lowering

    monkeypatch.setattr(_compat_lowering, "_JIT", None)
    data, (a, b) = _constants(2)
    frozenconst.set_device_budget(KIB8)
    f = jax.jit(lambda v: v * a)
    unrelated = jax.jit(lambda v: v - 1.0)
    v = jnp.full(N, 2.0, jnp.float32)
    np.testing.assert_array_equal(np.asarray(f(v)), 2 * data[0])
    unrelated(v).block_until_ready()
    with compiles() as compiled:
        _use(b)  # evicts a, held by f's program
        unrelated(v).block_until_ready()
    assert compiled["jit(<lambda>)"] == 1
    assert live_copies(data[0]) == 0
    np.testing.assert_array_equal(np.asarray(f(v)), 2 * data[0])


def test_an_inner_jit_holding_an_evicted_constant_lets_go_of_it_too():
    # The outer program's trace reuses the inner function's, which holds the constant: frozenconst
    # cannot name that trace's function, so every cache is cleared (`_hoist.dropped`).
    data, (a, b) = _constants(2)
    frozenconst.set_device_budget(KIB8)
    inner = jax.jit(lambda v: v * a)
    outer = jax.jit(lambda v: inner(v) + 1.0)
    v = jnp.full(N, 2.0, jnp.float32)
    np.testing.assert_array_equal(np.asarray(outer(v)), 2 * data[0] + 1)
    _use(b)  # evicts a, held by both programs
    assert live_copies(data[0]) == 0
    np.testing.assert_array_equal(np.asarray(outer(v)), 2 * data[0] + 1)
    np.testing.assert_array_equal(np.asarray(inner(v)), 2 * data[0])


# -- refusals ---------------------------------------------------------------------------


def test_a_constant_bigger_than_the_whole_budget_is_refused_naming_both_sizes():
    big = FrozenConst(unique_data((2 * N,)))
    frozenconst.set_device_budget(KIB8)
    with pytest.raises(
        FrozenConstValueError,
        match=r"needs 16\.0 KiB on .*more than the whole device budget of 8\.0 KiB.*residency=\"host\"",
    ):
        _use(big)
    assert live_copies(np.asarray(big)) == 0
    resident = FrozenConst(big, residency="host")  # what the message offers: never on the device
    assert float(jnp.sum(resident)) == float(jnp.sum(jnp.asarray(np.asarray(big))))


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (0, FrozenConstValueError, "positive number of bytes, but received 0"),
        (-5, FrozenConstValueError, "received -5"),
        (1.5, FrozenConstValueError, r"in \(0, 1\], but received 1\.5"),
        (0.0, FrozenConstValueError, r"received 0\.0"),
        (True, FrozenConstTypeError, "received a `bool`"),
        ("1GiB", FrozenConstTypeError, "received a `str`"),
    ],
)
def test_a_bad_budget_is_refused_by_name(bad, error, match):
    with pytest.raises(error, match=match):
        frozenconst.set_device_budget(bad)
    with pytest.raises(error, match=match), frozenconst.device_budget(bad):
        pass  # pragma: no cover


def test_a_fraction_is_refused_where_devices_do_not_report_their_memory():
    if not all(
        d.memory_stats() is None or "bytes_limit" not in d.memory_stats() for d in jax.local_devices()
    ):
        frozenconst.set_device_budget(0.5)  # an accelerator: half of each device's memory
        frozenconst.set_device_budget(None)
        return
    with pytest.raises(FrozenConstValueError, match=r"do not report.*'bytes_limit'.*in bytes"):
        frozenconst.set_device_budget(0.5)


def test_numpy_integers_are_bytes():
    _, (a, b) = _constants(2)
    frozenconst.set_device_budget(np.int64(KIB8))
    _use(a)
    _use(b)
    assert _on_device([a, b]) == [False, True]


# -- no budget: nothing changes -----------------------------------------------------------


def test_without_a_budget_uses_are_served_from_the_cache_slot_again():
    # The hit path frozenconst promises not to touch while no budget is set: a use is served
    # from the constant's one slot, which a budget empties (every use then comes to the
    # budget's accounting) and which its lifting fills again at the next use.
    _, (a,) = _constants(1)
    store = a._held()
    _use(a)
    assert store.hot is jnp.asarray(a)
    frozenconst.set_device_budget(4 * KIB8)
    assert store.hot is None
    _use(a)
    assert store.hot is None
    frozenconst.set_device_budget(None)
    _use(a)
    assert store.hot is jnp.asarray(a)


def test_a_buffer_deleted_behind_the_budgets_back_is_made_again_for_the_programs_holding_it():
    data, (a,) = _constants(1)
    frozenconst.set_device_budget(4 * KIB8)
    f = frozenconst.jit(lambda v: v * a, embed_max_bytes=0)
    v = jnp.full(N, 3.0, jnp.float32)
    np.testing.assert_array_equal(np.asarray(f(v)), 3 * data[0])
    jnp.asarray(a).delete()  # behind frozenconst's back: the program holds a deleted buffer
    with pytest.warns(frozenconst.FrozenConstWarning, match="was deleted"):
        np.testing.assert_array_equal(np.asarray(f(v)), 3 * data[0])
    assert live_copies(data[0]) >= 1
