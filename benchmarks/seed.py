"""The seed scenario: one large constant used by many layers inside one jitted function.

    python -m benchmarks.seed --demo          # the `make demo` table
    python -m benchmarks.seed --pipeline simplified --layers 12 --mib 0.5 --json rows.json
                                              # every variant, one fresh interpreter, rows as JSON
    python -m benchmarks.seed --list --json names.json   # the pipelines and variants, as JSON
    python -m benchmarks.seed --worker ...    # one measurement, as JSON (internal)

`--json PATH` writes the pipelines, the variants and (when something was
measured) the environment and the rows to PATH; nothing under docs/ is written.

JAX reads its constant pipeline (`JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS`) at import,
so each pipeline is measured in a subprocess of its own.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from ._harness import PIPELINES, copy_at, environment, pipeline_env, run_worker

VARIANTS = {
    "numpy-closure": "raw NumPy array, closed over, jax.jit",
    "jnp.array-closure": "jnp.array, closed over, jax.jit",
    "argument": "jnp.array passed as an argument, jax.jit (baseline)",
    "frozenconst-closure": "FrozenConst, closed over, jax.jit",
    "frozenconst.jit": "FrozenConst, closed over, frozenconst.jit",
}


def buffers_holding(data: Any) -> tuple[int, int, int]:
    """(arrays, copies, bytes) of live device arrays and distinct buffers holding `data`.

    Observed through `jax.live_arrays()`: a copy is a distinct (device, buffer
    pointer); several `jax.Array`s over one buffer are one copy.
    """
    import jax
    import numpy as np

    gc.collect()
    arrays = 0
    seen: dict[tuple[Any, int], int] = {}
    for arr in jax.live_arrays():  # type: ignore[no-untyped-call]  # unannotated in jax 0.10
        if arr.is_deleted() or arr.shape != data.shape or arr.dtype != data.dtype:
            continue
        if np.array_equal(np.asarray(arr), data):
            arrays += 1
            for shard in arr.addressable_shards:
                seen[(shard.device, shard.data.unsafe_buffer_pointer())] = shard.data.nbytes
    return arrays, len(seen), sum(seen.values())


def build(variant: str, layers: int, mib: float) -> tuple[Any, Any, tuple[Any, ...]]:
    """The scenario for one variant: `(data, fn, args)`, where `fn(*args)` is one step.

    `data` is the constant's value, for `buffers_holding`; the raw NumPy variant's
    constant is `data` itself, moved off the 64-byte grid (see `copy_at`), so that
    every variant's process holds the constant once on the host.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    import frozenconst

    cols = 256
    rows = max(1, int(mib * 2**20 / 4 / cols))
    # Drawn as float32 directly: no float64 temporary twice the constant's size.
    data = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    weights = [
        jnp.asarray(np.random.default_rng(i + 1).standard_normal((cols, 8), dtype=np.float32))
        for i in range(layers)
    ]

    def model(const: Any, ws: list[Any]) -> Any:
        return sum(jnp.sum(const @ w) for w in ws)

    if variant == "numpy-closure":
        data = copy_at(data, 16)  # off the 64-byte grid: see copy_at
        const: Any = data
        return data, jax.jit(lambda ws: model(const, ws)), (weights,)
    if variant == "jnp.array-closure":
        const = jnp.array(data)
        return data, jax.jit(lambda ws: model(const, ws)), (weights,)
    if variant == "argument":
        return data, jax.jit(model), (jnp.array(data), weights)
    if variant == "frozenconst-closure":
        const = frozenconst.FrozenConst(data)
        return data, jax.jit(lambda ws: model(const, ws)), (weights,)
    if variant == "frozenconst.jit":
        const = frozenconst.FrozenConst(data)
        return data, frozenconst.jit(lambda ws: model(const, ws)), (weights,)
    raise ValueError(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}")


