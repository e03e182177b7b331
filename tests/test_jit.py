"""frozenconst.jit: every FrozenConst the function reaches becomes a parameter."""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    SIMPLIFIED,
    assert_float32_close,
    free_port,
    jax_passes,
    live_copies,
    on_device,
    program_parameters,
    run_bounded,
    subprocess_env,
    unique_data,
)

import frozenconst
from frozenconst import FrozenConst

# Which closed-over arrays JAX's simplified pipeline makes parameters changes with JAX's
# version: the expected parameter counts use the package's one statement of that rule.

GLOBAL_TABLE = FrozenConst(np.random.default_rng(7).standard_normal((256, 64)).astype(np.float32))


def _hlo_size(jitted, *args):
    return len(jitted.lower(*args).as_text())


def _layers(const, n):
    def f(w):
        return sum(jnp.sum(const @ w * i) for i in range(n))

    return f


@pytest.mark.parametrize("n_uses", [1, 10])
def test_program_holds_no_constant_data(n_uses):
    w = jnp.ones((64, 4))
    small = FrozenConst(unique_data((32, 64)))  # 8 KiB: above `embed_max_bytes` on every backend
    large = FrozenConst(unique_data((65536, 64)))  # 16 MiB
    small_hlo = _hlo_size(frozenconst.jit(_layers(small, n_uses)), w)
    large_hlo = _hlo_size(frozenconst.jit(_layers(large, n_uses)), w)
    # Shapes differ (4 vs 65536 rows), so the text differs by a few characters
    # per use, never by the 16 MiB of data.
    assert large_hlo <= 1.05 * small_hlo
    assert large_hlo * 100 < large.nbytes  # the data as HLO text would take about 4x its bytes

    # Within 1.05x of the same function with the constant passed explicitly
    # (default pipeline), or with its buffer closed over under jax.jit, which JAX
    # passes to the executable (simplified pipeline: what frozenconst.jit does there).
    def explicit(c, w):
        return _layers(c, n_uses)(w)

    if SIMPLIFIED:
        baseline = _hlo_size(jax.jit(_layers(jnp.asarray(large), n_uses)), w)
    else:
        baseline = _hlo_size(jax.jit(explicit), jnp.asarray(large), w)
    assert large_hlo <= 1.05 * baseline


@pytest.mark.host_memory
def test_results_identical_to_jax_jit():
    x = FrozenConst(unique_data((32, 16)))
    w = jnp.asarray(unique_data((16, 8)))

    def f(w):
        return jnp.tanh(x @ w) + x[0, :8] * 2

    np.testing.assert_array_equal(np.asarray(frozenconst.jit(f)(w)), np.asarray(jax.jit(f)(w)))


def test_reached_every_way_is_a_parameter():
    data = unique_data((128, 128))
    c = FrozenConst(data)

    class Holder:  # hashable by identity: usable as a static argument
        def __init__(self, table):
            self.table = table

    inner = jax.jit(lambda w: c @ w)

    def every_way(w, holder, tree):
        out = c @ w  # closure
        out += GLOBAL_TABLE[:128, :1].sum() * w  # module global
        out += holder.table @ w  # static field
        out += tree["t"] @ w  # nested in a pytree argument
        out += inner(w)  # nested jax.jit
        out += jax.lax.scan(lambda carry, _: (carry + c @ w, None), jnp.zeros_like(w), None, length=2)[0]
        out += jax.lax.cond(w[0] > 0, lambda: c @ w, lambda: -(c @ w))
        out += jax.grad(lambda v: jnp.sum(c @ v))(w)
        out += jax.vmap(lambda row: row @ w)(c)
        return out

    w = jnp.asarray(unique_data((128,)))
    f = frozenconst.jit(every_way, static_argnums=1)
    holder = Holder(c)
    got = f(w, holder, {"t": c})
    expected = jax.jit(every_way, static_argnums=1)(w, holder, {"t": c})
    # XLA may fuse and reassociate float32 sums differently when a constant is a
    # parameter rather than embedded; a wrong or missing constant would be off by O(1).
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-4, atol=1e-4)
    lowered = f.lower(w, holder, {"t": c})
    assert (
        len(lowered.as_text()) < c.nbytes
    )  # the 64 KiB of data, embedded, would take about 4x its bytes as text
    # `w`, the argument `tree["t"]`, and one parameter for each constant (`c`, however many
    # uses and ways; `GLOBAL_TABLE`).
    assert program_parameters(lowered) == 4
    assert live_copies(data) == 1


