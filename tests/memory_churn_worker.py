"""Memory as jitted functions over a FrozenConst come and go.

    python memory_churn_worker.py COUNT DEVICES FORM [FORM ...]

Each FORM is `REACH-NESTED`: how the function reaches its constant (REACH:
`closure`, closed over; `attribute`, `self.table` of a callable object passed to
the jit; `attributes`, two such attributes, both used in the nested trace, so
that a trace already isolated meets the second; `dict`, an entry of a dict it
closes over; `global`, a module global it names; `module_jit`, a module-level
`jax.jit` function that closes over the constant and that the function calls;
`module_own`, the same made by the jit measured; `module_arg`, a module-level `jax.jit` function the function
passes the constant to, from a dict) and the nested trace it uses it in (NESTED:
`scan`, a `lax.scan` body; `jit`, an inner `jax.jit`; `grad`, an inner
`jax.grad`; `cond`, a `lax.cond` branch; with the `module_` forms, `jit` only).

For each form, makes, lowers and drops COUNT functions, first with `jax.jit`
over a `jax.Array` of the constant's data, then with `jax.jit` over the constant
(whose programs take it as a parameter), in this one process on DEVICES CPU
devices, and prints the heap bytes each grew by per function: `GROWTH <form>
<jax.Array bytes> <FrozenConst bytes>`. Lowering fills every cache JAX keeps of a
program, frozenconst's rewrite of it included; XLA's compile is left out (the
warm-up calls each kind once), as it multiplies the time by ten.
"""

import ctypes
import gc
import os
import sys
import time

# Python's objects allocated through malloc, so that `heap()` counts them too (pymalloc
# keeps its own arenas, out of malloc's sight): set before the interpreter starts.
if __name__ == "__main__" and os.environ.get("PYTHONMALLOC") != "malloc":
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONMALLOC": "malloc"})

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from frozenconst import FrozenConst


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2`: ten `size_t` fields, in this order."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def heap() -> int:
    """Bytes the process's heap holds after a collection, byte for byte: glibc's `mallinfo2`,
    the chunks in use in every arena (`uordblks`) and the blocks mapped on their own (`hblkhd`),
    which hold XLA's and MLIR's allocations and, under `PYTHONMALLOC=malloc`, Python's objects.

    RSS moves by pages (4 KiB) and with malloc's fragmentation, too coarse over a hundred
    functions; this count resolves tens of bytes per function, far below the leaks these forms
    pin.
    """
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        raise SystemExit("memory_churn_worker needs glibc's mallinfo2 (glibc 2.33 or later)") from None
    if os.environ.get("PYTHONMALLOC") != "malloc":
        raise SystemExit("memory_churn_worker counts Python's objects only under PYTHONMALLOC=malloc")
    mallinfo2.restype = _MallInfo2
    gc.collect()
    info = mallinfo2()
    return info.uordblks + info.hblkhd


# -- the nested traces: each uses the table that `get()` reaches, inside one ------------------


def in_scan(get, x):
    def body(carry, _):
        return carry + jnp.sum(get() * x), None

    return lax.scan(body, 0.0, None, length=3)[0]


def in_jit(get, x):
    return jax.jit(lambda y: jnp.sum(get() * y))(x)


def in_grad(get, x):
    return jnp.sum(jax.grad(lambda y: jnp.sum(jnp.sin(get() * y)))(x))


def in_cond(get, x):
    return lax.cond(x[0] > 0, lambda y: jnp.sum(get() * y), lambda y: jnp.sum(y), x)


NESTED = {"scan": in_scan, "jit": in_jit, "grad": in_grad, "cond": in_cond}


# -- how the function reaches the table ----------------------------------------------------------


class Model:
    """A callable holding the table as an attribute: `jax.jit(Model(...))`."""

    def __init__(self, table, nested):
        self.table = table
        self.nested = nested

    def __call__(self, x):
        return self.nested(lambda: self.table, x)


class TwoTables:
    """A callable holding two tables as attributes, both used in the nested trace."""

    def __init__(self, table, other, nested):
        self.table, self.other, self.nested = table, other, nested

    def __call__(self, x):
        return self.nested(lambda: self.table * 0.5 + self.other * 0.5, x)


TABLE = None  # the module global of the `global` form
OTHER = None  # the second table of the `attributes` form
MODULE_JIT = None  # the module-level jitted function of the `module_` forms


def make(jit, table, form):
    reach, nested_name = form.split("-")
    nested = NESTED[nested_name]
    if reach == "closure":
        return jit(lambda x: nested(lambda: table, x))
    if reach == "attribute":
        return jit(Model(table, nested))
    if reach == "attributes":
        return jit(TwoTables(table, OTHER, nested))
    if reach == "dict":
        tables = {"t": table}
        return jit(lambda x: nested(lambda: tables["t"], x))
    if reach == "global":
        return jit(lambda x: nested(lambda: TABLE, x))
    if reach in ("module_jit", "module_own"):
        return jit(lambda x: MODULE_JIT(x))
    if reach == "module_arg":
        tables = {"t": table}
        return jit(lambda x: MODULE_JIT(x, tables["t"]))
    raise SystemExit(f"unknown form {form!r}")


def growth(jit, table, other, form, count):
    global TABLE, OTHER, MODULE_JIT
    TABLE, OTHER = table, other
    if form.startswith("module_arg"):
        MODULE_JIT = jax.jit(lambda y, t: jnp.sum(t * y))
    else:
        MODULE_JIT = (jit if form.startswith("module_own") else jax.jit)(lambda y: jnp.sum(table * y))
    x = jnp.ones(table.shape, jnp.float32)
    make(jit, table, form)(x).block_until_ready()
    for _ in range(max(50, count // 5)):  # JAX's first-use allocations, and every cache warm
        make(jit, table, form).lower(x)
    before = heap()
    for _ in range(count):
        make(jit, table, form).lower(x)
    grown = (heap() - before) / count
    TABLE = OTHER = MODULE_JIT = None
    return grown


def main(count, forms):
    data = np.arange(2048, dtype=np.float32)
    for form in forms:
        start = time.perf_counter()
        plain = growth(jax.jit, jnp.asarray(data), jnp.asarray(data + 1), form, count)
        middle = time.perf_counter()
        ours = growth(jax.jit, FrozenConst(data), FrozenConst(data + 1), form, count)
        print(f"seconds {form} {middle - start:.1f} {time.perf_counter() - middle:.1f}", flush=True)
        print(f"GROWTH {form} {plain:.1f} {ours:.1f}", flush=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    jax.config.update("jax_num_cpu_devices", int(argv[1]))  # before JAX's backend starts
    main(int(argv[0]), argv[2:])
