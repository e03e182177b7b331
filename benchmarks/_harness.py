"""Timing helpers: interleaved A/B ratios, NumPy arrays placed off the 64-byte grid,
measurements run in fresh interpreters, JAX's compiles counted, and the stamp every results
file carries."""

from __future__ import annotations

import datetime
import gc
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Generated output (tables, JSON, plots), apart from the hand-written pages.
DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "results"


def results_folder(quick: bool, out: pathlib.Path | None = None) -> pathlib.Path:
    """Where a run writes its files: `out` if given, else docs/results, except that a
    smoke run (`--quick`) gets a new temporary folder, so its figures never replace the
    published ones the docs quote (checked by tests/test_docs_claims.py)."""
    if out is not None:
        return out
    if not quick:
        return DOCS
    folder = pathlib.Path(tempfile.mkdtemp(prefix="frozenconst-quick-"))
    print(f"a smoke run: results go to {folder}, docs/results keeps the full run's")
    return folder


def cpu_model() -> str:
    """The processor's model name, as `/proc/cpuinfo` gives it (elsewhere `platform.processor()`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def source_revision(module_file: str) -> str:
    """The git commit a module was imported from, `-dirty` when its checkout has uncommitted
    changes to the code measured (`frozenconst/`, `benchmarks/`); else why there is none.

    A copy without `.git` (the accelerator's, `tools/device-run`) is told its commit
    in `FROZENCONST_COMMIT`.
    """
    if os.environ.get("FROZENCONST_COMMIT"):
        return os.environ["FROZENCONST_COMMIT"]
    where = pathlib.Path(module_file).resolve().parent

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise OSError(out.stderr.strip())
        return out.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        root = git("rev-parse", "--show-toplevel")
        changed = git("status", "--porcelain", "--", f"{root}/frozenconst", f"{root}/benchmarks")
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout (an installed package)"
    return commit + ("-dirty" if changed else "")


def environment() -> dict[str, str]:
    """Where and when a measurement ran: the stamp at the top of every file in docs/results/.

    Date (UTC), processor, machine, memory, the frozenconst commit measured
    (`source_revision`) and the versions of everything that decides the figures.
    """
    import importlib.metadata

    import jax
    import numpy as np

    import frozenconst

    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{cpu_model()}, {os.cpu_count()} cores",
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}",
        "memory": f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB",
        "frozenconst": f"{frozenconst.__version__} at {source_revision(str(frozenconst.__file__))}",
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "numpy": np.__version__,
        "backend": jax.default_backend(),
    }


# JAX's two constant pipelines, by the value of `JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS` each runs
# under. Both named, never left unset: jax 0.12.1 made the simplified one its default, so an unset
# variable means the default pipeline up to jax 0.12.0 and the simplified one from 0.12.1.
PIPELINES: dict[str, str] = {"default": "0", "simplified": "1"}


def pipeline_env(flag: str | None, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with JAX's constant pipeline flag set to `flag`, or unset."""
    out = dict(os.environ if env is None else env)
    out.pop("JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS", None)
    if flag:
        out["JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS"] = flag
    return out


def run_worker(
    module: str,
    args: list[str],
    what: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = 1800,
) -> Any:
    """Run `python -m <module> --worker <args>` in a fresh interpreter and return the JSON
    on the last line of its output; a failure raises with `what` and the worker's stderr."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--worker", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# The event JAX records once per compile request, around XLA's compile or its persistent-cache
# lookup, with the program's name (`jit(f)`) as `fun_name`: `dispatch.BACKEND_COMPILE_EVENT`,
# recorded by `dispatch.log_elapsed_time` in `pxla`, the same on jax 0.8.1 to 0.12.1.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextmanager
def compiles() -> Iterator[Counter[str]]:
    """Within: the compiles JAX reports (`jax.monitoring`'s backend-compile event, a
    persistent-cache hit included), counted per program name (`jit(f)`)."""
    import jax.monitoring

    counts: Counter[str] = Counter()

    def listen(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == BACKEND_COMPILE_EVENT:
            counts[str(kwargs.get("fun_name", "?"))] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def _block(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call of `fn`, over a batch of `n` calls whose last result is waited for.

    JAX dispatches asynchronously: a batch left unwaited measures how fast calls
    enter the dispatch queue, not what they cost (an unwaited loop of a
    1000-constant function swung 0.4x to 4.8x between runs, issue #26). A
    `jax.Array` result is waited for (`block_until_ready`) inside the timed
    region; other results (a NumPy array, a FrozenConst) are not touched.
    """
    jax = sys.modules.get("jax")  # imported already where a result can be a jax.Array
    array_type: Any = None if jax is None else jax.Array
    start = time.perf_counter()
    out: Any = None
    for _ in range(n):
        out = fn()
    if array_type is not None and isinstance(out, array_type):
        out.block_until_ready()
    return (time.perf_counter() - start) / n


def ab_ratio(
    a: Callable[[], Any],
    b: Callable[[], Any],
    n: int = 1000,
    rounds: int = 31,
    before_a: Callable[[], Any] | None = None,
    before_b: Callable[[], Any] | None = None,
) -> dict[str, float]:
    """Per-call time of `a` and `b` and the median of per-round ratios a/b.

    Blocks of `n` calls alternate (a then b, b then a) so that drift in the
    machine's speed cancels; garbage collection is off while timing.
    `before_a`/`before_b` run, untimed, before each block (to switch a setting).
    """

    def run_a() -> float:
        if before_a is not None:
            before_a()
        return _block(a, n)

    def run_b() -> float:
        if before_b is not None:
            before_b()
        return _block(b, n)

    run_a()
    run_b()
    ratios, ta, tb = [], [], []
    gc.disable()
    try:
        for r in range(rounds):
            if r % 2:
                x, y = run_a(), run_b()
            else:
                y, x = run_b(), run_a()
            ta.append(x)
            tb.append(y)
            ratios.append(x / y)
    finally:
        gc.enable()
    return {
        "a_us": statistics.median(ta) * 1e6,
        "b_us": statistics.median(tb) * 1e6,
        "ratio": statistics.median(ratios),
    }


def process_memory() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of this process, in bytes (Linux's `/proc/self/status`)."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def reset_peak() -> bool:
    """Reset VmHWM to the current resident set (writing 5 to `/proc/self/clear_refs`, Linux >= 4.0);
    False where the kernel refuses, and the peak so far (imports) is the baseline instead."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_baseline() -> int:
    """The resident set a peak (`process_memory()["VmHWM"]`) is measured from, from now on."""
    reset = reset_peak()
    now = process_memory()
    return now["VmRSS"] if reset else now["VmHWM"]


def copy_at(data: Any, offset: int) -> Any:
    """A copy of NumPy array `data` whose address is `offset` bytes past a 64-byte boundary.

    JAX's CPU backend aliases a 64-byte-aligned NumPy buffer instead of copying
    it (jax #37830). Where NumPy's allocator puts an array is luck (one run in
    four gave an aligned 0.5 MiB array here), so a benchmark that hands JAX a
    NumPy array picks the case: `offset=0` for JAX's zero-copy best case,
    `offset=16` for the copy that an accelerator always makes.
    """
    import numpy as np

    raw = np.empty(data.nbytes + 64, np.uint8)
    start = (offset - raw.ctypes.data) % 64
    out = raw[start : start + data.nbytes].view(data.dtype).reshape(data.shape)
    np.copyto(out, data)
    assert out.ctypes.data % 64 == offset % 64
    return out


def single_device_sharding(device: Any, memory_kind: str | None = None) -> Any:
    """The sharding of one device, as this JAX makes it: jax 0.12.1 deprecates the name
    `jax.sharding.SingleDeviceSharding` for `jax.sharding.make_single_device_sharding`."""
    import jax

    make = getattr(jax.sharding, "make_single_device_sharding", None)
    if make is not None:
        return make(device, memory_kind=memory_kind)
    return jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)