def test_nested_frozenconst_jit_stays_hoisted_even_when_traced_before():
    c = FrozenConst(unique_data((128, 128)))
    inner = frozenconst.jit(lambda w: c @ w)
    inner(jnp.ones(128))  # traced and cached eagerly first
    outer = frozenconst.jit(lambda w: inner(w) * 2)
    assert len(outer.lower(jnp.ones(128)).as_text()) * 4 < c.nbytes  # no 64 KiB of data (about 4x as text)
    ones = np.ones(128, np.float32)
    assert_float32_close(outer(jnp.ones(128)), on_device(c) @ ones * 2, np.abs(np.asarray(c)) @ ones * 2)


def test_nested_jax_jit_traced_before_is_hoisted_too():
    # JAX caches an inner jax.jit's trace by function and argument types; the
    # one made eagerly below holds the buffer. frozenconst.jit traces in a trace
    # context of its own, so the inner function is traced afresh there.
    c = FrozenConst(unique_data((128, 128)))
    inner = jax.jit(lambda w: c @ w)
    inner(jnp.ones(128))
    outer = frozenconst.jit(lambda w: inner(w) + 1)
    assert len(outer.lower(jnp.ones(128)).as_text()) * 4 < c.nbytes  # no 64 KiB of data (about 4x as text)
    ones = np.ones(128, np.float32)
    assert_float32_close(outer(jnp.ones(128)), on_device(c) @ ones + 1, np.abs(np.asarray(c)) @ ones + 1)


@pytest.mark.parametrize("embed_max_bytes", [0, 1 << 30], ids=["parameter", "captured"])
def test_a_users_error_from_a_nested_frozenconst_jit_is_raised_as_under_jax_jit(embed_max_bytes):
    # Inside another trace the arrays frozenconst.jit feeds are that trace's values: asking them
    # whether they were deleted (a donated buffer refuses a call with a RuntimeError or
    # ValueError) would turn the user's ValueError into a ConcretizationTypeError.
    c = FrozenConst(unique_data((256, 8)))

    def layer(x):
        if x.shape[-1] != 8:
            raise ValueError(f"expected 8 features, got {x.shape[-1]}")
        return c @ x

    for wrap in (jax.jit, functools.partial(frozenconst.jit, embed_max_bytes=embed_max_bytes)):
        inner = wrap(layer)
        outer = wrap(lambda x, inner=inner: inner(x) * 2)
        for f in (inner, outer):
            with pytest.raises(ValueError, match="expected 8 features, got 5") as raised:
                f(jnp.ones(5))
            assert type(raised.value) is ValueError
            assert raised.value.__cause__ is None and raised.value.__context__ is None


def test_a_generator_function_is_refused_when_wrapped_as_jax_jit_refuses_it():
    def steps(x):
        yield x + 1

    with pytest.raises(TypeError, match="generator function"):
        jax.jit(steps)
    for wrap in (frozenconst.jit, frozenconst.filter_jit, frozenconst.jit()):
        with pytest.raises(frozenconst.FrozenConstTypeError, match=r"generator function `.*steps`"):
            wrap(steps)


def test_inner_functions_traced_under_frozenconst_jit_never_leak_tracers():
    c = FrozenConst(unique_data((8, 8)))
    inner = jax.jit(lambda w: c @ w)
    body = lambda carry, _: (carry + c @ carry, None)  # a reused, module-style body
    w = jnp.ones(8)
    frozenconst.jit(lambda w: inner(w) + jax.lax.scan(body, w, None, length=2)[0])(w)
    # Later uses of the same inner functions, eager and under plain jax.jit.
    ones = np.ones(8, np.float32)
    expected, magnitude = on_device(c) @ ones, np.abs(np.asarray(c)) @ ones
    assert_float32_close(inner(w), expected, magnitude)
    assert_float32_close(jax.jit(lambda w: inner(w))(w), expected, magnitude)
    jax.lax.scan(body, w, None, length=2)[0].block_until_ready()
    frozenconst.jit(lambda w: inner(w) * 2)(w).block_until_ready()


@pytest.mark.host_memory
def test_one_device_copy_shared_by_every_function():
    data = unique_data((256, 256))
    c = FrozenConst(data)
    w = jnp.ones(256)
    fs = [frozenconst.jit(lambda w, k=k: (c @ w) * k) for k in range(4)]
    for f in fs:
        f(w).block_until_ready()
    eager = c @ w
    eager.block_until_ready()
    assert live_copies(data) == 1


