"""Checkpoints of models holding constants, with orbax: the constant is never written, and
restoring gives back the real constant (not a derived copy), for flax NNX and equinox."""

import equinox as eqx
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from helpers import live_copies, unique_data
from hypothesis import strategies as st

import frozenconst
from frozenconst import FrozenConst


def _size(path):
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _save(path, tree):
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, tree)
        checkpointer.wait_until_finished()


def _restore(path, target):
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(path, target)


class _Net(nnx.Module):
    def __init__(self, table, rngs):
        self.table = nnx.data(table)
        self.lin = nnx.Linear(64, 4, rngs=rngs)
        self.count = nnx.BatchStat(jnp.zeros((), jnp.int32))  # non-parameter state is saved too

    def __call__(self, x):
        return self.lin(x @ self.table)


def test_flax_nnx_checkpoint_without_the_constant_restores_the_real_constant(tmp_path):
    data = unique_data((1024, 64))  # 256 KiB: far more than the parameters
    table = FrozenConst(data)
    model = _Net(table, nnx.Rngs(0))
    model.lin.kernel[...] = model.lin.kernel[...] + 1.0  # "trained": differs from a fresh init
    model.count[...] = 7
    _save(tmp_path / "full", nnx.state(model))  # the usual recipe: writes the constant too
    _save(tmp_path / "vars", nnx.state(model, nnx.Variable))  # Variables only: the constant is data

    abstract = nnx.eval_shape(lambda: _Net(table, nnx.Rngs(1)))
    graphdef, abstract_vars = nnx.split(abstract)
    # The abstract model's constant is a shape placeholder that NNX's state
    # leaves out, so the usual restore target lacks what the full checkpoint has.
    with pytest.raises(ValueError, match="tree structures do not match"):
        _restore(tmp_path / "full", abstract_vars)

    restored = nnx.merge(graphdef, _restore(tmp_path / "vars", abstract_vars))
    restored.table = table  # the constants go back in as they went in at construction
    assert restored.table is table
    np.testing.assert_array_equal(np.asarray(restored.lin.kernel[...]), np.asarray(model.lin.kernel[...]))
    assert int(restored.count[...]) == 7
    assert live_copies(data) == 1
    np.testing.assert_allclose(restored(jnp.ones((2, 1024))), model(jnp.ones((2, 1024))), rtol=1e-6)
    # orbax compresses, but random floats barely: the constant is most of the full checkpoint.
    assert (
        _size(tmp_path / "vars")
        < data.nbytes / 4
        < data.nbytes / 2
        < _size(tmp_path / "full") - _size(tmp_path / "vars")
    )


class _Model(eqx.Module):
    table: FrozenConst
    lin: eqx.nn.Linear
    step: jax.Array  # integer state: saved too

    def __call__(self, x):
        return self.lin(x @ self.table)


def test_equinox_checkpoint_without_the_constant_restores_the_real_constant(tmp_path):
    data = unique_data((1024, 64))
    table = FrozenConst(data)
    model = _Model(table, eqx.nn.Linear(64, 4, key=jax.random.key(0)), jnp.array(7, jnp.int32))
    # is_leaf stops at the constant: flattened, it is a jax.Array that eqx.is_array accepts.
    arrays, rest = eqx.partition(model, eqx.is_array, is_leaf=frozenconst.is_frozen)
    assert arrays.table is None and rest.table is table
    _save(tmp_path / "arrays", arrays)
    _save(tmp_path / "full", jax.tree_util.tree_map(jnp.asarray, model, is_leaf=frozenconst.is_frozen))

    like = _Model(table, eqx.nn.Linear(64, 4, key=jax.random.key(1)), jnp.array(0, jnp.int32))
    like_arrays, like_rest = eqx.partition(like, eqx.is_array, is_leaf=frozenconst.is_frozen)
    restored = eqx.combine(_restore(tmp_path / "arrays", like_arrays), like_rest)
    assert restored.table is table
    np.testing.assert_array_equal(np.asarray(restored.lin.weight), np.asarray(model.lin.weight))
    assert int(restored.step) == 7
    assert live_copies(data) == 1
    assert (
        _size(tmp_path / "arrays")
        < data.nbytes / 4
        < data.nbytes / 2
        < _size(tmp_path / "full") - _size(tmp_path / "arrays")
    )


# -- one call: frozenconst.restore ------------------------------------------------


