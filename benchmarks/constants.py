"""Per-call and first-call cost against the number of constants a function holds.

    python -m benchmarks constants            # K in 1, 10, 100, 1000; both pipelines
    python -m benchmarks constants --quick    # K in 1, 10, 100

One function adds a 4-element slice of each of K constants to its input. The
constants are held the way each library holds them: closed over by `jax.jit`,
passed to `jax.jit` as arguments, closed over as FrozenConsts by
`frozenconst.jit`, fields of an `eqx.Module` under `eqx.filter_jit`, and
`nnx.Variable`s of an `nnx.Module` under `nnx.jit`; and, as the floor for any
wrapper written in Python, the cheapest Python object in front of `jax.jit`
closed over (a `__call__` that passes its arguments on). Each pipeline runs in a
process of its own (JAX reads it at import). Per-call times are medians of
interleaved rounds (every variant once per round, in an order shuffled each
round), each a batch of calls whose last result is waited for
(`block_until_ready`), so a time is what a call costs, not how fast calls
enter JAX's dispatch queue. Each variant's batch is as many calls as take
about 5 ms (at least 3), so that the wait for the last call is a small part
of every variant's time, the fastest ones' too; ratios are per round against the better of
`jax.jit`'s two forms in that round, then the median. First calls are timed
on fresh functions (medians of three).
"""

from __future__ import annotations

import gc
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
    "jax.jit, closure": "jax.jit, the constants closed over (jax.Arrays)",
    "jax.jit, arguments": "jax.jit, the constants passed as arguments",
    "frozenconst.jit": "frozenconst.jit, FrozenConsts closed over",
    "Python layer (floor)": "a Python `__call__` in front of jax.jit closed over, passing its arguments on",
    "eqx.filter_jit": "eqx.filter_jit, the constants fields of an eqx.Module argument",
    "nnx.jit": "nnx.jit, the constants nnx.Variables of an nnx.Module argument",
}
SIZES = {"16 B": (4,), "1 MiB": (256, 1024)}


class _Layer:
    """The floor for any wrapper of `jax.jit` written in Python, `frozenconst.jit` among them:
    an object whose `__call__` passes its arguments on to a `jax.jit` function, and nothing
    else. Its cost is CPython's call of a Python `__call__` in front of JAX's C++ dispatch."""

    __slots__ = ("_f",)

    def __init__(self, f: Callable[..., Any]) -> None:
        self._f = f

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._f(*args, **kwargs)


def _makers(k: int, shape: tuple[int, ...], peers: bool = True) -> dict[str, Callable[[], Callable[[], Any]]]:
    """For each variant, a function that builds a fresh jitted function and returns a call of it.

    `peers=False`: `jax.jit`'s two forms and `frozenconst.jit` only (no equinox, no flax).
    """
    import jax
    import jax.numpy as jnp

    import frozenconst

    rng = np.random.default_rng(k)
    data = [rng.standard_normal(shape).astype(np.float32) for _ in range(k)]
    arrays = [jnp.asarray(d) for d in data]
    frozen = [frozenconst.FrozenConst(d) for d in data]
    w = jnp.ones(4, jnp.float32)
    i = jnp.int32(0)

    def body(cs: Any, w: Any, i: Any) -> Any:
        acc = w
        for c in cs:
            acc = acc + jax.lax.dynamic_slice_in_dim(jnp.asarray(c).reshape(-1), i, 4)
        return acc

    def closure() -> Callable[[], Any]:
        f = jax.jit(lambda w, i: body(arrays, w, i))
        return lambda: f(w, i)

    def arguments() -> Callable[[], Any]:
        f = jax.jit(lambda cs, w, i: body(cs, w, i))  # a new function: JAX caches traces by function
        return lambda: f(arrays, w, i)

    def ours() -> Callable[[], Any]:
        f = frozenconst.jit(lambda w, i: body(frozen, w, i))
        return lambda: f(w, i)

    def layer() -> Callable[[], Any]:
        f = _Layer(jax.jit(lambda w, i: body(arrays, w, i)))
        return lambda: f(w, i)

    makers = {
        "jax.jit, closure": closure,
        "jax.jit, arguments": arguments,
        "frozenconst.jit": ours,
        "Python layer (floor)": layer,
    }
    if not peers:
        return makers
    import equinox as eqx
    from flax import nnx

    class Holder(eqx.Module):
        cs: tuple[Any, ...]

    class Net(nnx.Module):
        def __init__(self, cs: list[Any]) -> None:
            self.cs = nnx.List([nnx.Variable(c) for c in cs])

    holder = Holder(tuple(arrays))
    net = Net(arrays)

    def equinox() -> Callable[[], Any]:
        f = eqx.filter_jit(lambda h, w, i: body(h.cs, w, i))
        return lambda: f(holder, w, i)

    def flax_nnx() -> Callable[[], Any]:
        f = nnx.jit(lambda m, w, i: body([v[...] for v in m.cs], w, i))
        return lambda: f(net, w, i)

    return {**makers, "eqx.filter_jit": equinox, "nnx.jit": flax_nnx}


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


