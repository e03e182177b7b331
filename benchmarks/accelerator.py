"""The accelerator section: what frozenconst promises for device memory, on whatever backend runs it.

    python -m benchmarks accelerator            # writes docs/results/accelerator-results.md, .json, .png
    python -m benchmarks accelerator --small    # small sizes: the CPU smoke run of `make test` (< 1 min)
    python -m benchmarks accelerator --out DIR  # write the three files into DIR instead

Made for an accelerator (`make device`, CONTRIBUTING.md "On an accelerator"); it runs
on the CPU backend too, where device buffers are host memory. Every measurement
runs in a fresh interpreter: the seed per variant and pipeline, the rest one
process per part, so no part inherits another's device memory or warm caches.

- The seed at its real size (64 MiB, L = 160) per variant and pipeline: live device
  copies (`jax.live_arrays()`), device bytes in use and at peak
  (`device.memory_stats()`, where the backend keeps them), HLO bytes, compile time,
  and step time both synchronous (a wait per step) and pipelined (one wait).
- Host mutation during asynchronous transfer: the source written right after
  `jax.device_put` returns, and from a thread while a FrozenConst is built.
- The first transfer in GB/s for each host-memory choice that the installed
  frozenconst offers, and the transfer again after `evict()`, against
  `jax.device_put` of the same NumPy array (its first and its repeated transfer),
  the construction time of each, and the floors of page-locked memory (the device
  reading a page-locked `jax.Array`; filling one from NumPy and from the device);
  `stats()` against `memory_stats()` as a constant is built, transferred and evicted.
- Per call against the number of constants, and cache hits.

Variants are timed in an order shuffled each round (a fixed order gave the 2nd and
4th variant up to 1.6x on the H200), and their outputs are freed after the clock
stops. Ratios are to a baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import inspect
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from . import seed, seed_real
from ._harness import DOCS, PIPELINES, copy_at, pipeline_env, run_worker
from ._harness import environment as _stamp

MIB = 1 << 20
_T = TypeVar("_T")
ROOT = pathlib.Path(__file__).resolve().parent.parent
# The host-memory choices asked for (issue #28 §1), in this order; those the installed
# frozenconst does not offer are left out and named in the results.
HOST_MEMORY = ("auto", "pinned", "pageable")


def sizes(small: bool) -> dict[str, Any]:
    """Every size and count of the run: the real ones, or a CPU smoke run's."""
    if small:
        return {
            "seed": (8, 1.0),
            "seed_timeout_s": 120,
            "mutation_mib": 4,
            "trials": 3,
            "transfer_mib": [4, 16],
            "transfer_reps": 3,
            "ks": [1, 10],
            "rounds": 3,
            "block_s": 0.01,
        }
    return {
        "seed": (seed_real.LAYERS, seed_real.MIB),
        "seed_timeout_s": 180,
        "mutation_mib": 256,
        "trials": 5,
        "transfer_mib": [256, 1024],
        "transfer_reps": 4,
        "ks": [1, 10, 100, 1000],
        "rounds": 15,
        "block_s": 0.05,
    }


def offered_host_memory(wanted: tuple[str, ...] = HOST_MEMORY) -> list[str]:
    """The choices of `wanted` that `FrozenConst(..., host_memory=...)` takes here; none before #28 §1."""
    from frozenconst import FrozenConst

    if "host_memory" not in inspect.signature(FrozenConst).parameters:
        return []
    return list(wanted)


# -- what ran where ---------------------------------------------------------------


