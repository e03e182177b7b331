"""The suite split over a lent accelerator's calls (tests/conftest.py): `FROZENCONST_SHARD=i/n`
takes one of n shares, and `FROZENCONST_RAN=file` leaves out the tests a call already ran, so a
call whose time ran out is continued by the next one, not started again.

Observed through pytest itself, in subprocesses: what each run collects and what it runs.
"""

import pathlib
import re
import sys

import pytest
from helpers import run_bounded, subprocess_env

pytestmark = [pytest.mark.subprocess, pytest.mark.pipeline_independent]

_HERE = pathlib.Path(__file__).resolve().parent
# A file of fourteen quick tests that start no subprocess.
_TARGET = "tests/test_device_neutral.py"


def _run(*flags: str, **env: str) -> tuple[int, str]:
    return run_bounded(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", *flags, _TARGET],
        env={**subprocess_env(platform="cpu"), **env},
        cwd=_HERE.parent,
    )


def _pytest(*flags: str, **env: str) -> str:
    code, out = _run(*flags, **env)
    assert code in (0, 5), out[-4000:]  # pytest's exit 5: every test deselected, none left to run
    return out


def _collected(**env: str) -> set[str]:
    out = _pytest("--collect-only", **env)
    return {line for line in out.splitlines() if line.startswith(_TARGET + "::")}


def _ran(path: pathlib.Path) -> set[str]:
    return set(path.read_text().splitlines())


def test_shares_partition_the_suite_and_a_later_call_runs_only_what_is_left(tmp_path):
    whole = _collected()
    assert len(whole) >= 4, whole
    shares = [_collected(FROZENCONST_SHARD=f"{i}/3") for i in (1, 2, 3)]
    assert set().union(*shares) == whole
    assert sum(map(len, shares)) == len(whole)  # no test in two shares

    # A first call runs one share (as a call whose time ran out leaves the rest).
    ran = tmp_path / "ran.txt"
    out = _pytest(FROZENCONST_SHARD="1/3", FROZENCONST_RAN=str(ran))
    assert _ran(ran) == shares[0]
    assert re.search(rf"\b{len(shares[0])} passed\b", out), out[-2000:]

    # The next call, over the whole suite, takes up only the tests not yet run, and records them.
    assert _collected(FROZENCONST_RAN=str(ran)) == whole - shares[0]
    _pytest(FROZENCONST_RAN=str(ran))
    assert _ran(ran) == whole
    assert _collected(FROZENCONST_RAN=str(ran)) == set()
    assert f"no tests collected ({len(whole)} deselected)" in _pytest(
        "--collect-only", FROZENCONST_RAN=str(ran)
    )


def test_a_share_out_of_range_is_refused_with_what_to_write():
    code, out = _run("--collect-only", FROZENCONST_SHARD="4/3")
    assert code != 0
    assert "FROZENCONST_SHARD is '4/3'" in out and "1 <= i <= n" in out, out[-2000:]
