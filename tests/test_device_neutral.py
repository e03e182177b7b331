"""The suite runs on any device: every read of a CPU-only fact is guarded.

On an accelerator (`tools/device-run`) each test checks its promise there and skips, with
the reason, only what holds on JAX's CPU backend alone (`helpers.CPU_ONLY`). This
reads every test source for those facts: aliasing of host and device memory, host
RSS counters, CPU devices made in a process, platform checks made by hand, and
float32 results compared with NumPy's arithmetic. Each must sit in a function that
asks `requires_cpu(...)` or `on_cpu()`, in a subprocess started on the CPU, or in
the documented list below.
"""

import ast
import pathlib
import re

import pytest
from helpers import CPU_ONLY

HERE = pathlib.Path(__file__).resolve().parent

_FACTS = {
    # A device buffer's address compared with a host buffer's: an alias only on the CPU.
    "aliasing": re.compile(r"==[^\n]*\.ctypes\.data\b|\.ctypes\.data\b[^\n%]*=="),
    "host RSS": re.compile(r"VmRSS|VmHWM|ru_maxrss|/proc/self/statm|getrusage|\bpeak_rss"),
    "cpu devices": re.compile(r"jax_num_cpu_devices|jax_cpu_collectives_implementation"),
    # Asked by hand instead of through `on_cpu`/`requires_cpu`, which say why.
    "platform check": re.compile(r"""\.platform\s*[!=]=\s*["']cpu|default_backend\(\)\s*[!=]="""),
}
_GUARDS = ("requires_cpu(", "on_cpu()", 'subprocess_env("cpu")', "run_processes(")

# Files that run only as subprocesses on JAX's CPU backend ("file"), or whose
# module-level configuration runs only there ("module level": the cases themselves
# also run in-process, on this process's devices), each with the test module that
# starts them and must start them on the CPU.
_CPU_SUBPROCESSES = {
    "multidevice_cases.py": ("file", "test_multidevice.py"),
    "bigger_than_host_worker.py": ("file", "test_bigger_than_host.py"),
    "memory_churn_worker.py": ("file", "test_lifetimes.py"),
    "donation_loop_worker.py": ("file", "test_lifetimes.py"),
    "composition_cases.py": ("module level", "test_composition.py"),
    "export_worker.py": ("file", "test_export.py"),
}
# Scripts held in module-level strings and run in CPU subprocesses: (module, name).
_CPU_SCRIPTS = {
    ("test_metadata.py", "_MIXING"),
    ("test_pickle_placement.py", "_SCRIPT"),
    ("test_lifetimes.py", "_GROWTH"),
    ("test_host_memory.py", "_RSS"),
    ("test_export.py", "_SHARDED"),
}
# Reads that hold on every device, each with why.
_NEUTRAL = {
    ("test_stats.py", "test_zero_copy_is_reported_from_buffer_pointers"): (
        "compares `stats().zero_copy` with the pointers whichever they are: True where the CPU "
        "aliases, False on an accelerator"
    ),
}
_SOURCES = sorted(p for p in HERE.glob("*.py") if p.name not in ("helpers.py", "test_device_neutral.py"))


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _enclosing(tree, line):
    """The innermost function around `line`, else the module-level statement holding it."""
    inside = [f for f in _functions(tree) if f.lineno <= line <= f.end_lineno]
    if inside:
        return max(inside, key=lambda f: f.lineno)
    return next(s for s in tree.body if s.lineno <= line <= s.end_lineno)


def _guarded_functions(tree, text):
    """Names of module functions that guard, directly or by calling one that does."""
    bodies = {f.name: ast.get_source_segment(text, f) for f in _functions(tree)}
    guarded = {name for name, body in bodies.items() if any(g in body for g in _GUARDS)}
    while True:
        more = {n for n, body in bodies.items() if n not in guarded and any(f"{g}(" in body for g in guarded)}
        if not more:
            return guarded
        guarded |= more


def _reads():
    """(module, enclosing node name, fact, line) of every CPU-only fact read in the suite."""
    for path in _SOURCES:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for fact, pattern in _FACTS.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                yield path.name, text, tree, _enclosing(tree, line), fact, line