def _commit() -> str:
    # The device machine gets the working tree without .git: `tools/device-run` passes the
    # commit the bundle was built from.
    if os.environ.get("FROZENCONST_COMMIT"):
        return os.environ["FROZENCONST_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git here, FROZENCONST_COMMIT unset)"
    return head + (" with uncommitted changes" if dirty else "")


def _driver() -> str:
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip():
            return "NVIDIA " + out.stdout.strip().splitlines()[0]
    return "not exposed"


def environment() -> dict[str, str]:
    """The backend, device, driver, versions, date and commit, as the results name them."""
    import importlib.metadata

    import jax

    env = _stamp()  # date, CPU, memory, commit, versions: every results file's stamp
    device = jax.devices()[0]
    env["device"] = f"{device.device_kind} ({device.platform}), {jax.device_count()} device(s)"
    env["runtime"] = str(getattr(getattr(device, "client", None), "platform_version", "not exposed"))
    env["driver"] = _driver()
    env["jaxlib"] = importlib.metadata.version("jaxlib")
    env["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    env["commit"] = _commit()
    return env


# -- timing -------------------------------------------------------------------------


def kept_block(call: Callable[[], Any], n: int) -> float:
    """Seconds per call of `n` calls dispatched back to back and one wait at the end.

    The outputs are kept until the clock stops, so freeing them is not timed.
    """
    import jax

    outs: list[Any] = [None] * n
    start = time.perf_counter()
    for i in range(n):
        outs[i] = call()
    jax.block_until_ready(outs)  # type: ignore[no-untyped-call]  # unannotated in jax 0.10
    elapsed = time.perf_counter() - start
    del outs
    return elapsed / n


def shuffled(items: list[_T], rng: random.Random) -> list[_T]:
    """A new list of `items` in an order drawn from `rng`: a fresh order each round."""
    order = list(items)
    rng.shuffle(order)
    return order


# -- the parts, each run in a worker process ----------------------------------------


def mutation(mib: int, trials: int) -> list[dict[str, Any]]:
    """How often the device copy differs from the source as it was, when the source is written
    right after the transfer starts, or from a thread while a FrozenConst is built."""
    import jax
    import jax.numpy as jnp

    from frozenconst import FrozenConst

    n = mib * MIB // 4

    def written_after(make: Callable[[np.ndarray[Any, Any]], Any]) -> int:
        differs = 0
        for _ in range(trials):
            source = np.ones(n, np.float32)
            out = make(source)
            source[:] = 2.0  # at once: the transfer may still be reading it
            differs += not bool(np.all(np.asarray(out) == 1.0))
            del out
        return differs

    def put(source: np.ndarray[Any, Any]) -> Any:
        return jax.device_put(source)

    def asarray(source: np.ndarray[Any, Any]) -> Any:
        return jnp.asarray(source)

    def frozen(source: np.ndarray[Any, Any]) -> Any:
        return FrozenConst(source).__jax_array__()

    rows = [
        {"case": "written right after", "how": how, "differs": written_after(make), "trials": trials}
        for how, make in (("jax.device_put(a)", put), ("jnp.asarray(a)", asarray), ("FrozenConst(a)", frozen))
    ]

    # A thread writes the whole source again and again, one value per pass.
    source = np.zeros(n, np.float32)
    stop = threading.Event()

    def hammer() -> None:
        value = 0.0
        while not stop.is_set():
            value += 1.0
            source[:] = value

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    torn = {"jax.device_put(a)": 0, "FrozenConst(a)": 0}
    frozen_differs = 0
    try:
        for _ in range(trials):
            device = np.asarray(jax.device_put(source))
            torn["jax.device_put(a)"] += len(np.unique(device[:: max(1, n // 4096)])) > 1
            x = FrozenConst(source)
            host, device = np.asarray(x), np.asarray(jnp.asarray(x))
            torn["FrozenConst(a)"] += len(np.unique(host[:: max(1, n // 4096)])) > 1
            frozen_differs += not np.array_equal(device.view(np.uint32), host.view(np.uint32))
            del x, host, device
    finally:
        stop.set()
        thread.join()
    rows += [
        {
            "case": "a thread writing during construction",
            "how": "jax.device_put(a)",
            "differs": None,
            "torn": torn["jax.device_put(a)"],
            "trials": trials,
        },
        {
            "case": "a thread writing during construction",
            "how": "FrozenConst(a)",
            "differs": frozen_differs,
            "torn": torn["FrozenConst(a)"],
            "trials": trials,
        },
    ]
    return [{**r, "mib": mib} for r in rows]


def transfer(sizes_mib: list[int], reps: int, choices: list[str], rng_seed: int) -> dict[str, Any]:
    """First transfer and transfer again (GB/s) and construction (s) per host-memory choice,
    against `jax.device_put` of the same NumPy array (first and repeated); the floors of
    page-locked memory (the device reading a page-locked `jax.Array`, and filling one from NumPy
    or from the device); and `stats()` against `memory_stats()` for one constant."""
    import jax

    import frozenconst
    from frozenconst import FrozenConst

    from ._harness import single_device_sharding

    device = jax.local_devices()[0]
    on_device = single_device_sharding(device)
    page_locked = single_device_sharding(device, memory_kind="pinned_host")
    rng = random.Random(rng_seed)
    rows = []
    floors = []
    for mib in sizes_mib:
        data = np.random.default_rng(mib).standard_normal(mib * MIB // 4, dtype=np.float32)
        # name -> the keywords of `FrozenConst(a, **keywords)`, or None for `jax.device_put(a)`.
        cases: dict[str, dict[str, Any] | None] = {"jax.device_put(a)": None}
        for choice in choices:
            cases[f"FrozenConst(a, host_memory={choice!r})"] = {"host_memory": choice}
        if not choices:
            cases["FrozenConst(a)"] = {}
        first_s: dict[str, list[float]] = {name: [] for name in cases}
        again_s: dict[str, list[float]] = {name: [] for name in cases}
        build_s: dict[str, list[float]] = {name: [] for name in cases}
        floor_s: dict[str, list[float]] = {}

        def timed(call: Callable[[], Any]) -> float:
            start = time.perf_counter()
            out = call()
            jax.block_until_ready(out)  # type: ignore[no-untyped-call]  # unannotated in jax 0.10
            took = time.perf_counter() - start
            del out
            return took

        for _ in range(reps):
            for name in shuffled([*cases, "floors"], rng):
                # A fresh NumPy array each sample (JAX moves an array it has seen faster), off
                # the 64-byte grid, so the CPU backend copies it as an accelerator does (jax #37830).
                source = copy_at(data, 16)
                gc.collect()
                if name == "floors":
                    put = jax.device_put(source, on_device)
                    put.block_until_ready()
                    try:
                        locked = jax.device_put(put, page_locked)
                        locked.block_until_ready()
                    except Exception:  # a backend without page-locked memory: no floors
                        continue
                    samples = {
                        "the device reads a page-locked jax.Array": (locked, on_device),
                        "page-locked memory filled from NumPy": (source, page_locked),
                        "page-locked memory filled from the device": (put, page_locked),
                    }
                    for floor, (what, where) in samples.items():
                        floor_s.setdefault(floor, []).append(
                            timed(functools.partial(jax.device_put, what, where))
                        )
                    del put, locked, samples
                    continue
                keywords = cases[name]
                start = time.perf_counter()
                held = source if keywords is None else FrozenConst(source, **keywords)
                built = time.perf_counter()
                out = jax.device_put(held) if keywords is None else held.__jax_array__()
                out.block_until_ready()
                done = time.perf_counter()
                del out
                if keywords is None:
                    again = timed(
                        functools.partial(jax.device_put, source)
                    )  # JAX moving an array it has seen
                else:
                    build_s[name].append(built - start)
                    # Transferred again after `evict()`: the second transfer, untimed, waits for
                    # whatever the first one started (a page-locked copy); the third is timed.
                    held.evict()
                    held.__jax_array__().block_until_ready()
                    held.evict()
                    again = timed(held.__jax_array__)
                first_s[name].append(done - built)
                again_s[name].append(again)
                del held, source
        base, base_again = (
            statistics.median(first_s["jax.device_put(a)"]),
            statistics.median(again_s["jax.device_put(a)"]),
        )
        for name in cases:
            t, t_again = statistics.median(first_s[name]), statistics.median(again_s[name])
            rows.append(
                {
                    "mib": mib,
                    "case": name,
                    "transfer_ms": t * 1e3,
                    "gbs": mib * MIB / t / 1e9,
                    "x_device_put": base / t,
                    "again_ms": t_again * 1e3,
                    "again_gbs": mib * MIB / t_again / 1e9,
                    "again_x_device_put": base / t_again,
                    "again_x_device_put_repeated": base_again / t_again,
                    "construction_ms": statistics.median(build_s[name]) * 1e3 if build_s[name] else None,
                }
            )
        for floor, times in floor_s.items():
            t = statistics.median(times)
            floors.append({"mib": mib, "floor": floor, "ms": t * 1e3, "gbs": mib * MIB / t / 1e9})
        del data

    # The library's own accounting against the device's counters, for one constant.
    device = jax.local_devices()[0]

    def in_use() -> int | None:
        stats = device.memory_stats()
        return int(stats["bytes_in_use"]) if stats and "bytes_in_use" in stats else None

    def ours() -> int:
        return int(frozenconst.stats().device_bytes.get(device, 0))

    mib = sizes_mib[0]
    gc.collect()
    steps = [("before", in_use(), ours())]
    x = FrozenConst(np.random.default_rng(7).standard_normal(mib * MIB // 4, dtype=np.float32))
    steps.append(("built", in_use(), ours()))
    x.__jax_array__().block_until_ready()
    steps.append(("transferred", in_use(), ours()))
    x.evict()
    gc.collect()
    steps.append(("evicted", in_use(), ours()))
    accounting = [{"stage": s, "device_bytes_in_use": d, "stats_device_bytes": o} for s, d, o in steps]
    return {
        "rows": rows,
        "floors": floors,
        "choices": choices,
        "accounting": accounting,
        "accounting_mib": mib,
    }


def per_call(ks: list[int], rounds: int, block_s: float, rng_seed: int) -> list[dict[str, Any]]:
    """Per-call time against the number of constants (16 B each): `jax.jit`'s two forms and
    `frozenconst.jit` (the `constants` section adds the peers), shuffled each round; ratios to
    the better `jax.jit` form of the same round."""
    from .constants import _makers

    rng = random.Random(rng_seed)
    rows = []
    for k in ks:
        calls = {name: make() for name, make in _makers(k, (4,), peers=False).items()}
        # Compiled untimed; then each block of calls lasts about `block_s`.
        n = {name: min(5000, max(3, int(block_s / kept_block(call, 3)))) for name, call in calls.items()}
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(rounds):
            gc.collect()
            gc.disable()
            try:
                for name in shuffled(list(calls), rng):
                    samples[name].append(kept_block(calls[name], n[name]))
            finally:
                gc.enable()
        best = [
            min(a, b) for a, b in zip(samples["jax.jit, closure"], samples["jax.jit, arguments"], strict=True)
        ]
        for name, times in samples.items():
            rows.append(
                {
                    "k": k,
                    "variant": name,
                    "call_us": statistics.median(times) * 1e6,
                    "vs_best_jax_jit": statistics.median(t / b for t, b in zip(times, best, strict=True)),
                }
            )
        del calls
        gc.collect()
    return rows


def cache_hits(rounds: int) -> list[dict[str, Any]]:
    """The core section's cache hits: FrozenConst against its cached `jax.Array` and the floor."""
    from .core import cache_hits as measure

    return measure(rounds)


_PARTS: dict[str, Callable[..., Any]] = {
    "mutation": mutation,
    "transfer": transfer,
    "per-call": per_call,
    "cache-hits": cache_hits,
}


def _worker(spec: str) -> None:
    request = json.loads(spec)
    import jax.numpy as jnp

    jnp.zeros(1).block_until_ready()  # the backend is up before anything is timed
    result = _PARTS[request["part"]](*request["args"])
    print(json.dumps({"result": result, "environment": environment()}))


def _run_part(part: str, *args: Any, timeout: float = 900) -> tuple[Any, dict[str, str]]:
    out = run_worker(
        "benchmarks.accelerator",
        [json.dumps({"part": part, "args": args})],
        f"accelerator part {part}",
        env=pipeline_env(PIPELINES["default"]),
        cwd=ROOT,
        timeout=timeout,
    )
    return out["result"], out["environment"]


def seed_runs(
    small: bool, rng: random.Random, rows: list[dict[str, Any]], after_each: Callable[[], None] = lambda: None
) -> list[dict[str, Any]]:
    """Every variant of the seed under both pipelines, each in a fresh process, in shuffled order.

    Each row is appended to `rows` as it comes, then `after_each()` is called; at the end
    `rows` is sorted by pipeline and variant and returned.
    """
    import jax

    layers, mib = sizes(small)["seed"]
    timeout = sizes(small)["seed_timeout_s"]
    simplified = hasattr(jax.config, "jax_use_simplified_jaxpr_constants")  # jax >= 0.7
    jobs = [(p, v) for p in PIPELINES if simplified or p == "default" for v in seed_real.VARIANTS]
    for pipeline, variant in shuffled(jobs, rng):
        try:
            row = seed_real.run_variant(
                variant,
                pipeline,
                layers,
                mib,
                3,
                seed_real.default_rss_limit(),
                timeout_s=timeout,
                budget_s=0.05 if small else 0.5,
            )
        except RuntimeError as err:  # the worker failed outright: its last words
            last = str(err).strip().splitlines()[-1][:300]
            row = {
                "variant": variant,
                "pipeline": pipeline,
                "layers": layers,
                "mib": mib,
                "outcome": f"failed: {last}",
            }
        print(f"  seed {pipeline:10s} {variant:20s} {row['outcome']}", flush=True)
        rows.append(row)
        after_each()
    rows.sort(key=lambda r: jobs.index((r["pipeline"], r["variant"])))
    return rows


def seed_per_pipeline(small: bool, rng: random.Random, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seed's headline variants (a raw NumPy closure, the argument form, a FrozenConst closed
    over), in one fresh process per pipeline (a lent accelerator's time: each process that opens
    a TPU costs 6 to 15 s): live copies, device bytes in use after each variant's steps, HLO
    bytes and times; the peak of one process spans its variants, so it is left out."""
    import jax

    layers, mib = sizes(small)["seed"]
    simplified = hasattr(jax.config, "jax_use_simplified_jaxpr_constants")
    for pipeline in PIPELINES:
        if pipeline == "simplified" and not simplified:
            continue
        headline = ["numpy-closure", "argument", "frozenconst-closure"]  # before, the floor, after
        jobs = [(variant, layers, mib) for variant in shuffled(headline, rng)]
        try:
            measured = seed.run_in_subprocess(pipeline, jobs, 3)
        except RuntimeError as err:  # the worker failed outright: its last words
            last = str(err).strip().splitlines()[-1][:300]
            measured = [
                {
                    "variant": v,
                    "pipeline": pipeline,
                    "layers": layers,
                    "mib": mib,
                    "outcome": f"failed: {last}",
                }
                for v, _, _ in jobs
            ]
        for row in measured:
            if "environment" in row:
                continue
            row.setdefault("outcome", "ok")
            row["device_peak_bytes"] = None  # one process for every variant: no peak of its own
            print(f"  seed {pipeline:10s} {row['variant']:20s} {row['outcome']}", flush=True)
            rows.append(row)
    order = [(p, v) for p in PIPELINES for v in seed_real.VARIANTS]
    rows.sort(key=lambda r: order.index((r["pipeline"], r["variant"])))
    return rows


def run(
    small: bool,
    rng_seed: int = 0,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
    device: bool = False,
) -> dict[str, Any]:
    """Every part, each in fresh interpreters; the results as one JSON-ready dict.

    The headline parts first (mutation, the first transfer, the seed), so a run stopped
    at its time limit has them; `checkpoint(results)` is called after each part (and
    each seed variant), with what is done.
    """
    rng = random.Random(rng_seed)
    size = sizes(small)
    start = time.monotonic()
    results: dict[str, Any] = {"small": small, "sizes": size, "part_s": {}, "environment": {}}

    def timed(part: str, measure: Callable[[], Any]) -> Any:
        began = time.monotonic()
        out = measure()
        results["part_s"][part] = time.monotonic() - began
        results["wall_s"] = time.monotonic() - start
        print(f"  {part}: {results['part_s'][part]:.0f} s", flush=True)
        return out

    def done() -> None:
        if checkpoint is not None:
            checkpoint(results)

    if device and not small:
        size.update(mutation_mib=64, transfer_mib=[512], transfer_reps=3)
    results["mutation"], results["environment"] = timed(
        "mutation", lambda: _run_part("mutation", size["mutation_mib"], size["trials"], timeout=120)
    )
    done()
    choices = offered_host_memory()
    results["transfer"], _ = timed(
        "transfer",
        lambda: _run_part(
            "transfer", size["transfer_mib"], size["transfer_reps"], choices, rng_seed, timeout=180
        ),
    )
    results["transfer"]["asked"] = list(HOST_MEMORY)
    done()
    results["seed"] = []
    if device:
        # A lent accelerator's time: the seed's headline variants, one process per pipeline; the
        # per-call figures are the anyjit section's, run beside this one (`make device`).
        timed("seed", lambda: seed_per_pipeline(small, rng, results["seed"]))
        results["complete"] = True
        done()
        return results
    timed("seed", lambda: seed_runs(small, rng, results["seed"], done))
    done()
    results["per_call"], _ = timed(
        "per call",
        lambda: _run_part("per-call", size["ks"], size["rounds"], size["block_s"], rng_seed, timeout=180),
    )
    done()
    results["cache_hits"], _ = timed(
        "cache hits", lambda: _run_part("cache-hits", size["rounds"], timeout=120)
    )
    results["complete"] = True
    done()
    return results


# -- the results, as tables and a plot --------------------------------------------


def _x(value: float | None, base: float | None) -> str:
    return f" ({value / base:.2f}x)" if value is not None and base else ""


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MIB:,.0f}"


def seed_table(rows: list[dict[str, Any]]) -> str:
    """The seed per variant and pipeline; ratios to the as-argument baseline of its pipeline."""
    base = {r["pipeline"]: r for r in rows if r["variant"] == "argument" and r.get("outcome") == "ok"}
    lines = [
        "| pipeline | variant | live copies | device MiB (live arrays) | in use / peak MiB (memory_stats) "
        "| HLO bytes (x base) | compile s (x base) | step ms (x base) | pipelined step ms (x base) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("outcome") != "ok":
            lines.append(f"| {r['pipeline']} | {r['variant']} | {r['outcome']} | | | | | | |")
            continue
        b = base.get(r["pipeline"], {})
        lines.append(
            f"| {r['pipeline']} | {r['variant']} | {r['live_copies']} | {_mib(r['device_bytes'])} "
            f"| {_mib(r.get('device_bytes_in_use'))} / {_mib(r.get('device_peak_bytes'))} "
            f"| {r['hlo_bytes']:,}{_x(r['hlo_bytes'], b.get('hlo_bytes'))} "
            f"| {r['compile_s']:.2f}{_x(r['compile_s'], b.get('compile_s'))} "
            f"| {r['step_s'] * 1e3:.1f}{_x(r['step_s'], b.get('step_s'))} "
            f"| {r['pipelined_step_s'] * 1e3:.1f}{_x(r['pipelined_step_s'], b.get('pipelined_step_s'))} |"
        )
    return "\n".join(lines)


def mutation_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| source written | by | device copy differs from the source as given "
        "| torn (values of several writes) |",
        "|---|---|---:|---:|",
    ]
    for r in rows:
        differs = "n/a (no copy to compare)" if r["differs"] is None else f"{r['differs']} of {r['trials']}"
        torn = f"{r['torn']} of {r['trials']}" if "torn" in r else ""
        lines.append(f"| {r['case']} ({r['mib']} MiB) | `{r['how']}` | {differs} | {torn} |")
    return "\n".join(lines)


def transfer_table(result: dict[str, Any]) -> str:
    lines = [
        "| MiB | of | first transfer ms | GB/s | x `jax.device_put` | again ms | GB/s "
        "| x `jax.device_put` first / repeated | construction ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        build = "" if r["construction_ms"] is None else f"{r['construction_ms']:.1f}"
        again = (
            f"| {r['again_ms']:.2f} | {r['again_gbs']:.2f} "
            f"| {r['again_x_device_put']:.2f} / {r['again_x_device_put_repeated']:.2f} "
            if "again_ms" in r
            else "| | | "
        )
        lines.append(
            f"| {r['mib']} | `{r['case']}` | {r['transfer_ms']:.2f} | {r['gbs']:.2f} "
            f"| {r['x_device_put']:.2f} {again}| {build} |"
        )
    floors = result.get("floors", [])
    if floors:
        lines += ["", "| MiB | floor | ms | GB/s |", "|---:|---|---:|---:|"]
        lines += [f"| {f['mib']} | {f['floor']} | {f['ms']:.2f} | {f['gbs']:.2f} |" for f in floors]
    return "\n".join(lines)


def accounting_table(result: dict[str, Any]) -> str:
    steps = result["accounting"]
    first = steps[0]["device_bytes_in_use"]
    lines = [
        f"| a {result['accounting_mib']} MiB constant | `memory_stats()` bytes in use, change "
        "| `frozenconst.stats()` device bytes |",
        "|---|---:|---:|",
    ]
    for s in steps:
        change = "n/a" if s["device_bytes_in_use"] is None else f"{s['device_bytes_in_use'] - first:+,}"
        lines.append(f"| {s['stage']} | {change} | {s['stats_device_bytes']:,} |")
    return "\n".join(lines)


def per_call_table(rows: list[dict[str, Any]]) -> str:
    ks = sorted({r["k"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lines = ["| variant | " + " | ".join(f"K = {k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for v in variants:
        cells = []
        for k in ks:
            (r,) = [r for r in rows if r["k"] == k and r["variant"] == v]
            cells.append(f"{r['call_us']:.1f} µs ({r['vs_best_jax_jit']:.2f}x)")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cache_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| call | FrozenConst µs | jax.Array µs | ratio to jax.Array | floor µs | ratio to the floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['case']} | {r['a_us']:.2f} | {r['b_us']:.2f} | {r['ratio']:.3f} | {r['floor_us']:.2f} "
        f"| {r['vs_floor']:.3f} |"
        for r in rows
    ]
    return "\n".join(lines)


def summary(results: dict[str, Any]) -> str:
    """The ratios the README quotes, from this run (of the parts that finished)."""
    parts = []
    ok = {(r["pipeline"], r["variant"]): r for r in results.get("seed", []) if r.get("outcome") == "ok"}
    raw, ours = ok.get(("simplified", "numpy-closure")), ok.get(("simplified", "frozenconst.jit"))
    if raw and ours:
        parts.append(
            f"seed, simplified pipeline: a raw NumPy closure left {raw['live_copies']} device copies, "
            f"frozenconst.jit {ours['live_copies']} "
            f"({raw['device_bytes'] / max(ours['device_bytes'], 1):.0f}x the bytes)"
        )
    after = {r["how"]: r for r in results.get("mutation", []) if r["case"] == "written right after"}
    put, fc = after.get("jax.device_put(a)"), after.get("FrozenConst(a)")
    if put and fc:
        parts.append(
            f"source written right after the transfer: device copy differs {put['differs']} of "
            f"{put['trials']} times with jax.device_put, {fc['differs']} of {fc['trials']} with FrozenConst"
        )
    if "transfer" in results:
        rows = results["transfer"]["rows"]
        largest = max(r["mib"] for r in rows)
        best = max(
            (r for r in rows if r["mib"] == largest and r["case"] != "jax.device_put(a)"),
            key=lambda r: r["gbs"],
        )
        parts.append(
            f"first transfer of {largest} MiB: `{best['case']}` at {best['x_device_put']:.2f}x "
            "jax.device_put's GB/s"
        )
        pinned = [r for r in rows if r["mib"] == largest and "pinned" in r["case"] and "again_ms" in r]
        if pinned:
            r = pinned[0]
            parts.append(
                f"transferred again (after `evict()`), a pinned constant of {largest} MiB at "
                f"{r['again_gbs']:.1f} GB/s: {r['again_x_device_put']:.2f}x jax.device_put's first "
                f"transfer, {r['again_x_device_put_repeated']:.2f}x its repeated one"
            )
    if "per_call" in results:
        parts.append(
            "frozenconst.jit per call against the better jax.jit form: "
            + ", ".join(
                f"{r['vs_best_jax_jit']:.2f}x at K = {r['k']}"
                for r in results["per_call"]
                if r["variant"] == "frozenconst.jit"
            )
        )
    if "cache_hits" in results:
        ratios = [r["ratio"] for r in results["cache_hits"]]
        parts.append(f"cache hits {min(ratios):.2f}-{max(ratios):.2f}x a jax.Array")
    return "; ".join(parts) + "."


def _choices(transfer: dict[str, Any]) -> str:
    missing = [c for c in transfer["asked"] if c not in transfer["choices"]]
    if not transfer["choices"]:
        return (
            "This frozenconst has no host-memory choice yet (`host_memory=`, issue #28 §1): the "
            "constant is built the one way it offers."
        )
    left_out = f"; not offered by this frozenconst: {', '.join(missing)}" if missing else ""
    return f"Host-memory choices measured: {', '.join(transfer['choices'])}{left_out}."


def markdown(results: dict[str, Any], command: str) -> str:
    """The results page: every part that finished, each with how it was measured."""
    env = results["environment"]
    size = results["sizes"]
    layers, mib = size["seed"]
    stopped = (
        [] if results.get("complete") else ["**Incomplete**: the run stopped after the parts below.", ""]
    )
    lines = [
        "# On an accelerator: device memory, transfers and per-call cost",
        "",
        f"Produced by `{command}` in {results.get('wall_s', 0):.0f} s on:",
        "",
        *[f"- {k}: {' '.join(str(v).split())}" for k, v in env.items()],
        "",
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        "",
        *stopped,
        f"**Summary.** {summary(results)}",
        "",
        "![device memory, transfers, per-call cost](accelerator.png)",
        "",
    ]
    if "mutation" in results:
        lines += [
            "## Host mutation during asynchronous transfer",
            "",
            "Written right after: the source is overwritten as soon as the call returns, before anything "
            "waits for the transfer. A thread writing during construction: it writes the whole source again "
            "and again, one value per pass; a torn copy holds values of several passes. A FrozenConst's "
            "device copy is compared with its own frozen host copy, bit for bit.",
            "",
            mutation_table(results["mutation"]),
            "",
        ]
    if "seed" in results:
        lines += [
            f"## The seed: {mib:g} MiB constant, L = {layers}",
            "",
            "One interpreter per variant and pipeline, in shuffled order. Live copies and device MiB count "
            "the distinct device buffers holding the constant's data (`jax.live_arrays()`); in use and peak "
            "are the default device's `memory_stats()` after the steps (n/a where the backend keeps none). "
            "Step: one wait per step; pipelined: the steps dispatched back to back, one wait.",
            "",
            seed_table(results["seed"]),
            "",
        ]
    if "transfer" in results:
        lines += [
            "## First transfer per host-memory choice",
            "",
            f"{_choices(results['transfer'])} Each sample starts from a fresh NumPy array (built untimed) "
            "and a fresh constant (its construction timed apart); the cases run in shuffled order, "
            f"{size['transfer_reps']} samples each, medians.",
            "",
            transfer_table(results["transfer"]),
            "",
            "`frozenconst.stats()` against the device's own counters:",
            "",
            accounting_table(results["transfer"]),
            "",
        ]
    if "per_call" in results:
        lines += [
            "## Per call against the number of constants (16 B each)",
            "",
            f"Default pipeline; {size['rounds']} rounds, each variant once per round in shuffled order, "
            "calls dispatched back to back with one wait, outputs freed after the clock stops; ratios per "
            "round to the better `jax.jit` form, medians. The peers (equinox, flax) are in the constants "
            "section.",
            "",
            per_call_table(results["per_call"]),
            "",
        ]
    if "cache_hits" in results:
        lines += [
            "## Cache hits (8x8 float32)",
            "",
            "The core section's measure: FrozenConst and its cached `jax.Array` (and the one-slot floor) "
            f"alternating in blocks of 1000 calls, {size['rounds']} rounds.",
            "",
            cache_table(results["cache_hits"]),
            "",
        ]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Four panels, each of a part that finished: seed device memory, first transfer, per call, mutation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ok = [r for r in results.get("seed", []) if r.get("outcome") == "ok"]
    if ok:
        axes[0][0].barh(range(len(ok)), [(r.get("device_peak_bytes") or r["device_bytes"]) / MIB for r in ok])
        axes[0][0].set_yticks(
            list(range(len(ok))), [f"{r['pipeline']}: {r['variant']}" for r in ok], fontsize=7
        )
        axes[0][0].set_xscale("log")
    axes[0][0].set_title("seed: device MiB (peak where kept, else live copies)")
    for name in dict.fromkeys(r["case"] for r in results.get("transfer", {}).get("rows", [])):
        sel = [r for r in results["transfer"]["rows"] if r["case"] == name]
        axes[0][1].plot([r["mib"] for r in sel], [r["gbs"] for r in sel], marker="o", label=name)
    axes[0][1].set(title="first transfer", xlabel="MiB", ylabel="GB/s", xscale="log")
    per_call = results.get("per_call", [])
    for v in dict.fromkeys(r["variant"] for r in per_call):
        sel = sorted((r for r in per_call if r["variant"] == v), key=lambda r: r["k"])
        axes[1][0].plot([r["k"] for r in sel], [r["call_us"] for r in sel], marker="o", label=v)
    axes[1][0].set(title="per call against K constants", xlabel="K", ylabel="µs", xscale="log", yscale="log")
    mutation = results.get("mutation", [])
    if mutation:
        counted = [
            ("differs", r["differs"]) if r["differs"] is not None else ("torn", r["torn"]) for r in mutation
        ]
        axes[1][1].barh(
            range(len(mutation)), [n / r["trials"] for (_, n), r in zip(counted, mutation, strict=True)]
        )
        labels = [
            f"{r['how']}, {'written after' if r['case'].startswith('written') else 'thread'}: {what}"
            for (what, _), r in zip(counted, mutation, strict=True)
        ]
        axes[1][1].set_yticks(list(range(len(mutation))), labels, fontsize=7)
    axes[1][1].set(title="host mutation: fraction of trials", xlim=(0, 1))
    for ax in (axes[0][1], axes[1][0]):
        if ax.get_lines():
            ax.legend(fontsize=7)
    for row in axes:
        for ax in row:
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(small: bool, docs: pathlib.Path, device: bool = False) -> dict[str, Any]:
    """Measure every part; write accelerator-results.md, .json and accelerator.png into `docs`.

    The JSON is written after each part; stopped early (Ctrl-C, `tools/device-run`'s time
    limit), the three files hold the parts that finished.
    """
    command = (
        "python -m benchmarks accelerator" + (" --small" if small else "") + (" --device" if device else "")
    )
    docs.mkdir(parents=True, exist_ok=True)
    finished: dict[str, Any] = {}

    def save(results: dict[str, Any]) -> None:
        finished.update(results)
        (docs / "accelerator-results.json").write_text(json.dumps({"command": command, **results}, indent=1))

    try:
        run(small, checkpoint=save, device=device)
    except KeyboardInterrupt:
        print("stopped: writing the parts that finished", flush=True)
        if "mutation" not in finished:
            raise
    text = markdown(finished, command)
    (docs / "accelerator-results.md").write_text(text)
    plot(finished, docs / "accelerator.png")
    print(text)
    return finished


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="small sizes (a CPU smoke run)")
    parser.add_argument("--device", action="store_true", help="one process per pipeline for the seed")
    parser.add_argument("--out", type=pathlib.Path, default=DOCS, help="where to write")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
    else:
        main(args.small, args.out, device=args.device)
