"""The seed at its real size: one 64 MiB constant matmul'd against 160 weight matrices.

    python -m benchmarks seed-real           # writes docs/results/benchmark-seed-real.md and .json
    python -m benchmarks.seed_real --variant argument --pipeline default --layers 4 --mib 1 \
        --json row.json                      # one variant, one process; its row as JSON, docs untouched
    python -m benchmarks.seed_real --worker JSON   # one variant, one process (internal)

jax #5308 as reported: one 64 MB NumPy constant used by 160 layers inside one
jitted function. Each (variant, pipeline) runs in an interpreter of its own,
so the peak RSS that the operating system reports is that variant's alone.
The worker prints one JSON line per stage it finishes; the parent watches the
child's resident memory and wall time, and a variant that passes either limit,
is killed, or raises out of memory is reported as having run out, with the
last stage it reached, instead of being skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from . import seed
from ._harness import DOCS, PIPELINES, environment, pipeline_env

LAYERS, MIB = 160, 64.0
QUICK_LAYERS, QUICK_MIB = 40, 16.0
REPEATS = 3  # runs per variant and pipeline, each in a fresh process; medians
# The variants jax #5308 is about, under both pipelines, with the honest
# alternatives beside frozenconst: a `jnp.array` closed over (what the
# simplified pipeline passes as frozenconst.jit does) and the argument baseline.
VARIANTS = ["numpy-closure", "jnp.array-closure", "argument", "frozenconst-closure", "frozenconst.jit"]
_OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "MemoryError", "Out of memory", "std::bad_alloc")


def _rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def default_rss_limit() -> int:
    """The memory a variant may hold before it counts as out of memory: 90% of the machine's."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.9)


