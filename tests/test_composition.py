"""frozenconst.jit composes like `jax.jit`: under transformations, on one device or two,
returning constants, exported and copied."""

import copy
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from composition_cases import *  # noqa: F403 - the cases, run here on this process's devices
from helpers import run_bounded, subprocess_env, unique_data
from jax import export  # a submodule: not an attribute of `jax` before it is imported (jax 0.6.2)

import frozenconst
from frozenconst import FrozenConst

HERE = pathlib.Path(__file__).resolve().parent


# Each case runs under the pipeline its parameter sets for the child, whatever
# this process runs under: make test runs it in the default-pipeline pass only.
@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.pipeline_independent
@pytest.mark.parametrize("pipeline", ["default", "simplified"])
def test_the_composition_cases_on_two_devices(pipeline):
    if pipeline == "simplified" and not hasattr(jax.config, "jax_use_simplified_jaxpr_constants"):
        pytest.skip(f"jax {jax.__version__} has one constant pipeline")
    env = subprocess_env("cpu")  # two CPU devices
    env["FROZENCONST_CPU_DEVICES"] = "2"
    env["JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS"] = "1" if pipeline == "simplified" else "0"
    code, out = run_bounded(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "composition_cases.py")],
        env=env,
        cwd=HERE,
    )
    assert code == 0, out[-6000:]
    assert " passed" in out and "failed" not in out and "skipped" not in out


# -- a constant the function returns ------------------------------------------------------------


def _returning(big):
    def fun(w):
        return {"t": big}, jnp.sum(big @ w)

    return fun


def test_a_returned_constant_is_not_embedded_and_is_what_jax_jit_returns():
    big = FrozenConst(unique_data((512, 512)))  # 1 MiB
    w = jnp.ones(512)
    fun = _returning(big)
    ours = frozenconst.jit(fun)
    as_argument = jax.jit(lambda b, w: ({"t": b}, jnp.sum(b @ w)))
    hlo = len(ours.lower(w).as_text())
    hlo_as_argument = len(as_argument.lower(jnp.asarray(big), w).as_text())
    assert abs(hlo - hlo_as_argument) <= 0.01 * big.nbytes, (hlo, hlo_as_argument)

    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        # What a jitted function returns is a new buffer: a derived copy, said, as from jax.jit.
        (got_tree, got_sum), (want_tree, want_sum) = ours(w), jax.jit(fun)(w)
    assert type(got_tree["t"]) is type(want_tree["t"]) is FrozenConst
    assert jax.tree.structure(got_tree) == jax.tree.structure(want_tree)
    np.testing.assert_array_equal(np.asarray(got_tree["t"]), np.asarray(big))
    np.testing.assert_allclose(np.asarray(got_sum), np.asarray(want_sum), rtol=1e-5)


def test_a_returned_constant_inside_nested_containers_and_beside_a_derived_one():
    big = FrozenConst(unique_data((64, 64)))

    def fun(w):
        return [big, (big * 2, {"again": big})], big @ w

    w = jnp.ones(64)
    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        got, want = frozenconst.jit(fun)(w), jax.jit(fun)(w)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6), got, want)
    assert len(frozenconst.jit(fun, embed_max_bytes=0).lower(w).as_text()) < big.nbytes


# -- what else jax.jit offers -------------------------------------------------------------------


_EXPORTED_RUNNER = """
import json, sys, numpy as np, jax, jax.numpy as jnp
from jax import export

exported = export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
print(json.dumps(np.asarray(exported.call(jnp.ones(256, jnp.float32))).tolist()))
"""


@pytest.mark.subprocess
def test_jax_export_serializes_a_program_that_carries_its_constants(tmp_path):
    table = FrozenConst(unique_data((64, 256)))
    fun = frozenconst.jit(lambda w: jnp.tanh(table @ w))
    spec = jax.ShapeDtypeStruct((256,), jnp.float32)
    with pytest.warns(frozenconst.FrozenConstWarning, match="exported program carries its constants"):
        exported = export.export(fun)(spec)
    with pytest.warns(frozenconst.FrozenConstWarning, match="exported program carries its constants"):
        reference = export.export(jax.jit(lambda w: jnp.tanh(table @ w)))(spec)
    assert exported.in_avals == reference.in_avals
    w = jnp.ones(256, jnp.float32)
    np.testing.assert_allclose(np.asarray(exported.call(w)), np.asarray(fun(w)), rtol=1e-6)

    blob = tmp_path / "exported.bin"
    blob.write_bytes(exported.serialize())
    script = tmp_path / "run_exported.py"
    script.write_text(_EXPORTED_RUNNER)
    code, out = run_bounded([sys.executable, str(script), str(blob)], env=subprocess_env())
    assert code == 0, out[-4000:]
    got = np.asarray(json.loads(out.strip().splitlines()[-1]), np.float32)
    np.testing.assert_allclose(got, np.asarray(fun(w)), rtol=1e-6)
    # After export, the function still keeps its constants out of its own programs.
    assert len(fun.lower(w).as_text()) < table.nbytes


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_frozenconst_jit_function_copies_as_jax_jit_functions_do(copier):
    table = FrozenConst(unique_data((64, 64)))
    fun = frozenconst.jit(lambda w: table @ w, static_argnames=())
    w = jnp.ones(64)
    before = fun(w)
    copied = copier(fun)
    assert copied is not fun and type(copied) is type(fun)
    np.testing.assert_array_equal(np.asarray(copied(w)), np.asarray(before))
    assert copied.__wrapped__ is fun.__wrapped__ or copier is copy.deepcopy
    assert len(copied.lower(w).as_text()) < table.nbytes
