"""The pytest and hypothesis entry points load nothing of frozenconst (nor JAX) until it is used.

Each check runs in a fresh interpreter. In the development environments
frozenconst is an editable install whose entry points are whatever was declared
when it was installed: the checks put a dist-info with this checkout's
pyproject.toml entry points first on the path, so they test what this checkout
ships. Under `make package` (`FROZENCONST_WHEEL_TEST=1`) they use the installed
wheel's own metadata. How long the two imports take is measured by
`python -m benchmarks startup`, not here.
"""

import json
import os
import sys
import textwrap
import tomllib

import pytest
from helpers import ROOT, run_bounded

# What the entry points import, in fresh interpreters: nothing is traced, so the same under
# both JAX constant pipelines.
pytestmark = pytest.mark.pipeline_independent
INSTALLED_WHEEL = os.environ.get("FROZENCONST_WHEEL_TEST") == "1"
ENTRY_POINTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]
# What frozenconst's entry points may add to a process that never uses frozenconst.
PLUGIN_MODULES = {
    ENTRY_POINTS["pytest11"]["frozenconst"],
    ENTRY_POINTS["hypothesis"]["frozenconst"].split(":")[0],
}


def _heavy(modules):
    return sorted(m for m in modules if m.split(".")[0] in ("frozenconst", "jax", "jaxlib"))


@pytest.fixture
def env(tmp_path):
    """A subprocess environment whose frozenconst entry points are this checkout's."""
    out = dict(os.environ)
    out.pop("HYPOTHESIS_NO_PLUGINS", None)
    if INSTALLED_WHEEL:
        return out
    info = tmp_path / "site" / "frozenconst-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: frozenconst\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items()) + "\n"
            for group, points in ENTRY_POINTS.items()
        )
    )
    # importlib.metadata takes the first distribution of a name on the path: this one.
    out["PYTHONPATH"] = os.pathsep.join([str(info.parent), str(ROOT), out.get("PYTHONPATH", "")])
    return out


