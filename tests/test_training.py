"""Constants in models are never trained: equinox, flax NNX, optax; and jaxtyping annotations."""

import pathlib
import re
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import live_copies, subprocess_env, unique_data
from hypothesis import given
from hypothesis import strategies as st
from jaxtyping import Float, Int, TypeCheckError, jaxtyped

import frozenconst
from frozenconst import FrozenConst


def _assert_untouched(const, data):
    np.testing.assert_array_equal(np.ascontiguousarray(const).view(np.uint8), data.view(np.uint8))  # bitwise
    on_device = np.ascontiguousarray(jnp.asarray(const))
    np.testing.assert_array_equal(on_device.view(np.uint8), data.view(np.uint8))
    assert live_copies(data) == 1  # one device buffer, observed through jax.live_arrays()
    assert const.stats().transfers == 1


class _Model(eqx.Module):
    table: FrozenConst
    lin: eqx.nn.Linear

    def __call__(self, x):
        return self.lin(x @ self.table)


def test_equinox_adamw_with_weight_decay_leaves_the_constant_alone():
    data = unique_data((16, 8))
    table = FrozenConst(data)

    class Model(eqx.Module):
        table: FrozenConst
        lin: eqx.nn.Linear

        def __call__(self, x):
            return self.lin(x @ self.table)

    model = Model(table, eqx.nn.Linear(8, 2, key=jax.random.key(0)))
    params, static = eqx.partition(model, frozenconst.is_trainable, is_leaf=frozenconst.is_frozen)
    assert params.table is None and static.table is table
    opt = optax.adamw(1e-1, weight_decay=0.5)
    opt_state = opt.init(params)

    @eqx.filter_jit
    def step(params, static, opt_state, x):
        loss, grads = eqx.filter_value_and_grad(lambda p: jnp.sum(eqx.combine(p, static)(x) ** 2))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    w0 = np.asarray(params.lin.weight)
    for _ in range(5):
        params, opt_state, _ = step(params, static, opt_state, jnp.ones(16))
    model = eqx.combine(params, static)
    assert model.table is table
    assert not np.array_equal(np.asarray(model.lin.weight), w0)  # the trainable weights did change
    _assert_untouched(model.table, data)


def test_optax_alone_with_partition_and_combine():
    data = unique_data((8, 4))
    params = {"table": FrozenConst(data), "w": jnp.ones((4, 3))}
    trainable, rest = frozenconst.partition(params)
    opt = optax.adamw(1e-1, weight_decay=0.5)
    opt_state = opt.init(trainable)
    assert all(
        leaf.shape != data.shape for leaf in jax.tree_util.tree_leaves(opt_state) if hasattr(leaf, "shape")
    )

    @jax.jit
    def step(trainable, rest, opt_state):
        def loss(t):
            p = frozenconst.combine(t, rest)
            return jnp.sum((p["table"] @ p["w"]) ** 2)

        grads = jax.grad(loss)(trainable)
        updates, opt_state = opt.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state

    for _ in range(5):
        trainable, opt_state = step(trainable, rest, opt_state)
    params2 = frozenconst.combine(trainable, rest)
    assert params2["table"] is params["table"]
    assert not np.array_equal(np.asarray(params2["w"]), np.ones((4, 3)))
    _assert_untouched(params2["table"], data)


