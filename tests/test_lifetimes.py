"""Nothing kept alive after the user drops it; each call fed exactly its executable's constants.

Observed through JAX (`jax.live_arrays()`, traced programs), weak references and
the bytes the process's heap holds (glibc's `mallinfo2`), each against `jax.jit` doing the
same in the same test.
"""

import gc
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    JAX_EMBED_MAX_BYTES,
    SIMPLIFIED,
    assert_float32_close,
    live_copies,
    on_device,
    program_parameters,
    run_bounded,
    subprocess_env,
    unique_data,
)

import frozenconst
from frozenconst import FrozenConst

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Holder:
    """A static argument that holds a constant (hashed by identity, as `jax.jit` allows)."""

    def __init__(self, c):
        self.c = c


WRAPS = [pytest.param(jax.jit, id="jax.jit"), pytest.param(frozenconst.jit, id="frozenconst.jit")]


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.xfail(
    jax.__version_info__ < (0, 9),
    reason="jax < 0.9 (seen on 0.6.2 and 0.8.3): jax.clear_caches() keeps jax.jit's static arguments",
    strict=True,
)
def test_constant_reached_through_a_static_argument_is_freed_with_it(wrap):
    data = unique_data((64, 32))
    f = wrap(lambda h, w: h.c @ w, static_argnums=0)
    h = Holder(FrozenConst(data))
    alive = weakref.ref(h.c)
    f(h, jnp.ones(32)).block_until_ready()
    assert live_copies(data) == 1
    del h
    jax.clear_caches()
    gc.collect()
    assert alive() is None
    assert live_copies(data) == 0
    np.testing.assert_array_equal(
        np.asarray(f(Holder(FrozenConst(np.eye(4, dtype=np.float32))), jnp.ones(4))), 1
    )


@pytest.mark.parametrize("wrap", WRAPS)
def test_pytree_arguments_and_closures_of_dropped_functions_are_freed(wrap):
    arg_data, closed_data = unique_data((16, 8)), unique_data((8, 8))

    def use():
        closed = FrozenConst(closed_data)
        tree = {"table": FrozenConst(arg_data), "scale": jnp.float32(2)}
        f = wrap(lambda t, w: (t["table"] @ (closed @ w)) * t["scale"])
        out = f(tree, jnp.ones(8))
        expected = on_device(arg_data) @ (on_device(closed_data) @ np.ones(8, np.float32)) * 2
        assert_float32_close(out, expected, np.abs(arg_data) @ (np.abs(closed_data) @ np.ones(8)) * 2)
        return weakref.ref(tree["table"]), weakref.ref(closed)

    refs = use()
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert live_copies(arg_data) == 0 and live_copies(closed_data) == 0


@pytest.mark.parametrize("wrap", WRAPS)
def test_each_call_is_fed_only_the_constants_its_executable_takes(wrap):
    # 30 static configurations, each reaching a constant of its own: the program
    # of one configuration takes that constant and the argument, nothing more,
    # exactly as `jax.jit` with the constant passed as an argument, and no program is
    # handed another configuration's constant.
    kwargs = {"embed_max_bytes": 0} if wrap is frozenconst.jit else {}
    f = wrap(lambda h, w: h.c @ w, static_argnums=0, **kwargs)
    holders = [Holder(FrozenConst(unique_data((32, 64)))) for _ in range(30)]  # 8 KiB: parameters
    w = jnp.ones(64)
    for h in holders:
        f(h, w).block_until_ready()
    baseline = jax.jit(lambda c, w: c @ w).lower(holders[0].c, w)
    for h in (holders[0], holders[-1]):
        assert program_parameters(f.lower(h, w)) == program_parameters(baseline) == 2
    for h in (holders[7], holders[0], holders[29]):
        assert_float32_close(f(h, w), on_device(h.c) @ np.ones(64), np.abs(np.asarray(h.c)).sum(1))


