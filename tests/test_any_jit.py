"""Every jit keeps a FrozenConst out of the programs it compiles, whatever the stack around it.

JAX is the oracle: the lowered program's text (a FrozenConst's data, embedded, would be in it:
two hex digits a byte), its parameters (one per constant, however many uses), the values it
computes (equal to the same program with the table passed as an argument, bit for bit),
`jax.live_arrays()` (one device copy of the table), and JAX's own count of the calls that
leave its C++ fast path. The compilers: `jax.jit`, `eqx.filter_jit`, `nnx.jit`, linen's
`jax.jit(model.apply)`, `frozenconst.jit`, and libraries that compile internally (a NumPyro
sampler, an Optimistix solver), each run as its docs write it.
"""

import contextlib
import gc
import importlib
import itertools
import json
import os
import pathlib
import sys
import textwrap
import tomllib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    ROOT,
    SIMPLIFIED,
    jax_donates_closed_over_buffers,
    jax_passes,
    live_copies,
    on_cpu,
    program_parameters,
    raw_numpy_lowers,
    run_bounded,
    subprocess_env,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jax import lax

import frozenconst
from frozenconst import FrozenConst

N = 64  # the table is N x N float32: 16 KiB, far above `embed_max_bytes`
_UNIQUE = itertools.count(1)


def _table(seed):
    return np.random.default_rng(seed).standard_normal((N, N)).astype(np.float32) / N


# -- the transformation stack --------------------------------------------------------------------
# Each turns `g`, a function of `x` (shape (N,)) that uses the table through `get()`, into another
# such function; the stack is built the same way over a closure and over an argument.


def _custom_jvp(g, get):
    @jax.custom_jvp
    def f(x):
        return g(x)

    @f.defjvp
    def rule(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), get() @ t  # the rule uses the table too

    return f


def _custom_vjp(g, get):
    @jax.custom_vjp
    def f(x):
        return g(x)

    f.defvjp(lambda x: (g(x), None), lambda _, ct: (get().T @ ct,))
    return f


TRANSFORMS = {
    "jit": lambda g, get: jax.jit(g),
    "vmap": lambda g, get: lambda x: jax.vmap(g)(jnp.stack([x, x]))[1],
    "grad": lambda g, get: lambda x: jax.grad(lambda y: jnp.sum(g(y)))(x),
    "scan": lambda g, get: lambda x: lax.scan(lambda c, _: (g(c), None), x, None, length=2)[0],
    "cond": lambda g, get: lambda x: lax.cond(x[0] > -1e9, g, lambda y: y * 0.5, x),
    "while": lambda g, get: lambda x: lax.fori_loop(0, 2, lambda i, c: g(c), x),
    "checkpoint": lambda g, get: jax.checkpoint(g),
    "custom_jvp": _custom_jvp,
    "custom_vjp": _custom_vjp,
}


def _stack(names, get):
    g = lambda x: jnp.tanh(get() @ x)
    for name in names:
        g = TRANSFORMS[name](g, get)
    return g


# -- how the function reaches the table ----------------------------------------------------------

_GLOBAL_TABLE = None  # the module-global form reads it, set per example


class _Holder:
    def __init__(self, table, names):
        self.table, self.names = table, names

    def __call__(self, x):
        return _stack(self.names, lambda: self.table)(x)


def _reached(reach, table, names):
    """The function of `x` alone, reaching `table` as `reach` says."""
    global _GLOBAL_TABLE
    if reach == "closure":
        return _stack(names, lambda: table)
    if reach == "attribute":
        return _Holder(table, names)
    if reach == "dict":
        tables = {"t": table}
        return _stack(names, lambda: tables["t"])
    _GLOBAL_TABLE = table
    return _stack(names, lambda: _GLOBAL_TABLE)


def _compile(jit, fun):
    if jit == "jax.jit":
        return jax.jit(fun)
    if jit == "frozenconst.jit":
        return frozenconst.jit(fun)
    if jit == "eqx.filter_jit":
        eqx = pytest.importorskip("equinox")
        return eqx.filter_jit(fun)
    if jit == "nnx.jit":
        nnx = pytest.importorskip("flax.nnx")
        return nnx.jit(fun)
    raise AssertionError(jit)


JITS = ["jax.jit", "frozenconst.jit", "eqx.filter_jit", "nnx.jit"]