def test_one_trace_makes_the_program_with_every_constant_a_parameter():
    traces = []
    c = FrozenConst(unique_data((40, 8)))  # above JAX's own threshold too (1 KiB from jax 0.12.1)

    @frozenconst.jit(embed_max_bytes=0)
    def f(w):
        traces.append(1)
        return GLOBAL_TABLE[:8, :40] @ (c @ w)

    f(jnp.ones(8))
    assert len(traces) == 1
    assert program_parameters(f.lower(jnp.ones(8))) == 3  # w, the global, the closure


def test_second_call_does_not_retrace():
    traces = []
    c = FrozenConst(unique_data((8, 8)))

    @frozenconst.jit
    def f(w):
        traces.append(1)
        return c @ w

    def executables():
        # JAX's own count of the executables it keeps for the wrapped function.
        return f._jitted._cache_size()

    f(jnp.ones(8))
    n, size = len(traces), executables()
    assert size == 1
    f(jnp.ones(8))
    f(jnp.zeros(8))
    assert len(traces) == n
    assert executables() == size


def test_constant_discovered_late_gives_correct_results():
    a = FrozenConst(np.full(4, 1.0, np.float32))
    # Held in a dict, so not visible before tracing: found by the trace that reaches it.
    tables = {"b": FrozenConst(np.full(4, 10.0, np.float32))}

    @frozenconst.jit(embed_max_bytes=0)
    def f(w):
        return a * w if w.shape[0] == 4 and w.ndim == 1 else (tables["b"] * w[0]).sum() + a.sum()

    np.testing.assert_array_equal(np.asarray(f(jnp.ones(4))), np.ones(4))
    np.testing.assert_array_equal(np.asarray(f(jnp.ones((1, 4)))), 44.0)  # b first reached here
    np.testing.assert_array_equal(np.asarray(f(jnp.full(4, 2.0))), np.full(4, 2.0))
    hoisted = not SIMPLIFIED or jax_passes(a)
    assert program_parameters(f.lower(jnp.ones(4))) == 1 + hoisted  # w, a
    assert program_parameters(f.lower(jnp.ones((1, 4)))) == 1 + 2 * hoisted  # w, a, b


@pytest.mark.host_memory
def test_static_and_donated_arguments_behave_as_in_jax_jit():
    c = FrozenConst(np.arange(4.0, dtype=np.float32))

    @functools.partial(frozenconst.jit, static_argnames="power", donate_argnums=0)
    def f(w, power):
        return c**power + w

    w, v = jnp.ones(4), jnp.ones(4)
    out = f(w, 2)
    np.testing.assert_array_equal(np.asarray(out), np.arange(4.0) ** 2 + 1)
    jax.jit(lambda w, power: c**power + w, static_argnames="power", donate_argnums=0)(v, 2)
    assert w.is_deleted() == v.is_deleted()  # donated exactly when jax.jit donates
    out3 = f(jnp.ones(4), power=3)
    np.testing.assert_array_equal(np.asarray(out3), np.arange(4.0) ** 3 + 1)
    g = frozenconst.jit(lambda n, w: c * n + w, static_argnums=(0,))
    np.testing.assert_array_equal(np.asarray(g(3, jnp.ones(4))), np.arange(4.0) * 3 + 1)
    with pytest.raises((TypeError, ValueError)):
        g(jnp.ones(()), jnp.ones(4))  # a non-hashable static argument, as jax.jit says


def test_decorator_forms_and_staging_api():
    c = FrozenConst(np.ones(3, np.float32))

    @frozenconst.jit
    def f(w):
        return c + w

    @frozenconst.jit(static_argnums=1)
    def g(w, k):
        return c * k + w

    assert f.__name__ == "f"
    np.testing.assert_array_equal(np.asarray(f(jnp.ones(3))), [2, 2, 2])
    np.testing.assert_array_equal(np.asarray(g(jnp.ones(3), 2)), [3, 3, 3])
    compiled = f.lower(jnp.ones(3)).compile()
    np.testing.assert_array_equal(np.asarray(compiled(jnp.ones(3))), [2, 2, 2])
    traced = f.trace(jnp.ones(3))  # every supported JAX has `.trace` (0.6.2 on)
    np.testing.assert_array_equal(np.asarray(traced.lower().compile()(jnp.ones(3))), [2, 2, 2])
    with pytest.raises(TypeError, match="callable"):
        frozenconst.jit(3)