def test_static_arguments_by_name_and_by_position_share_their_constants():
    c = FrozenConst(unique_data((40, 8)))
    d = FrozenConst(unique_data((40, 8)))
    f = frozenconst.jit(lambda w, table: table.c @ w, static_argnames="table", embed_max_bytes=0)
    w = jnp.ones(8)
    hc, hd = Holder(c), Holder(d)
    for h in (hc, hd):
        assert_float32_close(f(w, table=h), on_device(h.c) @ np.ones(8), np.abs(np.asarray(h.c)).sum(1))
        assert_float32_close(f(w, h), on_device(h.c) @ np.ones(8), np.abs(np.asarray(h.c)).sum(1))
        hoisted = not SIMPLIFIED or c.nbytes > JAX_EMBED_MAX_BYTES  # JAX's own, simplified
        assert program_parameters(f.lower(w, h)) == 1 + hoisted
        assert program_parameters(f.lower(w, table=h)) == 1 + hoisted


def test_unhashable_static_argument_raises_jax_jits_own_error():
    f = frozenconst.jit(lambda h, w: w, static_argnums=0)
    with pytest.raises((TypeError, ValueError), match="hash"):
        f([1, 2], jnp.ones(2))


def _buffers_at(pointer):
    gc.collect()
    return sum(
        1
        for a in jax.live_arrays()
        if not a.is_deleted() and any(s.data.unsafe_buffer_pointer() == pointer for s in a.addressable_shards)
    )


@pytest.mark.host_memory
def test_evict_leaves_no_array_on_the_evicted_buffer_and_accounting_true():
    data = unique_data((64, 64))
    x = FrozenConst(data)
    f = frozenconst.jit(lambda w: x @ w)
    g = frozenconst.jit(lambda w: jnp.sum(x * w[0]))
    w = jnp.ones(64)
    for _ in range(3):  # the second and third calls reuse what the first fed
        f(w).block_until_ready()
        g(w).block_until_ready()
    pointer = jnp.asarray(x).unsafe_buffer_pointer()
    assert _buffers_at(pointer) >= 1
    # Another test's garbage, collected mid-way, would change the figure; so would constants
    # that only JAX's caches still hold, freed when the eviction clears them.
    jax.clear_caches()
    f(w).block_until_ready()
    g(w).block_until_ready()
    gc.collect()
    device_before = frozenconst.stats().device_bytes
    x.evict()  # the programs holding the buffer go with JAX's caches
    assert _buffers_at(pointer) == 0
    assert x.placements == ()
    assert x.stats().device_bytes == {}
    after = frozenconst.stats().device_bytes
    (device,) = jax.local_devices()[:1]
    assert device_before.get(device, 0) - after.get(device, 0) == data.nbytes
    # The next use transfers once, and every function is fed the new buffer.
    transfers = x.stats().transfers
    assert_float32_close(f(w), on_device(data) @ np.ones(64), np.abs(data).sum(1))
    g(w).block_until_ready()
    assert x.stats().transfers == transfers + 1
    assert live_copies(data) == 1


def test_constant_built_inside_the_function_belongs_to_that_trace():
    traces = []
    made = []

    def f(w):
        traces.append(1)
        c = FrozenConst(np.arange(4.0, dtype=np.float32))
        made.append(weakref.ref(c))
        return c * w

    jitted = frozenconst.jit(f)
    gc.collect()  # an earlier test's constants, garbage but not yet collected, are not this test's
    before = frozenconst.stats().live_constants
    np.testing.assert_array_equal(np.asarray(jitted(jnp.ones(4))), np.arange(4.0))
    np.testing.assert_array_equal(np.asarray(jitted(jnp.ones(4) * 2)), 2 * np.arange(4.0))
    assert len(traces) == 1  # no redo, no retrace
    gc.collect()
    assert all(r() is None for r in made)
    assert frozenconst.stats().live_constants == before
    # The same as jax.jit: one trace, the same result (a function of its own: JAX shares the
    # traces of one Python function between its jits).
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda w: f(w))(jnp.ones(4))), np.arange(4.0))
    assert len(traces) == 2