# Seconds a batch of one variant's calls takes (the last call's result waited for).
_BATCH_S = 0.005


def _batch_size(call: Callable[[], Any]) -> int:
    """Calls of `call` that take about `_BATCH_S`, from the median of a few short batches."""
    each = statistics.median(_block(call, 3) for _ in range(5))
    return max(3, min(4000, round(_BATCH_S / each)))


def measure(k: int, size: str, rounds: int) -> list[dict[str, Any]]:
    """Per-call and first-call time of every variant for K constants of `size`."""
    makers = _makers(k, SIZES[size])
    for make in makers.values():  # one untimed round: what any first call pays once per process
        make()().block_until_ready()
    first = {name: _first_call(make, 3 if k <= 100 else 1) for name, make in makers.items()}
    calls = {name: make() for name, make in makers.items()}
    for call in calls.values():
        call().block_until_ready()
    # Each variant's batch takes about `_BATCH_S`: as many calls as fit, at least 3. One
    # size for all, set by the slowest (`nnx.jit` at K = 1000: 30 ms a call), made the
    # fast variants' batches 5 calls, whose time was mostly the wait for the last one and
    # moved by 1.4x from run to run (issue #26, K = 1000).
    batch = {name: _batch_size(call) for name, call in calls.items()}
    names = list(calls)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    # In a fixed order some slots came out up to 1.6x slower, whichever variant
    # sat there (measured on an accelerator host): a new order every round, seeded.
    shuffle = random.Random(k).shuffle
    gc.disable()
    try:
        for _ in range(rounds):
            order = list(names)
            shuffle(order)
            for name in order:
                per_round[name].append(_block(calls[name], batch[name]))
    finally:
        gc.enable()
    best = [
        min(a, b) for a, b in zip(per_round["jax.jit, closure"], per_round["jax.jit, arguments"], strict=True)
    ]
    best_first = min(first["jax.jit, closure"], first["jax.jit, arguments"])
    floor = per_round["Python layer (floor)"]
    return [
        {
            "k": k,
            "size": size,
            "variant": name,
            "call_us": statistics.median(per_round[name]) * 1e6,
            "vs_best_jax_jit": statistics.median(t / b for t, b in zip(per_round[name], best, strict=True)),
            "vs_floor": statistics.median(t / b for t, b in zip(per_round[name], floor, strict=True)),
            "first_call_s": first[name],
            "first_vs_best_jax_jit": first[name] / best_first,
        }
        for name in names
    ]


def _worker(spec: str) -> None:
    request = json.loads(spec)
    rows = []
    for k, size in request["jobs"]:
        rows += measure(k, size, request["rounds"])
        print(json.dumps({"progress": f"K={k} {size}"}), file=sys.stderr, flush=True)
    print(json.dumps(rows))


