"""What `make test` runs: every JAX environment under each constant pipeline it has, nothing lost.

Read from `make -n` (commands printed, none run): the suite passes, the
doctests, the checks, and `make test-fast`. Whatever the Makefile's structure
(targets side by side, `TEST_JOBS`), CI's coverage stays what it was.
"""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT = "env JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=0"
SIMPLIFIED = "env JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=1"
ONCE = '-m "not pipeline_independent"'
QUICK_CODEGEN = 'XLA_FLAGS="--xla_backend_optimization_level=0 ${XLA_FLAGS:-}"'

pytestmark = pytest.mark.pipeline_independent  # the Makefile is the same under both


def _dry_run(*targets):
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    # PYTHON312 set: the 3.12 passes are planned even where no Python 3.12 is found.
    out = subprocess.run(
        [make, "-n", "--no-print-directory", "PYTHON312=python3.12", *targets],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [line.strip() for line in out.stdout.splitlines()]


def _suite_lines(lines):
    """The pytest runs over the suite, the wheel's included (not the doctests)."""
    return [line for line in lines if " -m pytest " in line + " " and "--doctest" not in line]


def _env_and_pipeline(line):
    """The environment and constant pipeline of one suite pass's command line."""
    env = line.split("/bin/python")[0].split()[-1]
    pipeline = "simplified" if line.startswith(SIMPLIFIED) else "default" if line.startswith(DEFAULT) else "?"
    return env, pipeline


def _suite_passes(lines):
    """(environment, pipeline, once) of every pytest run over the suite (not doctests, not the wheel's)."""
    return [
        (*_env_and_pipeline(line), ONCE in line)
        for line in _suite_lines(lines)
        if "FROZENCONST_WHEEL_TEST" not in line
    ]


def test_make_test_runs_every_environment_under_each_of_its_pipelines():
    passes = _suite_passes(_dry_run("test"))
    assert sorted(passes) == sorted(
        [
            (".venv-py311", "default", False),
            (".venv-py311", "simplified", True),
            (".venv-py312", "default", False),
            (".venv-py312", "simplified", True),
            (".venv-jax092", "default", False),
            (".venv-jax092", "simplified", True),
            (".venv-jax081", "default", False),
            (".venv-jax081", "simplified", True),
        ]
    ), passes


def _doctest_passes(lines):
    """(environment, pipeline) of every doctest pass: the docs', the README's, the docstrings'."""
    passes = []
    for line in lines:
        if "--doctest-glob='*.md'" in line:
            env = line.split("/bin/python -S ")[0].rsplit("/", 1)[1]
            passes.append(
                (env, "simplified" if SIMPLIFIED in line else "default" if DEFAULT in line else "?")
            )
    return passes


def test_make_test_runs_the_doctests_from_the_wheel_in_every_environment_under_each_pipeline():
    # Every example of README.md, docs/ and the docstrings, as a pip user runs it: the
    # wheel installed (not the checkout), run from outside the checkout, on every JAX the
    # suite runs, under each of its pipelines.
    lines = _dry_run("test")
    assert sorted(_doctest_passes(lines)) == sorted(
        (env, pipeline) for env, pipeline, _ in _suite_passes(lines)
    ), _doctest_passes(lines)
    doctests = [line for line in lines if "--doctest-glob='*.md'" in line]
    for line in doctests:
        assert line.startswith("cd .docs-wheel && "), line  # outside the checkout
        assert f"--doctest-glob='*.md' {ROOT}/docs {ROOT}/README.md" in line, line
        assert line.endswith("--doctest-modules --pyargs frozenconst"), line  # the wheel's docstrings
        # -S: none of the environment's .pth files, the editable install's path to the checkout
        # among them; the wheel first on the path, then the environment's packages.
        assert "/bin/python -S -m pytest " in line and f"PYTHONPATH={ROOT}/.docs-wheel:" in line, line
    built = next(i for i, line in enumerate(lines) if "-m build --wheel --outdir .docs-wheel/.build" in line)
    installed = next(
        i for i, line in enumerate(lines) if "--no-deps --target .docs-wheel .docs-wheel/.build/" in line
    )
    assert built < installed < min(lines.index(line) for line in doctests)
    for check in ("ruff check", "ruff format --check", "mypy frozenconst", "mypy benchmarks", "pyright"):
        assert any(check in line for line in lines), check
    assert any("mkdocs build --strict" in line for line in lines)
    assert any("twine check --strict" in line for line in lines)
    assert any("FROZENCONST_WHEEL_TEST=1" in line for line in lines)


def test_ci_runs_make_test():
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec make test")


def test_make_test_fast_is_the_311_default_pass_without_slow_or_subprocess_tests():
    passes = [line for line in _dry_run("test-fast") if " -m pytest" in line]
    cache = f"FROZENCONST_TEST_COMPILATION_CACHE={ROOT}/.venv-py311/compilation-cache"
    assert passes == [
        f"{DEFAULT} {cache} {QUICK_CODEGEN} "
        '.venv-py311/bin/python -m pytest -q -p no:cacheprovider -m "not slow and not subprocess"'
    ]


def test_each_environments_passes_share_its_compilation_cache_the_simplified_one_second():
    # The passes listed second first: within `make test` (goal `checks`) make still runs each
    # environment's default pass before the passes that reuse its programs.
    second = [
        "pytest-311-simplified",
        "pytest-middle-simplified",
        "pytest-floor-simplified",
        "pytest-312-simplified",
        "package",
    ]
    first = ["pytest-311-default", "pytest-middle-default", "pytest-floor-default", "pytest-312-default"]
    lines = _dry_run("checks", f"CHECKS={' '.join(second + first)}")
    suite = _suite_lines(lines)
    order = {}
    for index, line in enumerate(suite):
        if "FROZENCONST_WHEEL_TEST" in line:  # the wheel's pass: Python 3.11's JAX, after its default pass
            env, pipeline = ".venv-py311", "wheel"
        else:
            env, pipeline = _env_and_pipeline(line)
        assert f"FROZENCONST_TEST_COMPILATION_CACHE={ROOT}/{env}/compilation-cache " in line, line
        order[env, pipeline] = index
    assert len(order) == 9, order
    for (env, pipeline), index in order.items():
        if pipeline != "default":
            assert index > order[env, "default"], (env, pipeline, suite)


def test_within_make_test_nothing_starts_before_every_environment_is_built():
    # The short checks listed first and every environment out of date (`-W pyproject.toml`):
    # within `checks` each still waits for all four environments, so that the longest
    # passes, listed first in CHECKS, start first once they are built.
    lines = _dry_run("-W", "pyproject.toml", "checks", "CHECKS=lint typecheck pytest-floor-default")
    built = [i for i, line in enumerate(lines) if line.startswith("touch ") and line.endswith("/.installed")]
    assert sorted(lines[i].split()[1] for i in built) == sorted(
        f"{env}/.installed" for env in (".venv-py311", ".venv-py312", ".venv-jax081", ".venv-jax092")
    ), lines
    first_check = next(i for i, line in enumerate(lines) if "ruff check" in line)
    assert max(built) < first_check, lines


def test_the_suite_compiles_at_xla_optimisation_level_0_the_doctests_as_users_do():
    # XLA's backend at level 0 (the Makefile's QUICK_CODEGEN) for every suite pass, the wheel's
    # and test-fast's included; the doctests, under both pipelines, compile as a user's program
    # does. A user's own XLA_FLAGS are kept.
    quick = QUICK_CODEGEN + " "
    lines = _dry_run("test-fast", "checks")
    suite = _suite_lines(lines)
    assert len(suite) == 10, suite  # test-fast, eight passes, the wheel's
    assert all(quick in line for line in suite), suite
    doctests = [line for line in lines if "--doctest-modules" in line]
    assert len(doctests) == 8 and not any("XLA_FLAGS" in line for line in doctests), doctests


def test_markers_that_leave_tests_out_are_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"pipeline_independent: ' in text and '"slow: ' in text
