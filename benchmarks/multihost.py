"""Constants bigger than one host: per-process memory against the whole constant.

    python -m benchmarks multihost            # 256 MiB and 1 GiB, 2 and 4 processes
    python -m benchmarks multihost --quick    # 64 MiB only

A float32 table is written to a .npy; N processes (2 CPU devices each) join over
jax.distributed (gloo, 127.0.0.1) and each builds the constant with
`sharding=NamedSharding(mesh, P("x"))` from `np.load(path, mmap_mode="r")`, then
transfers it (the first use). Two variants, each in fresh processes:

- `partial`: `FrozenConst(mapped, sharding=...)`, which freezes only this process's rows;
- `whole copy`: `FrozenConst(mapped).on(sharding)`, every process freezing the whole
  table first (what a sharded constant cost before, and still costs for in-memory data).

Per process: anonymous RSS growth (the frozen copies; the map's pages are the
kernel's page cache, shared and evictable) and peak RSS growth (`VmHWM`, reset
before construction, which counts the map's pages this process touched too).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

VARIANTS = ("partial", "whole copy")


def _worker(port: int, process_id: int, count: int, path: str, variant: str) -> None:
    import jax

    from ._harness import peak_baseline, process_memory

    jax.config.update("jax_num_cpu_devices", 2)  # type: ignore[no-untyped-call]  # unannotated in jax 0.10
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]  # unannotated in jax 0.10
    import gc

    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from frozenconst import FrozenConst

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=count,
        process_id=process_id,
        initialization_timeout=120,
    )
    try:
        spec = P("x")  # type: ignore[no-untyped-call]  # constructor unannotated in jax 0.10
        rows = NamedSharding(jax.make_mesh((jax.device_count(),), ("x",)), spec)
        small = f"{path}.{process_id}.npy"
        np.save(small, np.ones((64, 8), np.float32))
        makers: tuple[Callable[[Any], FrozenConst], ...] = (
            lambda m: FrozenConst(m, sharding=rows),
            lambda m: FrozenConst(m),
        )
        for make in makers:
            warm = make(np.load(small, mmap_mode="r"))
            warm.on(rows).block_until_ready()  # every code path once, on a small table
        del warm
        gc.collect()
        mapped = np.load(path, mmap_mode="r")
        anon = process_memory()["RssAnon"]
        rss = peak_baseline()
        x = FrozenConst(mapped, sharding=rows) if variant == "partial" else FrozenConst(mapped)
        x.on(rows).block_until_ready()
        row = {
            "anon_growth": process_memory()["RssAnon"] - anon,
            "peak_growth": process_memory()["VmHWM"] - rss,
            "host_bytes": x.stats().host_bytes,
            "whole": int(mapped.nbytes),
        }
        print("ROW " + json.dumps(row), flush=True)
    finally:
        jax.distributed.shutdown()  # type: ignore[no-untyped-call]  # unannotated in jax 0.10


def _launch(count: int, path: str, variant: str, timeout_s: float = 600) -> list[dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.multihost",
                "--worker",
                str(port),
                str(i),
                str(count),
                path,
                variant,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for i in range(count)
    ]
    rows = []
    try:
        for i, p in enumerate(procs):
            out, _ = p.communicate(timeout=timeout_s)
            found = [ln for ln in out.splitlines() if ln.startswith("ROW ")]
            if p.returncode != 0 or not found:
                raise RuntimeError(f"process {i} of {count} failed:\n{out[-3000:]}")
            rows.append({"process": i, **json.loads(found[0][4:])})
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    import numpy as np

    sizes_mib = [64] if quick else [256, 1024]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mib in sizes_mib:
            path = os.path.join(tmp, f"table{mib}.npy")
            table = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(mib * 256, 1024))
            for start in range(0, table.shape[0], 8192):  # written in blocks: no whole copy here
                block = table[start : start + 8192]
                block[:] = np.arange(start, start + len(block), dtype=np.float32)[:, None]
            table.flush()
            del table
            for count in (2, 4):
                for variant in VARIANTS:
                    rows = _launch(count, path, variant)
                    results.append({"mib": mib, "processes": count, "variant": variant, "rows": rows})
                    print(_line(results[-1]), flush=True)
    return results


def _line(r: dict[str, Any]) -> str:
    rows = r["rows"]
    whole = rows[0]["whole"]
    share = whole / r["processes"]
    worst_anon = max(x["anon_growth"] for x in rows)
    worst_peak = max(x["peak_growth"] for x in rows)
    return (
        f"| {r['mib']} MiB | {r['processes']} | {r['variant']} | {share / 2**20:.0f} MiB | "
        f"{worst_anon / 2**20:.1f} MiB | {worst_anon / share:.3f}x | {worst_anon / whole:.3f}x | "
        f"{worst_peak / 2**20:.1f} MiB | {worst_peak / whole:.3f}x |"
    )


def markdown(results: list[dict[str, Any]], env: dict[str, str], command: str) -> str:
    header = "\n".join(f"- {k}: {v}" for k, v in env.items())
    lines = [
        f"Produced by `{command}` on:\n\n{header}\n",
        "Each row: the largest figure over the processes of one run. Share: the whole constant "
        "divided by the number of processes (the rows this process's devices address). Anonymous "
        "growth: `RssAnon` after construction and first transfer, minus before. Peak growth: "
        "`VmHWM` (reset just before construction) minus `VmRSS` then; it also counts the pages of "
        "the memory-mapped file this process touched, which the kernel shares and can evict.\n",
        "| constant | processes | variant | share | anonymous growth | / share | / whole "
        "| peak RSS growth | / whole |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_line(r) for r in results),
    ]
    return "\n".join(lines) + "\n"


def main(quick: bool, docs: pathlib.Path) -> list[dict[str, Any]]:
    from ._harness import environment

    results = run(quick)
    env = environment()
    command = "python -m benchmarks multihost" + (" --quick" if quick else "")
    text = markdown(results, env, command)
    (docs / "multihost-results.md").write_text(text)
    (docs / "multihost-results.json").write_text(
        json.dumps({"environment": env, "results": results}, indent=1)
    )
    print(text)
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        port, pid, count, path, variant = sys.argv[2:7]
        _worker(int(port), int(pid), int(count), path, variant)
    else:
        from ._harness import results_folder

        main("--quick" in sys.argv, results_folder("--quick" in sys.argv))
