"""A static slice of a large constant under plain `jax.jit` (a Whisper decoder's causal mask).

NumPy slices a NumPy buffer at trace time, so `jax.jit` embeds only the slice. A
FrozenConst is a parameter of the program, sliced there: the program holds no data
at all, smaller than the NumPy original's, and the device holds the constant once,
shared by every program. A `jax.Array` is sliced in the program, and under JAX's
default pipeline the whole table is embedded: `frozenconst.audit` names that.
Measured by HLO size against the NumPy original.
"""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ROOT, SIMPLIFIED, run_bounded, subprocess_env

import frozenconst
from frozenconst import FrozenConst

N_CTX = 448
Q, K = 5, 7

pytestmark = pytest.mark.skipif(
    SIMPLIFIED, reason="the simplified pipeline embeds no constant: it passes the buffer as an argument"
)


def _mask():
    return np.tril(np.ones((N_CTX, N_CTX), np.float32))[None, None]


def _decoder(mask):
    def attend(scores):
        return jax.nn.softmax(scores + (1.0 - mask[:, :, :Q, :K]) * -1e9, axis=-1)

    return attend


def _hlo_bytes(fn, *args):
    return len(fn.lower(*args).as_text())


SCORES = jax.ShapeDtypeStruct((1, 2, Q, K), jnp.float32)


def test_a_static_slice_under_jax_jit_is_no_bigger_than_numpys():
    mask = _mask()
    x = FrozenConst(mask)
    numpy_original = _hlo_bytes(jax.jit(_decoder(mask)), SCORES)
    as_is = _hlo_bytes(jax.jit(_decoder(x)), SCORES)
    # The FrozenConst is a parameter, sliced in the program: none of the mask's 200704 values
    # embedded, where NumPy's slice embeds 35 (NumPy also computes `(1.0 - mask[...]) * -1e9`
    # on the host; the program holds those two operations, a few hundred bytes of text).
    assert as_is < numpy_original + 512
    same_expression = jax.jit(lambda s: s + x[:, :, :Q, :K])
    assert _hlo_bytes(same_expression, SCORES) <= _hlo_bytes(
        jax.jit(lambda s: s + mask[:, :, :Q, :K]), SCORES
    )
    (placement,) = x.placements  # the whole mask on the device, once, shared by every program
    assert sum(placement.device_bytes.values()) == mask.nbytes
    # A jax.Array is sliced in the program: the whole mask embedded.
    assert _hlo_bytes(jax.jit(_decoder(jnp.asarray(mask))), SCORES) > max(5 * numpy_original, N_CTX * N_CTX)
    # Under frozenconst.jit the mask is a parameter: nothing embedded.
    assert _hlo_bytes(frozenconst.jit(_decoder(x)), SCORES) < numpy_original
    # Same results every way.
    scores = jnp.linspace(-1.0, 1.0, 2 * Q * K).reshape(1, 2, Q, K)
    expected = jax.jit(_decoder(mask))(scores)
    for fn in (jax.jit(_decoder(x)), frozenconst.jit(_decoder(x)), jax.jit(_decoder(np.asarray(x)))):
        np.testing.assert_array_equal(fn(scores), expected)


def test_audit_names_a_jax_array_read_only_through_a_static_slice():
    x = jnp.asarray(_mask())
    report = frozenconst.audit(jax.jit(_decoder(x)), SCORES)
    (captured,) = [c for c in report.constants if c.kind == "jax"]
    assert captured.nbytes == x.nbytes and captured.sliced_bytes == Q * K * 4
    assert report.to_dict()["constants"][0]["sliced_bytes"] == Q * K * 4
    # A FrozenConst read so leaves nothing to say: a parameter of whatever jit compiles it.
    constant = FrozenConst(_mask())
    report = frozenconst.audit(jax.jit(_decoder(constant)), SCORES)
    (captured,) = report.constants
    assert captured.kind == "frozenconst" and captured.parameter and not report.lines()
    assert not frozenconst.audit(frozenconst.jit(_decoder(constant)), SCORES).lines()