def _python(code, env, cwd):
    code_, out = run_bounded([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd)
    assert code_ == 0, out[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.subprocess
def test_the_entry_points_are_the_ones_checked_here(env, tmp_path):
    found = _python(
        """
        import importlib.metadata as m, json
        print(json.dumps({g: {e.name: e.value for e in m.entry_points(group=g) if e.name == "frozenconst"}
                          for g in ("pytest11", "hypothesis")}))
        """,
        env,
        tmp_path,
    )
    assert found == {g: {"frozenconst": ENTRY_POINTS[g]["frozenconst"]} for g in ("pytest11", "hypothesis")}
    assert {"_frozenconst_pytestplugin", "_frozenconst_hypothesis"} == PLUGIN_MODULES


@pytest.mark.subprocess
def test_importing_hypothesis_imports_nothing_of_frozenconst(env, tmp_path):
    loaded = _python(
        """
        import json, sys
        import hypothesis
        print(json.dumps(sorted(sys.modules)))
        """,
        env,
        tmp_path,
    )
    assert "_frozenconst_hypothesis" in loaded  # the entry point ran
    assert _heavy(loaded) == []


_DRAW = """
    import json, sys
    {first}
    {second}
    from hypothesis import given, settings, strategies as st
    from frozenconst import FrozenConst
    # Registered lazily: the strategies module loads when a test first asks for one.
    lazy = "frozenconst.strategies" not in sys.modules
    seen = []

    @settings(max_examples=5, database=None, deadline=None)  # a loaded machine: no deadline
    @given(st.from_type(FrozenConst))
    def draw(x):
        seen.append(type(x).__name__)

    draw()
    print(json.dumps({{"lazy": lazy, "seen": sorted(set(seen))}}))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "first, second",
    [("import hypothesis", "import frozenconst"), ("import frozenconst", "import hypothesis")],
    ids=["hypothesis-first", "frozenconst-first"],
)
def test_from_type_works_in_either_import_order(env, tmp_path, first, second):
    result = _python(_DRAW.format(first=first, second=second), env, tmp_path)
    assert result == {"lazy": True, "seen": ["FrozenConst"]}


@pytest.mark.subprocess
def test_from_type_works_without_hypothesis_plugins_once_strategies_is_imported(env, tmp_path):
    env = dict(env, HYPOTHESIS_NO_PLUGINS="1")
    result = _python(
        _DRAW.format(first="import frozenconst", second="import hypothesis, frozenconst.strategies"),
        env,
        tmp_path,
    )
    assert result == {"lazy": False, "seen": ["FrozenConst"]}


_UNRELATED = """
    import json, pathlib, sys
    import hypothesis  # an unrelated suite that uses hypothesis: both entry points run

    def test_unrelated(request):
        plugins = request.config.pluginmanager
        pathlib.Path({out!r}).write_text(json.dumps(
            {{"modules": sorted(sys.modules), "plugin": plugins.has_plugin("frozenconst")}}
        ))
"""


def _pytest_modules(env, tmp_path, *flags):
    out = tmp_path / "modules.json"
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_unrelated.py").write_text(textwrap.dedent(_UNRELATED.format(out=str(out))))
    code, log = run_bounded(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags, "test_unrelated.py"],
        env=env,
        cwd=suite,
    )
    assert code == 0, log[-4000:]
    return json.loads(out.read_text())


@pytest.mark.subprocess
def test_a_pytest_run_of_unrelated_code_imports_nothing_of_frozenconst(env, tmp_path):
    on = _pytest_modules(env, tmp_path)
    off = _pytest_modules(dict(env, HYPOTHESIS_NO_PLUGINS="1"), tmp_path, "-p", "no:frozenconst")
    assert on["plugin"] and not off["plugin"]
    assert _heavy(on["modules"]) == []
    # All that the two plugins add to the run: their own two small modules.
    assert set(on["modules"]) - set(off["modules"]) == PLUGIN_MODULES


# That the guard's machinery loads only when asked for shows only as its module in sys.modules.
_FIXTURE = """
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import pytest

    TABLE = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)

    def test_a_plain_test_loads_no_guard():
        assert "frozenconst._guard" not in sys.modules

    def test_raw(no_numpy_constants):
        assert "frozenconst._guard" in sys.modules
        jax.jit(lambda w: TABLE @ w)(jnp.ones(64))
"""


@pytest.mark.subprocess
def test_the_fixture_imports_its_machinery_when_requested(env, tmp_path, request):
    request.getfixturevalue("needs_raw_numpy_lowering")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_user.py").write_text(textwrap.dedent(_FIXTURE))
    code, log = run_bounded(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "test_user.py"],
        env=env,
        cwd=tmp_path,
    )
    assert code == 1 and "1 failed, 1 passed" in log, log[-4000:]
    assert "CapturedNumpyConstantError" in log and "float32[64,64]" in log


def test_the_plugins_are_top_level_modules_shipped_with_the_package():
    for name in PLUGIN_MODULES:
        assert (ROOT / f"{name}.py").is_file()
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["hatch"]["build"]
    assert set(wheel["targets"]["wheel"]["only-include"]) == {"frozenconst"} | {
        f"{name}.py" for name in PLUGIN_MODULES
    }


_EXPECTING = """
    import jax, jax.numpy as jnp, numpy as np
    import pytest
    import frozenconst

    TABLE = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)

    def test_fixture_and_raises(no_numpy_constants):
        with pytest.raises(frozenconst.CapturedNumpyConstantError):
            jax.jit(lambda v: TABLE @ v)(jnp.ones(64))

    def test_context_manager_and_raises():
        with pytest.raises(frozenconst.CapturedNumpyConstantError):
            with frozenconst.no_numpy_constants():
                jax.jit(lambda v: TABLE @ v + 1)(jnp.ones(64))
"""


@pytest.mark.subprocess
def test_the_fixture_reports_after_the_body_and_the_context_manager_raises(env, tmp_path, request):
    # As docs/testing.md says: the fixture's report comes once the body has
    # run, so `pytest.raises` around the line sees nothing; the context manager's block raises.
    request.getfixturevalue("needs_raw_numpy_lowering")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_user.py").write_text(textwrap.dedent(_EXPECTING))
    code, log = run_bounded(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "test_user.py"],
        env=env,
        cwd=tmp_path,
    )
    assert code == 1 and "1 failed, 1 passed" in log, log[-4000:]
    assert "FAILED test_user.py::test_fixture_and_raises - Failed: DID NOT RAISE" in log, log[-4000:]
    assert "frozenconst.no_numpy_constants also found 1 raw NumPy constant" in log, log[-4000:]
