"""The accelerator benchmark section at its small size, on whatever backend runs the suite.

`make device` runs `python -m benchmarks accelerator` on an accelerator; no CI machine has
one, so this runs the same section, small, as a user runs it (from the checkout's root,
in a bounded subprocess), and checks what it writes: the command cannot rot while no
device is available. Behaviour, not time: no figure here is a timing.
"""

import json
import sys

import jax
import pytest
from helpers import ROOT, SIMPLIFIED, on_cpu, run_bounded, simplified_copies_per_use, subprocess_env

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]  # the whole section, small: left out of test-fast


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    pytest.importorskip("matplotlib")  # the plot: the bench extra (.venv-py311), and the device image
    if SIMPLIFIED:
        pytest.skip("the section measures both constant pipelines in subprocesses of its own")
    out = tmp_path_factory.mktemp("accelerator")
    code, log = run_bounded(
        [sys.executable, "-m", "benchmarks", "accelerator", "--small", "--out", str(out)],
        timeout=280,
        env=subprocess_env(),
        cwd=ROOT,
    )
    assert code == 0, log[-6000:]
    return out, json.loads((out / "accelerator-results.json").read_text()), log


def test_the_files_name_where_and_when_they_were_measured(written):
    out, results, _ = written
    assert {p.name for p in out.iterdir()} == {
        "accelerator-results.md",
        "accelerator-results.json",
        "accelerator.png",
    }
    env = results["environment"]
    for key in ("device", "driver", "runtime", "jax", "jaxlib", "numpy", "date", "commit", "backend"):
        assert env.get(key), key
    assert env["jax"] == jax.__version__ and env["backend"] == jax.default_backend()
    text = (out / "accelerator-results.md").read_text()
    assert results["command"] == "python -m benchmarks accelerator --small" and results["command"] in text
    for key in ("device", "driver", "jax", "date", "commit"):
        assert f"- {key}: {env[key]}" in text


def test_the_seed_runs_every_variant_under_each_pipeline(written):
    _, results, _ = written
    layers, _mib = results["sizes"]["seed"]
    rows = {(r["pipeline"], r["variant"]): r for r in results["seed"]}
    pipelines = (
        {"default", "simplified"}
        if hasattr(jax.config, "jax_use_simplified_jaxpr_constants")
        else {"default"}
    )
    assert {p for p, _ in rows} == pipelines
    for (pipeline, variant), row in rows.items():
        if row["outcome"] != "ok":
            # jax 0.7 to 0.9 cannot lower a NumPy closure under the simplified pipeline.
            assert (pipeline, variant) == ("simplified", "numpy-closure") and "TypedNdArray" in row["outcome"]
            continue
        assert row["hlo_bytes"] > 0 and row["step_s"] > 0 and row["pipelined_step_s"] > 0
        assert (row["device_bytes_in_use"] is None) == on_cpu()  # memory_stats() is None on the CPU
    for pipeline in pipelines:
        assert rows[(pipeline, "frozenconst.jit")]["live_copies"] == 1
    raw = rows.get(("simplified", "numpy-closure"))
    if raw and raw["outcome"] == "ok":
        # One device copy per layer (the bug frozenconst.jit removes), one from jax 0.12.1.
        assert raw["live_copies"] == (layers if simplified_copies_per_use() else 1)


def test_mutation_never_reaches_a_frozenconsts_device_copy(written):
    _, results, _ = written
    rows = results["mutation"]
    assert {r["how"] for r in rows} == {"jax.device_put(a)", "jnp.asarray(a)", "FrozenConst(a)"}
    for r in rows:
        assert r["trials"] == results["sizes"]["trials"]
        if r["how"] == "FrozenConst(a)":
            assert r["differs"] == 0, r


def test_the_first_transfer_covers_each_offered_host_memory_choice(written):
    _, results, _ = written
    transfer = results["transfer"]
    cases = {r["case"] for r in transfer["rows"]}
    assert "jax.device_put(a)" in cases
    wanted = {f"FrozenConst(a, host_memory={c!r})" for c in transfer["choices"]} or {"FrozenConst(a)"}
    assert cases - {"jax.device_put(a)"} == wanted
    assert {r["mib"] for r in transfer["rows"]} == set(results["sizes"]["transfer_mib"])
    stages = {s["stage"]: s for s in transfer["accounting"]}
    nbytes = transfer["accounting_mib"] * 2**20
    # frozenconst's own accounting through the constant's life.
    assert stages["built"]["stats_device_bytes"] == stages["before"]["stats_device_bytes"]
    assert stages["transferred"]["stats_device_bytes"] - stages["built"]["stats_device_bytes"] == nbytes
    assert stages["evicted"]["stats_device_bytes"] == stages["before"]["stats_device_bytes"]


def test_per_call_and_cache_hits_cover_every_variant(written):
    _, results, _ = written
    ks = results["sizes"]["ks"]
    variants = {r["variant"] for r in results["per_call"]}
    assert {"jax.jit, closure", "jax.jit, arguments", "frozenconst.jit"} <= variants
    assert sorted({r["k"] for r in results["per_call"]}) == ks
    assert len(results["per_call"]) == len(ks) * len(variants)
    assert {r["case"] for r in results["cache_hits"]} == {
        "jnp.add(x, 1)",
        "jnp.dot(x, w)",
        "x @ w",
        "jitted f(x)",
    }
