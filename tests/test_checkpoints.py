"""Checkpoints of models holding constants, with orbax: the constant is never written, and
restoring gives back the real constant (not a derived copy), for flax NNX and equinox."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from helpers import live_copies, unique_data

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
