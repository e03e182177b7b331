"""Each framework's training step as its own tutorial writes it, with a FrozenConst in the model
and no frozenconst filter added: it keeps the constant, or says so at the first step, before any
value changes (the table in docs/training.md, "What each idiom does").

Observed through JAX: `jax.live_arrays()` (device copies), bits of the data, the lowered
program's size, object identity; never only frozenconst's own counters.
"""

import warnings

import equinox as eqx
import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import SIMPLIFIED, live_copies, unique_data
from hypothesis import given
from hypothesis import strategies as st

import frozenconst
from frozenconst import FrozenConst, FrozenConstWarning

DERIVED = "not the constant's own buffer"


def _untouched(const, data):
    """The constant itself: bitwise its data, one device buffer, one transfer."""
    assert const.is_concrete
    np.testing.assert_array_equal(np.ascontiguousarray(const).view(np.uint8), data.view(np.uint8))
    on_device = np.ascontiguousarray(jnp.asarray(const))
    np.testing.assert_array_equal(on_device.view(np.uint8), data.view(np.uint8))
    assert live_copies(data) == 1
    assert const.stats().transfers == 1


def _program_bytes(lowered):
    return len(lowered.as_text())


class _EqxModel(eqx.Module):
    emb: FrozenConst
    lin: eqx.nn.Linear
    act: object = eqx.field(static=True, default=jax.nn.relu)

    def __call__(self, x):
        return self.act(self.lin(x @ self.emb))


def _eqx_tutorial_step(opt):
    # As equinox's tutorials write it ("Train a CNN", "Optax"): filter the arrays, train them.
    @eqx.filter_jit
    def make_step(model, opt_state, x):
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.sum(m(x) ** 2))(model)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    return make_step


def test_equinox_tutorial_step_warns_at_optimizer_init_before_any_value_changes():
    data = unique_data((16, 8))
    table = FrozenConst(data)
    model = _EqxModel(table, eqx.nn.Linear(8, 2, key=jax.random.key(0)))
    opt = optax.adamw(1e-1, weight_decay=0.5)
    with pytest.warns(FrozenConstWarning, match=DERIVED) as caught:
        opt_state = opt.init(eqx.filter(model, eqx.is_array))
    assert any("optimizer" in str(w.message) for w in caught)
    assert caught[0].filename == __file__  # names the user's line, not JAX's
    _untouched(table, data)  # nothing has changed yet: the warning came first
    step = _eqx_tutorial_step(opt)
    with pytest.warns(FrozenConstWarning, match=DERIVED):
        new, opt_state, _ = step(model, opt_state, jnp.ones(16))
    # What the warning said: the model now holds a derived copy, which weight decay changed.
    assert not new.emb.is_concrete and not np.array_equal(np.asarray(new.emb), data)
    np.testing.assert_array_equal(np.asarray(table), data)  # the constant itself never changes
    assert model.emb is table


