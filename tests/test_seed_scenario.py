"""The seed scenario as `make demo` and the benchmark measure it, checked for behaviour (not time)."""

import pathlib
import sys

import pytest
from conftest import SIMPLIFIED

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks import seed


@pytest.fixture(scope="module")
def rows():
    return {v: seed.measure(v, layers=12, mib=0.5, steps=1) for v in seed.VARIANTS}


def test_frozenconst_jit_matches_the_argument_baseline(rows):
    ours, base = rows["frozenconst.jit"], rows["argument"]
    assert ours["live_copies"] == base["live_copies"] == 1
    assert ours["hlo_bytes"] <= 1.05 * base["hlo_bytes"]


def test_raw_numpy_closure_shows_what_it_costs(rows):
    numpy_row = rows["numpy-closure"]
    if SIMPLIFIED:
        assert numpy_row["live_copies"] == 12  # one device copy per layer
    else:
        assert numpy_row["hlo_bytes"] > numpy_row["const_bytes"]  # embedded in the program


def test_frozenconst_under_plain_jit_keeps_one_copy(rows):
    assert rows["frozenconst-closure"]["live_copies"] == 1
