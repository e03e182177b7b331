"""A constant built from a memory-mapped `.npy` holds one copy in memory: the OS's own figures."""

import json
import sys

import numpy as np
import pytest
from helpers import ROOT, requires_peak_rss, run_bounded, subprocess_env

MIB = 1 << 20


# Nothing is traced (a build and one `jnp.asarray`), so the constant pipeline
# plays no part: make test runs it in the default-pipeline pass only.
@pytest.mark.subprocess
@pytest.mark.pipeline_independent
def test_building_from_a_memory_map_peaks_at_one_copy(tmp_path):
    requires_peak_rss()
    path = tmp_path / "const.npy"
    np.save(path, np.random.default_rng(0).standard_normal(16 * MIB).astype(np.float32))  # 64 MiB
    rows = {}
    for mode in ("np.load + FrozenConst", "mmap + FrozenConst"):
        code, out = run_bounded(
            [sys.executable, "-m", "benchmarks.disk", "--worker", mode, str(path)],
            env=subprocess_env("cpu"),  # host RSS: the build, measured where no driver allocates
            cwd=ROOT,
        )
        assert code == 0, out
        rows[mode] = json.loads(out.strip().splitlines()[-1])
        if not rows[mode]["peak_reset"]:
            pytest.skip("this kernel refuses to reset the peak resident set (/proc/self/clear_refs)")
    size = 64 * MIB
    loaded, mapped = rows["np.load + FrozenConst"], rows["mmap + FrozenConst"]
    assert loaded["nbytes"] == mapped["nbytes"] == size
    # Read into memory, then copied: two copies at the peak.
    assert loaded["build_peak_growth"] >= 1.8 * size
    # Copied from the map: one copy, and the resident set never holds more
    # than a block (8 MiB) of the file's pages besides, as each block's pages
    # are handed back once copied.
    assert mapped["build_peak_growth"] < 1.2 * size
    assert 0.8 * size < mapped["anon_after_build"] < 1.1 * size
    assert mapped["mapped_file_after_build"] < 0.2 * size
    for row in (loaded, mapped):
        assert 0.8 * size < row["kept_after_build"] < 1.2 * size  # the constant alone stays