@pytest.mark.parametrize("how", ["nnx.data", "register_data_type"])
def test_flax_nnx_split_merge_adamw_leaves_the_constant_alone(how):
    data = unique_data((16, 8))
    table = FrozenConst(data)
    if how == "register_data_type":
        nnx.register_data_type(FrozenConst)

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.table = nnx.data(table) if how == "nnx.data" else table
            self.lin = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, x):
            return self.lin(x @ self.table)

    model = Model(nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt = optax.adamw(1e-1, weight_decay=0.5)
    opt_state = opt.init(params)  # Params only: the constant has no optimizer state

    @jax.jit
    def step(params, rest, opt_state, x):
        grads = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    w0 = np.asarray(model.lin.kernel[...])
    for _ in range(5):
        params, opt_state = step(params, rest, opt_state, jnp.ones((3, 16)))
    nnx.update(model, params)
    assert not np.array_equal(np.asarray(model.lin.kernel[...]), w0)  # trained
    assert model.table is table  # the constant itself, never an output of the step
    _assert_untouched(model.table, data)


def _assert_derived_copy(value, table, data):
    # What a jitted function returns is a new buffer: a FrozenConst rebuilt from
    # it is a derived value, equal in content but not the constant itself.
    assert isinstance(value, FrozenConst) and value is not table and not value.is_concrete
    with pytest.raises(frozenconst.FrozenConstTypeError, match="derived"):
        value.stats()
    np.testing.assert_array_equal(np.ascontiguousarray(value).view(np.uint8), data.view(np.uint8))
    assert jnp.asarray(value).unsafe_buffer_pointer() != jnp.asarray(table).unsafe_buffer_pointer()
    assert live_copies(data) == 2  # the constant's buffer, and the copy the step returned


class _Net(nnx.Module):
    def __init__(self, table, rngs):
        self.table = nnx.data(table)
        self.lin = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.lin(x @ self.table)


def test_flax_nnx_jit_leaves_a_derived_copy_in_the_model():
    # nnx.jit returns every data attribute as an output and writes it back into
    # the model: the constant is never trained, but the model ends up holding a
    # copy. docs/training.md gives the recipe below instead.
    data = unique_data((16, 8))
    table = FrozenConst(data)
    model = _Net(table, nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adamw(1e-1, weight_decay=0.5), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, x):
        grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
        opt.update(model, grads)

    for _ in range(5):
        with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
            step(model, opt, jnp.ones((3, 16)))
    _assert_derived_copy(model.table, table, data)


def test_flax_nnx_optimizer_recipe_keeps_the_constant():
    data = unique_data((16, 8))
    table = FrozenConst(data)
    model = _Net(table, nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adamw(1e-1, weight_decay=0.5), wrt=nnx.Param)
    graphdef, state = nnx.split((model, opt))

    @jax.jit
    def step(state, x):
        model, opt = nnx.merge(graphdef, state)
        grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
        opt.update(model, grads)
        # Variables only (parameters, optimizer state): the constant is data, not
        # a Variable, so it is an input of the step and never an output.
        return nnx.state((model, opt), nnx.Variable)

    w0 = np.asarray(model.lin.kernel[...])
    for _ in range(5):
        nnx.update((model, opt), step(state, jnp.ones((3, 16))))
        state = nnx.state((model, opt))
    assert not np.array_equal(np.asarray(model.lin.kernel[...]), w0)  # trained
    assert model.table is table
    _assert_untouched(model.table, data)


@pytest.mark.parametrize("jit", [jax.jit, eqx.filter_jit], ids=["jax.jit", "eqx.filter_jit"])
def test_equinox_model_returned_from_a_jitted_step_holds_a_derived_copy(jit):
    data = unique_data((16, 8))
    table = FrozenConst(data)
    model = _Model(table, eqx.nn.Linear(8, 2, key=jax.random.key(0)))
    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        returned = jit(lambda m: eqx.tree_at(lambda m: m.lin.bias, m, m.lin.bias + 1))(model)
    assert model.table is table  # the input is untouched
    _assert_derived_copy(returned.table, table, data)
    # The recipe: return only the trainable half, combine outside.
    params, static = eqx.partition(model, frozenconst.is_trainable, is_leaf=frozenconst.is_frozen)
    params = jit(lambda p, s: eqx.tree_at(lambda m: m.lin.bias, p, p.lin.bias + 1))(params, static)
    assert eqx.combine(params, static).table is table


def test_jit_passthrough_gives_back_a_derived_value():
    data = unique_data((4, 4))
    x = FrozenConst(data)
    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        copy = jax.jit(lambda c: c)(x)
    _assert_derived_copy(copy, x, data)
    # Outside a transformation, rebuilding from the constant's own buffer gives
    # a handle on the constant itself (same host data, same device buffer).
    same = jax.tree_util.tree_map(lambda a: a, x)
    assert same.is_concrete and same.stats().transfers == 1
    assert jnp.asarray(same) is jnp.asarray(x)


def test_a_tree_of_gradients_has_the_structure_of_the_model():
    # A transformation gives back a derived value of the same type as the constant
    # (not a subclass: JAX keys pytree nodes by exact type), so the tree maps that
    # optimizers run over parameters and gradients together line up. A constant's
    # gradient is zero: it is a constant to autodiff (docs/design/index.md).
    data = np.arange(3.0, dtype=np.float32)
    model = {"w": jnp.ones(3), "c": FrozenConst(data)}
    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        grads = jax.grad(lambda m: jnp.sum(m["w"] * m["c"] ** 2))(model)
    assert type(grads["c"]) is FrozenConst and not grads["c"].is_concrete
    assert jax.tree.structure(grads) == jax.tree.structure(model)
    np.testing.assert_array_equal(np.asarray(grads["c"]), np.zeros(3))  # no gradient through a constant
    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        stepped = jax.tree.map(lambda p, g: p - 0.5 * g, model, grads)
    np.testing.assert_allclose(np.asarray(stepped["w"]), 1 - 0.5 * data**2)
    np.testing.assert_array_equal(np.asarray(stepped["c"]), data)  # d/dc = 0: the values hold
    assert model["c"].is_concrete  # the model's constant itself is untouched


def test_jaxtyping_annotations_are_checked_at_run_time():
    # The test extra's checker (pyproject.toml); skipped, not an import error for the
    # whole module, where an environment lacks it (the accelerator machine's image).
    beartype = pytest.importorskip("beartype").beartype

    @jaxtyped(typechecker=beartype)
    def embed(table: Float[FrozenConst, "vocab dim"], ids: Int[jax.Array, " n"]) -> Float[jax.Array, "n dim"]:
        return jnp.take(table, ids, axis=0)

    good = FrozenConst(unique_data((10, 4)))
    assert embed(good, jnp.array([1, 2])).shape == (2, 4)
    with pytest.raises(TypeCheckError):
        embed(FrozenConst(unique_data((10,))), jnp.array([1, 2]))  # wrong rank
    with pytest.raises(TypeCheckError):
        embed(FrozenConst(np.ones((10, 4), np.int32)), jnp.array([1, 2]))  # wrong dtype
    with pytest.raises(TypeCheckError):
        embed(jnp.ones((10, 4)), jnp.array([1, 2]))  # a jax.Array is not a FrozenConst

    @jaxtyped(typechecker=beartype)
    def pair(a: Float[FrozenConst, "n d"], b: Float[FrozenConst, "d m"]) -> Float[jax.Array, "n m"]:
        return a @ b

    assert pair(FrozenConst(unique_data((3, 5))), FrozenConst(unique_data((5, 2)))).shape == (3, 2)
    with pytest.raises(TypeCheckError):
        pair(FrozenConst(unique_data((3, 5))), FrozenConst(unique_data((4, 2))))  # dims disagree


def test_filters():
    const = FrozenConst(np.ones(2, np.float32))
    assert frozenconst.is_frozen(const) and not frozenconst.is_frozen(jnp.ones(2))
    assert not frozenconst.is_trainable(const)
    assert frozenconst.is_trainable(jnp.ones(2)) and frozenconst.is_trainable(np.ones(2))
    assert not frozenconst.is_trainable(jnp.ones(2, jnp.int32)) and not frozenconst.is_trainable("x")


class _MLPWithConstants(eqx.Module):
    mlp: eqx.nn.MLP  # holds activation functions: leaves an optimizer cannot hold state for
    table: FrozenConst
    ids: jax.Array  # integer data, not a parameter

    def __call__(self, x):
        return self.mlp(x @ self.table[self.ids].T)


def test_partition_splits_off_exactly_what_an_optimizer_trains():
    data = unique_data((4, 8))
    ids = jnp.array([3, 1, 0], jnp.int32)
    model = _MLPWithConstants(eqx.nn.MLP(3, 2, 5, depth=2, key=jax.random.key(0)), FrozenConst(data), ids)
    trainable, rest = frozenconst.partition(model)
    assert all(frozenconst.is_trainable(leaf) for leaf in jax.tree_util.tree_leaves(trainable))
    assert rest.table is model.table and rest.ids is ids and rest.mlp.activation is model.mlp.activation
    assert trainable.table is None and trainable.ids is None and trainable.mlp.activation is None
    assert rest.mlp.layers[0].weight is None and trainable.mlp.layers[0].weight is model.mlp.layers[0].weight

    opt = optax.adamw(1e-1, weight_decay=0.5)
    opt_state = opt.init(trainable)  # failed while `partition` put the activations into `trainable`

    @eqx.filter_jit  # `rest` holds functions: jax.jit would refuse it as an argument
    def step(trainable, rest, opt_state, x):
        grads = jax.grad(lambda t: jnp.sum(frozenconst.combine(t, rest)(x) ** 2))(trainable)
        updates, opt_state = opt.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state

    w0 = np.asarray(model.mlp.layers[0].weight)
    for _ in range(5):
        trainable, opt_state = step(trainable, rest, opt_state, jnp.ones(8))
    trained = frozenconst.combine(trainable, rest)
    assert not np.array_equal(np.asarray(trained.mlp.layers[0].weight), w0)  # floats trained
    assert trained.ids is ids  # the integer array untouched, the very object
    assert trained.table is model.table
    _assert_untouched(trained.table, data)


_leaves = st.one_of(
    st.sampled_from([None, "name", 3, 2.5, jax.nn.relu, np.float32(1.5), np.int32(2)]),
    st.builds(lambda n: jnp.ones(n), st.integers(0, 3)),
    st.builds(lambda n: np.zeros(n, np.int64), st.integers(0, 3)),
    st.builds(lambda n: FrozenConst(np.arange(n, dtype=np.float32)), st.integers(0, 3)),
)
_trees = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.sampled_from("abc"), children, max_size=3),
    ),
    max_leaves=8,
)


