"""The `export` section: programs exported without their constants, beside `jax.export`.

    python -m benchmarks.export                    # 1 MiB, 64 MiB and 2.5 GiB of constants
    python -m benchmarks.export --sizes 1 64       # other totals, in MiB
    python -m benchmarks export                    # the same, from the suite's entry point

One function uses N float32 tables of 256 MiB at most (their total the row's size), each
1,024 columns wide, in a chain of matrix-vector products with a vector as wide, so that the
program makes no copy of a table (a slice of one is a copy: with a 512-wide vector, 0.5x of the
tables at 2,560 MiB). For each total, fresh interpreters measure

- `frozenconst.export` + `save`, then `frozenconst.load` and one call: the program file's
  bytes, the store's, the time to export and save, the time to load and to make the first
  call, and each process's peak resident set growth (VmHWM, reset before the step where the
  kernel allows it) as a multiple of the constants' size; for the load, also its anonymous
  memory's growth (RssAnon) from before the load to before the first call: a loaded constant
  is its file's pages, mapped read-only, so only a copy would show there;
- `jax.export` of the same function + `serialize`: its artifact's bytes, or how it fails (the
  serialized form is a flatbuffer, capped at 2 GiB), and the same time and memory.

The tables are made in each process (random, from a seed), outside the measured step.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import time
from typing import Any

import numpy as np

from ._harness import environment, peak_baseline, process_memory, run_worker

MIB = 1 << 20
TABLE_MIB = 256
WIDTH = 1024  # each table's columns, and the vector's length


def _tables(total_mib: int) -> list[np.ndarray]:
    """float32 tables WIDTH columns wide, each at most TABLE_MIB, `total_mib` in all."""
    out, left, rng = [], total_mib * MIB // 4, np.random.default_rng(0)
    while left > 0:
        n = min(left, TABLE_MIB * MIB // 4)
        rows = max(1, n // WIDTH)
        out.append(rng.standard_normal((rows, n // rows), dtype=np.float32))
        left -= rows * (n // rows)
    return out


def _function(tables: list[Any]) -> Any:
    import jax.numpy as jnp

    def f(x: Any) -> Any:
        acc = jnp.zeros((), x.dtype)
        for t in tables:
            acc = acc + jnp.sum(t[:, : x.shape[0]] @ x)
        return acc

    return f


def _worker(step: str, total_mib: int, where: str) -> dict[str, Any]:
    import gc

    import jax
    import jax.numpy as jnp

    import frozenconst

    jnp.zeros(1).block_until_ready()
    data = _tables(total_mib)
    nbytes = sum(t.nbytes for t in data)
    struct: Any = jax.ShapeDtypeStruct  # untyped in JAX's stubs
    block: Any = jax.block_until_ready
    spec = struct((WIDTH,), jnp.float32)
    row: dict[str, Any] = {"step": step, "mib": total_mib, "nbytes": nbytes}
    path = pathlib.Path(where)
    if step == "frozenconst.export":
        tables = [frozenconst.FrozenConst(t) for t in data]
        del data
        gc.collect()
        base = peak_baseline()
        start = time.perf_counter()
        saved = frozenconst.export(_function(tables), spec).save(path / "prog")
        row["seconds"] = time.perf_counter() - start
        row["peak_growth"] = process_memory()["VmHWM"] - base
        row["program_bytes"] = (saved / "program.jaxexport").stat().st_size + (
            saved / "manifest.json"
        ).stat().st_size
        row["store_bytes"] = sum(p.stat().st_size for p in (saved / "constants").glob("*.npy"))
    elif step == "frozenconst.load":
        del data
        gc.collect()
        base = peak_baseline()
        anon = process_memory()["RssAnon"]
        start = time.perf_counter()
        loaded = frozenconst.load(path / "prog")
        row["seconds"] = time.perf_counter() - start
        row["anon_growth"] = process_memory()["RssAnon"] - anon
        start = time.perf_counter()
        block(loaded(jnp.ones(WIDTH)))
        row["first_call_seconds"] = time.perf_counter() - start
        row["peak_growth"] = process_memory()["VmHWM"] - base
    elif step == "jax.export":
        arrays = [jnp.asarray(t) for t in data]
        del data
        gc.collect()
        base = peak_baseline()
        start = time.perf_counter()
        try:
            blob = jax.export.export(jax.jit(_function(arrays)))(spec).serialize()
        except Exception as err:  # what `jax.export` raises past its limit
            row["failed"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        else:
            row["program_bytes"] = len(blob)
        row["seconds"] = time.perf_counter() - start
        row["peak_growth"] = process_memory()["VmHWM"] - base
    else:
        raise ValueError(f"unknown step {step!r}")
    return row


def measure(step: str, total_mib: int, where: pathlib.Path, timeout: float = 1800) -> dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    try:
        row: dict[str, Any] = run_worker(
            "benchmarks.export",
            [step, str(total_mib), str(where)],
            f"export benchmark ({step})",
            env,
            timeout=timeout,
        )
    except Exception as err:  # a worker killed (out of memory, the time limit): a row that says so
        row = {
            "step": step,
            "mib": total_mib,
            "nbytes": total_mib * MIB,
            "failed": f"worker: {str(err)[:160]}",
        }
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| constants | step | program bytes | store bytes | seconds | first call s | peak RSS growth "
        "| anonymous growth, loaded |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        size = r["nbytes"]
        program = f"{r['program_bytes']:,}" if "program_bytes" in r else ""
        if "failed" in r:
            program = f"fails: {r['failed']}"
        store = f"{r['store_bytes']:,}" if "store_bytes" in r else ""
        first = f"{r['first_call_seconds']:.2f}" if "first_call_seconds" in r else ""
        peak = f"{r['peak_growth'] / size:.2f}x" if "peak_growth" in r else ""
        seconds = f"{r['seconds']:.2f}" if "seconds" in r else ""
        anon = f"{r['anon_growth'] / size:.3f}x" if "anon_growth" in r else ""
        lines.append(
            f"| {size / MIB:,.0f} MiB | `{r['step']}` | {program} | {store} | {seconds} | {first} | {peak} "
            f"| {anon} |"
        )
    return "\n".join(lines)


def main(sizes_mib: list[int], docs: pathlib.Path | None = None) -> list[dict[str, Any]]:
    rows = []
    for mib in sizes_mib:
        with tempfile.TemporaryDirectory(prefix="frozenconst-export-") as tmp:
            for step in ("frozenconst.export", "frozenconst.load", "jax.export"):
                rows.append(measure(step, mib, pathlib.Path(tmp)))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    env = environment()
    text = "\n".join(
        [
            "# Export: programs saved without their constants",
            "",
            "Generated by `python -m benchmarks export` "
            f"(totals {', '.join(f'{m:,} MiB' for m in sizes_mib)}).",
            "",
            *[f"- {k}: {v}" for k, v in env.items()],
            "",
            (__doc__ or "").split("\n\n", 2)[2].strip(),
            "",
            table(rows),
        ]
    )
    if docs is not None:
        (docs / "export-results.md").write_text(text + "\n")
        (docs / "export-results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print(text)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1, 64, 2560], help="constants' totals in MiB"
    )
    parser.add_argument("--worker", nargs=3, metavar=("STEP", "MIB", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker[0], int(args.worker[1]), args.worker[2])))
    else:
        main(args.sizes)