def run(quick: bool) -> list[dict[str, Any]]:
    """Every (K, size) in a subprocess per pipeline."""
    ks = [1, 10, 100] if quick else [1, 10, 100, 1000]
    # 1 MiB constants stop at K = 100: `jax.jit` with 1000 of them closed over
    # embeds 1 GiB in the program under the default pipeline.
    jobs = [(k, "16 B") for k in ks] + [(k, "1 MiB") for k in ks if k <= 100]
    rows = []
    for pipeline, flag in PIPELINES.items():
        spec = json.dumps({"jobs": jobs, "rounds": 7 if quick else 15})
        env = pipeline_env(flag)
        measured = run_worker(
            "benchmarks.constants", [spec], f"benchmark worker ({pipeline})", env, timeout=None
        )
        rows += [{"pipeline": pipeline, **row} for row in measured]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """One Markdown table per (pipeline, size): per-call time and ratios against K."""
    out = []
    for pipeline in ("default", "simplified"):
        for size in SIZES:
            sel = [r for r in rows if r["pipeline"] == pipeline and r["size"] == size]
            if not sel:
                continue
            ks = sorted({r["k"] for r in sel})
            out += [
                f"**{pipeline} pipeline, constants of {size} each**: per-call time (ratio to the better "
                "of the two `jax.jit` forms in the same rounds); first call (ratio)",
                "",
                "| variant | " + " | ".join(f"K = {k}" for k in ks) + " |",
                "|---|" + "---:|" * len(ks),
            ]
            for variant in VARIANTS:
                cells = []
                for k in ks:
                    (r,) = [r for r in sel if r["k"] == k and r["variant"] == variant]
                    cells.append(
                        f"{r['call_us']:.1f} µs ({r['vs_best_jax_jit']:.2f}x); "
                        f"{r['first_call_s'] * 1e3:.0f} ms ({r['first_vs_best_jax_jit']:.2f}x)"
                    )
                out.append(f"| {variant} | " + " | ".join(cells) + " |")
            ours = {r["k"]: r["vs_floor"] for r in sel if r["variant"] == "frozenconst.jit"}
            out += [
                "",
                "`frozenconst.jit` per call against the Python-layer floor in the same rounds: "
                + ", ".join(f"K = {k} {ours[k]:.2f}x" for k in ks)
                + ".",
                "",
            ]
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, pipeline in zip(axes, ("default", "simplified"), strict=True):
        for variant in VARIANTS:
            sel = sorted(
                (
                    r
                    for r in rows
                    if r["pipeline"] == pipeline and r["size"] == "16 B" and r["variant"] == variant
                ),
                key=lambda r: r["k"],
            )
            ax.plot([r["k"] for r in sel], [r["call_us"] for r in sel], marker="o", label=variant)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("constants in the function (K, 16 B each)")
        ax.set_title(f"{pipeline} constant pipeline")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("per-call time (µs)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(rows: list[dict[str, Any]], env: dict[str, str], command: str) -> str:
    lines = [
        "# Cost as constants multiply",
        "",
        f"Generated by `{command}`.",
        "",
        *[f"- {k}: {v}" for k, v in env.items()],
        "",
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        "",
        "![per-call time against K](benchmark-constants.png)",
        "",
        table(rows),
    ]
    return "\n".join(lines) + "\n"


def main(quick: bool, docs: Any) -> list[dict[str, Any]]:
    """Measure, then write the table, the plot and the JSON into `docs`."""
    from ._harness import environment

    rows = run(quick)
    env = environment()
    command = "python -m benchmarks constants" + (" --quick" if quick else "")
    plot(rows, docs / "benchmark-constants.png")
    text = markdown(rows, env, command)
    (docs / "constants-results.md").write_text(text)
    (docs / "constants-results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print(text)
    return rows


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
        sys.stdout.flush()
        os._exit(0)
    main("--quick" in sys.argv, results_folder("--quick" in sys.argv))
