"""The serialisation and test tools JAX users already call, on models that hold constants.

flax's `to_bytes`/`from_bytes`, equinox's `tree_serialise_leaves` (with the
filter that skips constants, docs/checkpoints.md), chex's tree comparisons
(docs/testing.md), and a dtype probe that prints nothing.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TIMEOUT_S, enable_x64, run_bounded, subprocess_env

import frozenconst
from frozenconst import FrozenConst

# -- flax.serialization ------------------------------------------------------------


def _run(code):
    return run_bounded([sys.executable, "-c", textwrap.dedent(code)], env=subprocess_env(), timeout=TIMEOUT_S)


@pytest.mark.subprocess
def test_flax_learns_constants_at_import_when_flax_came_first_and_never_imports_it():
    pytest.importorskip("flax")
    rc, out = _run(
        """
        import sys
        import numpy as np
        import frozenconst
        assert "flax" not in sys.modules, "frozenconst imported flax"
        from flax import serialization
        x = frozenconst.FrozenConst(np.arange(3.0))
        try:
            serialization.to_bytes({"t": x})
        except TypeError as err:
            print("refused before register_flax:", err)
        frozenconst.register_flax()
        frozenconst.register_flax()  # again: nothing happens
        assert serialization.from_bytes({"t": x}, serialization.to_bytes({"t": x}))["t"] is x
        print("after register_flax: ok")
        """
    )
    assert rc == 0, out
    assert "refused before register_flax: can not serialize 'FrozenConst' object" in out
    assert "after register_flax: ok" in out
    rc, out = _run(
        """
        import numpy as np
        import flax.serialization as serialization
        import frozenconst
        x = frozenconst.FrozenConst(np.arange(3.0))
        print(serialization.msgpack_restore(serialization.to_bytes({"t": x})))
        """
    )
    assert rc == 0, out
    assert "'t': array([0., 1., 2.], dtype=float32)" in out  # the host data, held as jnp.asarray holds it


@pytest.fixture
def serialization():
    flax_serialization = pytest.importorskip("flax.serialization")
    frozenconst.register_flax()
    return flax_serialization


@pytest.mark.parametrize("x64", [False, True])
def test_flax_bytes_round_trip_as_a_jax_array_does(serialization, x64):
    data = np.random.default_rng(0).normal(size=(4, 3))
    with enable_x64(x64):
        x = FrozenConst(data)
        array = jnp.asarray(data)
        # A linen-style variables dict: trainable parameters beside a collection of constants.
        variables = {"params": {"w": jnp.ones(3)}, "constants": {"table": x, "mask": FrozenConst(data > 0)}}
        payload = serialization.to_bytes(variables)
        # The same bytes restore as a template's jax.Array and as its FrozenConst.
        like = {"params": {"w": jnp.ones(3)}, "constants": {"table": array, "mask": array > 0}}
        from_array = serialization.from_bytes(like, payload)
        # The constant holds what the jax.Array holds (float32 without x64): the same bytes saved.
        # Where the device's float64 is not IEEE's (a TPU emulates it, and rounds), the jax.Array
        # reads back rounded; the constant saves its host copy, the data itself.
        held = np.asarray(array)
        if not np.array_equal(held, data.astype(held.dtype)):
            held = data.astype(held.dtype)
        np.testing.assert_array_equal(from_array["constants"]["table"], held, strict=True)
        restored = serialization.from_bytes(variables, payload)
        # The template's own constants come back, the same objects (one device buffer each).
        assert restored["constants"]["table"] is x
        assert restored["constants"]["mask"] is variables["constants"]["mask"]
        np.testing.assert_array_equal(restored["params"]["w"], np.ones(3))
        # Into a template holding other data: a new constant of the restored data, bit for bit.
        other = {"params": {"w": jnp.zeros(3)}, "constants": {"table": FrozenConst(data + 1), "mask": x}}
        fresh = serialization.from_bytes(other, payload)["constants"]["table"]
        assert isinstance(fresh, FrozenConst) and fresh is not x
        assert fresh.host_dtype == array.dtype and fresh.fingerprint == x.fingerprint
        # State dicts hold the host data, as they hold a NumPy array's (unrounded on a TPU too).
        state = serialization.to_state_dict(variables)
        assert isinstance(state["constants"]["table"], np.ndarray)
        np.testing.assert_array_equal(state["constants"]["table"], held, strict=True)
        assert serialization.from_state_dict(variables, state)["constants"]["table"] is x


# -- equinox -----------------------------------------------------------------------


def _eqx_model():
    eqx = pytest.importorskip("equinox")

    class Model(eqx.Module):
        weight: jax.Array
        table: FrozenConst

        def __call__(self, v):
            return self.table @ (self.weight * v)

    table = FrozenConst(np.random.default_rng(1).normal(size=(256, 64)).astype(np.float32))
    return eqx, Model(jnp.full(64, 0.5), table)


def _save_spec(f, x):
    import equinox as eqx

    return None if frozenconst.is_frozen(x) else eqx.default_serialise_filter_spec(f, x)


def _load_spec(f, x):
    import equinox as eqx

    return x if frozenconst.is_frozen(x) else eqx.default_deserialise_filter_spec(f, x)


def test_equinox_serialise_leaves_recipe_skips_constants_and_restores_them(tmp_path):
    eqx, model = _eqx_model()
    path = tmp_path / "model.eqx"
    trained = eqx.tree_at(lambda m: m.weight, model, jnp.arange(64.0))
    eqx.tree_serialise_leaves(path, trained, filter_spec=_save_spec, is_leaf=frozenconst.is_frozen)
    # The file holds the trainable weight only: 64 float32 values plus headers.
    assert os.path.getsize(path) < model.table.stats().host_bytes / 16
    restored = eqx.tree_deserialise_leaves(path, model, filter_spec=_load_spec, is_leaf=frozenconst.is_frozen)
    assert restored.table is model.table  # the constant itself, not a derived copy
    np.testing.assert_array_equal(restored.weight, np.arange(64.0))
    np.testing.assert_array_equal(restored(jnp.ones(64)), trained(jnp.ones(64)))


# -- chex --------------------------------------------------------------------------


def test_chex_compares_a_tree_of_constants_once_they_are_arrays():
    chex = pytest.importorskip("chex")
    reference = {"a": np.arange(6.0).reshape(2, 3), "b": np.ones(2, np.int32)}
    tree = {"a": FrozenConst(reference["a"]), "b": FrozenConst(reference["b"])}
    with pytest.raises(AssertionError, match="tree structs"):
        chex.assert_trees_all_close(tree, reference)
    as_arrays = jax.tree.map(jnp.asarray, tree, is_leaf=frozenconst.is_frozen)
    chex.assert_trees_all_close(as_arrays, reference)
    chex.assert_trees_all_equal_shapes_and_dtypes(as_arrays, jax.tree.map(jnp.asarray, reference))
    with pytest.raises(AssertionError):
        chex.assert_trees_all_close(as_arrays, {**reference, "a": reference["a"] + 1})


# -- JAX's own test harness ------------------------------------------------------------


@pytest.mark.subprocess
def test_jaxs_test_harness_sees_no_config_value_of_frozenconst_appear():
    # JAX's harness (`JaxTestCase.setUp`) compares `jax.config.values` around every test; here it
    # wraps frozenconst's import (which pytest's entry points do at a test's first use), and
    # programs that take constants as parameters, nested uses among them.
    source = """
        import jax, jax.numpy as jnp, numpy as np
        from jax import lax
        from jax._src import test_util
        before = dict(jax.config.values)
        with test_util.assert_global_configs_unchanged():
            import frozenconst
            table = frozenconst.FrozenConst(np.arange(64.0, dtype=np.float32).reshape(8, 8))
            f = frozenconst.jit(lambda x: lax.scan(lambda c, _: (c + table @ x, None), x, None, length=2)[0])
            f(jnp.ones(8)).block_until_ready()
            frozenconst.jit(lambda x: jax.jit(lambda y: table @ y)(x), embed_max_bytes=0)(jnp.ones(8))
        assert dict(jax.config.values) == before
        print("unchanged", sorted(k for k in jax.config.values if "frozenconst" in k))
        """
    code, out = _run(source)
    assert code == 0, out[-3000:]
    assert "unchanged []" in out, out[-3000:]


# -- the dtype probe ---------------------------------------------------------------


@pytest.mark.subprocess
def test_probing_an_untransferable_dtype_prints_nothing():
    code = """
        import numpy as np, ml_dtypes, jax
        import frozenconst
        from frozenconst.strategies import jax_dtypes
        from hypothesis import given, settings
        assert hasattr(ml_dtypes, "int1")
        try:
            frozenconst.FrozenConst(np.zeros(2, ml_dtypes.int1))
            print("int1 held")
        except frozenconst.FrozenConstTypeError:
            print("int1 refused")
        @settings(max_examples=5, database=None)
        @given(jax_dtypes(exotic=True))
        def draw(dtype):
            pass
        draw()
        """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "int1 " in proc.stdout
    for line in ("INVALID_ARGUMENT", "RuntimeProgramInputMismatch"):
        assert line not in proc.stderr, proc.stderr


def test_a_probe_keeps_what_others_write_unless_it_fails(capfd):
    # The dtype probes run once a process, before a test can watch: their stderr holding alone.
    from frozenconst._dtypes import _held_stderr

    with _held_stderr() as release:
        os.write(2, b"kept line\n")
        release()
    with _held_stderr():
        os.write(2, b"dropped line\n")
    err = capfd.readouterr().err
    assert "kept line" in err and "dropped line" not in err