def _unguarded_reads():
    found = []
    for module, text, _tree, node, fact, line in _reads():
        scope, _launcher = _CPU_SUBPROCESSES.get(module, (None, None))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = ast.get_source_segment(text, node)
            if scope == "file" or (module, node.name) in _NEUTRAL or any(g in body for g in _GUARDS[:2]):
                continue
        else:
            names = {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}
            if scope is not None or any((module, n) in _CPU_SCRIPTS for n in names):
                continue
        found.append(f"{module}:{line} ({fact}) in {getattr(node, 'name', 'module level')}")
    return found


def test_every_read_of_a_cpu_only_fact_is_guarded():
    reads = list(_reads())
    assert {"aliasing", "host RSS", "cpu devices"} <= {fact for *_, fact, _ in reads}, (
        "the scan found no reads"
    )
    assert not _unguarded_reads(), (
        "these tests read a fact that holds on JAX's CPU backend only: ask `requires_cpu(fact)` or "
        "`on_cpu()` (tests/helpers.py, CPU_ONLY), or run them in `subprocess_env('cpu')`:\n"
        + "\n".join(_unguarded_reads())
    )


@pytest.mark.parametrize("module", sorted(_CPU_SUBPROCESSES))
def test_cpu_only_files_are_started_on_the_cpu(module):
    _scope, launcher = _CPU_SUBPROCESSES[module]
    text = (HERE / launcher).read_text(encoding="utf-8")
    tree = ast.parse(text)
    # Module-level names bound to the file's path (`WORKER = HERE / "..."`).
    aliases = {
        t.id
        for s in tree.body
        if isinstance(s, ast.Assign) and module in ast.get_source_segment(text, s)
        for t in s.targets
        if isinstance(t, ast.Name)
    }
    guarded = _guarded_functions(tree, text)
    starters = [
        f
        for f in _functions(tree)
        if module in ast.get_source_segment(text, f)
        or any(re.search(rf"\b{a}\b", ast.get_source_segment(text, f)) for a in aliases)
    ]
    assert starters, f"{launcher} does not start {module}"
    for f in starters:
        calls = {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        assert f.name in guarded or calls & guarded, f"{launcher}::{f.name} starts {module} off the CPU"


@pytest.mark.parametrize(("module", "name"), sorted(_CPU_SCRIPTS))
def test_cpu_only_scripts_are_started_on_the_cpu(module, name):
    text = (HERE / module).read_text(encoding="utf-8")
    tree = ast.parse(text)
    guarded = _guarded_functions(tree, text)
    users = [f for f in _functions(tree) if re.search(rf"\b{name}\b", ast.get_source_segment(text, f))]
    assert users, f"{module} never runs {name}"
    for f in users:
        calls = {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        assert f.name in guarded or calls & guarded, f"{module}::{f.name} runs {name} off the CPU"


def test_float32_results_are_compared_with_the_same_computation_on_the_device():
    # `assert_float32_close(actual, expected, ...)`: `expected` from JAX on this device
    # (`on_device`), never NumPy's matmul (an accelerator rounds differently).
    found = []
    for path in _SOURCES:
        if _CPU_SUBPROCESSES.get(path.name, ("",))[0] == "file":
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for f in _functions(tree):
            assigned = {
                t.id: ast.get_source_segment(text, s.value)
                for s in ast.walk(f)
                if isinstance(s, ast.Assign)
                for t in (s.targets[0].elts if isinstance(s.targets[0], ast.Tuple) else s.targets)
                if isinstance(t, ast.Name)
            }
            for call in ast.walk(f):
                if not (
                    isinstance(call, ast.Call) and getattr(call.func, "id", "") == "assert_float32_close"
                ):
                    continue
                expected = call.args[1]
                source = ast.get_source_segment(text, expected)
                if isinstance(expected, ast.Name):
                    source = assigned.get(expected.id, source)
                if "@" in source and "on_device(" not in source:
                    found.append(f"{path.name}:{call.lineno}: {source}")
    assert not found, "\n".join(found)


def test_the_guards_name_documented_facts():
    named = set()
    for path in [*_SOURCES, HERE / "helpers.py"]:
        named |= set(re.findall(r"""requires_cpu\(["']([^"']+)["']\)""", path.read_text(encoding="utf-8")))
    assert named and named <= set(CPU_ONLY), named - set(CPU_ONLY)