def run_variant(
    variant: str,
    pipeline: str,
    layers: int,
    mib: float,
    steps: int,
    rss_limit: int,
    timeout_s: float,
    budget_s: float = 0.5,
) -> dict[str, Any]:
    """Measure one variant in a fresh interpreter; a row with `outcome` "ok" or "ran out: ...".

    `budget_s`: about how long its timed steps may take, at least `steps` of them.
    """
    env = pipeline_env(PIPELINES[pipeline])
    spec = json.dumps(
        {"variant": variant, "layers": layers, "mib": mib, "steps": steps, "budget_s": budget_s}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.seed_real", "--worker", spec],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    errors: list[str] = []
    readers = [
        threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True),
        threading.Thread(target=lambda: errors.extend(proc.stderr or ()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    start = time.monotonic()
    stopped, highest = "", 0
    try:
        while True:
            # os.wait4 rather than Popen.wait: the kernel's rusage of this child, its
            # peak RSS included, also when it was killed.
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            highest = max(highest, _rss_of(proc.pid))
            if not stopped and highest > rss_limit:
                stopped = f"resident memory passed the {rss_limit / 2**30:.1f} GiB limit"
                proc.kill()
            elif not stopped and time.monotonic() - start > timeout_s:
                stopped = f"still running after {timeout_s:.0f} s"
                proc.kill()
            time.sleep(0.05)
    except BaseException:  # interrupted (Ctrl-C, a time limit): the worker goes too
        proc.kill()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall_s = time.monotonic() - start
    for reader in readers:
        reader.join(timeout=10)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    stages = [json.loads(line) for line in lines if line.startswith("{")]
    row: dict[str, Any] = {
        "variant": variant,
        "pipeline": pipeline,
        "layers": layers,
        "mib": mib,
        "wall_s": wall_s,
        "os_peak_rss_bytes": usage.ru_maxrss * 1024,  # KiB on Linux
    }
    result = next((s["result"] for s in stages if "result" in s), None)
    if proc.returncode == 0 and result is not None and not stopped:
        row.update(result, outcome="ok")
        return row
    stderr = "".join(errors)
    if stopped:
        why = stopped
    elif proc.returncode == -9:
        why = "killed by signal 9 (the kernel's out-of-memory killer, most likely)"
    elif any(marker in stderr for marker in _OUT_OF_MEMORY):
        why = "out of memory: " + next(m for m in _OUT_OF_MEMORY if m in stderr)
    else:
        raise RuntimeError(f"seed-real worker failed ({variant}, {pipeline}):\n{stderr[-4000:]}")
    last = stages[-1] if stages else {"stage": "none (JAX not yet started)", "rss_bytes": 0}
    row.update(
        outcome=f"ran out: {why}",
        last_stage=last["stage"],
        rss_at_last_stage_bytes=last["rss_bytes"],
        peak_rss_bytes=usage.ru_maxrss * 1024,
    )
    return row


def _worker(spec: str) -> None:
    request = json.loads(spec)
    try:  # if the machine runs short, the kernel's out-of-memory killer takes this process first
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass

    def report(stage: str, **extra: Any) -> None:
        print(json.dumps({"stage": stage, "rss_bytes": _rss_of(os.getpid()), **extra}), flush=True)

    import jax.numpy as jnp

    jnp.zeros(1).block_until_ready()  # the backend is up: what every variant pays
    report("started")
    row = seed.measure(
        request["variant"], request["layers"], request["mib"], request["steps"], report, request["budget_s"]
    )
    report("done", result=row)


_MEDIAN_KEYS = ("compile_s", "first_call_s", "step_s", "peak_rss_bytes", "os_peak_rss_bytes", "wall_s")


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a variant's runs: medians, or the first run that ran out, if any did."""
    out = [r for r in runs if r["outcome"] != "ok"]
    if out:
        return {**out[0], "runs": len(runs), "runs_out": len(out)}
    return {
        **runs[0],
        **{k: statistics.median(r[k] for r in runs) for k in _MEDIAN_KEYS},
        "runs": len(runs),
        "runs_out": 0,
    }


def run(quick: bool, rss_limit: int | None = None, repeats: int = REPEATS) -> list[dict[str, Any]]:
    """Every variant under both pipelines, each run in a fresh process, `repeats` runs each.

    The variants' order rotates from run to run, so drift in the machine's load
    does not always favour the same one.
    """
    layers, mib = (QUICK_LAYERS, QUICK_MIB) if quick else (LAYERS, MIB)
    limit = rss_limit or default_rss_limit()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(repeats):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for pipeline in PIPELINES:
            for variant in order:
                row = run_variant(variant, pipeline, layers, mib, 3 if quick else 5, limit, timeout_s=900)
                print(f"  {pipeline:10s} {variant:20s} {row['outcome']} ({row['wall_s']:.0f} s)", flush=True)
                runs.setdefault((pipeline, variant), []).append(row)
    return [_merge(runs[(p, v)]) for p in PIPELINES for v in VARIANTS]


def _x(value: float, base: dict[str, Any] | None, key: str) -> str:
    if base is None or base.get("outcome") != "ok" or not base[key]:
        return ""
    return f" ({value / base[key]:.2f}x)"


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table; each figure also as a ratio to the as-argument baseline of its pipeline."""
    base = {r["pipeline"]: r for r in rows if r["variant"] == "argument"}
    lines = [
        "| pipeline | variant | live copies | device MiB | HLO bytes (x base) | compile s (x base) "
        "| step ms (x base) | peak RSS MiB (x base) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b = base.get(r["pipeline"])
        if r["outcome"] != "ok":
            how_far = f"after stage '{r['last_stage']}' at {r['rss_at_last_stage_bytes'] / 2**20:,.0f} MiB"
            lines.append(
                f"| {r['pipeline']} | {r['variant']} | {r['outcome']} (in {r.get('runs_out', 1)} of "
                f"{r.get('runs', 1)} runs), {how_far} | | | | | {r['peak_rss_bytes'] / 2**20:,.0f} |"
            )
            continue
        lines.append(
            f"| {r['pipeline']} | {r['variant']} | {r['live_copies']} "
            f"| {r['device_bytes'] / 2**20:,.0f} "
            f"| {r['hlo_bytes']:,}{_x(r['hlo_bytes'], b, 'hlo_bytes')} "
            f"| {r['compile_s']:.2f}{_x(r['compile_s'], b, 'compile_s')} "
            f"| {r['step_s'] * 1e3:.0f}{_x(r['step_s'], b, 'step_s')} "
            f"| {r['peak_rss_bytes'] / 2**20:,.0f}{_x(r['peak_rss_bytes'], b, 'peak_rss_bytes')} |"
        )
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]], env: dict[str, str], command: str, wall_s: float) -> str:
    layers, mib = rows[0]["layers"], rows[0]["mib"]
    return (
        f"### The seed at its real size: {mib:g} MiB, L = {layers}\n\n"
        "![device memory and peak RSS per variant](benchmark-seed-real.png)\n\n"
        f"Produced by `{command}` in {wall_s:.0f} s on: "
        + ", ".join(f"{k} {v}" for k, v in env.items())
        + ".\n\n"
        f"jax #5308 as reported: one {mib:g} MiB float32 constant matmul'd against {layers} weight "
        f"matrices inside one jitted function. Each variant ran {rows[0].get('runs', 1)} time(s), each "
        "time in a fresh interpreter of its own, so its peak RSS (the kernel's VmHWM, read after the "
        "steps and before any counting) is its alone; the variants' order rotated from run to run, and "
        "each figure is the median over the runs. Ratios are to the as-argument baseline of the same "
        "pipeline, measured the same way. Compile is trace + lower + compile; step is the median of "
        "the timed steps within a run. Live copies and device MiB "
        "count the distinct device buffers holding the constant's data (`jax.live_arrays()`): on the CPU "
        "backend they are part of the process's RSS. The raw NumPy constant sits 16 bytes off the "
        "64-byte grid, so the CPU backend copies it, as an accelerator would, instead of aliasing it "
        "(jax #37830). A variant whose process passes 90% of the machine's memory, is killed, or raises "
        "out of memory is shown as having run out, with the last stage it finished.\n\n" + table(rows) + "\n"
    )


PAGE_BEGIN, PAGE_END = "<!-- seed-real:begin -->", "<!-- seed-real:end -->"
_PAGE_VARIANTS = {
    "numpy-closure": "raw NumPy array, closed over, `jax.jit`",
    "jnp.array-closure": "`jnp.array`, closed over, `jax.jit`",
    "argument": "`jnp.array` passed as an argument, `jax.jit` (baseline)",
    "frozenconst-closure": "`FrozenConst`, closed over, `jax.jit`",
    "frozenconst.jit": "`FrozenConst`, closed over, `frozenconst.jit`",
}


def page_table(rows: list[dict[str, Any]]) -> str:
    """docs/performance.md's first table: every variant of the real-size case, figures and ratios."""
    base = {r["pipeline"]: r for r in rows if r["variant"] == "argument"}
    lines = [
        f"| one {rows[0]['mib']:g} MiB constant, {rows[0]['layers']} layers | pipeline "
        "| live device copies | HLO bytes | compile s | step ms | peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        what = _PAGE_VARIANTS[r["variant"]]
        if r["outcome"] != "ok":
            lines.append(
                f"| {what} | {r['pipeline']} | **{r['outcome']}** after '{r['last_stage']}' | | | "
                f"| {r['peak_rss_bytes'] / 2**30:.1f} GiB |"
            )
            continue
        b = base.get(r["pipeline"])
        lines.append(
            f"| {what} | {r['pipeline']} | {r['live_copies']} ({r['device_bytes'] / 2**20:,.0f} MiB) "
            f"| {r['hlo_bytes'] / 1e6:,.2f} MB{_x(r['hlo_bytes'], b, 'hlo_bytes')} "
            f"| {r['compile_s']:.2f}{_x(r['compile_s'], b, 'compile_s')} "
            f"| {r['step_s'] * 1e3:.0f}{_x(r['step_s'], b, 'step_s')} "
            f"| {r['peak_rss_bytes'] / 2**30:.2f} GiB{_x(r['peak_rss_bytes'], b, 'peak_rss_bytes')} |"
        )
    return "\n".join(lines)


def update_page(path: pathlib.Path, rows: list[dict[str, Any]]) -> bool:
    """Replace the page's table between the seed-real markers; False if the markers are missing."""
    text = path.read_text()
    if PAGE_BEGIN not in text or PAGE_END not in text:
        return False
    head, rest = text.split(PAGE_BEGIN, 1)
    _, tail = rest.split(PAGE_END, 1)
    path.write_text(f"{head}{PAGE_BEGIN}\n{page_table(rows)}\n{PAGE_END}{tail}")
    return True


def plot(rows: list[dict[str, Any]], path: pathlib.Path) -> None:
    """Each variant under each pipeline: live device MiB and peak RSS (top), HLO bytes (bottom).

    A constant embedded in the program holds no device buffer, so its memory bar
    is 0: the HLO panel below shows where its data went. Every bar carries its
    figure, so a 0 reads as 0 on the log axis too.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers, mib = rows[0]["layers"], rows[0]["mib"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey=True, sharex="row")
    for col, pipeline in enumerate(("default", "simplified")):
        sel = [r for r in rows if r["pipeline"] == pipeline and r.get("outcome", "ok") == "ok"]
        names = [r["variant"] for r in sel]
        y = [float(i) for i in range(len(sel))]
        memory, hlo = axes[0][col], axes[1][col]
        device = [r["device_bytes"] / 2**20 for r in sel]
        # The table's peak (VmHWM after the steps), not the kernel's at exit,
        # which also counts the HLO text printed for measuring only.
        peak = [r["peak_rss_bytes"] / 2**20 for r in sel]
        bars: list[tuple[Any, list[float], list[float], str, str, float]] = [
            (memory, [i + 0.2 for i in y], device, "live device MiB holding the constant", "MiB", 1.0),
            (memory, [i - 0.2 for i in y], peak, "process peak RSS (VmHWM after the steps), MiB", "MiB", 1.0),
            (hlo, y, [r["hlo_bytes"] / 1e6 for r in sel], "HLO text of the compiled program, MB", "MB", 0.01),
        ]
        for ax, at, values, label, unit, floor in bars:
            color = "C2" if ax is hlo else None
            ax.barh(
                at,
                values,
                height=0.4 if ax is memory else 0.6,
                label=label if col == 0 else None,
                color=color,
            )
            for where, value in zip(at, values, strict=True):
                text = f"{value:,.2f} {unit}" if unit == "MB" else f"{value:,.0f} {unit}"
                if value == 0:
                    text += " (embedded in the program: see below)" if unit == "MiB" else ""
                ax.annotate(
                    text,
                    (max(value, floor), where),
                    fontsize=7,
                    va="center",
                    xytext=(3, 0),
                    textcoords="offset points",
                )
        for ax, floor in ((memory, 1.0), (hlo, 0.01)):
            ax.set_yticks(y, names)
            ax.set_xscale("log")
            ax.set_xlim(left=floor)
            ax.grid(True, axis="x", which="both", alpha=0.3)
        memory.set_title(f"{pipeline} pipeline: {mib:g} MiB constant, L = {layers}")
        hlo.set_xlabel("HLO text, MB")
    axes[0][0].set_xlim(right=max(2 * r["peak_rss_bytes"] / 2**20 for r in rows))
    axes[1][0].set_xlim(right=max(4 * r["hlo_bytes"] / 1e6 for r in rows if "hlo_bytes" in r))
    fig.legend(loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(quick: bool, docs: pathlib.Path, rss_limit: int | None = None) -> list[dict[str, Any]]:
    start = time.monotonic()
    rows = run(quick, rss_limit, 1 if quick else REPEATS)
    wall_s = time.monotonic() - start
    env = environment()
    command = "python -m benchmarks seed-real" + (" --quick" if quick else "")
    text = markdown(rows, env, command, wall_s)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "benchmark-seed-real.md").write_text(text)
    plot(rows, docs / "benchmark-seed-real.png")
    (docs / "benchmark-seed-real.json").write_text(
        json.dumps({"environment": env, "command": command, "wall_s": wall_s, "rows": rows}, indent=1)
    )
    page = docs.parent / "performance.md"  # docs/results -> docs: its first table, the real size only
    if not quick and page.exists():
        update_page(page, rows)
    print(text)
    return rows


def _cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--variant",
        choices=sorted(seed.VARIANTS),
        help="measure this variant alone in a fresh interpreter; without it, the whole section",
    )
    parser.add_argument("--pipeline", choices=sorted(PIPELINES), default="default")
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--mib", type=float, default=MIB)
    parser.add_argument("--steps", type=int, default=5, help="timed steps at least")
    parser.add_argument(
        "--rss-limit-bytes",
        type=int,
        help="resident memory at which the variant counts as out of memory (default: 90%% of RAM)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=900, help="wall time at which it counts as run out"
    )
    parser.add_argument(
        "--json", metavar="PATH", help="with --variant: write its row and its table to PATH as JSON"
    )
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json and not args.variant:
        parser.error("--json goes with --variant (the whole section writes docs/results/)")
    if args.worker:
        _worker(args.worker)
    elif args.variant:
        limit = args.rss_limit_bytes or default_rss_limit()
        row = run_variant(
            args.variant, args.pipeline, args.layers, args.mib, args.steps, limit, args.timeout_s
        )
        text = table([row])
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"row": row, "table": text}, f, indent=1)
    else:
        main(False, DOCS, args.rss_limit_bytes)


if __name__ == "__main__":
    _cli()