def test_method_binding():
    class Model:
        def __init__(self):
            self.table = FrozenConst(np.ones((2, 2), np.float32))

        @frozenconst.jit
        def __call__(self, w):
            return self.table @ w

    with pytest.raises((TypeError, ValueError)):
        Model()(jnp.ones(2))  # `self` is not a JAX type, exactly as with jax.jit
    model = Model()
    bound = frozenconst.jit(lambda w: model.table @ w)
    np.testing.assert_array_equal(np.asarray(bound(jnp.ones(2))), [2, 2])


@pytest.mark.parametrize("n_uses", [1, 8])
def test_plain_jax_jit_holds_one_constant_and_one_copy(n_uses):
    data = unique_data((512, 64))
    c = FrozenConst(data)
    f = _layers(c, n_uses)
    w = jnp.ones((64, 2))
    jaxpr = jax.make_jaxpr(f)(w)
    big = [k for k in jaxpr.consts if getattr(k, "shape", ()) == data.shape]
    assert len(big) <= 1
    jax.jit(f)(w).block_until_ready()
    assert live_copies(data) == 1
    lowered = jax.jit(f).lower(w)
    assert len(lowered.as_text()) < 50_000  # a parameter of the executable, under either pipeline
    assert program_parameters(lowered) == 2  # w and the constant, however many uses


def test_function_and_constant_are_freed_with_nothing_left_behind():
    # A first call traces twice (the first trace finds the constants); nothing of
    # either trace may keep the constant's buffer alive (observed via jax.live_arrays()).
    import gc

    data = unique_data((128, 64))

    def build_and_use():
        c = FrozenConst(data)
        ws = [jnp.ones((64, 4)) for _ in range(3)]
        f = frozenconst.jit(lambda ws: sum(jnp.sum(c @ w) for w in ws))
        f(ws).block_until_ready()
        f.lower(ws).compile()
        assert live_copies(data) == 1

    build_and_use()
    jax.clear_caches()
    gc.collect()
    assert live_copies(data) == 0


# --- many constants: what each costs per call -------------------------------


def _sum_of(constants):
    def f(w):
        acc = w
        for c in constants:
            acc = acc + c
        return acc

    return f


@pytest.mark.parametrize("k", [1, 40])
def test_small_constants_cost_no_parameter_and_large_ones_hold_no_data(k):
    small = [FrozenConst(unique_data((4,))) for _ in range(k)]  # 16 B each
    large = [FrozenConst(unique_data((2048,))) for _ in range(k)]  # 8 KiB each: above the default 4 KiB
    w = jnp.ones(4)
    f_small = frozenconst.jit(_sum_of(small))
    f_large = frozenconst.jit(lambda w: _sum_of([c[:4] for c in large])(w))
    expected_small = np.ones(4, np.float32) + sum(np.asarray(c) for c in small)
    assert_float32_close(f_small(w), expected_small, 1 + sum(np.abs(np.asarray(c)) for c in small))
    f_large(w).block_until_ready()
    # Small ones: never parameters under JAX's default pipeline (embedded, as JAX embeds them);
    # under the simplified one, what JAX itself hoists. Large ones: parameters, either way.
    small_hoisted = SIMPLIFIED and jax_passes(small[0])
    assert program_parameters(f_small.lower(w)) == 1 + small_hoisted * k
    assert program_parameters(f_large.lower(w)) == 1 + k
    # Never a copy: each large constant's one device buffer, whatever the pipeline.
    assert all(live_copies(np.asarray(c)) == 1 for c in large)
    # The program holds none of the large constants' data (k * 8 KiB): as large
    # as with them passed as arguments (default pipeline), or closed over as
    # jax.Arrays, which JAX passes to the executable (simplified).
    buffers = [jnp.asarray(c) for c in large]
    if SIMPLIFIED:
        baseline = jax.jit(lambda w: _sum_of([c[:4] for c in buffers])(w)).lower(w)
    else:
        baseline = jax.jit(lambda cs, w: _sum_of([c[:4] for c in cs])(w)).lower(buffers, w)
    # (JAX marks each hoisted constant `{jax.const = true}` in the text: 19 characters each.)
    assert len(f_large.lower(w).as_text()) <= 1.1 * len(baseline.as_text()) + 19 * k


@pytest.mark.parametrize("limit", [0, 15, 16, 1 << 20])
def test_embed_max_bytes_is_the_largest_constant_kept_out_of_the_parameters(limit):
    c = FrozenConst(unique_data((4,)))  # 16 B
    f = frozenconst.jit(lambda w: c * w, embed_max_bytes=limit)
    w = jnp.ones(4)
    np.testing.assert_array_equal(np.asarray(f(w)), np.asarray(c))
    parameter = jax_passes(c) if SIMPLIFIED else c.nbytes > limit
    assert program_parameters(f.lower(w)) == 1 + parameter


