"""Any jit: a program closing over FrozenConsts against the same program taking them as arguments.

    python -m benchmarks anyjit            # K in 1, 10, 100, 1000; both pipelines
    python -m benchmarks anyjit --quick    # K in 1, 10, 100

One function adds a 4-element slice of each of K constants (2 KiB each, at most
`embed_max_bytes`) to its input, compiled four ways: plain `jax.jit` closing over
the K FrozenConsts (embedded under JAX's default pipeline, as JAX embeds a small
array; each passed to the executable as a parameter under the simplified one), the
same `jax.jit` with the K tables passed as arguments (the baseline every ratio is
against), `frozenconst.jit` closing over them, and plain `jax.jit` closing over K
`jax.Array`s (what JAX itself does: embedded under the default pipeline, passed once
per use under the simplified one). Each variant's ratio to the better of the two
floors (the argument form and JAX's own handling of closed-over `jax.Array`s) is
taken per round too. Then one 256 KiB table in a small step (a parameter under any
jit), against the same floors and the argument form with one more parameter (what a
parameter costs per call). Per call: medians of interleaved rounds (every
variant once per round, in an order shuffled each round), each a batch of calls of
about 5 ms (20 ms with `--device`) whose last result is waited for; each ratio is taken per round, then the
median. Compile: the first call of a fresh function (trace, lowering, XLA's compile
and the call), the median of several, against the argument form's. Each pipeline
runs in a process of its own (JAX reads it at import).
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._harness import PIPELINES, _block, pipeline_env, results_folder, run_worker

VARIANTS = {
    "jax.jit, FrozenConsts closed over": "plain jax.jit closing over the FrozenConsts",
    "jax.jit, arguments": "plain jax.jit, the tables passed as arguments (the baseline)",
    "frozenconst.jit, closed over": "frozenconst.jit closing over the FrozenConsts",
    "jax.jit, jax.Arrays closed over": "plain jax.jit closing over jax.Arrays: JAX's own handling",
}
BASELINE = "jax.jit, arguments"
EMBEDDED = "jax.jit, jax.Arrays closed over"
SHAPE = (512,)  # 2 KiB of float32 each


def _makers(k: int) -> dict[str, Callable[[], Callable[[], Any]]]:
    """For each variant, a function that builds a fresh jitted function and returns a call of it."""
    import jax
    import jax.numpy as jnp

    import frozenconst

    rng = np.random.default_rng(k)
    data = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(k)]
    arrays = [jnp.asarray(d) for d in data]
    frozen = [frozenconst.FrozenConst(d) for d in data]
    w = jnp.ones(4, jnp.float32)
    i = jnp.int32(0)

    def body(cs: Any, w: Any, i: Any) -> Any:
        acc = w
        for c in cs:
            acc = acc + jax.lax.dynamic_slice_in_dim(jnp.asarray(c), i, 4)
        return acc

    def closed_frozen() -> Callable[[], Any]:
        f = jax.jit(lambda w, i: body(frozen, w, i))
        return lambda: f(w, i)

    def arguments() -> Callable[[], Any]:
        f = jax.jit(lambda cs, w, i: body(cs, w, i))  # a new function: JAX caches traces by function
        return lambda: f(arrays, w, i)

    def ours() -> Callable[[], Any]:
        f = frozenconst.jit(lambda w, i: body(frozen, w, i))
        return lambda: f(w, i)

    def closed_arrays() -> Callable[[], Any]:
        f = jax.jit(lambda w, i: body(arrays, w, i))
        return lambda: f(w, i)

    return {
        "jax.jit, FrozenConsts closed over": closed_frozen,
        BASELINE: arguments,
        "frozenconst.jit, closed over": ours,
        "jax.jit, jax.Arrays closed over": closed_arrays,
    }


def _first_call(make: Callable[[], Callable[[], Any]], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        call = make()
        call().block_until_ready()
        times.append(time.perf_counter() - start)
        del call
    return statistics.median(times)


# A batch's length: calls back to back, the last one waited for. On an accelerator a call takes
# 0.1-1 ms and its rounds vary by several percent, so batches are longer there (`run`).
_BATCH_S = 0.005


def _batch_size(call: Callable[[], Any], batch_s: float = _BATCH_S) -> int:
    each = statistics.median(_block(call, 3) for _ in range(5))
    return max(3, min(4000, round(batch_s / each)))


def measure(k: int, rounds: int, compiles: int, batch_s: float = _BATCH_S) -> list[dict[str, Any]]:
    makers = _makers(k)
    for make in makers.values():  # one untimed round: what any first call pays once per process
        make()().block_until_ready()
    # Compile times first, interleaved: each round builds and runs a fresh function of each.
    first: dict[str, list[float]] = {name: [] for name in makers}
    shuffle = random.Random(k).shuffle
    for _ in range(compiles):
        order = list(makers)
        shuffle(order)
        for name in order:
            first[name].append(_first_call(makers[name], 1))
    calls = {name: make() for name, make in makers.items()}
    for call in calls.values():
        call().block_until_ready()
    batch = {name: _batch_size(call, batch_s) for name, call in calls.items()}
    per_round: dict[str, list[float]] = {name: [] for name in calls}
    gc.disable()
    try:
        for _ in range(rounds):
            order = list(calls)
            shuffle(order)
            for name in order:
                per_round[name].append(_block(calls[name], batch[name]))
    finally:
        gc.enable()
    base, base_first = per_round[BASELINE], first[BASELINE]
    # The better of the two floors in each round: the argument form, or JAX's own handling of
    # closed-over jax.Arrays (embedded under the default pipeline).
    floor = [min(a, b) for a, b in zip(base, per_round[EMBEDDED], strict=True)]
    return [
        {
            "k": k,
            "variant": name,
            "call_us": statistics.median(per_round[name]) * 1e6,
            "call_vs_arguments": statistics.median(t / b for t, b in zip(per_round[name], base, strict=True)),
            "call_vs_best_floor": statistics.median(
                t / b for t, b in zip(per_round[name], floor, strict=True)
            ),
            "compile_s": statistics.median(first[name]),
            "compile_vs_arguments": statistics.median(
                t / b for t, b in zip(first[name], base_first, strict=True)
            ),
        }
        for name in calls
    ]


TABLE_SHAPE = (256, 256)  # one 256 KiB float32 table in a small step


def one_table(rounds: int, batch_s: float = _BATCH_S) -> dict[str, Any]:
    """One 256 KiB table in a small step (`tanh(table @ x)`), per call: closed over as a
    FrozenConst (plain `jax.jit` and `frozenconst.jit`), passed as an argument (the baseline),
    closed over as a `jax.Array` (embedded by JAX's default pipeline), and the argument form with
    one more (unused) parameter, whose difference is what a parameter costs per call. Where the
    embedded program is faster than the argument form by more than a parameter costs, XLA
    compiles the constant it can see differently (folding it, or laying it out for the step)."""
    import jax
    import jax.numpy as jnp

    import frozenconst

    data = np.random.default_rng(3).standard_normal(TABLE_SHAPE).astype(np.float32)
    array, frozen = jnp.asarray(data), frozenconst.FrozenConst(data)
    x, spare = jnp.ones(TABLE_SHAPE[1], jnp.float32), jnp.ones(4, jnp.float32)

    def step(t: Any, v: Any) -> Any:
        return jnp.tanh(t @ v)

    closed, passed = jax.jit(lambda v: step(frozen, v)), jax.jit(step)
    ours, embedded = frozenconst.jit(lambda v: step(frozen, v)), jax.jit(lambda v: step(array, v))
    extra = jax.jit(lambda t, v, unused: step(t, v))
    calls: dict[str, Callable[[], Any]] = {
        "jax.jit, FrozenConst closed over": lambda: closed(x),
        BASELINE: lambda: passed(array, x),
        "frozenconst.jit, closed over": lambda: ours(x),
        EMBEDDED: lambda: embedded(x),
        "jax.jit, arguments and one more parameter": lambda: extra(array, x, spare),
    }
    for call in calls.values():
        call().block_until_ready()
    batch = {name: _batch_size(call, batch_s) for name, call in calls.items()}
    per_round: dict[str, list[float]] = {name: [] for name in calls}
    shuffle = random.Random(7).shuffle
    gc.disable()
    try:
        for _ in range(rounds):
            order = list(calls)
            shuffle(order)
            for name in order:
                per_round[name].append(_block(calls[name], batch[name]))
    finally:
        gc.enable()
    base = per_round[BASELINE]
    rows = {
        name: {
            "call_us": statistics.median(times) * 1e6,
            "call_vs_arguments": statistics.median(t / b for t, b in zip(times, base, strict=True)),
        }
        for name, times in per_round.items()
    }
    parameter_us = statistics.median(
        (t - b) * 1e6
        for t, b in zip(per_round["jax.jit, arguments and one more parameter"], base, strict=True)
    )
    gap_us = statistics.median((b - e) * 1e6 for b, e in zip(base, per_round[EMBEDDED], strict=True))
    # The rounds' own spread: the argument form against itself, round to round.
    spread_us = (
        statistics.median(abs(a - b) * 1e6 for a, b in itertools.pairwise(base)) if len(base) > 1 else 0.0
    )
    if abs(gap_us) <= max(spread_us, 1.5 * max(parameter_us, 0.0)):
        cause = "no more than one parameter's dispatch and the rounds' spread"
    elif gap_us > 0:
        cause = (
            "more than a parameter's dispatch: XLA compiles a constant it can see (folded, laid out "
            "for the step)"
        )
    else:
        cause = "the embedded program is the slower"
    return {
        "mib": data.nbytes / 2**20,
        "rows": rows,
        "parameter_us": parameter_us,
        "spread_us": spread_us,
        "gap_us": gap_us,
        "cause": cause,
    }


def _worker(spec: str) -> None:
    request = json.loads(spec)
    rows = []
    for k in request["ks"]:
        rows += measure(
            k,
            request["rounds"],
            request["compiles"] if k < 1000 else min(3, request["compiles"]),
            request["batch_s"],
        )
        print(json.dumps({"progress": f"K={k}"}), file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows, "one_table": one_table(request["rounds"], request["batch_s"])}))


def run(quick: bool, device: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every K under both pipelines, each pipeline in a process of its own. `device`: the sizes
    for a lent accelerator's time: fewer compiles (each is slower there), more and longer rounds
    (a call's time varies more there: 4% round to round on a TPU v5e, with 7 rounds of 5 ms)."""
    ks = [1, 10, 100] if quick else [100, 1000] if device else [1, 10, 100, 1000]
    rounds, compiles = (7, 3) if quick else (41, 1) if device else (21, 7)
    batch_s = 0.02 if device else _BATCH_S
    rows: list[dict[str, Any]] = []
    tables: dict[str, Any] = {}
    for pipeline, flag in PIPELINES.items():
        spec = json.dumps({"ks": ks, "rounds": rounds, "compiles": compiles, "batch_s": batch_s})
        measured = run_worker(
            "benchmarks.anyjit", [spec], f"benchmark worker ({pipeline})", pipeline_env(flag)
        )
        rows += [{"pipeline": pipeline, **row} for row in measured["rows"]]
        tables[pipeline] = measured["one_table"]
    return rows, tables


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    for pipeline in ("default", "simplified"):
        sel = [r for r in rows if r["pipeline"] == pipeline]
        if not sel:
            continue
        ks = sorted({r["k"] for r in sel})
        out += [
            f"**{pipeline} pipeline**: per call, µs (ratio to the argument form in the same rounds); "
            "compile and first call, ms (ratio)",
            "",
            "| variant | " + " | ".join(f"K = {k}" for k in ks) + " |",
            "|---|" + "---:|" * len(ks),
        ]
        for variant in VARIANTS:
            cells = []
            for k in ks:
                (r,) = [r for r in sel if r["k"] == k and r["variant"] == variant]
                cells.append(
                    f"{r['call_us']:.1f} ({r['call_vs_arguments']:.2f}x; "
                    f"{r.get('call_vs_best_floor', float('nan')):.2f}x the better floor); "
                    f"{r['compile_s'] * 1e3:.0f} ({r['compile_vs_arguments']:.2f}x)"
                )
            out.append(f"| {variant} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def table_of_one(tables: dict[str, Any]) -> str:
    """The one-table case per pipeline: per call and ratio to the argument form, and the cause of
    the embedded program's difference."""
    out = []
    for pipeline, t in tables.items():
        out += [
            f"**{pipeline} pipeline**, one {t['mib'] * 1024:.0f} KiB table: per call, µs "
            "(ratio to the argument form)",
            "",
            "| variant | µs | ratio |",
            "|---|---:|---:|",
        ]
        out += [
            f"| {name} | {r['call_us']:.1f} | {r['call_vs_arguments']:.3f} |" for name, r in t["rows"].items()
        ]
        out += [
            "",
            f"One more parameter costs {t['parameter_us']:.2f} µs per call (rounds spread by "
            f"{t.get('spread_us', 0.0):.2f} µs); the embedded program's lead over the argument form is "
            f"{t['gap_us']:.2f} µs: {t['cause']}.",
            "",
        ]
    return "\n".join(out)


def markdown(
    rows: list[dict[str, Any]], env: dict[str, str], command: str, tables: dict[str, Any] | None = None
) -> str:
    lines = [
        "# Any jit: closed over against passed as arguments",
        "",
        f"Generated by `{command}`.",
        "",
        *[f"- {k}: {v}" for k, v in env.items()],
        "",
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        "",
        table(rows),
        *(["## One large table", "", table_of_one(tables)] if tables else []),
    ]
    return "\n".join(lines) + "\n"


def main(quick: bool, docs: Any, device: bool = False) -> list[dict[str, Any]]:
    """Measure, then write the table and the JSON into `docs` (`anyjit-results.*`; on a device
    other than the CPU, `anyjit-<platform>-results.*`, so that both stay side by side)."""
    import jax

    from ._harness import environment

    rows, tables = run(quick, device)
    env = environment()
    platform = jax.default_backend()
    command = "python -m benchmarks anyjit" + (" --quick" if quick else "") + (" --device" if device else "")
    text = markdown(rows, env, command, tables)
    stem = "anyjit-results" if platform == "cpu" else f"anyjit-{platform}-results"
    (docs / f"{stem}.md").write_text(text)
    (docs / f"{stem}.json").write_text(
        json.dumps({"environment": env, "rows": rows, "one_table": tables}, indent=1)
    )
    print(text)
    return rows


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
        sys.stdout.flush()
        os._exit(0)
    main("--quick" in sys.argv, results_folder("--quick" in sys.argv), device="--device" in sys.argv)
