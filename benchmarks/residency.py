"""The residency section: constants bigger than the chip, and a device-memory budget.

    python -m benchmarks residency --device   # on an accelerator: sized from its memory (~150 s on a TPU v5e)
    python -m benchmarks residency --quick    # a CPU smoke run (seconds), into a temp folder
    python -m benchmarks residency --out DIR  # write residency-results.md and .json into DIR

Made for an accelerator (`make device`); on the CPU backend it runs at small sizes, where
device memory is host memory and nothing runs out. One process, the parts in this order (each
frees what it made before the next):

- Bandwidth: a page-locked (`pinned_host`) `jax.Array` moved to the device by
  `jax.device_put`, and the same moved inside a compiled program (a `pinned_host`
  parameter, `jax.device_put` to device memory in the program).
- The compute floor: a `lax.scan` over layers whose tables (a `jax.Array` in device
  memory) fit, its step time per layer.
- Bigger than the chip: one stacked table of L layers, more bytes than the device's memory
  (`memory_stats()["bytes_limit"]`), as a `FrozenConst(..., residency="host")`. Plain JAX
  (the table as a `jax.Array`) and a device-resident FrozenConst of the same data are
  tried first and their out-of-memory errors shown; the host-resident run's step time is
  set against its floor, the larger of the compute floor times L and the bytes streamed over
  the measured bandwidth, and its result against a reference computed a layer at a time.
  `memory_stats()["bytes_in_use"]` is sampled while it runs.
- The budget: models of two constants each, together more than a device budget, called in
  turn for several rounds; device bytes sampled and the re-transfers counted.

Every timed call is waited for (`block_until_ready`); times are medians.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import pathlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ._harness import DOCS, compiles
from ._harness import environment as _stamp

GIB = 1 << 30
MIB = 1 << 20


def sizes(quick: bool, bytes_limit: int | None) -> dict[str, Any]:
    """Every size of the run: a CPU smoke run's, or an accelerator's, from its memory."""
    if quick or bytes_limit is None:
        return {
            "width": 128,  # a layer's table is width x width float32
            "layers": 8,
            "fit_layers": 4,
            "batch": 8,
            "bandwidth_bytes": 16 * MIB,
            "reps": 3,
            "model_width": 64,
            "models": 3,
            "rounds": 3,
        }
    # The model's own arrays take most of the chip (a ballast `jax.Array` in device memory), so
    # that tables a few GiB larger than what is left run out of it while the host, which holds
    # each table's NumPy copy and, for host residency, its page-locked copy, keeps room: the
    # TPU machine has 40 GiB of host memory against the chip's 15.7 GiB.
    width = 8192  # 256 MiB per layer
    layer = width * width * 4
    ballast = max(0, bytes_limit - 6 * GIB)
    return {
        "width": width,
        "ballast_bytes": ballast,
        "layers": (bytes_limit - ballast + 2 * GIB) // layer,  # 2 GiB more than is left
        "fit_layers": 4,
        "batch": 256,
        "bandwidth_bytes": GIB,
        "reps": 3,
        "model_width": 8192,  # each of a model's two constants 256 MiB
        "models": 3,
        "rounds": 3,
    }


def _median_s(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        _block(out)
        times.append(time.perf_counter() - start)
        del out
    return statistics.median(times)


def _block(out: Any) -> None:
    import jax

    wait: Callable[[Any], Any] = jax.block_until_ready  # untyped in JAX's stubs
    wait(out)


def _limit(device: Any) -> int | None:
    stats = device.memory_stats()
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def _in_use(device: Any) -> int | None:
    stats = device.memory_stats()
    return int(stats["bytes_in_use"]) if stats and "bytes_in_use" in stats else None


@contextmanager
def _sampled(device: Any, every_s: float = 0.002) -> Iterator[list[int]]:
    """`memory_stats()["bytes_in_use"]` sampled from a thread while the block runs (empty where
    the backend keeps none)."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            found = _in_use(device)
            if found is None:
                return
            samples.append(found)
            stop.wait(every_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def _outcome(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    kind = "out of memory" if "RESOURCE_EXHAUSTED" in str(err) or "memory" in str(err).lower() else "error"
    return f"{kind}: {type(err).__name__}: {text[:300]}"


def _layers_fn(table: Any, layers: int) -> Callable[[Any], Any]:
    """h -> a scan over `layers` layers, each `tanh(h @ table[i])`: JAX's host-offloading idiom
    where `table` is host-resident (each step reads one layer's slice)."""
    import jax
    import jax.numpy as jnp

    def f(h: Any) -> Any:
        def body(h: Any, i: Any) -> tuple[Any, None]:
            return jnp.tanh(jnp.matmul(h, table[i], precision=jax.lax.Precision.HIGHEST)), None

        out, _ = jax.lax.scan(body, h, jnp.arange(layers))
        return out

    return f


def bandwidth(size: dict[str, Any]) -> dict[str, Any]:
    """pinned_host -> device: by `jax.device_put`, and inside a compiled program."""
    import jax
    import jax.numpy as jnp

    from ._harness import single_device_sharding

    device = jax.devices()[0]
    n = size["bandwidth_bytes"] // 4
    pinned_sharding = single_device_sharding(device, memory_kind="pinned_host")
    on_device = single_device_sharding(device)
    start = time.perf_counter()
    pinned = jax.device_put(jnp.ones(n, jnp.float32), pinned_sharding)  # device -> pinned
    pinned.block_until_ready()
    fill_s = time.perf_counter() - start
    put_s = _median_s(lambda: jax.device_put(pinned, on_device), size["reps"])
    move = jax.jit(lambda p: jax.device_put(p, jax.memory.Space.Device))
    _block(move(pinned))
    jit_s = _median_s(lambda: move(pinned), size["reps"])
    nbytes = n * 4
    return {
        "bytes": nbytes,
        "device_put_gbs": nbytes / put_s / 1e9,
        "in_program_gbs": nbytes / jit_s / 1e9,
        "fill_from_device_gbs": nbytes / fill_s / 1e9,
    }


def compute_floor(size: dict[str, Any]) -> dict[str, Any]:
    """The scan's step time per layer with the tables in device memory (a size that fits)."""
    import jax
    import jax.numpy as jnp

    width, fit = size["width"], size["fit_layers"]
    tables = jax.random.normal(jax.random.key(1), (fit, width, width), jnp.float32) / math.sqrt(width)
    f = jax.jit(lambda h, t: _layers_fn(t, fit)(h))
    h = jnp.ones((size["batch"], width), jnp.float32)
    _block(f(h, tables))
    step_s = _median_s(lambda: f(h, tables), size["reps"])
    return {"fit_layers": fit, "step_s": step_s, "per_layer_s": step_s / fit}


def _table(size: dict[str, Any]) -> np.ndarray[Any, Any]:
    """The stacked table, made a layer at a time on the device (fast) and copied out."""
    import jax
    import jax.numpy as jnp

    width, layers = size["width"], size["layers"]
    src = np.empty((layers, width, width), np.float32)
    layer = jax.jit(lambda k: jax.random.normal(k, (width, width), jnp.float32) / math.sqrt(width))
    for i in range(layers):
        src[i] = np.asarray(layer(jax.random.key(100 + i)))
    return src


def bigger_than_chip(
    size: dict[str, Any], floor: dict[str, Any] | None, link: dict[str, Any] | None
) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import frozenconst

    device = jax.devices()[0]
    width, layers = size["width"], size["layers"]
    out: dict[str, Any] = {"layers": layers, "width": width, "bytes_limit": _limit(device)}
    # The model's own arrays, on the device for the whole part.
    ballast = jnp.zeros(size.get("ballast_bytes", 0) // 4, jnp.float32)
    ballast.block_until_ready()
    out["ballast_bytes"] = ballast.nbytes
    out["free_bytes"] = None if out["bytes_limit"] is None else out["bytes_limit"] - (_in_use(device) or 0)
    start = time.perf_counter()
    src = _table(size)
    out["generate_s"] = time.perf_counter() - start
    start = time.perf_counter()
    table = frozenconst.FrozenConst(src, residency="host")
    out["freeze_s"] = time.perf_counter() - start
    del src
    gc.collect()
    out["table_bytes"] = table.nbytes
    h = jnp.ones((size["batch"], width), jnp.float32) / math.sqrt(width)

    # Plain JAX: the table as a jax.Array on the device.
    try:
        whole = jax.device_put(np.asarray(table), device)
        whole.block_until_ready()
        out["plain_jax"] = "ok (it fits)"
        del whole
    except Exception as err:  # XLA's out-of-memory error is its own class
        out["plain_jax"] = _outcome(err)
    gc.collect()
    # The same data as a device-resident FrozenConst (sharing the frozen NumPy copy).
    resident_on_device = frozenconst.FrozenConst(table, residency="device")
    try:
        _block(jax.jit(_layers_fn(resident_on_device, layers))(h))
        out["device_resident"] = "ok (it fits)"
    except Exception as err:
        out["device_resident"] = _outcome(err)
    resident_on_device.evict()
    del resident_on_device
    gc.collect()

    try:
        _host_resident(size, table, h, out)
    except Exception as err:  # XLA's refusal of the program, or running out: shown, not fatal
        out["host_resident_error"] = _outcome(err)
        return out
    streamed = table.nbytes
    if link is not None:
        out["transfer_floor_s"] = streamed / (link["device_put_gbs"] * 1e9)
        out["transfer_floor_in_program_s"] = streamed / (link["in_program_gbs"] * 1e9)
    if floor is not None:
        out["compute_floor_s"] = floor["per_layer_s"] * layers
    if link is not None and floor is not None:
        out["floor_s"] = max(out["transfer_floor_s"], out["compute_floor_s"])
        out["ratio_to_floor"] = out["step_s"] / out["floor_s"]
    out["stats"] = table.stats().to_dict()
    return out


def _host_resident(size: dict[str, Any], table: Any, h: Any, out: dict[str, Any]) -> None:
    """The host-resident run: the page-locked buffer made at the first use, the scan timed with
    device memory sampled, and its result against a reference computed a layer at a time."""
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    layers = size["layers"]
    start = time.perf_counter()
    _block(jax.jit(lambda: table[0])())
    out["page_lock_s"] = time.perf_counter() - start
    f = jax.jit(_layers_fn(table, layers))
    start = time.perf_counter()
    got = f(h)
    _block(got)
    out["first_call_s"] = time.perf_counter() - start
    before = _in_use(device)
    with _sampled(device) as samples:
        out["step_s"] = _median_s(lambda: f(h), size["reps"])
    out["bytes_in_use_before"] = before
    out["bytes_in_use_max"] = max(samples) if samples else None
    # The reference, a layer at a time: each layer's table moved from the NumPy copy, the same
    # computation on the device.
    layer = jax.jit(lambda h, w: jnp.tanh(jnp.matmul(h, w, precision=jax.lax.Precision.HIGHEST)))
    want = h
    host = np.asarray(table)
    for i in range(layers):
        want = layer(want, jax.device_put(host[i], device))
    got_np, want_np = np.asarray(got), np.asarray(want)
    out["max_abs_diff"] = float(np.max(np.abs(got_np - want_np)))
    out["equal"] = bool(np.array_equal(got_np, want_np))
    out["close"] = bool(np.allclose(got_np, want_np, rtol=1e-5, atol=1e-5))


def budget(size: dict[str, Any]) -> dict[str, Any]:
    """Models whose constants together exceed a device budget, called in turn."""
    import jax
    import jax.numpy as jnp

    import frozenconst

    device = jax.devices()[0]
    width = size["model_width"]
    one = 2 * width * width * 4  # a model's two constants
    limit = one + one // 4  # room for one model at a time
    models = []
    for m in range(size["models"]):
        keys = jax.random.split(jax.random.key(200 + m))
        tables = [
            frozenconst.FrozenConst(
                np.asarray(jax.random.normal(k, (width, width), jnp.float32) / math.sqrt(width)),
                host_memory="pinned",
            )
            for k in keys
        ]
        models.append((tables, jax.jit(_model(tables))))
    h = jnp.ones((size["batch"], width), jnp.float32)
    # A program that uses no constant, called after each model: a switch must not compile it again.
    bystander = jax.jit(lambda x: jnp.tanh(x) * 2.0)
    _block(bystander(h))
    rows = []
    frozenconst.set_device_budget(limit)
    baseline = _in_use(device)
    before = frozenconst.stats()
    try:
        with _sampled(device) as samples, compiles() as compiled:
            for r in range(size["rounds"]):
                for m, (_, model) in enumerate(models):
                    start = time.perf_counter()
                    _block(model(h))
                    took = time.perf_counter() - start
                    held = sum(frozenconst.stats().device_bytes.values())
                    rows.append({"round": r, "model": m, "call_s": took, "constants_bytes": held})
                    _block(bystander(h))
        after = frozenconst.stats()
    finally:
        frozenconst.set_device_budget(None)
    # The same calls with no budget (everything fits): what a call costs without switching.
    for _, model in models:
        _block(model(h))
    no_budget_s = statistics.median(
        _median_s(functools.partial(model, h), size["reps"]) for _, model in models
    )
    peak = None if not samples or baseline is None else max(samples) - baseline
    out = {
        "budget_bytes": limit,
        "model_bytes": one,
        "models": size["models"],
        "rounds": size["rounds"],
        "calls": rows,
        "constants_bytes_max": max(r["constants_bytes"] for r in rows),
        "bytes_in_use_baseline": baseline,
        "bytes_in_use_above_baseline_max": peak,
        "samples": len(samples),
        "evictions": after.evictions - before.evictions,
        "retransfers": after.retransfers - before.retransfers,
        "transfers": after.transfers - before.transfers,
        "call_s_median": statistics.median(r["call_s"] for r in rows if r["round"] > 0),
        "call_s_no_budget": no_budget_s,
        # Compiles JAX reported while the rounds ran, per program name (`jax.monitoring`).
        "compiles": dict(compiled),
    }
    out["switch_ratio"] = out["call_s_median"] / no_budget_s if no_budget_s else None
    for tables, _ in models:
        for t in tables:
            t.evict()
    return out


def _model(tables: list[Any]) -> Callable[[Any], Any]:
    import jax.numpy as jnp

    def model(h: Any) -> Any:
        return jnp.tanh(jnp.matmul(h, tables[0], precision="highest")) @ tables[1]

    return model


def run(quick: bool, checkpoint: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    import jax

    device = jax.devices()[0]
    limit = _limit(device)
    size = sizes(quick, limit)
    results: dict[str, Any] = {"environment": _environment(device), "sizes": size}
    took: dict[str, float] = {}
    parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("bandwidth", lambda: bandwidth(size)),
        ("compute_floor", lambda: compute_floor(size)),
        (
            "bigger_than_chip",
            lambda: bigger_than_chip(size, results.get("compute_floor"), results.get("bandwidth")),
        ),
        ("budget", lambda: budget(size)),
    ]
    errors: dict[str, str] = {}
    for name, part in parts:
        start = time.perf_counter()
        try:
            results[name] = part()
        except Exception as err:  # one precious accelerator run: the other parts still run
            errors[name] = f"{type(err).__name__}: {str(err).strip()[:600]}"
            results["errors"] = errors
            print(f"{name} failed: {errors[name]}", flush=True)
        # What the part made goes with it; the programs JAX compiled hold its constants (the
        # page-locked table among them) as parameters: they go too.
        clear: Callable[[], None] = jax.clear_caches
        clear()
        gc.collect()
        took[name] = time.perf_counter() - start
        results["took_s"] = took
        print(f"{name}: {took[name]:.1f} s", flush=True)
        checkpoint(results)
    return results


def _environment(device: Any) -> dict[str, str]:
    env = _stamp()
    env["device"] = f"{device.device_kind} ({device.platform})"
    limit = _limit(device)
    env["device_memory"] = "not reported" if limit is None else f"{limit / GIB:.1f} GiB"
    return env


def _gib(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _resident_outcome(big: dict[str, Any]) -> str:
    if "host_resident_error" in big:
        return str(big["host_resident_error"])
    equal = "bitwise" if big["equal"] else ("within 1e-5" if big["close"] else "NO")
    floor = f", {big['ratio_to_floor']:.2f}x its floor" if "ratio_to_floor" in big else ""
    return (
        f"ok: step {big['step_s']:.3f} s{floor}; equal to the layer-by-layer reference: {equal} "
        f"(max abs diff {big['max_abs_diff']:.2e})"
    )


def markdown(results: dict[str, Any], command: str) -> str:
    env = results.get("environment", {})
    lines = [
        "# Constants bigger than the chip, and a device budget",
        "",
        f"`{command}`",
        "",
        *[f"- {k}: {v}" for k, v in env.items()],
        "",
    ]
    link = results.get("bandwidth")
    if link:
        lines += [
            "## Page-locked memory to the device",
            "",
            "| path | GB/s |",
            "|---|---|",
            f"| `jax.device_put(pinned, device)` | {link['device_put_gbs']:.2f} |",
            f"| moved inside a compiled program | {link['in_program_gbs']:.2f} |",
            f"| filling page-locked memory from the device | {link['fill_from_device_gbs']:.2f} |",
            "",
        ]
    big = results.get("bigger_than_chip")
    if big:
        lines += [
            f"## A scan over {big['layers']} layers, {_gib(big['table_bytes'])} of tables "
            f"(device memory {_gib(big['bytes_limit'])}, of which the model's own arrays hold "
            f"{_gib(big.get('ballast_bytes', 0))}: {_gib(big.get('free_bytes'))} free)",
            "",
            "| run | outcome |",
            "|---|---|",
            f"| plain JAX, the table as a `jax.Array` | {big['plain_jax']} |",
            f"| `FrozenConst(table)` (device-resident) | {big['device_resident']} |",
            f'| `FrozenConst(table, residency="host")` | {_resident_outcome(big)} |',
            "",
        ]
        if "floor_s" in big:
            lines += [
                f"Floor {big['floor_s']:.3f} s: the larger of the compute with the tables in device memory "
                f"({big['compute_floor_s']:.3f} s, measured at {results['compute_floor']['fit_layers']} "
                f"layers) and {_gib(big['table_bytes'])} over the measured `jax.device_put` bandwidth "
                f"({big['transfer_floor_s']:.3f} s; over the in-program bandwidth "
                f"{big['transfer_floor_in_program_s']:.3f} s).",
                "",
            ]
        if "step_s" in big:
            lines += [
                f"Device bytes in use while it ran: at most {_gib(big['bytes_in_use_max'])} (before: "
                f"{_gib(big['bytes_in_use_before'])}). Building it: generating {big['generate_s']:.1f} s, "
                f"the frozen copy {big['freeze_s']:.1f} s, the page-locked copy at the first use "
                f"{big['page_lock_s']:.1f} s; the first call (compile and run) {big['first_call_s']:.1f} s.",
                "",
            ]
    budget_part = results.get("budget")
    if budget_part:
        b = budget_part
        lines += [
            f"## The budget: {b['models']} models of {_gib(b['model_bytes'])} each, budget "
            f"{_gib(b['budget_bytes'])}, {b['rounds']} rounds",
            "",
            f"- constants on the device (`stats()`), at most: {_gib(b['constants_bytes_max'])}",
            f"- device bytes in use above the baseline, sampled ({b['samples']} samples), at most: "
            f"{_gib(b['bytes_in_use_above_baseline_max'])}",
            f"- evictions {b['evictions']}, re-transfers {b['retransfers']}, transfers {b['transfers']}",
            f"- a call after the first round (re-transfers and a compile): {b['call_s_median']:.3f} s; "
            f"with no budget (all fit): {b['call_s_no_budget']:.4f} s"
            + (f" ({b['switch_ratio']:.0f}x)" if b.get("switch_ratio") else ""),
            "- compiles while the rounds ran: "
            + (", ".join(f"`{k}` {v}" for k, v in sorted(b.get("compiles", {}).items())) or "none"),
            "",
        ]
    for name, error in results.get("errors", {}).items():
        lines += [f"**{name} failed**: {error}", ""]
    took = results.get("took_s", {})
    if took:
        lines += ["Wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()), ""]
    return "\n".join(lines)


def main(quick: bool, docs: pathlib.Path, device: bool = False) -> dict[str, Any]:
    """Run every part; write residency-results.md and .json into `docs` (the JSON after each part)."""
    command = (
        "python -m benchmarks residency" + (" --quick" if quick else "") + (" --device" if device else "")
    )
    docs.mkdir(parents=True, exist_ok=True)

    def save(results: dict[str, Any]) -> None:
        (docs / "residency-results.json").write_text(json.dumps({"command": command, **results}, indent=1))

    results = run(quick, save)
    text = markdown(results, command)
    (docs / "residency-results.md").write_text(text)
    print(text)
    return results


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a CPU smoke run)")
    parser.add_argument("--device", action="store_true", help="an accelerator's sizes")
    parser.add_argument("--out", type=pathlib.Path, default=DOCS, help="where to write")
    args = parser.parse_args()
    main(args.quick, args.out, device=args.device)
