"""The runner of the seed-at-real-size benchmark, at a tiny size: behaviour, not time.

A variant runs in a fresh interpreter watched by the parent; one that passes the
memory limit is reported as having run out, with the last stage it reached.
"""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks import seed_real

pytestmark = pytest.mark.subprocess  # each variant runs in a fresh interpreter


def test_a_variant_that_finishes_reports_its_peak_rss():
    row = seed_real.run_variant("frozenconst.jit", "default", 4, 1.0, 1, rss_limit=2**40, timeout_s=240)
    assert row["outcome"] == "ok"
    assert row["live_copies"] == 1
    assert 0 < row["peak_rss_bytes"] <= row["os_peak_rss_bytes"]


def test_a_variant_over_the_memory_limit_is_reported_as_run_out():
    row = seed_real.run_variant("argument", "default", 4, 1.0, 1, rss_limit=1, timeout_s=240)
    assert row["outcome"].startswith("ran out: resident memory passed")
    assert row["last_stage"]
    assert "ran out" in seed_real.table([row])
