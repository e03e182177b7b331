"""The `compare` section: the core section's per-call figures, a base revision against the working tree.

    python -m benchmarks compare BASE_REV           # e.g. HEAD, HEAD~3, main, a sha
    python -m benchmarks compare BASE_REV --quick   # fewer rounds and pairs (a smoke run)
    python -m benchmarks.compare --worker TREE ROUNDS   # one measurement, as JSON (internal)

The `frozenconst` package of BASE_REV is extracted (`git archive`) into a
temporary directory; the working tree's `frozenconst` is the other side. Both
sides run the working tree's benchmark code (`core.cache_hits`,
`core.jit_overhead`, `core.jit_static_configurations`: public API only), each in
fresh interpreters of its own, `PYTHONPATH` choosing which `frozenconst` is
imported. Base and working-tree processes alternate in pairs, in ABBA order, so
drift in the machine's speed hits both sides alike. Each process measures its
ratios against baselines measured in the same process (`jax.Array`, the
one-slot floor, `jax.jit`); the change of a quantity is the median over pairs
of (working-tree ratio / base ratio). Issue #13's bound: no change above 1.03.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from ._harness import run_worker

# The repository root: `benchmarks` is always imported from here, and its
# `frozenconst` is the working-tree side.
ROOT = pathlib.Path(__file__).resolve().parent.parent
BOUND = 1.03
SIDES = ("base", "working tree")
# The one quantity that runs no frozenconst code: not gated, it shows the noise.
CONTROL = "control: jax.jit"


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed:\n{out.stderr.strip()}")
    return out.stdout.strip()


def extract(rev: str, dest: pathlib.Path) -> str:
    """Write the `frozenconst` package of git revision `rev` under `dest`; return the commit's sha."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    archive = subprocess.Popen(
        ["git", "archive", "--format=tar", sha, "frozenconst"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert archive.stdout is not None and archive.stderr is not None
    untar = subprocess.run(
        ["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True, check=False
    )
    archive.stdout.close()
    error = archive.stderr.read().decode()
    archive.stderr.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise RuntimeError(f"extracting frozenconst at {rev} ({sha}) failed:\n{error}{untar.stderr.decode()}")
    if not (dest / "frozenconst" / "__init__.py").is_file():
        raise RuntimeError(f"{rev} ({sha}) has no frozenconst/__init__.py")
    return sha


def _worker(tree: str, rounds: int) -> None:
    """Measure in this process, with `frozenconst` required to come from `tree`; print JSON."""
    import benchmarks
    import frozenconst

    from . import core
    from ._harness import environment

    # Fail loudly when PYTHONPATH did not choose the intended trees.
    for module, where in ((frozenconst, pathlib.Path(tree)), (benchmarks, ROOT)):
        path = pathlib.Path(str(module.__file__)).resolve()
        if not path.is_relative_to(where.resolve()):
            raise SystemExit(f"{module.__name__} imported from {path}, not from under {where}")
    results = {
        "frozenconst_file": frozenconst.__file__,
        "environment": environment(),
        "cache_hits": core.cache_hits(rounds),
        "jit_overhead": core.jit_overhead(rounds),
        "jit_static_configurations": core.jit_static_configurations(rounds),
    }
    print(json.dumps(results))


def run_side(tree: pathlib.Path, rounds: int, cwd: pathlib.Path) -> dict[str, Any]:
    """One fresh interpreter importing `frozenconst` from `tree` and `benchmarks` from the working tree.

    `cwd` is an empty directory: `python -m` puts the current directory first
    on `sys.path`, ahead of `PYTHONPATH`, and the repository root there would
    shadow the base tree's `frozenconst`.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(tree), str(ROOT)]))
    result: dict[str, Any] = run_worker(
        "benchmarks.compare", [str(tree), str(rounds)], f"compare worker (frozenconst from {tree})", env, cwd
    )
    return result


def quantities(result: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each measured quantity of one process: (ratio to its baseline, FrozenConst's time in us).

    Gated quantities first; the last, `jax.jit` after many static
    configurations, runs no frozenconst code: a control that shows the noise.
    """
    out: dict[str, tuple[float, float]] = {}
    for row in result["cache_hits"]:
        out[f"cache hit {row['case']}: ratio to jax.Array"] = (row["ratio"], row["a_us"])
        out[f"cache hit {row['case']}: ratio to the one-slot floor"] = (row["vs_floor"], row["a_us"])
        if "vs_cache_floor" in row:  # measured from this revision of the benchmark on
            out[f"cache hit {row['case']}: ratio to the one-slot cache floor"] = (
                row["vs_cache_floor"],
                row["a_us"],
            )
    j = result["jit_overhead"]
    out["frozenconst.jit per call: ratio to jax.jit"] = (j["ratio"], j["a_us"])
    s = result["jit_static_configurations"]
    many = f"after {s['configurations']} static configurations: ratio to after one"
    ours, floor = s["frozenconst.jit"], s["jax.jit"]
    out[f"frozenconst.jit {many}"] = (ours["ratio"], ours["a_us"])
    out[f"{CONTROL} {many}"] = (floor["ratio"], floor["a_us"])
    return out


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per quantity: each side's median ratio and time, and the median and range of the per-pair changes."""
    per_side = {side: [quantities(r) for r in runs[side]] for side in SIDES}
    rows = []
    for name in per_side["base"][0]:
        base = [q[name] for q in per_side["base"]]
        work = [q[name] for q in per_side["working tree"]]
        changes = [w[0] / b[0] for b, w in zip(base, work, strict=True)]
        change = statistics.median(changes)
        control = name.startswith(CONTROL)
        rows.append(
            {
                "quantity": name,
                "base_us": statistics.median(b[1] for b in base),
                "working_us": statistics.median(w[1] for w in work),
                "base_ratio": statistics.median(b[0] for b in base),
                "working_ratio": statistics.median(w[0] for w in work),
                "change": change,
                "pair_changes": changes,
                "pair_spread": max(abs(c - 1) for c in changes),
                "gated": not control,
                "within": change <= BOUND,
            }
        )
    return rows


def markdown(results: dict[str, Any], command: str) -> str:
    env, rows = results["environment"], results["rows"]
    gated = [r for r in rows if r["gated"]]
    outside = [r["quantity"] for r in gated if not r["within"]]
    verdict = (
        f"every gated quantity within the bound (worst change {max(r['change'] for r in gated):.3f})"
        if not outside
        else f"{len(outside)} of {len(gated)} gated quantities above the bound: " + "; ".join(outside)
    )
    spread = max(r["pair_spread"] for r in rows)
    noisy = sum(r["pair_spread"] > BOUND - 1 for r in rows)
    noise = (
        f" Single pairs differed from 1 by more than the bound on {noisy} of {len(rows)} quantities (the "
        "range column): there the verdict is within this run's noise; more pairs (`--pairs N`) narrow "
        "the median."
        if noisy
        else ""
    )
    lines = [
        "# Benchmark comparison: a base revision against the working tree",
        "",
        f"Produced by `{command}` on:",
        "",
        *[f"- {k}: {v}" for k, v in env.items()],
        f"- base: `{results['base_rev']}` = `{results['base_sha']}`",
        f"- working tree: `{results['working_tree']}`"
        + (" (its frozenconst identical to the base's)" if results["identical"] else ""),
        "",
        f"**Summary.** Issue #13's bound, change <= {BOUND:.2f}: {verdict}. The largest single-pair "
        f"change of any quantity, the control included, was {spread:.1%} away from 1.{noise}",
        "",
        "Both sides run the working tree's `benchmarks.core` (`cache_hits`, `jit_overhead`,",
        "`jit_static_configurations`) in fresh interpreters of their own, `PYTHONPATH` choosing the",
        "`frozenconst` they import: the base revision's, extracted with `git archive`, or the working",
        f"tree's. {results['pairs']} pairs of processes, base and working tree alternating in ABBA",
        f"order; in each process {results['rounds']} rounds of 1000 calls per side of every A/B ratio",
        f"({3 * results['rounds']} for the cache hits; each batch's last result waited for), against",
        "baselines measured in the same process. Ratio",
        "and time columns: medians over a side's processes (the time is FrozenConst's call, or",
        "`frozenconst.jit`'s). Change: the median over pairs of (working-tree ratio / base ratio);",
        "range: the smallest and largest pair. The control row runs no frozenconst code: its change is",
        "the noise between two identical measurements.",
        "",
        "| quantity | base us | working us | base ratio | working ratio | change | range over pairs "
        f"| within {BOUND:.2f} |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        verdict_cell = ("yes" if r["within"] else "**no**") if r["gated"] else "(control)"
        lines.append(
            f"| {r['quantity']} | {r['base_us']:.2f} | {r['working_us']:.2f} | {r['base_ratio']:.3f} "
            f"| {r['working_ratio']:.3f} | {r['change']:.3f} "
            f"| {min(r['pair_changes']):.3f} to {max(r['pair_changes']):.3f} | {verdict_cell} |"
        )
    return "\n".join(lines) + "\n"


def main(base_rev: str, quick: bool, docs: pathlib.Path, pairs: int | None = None) -> dict[str, Any]:
    rounds = 11 if quick else 31
    pairs = pairs or (3 if quick else 5)
    working_tree = _git("describe", "--always", "--dirty")
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    order: list[str] = []
    with tempfile.TemporaryDirectory(prefix="frozenconst-compare-") as tmp:
        base_tree, empty = pathlib.Path(tmp) / "base", pathlib.Path(tmp) / "cwd"
        base_tree.mkdir()
        empty.mkdir()
        base_sha = extract(base_rev, base_tree)
        identical = subprocess.run(
            ["git", "diff", "--quiet", base_sha, "--", "frozenconst"], cwd=ROOT, check=False
        ).returncode == 0 and not _git("ls-files", "--others", "--exclude-standard", "frozenconst")
        trees = {"base": base_tree, "working tree": ROOT}
        for p in range(pairs):
            for side in SIDES if p % 2 == 0 else SIDES[::-1]:
                print(f"pair {p + 1}/{pairs}: {side}", file=sys.stderr, flush=True)
                runs[side].append(run_side(trees[side], rounds, empty))
                order.append(side)
    pipeline = os.environ.get("JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS")
    results: dict[str, Any] = {
        # The working tree's stamp: its frozenconst is this checkout's commit; the base's, an
        # extracted archive, has none (the base's line below names it).
        "environment": {
            **runs["working tree"][0]["environment"],
            "JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS": pipeline if pipeline is not None else "unset",
        },
        "base_rev": base_rev,
        "base_sha": base_sha,
        "working_tree": working_tree,
        "identical": identical,
        "bound": BOUND,
        "rounds": rounds,
        "pairs": pairs,
        "order": order,
        "rows": summarize(runs),
        "runs": runs,
    }
    command = f"python -m benchmarks compare {base_rev}" + (" --quick" if quick else "")
    text = markdown(results, command)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "benchmark-compare.md").write_text(text)
    (docs / "benchmark-compare.json").write_text(json.dumps(results, indent=1))
    print(text)
    return results


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], int(sys.argv[3]))
        sys.stdout.flush()
        os._exit(0)
    print(__doc__)