@pytest.mark.parametrize("bad", [-1, 1.5, "1k", True, None])
def test_embed_max_bytes_refuses_what_is_not_a_byte_count(bad):
    with pytest.raises(TypeError, match=r"embed_max_bytes.*non-negative int.*received"):
        frozenconst.jit(lambda w: w, embed_max_bytes=bad)


def test_refusals_are_the_packages_error_classes_and_still_the_builtins():
    with pytest.raises(frozenconst.FrozenConstTypeError, match="callable"):
        frozenconst.jit(3)
    with pytest.raises(frozenconst.FrozenConstTypeError, match="embed_max_bytes") as caught:
        frozenconst.jit(lambda w: w, embed_max_bytes=-1)
    assert isinstance(caught.value, TypeError)


def test_on_inside_the_traced_function_is_the_committed_buffer_as_under_jax_jit():
    # `x.on(target)` returns a committed `jax.Array`: inside the traced function too,
    # as `jax.jit` sees it, so code that reads it concretely runs there.
    x = FrozenConst(unique_data(4096))
    device = jax.devices()[0]
    seen = []

    def body(a):
        y = x.on(device)
        seen.append((y is x.on(device), y.committed, float(np.asarray(y)[3])))
        return a + y

    expected = jax.jit(body)(jnp.ones(4096, jnp.float32))
    under_jax_jit, seen[:] = list(seen), []
    got = frozenconst.jit(lambda a: body(a))(jnp.ones(4096, jnp.float32))  # a trace of its own
    assert seen and set(seen) == set(under_jax_jit) == {(True, True, float(np.asarray(x)[3]))}
    np.testing.assert_array_equal(got, expected)


_LIBRARY_THEN_DISTRIBUTED = """
import sys, numpy as np, jax
import frozenconst
from frozenconst import FrozenConst
# A library's module: a table, its compiled function, a jax.jit of it, an interned constant.
TABLE = FrozenConst(np.arange(4.0, dtype=np.float32))
mfcc_compiled = frozenconst.jit(lambda x: x * TABLE)
plain = jax.jit(lambda x: x + TABLE)
half, interned = FrozenConst(0.5), frozenconst.intern(np.ones(3))
# The user, later: the distributed runtime, which must start before any backend.
address = f"127.0.0.1:{sys.argv[1]}"
jax.distributed.initialize(address, num_processes=1, process_id=0, initialization_timeout=60)
try:
    assert jax.process_count() == 1
    print(mfcc_compiled(np.ones(4, np.float32)).tolist(), plain(np.ones(4, np.float32)).tolist())
finally:
    jax.distributed.shutdown()
"""


@pytest.mark.subprocess
@pytest.mark.pipeline_independent
def test_wrapping_and_building_constants_start_no_backend():
    # A library's module-level `frozenconst.jit` (and `jax.jit` over a FrozenConst, a FrozenConst
    # built, interned) must leave `jax.distributed.initialize` possible.
    code, out = run_bounded(
        [sys.executable, "-c", _LIBRARY_THEN_DISTRIBUTED, str(free_port())], env=subprocess_env("cpu")
    )
    assert code == 0, out[-3000:]
    assert "[0.0, 1.0, 2.0, 3.0] [1.0, 2.0, 3.0, 4.0]" in out, out[-3000:]


def _raised(call):
    try:
        call()
    except Exception as err:  # whatever jax.jit raises, compared below
        return type(err), str(err).split("\n")[0]
    return None


@pytest.mark.parametrize(
    "options",
    [
        {"static_argnums": 5},
        {"static_argnums": -3},
        {"donate_argnums": 7},
        {"static_argnums": "a"},
        {"donate_argnums": "x"},
        {"static_argnames": 3},
        {"static_argnums": 0, "donate_argnums": 0},
    ],
    ids=repr,
)
def test_bad_jit_options_get_jax_jits_own_errors(options):
    # The numbers and messages `jax.jit` gives, at wrapping or at the call.
    table = FrozenConst(np.ones(3, np.float32))

    def f(x):
        return x + table

    theirs = _raised(lambda: jax.jit(f, **options)(jnp.ones(3)))
    ours = _raised(lambda: frozenconst.jit(f, **options)(jnp.ones(3)))
    assert theirs is not None and ours == theirs
