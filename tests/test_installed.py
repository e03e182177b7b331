"""The installed package, as users get it: run by `make package` against the wheel.

In the development environments frozenconst is an editable install of this
checkout; there the same facts are checked on the source tree.
"""

import importlib.metadata
import os
import pathlib
import re
import tomllib

import pytest

import frozenconst

PACKAGE = pathlib.Path(frozenconst.__file__).resolve().parent
INSTALLED_WHEEL = os.environ.get("FROZENCONST_WHEEL_TEST") == "1"


def test_imported_from_where_it_should_be():
    source_tree = pathlib.Path(__file__).resolve().parent.parent / "frozenconst"
    # Under `make package` (and `make device`): the files the wheel installed, wherever pip put
    # them (site-packages, or `--target`), never this checkout.
    assert (source_tree == PACKAGE) is not INSTALLED_WHEEL, PACKAGE
    installed = importlib.metadata.distribution("frozenconst").locate_file("frozenconst/__init__.py")
    assert (pathlib.Path(str(installed)).resolve().parent == PACKAGE) is INSTALLED_WHEEL, PACKAGE


def test_typed_marker_and_entry_points_are_shipped():
    assert (PACKAGE / "py.typed").is_file()
    points = importlib.metadata.entry_points()
    plugin = {e.name: e.value for e in points.select(group="pytest11")}
    hook = {e.name: e.value for e in points.select(group="hypothesis")}
    # Top-level modules, so that loading them imports nothing of frozenconst (test_plugins.py).
    # An editable install made from an older pyproject.toml may name other modules: `pip install
    # -e .` (make does it when pyproject.toml changes) rewrites them.
    stale = "installed entry points are not pyproject.toml's: reinstall (pip install -e .)"
    assert plugin.get("frozenconst") == "_frozenconst_pytestplugin", stale
    assert hook.get("frozenconst") == "_frozenconst_hypothesis:setup", stale
    for entry in (*points.select(group="pytest11", name="frozenconst"), *points.select(group="hypothesis")):
        if entry.name == "frozenconst":
            assert entry.load() is not None


def test_metadata_matches_the_project():
    meta = importlib.metadata.metadata("frozenconst")
    assert meta["Name"] == "frozenconst"
    assert meta["License-Expression"] == "Apache-2.0" or meta["License"] == "Apache-2.0"
    requires = importlib.metadata.requires("frozenconst") or []
    # The floor only: every later JAX is tested (docs/jax.md, "JAX versions").
    jax = [r for r in requires if r.startswith(("jax>", "jax<", "jax ")) and "extra ==" not in r]
    assert jax == ["jax>=0.8.1"], requires
    assert any(r.startswith("numpy>=") for r in requires), requires


# -- what a package index shows (pyproject.toml, and the wheel's metadata under make package)

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
REPOSITORY = "https://github.com/frozenconst/frozenconst"


def _long_description():
    return (ROOT / PROJECT["readme"]).read_text(encoding="utf-8")


def test_the_long_description_reads_right_on_a_package_index():
    text = _long_description()
    assert PROJECT["readme"] != "README.md"  # the repository's page: set-up commands, relative links
    links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"<([a-z]+://[^>]+)>", text)
    assert len(links) >= 5, links
    relative = [link for link in links if not link.startswith("https://")]
    assert not relative, relative
    for local in ("2-core", "this project's", "this machine", "make test", ".venv"):
        assert local not in text, local
    assert text.startswith("# frozenconst\n")


def test_the_long_description_quick_start_runs():
    blocks = re.findall(r"```python\n(.*?)```", _long_description(), flags=re.S)
    assert len(blocks) == 1
    scope = {}
    exec(compile(blocks[0], "README-pypi.md", "exec"), scope)
    assert scope["y"].shape == (4096,) and scope["z"].shape == (4096,)


def _declared_pythons():
    return [c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"] if re.fullmatch(r".*:: 3\.\d+", c)]


def test_classifiers_keywords_and_urls():
    floor = PROJECT["requires-python"].removeprefix(">=")
    pythons = _declared_pythons()
    assert pythons[0] == floor and pythons == [f"3.{n}" for n in range(11, 11 + len(pythons))]
    assert "3.12" in pythons and "Programming Language :: Python :: 3 :: Only" in PROJECT["classifiers"]
    for prefix in ("Development Status :: ", "Topic :: ", "Intended Audience :: ", "Typing :: Typed"):
        assert any(c.startswith(prefix) for c in PROJECT["classifiers"]), prefix
    assert {"Framework :: Pytest", "Framework :: Hypothesis"} <= set(PROJECT["classifiers"])  # its plugins
    assert "jax" in PROJECT["keywords"]
    urls = PROJECT["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
    assert urls["Repository"] == urls["Homepage"] == REPOSITORY
    assert urls["Issues"] == f"{REPOSITORY}/issues" and urls["Changelog"].startswith(f"{REPOSITORY}/blob/")
    assert urls["Documentation"] == "https://frozenconst.github.io/frozenconst/"


def test_the_changelog_opens_with_this_versions_release_section():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", changelog, flags=re.M)
    assert sections[0].startswith(f"{PROJECT['version']} (")
    assert "release date: YYYY-MM-DD" in sections[0] or re.search(r"\d{4}-\d\d-\d\d", sections[0])
    assert not [s for s in sections if s.lower().startswith("unreleased")]
    assert sum(s.split()[0] == PROJECT["version"] for s in sections) == 1


def test_the_numpy_floor_is_stated():
    numpy = next(r for r in PROJECT["dependencies"] if r.startswith("numpy"))
    floor = numpy.removeprefix("numpy>=")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f"NumPy: {floor}" in pyproject  # the comment that says why
    assert f"`numpy>={floor}`" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")


@pytest.mark.skipif(not INSTALLED_WHEEL, reason="an editable install's metadata is as of its install")
def test_the_wheels_metadata_is_pyprojects():
    meta = importlib.metadata.metadata("frozenconst")
    assert meta.get_all("Classifier") == sorted(PROJECT["classifiers"])
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls == PROJECT["urls"]
    assert sorted(meta["Keywords"].split(",")) == sorted(PROJECT["keywords"])
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == _long_description().strip()


def test_a_program_saves_and_loads_with_the_declared_dependencies_alone(tmp_path):
    # Under `make package`: an environment holding the wheel, what it declares, and pytest.
    # JAX's serialization of exported programs imports `flatbuffers`, which JAX does not declare.
    import jax
    import jax.numpy as jnp
    import numpy as np

    declared = PROJECT["dependencies"] + (
        importlib.metadata.requires("frozenconst") if INSTALLED_WHEEL else []
    )
    assert any(r.startswith("flatbuffers") for r in declared), declared
    table = frozenconst.FrozenConst(np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096)
    exported = frozenconst.export(lambda x: jnp.tanh(table @ x), jax.ShapeDtypeStruct((64,), jnp.float32))
    loaded = frozenconst.load(exported.save(tmp_path / "prog", vjp_order=1))
    x = jnp.linspace(-1.0, 1.0, 64)
    assert (
        np.asarray(loaded(x)) == np.asarray(jax.jit(lambda t, v: jnp.tanh(t @ v))(jnp.asarray(table), x))
    ).all()
