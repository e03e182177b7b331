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
    ["_compat", "_refusals"],
    ["_dtypes"],
    ["_convert"],
    ["_host", "_targets", "_tracebacks", "_jaxprs", "_deferred"],
    ["_cache"],
    ["_partial", "_derived", "_stats", "_hoist"],
    ["_frozen", "_lowering"],
    ["_jit"],
    ["_audit", "_checkpoints", "_filter_jit", "_flax", "_intern", "_training", "nnx", "strategies"],
    ["_export", "_guard", "_hypothesis_hook"],
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


# docs/design/index.md, "Words, one meaning each": the drift the code is checked for.
# "target" names a placement only: never a dtype, an array or an address (the one
# name with "target" in it that is not a placement is the deprecated alias kept
# for users, `FrozenConst.sharding_target`). "source" is the caller's data a
# constant is built from: never a type alias, a (store, sharding) pair, a dtype,
# an address or a description. A type alias has one name in the whole package.
_DEPRECATED_NAMES = {"sharding_target"}
_NOT_A_PLACEMENT = ("dtype", "ndarray", "int", "str", "np.", ".view(", "reshape(", "window")
_NOT_A_SOURCE = ("dtype", "int", "str", "tuple[", "Store")


def _annotation(node: ast.arg | ast.AnnAssign) -> str:
    return "" if node.annotation is None else ast.unparse(node.annotation)


def _glossary_drift(path: pathlib.Path) -> list[str]:
    """Where `path` uses "target", "source" or an alias name against the glossary."""
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.arg):
            annotation = _annotation(node)
            if "target" in node.arg.lower() and annotation not in {"Target", "Target | None", "Any"}:
                found.append(f"{where}: argument {node.arg}: {annotation}")
            if "source" in node.arg.lower() and any(t in annotation for t in _NOT_A_SOURCE):
                found.append(f"{where}: argument {node.arg}: {annotation}")
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            if "target" in node.name.lower() and node.name not in _DEPRECATED_NAMES:
                found.append(f"{where}: {node.name}")
            if "Source" in node.name:
                found.append(f"{where}: {node.name}")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in targets]
            value = "" if node.value is None else ast.unparse(node.value)
            for name in names:
                if "target" in name.lower() and any(t in value for t in _NOT_A_PLACEMENT):
                    found.append(f"{where}: {name} = {value}")
                if "source" in name.lower() and (
                    "Source" in name or any(t in value for t in ("dtype", "_address", "(", "'", '"'))
                ):
                    found.append(f"{where}: {name} = {value}")
    return found


def _aliases(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.target.id
        for node in tree.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and ast.unparse(node.annotation) in {"TypeAlias", "typing.TypeAlias"}
    ]


def test_the_code_keeps_the_glossary():
    drift = [line for path in sorted(PACKAGE.glob("*.py")) for line in _glossary_drift(path)]
    assert not drift, "words used against docs/design/index.md's glossary:\n" + "\n".join(drift)


def test_each_type_alias_has_one_name_in_the_package():
    names = [name for path in PACKAGE.glob("*.py") for name in _aliases(path)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_glossary_check_sees_each_drift(tmp_path):
    # The checks themselves can fail: each drift the issue named (#22) is found.
    module = tmp_path / "_drift.py"
    module.write_text(
        "Source: TypeAlias = 'tuple[Store, Sharding | None]'\n"
        "Key: TypeAlias = tuple[int, ...]\n"
        "def check(source: np.dtype[Any], target: np.dtype[Any]) -> None:\n"
        "    target = window.view(dtype)\n"
        "    source = _address(src)\n"
        "    self.source = 'a memory map'\n"
        "def sharding_target_of(x: Target) -> None: ...\n"
    )
    drift = "\n".join(_glossary_drift(module))
    for line in (1, 3, 4, 5, 6, 7):
        assert f"_drift.py:{line}:" in drift, (line, drift)
    assert drift.count("_drift.py:3:") == 2  # both arguments
    other = tmp_path / "_other.py"
    other.write_text("Key: TypeAlias = tuple[str, ...]\n")
    assert _aliases(module) + _aliases(other) == ["Source", "Key", "Key"]
    assert "_drift.py:1:" not in "\n".join(_glossary_drift(other))