def test_equinox_step_under_frozenconst_filter_jit_keeps_the_constant_itself():
    # The same step compiled by frozenconst.filter_jit, partitioning inside with
    # frozenconst's filter: the model it returns holds the constant, no copy made.
    data = unique_data((16, 8))
    table = FrozenConst(data)
    model = _EqxModel(table, eqx.nn.Linear(8, 2, key=jax.random.key(0)))
    opt = optax.adamw(1e-1, weight_decay=0.5)
    params, _ = eqx.partition(model, frozenconst.is_trainable, is_leaf=frozenconst.is_frozen)
    opt_state = opt.init(params)

    @frozenconst.filter_jit
    def make_step(model, opt_state, x):
        params, static = eqx.partition(model, frozenconst.is_trainable, is_leaf=frozenconst.is_frozen)
        loss, grads = eqx.filter_value_and_grad(lambda p: jnp.sum(eqx.combine(p, static)(x) ** 2))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return eqx.combine(eqx.apply_updates(params, updates), static), opt_state, loss

    w0 = np.asarray(model.lin.weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            model, opt_state, _ = make_step(model, opt_state, jnp.ones(16))
    assert model.emb is table and not np.array_equal(np.asarray(model.lin.weight), w0)
    _untouched(table, data)
    assert _program_bytes(make_step.lower(model, opt_state, jnp.ones(16))) < 20 * data.nbytes


class _NnxNet(nnx.Module):
    def __init__(self, table, rngs):
        self.pos = nnx.data(table)
        self.lin = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.lin(x @ self.pos)


def test_flax_nnx_tutorial_step_keeps_values_and_warns_at_the_first_step():
    data = unique_data((16, 8))
    table = FrozenConst(data)
    net = _NnxNet(table, nnx.Rngs(0))
    optimizer = nnx.Optimizer(net, optax.adamw(1e-1, weight_decay=0.5), wrt=nnx.Param)

    @nnx.jit  # as flax's "MNIST tutorial" writes the step
    def train_step(net, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(net)
        optimizer.update(net, grads)
        return loss

    with pytest.warns(FrozenConstWarning, match=DERIVED) as caught:
        train_step(net, optimizer, jnp.ones((3, 16)))
    assert caught[0].filename == __file__
    for _ in range(3):
        with pytest.warns(FrozenConstWarning, match=DERIVED):  # each step writes a copy back
            train_step(net, optimizer, jnp.ones((3, 16)))
    # Never trained (not an nnx.Param): the values hold, in the copy nnx.jit wrote back.
    np.testing.assert_array_equal(np.ascontiguousarray(net.pos).view(np.uint8), data.view(np.uint8))
    assert not net.pos.is_concrete
    # frozenconst.jit keeps the copy out of the program, as it keeps the constant out.
    before = _program_bytes(jax.jit(lambda v: net(v)).lower(jnp.ones((3, 16))))
    ours = _program_bytes(frozenconst.jit(lambda v: net(v)).lower(jnp.ones((3, 16))))
    assert before > data.nbytes and ours < 4000
    np.testing.assert_allclose(frozenconst.jit(lambda v: net(v))(jnp.ones((3, 16))), net(jnp.ones((3, 16))))


def test_flax_linen_compact_module_with_optax_keeps_the_constant():
    data = unique_data((16, 8))
    table = FrozenConst(data)

    class Net(linen.Module):
        @linen.compact
        def __call__(self, x):
            return linen.Dense(2)(x @ table)

    net = Net()
    params = net.init(jax.random.key(0), jnp.ones((3, 16)))
    assert all(leaf.shape != data.shape for leaf in jax.tree.leaves(params))
    opt = optax.adamw(1e-1, weight_decay=0.5)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, x):
        grads = jax.grad(lambda p: jnp.sum(net.apply(p, x) ** 2))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            params, opt_state = step(params, opt_state, jnp.ones((3, 16)))
    _untouched(table, data)


def test_optax_over_a_params_dict_warns_at_init_and_the_constant_gets_no_gradient():
    data = unique_data((8, 4))
    table = FrozenConst(data)
    params = {"table": table, "w": jnp.ones((4, 3))}
    opt = optax.adamw(1e-1, weight_decay=0.5)
    with pytest.warns(FrozenConstWarning, match=DERIVED):
        opt_state = opt.init(params)
    _untouched(table, data)

    def loss(p):
        return jnp.sum((p["table"] @ p["w"]) ** 2)

    with pytest.warns(FrozenConstWarning, match=DERIVED):
        grads = jax.grad(loss)(params)
    np.testing.assert_array_equal(np.asarray(grads["table"]), np.zeros_like(data))
    with pytest.warns(FrozenConstWarning, match=DERIVED):
        updates, opt_state = opt.update(grads, opt_state, params)
        stepped = optax.apply_updates(params, updates)
    assert not stepped["table"].is_concrete  # weight decay changed the copy, as the warning said
    assert params["table"] is table
    _untouched(table, data)


# Where the constant sits in the differentiated tree, and how the loss reaches it.
_WRAPPERS = {
    "plain": lambda f: f,
    "jax.jit": jax.jit,
    "frozenconst.jit": frozenconst.jit,
    "eqx.filter_jit": eqx.filter_jit,
    "frozenconst.filter_jit": frozenconst.filter_jit,
}


@given(
    outer=st.sampled_from(sorted(_WRAPPERS)),
    inner=st.sampled_from(sorted(_WRAPPERS)),
    how=st.sampled_from(["value_and_grad", "grad", "vjp"]),
)
def test_a_constant_in_a_differentiated_tree_gets_a_zero_gradient(outer, inner, how):
    # Against the same tree with a jax.Array behind lax.stop_gradient in the
    # constant's place: the constant's gradient is exactly zero, every other leaf's
    # is what it would be, under every wrapper, inside and outside the gradient.
    data = np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3)
    tree = {"w": jnp.full((3,), 0.5), "c": FrozenConst(data)}
    reference = {"w": jnp.full((3,), 0.5), "c": jnp.asarray(data)}

    def loss(t, stop):
        c = jax.lax.stop_gradient(t["c"]) if stop else t["c"]
        return jnp.sum(jnp.tanh(c @ t["w"]) ** 2)

    def grad_of(t, stop):
        f = _WRAPPERS[inner](lambda t: loss(t, stop))
        if how == "grad":
            return jax.grad(f)(t)
        if how == "value_and_grad":
            return jax.value_and_grad(f)(t)[1]
        _, pullback = jax.vjp(f, t)
        return pullback(jnp.ones(()))[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FrozenConstWarning)  # the gradient tree holds a derived copy
        ours = _WRAPPERS[outer](lambda t: grad_of(t, False))(tree)
        expected = _WRAPPERS[outer](lambda t: grad_of(t, True))(reference)
    np.testing.assert_array_equal(np.asarray(ours["c"]), np.zeros_like(data))
    np.testing.assert_allclose(np.asarray(ours["w"]), np.asarray(expected["w"]), rtol=1e-6)
    assert jax.tree.structure(ours) == jax.tree.structure(tree)


