"""The package's shape: private modules in layers, each importing only modules below it.

The order is CONTRIBUTING.md's "Where things are", bottom first. Imports needed
only for annotations (under `if TYPE_CHECKING:`) do not count: they do not run.
"""

import ast
import pathlib

import frozenconst

PACKAGE = pathlib.Path(frozenconst.__file__).parent
LAYERS = [
    ["_errors", "_fingerprint"],
    ["_compat"],
    ["_dtypes"],
    ["_convert"],
    ["_host", "_targets", "_argnums", "_hoisting", "_tracebacks", "_jaxprs"],
    ["_cache"],
    ["_partial", "_derived", "_stats"],
    ["_frozen"],
    ["_groups"],
    ["_stages"],
    ["_jit"],
    ["_audit", "_intern", "_training", "strategies", "_hypothesis_hook"],
    ["_guard"],
    ["_pytest_plugin", "__init__", "__main__"],
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _runtime_imports(path: pathlib.Path) -> set[str]:
    """The package modules `path` imports when it runs."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for stmt in ast.walk(tree)
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}
        for node in ast.walk(stmt)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        if node.module:
            found.add(node.module.split(".")[0])
        else:
            found.update(alias.name for alias in node.names)
    return found


def test_every_module_has_a_layer():
    assert {p.stem for p in PACKAGE.glob("*.py")} == set(LEVEL)


def test_each_module_imports_only_modules_below_it():
    upward = {
        (path.stem, imported)
        for path in PACKAGE.glob("*.py")
        for imported in _runtime_imports(path)
        if imported in LEVEL and LEVEL[imported] >= LEVEL[path.stem] and path.stem != "__init__"
    }
    assert not upward, f"imports at or above their own layer: {sorted(upward)}"


def test_the_check_sees_an_upward_import(tmp_path):
    # The check itself can fail: a module that imports one above it is found.
    module = tmp_path / "_cache.py"
    module.write_text("from ._jit import jit\nif TYPE_CHECKING:\n    from ._frozen import FrozenConst\n")
    assert _runtime_imports(module) == {"_jit"}
