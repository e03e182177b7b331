"""Static typing: the library sample passes both checkers; misuse is caught by both; both reveal
the wrapped function's types through `frozenconst.jit` and `frozenconst.filter_jit`."""

import os
import pathlib
import re
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


SAMPLES = [str(TYPING / name) for name in ("library_sample.py", "misuse_sample.py", "reveal_sample.py")]

# Each checker runs once over both samples (most of a run is reading JAX's and
# NumPy's annotations, the same for both), and the tests below split its
# report by file: the library sample must get no line at all, the misuse
# sample exactly its marked lines, the reveal sample the types its lines name,
# and no other file an error.


# A static check is the same under both constant pipelines: `make test` runs it
# once per environment (marker `pipeline_independent`); and it is slow for the
# edit-test loop (`make test-fast` leaves out `slow`).
def _static_check(test):
    return pytest.mark.pipeline_independent(pytest.mark.slow(pytest.mark.subprocess(test)))


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory):
    cache = tmp_path_factory.mktemp("mypy-cache")  # its own: never another run's cache
    out = subprocess.run(
        [_tool("mypy"), "--strict", "--no-incremental", "--cache-dir", str(cache), *SAMPLES],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert "error: " not in out.stderr, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def pyright_report():
    config = str(TYPING / "pyrightconfig.json")
    out = subprocess.run(
        [_tool("pyright"), "--pythonpath", sys.executable, "-p", config, *SAMPLES],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    return out.stdout


def _mypy_errors(report):
    """(file name, line) of every error mypy reports."""
    found = set()
    for line in report.splitlines():
        where, _, rest = line.partition(": error: ")
        if rest:
            path, lineno = where.split(":")[:2]
            found.add((pathlib.Path(path).name, int(lineno)))
    return found


def _pyright_errors(report):
    """(file name, line) of every error pyright reports (`  /path/file.py:12:5 - error: ...`)."""
    found = set()
    for line in report.splitlines():
        where, _, rest = line.strip().partition(" - error: ")
        if rest:
            path, lineno = where.rsplit(":", 2)[:2]
            found.add((pathlib.Path(path).name, int(lineno)))
    return found


@_static_check
def test_library_sample_passes_mypy_strict(mypy_report):
    assert "library_sample.py" not in mypy_report, mypy_report  # not an error, not even a note
    assert {name for name, _ in _mypy_errors(mypy_report)} <= {"misuse_sample.py"}, mypy_report
    assert "(checked 3 source files)" in mypy_report, mypy_report


@_static_check
def test_library_sample_passes_pyright(pyright_report):
    assert {name for name, _ in _pyright_errors(pyright_report)} <= {"misuse_sample.py"}, pyright_report
    assert not [line for line in pyright_report.splitlines() if "library_sample.py:" in line], pyright_report


def test_library_sample_has_no_ignores():
    text = (TYPING / "library_sample.py").read_text()
    assert "type: ignore" not in text and "pyright: ignore" not in text


def _error_lines():
    lines = (TYPING / "misuse_sample.py").read_text().splitlines()
    return {i + 1 for i, line in enumerate(lines) if "# ERROR" in line}


@_static_check
def test_misuse_is_caught_by_mypy(mypy_report):
    flagged = {n for name, n in _mypy_errors(mypy_report) if name == "misuse_sample.py"}
    assert flagged == _error_lines(), mypy_report


@_static_check
def test_misuse_is_caught_by_pyright(pyright_report):
    flagged = {n for name, n in _pyright_errors(pyright_report) if name == "misuse_sample.py"}
    assert flagged == _error_lines(), pyright_report


def _expected_reveals():
    """{line: type} of the reveal sample's `reveal_type` lines, as their comments name it."""
    lines = (TYPING / "reveal_sample.py").read_text().splitlines()
    return {i + 1: line.split("# reveals: ")[1] for i, line in enumerate(lines) if "# reveals: " in line}


def _short(name):
    """A revealed type without module paths (`jax._src.basearray.Array` is `Array`); pyright's
    `Unknown` is mypy's `Any`."""
    return re.sub(r"\b(?:\w+\.)+(\w)", r"\1", name).replace("Unknown", "Any")


@_static_check
def test_mypy_reveals_the_wrapped_functions_types(mypy_report):
    found = re.findall(r'reveal_sample\.py:(\d+): note: Revealed type is "(.*)"', mypy_report)
    assert {int(line): _short(kind) for line, kind in found} == _expected_reveals(), mypy_report


@_static_check
def test_pyright_reveals_the_wrapped_functions_types(pyright_report):
    found = re.findall(r'reveal_sample\.py:(\d+):\d+ - information: Type of ".*" is "(.*)"', pyright_report)
    assert {int(line): _short(kind) for line, kind in found} == _expected_reveals(), pyright_report
    assert not [
        line for line in pyright_report.splitlines() if "reveal_sample.py:" in line and " - error" in line
    ]


@pytest.mark.subprocess
def test_sample_runs():
    out = subprocess.run(
        [sys.executable, str(TYPING / "library_sample.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])),
    )
    assert out.returncode == 0, out.stderr
