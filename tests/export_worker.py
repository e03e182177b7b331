"""Programs saved and loaded by several processes.

    python export_worker.py DIR export              # one process, 4 CPU devices: export, save
    python export_worker.py DIR load PID PORT       # one of 2 processes, 2 CPU devices each
    python export_worker.py DIR save INDEX COUNT ROUNDS  # one of COUNT processes saving at once
    python export_worker.py DIR memory MIB          # save, then (another process) load: memory

`export` and `load`: a program with a constant sharded over 4 devices, exported in one process and
loaded in two. Each loading process holds only the constant's slices its devices address (`HOST`
line: its host bytes and the constant's), and the gathered result is bitwise the exporter's
(`RESULT`).

`save`: every process exports the same program, as every host of a multi-host job running one
script does, then, in each of ROUNDS rounds, waits for the others (a barrier of files in DIR) and
saves it to `DIR/round-<r>`, with its store by default, named inside the program's directory, or
shared beside it, in turn. It prints `SAVED INDEX` once every save returned.

`memory`: saves a program over a MIB MiB table (and one over a 1 MiB table) into DIR, then, in a
fresh process, loads and calls the small one (what any process's first program costs: XLA's
compiler, its arenas), and measures loading the big one and its first call: `MEMORY <anonymous
growth before the call> <peak growth> <anonymous growth after it> <the table's bytes>`, in
bytes, from Linux's `/proc/self/status` (the peak from a reset VmHWM).
"""

import pathlib
import sys
import time

import jax
import numpy as np

if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", {"export": 4, "load": 2}.get(sys.argv[2], 1))

import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import frozenconst
from frozenconst import FrozenConst


def export(out: pathlib.Path) -> None:
    mesh = jax.make_mesh((4,), ("x",))
    data = np.arange(128 * 64, dtype=np.float32).reshape(128, 64) / 100
    table = FrozenConst(data, sharding=NamedSharding(mesh, P("x")))
    spec = jax.ShapeDtypeStruct((64,), jnp.float32, sharding=NamedSharding(mesh, P()))
    exported = frozenconst.export(lambda x: jnp.tanh(table) @ x, spec)
    exported.save(out / "prog")
    x = jax.device_put(jnp.ones(64), NamedSharding(mesh, P()))
    np.save(out / "expected.npy", np.asarray(exported(x)))
    print("EXPORTED", flush=True)


def load(out: pathlib.Path, pid: int, port: int) -> None:
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=pid, initialization_timeout=120
    )
    try:
        loaded = frozenconst.load(out / "prog")
        (table,) = loaded.constants
        print("HOST", pid, table.stats().host_bytes, table.nbytes, flush=True)
        mesh = jax.make_mesh((4,), ("x",))
        x = jax.make_array_from_callback(
            (64,), NamedSharding(mesh, P()), lambda i: np.ones(64, np.float32)[i]
        )
        whole = np.asarray(multihost_utils.process_allgather(loaded(x), tiled=True))
        print("RESULT", pid, whole.tobytes() == np.load(out / "expected.npy").tobytes(), flush=True)
    finally:
        jax.distributed.shutdown()


STORES = ("default", "inside", "beside")


def store_of(out: pathlib.Path, r: int) -> pathlib.Path | None:
    """Round `r`'s store: the default one, one named inside the program's directory, or one beside."""
    kind = STORES[r % len(STORES)]
    return (
        None
        if kind == "default"
        else out / f"round-{r}" / "constants"
        if kind == "inside"
        else out / "shared"
    )


def table() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((128, 128)).astype(np.float32)


def save(out: pathlib.Path, index: int, count: int, rounds: int) -> None:
    constant = FrozenConst(table())
    exported = frozenconst.export(lambda x: jnp.tanh(constant @ x), jax.ShapeDtypeStruct((128,), jnp.float32))
    for r in range(rounds):
        (out / f".ready-{r}-{index}").touch()
        while len(list(out.glob(f".ready-{r}-*"))) < count:  # the others ready too: save at once
            time.sleep(0.001)
        exported.save(out / f"round-{r}", constants=store_of(out, r))
    print("SAVED", index, flush=True)


def _tanh_sum(table: FrozenConst):
    return lambda x: jnp.sum(jnp.tanh(table @ x))


def memory(out: pathlib.Path, mib: int) -> None:
    import subprocess

    from benchmarks._harness import peak_baseline, process_memory

    if not (out / "big").exists():
        for name, size, seed in (("small", 1, 1), ("big", mib, 0)):
            data = np.random.default_rng(seed).standard_normal((size * 1024, 256), dtype=np.float32) / 16
            frozenconst.export(_tanh_sum(FrozenConst(data)), jax.ShapeDtypeStruct((256,), jnp.float32)).save(
                out / name
            )
        sys.exit(subprocess.call([sys.executable, __file__, str(out), "memory", str(mib)]))
    small = frozenconst.load(out / "small")
    small(jnp.ones(256)).block_until_ready()
    base = peak_baseline()
    before = process_memory()
    loaded = frozenconst.load(out / "big")
    loaded_anon = process_memory()["RssAnon"] - before["RssAnon"]
    loaded(jnp.ones(256)).block_until_ready()
    after = process_memory()
    (table,) = loaded.constants
    print("MEMORY", loaded_anon, after["VmHWM"] - base, after["RssAnon"] - before["RssAnon"], table.nbytes)


if __name__ == "__main__":
    where = pathlib.Path(sys.argv[1])
    if sys.argv[2] == "export":
        export(where)
    elif sys.argv[2] == "load":
        load(where, int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[2] == "memory":
        memory(where, int(sys.argv[3]))
    else:
        save(where, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
