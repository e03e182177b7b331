"""A static slice of a large constant under plain `jax.jit` (a Whisper decoder's causal mask).

NumPy slices a NumPy buffer at trace time, so `jax.jit` embeds only the slice;
a FrozenConst, like a `jax.Array`, is sliced in the program, so under JAX's
default pipeline the whole table is embedded. docs/jit.md ("Static slices of a
large table") says which way to write it; `frozenconst.audit` names it. Measured
by HLO size against the NumPy original.
"""

import json
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


def test_a_static_slice_embeds_the_whole_table_under_jax_jit_and_what_to_write_instead():
    mask = _mask()
    x = FrozenConst(mask)
    numpy_original = _hlo_bytes(jax.jit(_decoder(mask)), SCORES)
    as_is = _hlo_bytes(jax.jit(_decoder(x)), SCORES)
    # The FrozenConst (like a jax.Array) is embedded whole: more than the mask's
    # 200704 values, where the NumPy original embeds 35.
    assert as_is > 5 * numpy_original
    assert as_is > N_CTX * N_CTX
    assert _hlo_bytes(jax.jit(_decoder(jnp.asarray(mask))), SCORES) == pytest.approx(as_is, rel=0.01)
    # The two ways docs/jit.md gives: frozenconst.jit (a parameter, nothing embedded),
    # or the host data sliced at trace time, as NumPy did (a read-only view, no copy).
    assert _hlo_bytes(frozenconst.jit(_decoder(x)), SCORES) < numpy_original
    host_view = _hlo_bytes(jax.jit(_decoder(np.asarray(x))), SCORES)
    assert host_view == numpy_original
    # Same results every way.
    scores = jnp.linspace(-1.0, 1.0, 2 * Q * K).reshape(1, 2, Q, K)
    expected = jax.jit(_decoder(mask))(scores)
    for fn in (jax.jit(_decoder(x)), frozenconst.jit(_decoder(x)), jax.jit(_decoder(np.asarray(x)))):
        np.testing.assert_array_equal(fn(scores), expected)


def test_audit_names_a_constant_read_only_through_a_static_slice():
    x = FrozenConst(_mask())
    report = frozenconst.audit(jax.jit(_decoder(x)), SCORES)
    (captured,) = [c for c in report.constants if c.kind == "frozenconst"]
    assert captured.nbytes == x.nbytes and captured.sliced_bytes == Q * K * 4
    (line,) = [line for line in report.lines() if line.startswith("frozenconst")]
    assert "static slice of 140 B" in line and "`frozenconst.jit`" in line and "np.asarray(x)[...]" in line
    assert report.to_dict()["constants"][0]["sliced_bytes"] == Q * K * 4
    # The ways docs/jit.md gives leave nothing to say.
    assert not frozenconst.audit(frozenconst.jit(_decoder(x)), SCORES).lines()
    assert not frozenconst.audit(jax.jit(_decoder(np.asarray(x))), SCORES).lines()


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
    # text (jax 0.6.2 packs the bits; 0.10.2 prints a byte per value, 5.2x in all).
    whole_mask = N_CTX * N_CTX // 8 * 2
    assert hlo["FrozenConst"] == hlo["jax.Array"] >= hlo["frozenconst.jit"] + whole_mask
    assert hlo["frozenconst.jit"] < hlo["numpy"]
    assert hlo["host slice"] == pytest.approx(hlo["numpy"], rel=0.01)
    # The stamp every results file carries (`benchmarks._harness.environment`).
    stamp = result["environment"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", stamp["date"]), stamp
    assert stamp["jax"] == jax.__version__ and stamp["numpy"] == np.__version__ and stamp["cpu"]
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode == 0:
        commit = stamp["frozenconst"].split(" at ")[1]
        assert commit.removesuffix("-dirty") == head.stdout.strip(), stamp