def test_a_constant_read_whole_somewhere_is_not_called_sliced():
    x = FrozenConst(_mask())
    report = frozenconst.audit(jax.jit(lambda s: _decoder(x)(s) + x.sum()), SCORES)
    (captured,) = [c for c in report.constants if c.kind == "frozenconst"]
    assert captured.sliced_bytes is None
    assert not any("static slice" in line for line in report.lines())


@pytest.mark.subprocess
def test_the_whisper_stand_in_behind_the_docs_figures_shows_what_they_say():
    # docs/jit.md quotes `python -m benchmarks static-slices` (a Whisper decoder with
    # Whisper tiny's shapes): its worker, run as the benchmark runs it.
    code, out = run_bounded(
        [sys.executable, "-m", "benchmarks.static_slices", "--worker", "default"],
        env=subprocess_env(),
        cwd=ROOT,
    )
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    hlo = {r["variant"]: r["hlo_bytes"] for r in result["rows"]}
    # The boolean mask embedded whole: at least a bit per value, as hex digits in HLO
    # text (jax 0.6.2 packs the bits; 0.10.2 prints a byte per value).
    whole_mask = N_CTX * N_CTX // 8 * 2
    assert hlo["jax.Array"] >= hlo["frozenconst.jit"] + whole_mask
    # Sliced from the host data, as NumPy's is: the same data; NumPy also folds
    # `(1.0 - mask[...]) * -1e9` on the host, the program holds those few operations.
    assert hlo["FrozenConst"] < hlo["numpy"] + 1024
    assert hlo["frozenconst.jit"] < hlo["numpy"]
    assert hlo["host slice"] == pytest.approx(hlo["numpy"], rel=0.01)
    # The stamp every results file carries (`benchmarks._harness.environment`).
    stamp = result["environment"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", stamp["date"]), stamp
    assert stamp["jax"] == jax.__version__ and stamp["numpy"] == np.__version__ and stamp["cpu"]
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    # A copy whose commit is told (`make device`: `FROZENCONST_COMMIT`) is stamped with that one.
    told = os.environ.get("FROZENCONST_COMMIT", "").split(" ")[0]
    if told or head.returncode == 0:
        commit = stamp["frozenconst"].split(" at ")[1]
        assert commit.removesuffix("-dirty") == (told or head.stdout.strip()), stamp


@pytest.mark.subprocess
def test_a_smoke_run_leaves_the_published_results_alone(tmp_path):
    # `--quick` is a smoke run: its figures go to a folder of their own, never over the
    # docs/results files that the docs quote and tests/test_docs_claims.py checks.
    # The section measures both pipelines, the NumPy original's program included, which
    # jax 0.7 to 0.9 cannot lower under the simplified one: `helpers.raw_numpy_lowers`,
    # asked in a process of that pipeline.
    env = subprocess_env()
    env["JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env["PYTHONPATH"]])
    probe = "import sys, helpers; sys.exit(0 if helpers.raw_numpy_lowers() else 3)"
    code, out = run_bounded([sys.executable, "-c", probe], env=env, cwd=ROOT)
    assert code in (0, 3), out
    if code == 3:
        pytest.skip("this JAX cannot lower a NumPy closure under the simplified pipeline (jax 0.7 to 0.9)")
    results = ROOT / "docs" / "results"
    before = {p.name: p.read_bytes() for p in results.iterdir()}
    env = subprocess_env()
    env["TMPDIR"] = str(tmp_path)  # where `tempfile.mkdtemp` makes the smoke run's folder
    code, out = run_bounded(
        [sys.executable, "-m", "benchmarks", "static-slices", "--quick"], env=env, cwd=ROOT
    )
    assert code == 0, out
    assert {p.name: p.read_bytes() for p in results.iterdir()} == before
    (folder,) = tmp_path.glob("frozenconst-quick-*")
    assert str(folder) in out
    written = json.loads((folder / "static-slices-results.json").read_text())
    assert {r["variant"] for r in written["rows"]} >= {"numpy", "FrozenConst", "frozenconst.jit"}