@given(_trees)
def test_combine_inverts_partition(tree):
    trainable, rest = frozenconst.partition(tree)
    rebuilt = frozenconst.combine(trainable, rest)
    flat = jax.tree_util.tree_flatten(tree, is_leaf=frozenconst.is_frozen)
    flat_rebuilt = jax.tree_util.tree_flatten(rebuilt, is_leaf=frozenconst.is_frozen)
    assert flat_rebuilt[1] == flat[1]
    assert len(flat_rebuilt[0]) == len(flat[0])
    assert all(a is b for a, b in zip(flat_rebuilt[0], flat[0], strict=True))
    assert all(frozenconst.is_trainable(leaf) for leaf in jax.tree_util.tree_leaves(trainable))
    assert not any(
        frozenconst.is_trainable(leaf)
        for leaf in jax.tree_util.tree_leaves(rest, is_leaf=frozenconst.is_frozen)
    )


_COPYING_TEST = """
import jax, jax.numpy as jnp, numpy as np
import frozenconst


def test_a_copy_of_a_constant():
    table = frozenconst.FrozenConst(np.ones((4, 4), np.float32))
    jax.tree.map(jnp.zeros_like, {"table": table})  # an optimizer's init does this
"""


@pytest.mark.subprocess
@pytest.mark.pipeline_independent
def test_the_documented_pytest_configuration_makes_frozenconst_warnings_errors(tmp_path):
    # docs/testing.md's configuration, as written there, fails a test that copies a constant.
    docs = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    (config,) = [block for block in re.findall(r"```toml\n(.*?)```", docs, re.S) if "filterwarnings" in block]
    assert config == '[tool.pytest.ini_options]\nfilterwarnings = ["error::frozenconst.FrozenConstWarning"]\n'
    (tmp_path / "test_sample.py").write_text(_COPYING_TEST)
    run = lambda: subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sample.py"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=240,
        cwd=tmp_path,
    )
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    assert "1 passed" in run().stdout  # warned only
    (tmp_path / "pyproject.toml").write_text(config)
    failed = run().stdout
    assert "1 failed" in failed and "FrozenConstWarning" in failed, failed[-3000:]


@pytest.mark.parametrize("leaf", ["frozen", "array"])
def test_a_tree_of_nones_in_a_constants_place_pickles_and_combines_back(leaf):
    # The half of `eqx.partition` without arrays (and any tree mapped to `None`s) holds a
    # placeholder where the constant was; it pickles as that, as with a jax.Array.
    import pickle

    data = unique_data((8, 4))
    table = FrozenConst(data) if leaf == "frozen" else jnp.asarray(data)
    model = _Model(table, eqx.nn.Linear(4, 2, key=jax.random.key(0)))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    back = eqx.combine(params, pickle.loads(pickle.dumps(static)))
    assert jax.tree.structure(back) == jax.tree.structure(model)
    x = jnp.ones(8)
    np.testing.assert_array_equal(np.asarray(back(x)), np.asarray(model(x)))
    nones = pickle.loads(pickle.dumps(jax.tree.map(lambda v: None, {"t": table})))
    assert jax.tree.leaves(nones) == [] and jax.tree.structure(nones) == jax.tree.structure(
        jax.tree.map(lambda v: None, {"t": table})
    )