@pytest.fixture(scope="module")
def frameworks_imported():
    """The frameworks behind `JITS` imported before a property test draws one. On the TPU
    machine's image the example that first imported them raised the recursion limit to 3,000,
    which hypothesis then declines to reset (a `HypothesisWarning`, an error under the suite's
    `filterwarnings`); imported first, the property passes there."""
    for name in ("equinox", "flax.nnx"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


@contextlib.contextmanager
def lowered_programs():
    """The text of every program JAX lowers inside the block, as JAX lowers it (its module)."""
    from jax._src.interpreters import mlir  # JAX's own lowering function, observed

    original = mlir.lower_jaxpr_to_module
    texts: list[str] = []

    def lower(*args, **kwargs):
        result = original(*args, **kwargs)
        texts.append(str(result.module))
        return result

    mlir.lower_jaxpr_to_module = lower
    try:
        yield texts
    finally:
        mlir.lower_jaxpr_to_module = original


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(st.sampled_from(sorted(TRANSFORMS)), min_size=0, max_size=3),
    reach=st.sampled_from(["closure", "attribute", "dict", "global"]),
    jit=st.sampled_from(JITS),
    seed=st.integers(0, 2**16),
)
# A stack JAX cannot run with the table as an argument (above), in every run.
@example(names=["custom_jvp", "cond", "grad"], reach="closure", jit="jax.jit", seed=0)
def test_every_jit_over_every_stack_takes_the_constant_as_one_parameter(
    frameworks_imported, names, reach, jit, seed
):
    data = _table(seed) + next(_UNIQUE)  # unlike any other example's table
    table = FrozenConst(data)
    x = jnp.asarray(np.random.default_rng(seed + 1).standard_normal(N).astype(np.float32))
    ours = _compile(jit, _reached(reach, table, names))
    as_argument = jax.jit(lambda t, x: _stack(names, lambda: t)(x))
    with lowered_programs() as texts:
        got = np.asarray(ours(x))
    assert live_copies(data) == 1  # the constant's one device buffer, shared by every program
    array = jnp.asarray(data)
    try:
        expected = np.asarray(as_argument(array, x))
    except TypeError as err:
        # JAX itself cannot run some stacks with the table as an argument, on every supported
        # version and pipeline (a `custom_jvp` closing over it under `cond` and `grad`: "No
        # constant handler for type: DynamicJaxprTracer", or from jax 0.12.1 an
        # `UnexpectedTracerError`, "The tracer reached lowering as a constant"); the closure
        # over a `jax.Array` runs, and is the oracle there.
        assert "No constant handler" in str(err) or "reached lowering as a constant" in str(err), err
        expected = np.asarray(jax.jit(lambda x: _stack(names, lambda: array)(x))(x))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # Bit for bit: the program with the table passed as an argument, which is what the default
    # pipeline's program becomes; under the simplified one, what JAX makes of a closed-over
    # `jax.Array` (a literal it passes to the executable), which frozenconst leaves as JAX makes it.
    if SIMPLIFIED:
        expected = np.asarray(jax.jit(lambda x: _stack(names, lambda: array)(x))(x))
    np.testing.assert_array_equal(got, expected)
    # None of the table's data in any program the jit lowered; one parameter for it.
    assert texts and max(len(t) for t in texts) < data.nbytes, [len(t) for t in texts]
    # The parameters of the program with the table passed as an argument: one for the table.
    main = [t for t in texts if "func.func public @main(" in t]
    parameters = [t.split("func.func public @main(", 1)[1].split(") -> ", 1)[0].count("%arg") for t in main]
    with contextlib.suppress(TypeError):  # the argument form JAX cannot lower (above)
        assert program_parameters(as_argument.lower(array, x)) in parameters, (names, parameters)


def test_a_program_with_many_uses_takes_each_constant_once():
    tables = [FrozenConst(_table(s)) for s in range(3)]

    def f(x):
        for _ in range(40):
            for t in tables:
                x = jnp.tanh(t @ x)
        return x

    def g(ts, x):
        for _ in range(40):
            for t in ts:
                x = jnp.tanh(t @ x)
        return x

    x = jnp.ones(N)
    as_argument = len(jax.jit(g).lower([jnp.asarray(t) for t in tables], x).as_text())
    for jit in (jax.jit, frozenconst.jit):
        lowered = jit(f).lower(x)
        assert program_parameters(lowered) == 1 + len(tables)  # JAX's own would pass one per use
        # The program of the tables as arguments (with JAX's `{jax.const = true}` on each).
        assert len(lowered.as_text()) <= as_argument + 19 * len(tables)


def test_the_cpp_fast_path_is_kept():
    # JAX's own count of the calls that leave its C++ dispatch (`util.test_event`, the hook JAX's
    # test suite counts cache misses with): the first call only, as with the table as an argument.
    from jax._src import util

    table = FrozenConst(_table(3))
    f = jax.jit(lambda x: table @ x)
    g = jax.jit(lambda t, x: t @ x)
    # Made before counting: `jnp.ones` is a jitted primitive of its own, a miss the first time
    # in a process (on a TPU shard that ran no test before this one).
    ones, held = jnp.ones(N), jnp.asarray(table)
    events = []
    previous = util.test_event_listener
    util.test_event_listener = lambda name, *args: events.append(name)
    try:
        for _ in range(20):
            f(ones)
            g(held, ones)
    finally:
        util.test_event_listener = previous
    misses = [e for e in events if e == "jit_cpp_cache_miss"]
    assert len(misses) == 2, events  # one first call each, then JAX's C++ dispatch


def test_two_constants_of_one_shape_in_two_functions_are_never_swapped():
    a, b = FrozenConst(_table(10)), FrozenConst(_table(11))
    fa, fb = jax.jit(lambda x: a @ x), jax.jit(lambda x: b @ x)
    x = jnp.ones(N)
    for _ in range(2):  # the second time from JAX's caches (the executable shared, its constant not)
        np.testing.assert_array_equal(np.asarray(fa(x)), np.asarray(jnp.asarray(a) @ x))
        np.testing.assert_array_equal(np.asarray(fb(x)), np.asarray(jnp.asarray(b) @ x))


def test_lower_compile_and_donating_another_argument():
    table = FrozenConst(_table(4))
    f = jax.jit(lambda s, x: (s + 1, table @ x), donate_argnums=0)
    compiled = jax.jit(lambda x: table @ x).lower(jnp.ones(N)).compile()
    np.testing.assert_array_equal(
        np.asarray(compiled(jnp.ones(N))), np.asarray(jnp.asarray(table) @ jnp.ones(N))
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        _, y = f(jnp.zeros(3), jnp.ones(N))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jnp.asarray(table) @ jnp.ones(N)))
    assert live_copies(np.asarray(table)) == 1


