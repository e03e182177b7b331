"""The installed package, as users get it: run by `make package` against the wheel.

In the development environments frozenconst is an editable install of this
checkout; there the same facts are checked on the source tree.
"""

import importlib.metadata
import os
import pathlib

import frozenconst

PACKAGE = pathlib.Path(frozenconst.__file__).resolve().parent
INSTALLED_WHEEL = os.environ.get("FROZENCONST_WHEEL_TEST") == "1"


def test_imported_from_where_it_should_be():
    source_tree = pathlib.Path(__file__).resolve().parent.parent / "frozenconst"
    # Under `make package`: the wheel in site-packages, never this checkout.
    assert (source_tree == PACKAGE) is not INSTALLED_WHEEL, PACKAGE
    assert ("site-packages" in PACKAGE.parts) is INSTALLED_WHEEL


def test_typed_marker_and_entry_points_are_shipped():
    assert (PACKAGE / "py.typed").is_file()
    points = importlib.metadata.entry_points()
    plugin = {e.name: e.value for e in points.select(group="pytest11")}
    hook = {e.name: e.value for e in points.select(group="hypothesis")}
    # Top-level modules, so that loading them imports nothing of frozenconst (test_plugins.py).
    # An editable install made before the entry points moved still names the old ones:
    # `pip install -e .` (make does it when pyproject.toml changes) rewrites them.
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
    assert any(r.startswith("jax>=") for r in requires) and any(r.startswith("numpy>=") for r in requires)