_TRACES = {
    "jax.eval_shape": lambda f, w: jax.eval_shape(f, w),
    "jax.jit(f).trace": lambda f, w: jax.jit(f).trace(w),
    "jax.make_jaxpr": lambda f, w: jax.make_jaxpr(f)(w),
}


@pytest.mark.parametrize("trace", sorted(_TRACES))
def test_after_a_trace_and_evict_the_next_program_takes_the_current_buffer(trace):
    # JAX keeps the trace of `f` (how flax and equinox build abstract models, `jax.eval_shape`)
    # with the buffer it met there; a later `jax.jit(f)` lowers that trace. After `evict` it must
    # take the constant's current buffer as a parameter, and the evicted buffer must be gone.
    data = unique_data((128, 128))
    table = FrozenConst(data)
    w = jnp.ones(128)

    def f(v):
        return jnp.tanh(table @ v)

    as_argument = jax.jit(lambda t, v: jnp.tanh(t @ v))
    array = on_device(data)
    expected = np.asarray(as_argument(array, w))
    argument_form = len(as_argument.lower(array, w).as_text())
    del array
    _TRACES[trace](f, w)
    evicted = weakref.ref(jnp.asarray(table))
    table.evict()
    assert len(jax.jit(f).lower(w).as_text()) <= 1.1 * argument_form  # none of the data
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(w)), expected)
    gc.collect()
    # The evicted buffer went with JAX's trace (on the CPU the current one may alias the same
    # host memory: the array object is what tells them apart), and the program holds the current.
    assert evicted() is None
    assert live_copies(data) == 1


@pytest.mark.parametrize("make", ["frozenconst.intern", "FrozenConst"])
def test_a_constant_made_inside_the_jitted_function_is_a_parameter(make):
    # The constant dies when the trace ends, before JAX lowers the trace: the program takes its
    # buffer as a parameter all the same, as it would the buffer of a constant that lives on.
    data = unique_data((128, 128))
    build = frozenconst.intern if make == "frozenconst.intern" else FrozenConst
    w = jnp.ones(128)

    def f(v):
        return jnp.tanh(build(data) @ v)

    as_argument = jax.jit(lambda t, v: jnp.tanh(t @ v))
    array = on_device(data)
    expected = np.asarray(as_argument(array, w))
    argument_form = len(as_argument.lower(array, w).as_text())
    del array
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: nothing is embedded
        assert len(jax.jit(f).lower(w).as_text()) <= 1.1 * argument_form
        jitted = jax.jit(f)
        np.testing.assert_array_equal(np.asarray(jitted(w)), expected)
        np.testing.assert_array_equal(np.asarray(jitted(w)), expected)  # the cached program
        # The audit says so too: a FrozenConst, a parameter.
        (found,) = frozenconst.audit(f, w).constants
        assert (found.kind, found.parameter) == ("frozenconst", True)
    assert live_copies(data) == 1  # held by the program, as its parameter
    del jitted
    jax.clear_caches()
    assert live_copies(data) == 0  # and gone with it


def test_a_nested_use_costs_no_trace_more_than_jax_jit():
    c = FrozenConst(unique_data((24, 24)) / 24)  # 2.25 KiB: above JAX's own threshold too
    traces = []

    def f(w):
        traces.append(w.shape)
        return jax.lax.scan(lambda carry, _: (c @ carry, None), w, None, length=2)[0]

    jitted = frozenconst.jit(f, embed_max_bytes=0)
    for n in (1, 2):
        w = jnp.ones((24, n))
        a = np.asarray(c)
        expected = on_device(a) @ (on_device(a) @ np.ones((24, n)))
        assert_float32_close(jitted(w), expected, np.abs(a) @ (np.abs(a) @ np.ones((24, n))))
    assert traces == [(24, 1), (24, 2)]  # one trace per program, as jax.jit
    # No constant data in the program: the size of the one taking `c` as an argument.
    as_argument = jax.jit(lambda c, w: jax.lax.scan(lambda carry, _: (c @ carry, None), w, None, length=2)[0])
    w = jnp.ones((24, 3))
    assert len(jitted.lower(w).as_text()) <= 1.1 * len(as_argument.lower(jnp.asarray(c), w).as_text())


