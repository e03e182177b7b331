"""The runner of the seed-at-real-size benchmark, at a tiny size: behaviour, not time.

The runner runs as a user runs it, `python -m benchmarks.seed_real --variant ...`
from the checkout's root, in a subprocess; the test reads the JSON it writes
(`--json`). A variant runs in a fresh interpreter watched by the runner; one that
passes the memory limit is reported as having run out, with the last stage it reached.
"""

import json
import os
import sys

import pytest
from helpers import ROOT, on_cpu, run_bounded, subprocess_env

# Each variant runs in a fresh interpreter, with the pipeline the runner sets for
# it (`--pipeline default`), whatever this process runs under.
pytestmark = [pytest.mark.subprocess, pytest.mark.pipeline_independent, pytest.mark.slow]


def _rss_counter_slack():
    """How far apart two reads of a process's RSS can be for counting alone, in bytes.

    Linux counts resident pages per CPU (per-CPU counters since 6.2; per-thread
    caches synced every 64 faults before): a read can miss up to a batch of pages
    per CPU for each of the file, anonymous and shared-memory counts, the batch
    `max(32, 2 * CPUs)` pages (64 before 6.2), so the slack grows with the CPU count.
    """
    cpus = os.cpu_count() or 1
    return 3 * cpus * max(64, 2 * cpus) * os.sysconf("SC_PAGE_SIZE")


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
    # The worker's own peak (VmHWM, read after its steps) and the kernel's (`ru_maxrss`,
    # at exit) are two reads of one high-water mark: the first is never above the
    # second, up to the slack of Linux's RSS counters.
    slack = max(0.01 * row["os_peak_rss_bytes"], _rss_counter_slack())
    assert 0 < row["peak_rss_bytes"] <= row["os_peak_rss_bytes"] + slack
    if on_cpu():
        # And nothing after the steps grows the process: on the CPU backend, counting
        # the device copies reads them where they are. On an accelerator it copies each
        # to the host first, so the kernel's peak can be above the one read at the steps.
        assert row["os_peak_rss_bytes"] <= row["peak_rss_bytes"] + slack


def test_a_variant_over_the_memory_limit_is_reported_as_run_out(tmp_path):
    result = run_variant(tmp_path, "argument", rss_limit=1)
    row = result["row"]
    assert row["outcome"].startswith("ran out: resident memory passed")
    assert row["last_stage"]
    assert "ran out" in result["table"]