def _check_one_buffer_and_the_constant_itself(restored, table, data):
    # The very object: a derived copy (a FrozenConst rebuilt around the restored
    # or placeholder leaf) or a new handle would not be `table`.
    assert restored.table is table
    assert restored.table.is_concrete
    # One device buffer holds the data, as JAX sees it: no copy was made on the way.
    assert live_copies(data) == 1


@pytest.mark.parametrize("target", ["concrete", "abstract"])
def test_flax_nnx_restores_in_one_call_with_the_real_constant(tmp_path, target):
    data = unique_data((1024, 64))
    table = FrozenConst(data)
    model = _Net(table, nnx.Rngs(0))
    model.lin.kernel[...] = model.lin.kernel[...] + 1.0
    model.count[...] = 7
    _save(tmp_path / "vars", nnx.state(model, nnx.Variable))
    _save(tmp_path / "full", nnx.state(model))

    template = _Net(table, nnx.Rngs(1))  # the real constant; parameters to be overwritten
    if target == "concrete":
        like = nnx.state(template, nnx.Variable)
    else:  # NNX's abstract restore target: shapes only, no memory for the parameters
        like = nnx.split(nnx.eval_shape(lambda: _Net(table, nnx.Rngs(1))))[1]
    restored = frozenconst.restore(template, _restore(tmp_path / "vars", like))

    _check_one_buffer_and_the_constant_itself(restored, table, data)
    np.testing.assert_array_equal(np.asarray(restored.lin.kernel[...]), np.asarray(model.lin.kernel[...]))
    assert int(restored.count[...]) == 7
    assert int(template.count[...]) == 0  # the template is left as it was
    np.testing.assert_allclose(restored(jnp.ones((2, 1024))), model(jnp.ones((2, 1024))), rtol=1e-6)
    assert _size(tmp_path / "vars") < data.nbytes / 4 < data.nbytes / 2 < _size(tmp_path / "full")


def test_flax_nnx_a_model_merged_from_the_abstract_restore_gets_its_constant_back(tmp_path):
    # NNX's usual recipe ends in nnx.merge, whose model holds a shape placeholder
    # (a FrozenConst derived from a ShapeDtypeStruct) where the constant was.
    data = unique_data((1024, 64))
    table = FrozenConst(data)
    model = _Net(table, nnx.Rngs(0))
    model.count[...] = 3
    _save(tmp_path / "vars", nnx.state(model, nnx.Variable))
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: _Net(table, nnx.Rngs(1))))
    merged = nnx.merge(graphdef, _restore(tmp_path / "vars", abstract))
    assert not merged.table.is_concrete  # the placeholder
    restored = frozenconst.restore(_Net(table, nnx.Rngs(2)), merged)
    _check_one_buffer_and_the_constant_itself(restored, table, data)
    assert int(restored.count[...]) == 3
    np.testing.assert_array_equal(np.asarray(restored.lin.kernel[...]), np.asarray(model.lin.kernel[...]))


def test_equinox_restores_in_one_call_with_the_real_constant(tmp_path):
    data = unique_data((1024, 64))
    table = FrozenConst(data)
    model = _Model(table, eqx.nn.Linear(64, 4, key=jax.random.key(0)), jnp.array(7, jnp.int32))
    _save(tmp_path / "arrays", eqx.filter(model, eqx.is_array, is_leaf=frozenconst.is_frozen))
    _save(tmp_path / "full", jax.tree_util.tree_map(jnp.asarray, model, is_leaf=frozenconst.is_frozen))

    template = _Model(table, eqx.nn.Linear(64, 4, key=jax.random.key(1)), jnp.array(0, jnp.int32))
    like = eqx.filter(template, eqx.is_array, is_leaf=frozenconst.is_frozen)
    restored = frozenconst.restore(template, _restore(tmp_path / "arrays", like))

    _check_one_buffer_and_the_constant_itself(restored, table, data)
    np.testing.assert_array_equal(np.asarray(restored.lin.weight), np.asarray(model.lin.weight))
    assert int(restored.step) == 7
    np.testing.assert_allclose(restored(jnp.ones(1024)), model(jnp.ones(1024)), rtol=1e-6)
    assert _size(tmp_path / "arrays") < data.nbytes / 4 < data.nbytes / 2 < _size(tmp_path / "full")