@pytest.mark.parametrize("nested", ["jit", "scan"])
def test_lowering_leaves_no_error_in_a_reference_cycle(nested):
    # Lowering a program must not leave an error in a frame its traceback holds (frozenconst's
    # lowering tries, and falls back where JAX refuses): such a cycle keeps the program's
    # traces alive until Python's collector runs.
    import types

    t, o = FrozenConst(unique_data((64,))), FrozenConst(unique_data((64,)))

    def inner(get, x):
        if nested == "jit":
            return jax.jit(lambda y: jnp.sum(get() * y))(x)
        return jax.lax.scan(lambda c, _: (c + jnp.sum(get() * x), None), 0.0, None, length=2)[0]

    def make():
        return frozenconst.jit(lambda x: inner(lambda: t * 0.5 + o * 0.5, x), embed_max_bytes=0)

    x = jnp.ones(64)
    make().lower(x)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        make().lower(x)
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    # What holds a redone trace: an exception in a local of one of frozenconst's frames (its
    # traceback holds that frame). JAX 0.6.2's `reraise_with_filtered_traceback` keeps a
    # traceback chain of its own in a cycle (frames, no exception): JAX's, not looked at here.
    holding = [
        f"{g.f_code.co_name}: {name}"
        for g in garbage
        if isinstance(g, types.FrameType) and os.sep + "frozenconst" + os.sep in g.f_code.co_filename
        for name, value in g.f_locals.items()
        if isinstance(value, BaseException)
    ]
    errors = [type(g).__name__ for g in garbage if isinstance(g, BaseException)]
    assert holding == [] and errors == [], (holding, errors)


# Functions made, compiled, called and dropped, in a fresh process: the heap growth of
# `jax.jit` over a `jax.Array`, and over a FrozenConst (a parameter of its program, rewritten
# at lowering), each after a warm-up round. The heap is counted byte for byte
# (`memory_churn_worker.heap`, under PYTHONMALLOC=malloc).
_GROWTH = textwrap.dedent(
    """
    import gc, sys
    import jax, jax.numpy as jnp, numpy as np
    import frozenconst
    from frozenconst import FrozenConst
    sys.path.insert(0, "tests")
    from memory_churn_worker import heap

    data = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    w = jnp.ones(64)

    def growth(wrap, table, n):
        # The least of the rounds after a warm-up one: a one-time growth (a table of JAX's
        # doubling its size) lands in one round, what each function keeps in all.
        grown = []
        for _ in range(3):
            start = heap()
            for _ in range(n):
                f = wrap(lambda w: jnp.tanh(table @ w) + jnp.sin(w) * 2)
                f(w).block_until_ready()
                del f
            gc.collect()
            grown.append(heap() - start)
        return min(grown[1:])

    n = int(sys.argv[1])
    print("array", growth(jax.jit, jnp.asarray(data), n))
    print("frozen", growth(jax.jit, FrozenConst(data), n))
    print("frozenconst", growth(frozenconst.jit, FrozenConst(data), n))
    """
)


@pytest.mark.subprocess
@pytest.mark.slow
def test_functions_made_and_dropped_leave_memory_flat_as_jax_jit():
    proc = subprocess.run(
        [sys.executable, "-c", _GROWTH, "100"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**subprocess_env("cpu"), "PYTHONMALLOC": "malloc"},  # host memory: the heap
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    growth = {name: int(value) for name, value in (line.split() for line in proc.stdout.split("\n") if line)}
    # Within 2x of jax.jit over a jax.Array (whose growth moves by a few hundred bytes a
    # function from run to run: one under 256 bytes a function counts as 256).
    floor = max(growth["array"], 256 * 100)
    assert growth["frozen"] <= 2 * floor, growth
    assert growth["frozenconst"] <= 2 * floor, growth


def _churn(count, devices, forms, timeout=600):
    """{form: (jax.jit bytes, frozenconst.jit bytes)} of heap grown per function made, lowered and
    dropped, both measured in one fresh process (`memory_churn_worker.py`)."""
    worker = pathlib.Path(__file__).resolve().parent / "memory_churn_worker.py"
    cmd = [sys.executable, str(worker), str(count), str(devices), *forms]
    code, out = run_bounded(cmd, timeout, env=subprocess_env("cpu"))  # host memory, CPU devices
    assert code == 0, out[-4000:]
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("GROWTH ")]
    return {form: (float(plain), float(ours)) for _, form, plain, ours in lines}


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("form", ["closure-scan", "closure-jit"])
def test_functions_using_a_constant_in_a_nested_trace_grow_memory_as_jax_jit(form):
    # The worker measures jax.jit over a jax.Array and over the constant in one process, the heap
    # byte for byte; run to run, jax.jit's growth over 100 functions moves by a few hundred bytes
    # per function, so a growth under 256 bytes counts as 256.
    plain, ours = _churn(100, 1, [form])[form]
    assert ours <= 2 * max(plain, 256.0), (plain, ours)


