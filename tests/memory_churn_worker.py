"""Memory as frozenconst.jit functions come and go (issue #19, part 7).

    python memory_churn_worker.py FORM COUNT

Makes, lowers and drops COUNT functions whose body uses a constant inside
FORM (`scan`: a `lax.scan` body; `jit`: an inner `jax.jit`), first with
`jax.jit` over the constant's device buffer, then with `frozenconst.jit` over
the constant, in this one process, and prints the resident memory each grew
by per function: `GROWTH <form> <jax.jit bytes> <frozenconst.jit bytes>`.
Lowering fills every cache keyed by the trace context; XLA's compile is left
out (the warm-up calls each kind once), as it multiplies the time by ten.
"""

import ctypes
import gc
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import frozenconst
from frozenconst import FrozenConst

try:
    _trim = ctypes.CDLL("libc.so.6").malloc_trim  # free pages back, so RSS counts what is held
except (OSError, AttributeError):  # pragma: no cover - not glibc
    _trim = None


def rss() -> int:
    gc.collect()
    if _trim is not None:
        _trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def make(jit, table, form):
    if form == "scan":

        def f(x):
            def body(carry, _):
                return carry + jnp.sum(table * x), None

            return lax.scan(body, 0.0, None, length=3)[0]
    else:

        def f(x):
            return jax.jit(lambda y: jnp.sum(table * y))(x)

    return jit(f)


def growth(jit, table, form, count):
    x = jnp.ones(table.shape, jnp.float32)
    make(jit, table, form)(x).block_until_ready()
    for _ in range(max(100, count // 5)):  # JAX's first-use allocations, and every cache warm
        make(jit, table, form).lower(x)
    before = rss()
    for _ in range(count):
        make(jit, table, form).lower(x)
    return (rss() - before) / count


def main(form, count):
    data = np.arange(2048, dtype=np.float32)
    x = FrozenConst(data)
    start = time.perf_counter()
    plain = growth(jax.jit, jnp.asarray(data), form, count)
    middle = time.perf_counter()
    ours = growth(frozenconst.jit, x, form, count)
    print(f"seconds {middle - start:.1f} {time.perf_counter() - middle:.1f}", flush=True)
    print(f"GROWTH {form} {plain:.1f} {ours:.1f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