def test_at_or_below_the_threshold_a_constant_stays_embedded_as_jax_embeds_it():
    small = FrozenConst(np.arange(256, dtype=np.float32))  # 1024 bytes
    lowered = jax.jit(lambda x: small * x).lower(jnp.ones(256))
    # Whether JAX's simplified pipeline makes it a parameter depends on JAX's version: JAX's
    # own lowering of a `jax.Array` in its place says.
    hoisted = SIMPLIFIED and jax_passes(small)
    assert program_parameters(lowered) == 1 + hoisted


def test_linen_apply_under_jax_jit_keeps_a_closed_over_table_out():
    nn = pytest.importorskip("flax.linen")
    data = _table(5)
    table = FrozenConst(data)

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(jnp.tanh(table @ x))

    model = Model()
    x = jnp.ones(N)
    params = model.init(jax.random.key(0), x)
    apply = jax.jit(model.apply)
    lowered = apply.lower(params, x)
    assert len(lowered.as_text()) < data.nbytes
    reference = Model()
    np.testing.assert_allclose(
        np.asarray(apply(params, x)), np.asarray(reference.apply(params, x)), rtol=1e-6
    )


# -- libraries that compile internally, run as their docs write them ------------------------------


# -- copies frozenconst knows: a training step's copy of a constant is kept out as the constant is --
#
# A step that hands back its state (NNX's `nnx.jit` with the constant in `nnx.data`, equinox's
# `filter_jit` returning the model, a jitted optax step returning the params) puts a copy of the
# constant in the state, and warns there. A program that reads the copy afterwards (an
# evaluation closing over the model) takes the copy's buffer as a parameter, as it takes a
# constant's: its program is the program of the table passed as an argument, its values that
# program's, bit for bit.


