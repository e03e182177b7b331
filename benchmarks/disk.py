"""The `disk` section: peak memory of building a constant from a `.npy` file.

    python -m benchmarks.disk                   # 256 MiB and 1 GiB files (needs about 3 GiB free)
    python -m benchmarks.disk --sizes 64 256    # other sizes, in MiB
    python -m benchmarks disk                   # the same, from the suite's entry point

For each size it writes a float32 `.npy`, then measures, each in a fresh
interpreter that has already imported JAX and frozenconst, how much the
process's peak resident set grows while it builds

- `np.load(path)`: the baseline, one array read into memory;
- `FrozenConst(np.load(path))`: read into memory, then copied once;
- `FrozenConst(np.load(path, mmap_mode="r"))`: copied once from the mapped file;

each also after its first use on the device (`jnp.asarray`). The peak is read
from the OS (`VmHWM` in `/proc/self/status`, reset through `/proc/self/clear_refs`
before the build where the kernel allows it; `getrusage`'s `ru_maxrss` is not
reset, so after JAX's imports it would hide a small build); growth is reported
as a multiple of the constant's size. Pages of
the file that a memory map has read count in the resident set while mapped,
as the kernel counts them.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
from typing import Any

import numpy as np

from ._harness import environment, process_memory, reset_peak, run_worker

MIB = 1 << 20
MODES = ("np.load", "np.load + FrozenConst", "mmap + FrozenConst")


def _worker(mode: str, path: str) -> dict[str, Any]:
    import gc

    import jax.numpy as jnp

    from frozenconst import FrozenConst

    jnp.zeros(1).block_until_ready()  # JAX's backend started before the baseline
    gc.collect()
    reset = reset_peak()
    before = process_memory()
    source: Any = None
    if mode == "np.load":
        value: Any = np.load(path)
    elif mode == "np.load + FrozenConst":
        value = FrozenConst(np.load(path))
    elif mode == "mmap + FrozenConst":
        source = np.load(path, mmap_mode="r")  # kept mapped until measured: its pages count
        value = FrozenConst(source)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    gc.collect()
    built = process_memory()
    del source  # unmapped: what stays is the constant's own copy
    gc.collect()
    kept = process_memory()
    jnp.asarray(value).block_until_ready()
    gc.collect()
    used = process_memory()
    base = before["VmRSS"] if reset else before["VmHWM"]
    peak = built["VmHWM"] - base
    # What is resident when the build returns, with the map still open: the
    # process's own (anonymous) memory, and the file's pages it still maps
    # (frozenconst hands a read-only map's pages back as it copies them).
    return {
        "mode": mode,
        "nbytes": int(np.prod(value.shape)) * value.dtype.itemsize,
        "peak_reset": reset,
        "build_peak_growth": peak,
        "anon_after_build": built["RssAnon"] - before["RssAnon"],
        "mapped_file_after_build": built["RssFile"] - before["RssFile"],
        "kept_after_build": kept["VmRSS"] - before["VmRSS"],
        "use_peak_growth": used["VmHWM"] - base,
    }


def measure(path: pathlib.Path, mode: str, timeout: float = 600) -> dict[str, Any]:
    """One build of `mode` from `path`, in a fresh interpreter."""
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    row: dict[str, Any] = run_worker(
        "benchmarks.disk", [mode, str(path)], f"disk benchmark worker ({mode})", env, timeout=timeout
    )
    return row


def write_npy(path: pathlib.Path, mib: int) -> None:
    """A float32 `.npy` of `mib` MiB of random data, written in 64 MiB blocks (no full copy in memory)."""
    n = mib * MIB // 4
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n,))
    rng = np.random.default_rng(0)
    block = 16 * MIB
    for start in range(0, n, block):
        out[start : start + block] = rng.standard_normal(min(block, n - start), dtype=np.float32)
    out.flush()
    del out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| constant | build | peak RSS growth | anonymous after build | file pages mapped after build "
        "| kept once unmapped | peak after first device use |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        size = r["nbytes"]
        cells = [
            r[k] / size
            for k in (
                "build_peak_growth",
                "anon_after_build",
                "mapped_file_after_build",
                "kept_after_build",
                "use_peak_growth",
            )
        ]
        lines.append(
            f"| {size / MIB:,.0f} MiB | `{r['mode']}` | " + " | ".join(f"{c:.2f}x" for c in cells) + " |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: pathlib.Path) -> None:
    """Peak RSS growth of each build, as a multiple of the constant's size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["nbytes"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(MODES)
    for j, mode in enumerate(MODES):
        by_size = {r["nbytes"]: r["build_peak_growth"] / r["nbytes"] for r in rows if r["mode"] == mode}
        values = [by_size[n] for n in sizes]
        ax.bar([i + (j - 1) * width for i in range(len(sizes))], values, width=width, label=mode)
    ax.set_xticks(range(len(sizes)), [f"{n / MIB:,.0f} MiB" for n in sizes])
    ax.set_ylabel("peak RSS growth, x the constant")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(sizes_mib: list[int], docs: pathlib.Path | None = None) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="frozenconst-disk-") as tmp:
        for mib in sizes_mib:
            path = pathlib.Path(tmp) / f"const-{mib}.npy"
            write_npy(path, mib)
            for mode in MODES:
                rows.append(measure(path, mode))
            path.unlink()
    env = environment()
    text = "\n".join(
        [
            "# Large constants from disk",
            "",
            f"Generated by `python -m benchmarks disk` (sizes {', '.join(f'{m} MiB' for m in sizes_mib)}).",
            "",
            *[f"- {k}: {v}" for k, v in env.items()],
            "",
            table(rows),
        ]
    )
    if docs is not None:
        plot(rows, docs / "benchmark-disk.png")
        (docs / "disk-results.md").write_text(text + "\n\n![peak RSS growth per build](benchmark-disk.png)\n")
        (docs / "disk-results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print(text)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024], help="file sizes in MiB")
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(*args.worker)))
    else:
        result = main(args.sizes)
        if args.json:
            print(json.dumps(result))
