"""The `core` section: construction, first transfer, CPU zero-copy, cache hits, scaling, fingerprints.

    python -m benchmarks core           # writes docs/performance.md and docs/benchmark-core.png
    python -m benchmarks core --quick   # smaller sizes, fewer rounds

Every target is a ratio to a baseline measured in the same run (medians).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._harness import ab_ratio, copy_at, results_folder

MIB = 1 << 20


def _construction_row(case: str, mib: int, data: Any, baseline: Any, ours: Any, reps: int) -> dict[str, Any]:
    """NumPy's copy and FrozenConst's, alternating in the same process and memory state.

    Each result is dropped before the next call, so both sides write into the
    pages the allocator hands back warm. Up to 16 MiB a copy takes tens of
    microseconds: timed in blocks of calls (about 64 MiB copied per block), so
    the timer's resolution does not matter.
    """
    n = max(1, 64 * MIB // data.nbytes)
    r = ab_ratio(ours, baseline, n=n, rounds=15 if n > 1 else reps)
    return _row(case, mib, data.nbytes, r["b_us"] * 1e-6, r["a_us"] * 1e-6, 1 / r["ratio"])


def _row(case: str, mib: int, nbytes: int, t_base: float, t_ours: float, ratio: float) -> dict[str, Any]:
    return {
        "case": case,
        "mib": mib,
        "np_copy_gbs": nbytes / t_base / 1e9,
        "frozenconst_gbs": nbytes / t_ours / 1e9,
        "ratio": ratio,
        "seconds": t_ours,
    }


SIDES = ("np.copy", "FrozenConst")
_FRESH_SCRIPT = r"""
import json, sys, time
import numpy as np
from frozenconst import FrozenConst
side, sizes, reps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
make = np.copy if side == "np.copy" else FrozenConst
make(np.ones(1024, np.float32))  # first-call costs, in small-object memory
# Every input first, then every copy, each kept: no copy lands in pages a freed one left.
inputs = {m: np.random.default_rng(0).standard_normal(m * 2**20 // 4, dtype=np.float32) for m in sizes}
kept, out = [], {}
for m in sizes:
    out[m] = []
    for _ in range(reps):
        start = time.perf_counter()
        kept.append(make(inputs[m]))
        out[m].append(time.perf_counter() - start)
print(json.dumps(out))
"""


def fresh_memory(sizes_mib: list[int], processes: int = 5, reps: int = 5) -> list[dict[str, Any]]:
    """`np.copy` against `FrozenConst` into memory the process has never touched, every result kept.

    Each side runs in fresh interpreters of its own (`processes` each, the two
    sides alternating), which import the same modules and build the same inputs,
    so both write into never-touched pages; within a process every copy is kept,
    as a program keeps its constants. The figures are medians over all samples,
    and every sample is kept in the row: a copy into fresh memory can vary
    several-fold from one process to the next.
    """
    samples: dict[str, dict[int, list[float]]] = {side: {m: [] for m in sizes_mib} for side in SIDES}
    for p in range(processes):
        for side in SIDES if p % 2 == 0 else SIDES[::-1]:
            out = subprocess.run(
                [sys.executable, "-c", _FRESH_SCRIPT, side, json.dumps(sizes_mib), str(reps)],
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            for m, times in json.loads(out.stdout.strip().splitlines()[-1]).items():
                samples[side][int(m)] += times
    rows = []
    for m in sizes_mib:
        t_base, t_ours = (statistics.median(samples[side][m]) for side in SIDES)
        row = _row(
            "C-contiguous float32, results kept (fresh memory)", m, m * MIB, t_base, t_ours, t_base / t_ours
        )
        rows.append({**row, "samples_s": {side: samples[side][m] for side in SIDES}})
    return rows


def construction(sizes_mib: list[int]) -> list[dict[str, Any]]:
    from frozenconst import FrozenConst

    fresh = {r["mib"]: r for r in fresh_memory([m for m in sizes_mib if m <= 256])}
    rows = []
    for mib in sizes_mib:
        a = np.random.default_rng(0).standard_normal(mib * MIB // 4).astype(np.float32)
        reps = 3 if mib >= 512 else 7
        rows.append(
            _construction_row(
                "C-contiguous float32", mib, a, lambda a=a: np.copy(a), lambda a=a: FrozenConst(a), reps
            )
        )
        if mib in fresh:
            rows.append(fresh[mib])
        if mib in (16, 256):
            t = a.reshape(-1, 1024).T
            rows.append(
                _construction_row(
                    "transposed (non-contiguous)",
                    mib,
                    a,
                    lambda t=t: np.ascontiguousarray(t),
                    lambda t=t: FrozenConst(t),
                    reps,
                )
            )
            d = a.astype(np.float64)
            rows.append(
                _construction_row(
                    "float64 -> float32",
                    mib,
                    a,
                    lambda d=d: d.astype(np.float32),
                    lambda d=d: FrozenConst(d, dtype=np.float32),
                    reps,
                )
            )
        gc.collect()
    return rows


# The variants of the host-memory construction table: (label, `host_memory=`), np.copy first.
HOST_MEMORY_VARIANTS = (
    ("np.copy", None),
    ("host_memory='pageable'", "pageable"),
    ("host_memory='pinned'", "pinned"),
    ("host_memory='auto'", "auto"),
)


def host_memory_construction(sizes_mib: list[int], rounds: int) -> list[dict[str, Any]]:
    """`FrozenConst(a, host_memory=...)` for each choice against `np.copy(a)`, in one process.

    Each round times every variant once (a block of calls below 16 MiB, about
    64 MiB copied per block, so the timer's resolution does not matter), in an
    order that rotates from round to round; each result is freed before the next
    call, outside the timed region. Times are medians over rounds, the ratios
    medians of the per-round ratios to `np.copy` and to `pageable`.
    """
    from frozenconst import FrozenConst

    rows = []
    for mib in sizes_mib:
        a = np.random.default_rng(3).standard_normal(mib * MIB // 4).astype(np.float32)
        n = max(1, 64 * MIB // a.nbytes)

        def make(choice: str | None, a: Any = a) -> Any:
            return np.copy(a) if choice is None else FrozenConst(a, host_memory=choice)  # type: ignore[arg-type]

        def timed(choice: str | None, n: int = n) -> float:
            start = time.perf_counter()
            for _ in range(n):
                made = make(choice)
                del made
            return (time.perf_counter() - start) / n

        for _, choice in HOST_MEMORY_VARIANTS:  # warm: first-call costs, pinned allocations
            timed(choice)
        samples: list[list[float]] = [[] for _ in HOST_MEMORY_VARIANTS]
        for r in range(rounds):
            for i in range(len(HOST_MEMORY_VARIANTS)):
                k = (r + i) % len(HOST_MEMORY_VARIANTS)
                samples[k].append(timed(HOST_MEMORY_VARIANTS[k][1]))
                gc.collect()
        for k, (label, _) in enumerate(HOST_MEMORY_VARIANTS):
            rows.append(
                {
                    "mib": mib,
                    "variant": label,
                    "ms": statistics.median(samples[k]) * 1e3,
                    "ratio_np_copy": statistics.median(
                        t / c for t, c in zip(samples[k], samples[0], strict=True)
                    ),
                    "ratio_pageable": statistics.median(
                        t / p for t, p in zip(samples[k], samples[1], strict=True)
                    ),
                }
            )
    return rows


def first_transfer(sizes_mib: list[int]) -> list[dict[str, Any]]:
    """FrozenConst's first use against `jax.device_put` of a fresh aligned and unaligned array.

    Every sample starts from memory JAX has not seen (a new constant, a new
    source array, built untimed): JAX's `device_put` of an array it has seen
    before is several times faster than of a fresh one. The three are timed in
    turn in each round, without a garbage collection in between (one before
    each timed call made every call here several times slower), in an order
    that rotates from round to round.
    """
    import jax

    from frozenconst import FrozenConst

    def timed(make: Any, use: Any) -> float:
        source = make()
        start = time.perf_counter()
        use(source).block_until_ready()
        return time.perf_counter() - start

    rows = []
    for mib in sizes_mib:
        reps = 31 if mib <= 16 else 7  # small transfers are short: more samples
        data = np.random.default_rng(1).standard_normal(mib * MIB // 4).astype(np.float32)
        cases = [
            (lambda d=data: FrozenConst(d), lambda x: x.__jax_array__()),
            # JAX aliases the aligned source (its best case) and copies the other.
            (lambda d=data: copy_at(d, 0), jax.device_put),
            (lambda d=data: copy_at(d, 16), jax.device_put),
        ]
        samples: list[list[float]] = [[], [], []]
        for r in range(reps):
            for i in range(3):  # each case goes first in a third of the rounds
                k = (r + i) % 3
                samples[k].append(timed(*cases[k]))
        t_ours, t_aliased, t_copied = (statistics.median(t) for t in samples)
        rows.append(
            {
                "mib": mib,
                "device_put_aligned_ms": t_aliased * 1e3,
                "device_put_unaligned_ms": t_copied * 1e3,
                "frozenconst_ms": t_ours * 1e3,
                "ratio": t_ours / t_aliased,
                "ratio_unaligned": t_ours / t_copied,
            }
        )
    return rows


_RSS_SCRIPT = r"""
import json, os, sys, gc
import numpy as np, jax, jax.numpy as jnp
import frozenconst
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
mode, mib = sys.argv[1], int(sys.argv[2])
jnp.zeros(1).block_until_ready()
src = np.random.default_rng(2).standard_normal(mib * 2**20 // 4)  # float64: JAX holds mib MiB of float32
if mode in ("frozenconst", "pinned", "naive"):
    src = src.astype(np.float32)
gc.collect(); before = rss()
if mode != "naive":
    make = {
        "frozenconst": lambda: frozenconst.FrozenConst(src),
        "float64": lambda: frozenconst.FrozenConst(src),  # NumPy's default dtype, held as float32
        "dtype=float64": lambda: frozenconst.FrozenConst(src, dtype=np.float64),
        "pinned": lambda: frozenconst.FrozenConst(src, host_memory="pinned"),
    }[mode]
    x = make()
    dev = jnp.asarray(x); dev.block_until_ready()
    aliased = dev.unsafe_buffer_pointer() == np.asarray(x).ctypes.data
else:  # the naive immutable constant: a private host copy, then a device copy
    host = src.copy(); host.flags.writeable = False
    dev = jnp.array(host); dev.block_until_ready()
    aliased = dev.unsafe_buffer_pointer() == host.ctypes.data
gc.collect()
print(json.dumps({"mode": mode, "extra_bytes": rss() - before, "aliased": bool(aliased)}))
"""


# The approaches of the zero-copy table: (row label, mode of `_RSS_SCRIPT`). The float64
# rows build from NumPy's default dtype, of which JAX holds the float32 half (x64 off).
_RSS_MODES = (
    ("FrozenConst(a), float32", "frozenconst"),
    ("FrozenConst(a), float64 input (held as float32)", "float64"),
    ("FrozenConst(a, dtype=np.float64), float64 input", "dtype=float64"),
    ("FrozenConst(a, host_memory='pinned'), float32", "pinned"),
    ("host copy + jnp.array, float32", "naive"),
)


def zero_copy(mib: int) -> list[dict[str, Any]]:
    rows = []
    for label, mode in _RSS_MODES:
        out = subprocess.run(
            [sys.executable, "-c", _RSS_SCRIPT, mode, str(mib)],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["mode"] = label
        row["x_size"] = row["extra_bytes"] / (mib * MIB)  # x what JAX holds (float32)
        rows.append(row)
    return rows


def cache_hits(rounds: int) -> list[dict[str, Any]]:
    """Each call on a FrozenConst against the same call on its `jax.Array`, on the one-slot floor
    and on the one-slot cache floor, in `3 * rounds` rounds each: the ratios sit a few percent
    from 1, and a single run of 31 rounds moved them by as much (issue #26)."""
    import jax
    import jax.numpy as jnp

    from frozenconst import FrozenConst

    x = FrozenConst(np.ones((8, 8), np.float32))
    a = jnp.asarray(x)
    w = jnp.ones((8, 8), jnp.float32)

    class Slot:
        """The cheapest possible custom array type: one slot, `__jax_array__`, a Python
        flatten function. The floor for anything that is not a `jax.Array` (#12)."""

        __slots__ = ("v",)

        def __init__(self, v: Any) -> None:
            self.v = v

        def __jax_array__(self) -> Any:
            return self.v

        def __matmul__(self, other: Any) -> Any:
            return self.v @ other

    jax.tree_util.register_pytree_node(Slot, lambda b: ((b.v,), None), lambda _, c: Slot(c[0]))
    slot = Slot(a)

    # What any cache of device buffers must ask JAX on every use to keep the promises a
    # FrozenConst keeps: the `jax_default_device` setting (a buffer per default device,
    # so `jax.default_device` costs no transfer per call) and whether the buffer was
    # deleted (donated to a jitted function, or deleted through `jnp.asarray(x)`). Each is a
    # call into JAX's C++ (the setting read as frozenconst reads it, the cheapest way JAX
    # offers): the floor of such a cache, the one-slot type with those two reads.
    from frozenconst._compat import DEFAULT_DEVICE

    def checked(v: Any) -> Any:
        if DEFAULT_DEVICE.value is not None or v.is_deleted():
            raise AssertionError("the benchmark runs on the default device, with a live buffer")
        return v

    class CheckedSlot(Slot):
        __slots__ = ()

        def __jax_array__(self) -> Any:
            return checked(self.v)

        def __matmul__(self, other: Any) -> Any:
            return checked(self.v) @ other

    # Rebuilt inside a trace around a tracer, it is the plain slot, as a FrozenConst is then
    # a derived value that asks nothing of JAX.
    as_plain_slot: Callable[[Any, Any], Any] = lambda _, c: Slot(c[0])
    jax.tree_util.register_pytree_node(CheckedSlot, lambda b: ((checked(b.v),), None), as_plain_slot)
    cache = CheckedSlot(a)
    g = jax.jit(lambda v: jnp.multiply(v, 2))  # takes a Slot too: jnp reads `__jax_array__`
    # The two ignores: jnp takes an object with `__jax_array__` at run time, but jax's
    # `ArrayLike` annotation (jax 0.10) leaves such objects out, so `slot` fails it.
    cases: list[tuple[str, Callable[[Any], Any]]] = [
        ("jnp.add(x, 1)", lambda v: jnp.add(v, 1)),
        ("jnp.dot(x, w)", lambda v: jnp.dot(v, w)),
        ("x @ w", lambda v: v @ w),
        ("jitted f(x)", g),
    ]

    def row(name: str, call: Callable[[Any], Any]) -> dict[str, Any]:
        vs_array = ab_ratio(lambda: call(x), lambda: call(a), rounds=3 * rounds)
        vs_floor = ab_ratio(lambda: call(x), lambda: call(slot), rounds=3 * rounds)
        vs_cache = ab_ratio(lambda: call(x), lambda: call(cache), rounds=3 * rounds)
        return {
            "case": name,
            **vs_array,
            "floor_us": vs_floor["b_us"],
            "vs_floor": vs_floor["ratio"],
            "cache_floor_us": vs_cache["b_us"],
            "vs_cache_floor": vs_cache["ratio"],
        }

    return [row(name, call) for name, call in cases]


def accounting(rounds: int) -> list[dict[str, Any]]:
    """Each kind of cache hit with hit counting on, against the same call with it off."""
    import jax
    import jax.numpy as jnp

    import frozenconst

    x = frozenconst.FrozenConst(np.ones((8, 8), np.float32))
    w = jnp.ones((8, 8), jnp.float32)
    f = jax.jit(lambda v: v * 2)
    on, off = (lambda: frozenconst.set_accounting(True)), (lambda: frozenconst.set_accounting(False))
    rows = []
    try:
        for key, fn in (
            ("jnp.asarray(x)", lambda: jnp.asarray(x)),
            ("jnp.add(x, 1)", lambda: jnp.add(x, 1)),
            ("x @ w", lambda: x @ w),
            ("jitted f(x)", lambda: f(x)),
            ("bare protocol call x.__jax_array__()", lambda: x.__jax_array__()),
        ):
            # A few tens of nanoseconds on calls of tens of microseconds: three
            # times the rounds of the other tables, so the median settles.
            rows.append({"case": key, **ab_ratio(fn, fn, rounds=3 * rounds, before_a=on, before_b=off)})
    finally:
        frozenconst.set_accounting(True)
    return rows


def scaling() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from frozenconst import FrozenConst

    from .seed import buffers_holding

    eager = []
    data = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)
    x = FrozenConst(data)
    done = 0
    for uses in (1, 10, 100, 1000, 10000):
        for _ in range(uses - done):
            (x + 1.0).block_until_ready()
        done = uses
        _, copies, nbytes = buffers_holding(data)
        eager.append(
            {"uses": uses, "transfers": x.stats().transfers, "live_copies": copies, "device_bytes": nbytes}
        )
    in_jit = []
    for uses in (1, 10, 100, 1000):
        d2 = np.random.default_rng(4 + uses).standard_normal((64, 64)).astype(np.float32)
        y = FrozenConst(d2)
        fn = jax.jit(lambda v, y=y, uses=uses: sum(jnp.sum(y * v) for _ in range(uses)))
        fn(jnp.float32(1.0)).block_until_ready()
        _, copies, nbytes = buffers_holding(d2)
        in_jit.append(
            {"uses": uses, "transfers": y.stats().transfers, "live_copies": copies, "device_bytes": nbytes}
        )
        del fn
        jax.clear_caches()  # type: ignore[no-untyped-call]  # unannotated in jax 0.10
    return {"eager": eager, "jit": in_jit}


def fingerprints(mib: int, rounds: int = 5) -> list[dict[str, Any]]:
    """Each `hashlib` digest and FrozenConst's fingerprint over the same data, in interleaved rounds.

    Every round times each case once, in an order that rotates from round to
    round, so all of them read the same data in the same memory state; the
    figures are medians. "first request" hashes a new constant (built untimed).
    """
    from frozenconst import FrozenConst

    a = np.random.default_rng(5).integers(0, 255, mib * MIB, dtype=np.uint8)
    holder: dict[str, Any] = {}
    cached = FrozenConst(a)
    _ = cached.fingerprint
    cases: list[tuple[str, Any, Any]] = [
        (f"hashlib.{name}", lambda name=name: hashlib.new(name, a.data).hexdigest(), None)
        for name in ("sha256", "sha1", "md5", "blake2b", "sha3_256")
    ]
    cases += [
        (
            "x.fingerprint (first request)",
            lambda: holder["x"].fingerprint,
            lambda: holder.update(x=FrozenConst(a)),
        ),
        ("x.fingerprint (cached)", lambda: cached.fingerprint, None),
    ]
    samples: list[list[float]] = [[] for _ in cases]
    for r in range(rounds):
        for i in range(len(cases)):
            k = (r + i) % len(cases)
            _, fn, setup = cases[k]
            if setup is not None:
                setup()
            gc.collect()
            start = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - start)
    return [
        {"what": name, "gbs": a.nbytes / statistics.median(t) / 1e9}
        for (name, _, _), t in zip(cases, samples, strict=True)
    ]


def live_twins(rounds: int, counts: tuple[int, ...] = (0, 1_000, 10_000), n: int = 200) -> dict[str, Any]:
    """`intern` and `pickle.loads` per call with N other constants alive, against none alive.

    Each looks for a live constant of the same content (a twin), among constants of the same
    shape and dtype as its own, the case a scan paid most for. Every call is of new content
    (no twin: a new constant, made, looked up, dropped). The N constants are made first and
    looked up once, untimed but reported ("first lookup": where they are digested, once);
    then `rounds` rounds each time a block of `n` calls of every operation, in an order that
    rotates from round to round, with garbage collection off (its full passes cost in
    proportion to every object alive, frozenconst's or not); medians. The figures with none
    alive are measured before the first N and again after the last N are dropped, and the
    baseline is their mean: the ratio of the two says how far the machine drifted meanwhile.
    `FrozenConst(a)`, which looks nothing up, is the control: `per_construction` is each
    operation's time over the construction's in the same rounds, against that with none
    alive, which a machine's drift between measurements does not move.
    """
    import itertools
    import pickle

    import frozenconst
    from frozenconst import FrozenConst

    fresh = itertools.count()

    def data() -> Any:
        return np.full(16, next(fresh), np.float32)

    blobs = itertools.cycle([pickle.dumps(FrozenConst(data())) for _ in range(8)])
    operations: dict[str, Callable[[], Any]] = {
        "FrozenConst(a)": lambda: FrozenConst(data()),
        "intern(a)": lambda: frozenconst.intern(data()),
        "pickle.loads": lambda: pickle.loads(next(blobs)),
    }

    def measure() -> dict[str, float]:
        samples: dict[str, list[float]] = {name: [] for name in operations}
        names = list(operations)
        gc.collect()
        gc.disable()
        try:
            for r in range(rounds):
                for i in range(len(names)):
                    name = names[(r + i) % len(names)]
                    fn = operations[name]
                    start = time.perf_counter()
                    for _ in range(n):
                        fn()
                    samples[name].append((time.perf_counter() - start) / n)
        finally:
            gc.enable()
        return {name: statistics.median(t) * 1e6 for name, t in samples.items()}

    measure()  # warm: first calls, the blobs' constants digested
    rows: list[dict[str, Any]] = []
    before = measure()
    for count in counts:
        if not count:
            continue
        alive = [FrozenConst(data()) for _ in range(count)]
        start = time.perf_counter()
        frozenconst.intern(data())  # the first lookup of their shape and dtype digests them
        first = time.perf_counter() - start
        rows.append({"alive": count, "first_lookup_ms": first * 1e3, **measure()})
        del alive
    after = measure()
    none = {name: (before[name] + after[name]) / 2 for name in operations}
    control = "FrozenConst(a)"

    def relative(times: dict[str, float]) -> dict[str, float]:
        return {name: times[name] / times[control] for name in operations}

    none_relative = {name: (relative(before)[name] + relative(after)[name]) / 2 for name in operations}
    for row in rows:
        row["ratios"] = {name: row[name] / none[name] for name in operations}
        row["per_construction"] = {name: relative(row)[name] / none_relative[name] for name in operations}
    return {
        "rounds": rounds,
        "calls": n,
        "none_alive": none,
        "drift": {name: after[name] / before[name] for name in operations},
        "rows": rows,
    }


def jit_overhead(rounds: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    import frozenconst

    const = frozenconst.FrozenConst(np.ones(4, np.float32))
    raw = jnp.ones(4, jnp.float32)
    v = jnp.ones(4, jnp.float32)
    plain = jax.jit(lambda v: v + raw)
    ours = frozenconst.jit(lambda v: v + const)
    return ab_ratio(lambda: ours(v), lambda: plain(v), rounds=rounds)


def jit_static_configurations(rounds: int, configurations: int = 200) -> dict[str, Any]:
    """A call after many static configurations (each reaching a constant of its own) against the
    same call on a function that has seen one: `frozenconst.jit`, and `jax.jit` as the floor."""
    import jax
    import jax.numpy as jnp

    import frozenconst

    class Holder:
        def __init__(self, c: Any) -> None:
            self.c = c

    def fun(h: Holder, v: Any) -> Any:
        return v + h.c

    v = jnp.ones(4, jnp.float32)
    out: dict[str, Any] = {"configurations": configurations}
    for name, wrap, make in (
        ("frozenconst.jit", frozenconst.jit, frozenconst.FrozenConst),
        ("jax.jit", jax.jit, np.asarray),
    ):
        holders = [Holder(make(np.full(4, i, np.float32))) for i in range(configurations)]
        many = wrap(fun, static_argnums=0)
        for h in holders:
            many(h, v)
        one = wrap(fun, static_argnums=0)
        one(holders[0], v)
        first = holders[0]
        out[name] = ab_ratio(lambda: many(first, v), lambda: one(first, v), rounds=rounds)  # noqa: B023
    return out


def run(quick: bool) -> dict[str, Any]:
    sizes = [1, 16, 64] if quick else [1, 4, 16, 64, 256, 1024]
    rounds = 11 if quick else 31
    return {
        "rounds": rounds,
        "construction": construction(sizes),
        "host_memory": host_memory_construction([1, 16] if quick else [1, 16, 256], 5 if quick else 11),
        "first_transfer": first_transfer([1, 16] if quick else [1, 16, 256]),
        "zero_copy": zero_copy(64 if quick else 256),
        "cache_hits": cache_hits(rounds),
        "accounting": accounting(rounds),
        "jit_overhead": jit_overhead(rounds),
        "jit_static_configurations": jit_static_configurations(rounds),
        "live_twins": live_twins(11 if quick else 31),
        "scaling": scaling(),
        "fingerprint": fingerprints(64 if quick else 256),
    }


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    rows = [r for r in results["construction"] if r["case"] == "C-contiguous float32"]
    sizes = [r["mib"] for r in rows]
    axes[0].loglog(sizes, [r["seconds"] * 1e3 for r in rows], marker="o", label="FrozenConst(a)")
    axes[0].loglog(
        sizes, [r["mib"] * MIB / (r["np_copy_gbs"] * 1e9) * 1e3 for r in rows], marker="s", label="np.copy(a)"
    )
    axes[0].set(title="construction time grows linearly with size", xlabel="MiB", ylabel="ms")
    for key, ax, title in (("eager", axes[1], "eager uses"), ("jit", axes[2], "uses inside one jax.jit")):
        rs = results["scaling"][key]
        ax.semilogx(
            [r["uses"] for r in rs],
            [r["transfers"] for r in rs],
            marker="o",
            markersize=10,
            linestyle="--",
            fillstyle="none",
            label="transfers",
        )
        ax.semilogx(
            [r["uses"] for r in rs], [r["live_copies"] for r in rs], marker="s", label="live device copies"
        )
        ax.set(title=f"{title}: transfers and copies stay at 1", xlabel="uses", ylim=(0, 3))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_INTERLEAVED = (
    "Measured in one process, in {rounds} rounds of 1000 calls of each side (the last result of each "
    "batch waited for), the two sides alternating which goes first; the times are medians of the "
    "rounds, the ratio the median of the per-round ratios."
)


def _ab_table(title: str, header: tuple[str, str, str], rows: list[dict[str, Any]], rounds: int) -> list[str]:
    lines = ["", f"### {title}", "", _INTERLEAVED.format(rounds=rounds), ""]
    lines += [f"| {' | '.join(header)} | ratio |", "|---|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['a_us']:.2f} | {r['b_us']:.2f} | {r['ratio']:.3f} |" for r in rows]
    return lines


def _live_twins_table(twins: dict[str, Any] | None) -> list[str]:
    """The table of `live_twins`: per call with N constants alive, and the ratio to none alive."""
    if not twins:
        return []
    names = list(twins["none_alive"])
    none = ", ".join(f"{name} {twins['none_alive'][name]:.1f} us" for name in names)
    drift = ", ".join(f"{twins['drift'][name]:.2f}" for name in names)
    lines = [
        "",
        "### Finding a live twin: `intern` and `pickle.loads` against the constants alive",
        "",
        "`intern` and `pickle.loads` look for a live constant of the same content; each call here "
        "is of new content, of the shape and dtype of every constant alive (16 float32). "
        f"{twins['rounds']} rounds each time a block of {twins['calls']} calls of every "
        "operation, in an order rotating from round to round, garbage collection off; medians. "
        f"With none alive (the mean of before and after, whose ratio after/before is {drift}): "
        f"{none}. The first lookup after the N constants are made digests them, once. In "
        "brackets the ratio to none alive; the last columns divide each by `FrozenConst(a)`'s "
        "time in the same rounds (which looks nothing up) first, so that the machine's drift "
        "between the measurements cancels (target: within 1.2x).",
    ]
    env = twins.get("environment")
    if env:  # measured on its own (`live_twins`), after the rest of this page
        lines += ["", f"This table alone was measured on {env['date']}, frozenconst {env['frozenconst']}."]
    lines += [
        "",
        "| constants alive | first lookup ms | "
        + " | ".join(f"{n} us (ratio)" for n in names)
        + " | "
        + " | ".join(f"{n}, per construction" for n in names[1:])
        + " |",
        "|---:|---:|" + "---:|" * (2 * len(names) - 1),
    ]
    for row in twins["rows"]:
        cells = " | ".join(f"{row[n]:.1f} ({row['ratios'][n]:.2f})" for n in names)
        relative = " | ".join(f"{row['per_construction'][n]:.2f}" for n in names[1:])
        lines.append(f"| {row['alive']:,} | {row['first_lookup_ms']:.1f} | {cells} | {relative} |")
    return lines


def markdown(results: dict[str, Any], env: dict[str, str], command: str) -> str:
    rounds = results.get("rounds", 31)
    lines = [f"Produced by `{command}` on:", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]
    lines += [
        "Every figure is a ratio to a baseline measured in the same run. Every A-against-B figure",
        "either alternates A and B in one process and the same memory state, or measures each in fresh",
        "interpreters of its own; each table says which.",
        "",
        "![construction time and scaling](benchmark-core.png)",
        "",
        "### Construction: one copy, at the speed of `np.copy`",
        "",
        "The plain rows alternate NumPy's copy and FrozenConst's in one process, each result freed",
        "before the next call, so both write into the warm pages the allocator hands back: up to",
        "16 MiB in 15 rounds of blocks of calls (about 64 MiB copied per block), above in single calls",
        "(3 rounds from 512 MiB, 7 below); the ratio is the median of the per-round ratios. The",
        "'results kept (fresh memory)' rows measure each side in fresh interpreters of its own (five",
        "each, the sides alternating), which import the same modules and build the same inputs, then",
        "copy each size five times keeping every result, as a program keeps its constants: both sides",
        "write into pages the process has never touched. The figures are medians over all 25 copies",
        "of a side; the ratio is NumPy's median time over FrozenConst's. A copy into fresh memory can",
        "vary several-fold from one process to the next on this machine (`np.copy` of 64 MiB: 0.3 GB/s",
        "in one, 1.3 to 2.6 GB/s in the next), so the JSON file next to this page keeps every sample.",
        "",
        "| input | MiB | np / numpy GB/s | FrozenConst GB/s | ratio (target >= 0.8) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results["construction"]:
        lines.append(
            f"| {r['case']} | {r['mib']} | {r['np_copy_gbs']:.2f} | {r['frozenconst_gbs']:.2f} "
            f"| {r['ratio']:.2f} |"
        )
    lines += [
        "",
        "The baseline for transposed input is `np.ascontiguousarray(a.T)`, and for the dtype",
        "conversion `a.astype(np.float32)`: the same work done by NumPy.",
        "",
        "### Construction: host memory",
        "",
        "`FrozenConst(a, host_memory=...)` for each choice (docs/host-memory.md) and `np.copy(a)`,",
        "float32, in one process: each round times every variant once (blocks of calls below 16 MiB),",
        "in an order that rotates from round to round, each result freed outside the timed region;",
        "medians over rounds, ratios the medians of the per-round ratios. On CPU `auto` is pageable,",
        "and JAX page-locks the frozen copy in place (it aliases the aligned buffer).",
        "",
        "| MiB | variant | ms | ratio to np.copy | ratio to pageable |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in results.get("host_memory", []):
        lines.append(
            f"| {r['mib']} | {r['variant']} | {r['ms']:.3f} | {r['ratio_np_copy']:.2f} "
            f"| {r['ratio_pageable']:.2f} |"
        )
    lines += [
        "",
        "### First transfer to the default device",
        "",
        "`jax.device_put` of a NumPy array that starts on a 64-byte boundary is an alias on CPU (JAX's",
        "best case, the target's baseline); of any other array, a copy, as on an accelerator. The three",
        "are timed in turn in one process, in an order that rotates from round to round (31 rounds up",
        "to 16 MiB, 7 above), each sample from a source built untimed that JAX has not seen; medians.",
        "",
        "| MiB | device_put, aligned ms | device_put, unaligned ms | FrozenConst first use ms "
        "| ratio to aligned (target <= 1.1) | ratio to unaligned |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["first_transfer"]:
        lines.append(
            f"| {r['mib']} | {r['device_put_aligned_ms']:.3f} | {r['device_put_unaligned_ms']:.3f} "
            f"| {r['frozenconst_ms']:.3f} | {r['ratio']:.2f} | {r['ratio_unaligned']:.2f} |"
        )
    lines += [
        "",
        "### CPU zero-copy: process memory for one constant",
        "",
        "Each approach in a fresh interpreter of its own: the RSS it adds once the constant is built",
        "and used once, read from `/proc`, against the bytes of float32 data JAX holds (x64 off). The",
        "float64 rows start from NumPy's default dtype, twice those bytes.",
        "",
        "| approach | device buffer aliases host | extra RSS, x the constant's size |",
        "|---|---|---:|",
    ]
    for r in results["zero_copy"]:
        lines.append(f"| {r['mode']} | {r['aliased']} | {r['x_size']:.2f} |")
    lines += [
        "",
        "### Cache hits (dispatch-bound: 8x8 float32)",
        "",
        _INTERLEAVED.format(rounds=3 * rounds),
        "The floor is the cheapest possible custom array type (one slot, `__jax_array__`, a "
        "Python flatten function), measured against FrozenConst in rounds of its own; target: "
        "FrozenConst <= 1.05x the floor. The cache floor is that type with the two questions every "
        "use of a cached device buffer must ask JAX to keep a FrozenConst's promises, each a call "
        "into JAX's C++: the `jax_default_device` setting (a buffer per default device, so "
        "`jax.default_device` costs no transfer per call) and whether the buffer was deleted "
        "(donated, or deleted through `jnp.asarray(x)`); also in rounds of its own.",
        "",
        "| call | FrozenConst us | jax.Array us | ratio to jax.Array | floor us | ratio to the floor "
        "| cache floor us | ratio to the cache floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['case']} | {r['a_us']:.2f} | {r['b_us']:.2f} | {r['ratio']:.3f} | {r['floor_us']:.2f} "
        f"| {r['vs_floor']:.3f} | {r['cache_floor_us']:.2f} | {r['vs_cache_floor']:.3f} |"
        for r in results["cache_hits"]
    ]
    lines += _ab_table(
        "Accounting: hit counting on against off (target <= 1.05)",
        ("cache hit", "counting on us", "counting off us"),
        results["accounting"],
        3 * rounds,
    )
    j = results["jit_overhead"]
    s = results["jit_static_configurations"]
    ours, floor = s["frozenconst.jit"], s["jax.jit"]
    lines += [
        "",
        f"`frozenconst.jit` per call on a tiny function: {j['a_us']:.2f} us against {j['b_us']:.2f} us "
        f"for `jax.jit` ({j['ratio']:.3f}x), each with one 4-element constant closed over. "
        + _INTERLEAVED.format(rounds=rounds),
        "",
        f"Per call after {s['configurations']} static configurations, each reaching a constant of "
        f"its own, against the same call on a function that has seen one: `frozenconst.jit` "
        f"{ours['a_us']:.2f} us against {ours['b_us']:.2f} us ({ours['ratio']:.3f}x); the floor, "
        f"`jax.jit` with NumPy constants, {floor['a_us']:.2f} against {floor['b_us']:.2f} us "
        f"({floor['ratio']:.3f}x). Each call is fed only its own configuration's constants. "
        + _INTERLEAVED.format(rounds=rounds),
    ]
    lines += _live_twins_table(results.get("live_twins"))
    lines += [
        "",
        "### Scaling",
        "",
        "| where | uses | transfers | live device copies | device bytes |",
        "|---|---:|---:|---:|---:|",
    ]
    for key in ("eager", "jit"):
        for r in results["scaling"][key]:
            lines.append(
                f"| {key} | {r['uses']} | {r['transfers']} | {r['live_copies']} | {r['device_bytes']} |"
            )
    lines += [
        "",
        "### Fingerprints",
        "",
        "Every digest over the same data in one process, in 5 rounds that time each once, in an order",
        "that rotates from round to round; medians. The first request hashes a new constant (built",
        "untimed).",
        "",
        "| digest | GB/s |",
        "|---|---:|",
    ]
    for r in results["fingerprint"]:
        lines.append(f"| {r['what']} | {r['gbs']:.2f} |")
    return "\n".join(lines) + "\n"


def main(quick: bool, docs: pathlib.Path) -> dict[str, Any]:
    from ._harness import environment

    results = run(quick)
    env = environment()
    command = "python -m benchmarks core" + (" --quick" if quick else "")
    plot(results, docs / "benchmark-core.png")
    text = markdown(results, env, command)
    (docs / "performance-results.md").write_text(text)
    (docs / "performance-results.json").write_text(json.dumps({"environment": env, **results}, indent=1))
    print(text)
    return results


def render(docs: pathlib.Path, quick: bool = False) -> None:
    """Write the Markdown again from the saved JSON (no measuring)."""
    saved = json.loads((docs / "performance-results.json").read_text())
    env = saved.pop("environment")
    command = "python -m benchmarks core" + (" --quick" if quick else "")
    (docs / "performance-results.md").write_text(markdown(saved, env, command))


if __name__ == "__main__":  # pragma: no cover
    main("--quick" in sys.argv, results_folder("--quick" in sys.argv))
    os._exit(0)
