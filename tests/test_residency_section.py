"""The residency benchmark section at its smoke size, on whatever backend runs the suite.

`python -m benchmarks residency --device` measures on an accelerator; no CI machine has one, so
this runs the same section, small (`--quick`), as a user runs it (from the checkout's root, in a
bounded subprocess), and checks what it writes: the command cannot rot while no device is
available. Behaviour, not time: no figure here is a timing.
"""

import json
import sys

import jax
import pytest
from helpers import ROOT, SIMPLIFIED, on_cpu, run_bounded, subprocess_env

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    if SIMPLIFIED:
        pytest.skip("the section runs under the pipeline its process starts with: the default pass covers it")
    out = tmp_path_factory.mktemp("residency")
    code, log = run_bounded(
        [sys.executable, "-m", "benchmarks", "residency", "--quick", "--out", str(out)],
        timeout=240,
        env=subprocess_env(),
        cwd=ROOT,
    )
    assert code == 0, log[-6000:]
    return out, json.loads((out / "residency-results.json").read_text())


def test_the_files_name_where_and_when_they_were_measured(written):
    out, results = written
    assert {p.name for p in out.iterdir()} == {"residency-results.md", "residency-results.json"}
    assert results["command"] == "python -m benchmarks residency --quick"
    env = results["environment"]
    for key in ("device", "device_memory", "jax", "date", "frozenconst", "backend"):
        assert env.get(key), key
    assert env["jax"] == jax.__version__
    text = (out / "residency-results.md").read_text()
    assert results["command"] in text and f"- jax: {jax.__version__}" in text


def test_the_host_resident_scan_computes_the_references_values(written):
    _, results = written
    big = results["bigger_than_chip"]
    assert big["close"], big["max_abs_diff"]
    assert big["table_bytes"] == big["layers"] * big["width"] ** 2 * 4
    assert big["step_s"] > 0 and big["floor_s"] > 0 and big["ratio_to_floor"] > 0
    assert big["stats"]["residency"] == "host" and big["stats"]["device_bytes"] == {}
    assert results["bandwidth"]["device_put_gbs"] > 0 and results["bandwidth"]["in_program_gbs"] > 0
    if on_cpu():
        # Nothing runs out where device memory is host memory: both runs say so.
        assert big["plain_jax"] == big["device_resident"] == "ok (it fits)"
        assert big["bytes_limit"] is None
    else:  # pragma: no cover - an accelerator's quick run fits too: only the real size runs out
        assert big["plain_jax"].startswith(("ok", "out of memory"))


def test_the_budget_holds_and_counts_the_retransfers(written):
    _, results = written
    b = results["budget"]
    assert b["constants_bytes_max"] <= b["budget_bytes"] < 2 * b["model_bytes"]
    assert len(b["calls"]) == b["models"] * b["rounds"]
    # One model fits at a time: every call after the first round transfers both its constants again.
    assert b["retransfers"] == 2 * b["models"] * (b["rounds"] - 1)
    assert b["evictions"] == 2 * (b["models"] * b["rounds"] - 1)
    if b["bytes_in_use_above_baseline_max"] is not None:  # pragma: no cover - an accelerator's
        assert b["bytes_in_use_above_baseline_max"] <= b["budget_bytes"]
