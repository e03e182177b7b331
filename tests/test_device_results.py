"""`tools/device-results`: a run split over several device calls, read back as one report.

A share that ran out of time and a narrowed rerun after a fix are later calls: each test
counts once, with its latest outcome, and every test any call ran is counted.
"""

import importlib.machinery
import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.pipeline_independent

_TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "device-results"


def _tool():
    loader = importlib.machinery.SourceFileLoader("device_results", str(_TOOL))
    spec = importlib.util.spec_from_loader("device_results", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _report(folder: pathlib.Path, lane: str, outcomes: dict[str, str], seconds: float) -> None:
    cases = []
    for name, outcome in outcomes.items():
        inner = {
            "passed": "",
            "failed": '<failure message="AssertionError: no">trace</failure>',
            "skipped": '<skipped message="a CPU-backend fact" />',
        }[outcome]
        cases.append(f'<testcase classname="tests.test_x" name="{name}" time="1">{inner}</testcase>')
    # A worker's crash report: a test case with no name, which is no test.
    cases.append('<testcase time="0.001" />')
    (folder / "suite").mkdir(parents=True, exist_ok=True)
    (folder / "suite" / f"{lane}.xml").write_text(
        f'<?xml version="1.0"?><testsuites><testsuite time="{seconds}">{"".join(cases)}'
        "</testsuite></testsuites>"
    )
    (folder / "device-run.log").write_text(f"[device-run +0s] {lane}\n")


@pytest.mark.parametrize("n_shares", [2, 3])
def test_a_later_call_replaces_the_outcome_of_the_tests_it_ran_again(tmp_path, n_shares):
    names = [f"test_{i}" for i in range(12)]
    calls = []
    for share in range(1, n_shares + 1):
        # Each share fails its first test, the first skips its second, and the last runs out
        # of time before its last.
        mine = names[share - 1 :: n_shares]
        ran = mine[:-1] if share == n_shares else mine
        outcomes = {name: "passed" for name in ran} | {mine[0]: "failed"}
        if share == 1:
            outcomes[mine[1]] = "skipped"
        folder = tmp_path / f"call{share}"
        _report(folder, f"chip-default-{share}of{n_shares}", outcomes, 10.0)
        calls.append(folder)
    failed_first = [names[share - 1] for share in range(1, n_shares + 1)]
    never_ran = names[n_shares - 1 :: n_shares][-1]
    # The narrowed rerun after the fix: the failures pass now, with the one that never ran.
    rerun = tmp_path / "rerun"
    _report(rerun, "chip-default", {name: "passed" for name in [*failed_first, never_ran]}, 5.0)
    dest = tmp_path / "docs"
    assert _tool().main([*calls, rerun], dest) == 0
    text = (dest / "accelerator-suite.md").read_text()
    section = text.split("## chip-default:")[1].split("## ")[0]
    shares = ", ".join(f"{i}/{n_shares}" for i in range(1, n_shares + 1))
    counts = f"11 passed, 0 failed or errored, 1 skipped, of 12 (shares {shares}, 1 whole or narrowed pass;"
    assert counts in section
    assert f"in {int(10 * n_shares + 5)} s." in section
    assert "failure:" not in section
    # Without the rerun the failures stand, each once, and the test that never ran is not counted.
    assert _tool().main(calls, dest) == 0
    section = (dest / "accelerator-suite.md").read_text().split("## chip-default:")[1].split("## ")[0]
    assert f"{10 - n_shares} passed, {n_shares} failed or errored, 1 skipped, of 11 (" in section
    assert sorted(
        line.split("`")[1] for line in section.splitlines() if line.startswith("- failure")
    ) == sorted(f"tests.test_x::{name}" for name in failed_first)
