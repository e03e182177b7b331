"""The runner of the seed-at-real-size benchmark, at a tiny size: behaviour, not time.

The runner runs as a user runs it, `python -m benchmarks.seed_real --variant ...`
from the checkout's root, in a subprocess; the test reads the JSON it writes
(`--json`). A variant runs in a fresh interpreter watched by the runner; one that
passes the memory limit is reported as having run out, with the last stage it reached.
"""

import json
import sys

import pytest
from helpers import ROOT, run_bounded, subprocess_env

pytestmark = pytest.mark.subprocess  # each variant runs in a fresh interpreter


def run_variant(tmp_path, variant, rss_limit):
    """One variant at 4 layers and 1 MiB, one step, default pipeline: the runner's JSON."""
    path = tmp_path / "row.json"
    cmd = [sys.executable, "-m", "benchmarks.seed_real", "--variant", variant, "--pipeline", "default"]
    cmd += ["--layers", "4", "--mib", "1.0", "--steps", "1", "--timeout-s", "240"]
    cmd += ["--rss-limit-bytes", str(rss_limit), "--json", str(path)]
    # Past the runner's own 240 s limit, so that its verdict comes first.
    code, out = run_bounded(cmd, timeout=280, env=subprocess_env(), cwd=ROOT)
    assert code == 0, out
    return json.loads(path.read_text())


def test_a_variant_that_finishes_reports_its_peak_rss(tmp_path):
    row = run_variant(tmp_path, "frozenconst.jit", rss_limit=2**40)["row"]
    assert row["outcome"] == "ok"
    assert row["live_copies"] == 1
    # The worker's own peak (VmHWM, read as it ends) and the kernel's (`ru_maxrss`,
    # at exit) agree up to the slack of Linux's per-CPU RSS counters: a few pages
    # either way (seen: 4 KiB over, on a 214 MiB peak).
    assert row["peak_rss_bytes"] > 0
    assert abs(row["peak_rss_bytes"] - row["os_peak_rss_bytes"]) <= 0.01 * row["os_peak_rss_bytes"]


def test_a_variant_over_the_memory_limit_is_reported_as_run_out(tmp_path):
    result = run_variant(tmp_path, "argument", rss_limit=1)
    row = result["row"]
    assert row["outcome"].startswith("ran out: resident memory passed")
    assert row["last_stage"]
    assert "ran out" in result["table"]
