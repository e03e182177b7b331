"""The seed scenario as `make demo` and the benchmark measure it, checked for behaviour (not time).

The benchmark runs as a user runs it, `python -m benchmarks.seed` from the
checkout's root, in a subprocess; the test reads the JSON it writes (`--json`).
Each pipeline is measured in a fresh interpreter, as in the benchmark: JAX reads
the pipeline (`JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS`) when it is imported.
"""

import json
import sys

import jax
import pytest
from helpers import ROOT, run_bounded, simplified_copies_per_use, subprocess_env

# The measurements run in fresh interpreters, each with the constant pipeline the
# benchmark sets for it (`_harness.pipeline_env`), whatever this process runs
# under: the same in both of make test's passes, so run in the default one only.
pytestmark = [pytest.mark.subprocess, pytest.mark.pipeline_independent, pytest.mark.slow]

LAYERS = 12
# The benchmark's pipelines (`benchmarks.seed.PIPELINES`), restated: pytest needs
# them before any subprocess runs. The `listed` fixture checks them against the CLI.
PIPELINES = ["default", "simplified"]


def run_seed(tmp_path, name, *args):
    """`python -m benchmarks.seed *args --json PATH` from the root: (exit code, output, the JSON or None)."""
    path = tmp_path / f"{name}.json"
    code, out = run_bounded(
        [sys.executable, "-m", "benchmarks.seed", *args, "--json", str(path)],
        env=subprocess_env(),
        cwd=ROOT,
    )
    return code, out, json.loads(path.read_text()) if code == 0 else None


@pytest.fixture(scope="module")
def listed(tmp_path_factory):
    """The benchmark's pipelines (name: value of the variable) and variants, from its CLI."""
    code, out, names = run_seed(tmp_path_factory.mktemp("seed"), "list", "--list")
    assert code == 0, out
    assert sorted(names["pipelines"]) == PIPELINES
    return names


@pytest.fixture(scope="module", params=PIPELINES)
def rows(request, listed, tmp_path_factory):
    if listed["pipelines"][request.param] and not hasattr(jax.config, "jax_use_simplified_jaxpr_constants"):
        pytest.skip(f"jax {jax.__version__} has one constant pipeline (the flag arrived in 0.7)")
    tmp = tmp_path_factory.mktemp(f"seed-{request.param}")
    args = ["--pipeline", request.param, "--layers", str(LAYERS), "--mib", "0.5", "--steps", "1"]
    expected = list(listed["variants"])
    code, out, measured = run_seed(tmp, "all", *args)
    if code != 0:
        # jax 0.8 and 0.9 (seen on 0.8.3 and 0.9.2) cannot lower a raw NumPy closure under
        # the simplified pipeline ("'TypedNdArray' object has no attribute 'sharding'"):
        # measure the other variants; the raw NumPy test then skips.
        assert "TypedNdArray" in out, out
        expected.remove("numpy-closure")
        code, out, measured = run_seed(tmp, "without-numpy", *args, "--exclude", "numpy-closure")
        assert code == 0, out
    by_variant = {r["variant"]: r for r in measured["rows"]}
    assert list(by_variant) == expected  # every variant asked for, each once
    assert {r["pipeline"] for r in measured["rows"]} == {request.param}
    return request.param, by_variant


def test_frozenconst_jit_matches_the_argument_baseline(rows):
    pipeline, by_variant = rows
    ours, base = by_variant["frozenconst.jit"], by_variant["argument"]
    assert ours["live_copies"] == base["live_copies"] == 1
    # Default pipeline: the constant is a parameter, as in the argument baseline.
    # Simplified: its buffer is captured and JAX passes it to the executable, as
    # for a FrozenConst closed over under jax.jit; no data in the program either way.
    floor = base if pipeline == "default" else by_variant["frozenconst-closure"]
    assert ours["hlo_bytes"] <= 1.05 * floor["hlo_bytes"]
    assert ours["hlo_bytes"] * 10 < ours["const_bytes"]


def test_raw_numpy_closure_shows_what_it_costs(rows):
    pipeline, by_variant = rows
    if "numpy-closure" not in by_variant:
        pytest.skip(f"jax {jax.__version__} cannot lower a raw NumPy closure under the {pipeline} pipeline")
    numpy_row = by_variant["numpy-closure"]
    if pipeline == "simplified":
        # One device array per layer, each its own buffer (the benchmark keeps
        # the NumPy constant off the 64-byte grid so the CPU backend copies it,
        # as an accelerator would, instead of aliasing it).
        # One from jax 0.12.1, which keeps the array one constant of the program.
        copies = LAYERS if simplified_copies_per_use() else 1
        assert numpy_row["live_arrays"] == numpy_row["live_copies"] == copies
    else:
        assert numpy_row["hlo_bytes"] > numpy_row["const_bytes"]  # embedded in the program


def test_frozenconst_under_plain_jit_keeps_one_copy(rows):
    _, by_variant = rows
    assert by_variant["frozenconst-closure"]["live_copies"] == 1


def test_the_demo_ends_with_one_line_saying_what_the_rows_show(rows):
    from benchmarks.seed import demo_summary

    pipeline, by_variant = rows
    line = demo_summary(list(by_variant.values()))
    assert "\n" not in line and f"({pipeline} pipeline;" in line
    base = by_variant["argument"]
    for variant, r in by_variant.items():
        if variant == "argument":
            continue
        ratio = r["hlo_bytes"] / base["hlo_bytes"]
        hlo = f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2f}x"
        copies = r["live_copies"]
        assert f"{variant} {hlo} HLO, {copies} device cop{'y' if copies == 1 else 'ies'}" in line, line
    # What the demo is for: the raw NumPy closure's cost, and frozenconst.jit's lack of it.
    ours = by_variant["frozenconst.jit"]
    assert ours["live_copies"] == 1 and ours["hlo_bytes"] < 2 * base["hlo_bytes"]
    if "numpy-closure" in by_variant:
        many = pipeline == "simplified" and simplified_copies_per_use()
        assert (f"HLO, {LAYERS} device copies" in line) == many, line
