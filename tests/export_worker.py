"""A program with a constant sharded over 4 devices, exported in one process and loaded in two.

    python export_worker.py DIR export              # one process, 4 CPU devices: export, save
    python export_worker.py DIR load PID PORT       # one of 2 processes, 2 CPU devices each

Each loading process holds only the constant's slices its devices address (`HOST` line: its
host bytes and the constant's), and the gathered result is bitwise the exporter's (`RESULT`).
"""

import pathlib
import sys

import jax
import numpy as np

if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", 4 if sys.argv[2] == "export" else 2)

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


if __name__ == "__main__":
    where = pathlib.Path(sys.argv[1])
    if sys.argv[2] == "export":
        export(where)
    else:
        load(where, int(sys.argv[3]), int(sys.argv[4]))