def _nnx_trained(data, x):
    nnx = pytest.importorskip("flax.nnx", reason="flax NNX needs jax >= 0.10")
    optax = pytest.importorskip("optax")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(data.shape[1], 2, rngs=rngs)
            self.table = nnx.data(FrozenConst(data))

        def __call__(self, v):
            return self.lin(v @ self.table)

    net = Net(nnx.Rngs(0))
    opt = nnx.Optimizer(net, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(net, opt, v):
        loss, grads = nnx.value_and_grad(lambda n: jnp.sum(n(v) ** 2))(net)
        opt.update(net, grads)
        return loss

    for _ in range(3):
        step(net, opt, x)
    return net.table, lambda v: net(v), lambda t, v: net.lin(v @ t)


def _equinox_trained(data, x):
    eqx = pytest.importorskip("equinox")
    optax = pytest.importorskip("optax")

    class Model(eqx.Module):
        table: FrozenConst
        lin: eqx.nn.Linear

        def __call__(self, v):
            return jax.vmap(self.lin)(v @ self.table)

    model = Model(FrozenConst(data), eqx.nn.Linear(data.shape[1], 2, key=jax.random.key(0)))
    opt = optax.adam(1e-2)
    state = opt.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model, state, v):
        grads = eqx.filter_grad(lambda m: jnp.sum(m(v) ** 2))(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state

    for _ in range(3):
        model, state = step(model, state, x)
    return model.table, lambda v: model(v), lambda t, v: jax.vmap(model.lin)(v @ t)


def _optax_trained(data, x):
    optax = pytest.importorskip("optax")
    params = {"table": FrozenConst(data), "w": jnp.ones((data.shape[1], 2))}
    opt = optax.adamw(1e-2, weight_decay=0.1)
    state = opt.init(params)

    def forward(p, v):
        return (v @ p["table"]) @ p["w"]

    @jax.jit
    def step(p, state, v):
        grads = jax.grad(lambda p: jnp.sum(forward(p, v) ** 2))(p)
        updates, state = opt.update(grads, state, p)
        return optax.apply_updates(p, updates), state

    for _ in range(3):
        params, state = step(params, state, x)
    return params["table"], lambda v: forward(params, v), lambda t, v: (v @ t) @ params["w"]


_TRAINED = {"nnx": _nnx_trained, "equinox": _equinox_trained, "optax": _optax_trained}


@pytest.mark.parametrize("idiom", list(_TRAINED))
def test_a_copy_a_training_step_made_is_a_parameter_of_every_jit_reading_it(idiom):
    data = np.random.default_rng(20).standard_normal((256, 64)).astype(np.float32)  # 64 KiB
    x = jnp.ones((2, data.shape[0]))
    with pytest.warns(frozenconst.FrozenConstWarning, match="put a copy"):  # said at the step, as before
        copy, reads, as_argument = _TRAINED[idiom](data, x)
    assert isinstance(copy, FrozenConst) and not copy.is_concrete  # a copy, not the constant
    array = jnp.asarray(copy)
    expected = np.asarray(jax.jit(as_argument)(array, x))
    argument_size = len(jax.jit(as_argument).lower(array, x).as_text())
    for jit in JITS:
        with lowered_programs() as texts:
            got = _compile(jit, lambda v: reads(v))(x)  # a function of its own: JAX's caches share none
        np.testing.assert_array_equal(np.asarray(got), expected)  # the argument form's, bit for bit
        # The program of the table as an argument (give or take a jit's own wrapping), none of its data.
        assert texts and max(len(t) for t in texts) <= argument_size + 500, (jit, [len(t) for t in texts])
    assert jnp.asarray(copy) is array  # still the same buffer, not copied again


def test_a_known_copy_used_many_times_is_one_parameter():
    with pytest.warns(frozenconst.FrozenConstWarning, match="put a copy"):
        copy = jax.jit(lambda t: t)(FrozenConst(_table(21)))

    def uses(t, x):
        return sum(jnp.sum(t @ (x * i)) for i in range(8))

    x = jnp.ones(N)
    lowered = jax.jit(lambda x: uses(copy, x)).lower(x)
    as_argument = jax.jit(uses).lower(jnp.asarray(copy), x)
    assert program_parameters(lowered) == 2  # JAX's own, under the simplified pipeline: one per use
    # (JAX's `{jax.const = true}` on the parameter, and the function's name.)
    assert len(lowered.as_text()) <= len(as_argument.as_text()) + 32
    np.testing.assert_array_equal(
        np.asarray(lowered.compile()(x)), np.asarray(as_argument.compile()(jnp.asarray(copy), x))
    )


def test_the_copies_known_are_those_read_while_they_live():
    from frozenconst import _derived  # the table of known copies, read where it is kept

    table = FrozenConst(_table(23))
    step = jax.jit(lambda state: jax.tree.map(lambda a: a + 1, state))
    gc.collect()
    before = len(_derived.COPY_REFS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", frozenconst.FrozenConstWarning)
        state = {"t": table}
        for _ in range(100):  # a loop passing its copies along files none of them
            state = step(state)
        assert len(_derived.COPY_REFS) == before
        many = [jax.tree.map(lambda a, i=i: a + i, table) for i in range(1000)]
        for copy in many:
            jnp.asarray(copy)  # read as an array: known from now on
        assert len(_derived.COPY_REFS) == before + 1000
        del many, copy
    gc.collect()
    assert len(_derived.COPY_REFS) == before  # each forgotten as it died
    # A copy a program reads is a parameter of it; an array equal to it that no copy holds is
    # embedded, as JAX embeds any array.
    kept, stranger = state["t"], jnp.asarray(state["t"]) + 0
    assert program_parameters(jax.jit(lambda x: kept @ x).lower(jnp.ones(N))) == 2
    if not SIMPLIFIED:  # (the simplified pipeline passes every closed-over jax.Array itself)
        assert program_parameters(jax.jit(lambda x: stranger @ x).lower(jnp.ones(N))) == 1


def test_a_step_donating_a_state_that_holds_a_known_copy_keeps_its_buffer():
    if not jax_donates_closed_over_buffers():
        pytest.skip("this JAX refuses a call donating an array its function closes over")
    with pytest.warns(frozenconst.FrozenConstWarning, match="put a copy"):
        state = jax.jit(lambda s: s)({"t": FrozenConst(_table(22)), "w": jnp.ones(N)})
    copy = state["t"]
    read = jax.jit(lambda x: copy @ x)  # holds the copy's buffer as a parameter
    expected = np.asarray(read(jnp.ones(N)))
    step = jax.jit(lambda s: {"t": jnp.asarray(s["t"]) * 2.0, "w": s["w"] + 1}, donate_argnums=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        new = step(state)
    # The rest of the state was donated; the copy's buffer, which a program holds, was kept.
    assert state["w"].is_deleted()
    assert not jnp.asarray(copy).is_deleted()
    np.testing.assert_array_equal(np.asarray(read(jnp.ones(N))), expected)
    np.testing.assert_array_equal(np.asarray(new["t"]), 2.0 * np.asarray(copy))


def _regression(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((2000, 32)).astype(np.float32)
    w = rng.standard_normal(32).astype(np.float32)
    y = (X @ w + 0.1 * rng.standard_normal(2000)).astype(np.float32)
    return X, y


def test_a_numpyro_sampler_compiles_its_log_density_without_the_observed_data():
    numpyro = pytest.importorskip("numpyro")
    if not raw_numpy_lowers():
        pytest.skip("jax 0.7 to 0.9 under the simplified pipeline cannot lower NumPyro's NumPy constants")
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    X, y = _regression()

    def model(data, obs):  # NumPyro's linear regression
        w = numpyro.sample("w", dist.Normal(jnp.zeros(32), 1.0))
        numpyro.sample("obs", dist.Normal(data @ w, 0.1), obs=obs)

    def run(*args, closed=None):
        fun = model if closed is None else (lambda: model(*closed))  # the data closed over, or passed
        # At full float32 precision: an accelerator's default (bfloat16 passes on a TPU) lets the
        # embedded program, which XLA compiles apart, drift further over the chain than 1e-4.
        with lowered_programs() as texts, jax.default_matmul_precision("highest"):
            mcmc = MCMC(NUTS(fun), num_warmup=30, num_samples=30, progress_bar=False)
            mcmc.run(jax.random.key(0), *args)
        return np.asarray(mcmc.get_samples()["w"]), max(len(t) for t in texts)

    as_arguments, _ = run(jnp.asarray(X), jnp.asarray(y))
    plain, plain_size = run(closed=(jnp.asarray(X), jnp.asarray(y)))
    ours, our_size = run(closed=(FrozenConst(X), FrozenConst(y)))
    if on_cpu():  # CPU_ONLY["one arithmetic"]
        np.testing.assert_array_equal(ours, as_arguments)  # the same samples, bit for bit
        np.testing.assert_allclose(ours, plain, rtol=1e-4, atol=1e-5)
    else:  # the same posterior
        for other in (as_arguments, plain):
            np.testing.assert_allclose(ours.mean(0), other.mean(0), rtol=1e-2, atol=1e-3)
    assert our_size < X.nbytes  # the sampler's programs hold none of the 250 KiB of data
    if not SIMPLIFIED:
        assert plain_size > 2 * X.nbytes  # ... where jax.Arrays are embedded, as JAX embeds them


def test_a_numpyro_sampler_carrying_model_arguments_names_the_users_line_and_numpyros_fix():
    # `jit_model_args=True` carries the model's arguments through numpyro's sampling loop, as
    # outputs: a copy of the constant each run, as of a NumPy array. Said at the user's line
    # (not inside numpyro), with numpyro's own fix; that fix, or the default, says nothing.
    numpyro = pytest.importorskip("numpyro")
    if not raw_numpy_lowers():
        pytest.skip("jax 0.7 to 0.9 under the simplified pipeline cannot lower NumPyro's NumPy constants")
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    X, y = _regression(2)
    table, obs = FrozenConst(X[:200]), jnp.asarray(y[:200])

    def model(data, obs):
        w = numpyro.sample("w", dist.Normal(jnp.zeros(32), 1.0))
        numpyro.sample("obs", dist.Normal(data @ w, 0.1), obs=obs)

    def run(jit_model_args, *args, fun=model):
        mcmc = MCMC(NUTS(fun), num_warmup=5, num_samples=5, jit_model_args=jit_model_args, progress_bar=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(jax.random.key(0), *args)
        return [w for w in caught if issubclass(w.category, frozenconst.FrozenConstWarning)]

    (told,) = run(True, table, obs)
    text = str(told.message)
    assert told.filename == __file__ and text.startswith("numpyro put a copy of FrozenConst values")
    assert "close over the constant in the model instead, or leave `jit_model_args` off" in text
    assert run(False, table, obs) == []
    assert run(True, obs, fun=lambda obs: model(table, obs)) == []


@pytest.mark.parametrize("progress_bar", [True, False])
def test_numpyro_reruns_of_one_mcmc_compile_nothing_with_the_data_a_frozenconst(progress_bar, monkeypatch):
    # NumPyro keys its compiled sampler on `jax.tree.map` of the model's arguments: a rerun of
    # the same `MCMC` object finds it, with jax.Arrays as data (the oracle) as with FrozenConsts.
    # The programs are counted where JAX lowers them (`lowered_programs`). With the progress bar
    # on (numpyro's default, as its docs write it) a rerun compiles nothing; with it off,
    # numpyro's `fori_collect` jits a fresh closure each run, for jax.Arrays too, and a
    # FrozenConst adds nothing to that. numpyro turns its bar off by itself where `CI` or
    # `PYTEST_XDIST_WORKER` is set (`MCMC.__init__`): a user's run has neither.
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    numpyro = pytest.importorskip("numpyro")
    if not raw_numpy_lowers():
        pytest.skip("jax 0.7 to 0.9 under the simplified pipeline cannot lower NumPyro's NumPy constants")
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    X, y = _regression(3)

    def model(x, y=None):
        w = numpyro.sample("w", dist.Normal(jnp.zeros(32), 1.0))
        numpyro.sample("y", dist.Normal(x @ w, 0.1), obs=y)

    def lowered_per_run(x, y):
        mcmc = MCMC(NUTS(model), num_warmup=10, num_samples=10, progress_bar=progress_bar)
        assert mcmc.progress_bar is progress_bar
        counts, samples = [], []
        for run in range(2):
            with lowered_programs() as texts:
                mcmc.run(jax.random.key(run), x, y=y)
            counts.append(len(texts))
            samples.append(np.asarray(mcmc.get_samples()["w"]))
        return counts, samples

    arrays, expected = lowered_per_run(jnp.asarray(X[:300]), jnp.asarray(y[:300]))
    ours, got = lowered_per_run(FrozenConst(X[:300]), FrozenConst(y[:300]))
    # The first runs are not compared: the FrozenConsts' first run finds what the jax.Arrays'
    # compiled (the same parameters), so it lowers less.
    if progress_bar:
        assert arrays[0] > 0 and arrays[1] == 0  # numpyro's own cache, with jax.Arrays
    assert ours[1] == arrays[1], (ours, arrays)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_an_optimistix_solver_compiles_its_loss_without_the_data():
    optx = pytest.importorskip("optimistix")
    X, y = _regression(1)

    def fit(loss, args):
        with lowered_programs() as texts:
            # `throw=False`: on jaxlib 0.12.1's CPU backend at LLVM's -O0 (the suite's XLA_FLAGS)
            # BFGS never meets its termination test, though its iterate reaches the optimum as at
            # -O2 (plain JAX, no FrozenConst); the values below are what is compared.
            solution = optx.minimise(
                loss, optx.BFGS(rtol=1e-6, atol=1e-6), jnp.zeros(32), args=args, max_steps=200, throw=False
            )
        return np.asarray(solution.value), max(len(t) for t in texts)

    def closed(data, target):
        return lambda w, _: jnp.mean((data @ w - target) ** 2)

    as_arguments, _ = fit(lambda w, a: jnp.mean((a[0] @ w - a[1]) ** 2), (jnp.asarray(X), jnp.asarray(y)))
    plain, plain_size = fit(closed(jnp.asarray(X), jnp.asarray(y)), None)
    ours, our_size = fit(closed(FrozenConst(X), FrozenConst(y)), None)
    if on_cpu():  # CPU_ONLY["one arithmetic"]
        np.testing.assert_array_equal(ours, as_arguments)
    np.testing.assert_allclose(ours, as_arguments, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours, plain, rtol=1e-4, atol=1e-5)
    # Solved: the least-squares fit NumPy computes in float64.
    np.testing.assert_allclose(ours, np.linalg.lstsq(X.astype(np.float64), y, rcond=None)[0], atol=1e-4)
    assert our_size < X.nbytes
    if not SIMPLIFIED:
        assert plain_size > 2 * X.nbytes


# -- nothing else changes: programs without a FrozenConst lower byte for byte as JAX's own ------

_PROGRAMS = textwrap.dedent(
    """
    import hashlib, json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    if sys.argv[1] == "with":
        import frozenconst  # installs its lowering
    rng = np.random.default_rng(0)
    table = rng.standard_normal((64, 64)).astype(np.float32)  # NumPy, closed over
    array = jnp.asarray(rng.standard_normal((64, 64)).astype(np.float32))  # a jax.Array, closed over
    small = np.arange(4, dtype=np.float32)
    x = jnp.ones(64)
    programs = {
        "numpy closure": lambda x: table @ x,
        "jax.Array closure": lambda x: array @ x + small[0],
        "many uses": lambda x: sum(jnp.tanh(array @ x) * i for i in range(8)),
        "scan": lambda x: lax.scan(lambda c, _: (jnp.tanh(array @ c), None), x, None, length=3)[0],
        "cond": lambda x: lax.cond(x[0] > 0, lambda y: table @ y, lambda y: array @ y, x),
        "nested jit": lambda x: jax.jit(lambda y: array @ y)(x) + table[0],
        "grad": lambda x: jax.grad(lambda y: jnp.sum(jnp.sin(array @ y)))(x),
        "vmap": lambda x: jax.vmap(lambda r: r @ x)(table),
        "argument": None,
    }
    out = {}
    for name, f in programs.items():
        try:  # jax 0.8 and 0.9 cannot lower a NumPy closure under the simplified pipeline
            lowered = jax.jit(lambda a, x: a @ x).lower(array, x) if f is None else jax.jit(f).lower(x)
            out[name] = hashlib.sha256(lowered.as_text().encode()).hexdigest()
        except Exception as err:
            out[name] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    spec = jax.ShapeDtypeStruct((64,), np.float32)
    try:
        exported = jax.export.export(jax.jit(lambda x: array @ x + table @ x))(spec)
        out["export"] = hashlib.sha256(exported.mlir_module_serialized).hexdigest()
    except Exception as err:
        out["export"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    print(json.dumps(out))
    """
)


@pytest.mark.subprocess
def test_programs_without_a_frozenconst_lower_byte_for_byte_as_jax_lowers_them():
    texts = {}
    for side in ("without", "with"):
        code, out = run_bounded([sys.executable, "-c", _PROGRAMS, side], env=subprocess_env())
        assert code == 0, out
        texts[side] = json.loads(out.strip().splitlines()[-1])
    assert texts["with"] == texts["without"]


# -- reads and transformations that hoisting at lowering keeps out of the program ---------------


def _wide_table():
    return FrozenConst(
        np.random.default_rng(5).standard_normal((128, 128)).astype(np.float32) + next(_UNIQUE)
    )


@pytest.mark.parametrize("rule", ["custom_jvp", "custom_vjp"])
def test_grad_of_frozenconst_jit_over_a_custom_rule_keeps_the_constant_out(rule):
    # `jax.grad(frozenconst.jit(f))`, `f` with a custom rule closing over a 64 KiB table: as
    # small a program as with the table passed as an argument, under either pipeline, and no
    # warning.
    table = _wide_table()
    get = lambda: table
    f = TRANSFORMS[rule](lambda x: jnp.tanh(get() @ x), get)
    loss = lambda x: jnp.sum(f(x))
    x = jnp.ones(128)
    as_argument = jax.jit(
        jax.grad(lambda x, t: jnp.sum(TRANSFORMS[rule](lambda y: jnp.tanh(t @ y), lambda: t)(x)))
    )
    baseline = len(as_argument.lower(x, jnp.asarray(table)).as_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error", frozenconst.FrozenConstWarning)
        for program in (jax.jit(jax.grad(frozenconst.jit(loss))), jax.jit(frozenconst.jit(jax.grad(loss)))):
            text = program.lower(x).as_text()
            assert len(text) < baseline + 1024 < table.nbytes, (len(text), baseline)
            np.testing.assert_array_equal(program(x), as_argument(x, jnp.asarray(table)))


def _with_a_reference(form, get):
    """A function of `(ref, x)` that uses the table through `get()` beside a mutable reference
    (`jax.new_ref`): made inside and updated in a `fori_loop` body, passed in, or made inside and
    updated by a nested `jax.jit`."""

    def step(r, x):
        r[...] += jnp.tanh(get() @ x)

    def in_loop(ref, x):
        r = jax.new_ref(jnp.zeros(128))
        lax.fori_loop(0, 3, lambda i, c: (step(r, x), c)[1], 0)
        return r[...]

    def passed_in(ref, x):
        step(ref, x)
        return ref[...]

    def nested(ref, x):
        r = jax.new_ref(jnp.zeros(128))
        inner = jax.jit(step)
        inner(r, x)
        inner(r, x * 2)
        return r[...]

    return {"fori_loop": in_loop, "argument": passed_in, "nested jit": nested}[form]


REFERENCE_FORMS = ["fori_loop", "argument", "nested jit"]


@pytest.mark.parametrize("form", REFERENCE_FORMS)
@pytest.mark.parametrize("jit", ["jax.jit", "frozenconst.jit"])
def test_a_mutable_reference_beside_the_constant_keeps_it_out(form, jit):
    # JAX makes such a program pure at lowering by tracing it again (`discharge_state`), which
    # under its default pipeline turns the constant back into embedded data: the program must
    # stay the size of the argument form's, compute its values and say nothing.
    table = _wide_table()
    x = jnp.linspace(-1.0, 1.0, 128, dtype=jnp.float32)
    ours = _compile(jit, _with_a_reference(form, lambda: table))
    as_argument = jax.jit(lambda ref, x, t: _with_a_reference(form, lambda: t)(ref, x))
    array = jnp.asarray(np.asarray(table))
    baseline = len(as_argument.lower(jax.new_ref(jnp.zeros(128)), x, array).as_text())
    expected = np.asarray(as_argument(jax.new_ref(jnp.zeros(128)), x, array))
    with warnings.catch_warnings():
        warnings.simplefilter("error", frozenconst.FrozenConstWarning)
        text = ours.lower(jax.new_ref(jnp.zeros(128)), x).as_text()
        assert len(text) < baseline + 1024 < table.nbytes, (len(text), baseline)
        np.testing.assert_array_equal(np.asarray(ours(jax.new_ref(jnp.zeros(128)), x)), expected)


@pytest.mark.skipif(SIMPLIFIED, reason="JAX's simplified pipeline keeps a literal through the new trace")
def test_where_the_pure_program_cannot_be_reached_the_embedded_constant_is_named(monkeypatch):
    # Reaches inside: a JAX whose lowering frozenconst cannot follow into the pure program it
    # makes of one with references (`_compat_lowering.Hooks.discharge` missing) is simulated by putting
    # JAX's own function back; the constant is then embedded, and said, with the fix.
    from frozenconst._compat_lowering import HOISTING

    assert HOISTING is not None and HOISTING.discharge is not None
    monkeypatch.setattr(HOISTING.pxla, "_discharge_refs_jaxpr", HOISTING.discharge)
    monkeypatch.setattr(HOISTING, "discharge", None)
    table = _wide_table()
    x = jnp.ones(128)
    for form in REFERENCE_FORMS:
        program = jax.jit(_with_a_reference(form, lambda: table))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            text = program.lower(jax.new_ref(jnp.zeros(128)), x).as_text()
        assert len(text) > table.nbytes  # embedded, as JAX embeds it
        told = [str(w.message) for w in said if issubclass(w.category, frozenconst.FrozenConstWarning)]
        assert len(told) == 1 and "mutable reference (`jax.new_ref`)" in told[0], told
        assert "pass the constant to the function as an argument" in told[0]


@pytest.mark.parametrize("index", [slice(None), Ellipsis, slice(None, 64)], ids=["[:]", "[...]", "[:64]"])
def test_a_static_slice_of_a_frozenconst_under_jax_jit_is_a_parameter(index):
    # `T[:]`, `T[...]`, `T[:64]` inside `jax.jit` must not put the data into the program, nor
    # look like a raw NumPy constant to the guard and audit: the constant is a parameter, sliced
    # in the program, never bigger than the NumPy form's, and nothing to say.
    table = _wide_table()
    # The NumPy form, where this JAX lowers one (not jax 0.7 to 0.9 under the simplified
    # pipeline); there, the same data as a jax.Array, which that pipeline passes as a parameter.
    data = np.asarray(table) if raw_numpy_lowers() else jnp.asarray(np.asarray(table))
    fn = lambda t: jax.jit(lambda x: x[:64] * 2 + t[index][:64])
    x = jnp.ones((128, 128), jnp.float32)
    ours, numpy_form = fn(table).lower(x), fn(data).lower(x)
    # (Under the simplified pipeline NumPy's slice is itself a parameter, a device copy per
    # program; ours is the constant's one buffer, and the slice an instruction of the program.)
    slack = 256 if SIMPLIFIED else 0
    assert len(ours.as_text()) <= len(numpy_form.as_text()) + slack and program_parameters(ours) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", frozenconst.FrozenConstWarning)
        with frozenconst.no_numpy_constants():
            got = fn(table)(x)
        report = frozenconst.audit(fn(table), x)
    np.testing.assert_array_equal(got, fn(data)(x))
    (captured,) = report.constants
    assert captured.kind == "frozenconst" and captured.parameter and not report.lines()


def test_static_slices_read_many_times_make_no_device_buffers_a_jax_arrays_do_not():
    # `T[:64]` read 8 times in one `jax.jit`: the reads are in the program, on the constant's
    # one buffer, never a device buffer per read (under either pipeline).
    table = _wide_table()
    x = jnp.ones((64, 128), jnp.float32)

    def new_buffers(t):
        fn = jax.jit(lambda x: sum(x * t[:64] for _ in range(8)))
        before = {id(a) for a in jax.live_arrays()}
        fn(x).block_until_ready()
        gc.collect()
        return sum(a.nbytes for a in jax.live_arrays() if id(a) not in before), fn

    array = jnp.asarray(np.asarray(table))
    jnp.asarray(table).block_until_ready()  # the constant's one device buffer, made before
    theirs, reference = new_buffers(array)
    ours, fn = new_buffers(table)
    assert ours <= theirs, (ours, theirs)  # nothing per read
    np.testing.assert_array_equal(fn(x), reference(x))


@pytest.mark.parametrize("inner", ["checkpoint", "shard_map"])
def test_a_constant_inside_checkpoint_or_shard_map_is_a_parameter_and_an_export_names_the_line(inner):
    # Inside `jax.checkpoint` or `shard_map` the constant is a parameter (nothing said); where a
    # program must embed it (`jax.export`), the warning names this file's line, never "a line
    # JAX did not record".
    from jax import export
    from jax.sharding import PartitionSpec as P

    table = _wide_table()
    body = lambda y: jnp.tanh(table @ y)
    if inner == "checkpoint":
        fn = jax.jit(lambda x: jax.checkpoint(body)(x))
    else:
        mesh = jax.make_mesh((1,), ("x",))
        fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P()))
    x = jnp.ones(128)
    with warnings.catch_warnings():
        warnings.simplefilter("error", frozenconst.FrozenConstWarning)
        lowered = fn.lower(x)
        np.testing.assert_allclose(fn(x), jnp.tanh(jnp.asarray(table) @ x), rtol=1e-6)
    assert program_parameters(lowered) == 2 and len(lowered.as_text()) < table.nbytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export.export(fn)(jax.ShapeDtypeStruct((128,), jnp.float32))
    (told,) = [w for w in caught if issubclass(w.category, frozenconst.FrozenConstWarning)]
    assert told.filename == __file__ and "did not record" not in str(told.message)
    assert "is embedded in the compiled program" in str(told.message)


_LIBRARY = """
import numpy as np, jax.numpy as jnp
from frozenconst import FrozenConst
MEL = FrozenConst(np.linspace(0.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64))
def log_mel(s):
    return jnp.log(MEL @ s + 1.0)
"""


def test_a_library_scopes_the_warnings_about_its_constants_in_one_line(tmp_path, monkeypatch):
    # The warning is the user's line, so a `module="mylib"` filter cannot scope it: the message
    # names the module the constant was made in, for a message filter; under `-W error` the
    # outcome must not depend on the order of the tests.
    from jax import export

    package = tmp_path / "mylib_row15"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tables.py").write_text(_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import mylib_row15.tables as tables

    mine = _wide_table()
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    theirs = lambda: export.export(jax.jit(lambda s: tables.log_mel(s)))(spec)  # a user's function
    ours = lambda: export.export(jax.jit(lambda s: mine[:64, :64] @ s))(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", frozenconst.FrozenConstWarning)
        for _ in range(3):  # raised each time it applies: no order between tests matters
            with pytest.raises(frozenconst.FrozenConstWarning, match=r"made in `mylib_row15\.tables`"):
                theirs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", r".*made in `mylib_row15[.`]", frozenconst.FrozenConstWarning)
        theirs()
        ours()
    told = [str(w.message) for w in caught if issubclass(w.category, frozenconst.FrozenConstWarning)]
    assert len(told) == 1 and f"made in `{__name__}`" in told[0], told
    with warnings.catch_warnings(record=True) as caught:  # the library's line, with the filter gone
        warnings.simplefilter("always")
        theirs()
    assert [w.filename for w in caught if issubclass(w.category, frozenconst.FrozenConstWarning)] == [
        __file__
    ]


def _documented_pytest_setting():
    """The `filterwarnings` setting docs/jit.md gives a pytest suite, as written there."""
    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "jit.md").read_text()
    block = text.split("```toml", 1)[1].split("```", 1)[0]
    return textwrap.dedent(block).strip()


_USER_TESTS = """
import jax, jax.numpy as jnp, numpy as np
from jax import export
from frozenconst import FrozenConst
import mylib_row15.tables as tables
SPEC = jax.ShapeDtypeStruct((64,), jnp.float32)

def test_the_librarys_constant():
    export.export(jax.jit(lambda s: tables.log_mel(s)))(SPEC)

def test_my_own_constant():
    mine = FrozenConst(np.linspace(0.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64))
    export.export(jax.jit(lambda s: mine @ s))(SPEC)
"""


@pytest.mark.subprocess
@pytest.mark.pipeline_independent
def test_a_pytest_suite_that_makes_warnings_errors_scopes_a_librarys_warnings_as_documented(tmp_path):
    # pytest applies its `filterwarnings` setting before each test, ahead of any filter a module
    # set at import: the documented setting scopes the library's warnings there, and the
    # user's own constant still fails their test.
    package = tmp_path / "mylib_row15"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tables.py").write_text(_LIBRARY)
    (tmp_path / "test_user.py").write_text(_USER_TESTS)
    setting = _documented_pytest_setting().replace("mylib", "mylib_row15")
    # A machine whose `import jax` warns (a TPU VM's start-up) needs its own line in any suite that
    # makes warnings errors, ahead of a category whose import imports JAX: the one this project's
    # pytest setting has.
    machine = [
        f
        for f in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
            "filterwarnings"
        ]
        if "Transparent hugepages" in f
    ]
    setting = setting.replace(
        '["error", ', "[" + ", ".join(json.dumps(f) for f in ["error", *machine]) + ", "
    )
    assert machine and all(json.dumps(f) in setting for f in machine), setting
    (tmp_path / "pyproject.toml").write_text(setting)
    env = {**subprocess_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_env()["PYTHONPATH"]])}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "test_user.py",
    ]
    code, out = run_bounded(command, cwd=tmp_path, env=env)
    assert code == 1, out[-3000:]
    assert "1 failed, 1 passed" in out and "FAILED test_user.py::test_my_own_constant" in out, out[-3000:]
    assert "made in `test_user`" in out, out[-3000:]
