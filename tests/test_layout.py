"""The package's shape: private modules in layers, each importing only modules below it.

The order is CONTRIBUTING.md's "Where things are", bottom first. Imports needed
only for annotations (under `if TYPE_CHECKING:`) go down too: the house has no
circle and no upward arrow.
"""

import ast
import pathlib
import re

import pytest

import frozenconst

# It reads the package's source: nothing a constant pipeline or a device changes.
pytestmark = pytest.mark.pipeline_independent

PACKAGE = pathlib.Path(frozenconst.__file__).parent
LAYERS = [
    ["_errors", "_fingerprint"],
    ["_compat"],
    ["_compat_lowering"],
    ["_frames"],
    ["_dtypes"],
    ["_host", "_host_memory", "_targets", "_jaxprs"],
    ["_convert"],
    ["_cache", "_refusals"],
    ["_partial", "_derived", "_stats", "_budget"],
    ["_plan"],
    ["_hoist"],
    ["_frozen"],
    ["_jit"],
    ["_audit", "_checkpoints", "_filter_jit", "_flax", "_intern", "_training", "nnx", "strategies"],
    ["_export", "_hypothesis_hook"],
    ["_install"],
    ["_guard"],
    ["__init__"],
    ["__main__"],  # the command line: the public API's first user (`frozenconst.audit`)
]
# The core: a constant's construction, host buffer, device store, pytree handling and array API.
# It imports nothing of the jit side (`_hoist`, `_jit`, `_filter_jit`, `_export`), of the tools
# (`_audit`, `_guard`, the command line) or of the framework glue: the jit side plugs in through
# `_install` (the `_cache.STATE.dropped` seam, JAX's lowering functions).
CORE = [
    "_errors", "_fingerprint", "_compat", "_refusals", "_dtypes", "_convert", "_host", "_host_memory",
    "_targets",
    "_frames", "_jaxprs", "_cache", "_partial", "_derived", "_stats", "_budget", "_frozen",
]  # fmt: skip
# JAX's internals split along the same line: the core's in `_compat`, the jit side's (lowering,
# hoisting, export, program objects, JAX's messages) in `_compat_lowering`, which the core reads
# only where it reads a program (`_jaxprs`) or JAX's words (`_refusals`).
COMPAT = {"_compat", "_compat_lowering"}
READS_LOWERING = {"_jaxprs", "_refusals"}
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _runtime_imports(path: pathlib.Path, annotations: bool = False) -> set[str]:
    """The package modules `path` imports when it runs (and, with `annotations`, for its
    annotations only, under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for stmt in ast.walk(tree)
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}
        for node in ast.walk(stmt)
        if not annotations
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        if node.module:
            found.add(node.module.split(".")[0])
        else:  # `from . import name`: a module, or a name of the package's own `__init__`
            names = (a.name for a in node.names)
            found.update(n if (path.parent / f"{n}.py").is_file() else "__init__" for n in names)
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


def test_no_import_goes_up_or_round_in_a_circle_even_for_annotations():
    # The house has no circle: not even an import for a type checker reaches a module above.
    upward = {
        (path.stem, imported)
        for path in PACKAGE.glob("*.py")
        for imported in _runtime_imports(path, annotations=True)
        if imported in LEVEL and LEVEL[imported] >= LEVEL[path.stem] and path.stem != "__init__"
    }
    assert not upward, f"imports (annotations' too) at or above their own layer: {sorted(upward)}"


def test_the_host_copy_decides_nothing_and_never_asks_back():
    # A construction is decided once, in `_convert.host_plan`, and `_host.freeze` carries the
    # plan out: the copy imports neither the conversion nor the dtype rules, for annotations
    # neither, so the walk of a construction goes one way.
    assert not _runtime_imports(PACKAGE / "_host.py", annotations=True) & {"_convert", "_dtypes"}
    assert "_host" in _runtime_imports(PACKAGE / "_convert.py")


def test_the_core_imports_nothing_of_the_jit_the_tools_or_the_frameworks():
    core = set(CORE)
    outside = {
        (name, imported)
        for name in CORE
        for imported in _runtime_imports(PACKAGE / f"{name}.py") - core
        if not (imported == "_compat_lowering" and name in READS_LOWERING)
    }
    assert not outside, f"core modules importing outside the core: {sorted(outside)}"
    frameworks = {"flax", "equinox", "optax", "orbax", "hypothesis", "pytest"}
    third_party = {(name, top) for name in CORE for top in _third_party(PACKAGE / f"{name}.py") & frameworks}
    assert not third_party, sorted(third_party)


def _third_party(path: pathlib.Path) -> set[str]:
    """The top-level packages `path` imports, anywhere in it (a function's own import too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_module_rebinds_a_global():
    # Process-wide state belongs to named objects, each with its lock: no `global` statement.
    found = [
        f"{path.name}:{node.lineno}"
        for path in sorted(PACKAGE.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]
    assert not found, found


# What changes JAX's own state (or flax's, hypothesis's): called in `_install` alone, at import.
_INSTALLING = {
    "register_pytree_node",
    "register_pytree_with_keys",
    "register_pytree_node_class",
    "register_pytree_with_keys_class",
    "register_dataclass",
    "register_exclusion",
    "register_array_type",
    "register_serialization_state",
    "exclude_package_frames",
    "wrap_lowering",
}


def _calls(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def test_only_install_changes_jaxs_state():
    # `_compat` defines the shims (`register_array_type`, `exclude_package_frames`) that call
    # JAX's registries; `_flax.register_flax` is the public call for flax imported later.
    allowed = {"_install": _INSTALLING, "_compat": _INSTALLING, "_flax": {"register_serialization_state"}}
    found = {
        (path.stem, name)
        for path in PACKAGE.glob("*.py")
        for name in _calls(path) & _INSTALLING
        if name not in allowed.get(path.stem, set())
    }
    assert not found, sorted(found)


def _names_jax_internals(path: pathlib.Path) -> list[str]:
    """Where `path` names a JAX-private module outside a comment (an import, a string, `._src`)."""
    found = [
        f"{path.name}:{number}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "jax._src" in line and not line.lstrip().startswith("#")
    ]
    tree = ast.parse(path.read_text())
    attributes = [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if getattr(n, "attr", "") == "_src"]
    return sorted(set(found + attributes))


def test_jaxs_private_modules_are_named_in_the_compat_modules_alone():
    # A JAX-private module, imported or matched by name (a frame's module, a traceback's),
    # lives in `_compat` (the core's) or `_compat_lowering` (the jit side's) with its reason,
    # versions and fallback.
    found = [
        line
        for path in sorted(PACKAGE.glob("*.py"))
        if path.stem not in COMPAT
        for line in _names_jax_internals(path)
    ]
    assert not found, found
    assert all(_names_jax_internals(PACKAGE / f"{name}.py") for name in COMPAT)


# The texts of JAX's messages that frozenconst matches (its refusals of a FrozenConst where it
# takes a `jax.Array`, of a non-array argument, of a deleted buffer, of an input on other devices;
# a call of an exported program): each in `_compat_lowering` alone, with the versions it holds for.
_JAX_TEXTS = (
    "__jax_array__() during abstractification",
    "Got FrozenConst(",
    "got FrozenConst(",
    "CustomNode(FrozenConst",
    "<class 'frozenconst._frozen.FrozenConst'>",
    "as an abstract array",
    "valid JAX type",
    "deleted",
    "DeviceAssignmentMismatch",
    "incompatible devices",
    r"args\[(\d+)\]",
    "args is a tuple of length",
)


def _reads_text(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` is an object's text: `str(x)`, `repr(x)`, `type(x).__name__`, or a name
    bound to one of those."""
    called = isinstance(node, ast.Call) and getattr(node.func, "id", "") in {"str", "repr"}
    return (
        called
        or (isinstance(node, ast.Attribute) and node.attr == "__name__")
        or getattr(node, "id", "") in names
    )


def _matches_jax_texts(path: pathlib.Path) -> list[str]:
    """Where `path` holds one of `_JAX_TEXTS` (a string that is one, or that holds one of more than
    one word) or matches words against an object's text (`"..." in str(err)`)."""
    tree = ast.parse(path.read_text())
    names = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _reads_text(node.value, set())
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            held = [t for t in _JAX_TEXTS if node.value == t or (not t.isidentifier() and t in node.value)]
            found += [f"{path.name}:{node.lineno}: {t!r}" for t in held]
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            and any(_reads_text(side, names) for side in node.comparators)
        ):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_jaxs_messages_are_read_in_compat_lowering_alone():
    found = [
        line
        for path in sorted(PACKAGE.glob("*.py"))
        if path.stem != "_compat_lowering"
        for line in _matches_jax_texts(path)
    ]
    assert not found, found
    lowering = (PACKAGE / "_compat_lowering.py").read_text()
    assert [t for t in _JAX_TEXTS if t not in lowering] == [], (
        "texts the list names, gone from _compat_lowering"
    )


# The keep-out decision has one home (`_plan.plan`), and "is this array a constant's buffer?" one
# lookup (`_hoist.store_of`): the three places that ask, a jit's lowering, the audit and export,
# ask those two and read no table of owners themselves.
_ASKERS = ["_hoist", "_audit", "_export"]
_OWNER_TABLES = {"buffer_owner", "owner_of", "OWNER_REFS", "COPY_REFS", "RELICS"}


def _names_read(function: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}


def _one_answer_each(path: pathlib.Path) -> tuple[bool, set[str]]:
    """Whether the module at `path` calls `plan`, and the owner tables its functions read beside
    `store_of` and `none_known` (the lookup itself, and the empty-tables fast path)."""
    tree = ast.parse(path.read_text())
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    asks = any("plan" in _names_read(f) for f in functions)
    reads = {
        f"{f.name}: {name}"
        for f in functions
        if f.name not in {"store_of", "none_known"}
        for name in _names_read(f) & _OWNER_TABLES
    }
    return asks, reads


def test_the_keep_out_decision_and_the_owner_lookup_each_have_one_home():
    for name in _ASKERS:
        asks, reads = _one_answer_each(PACKAGE / f"{name}.py")
        assert asks, f"{name} decides what a program keeps out without `_plan.plan`"
        assert not reads, f"{name} reads the owners' tables beside `store_of`: {sorted(reads)}"


def test_the_home_check_sees_a_second_answer(tmp_path):
    module = tmp_path / "_audit.py"
    module.write_text("def kept(v):\n    return buffer_owner(v) is not None and v.nbytes > 4096\n")
    assert _one_answer_each(module) == (False, {"kept: buffer_owner"})


def test_no_block_of_the_hoist_is_above_radon_c():
    # radon's cyclomatic complexity, C at most (11 to 20): `_hoist` is where a JAX upgrade that
    # breaks the keep-out is read. radon is in the `lint` extra (`make lint`'s environment).
    complexity = pytest.importorskip("radon.complexity", reason="radon is in the lint extra")
    blocks = complexity.cc_visit((PACKAGE / "_hoist.py").read_text())
    ranked = {f"{b.name}: {b.complexity}" for b in blocks if complexity.cc_rank(b.complexity) > "C"}
    assert blocks and not ranked, sorted(ranked)


def _picture_rows() -> list[set[str]]:
    """The modules on each row of docs/design/index.md's picture, top row first."""
    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "design" / "index.md").read_text()
    block = text.split("## The package, one page", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    words = [set(line.replace(",", " ").split()) for line in block.splitlines()]
    return [row & set(LEVEL) for row in words if row & set(LEVEL)]


def test_the_design_picture_shows_every_module_once_each_above_what_it_imports():
    rows = _picture_rows()
    shown = [name for row in rows for name in row]
    assert sorted(shown) == sorted(LEVEL), "docs/design/index.md's picture of the modules"
    row_of = {name: i for i, row in enumerate(rows) for name in row}
    below = {
        (path.stem, imported)
        for path in PACKAGE.glob("*.py")
        for imported in _runtime_imports(path)
        if imported in row_of and path.stem != "__init__" and row_of[imported] <= row_of[path.stem]
    }
    assert not below, f"the picture shows these imports going sideways or up: {sorted(below)}"


def test_the_check_sees_an_upward_import(tmp_path):
    # The check itself can fail: a module that imports one above it is found.
    module = tmp_path / "_cache.py"
    module.write_text("from ._jit import jit\nif TYPE_CHECKING:\n    from ._frozen import FrozenConst\n")
    assert _runtime_imports(module) == {"_jit"}
    assert _runtime_imports(module, annotations=True) == {"_jit", "_frozen"}
    # And the other checks: a framework import, a `global`, a registration, a private module.
    module.write_text(
        "import flax.nnx\ndef f():\n    global X\n    jax.tree_util.register_pytree_node(A, g, h)\n"
        "    return 'jax._src.pjit'\n"
    )
    assert "flax" in _third_party(module) and "register_pytree_node" in _calls(module)
    assert any(isinstance(n, ast.Global) for n in ast.walk(ast.parse(module.read_text())))
    assert _names_jax_internals(module) == ["_cache.py:5"]


def test_the_compat_checks_see_a_jax_internal_and_a_jax_message(tmp_path):
    # A JAX internal or a JAX message text outside the compat modules is found, in each form.
    module = tmp_path / "_frozen.py"
    module.write_text(
        "from jax._src import dtypes\n"
        "# jax._src.dtypes, in a comment: allowed\n"
        "import jax\nCORE = jax._src\n"
        "def f(err):\n"
        "    text = str(err)\n"
        "    if 'Mismatch' in type(err).__name__ or 'gone' in text or 'deleted' in str(err):\n"
        "        return 'it is incompatible devices, said JAX'\n"
    )
    assert _names_jax_internals(module) == ["_frozen.py:1", "_frozen.py:4"]
    found = "\n".join(_matches_jax_texts(module))
    for words in ("__name__", "'gone' in text", "in str(err)", "'deleted'", "'incompatible devices'"):
        assert words in found, (words, found)
    module.write_text("def f(err):\n    return f'{err} was deleted or said nothing'\n")
    assert _matches_jax_texts(module) == []  # a one-word text is one only whole


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
    # The checks themselves can fail: each drift the glossary names is found.
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


def test_comments_name_no_internal_issue():
    # Comments say why, once: the project's own issue numbers belong to the changelog and the
    # design notes, not to the package, the tests or the Makefile. A JAX issue a comment works
    # around stays ("jax #37830", a link).
    import re

    root = _TESTS.resolve().parent  # the checkout (the package may be an installed wheel's)
    paths = [*PACKAGE.glob("*.py"), *(root / "tests").rglob("*.py"), root / "Makefile"]
    pattern = re.compile(r"(?:\bissue #|\(#|\bRows? )\d+")
    found = [
        f"{path}:{number}"
        for path in paths
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and "jax-ml/jax" not in line
    ]
    assert not found, found
    # The check can fail (the samples built so that this file does not match itself).
    samples = ["# (issue #" + "47 row 8)", "# Row " + "5: ...", "(#" + "35)"]
    assert all(pattern.search(sample) for sample in samples)


# -- the tests' own map -------------------------------------------------------------------------
_TESTS = pathlib.Path(__file__).parent
_PRIVATE = re.compile(
    r"^\s*(?:from frozenconst(?:\.(_\w+))? import (?:\(?\s*)?(_\w+)?|import frozenconst\.(_\w+))", re.M
)


def _reaches_private(path: pathlib.Path) -> bool:
    return any(any(group) for group in _PRIVATE.findall(path.read_text()))


def test_the_tests_readme_maps_every_file_and_each_private_reach():
    text = (_TESTS / "README.md").read_text()
    named = set(re.findall(r"`(test_\w+\.py)`", text))
    files = {path.name for path in _TESTS.glob("test_*.py")}
    assert files <= named, f"tests/README.md does not name {sorted(files - named)}"
    assert named <= files, f"tests/README.md names files that are gone: {sorted(named - files)}"
    reaches = text.split("## Private reaches", 1)[1]
    listed = {
        name
        for row in reaches.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`(test_\w+\.py)`", row.split("|")[1])
    }
    private = {path.name for path in _TESTS.glob("test_*.py") if _reaches_private(path)}
    assert private <= listed, (
        f"private reaches without a reason in tests/README.md: {sorted(private - listed)}"
    )


def test_the_map_check_sees_a_private_reach(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text("import jax\nfrom frozenconst import FrozenConst\n")
    assert not _reaches_private(module)
    for line in (
        "from frozenconst._cache import STATE",
        "from frozenconst import _derived",
        "import frozenconst._frozen",
    ):
        module.write_text(f"import jax\n    {line}\n")
        assert _reaches_private(module), line
