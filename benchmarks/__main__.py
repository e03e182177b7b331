"""Run the benchmark suite and write its figures into docs/.

    python -m benchmarks                 # everything (make bench): every section below
    python -m benchmarks seed            # seed scenario: L in 10, 40, 160; 1, 4, 16 MiB; both pipelines
    python -m benchmarks seed-real       # the seed at its real size: 64 MiB, L = 160, a process per variant
    python -m benchmarks core            # construction, transfer, zero-copy, cache hits, scaling, digests
    python -m benchmarks disk            # peak memory building constants from 256 MiB and 1 GiB .npy files
    python -m benchmarks multihost       # constants bigger than one host: per-process RSS, 2 and 4 processes
    python -m benchmarks constants       # per-call cost against the number of constants, with the peers
    python -m benchmarks anyjit          # jax.jit closing over FrozenConsts against the tables as arguments
    python -m benchmarks training        # the pytree choice, and training steps with a large table
    python -m benchmarks finetune        # the five fine-tuning examples, as written and with the one line
    python -m benchmarks startup         # what the entry points add to `import hypothesis` and to pytest
    python -m benchmarks static-slices   # HLO bytes of a Whisper decoder stand-in slicing its causal mask
    python -m benchmarks export          # programs saved without their constants, beside jax.export,
                                         # up to 2.5 GiB of constants
    python -m benchmarks compare REV     # the core section's per-call figures: git revision REV's
                                         # frozenconst against the working tree's (not part of "all")
    python -m benchmarks accelerator     # device memory, mutation, first transfer per host-memory
                                         # choice, per call, cache hits (`make device`; not part of "all":
                                         # its files are the accelerator's); --small: a CPU smoke run
    python -m benchmarks residency       # constants bigger than the chip (host residency) and a device
                                         # budget; --device: an accelerator's sizes (not part of "all");
                                         # --quick: a CPU smoke run
    python -m benchmarks --quick         # smaller sweeps (a smoke run), written into a new
                                         # temporary folder: docs/results keeps the full run's
    python -m benchmarks SECTION --out DIR   # write that section's files into DIR, not docs/results

Every figure is a ratio to a baseline measured in the same run: the constant
passed to `jax.jit` as an explicit argument for the seed scenario, NumPy,
`jax.device_put`, the cached `jax.Array` or plain `jax.jit` for the core
section. Times are medians of repeated runs. Every A-against-B figure either
alternates A and B in the same memory state (interleaved rounds) or measures
each in fresh interpreters of its own.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from collections.abc import Callable
from typing import Any

from . import (
    accelerator,
    anyjit,
    compare,
    constants,
    core,
    disk,
    export,
    finetune,
    multihost,
    residency,
    seed,
    seed_real,
    startup,
    static_slices,
    training,
)
from ._harness import DOCS, PIPELINES, results_folder


def _median_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    merged = []
    for group in zip(*runs, strict=True):
        row = dict(group[0])
        for key in ("compile_s", "first_call_s", "step_s"):
            row[key] = statistics.median(r[key] for r in group)
        merged.append(row)
    return merged


def plot(rows: list[dict[str, Any]], mib: float, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for col, pipeline in enumerate(PIPELINES):
        for variant in seed.VARIANTS:
            sel = sorted(
                (
                    r
                    for r in rows
                    if r["pipeline"] == pipeline and r["variant"] == variant and r["mib"] == mib
                ),
                key=lambda r: r["layers"],
            )
            if not sel:
                continue
            ls = [r["layers"] for r in sel]
            axes[0][col].plot(ls, [r["device_bytes"] / 2**20 for r in sel], marker="o", label=variant)
            axes[1][col].plot(ls, [r["compile_s"] for r in sel], marker="o", label=variant)
        axes[0][col].set_title(f"{pipeline} constant pipeline, {mib:g} MiB constant")
        axes[0][col].set_ylabel("device MiB holding the constant")
        axes[1][col].set_ylabel("trace + compile, s")
        axes[1][col].set_xlabel("layers L using the constant")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log")
            ax.grid(alpha=0.3)
    axes[0][1].set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_seed(quick: bool, repeats: int, docs: pathlib.Path = DOCS) -> str:
    layers = [10, 40] if quick else [10, 40, 160]
    sizes = [1.0, 4.0] if quick else [1.0, 4.0, 16.0]
    configurations = [(n, m) for m in sizes for n in layers]
    rows: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    for pipeline in PIPELINES:
        # One fresh interpreter per variant and run, each measuring the same
        # configurations in the same order, so no variant inherits another's
        # memory or warm caches; the variants' order rotates from run to run.
        runs: dict[str, list[list[dict[str, Any]]]] = {v: [] for v in seed.VARIANTS}
        names = list(seed.VARIANTS)
        for run in range(repeats):
            for variant in names[run % len(names) :] + names[: run % len(names)]:
                result = seed.run_in_subprocess(
                    pipeline, [(variant, n, m) for n, m in configurations], steps=5
                )
                env = result.pop()["environment"]
                runs[variant].append(result)
        merged = {v: _median_rows(runs[v]) for v in names}
        rows += [merged[v][i] for i in range(len(configurations)) for v in names]

    header = "\n".join(f"- {k}: {v}" for k, v in env.items())
    base = {(r["pipeline"], r["layers"], r["mib"]): r for r in rows if r["variant"] == "argument"}
    worst = {k: 0.0 for k in ("hlo_bytes", "live_copies", "compile_s", "step_s")}
    numpy_worst = {"live_copies": 0.0, "hlo_bytes": 0.0}
    for r in rows:
        b = base[(r["pipeline"], r["layers"], r["mib"])]
        if r["variant"] == "frozenconst.jit":
            for k in worst:
                worst[k] = max(worst[k], r[k] / b[k])
        if r["variant"] == "numpy-closure":
            for k in numpy_worst:
                numpy_worst[k] = max(numpy_worst[k], r[k] / b[k])
    summary = (
        "frozenconst.jit against the as-argument baseline, worst case over every L, size and pipeline: "
        f"HLO bytes {worst['hlo_bytes']:.2f}x, live copies {worst['live_copies']:.2f}x, "
        f"compile {worst['compile_s']:.2f}x, step {worst['step_s']:.2f}x. "
        f"A raw NumPy closure costs up to {numpy_worst['live_copies']:.0f}x the live copies (simplified "
        f"pipeline) and {numpy_worst['hlo_bytes']:.0f}x the HLO bytes (default pipeline)."
    )
    docs.mkdir(parents=True, exist_ok=True)
    plot(rows, 4.0, docs / "benchmark-seed.png")
    command = "python -m benchmarks seed" + (" --quick" if quick else "")
    (docs / "benchmark-results.md").write_text(
        "# Benchmark results: constants inside jit\n\n"
        f"Produced by `{command}` ({repeats} runs per configuration, medians) on:\n\n{header}\n\n"
        f"**Summary.** {summary}\n\n"
        '--8<-- "results/benchmark-seed-real.md"\n\n'
        f"### The sweep: L in {', '.join(map(str, layers))}; {', '.join(f'{m:g}' for m in sizes)} MiB\n\n"
        "![device memory and compile time against L](benchmark-seed.png)\n\n"
        "The seed scenario: one constant matmul'd against L weight matrices inside one jitted function. "
        "Each variant runs in fresh interpreters of its own, one per run, each measuring every L and "
        "size in the same order (the variants' order rotates from run to run), so that no variant "
        "inherits another's memory or warm caches; the figures are medians over the runs. "
        "Each cell: the measurement, and in brackets its ratio to the as-argument baseline of the same "
        "pipeline, L and size. Live copies and device MiB count distinct device buffers holding the "
        "constant's data, read from `jax.live_arrays()` after the steps (independently of frozenconst's "
        "own counters); a constant embedded in the compiled program is not a device buffer and shows "
        "as 0 there, but inflates HLO bytes. The raw NumPy constant sits 16 bytes off the 64-byte grid: "
        "JAX's CPU backend aliases a 64-byte-aligned NumPy buffer instead of copying it (jax #37830), so "
        "an aligned constant's L device arrays would all be views of its host memory (measured: 12 "
        "arrays, 1 buffer), while an accelerator copies every time. Off the grid, the CPU copies too, "
        "and the table shows what an accelerator would hold.\n\n" + seed.table(rows) + "\n"
    )
    (docs / "benchmark-results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print(seed.table(rows))
    print()
    print(summary)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "section",
        nargs="?",
        choices=[
            "all",
            "seed",
            "seed-real",
            "core",
            "constants",
            "anyjit",
            "training",
            "finetune",
            "disk",
            "multihost",
            "startup",
            "static-slices",
            "export",
            "compare",
            "accelerator",
            "residency",
        ],
        default="all",
    )
    parser.add_argument(
        "rev", nargs="?", help="compare: the git revision whose frozenconst is the base (e.g. HEAD, HEAD~3)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sweeps")
    parser.add_argument(
        "--small", action="store_true", help="accelerator: small sizes, a CPU smoke run (under a minute)"
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        help="write the results into this folder (default: docs/results; --quick: a new temp folder)",
    )
    parser.add_argument(
        "--device",
        action="store_true",
        help="anyjit, accelerator, residency: sizes for a lent accelerator's time (`make device`): fewer "
        "compiles, one process per pipeline for the seed; residency sized from the device's memory",
    )
    parser.add_argument("--repeats", type=int, default=3, help="seed runs per configuration (median)")
    parser.add_argument(
        "--rss-limit-gib",
        type=float,
        help="seed-real: resident memory at which a variant counts as out of memory (default: 90%% of RAM)",
    )
    parser.add_argument("--pairs", type=int, help="compare: process pairs (default 5; 3 quick)")
    args = parser.parse_args()
    if (args.section == "compare") != (args.rev is not None):
        parser.error("a revision goes with the compare section, and only with it: compare REV")
    if args.small and args.section != "accelerator":
        parser.error("--small goes with the accelerator section; the others take --quick")
    if args.device and args.section not in ("accelerator", "anyjit", "residency"):
        parser.error("--device goes with the accelerator, anyjit and residency sections")
    docs = results_folder(args.quick, args.out)
    docs.mkdir(parents=True, exist_ok=True)  # a new --out folder: made before an hour of measuring
    limit = int(args.rss_limit_gib * 2**30) if args.rss_limit_gib else None
    sections: dict[str, Callable[[], object]] = {
        "seed": lambda: run_seed(args.quick, args.repeats, docs),
        "seed-real": lambda: seed_real.main(args.quick, docs, limit),
        "core": lambda: core.main(args.quick, docs),
        "constants": lambda: constants.main(args.quick, docs),
        "anyjit": lambda: anyjit.main(args.quick, docs, device=args.device),
        "training": lambda: training.main(args.quick, docs),
        "finetune": lambda: finetune.main(args.quick, docs),
        "disk": lambda: disk.main([64] if args.quick else [256, 1024], docs),  # up to 1 GiB in a temp dir
        "multihost": lambda: multihost.main(args.quick, docs),
        "startup": lambda: startup.main(args.quick, docs),
        "static-slices": lambda: static_slices.main(docs),  # HLO bytes only: the same with --quick
        "export": lambda: export.main([1, 64] if args.quick else [1, 64, 2560], docs),
        # Not in "all": a check for a change, against a revision; and the
        # accelerator's section, whose files are the accelerator's (`make device`).
        "compare": lambda: compare.main(args.rev, args.quick, docs, args.pairs),
        "accelerator": lambda: accelerator.main(args.small or args.quick, docs, device=args.device),
        "residency": lambda: residency.main(args.quick, docs, device=args.device),
    }
    took = {}
    for name, run in sections.items():
        if args.section == name or (
            args.section == "all" and name not in ("compare", "accelerator", "residency")
        ):
            start = time.monotonic()
            run()
            took[name] = time.monotonic() - start
    # How long each section took on this machine: the figure to quote, measured.
    print(
        "\nwall time: "
        + ", ".join(f"{name} {s:.0f} s" for name, s in took.items())
        + f"; {sum(took.values()):.0f} s in all"
    )


if __name__ == "__main__":
    main()