def test_a_derived_copy_says_what_it_holds_without_its_data():
    data = np.full((300, 300), 7.0, np.float32)
    with pytest.warns(FrozenConstWarning, match=r"float32\[300, 300\], 351\.6 KiB"):
        copy = jax.jit(lambda c: c)(FrozenConst(data))
    with pytest.raises(frozenconst.FrozenConstTypeError, match=r"float32\[300, 300\]") as err:
        copy.stats()
    assert "7." not in str(err.value) and len(str(err.value)) < 600


class _EqxMLPModel(eqx.Module):
    emb: FrozenConst
    mlp: eqx.nn.MLP  # its activation is a field, a leaf that is no array

    def __call__(self, x):
        return self.mlp(x @ self.emb)


def test_an_equinox_module_with_activations_compiles_with_filter_jit_and_keeps_constants_out():
    data = unique_data((256, 64))
    table = FrozenConst(data)
    model = _EqxMLPModel(table, eqx.nn.MLP(64, 4, 32, depth=2, key=jax.random.key(1)))
    x = jnp.ones(256)
    with pytest.raises(TypeError, match=r"abstract array|valid JAX type") as refused:  # as jax.jit
        frozenconst.jit(lambda m, x: m(x))(model, x)
    assert any("frozenconst.filter_jit" in note for note in refused.value.__notes__)
    as_argument = frozenconst.filter_jit(lambda m, x: m(x))
    closed_over = frozenconst.filter_jit(lambda x: model(x))
    np.testing.assert_allclose(as_argument(model, x), eqx.filter_jit(lambda m, x: m(x))(model, x), rtol=1e-6)
    if SIMPLIFIED:
        # JAX passes what a function closes over to the executable: nothing is embedded.
        np.testing.assert_allclose(closed_over(x), model(x), rtol=1e-6)
        assert _program_bytes(closed_over.lower(x)) < data.nbytes
    else:
        with pytest.warns(FrozenConstWarning, match=r"closes over a jax.Array float32\[32, 64\]"):
            # The MLP's own weights, closed over: embedded, as jax.jit embeds them, and said once.
            np.testing.assert_allclose(closed_over(x), model(x), rtol=1e-6)
        # eqx.filter_jit keeps the table out too (every jit does): its program is the same size.
        by_equinox = _program_bytes(eqx.filter_jit(lambda x: model(x)).lower(x))
        assert by_equinox < data.nbytes
        assert abs(_program_bytes(closed_over.lower(x)) - by_equinox) < 1024
    assert _program_bytes(as_argument.lower(model, x)) < 4000
    assert live_copies(data) == 1