def test_restore_says_what_differs_between_the_restored_tree_and_the_template():
    table = FrozenConst(np.ones((4, 2), np.float32))
    template = {"w": jnp.zeros((2, 3)), "table": table, "step": jnp.zeros((), jnp.int32)}
    with pytest.raises(
        frozenconst.FrozenConstValueError, match=r"`w` is float32\[2, 3\].*restored: float32\[3\]"
    ):
        frozenconst.restore(template, {"w": jnp.zeros(3)})
    with pytest.raises(
        frozenconst.FrozenConstValueError, match=r"`step` is int32\[\].*restored: float32\[\]"
    ):
        frozenconst.restore(template, {"step": jnp.zeros(())})
    with pytest.raises(
        frozenconst.FrozenConstValueError, match=r"`bias` \(float32\[2\].*is not in the template"
    ):
        frozenconst.restore(template, {"w": jnp.ones((2, 3)), "bias": jnp.zeros(2)})
    with pytest.raises(
        frozenconst.FrozenConstValueError, match=r"`table` is the constant .*\[4, 2\].*restored: .*\[5\]"
    ):
        frozenconst.restore(template, {"table": jnp.zeros(5)})
    # A dict restored for a model: the names match, the kinds of keys need not.
    out = frozenconst.restore(template, {"w": jnp.ones((2, 3)), "table": None})
    assert out["table"] is table and out["step"] is template["step"]


@hypothesis.given(
    st.recursive(
        st.sampled_from(["array", "int", "constant", "function", "none"]),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
        ),
        max_leaves=8,
    ),
    st.booleans(),
)
@hypothesis.settings(max_examples=40, deadline=None)
def test_restore_keeps_constants_and_takes_every_restored_leaf(shape, drop_others):
    counter = iter(range(1000))

    def build(spec):
        if isinstance(spec, list):
            return [build(s) for s in spec]
        if isinstance(spec, dict):
            return {k: build(v) for k, v in spec.items()}
        n = next(counter)
        return {
            "array": lambda: jnp.full((2,), float(n)),
            "int": lambda: jnp.array(n, jnp.int32),
            "constant": lambda: FrozenConst(np.full((3,), n, np.float32)),
            "function": lambda: jnp.tanh,
            "none": lambda: None,
        }[spec]()

    template = build(shape)
    # What a checkpoint gives back: new arrays, nothing for constants and functions.
    restored = jax.tree_util.tree_map(
        lambda x: None if isinstance(x, FrozenConst) or callable(x) else x + 1,
        template,
        is_leaf=frozenconst.is_frozen,
    )
    if drop_others:  # a partial restore: the template's own leaves stay
        restored = jax.tree_util.tree_map(lambda x: None, restored)
    out = frozenconst.restore(template, restored)
    flat_t = jax.tree_util.tree_leaves(template, is_leaf=frozenconst.is_frozen)
    flat_r = jax.tree_util.tree_leaves(restored, is_leaf=frozenconst.is_frozen)
    flat_o, tree_o = jax.tree_util.tree_flatten(out, is_leaf=frozenconst.is_frozen)
    assert tree_o == jax.tree_util.tree_structure(template, is_leaf=frozenconst.is_frozen)
    taken = iter(flat_r)
    for t, o in zip(flat_t, flat_o, strict=True):
        if isinstance(t, FrozenConst) or callable(t) or drop_others:
            assert o is t
        else:
            assert o is next(taken)


def test_a_restore_that_copies_a_constant_names_each_users_line(tmp_path):
    # orbax restores through `asyncio`: the copy warning must name each user's line, never
    # `asyncio/events.py`, so that a second line is told too.
    import warnings

    tree = {"w": jnp.ones(4), "t": FrozenConst(unique_data((8,)))}
    _save(tmp_path / "a", tree)
    with ocp.StandardCheckpointer() as checkpointer, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        first = checkpointer.restore(tmp_path / "a", tree)  # one line
        second = checkpointer.restore(tmp_path / "a", tree)  # another
    told = [w for w in caught if issubclass(w.category, frozenconst.FrozenConstWarning)]
    assert [(w.filename, w.lineno) for w in told] == [
        (__file__, told[0].lineno),
        (__file__, told[0].lineno + 1),
    ], [(w.filename, w.lineno) for w in told]
    for restored in (first, second):
        np.testing.assert_array_equal(np.asarray(restored["t"]), np.asarray(tree["t"]))
