"""Static typing: the library sample passes both checkers; misuse is caught by both."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

TYPING = pathlib.Path(__file__).resolve().parent / "typing"
ROOT = TYPING.parent.parent


def _tool(name):
    path = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed in this environment (make typecheck runs it)")
    return path


def _mypy(*files):
    return subprocess.run(
        [_tool("mypy"), "--strict", "--no-incremental", *files],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def _pyright(*files):
    return subprocess.run(
        [_tool("pyright"), "--pythonpath", sys.executable, "-p", str(TYPING / "pyrightconfig.json"), *files],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


@pytest.mark.subprocess
def test_library_sample_passes_mypy_strict():
    out = _mypy(str(TYPING / "library_sample.py"))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.subprocess
def test_library_sample_passes_pyright():
    out = _pyright(str(TYPING / "library_sample.py"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 errors" in out.stdout


def test_library_sample_has_no_ignores():
    text = (TYPING / "library_sample.py").read_text()
    assert "type: ignore" not in text and "pyright: ignore" not in text


def _error_lines():
    lines = (TYPING / "misuse_sample.py").read_text().splitlines()
    return {i + 1 for i, line in enumerate(lines) if "# ERROR" in line}


@pytest.mark.subprocess
def test_misuse_is_caught_by_mypy():
    out = _mypy(str(TYPING / "misuse_sample.py"))
    flagged = {int(line.split(":")[1]) for line in out.stdout.splitlines() if "misuse_sample.py:" in line}
    assert flagged == _error_lines(), out.stdout


@pytest.mark.subprocess
def test_misuse_is_caught_by_pyright():
    out = _pyright(str(TYPING / "misuse_sample.py"))
    flagged = {
        int(line.split(":")[1])
        for line in out.stdout.splitlines()
        if "misuse_sample.py:" in line and "error" in line
    }
    assert flagged == _error_lines(), out.stdout


@pytest.mark.subprocess
def test_sample_runs():
    out = subprocess.run(
        [sys.executable, str(TYPING / "library_sample.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert out.returncode == 0, out.stderr
