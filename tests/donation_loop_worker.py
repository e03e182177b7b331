"""Memory and traces of a training loop that donates a state holding a constant.

    python donation_loop_worker.py STEPS DEVICES LOOP [LOOP ...]

Each LOOP is one of:

- `donate`: each step, `jax.jit(step, donate_argnums=0)({"w": w, "t": C})`, a FrozenConst `C`
  in the donated state (JAX deletes its cached device buffer, which the next use transfers
  again), then `g(x)`, a `frozenconst.jit` function closing over `C`;
- `delete`: each step, `jnp.asarray(C).delete()`, then `g(x)`.

Beside them, `h(x)`, a `frozenconst.jit` function that uses another constant `D` inside a
`lax.scan` body, and never meets `C`.

Each loop runs twice in this one process on DEVICES CPU devices: with the constant, then the
same loop with a `jax.Array` equal to it in the constant's place in the donated state (or
deleted), made afresh each step as the constant's buffer is transferred again; `g` and `h`
are the same functions. It prints, per loop: `STEPS <loop> <jax.Array bytes> <FrozenConst
bytes>`, the heap bytes each grew by per step after a warm-up, and `TRACES <loop> <g> <h>`,
how many times `g` and `h` were traced over the constant's loop (warm-up included).
"""

import os
import sys
import warnings

# Python's objects allocated through malloc, so that `heap()` counts them too (see
# memory_churn_worker.py): set before the interpreter starts.
if __name__ == "__main__" and os.environ.get("PYTHONMALLOC") != "malloc":
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONMALLOC": "malloc"})

import jax

if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", int(sys.argv[2]))  # before JAX's backend starts

import jax.numpy as jnp
import numpy as np
from jax import lax
from memory_churn_worker import heap

import frozenconst
from frozenconst import FrozenConst

# What each step says, said once per line by Python's default filter, or not at all.
warnings.filterwarnings("ignore", "Some donated buffers were not usable")
warnings.filterwarnings("ignore", category=frozenconst.FrozenConstWarning)

DATA = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
C = FrozenConst(DATA)
D = FrozenConst(DATA + 1)
TRACES = {"g": 0, "h": 0}


def _g(x):
    TRACES["g"] += 1
    return jnp.tanh(C @ x) + 1


def _h(x):
    TRACES["h"] += 1
    return lax.scan(lambda carry, _: (carry + jnp.sum(D @ x), None), 0.0, None, length=2)[0]


g = frozenconst.jit(_g)
h = frozenconst.jit(_h)
step = jax.jit(lambda s: {"w": s["w"] * 0.5 + jnp.sum(s["t"]), "t": s["t"]}, donate_argnums=0)
x = jnp.ones(64, jnp.float32)


def one_step(loop, table, w):
    if loop == "donate":
        w = step({"w": w, "t": table})["w"]
    else:
        jnp.asarray(table).delete()
    jax.block_until_ready((g(x), h(x), w))
    return w


def run(loop, frozen, steps):
    w = jnp.zeros((), jnp.float32)
    for _ in range(max(20, steps // 5)):  # every cache warm, JAX's first-use allocations made
        w = one_step(loop, C if frozen else jnp.array(DATA), w)
    before = heap()
    for _ in range(steps):
        w = one_step(loop, C if frozen else jnp.array(DATA), w)
    return (heap() - before) / steps


def main(steps, loops):
    for loop in loops:
        plain = run(loop, False, steps)
        TRACES.update(g=0, h=0)
        ours = run(loop, True, steps)
        print(f"STEPS {loop} {plain:.1f} {ours:.1f}", flush=True)
        print(f"TRACES {loop} {TRACES['g']} {TRACES['h']}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[3:])