# Constants reached only by tracing (an attribute of the callable, a dict entry), used in nested
# traces (`attributes`: two tables). Over 60 functions the heap's growth moves by up to about
# 250 bytes per function from run to run (jax 0.10.2), so a jax.jit growth under 512 bytes counts
# as 512.
_LATE_FORMS = [
    pytest.param(["attribute-scan", "dict-grad", "dict-cond"], id="scan-grad-cond"),
    pytest.param(["attributes-jit"], id="inner-jit"),
]


@pytest.mark.subprocess
@pytest.mark.parametrize("forms", _LATE_FORMS)
def test_functions_meeting_their_constant_late_in_a_nested_trace_grow_memory_as_jax_jit(forms):
    growth = _churn(60, 1, forms)
    assert sorted(growth) == sorted(forms), growth
    for form, (plain, ours) in growth.items():
        assert ours <= 2 * max(plain, 512.0), (form, growth)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "forms",
    [
        pytest.param(["attribute-scan"], id="scan"),
        pytest.param(["attributes-jit"], id="inner-jit"),
    ],
)
def test_on_two_devices_functions_meeting_their_constant_late_grow_memory_as_jax_jit(forms):
    # Two devices: the constant without a declared sharding, its program's parameter on either.
    growth = _churn(60, 2, forms)
    assert sorted(growth) == sorted(forms), growth
    for form, (plain, ours) in growth.items():
        assert ours <= 2 * max(plain, 512.0), (form, growth)


# A training loop that donates a state holding a constant, beside a frozenconst.jit function
# closing over it (`donation_loop_worker.py`), measured in one process against the same loop with
# a jax.Array, the heap byte for byte; over 150 steps the jax.Array loop's growth moves by up to
# about 300 bytes a step from run to run (jax 0.10.2), so one under 256 counts as 256.
@pytest.mark.subprocess
@pytest.mark.parametrize("devices", [1, 2])
def test_a_loop_donating_a_constant_each_step_grows_memory_as_one_donating_a_jax_array(devices):
    worker = pathlib.Path(__file__).resolve().parent / "donation_loop_worker.py"
    cmd = [sys.executable, str(worker), "150", str(devices), "donate", "delete"]
    code, out = run_bounded(cmd, 300, env=subprocess_env("cpu"))  # host memory, CPU devices
    assert code == 0, out[-4000:]
    rows = [line.split() for line in out.splitlines() if line.startswith(("STEPS ", "TRACES "))]
    growth = {loop: (float(plain), float(ours)) for kind, loop, plain, ours in rows if kind == "STEPS"}
    traces = {loop: (int(g), int(h)) for kind, loop, g, h in rows if kind == "TRACES"}
    assert sorted(growth) == sorted(traces) == ["delete", "donate"], out[-4000:]
    for loop, (plain, ours) in growth.items():
        assert ours <= 2 * max(plain, 256.0), (loop, growth)
    for loop, (g, h) in traces.items():
        # `g` traced again once at most after the first loss, `h` at most once: where a program
        # held the lost buffer, JAX's caches are cleared once.
        assert g <= 2 and h <= 1, (loop, traces)