def test_filter_jit_returns_a_constant_it_received_as_itself_and_others_as_jax_does():
    data = unique_data((32, 32))
    table = FrozenConst(data)
    calls = []

    @frozenconst.filter_jit
    def f(tree, scale):
        calls.append(scale)
        return {"same": tree["t"], "scaled": tree["t"] * scale, "name": tree["name"], "n": scale}

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = f({"t": table, "name": "a"}, 2.0)
        again = f({"t": FrozenConst(unique_data((32, 32))), "name": "a"}, 2.0)
    assert out["same"] is table and out["name"] == "a" and out["n"] == 2.0
    np.testing.assert_allclose(np.asarray(out["scaled"]), data * 2)
    assert again["same"] is not table and again["same"].is_concrete  # the call's own, by position
    assert len(calls) == 1  # one trace: constants of one shape share the program
    f({"t": table, "name": "a"}, 3.0)
    assert len(calls) == 2  # a new static value traces anew, as in eqx.filter_jit
    assert live_copies(data) == 1
    with pytest.raises(frozenconst.FrozenConstTypeError, match="hashable"):
        f({"t": table, "name": {1, 2}}, 2.0)


def test_filter_jit_traces_once_for_a_static_leaf_unequal_to_itself():
    # A NaN among the static leaves (`{"pad": float("nan")}`) must not compile anew at every call,
    # as static halves compared with `==` alone would: jax.jit with the same object static, and
    # eqx.filter_jit, trace once.
    table = FrozenConst(unique_data((16, 16)))
    model = {"t": table, "scale": 2.0, "pad": float("nan")}
    traces = {"ours": 0, "equinox": 0, "jax.jit": 0}

    def apply(name):
        def f(m, x):
            traces[name] += 1
            return m["t"] @ x * m["scale"]

        return f

    ours, theirs = frozenconst.filter_jit(apply("ours")), eqx.filter_jit(apply("equinox"))
    static = jax.jit(lambda h, t, x: apply("jax.jit")({"t": t, **h.leaves}, x), static_argnums=0)
    x = jnp.ones(16)

    class Held:  # a static argument of jax.jit, hashed and compared as JAX does: by identity
        def __init__(self, leaves):
            self.leaves = leaves

    held = Held({"scale": 2.0, "pad": model["pad"]})
    for _ in range(5):
        np.testing.assert_allclose(np.asarray(ours(model, x)), np.asarray(theirs(model, x)), rtol=1e-6)
        static(held, table, x)
    assert traces == {"ours": 1, "equinox": 1, "jax.jit": 1}, traces


def test_equinox_serialisation_round_trips_keep_or_give_back_the_constant(tmp_path):
    data = unique_data((16, 8))
    table = FrozenConst(data)
    model = _EqxModel(table, eqx.nn.Linear(8, 2, key=jax.random.key(0)))
    # As equinox's docs write it: the loaded model holds a copy, said at the loading line.
    eqx.tree_serialise_leaves(tmp_path / "plain.eqx", model)
    with pytest.warns(FrozenConstWarning, match=DERIVED) as caught:
        loaded = eqx.tree_deserialise_leaves(tmp_path / "plain.eqx", model)
    assert caught[0].filename == __file__ and not loaded.emb.is_concrete
    restored = frozenconst.restore(model, loaded)
    assert restored.emb is table
    np.testing.assert_array_equal(np.asarray(restored.lin.weight), np.asarray(model.lin.weight))
    # `is_leaf` alone: equinox's default deserialiser takes the constant for a scalar.
    eqx.tree_serialise_leaves(tmp_path / "leaf.eqx", model, is_leaf=frozenconst.is_frozen)
    with pytest.raises(Exception, match="emb"):
        eqx.tree_deserialise_leaves(tmp_path / "leaf.eqx", model, is_leaf=frozenconst.is_frozen)

    # The two filter specs of docs/checkpoints.md: nothing written for it, the template's restored.
    def save(f, x):
        return None if frozenconst.is_frozen(x) else eqx.default_serialise_filter_spec(f, x)

    def load(f, x):
        return x if frozenconst.is_frozen(x) else eqx.default_deserialise_filter_spec(f, x)

    eqx.tree_serialise_leaves(tmp_path / "spec.eqx", model, filter_spec=save, is_leaf=frozenconst.is_frozen)
    assert (tmp_path / "spec.eqx").stat().st_size < data.nbytes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = eqx.tree_deserialise_leaves(
            tmp_path / "spec.eqx", model, filter_spec=load, is_leaf=frozenconst.is_frozen
        )
    assert again.emb is table
    del loaded, caught  # the copy the plain round trip made
    _untouched(table, data)