def peak_rss() -> int:
    """This process's peak resident set size in bytes, as the kernel reports it (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def device_memory() -> dict[str, int] | None:
    """The default device's `memory_stats()` (`bytes_in_use`, `peak_bytes_in_use`, ...), or
    None where JAX keeps none (the CPU backend)."""
    import jax

    stats = jax.local_devices()[0].memory_stats()
    return {k: int(v) for k, v in stats.items() if isinstance(v, int)} if stats else None


def measure(
    variant: str,
    layers: int,
    mib: float,
    steps: int = 5,
    progress: Callable[[str], None] | None = None,
    budget_s: float = 0.5,
) -> dict[str, Any]:
    """Build the scenario for one variant and measure it in this process.

    `progress`, if given, is called with the name of each stage as it ends. The
    peak RSS is read after the steps, before anything that only measures (the
    buffer count, the HLO text of a constant embedded in the program: hundreds
    of MB at the seed's size) adds to it.
    """
    report = progress or (lambda stage: None)
    data, fn, args = build(variant, layers, mib)
    report("built")
    start = time.perf_counter()
    lowered = fn.lower(*args)
    report("lowered")
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    del compiled, lowered
    report("compiled")
    # The first call also traces and compiles through jax.jit's own cache.
    first = time.perf_counter()
    fn(*args).block_until_ready()
    first_call_s = time.perf_counter() - first
    report("first call")
    # At least `steps` timed steps, more for fast steps (up to about `budget_s`
    # seconds' worth, 41 at most): short steps need more samples for a stable median.
    probe = time.perf_counter()
    fn(*args).block_until_ready()
    one = max(time.perf_counter() - probe, 1e-6)
    times = []
    n = max(steps, min(41, int(budget_s / one)))
    for i in range(n):
        t = time.perf_counter()
        out = fn(*args).block_until_ready()
        times.append(time.perf_counter() - t)
        del out  # freed after the clock stopped: an accelerator's free is not a step's cost
        report(f"step {i + 1} of {n}")
    # Pipelined: the same steps dispatched back to back and one wait at the end, as a
    # training loop runs them; the outputs are kept until the clock stops.
    import jax

    outs = []
    t = time.perf_counter()
    for _ in range(n):
        outs.append(fn(*args))
    jax.block_until_ready(outs)  # type: ignore[no-untyped-call]  # unannotated in jax 0.10
    pipelined_s = (time.perf_counter() - t) / n
    del outs
    report("pipelined steps")
    peak = peak_rss()
    memory = device_memory()
    arrays, copies, device_bytes = buffers_holding(data)
    hlo_bytes = len(fn.lower(*args).as_text().encode())  # untimed: text is for measuring only
    return {
        "variant": variant,
        "layers": layers,
        "mib": mib,
        "hlo_bytes": hlo_bytes,
        "compile_s": compile_s,
        "first_call_s": first_call_s,
        "step_s": statistics.median(times),
        "pipelined_step_s": pipelined_s,
        "live_arrays": arrays,
        "live_copies": copies,
        "device_bytes": device_bytes,
        "const_bytes": data.nbytes,
        "peak_rss_bytes": peak,
        # The default device's own counters, None where JAX keeps none (the CPU backend).
        "device_bytes_in_use": None if memory is None else memory.get("bytes_in_use"),
        "device_peak_bytes": None if memory is None else memory.get("peak_bytes_in_use"),
    }


def run_in_subprocess(pipeline: str, jobs: list[tuple[str, int, float]], steps: int) -> list[dict[str, Any]]:
    """Measure `jobs` in a fresh interpreter running JAX's `pipeline` constant pipeline."""
    spec = json.dumps({"jobs": jobs, "steps": steps})
    env = pipeline_env(PIPELINES[pipeline])
    rows: list[dict[str, Any]] = run_worker("benchmarks.seed", [spec], f"benchmark worker ({pipeline})", env)
    for row in rows:
        row["pipeline"] = pipeline
    return rows


def _worker(spec: str) -> None:
    request = json.loads(spec)
    rows = []
    for variant, layers, mib in request["jobs"]:
        rows.append(measure(variant, layers, mib, request["steps"]))
        gc.collect()
        import jax

        jax.clear_caches()  # type: ignore[no-untyped-call]  # unannotated in jax 0.10
    rows.append({"environment": environment()})
    print(json.dumps(rows))


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table, each figure also as a ratio to the as-argument baseline of the same run."""
    base = {(r["pipeline"], r["layers"], r["mib"]): r for r in rows if r["variant"] == "argument"}
    lines = [
        "| pipeline | L | MiB | variant | live copies | device MiB | HLO bytes (x base) "
        "| compile s (x base) | step ms (x base) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b = base[(r["pipeline"], r["layers"], r["mib"])]
        lines.append(
            f"| {r['pipeline']} | {r['layers']} | {r['mib']:g} | {r['variant']} | {r['live_copies']} "
            f"| {r['device_bytes'] / 2**20:.1f} "
            f"| {r['hlo_bytes']:,} ({r['hlo_bytes'] / b['hlo_bytes']:.2f}x) "
            f"| {r['compile_s']:.3f} ({r['compile_s'] / b['compile_s']:.2f}x) "
            f"| {r['step_s'] * 1e3:.2f} ({r['step_s'] / b['step_s']:.2f}x) |"
        )
    return "\n".join(lines)


def demo() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Print the `make demo` table and its one-line summary; return its (rows, environment)."""
    layers, mib = 40, 4
    print(
        f"Seed scenario: one {mib} MiB float32 constant matmul'd against {layers} weight matrices "
        "inside one jitted function.\n"
    )
    rows: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    for pipeline in PIPELINES:
        for variant in VARIANTS:  # a fresh interpreter each: none inherits another's memory
            result = run_in_subprocess(pipeline, [(variant, layers, mib)], steps=5)
            env = result.pop()["environment"]
            rows += result
    print(demo_table(rows))
    print("\nvariants:")
    for name, text in VARIANTS.items():
        print(f"  {name:20s} {text}")
    print("\n" + ", ".join(f"{k} {v}" for k, v in env.items()))
    print("Timings: `python -m benchmarks seed` (medians of repeated runs, in docs/results/).")
    print("\n" + demo_summary(rows))
    return rows, env


def demo_table(rows: list[dict[str, Any]]) -> str:
    """`table` without timings: here each is one process's, not a median of repeated runs
    (`python -m benchmarks seed` repeats them and gives medians)."""
    base = {(r["pipeline"], r["layers"], r["mib"]): r for r in rows if r["variant"] == "argument"}
    lines = [
        "| pipeline | variant | live copies | device MiB | HLO bytes (x base) |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        b = base[(r["pipeline"], r["layers"], r["mib"])]
        lines.append(
            f"| {r['pipeline']} | {r['variant']} | {r['live_copies']} | {r['device_bytes'] / 2**20:.1f} "
            f"| {r['hlo_bytes']:,} ({r['hlo_bytes'] / b['hlo_bytes']:.2f}x) |"
        )
    return "\n".join(lines)


def demo_summary(rows: list[dict[str, Any]]) -> str:
    """One line: each variant's HLO bytes (a ratio to the argument baseline) and live device copies."""
    base = {r["pipeline"]: r for r in rows if r["variant"] == "argument"}
    by = {(r["pipeline"], r["variant"]): r for r in rows}
    pipelines = [p for p in PIPELINES if p in base]

    def cell(pipeline: str, variant: str) -> str:
        r = by.get((pipeline, variant))
        if r is None:
            return "not measured"
        ratio = r["hlo_bytes"] / base[pipeline]["hlo_bytes"]
        hlo = f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2f}x"
        return f"{hlo} HLO, {_copies(r['live_copies'])}"

    held = sorted({base[p]["live_copies"] for p in pipelines})
    parts = [
        f"{variant} " + " | ".join(cell(p, variant) for p in pipelines)
        for variant in VARIANTS
        if variant != "argument"
    ]
    return (
        f"Summary ({' | '.join(pipelines)} pipeline; HLO bytes against passing the constant as an "
        f"argument, which holds {' or '.join(map(_copies, held))}): " + "; ".join(parts) + "."
    )


def _copies(n: int) -> str:
    return f"{n} device cop{'y' if n == 1 else 'ies'}"


def measure_pipeline(
    pipeline: str, layers: int, mib: float, steps: int, exclude: list[str]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every variant but `exclude`, in `VARIANTS` order, in one fresh interpreter: (rows, environment)."""
    unknown = sorted(set(exclude) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    jobs = [(variant, layers, mib) for variant in VARIANTS if variant not in exclude]
    rows = run_in_subprocess(pipeline, jobs, steps)
    env: dict[str, str] = rows.pop()["environment"]
    return rows, env


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--demo", action="store_true", help="print the seed scenario table (make demo; the default)"
    )
    parser.add_argument(
        "--pipeline",
        choices=sorted(PIPELINES),
        help="measure every variant under this constant pipeline, in one fresh interpreter",
    )
    parser.add_argument("--layers", type=int, default=40, help="with --pipeline: layers using the constant")
    parser.add_argument("--mib", type=float, default=4.0, help="with --pipeline: the constant's size in MiB")
    parser.add_argument("--steps", type=int, default=5, help="with --pipeline: timed steps at least")
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        choices=sorted(v for v in VARIANTS if v != "argument"),  # every ratio is to the baseline
        metavar="VARIANT",
        help="with --pipeline: leave this variant out (repeatable; the argument baseline stays)",
    )
    parser.add_argument(
        "--list", action="store_true", help="only the pipelines and variants (no measurement)"
    )
    parser.add_argument(
        "--json", metavar="PATH", help="write the pipelines, variants and rows to PATH as JSON"
    )
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    result: dict[str, Any] = {"pipelines": PIPELINES, "variants": VARIANTS}
    if args.list:
        if not args.json:
            print(json.dumps(result, indent=1))
    elif args.pipeline:
        try:
            rows, env = measure_pipeline(args.pipeline, args.layers, args.mib, args.steps, args.exclude)
        except RuntimeError as err:  # the worker failed: its stderr is in the message
            sys.exit(str(err))
        result.update(environment=env, rows=rows)
        print(table(rows))
    else:
        rows, env = demo()
        result.update(environment=env, rows=rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
