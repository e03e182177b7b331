"""A constant bigger than one host: each of two processes freezes only the rows its devices address.

    python examples/bigger_than_host.py                 # writes a table, launches both processes on 127.0.0.1
    python examples/bigger_than_host.py PORT ID PATH    # one process (ID 0 or 1), as a launcher would

Each process has 2 CPU devices; on real hosts, run one process per host with the
coordinator's address instead of 127.0.0.1, drop `jax_num_cpu_devices`, and
point PATH at a .npy every host can read (a shared file system).
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from frozenconst import FrozenConst, NotAddressableError  # noqa: E402

ROWS, COLS = 4096, 256  # a 4 MiB float32 embedding table


def main(port: int, process_id: int, path: str) -> None:
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=120,
    )
    try:
        mesh = jax.make_mesh((jax.device_count(),), ("x",))
        rows = NamedSharding(mesh, P("x"))

        # Memory-mapped: this process reads and freezes only its half of the rows.
        table = FrozenConst(np.load(path, mmap_mode="r"), sharding=rows)
        assert table.stats().host_bytes == ROWS * COLS * 4 // 2

        # The same from a callback, as `jax.make_array_from_callback` takes one.
        source = np.load(path, mmap_mode="r")
        same = FrozenConst.from_callback((ROWS, COLS), rows, lambda index: source[index], dtype=np.float32)

        # Used like any sharded jax.Array: jit programs take its global array as
        # it is, closed over (a parameter of the program, where JAX alone refuses to
        # embed an array that spans other processes) or as an argument.
        v = jnp.linspace(-1, 1, COLS, dtype=jnp.float32)
        scores = jax.jit(lambda v: jnp.max(table @ v))(v)
        also = jax.jit(lambda t, v: jnp.max(t @ v))(same, v)
        want = np.max(np.asarray(source) @ np.asarray(v))
        np.testing.assert_allclose([float(scores), float(also)], [want, want], rtol=1e-5)

        # Whole-array host access needs a collective, and says which.
        try:
            np.asarray(table)
        except NotAddressableError as err:
            assert "process_allgather" in str(err)
        whole = multihost_utils.process_allgather(table.on(table.declared_sharding), tiled=True)
        assert FrozenConst(np.asarray(whole)).fingerprint == FrozenConst(np.load(path)).fingerprint
        print(
            f"process {process_id} ok: holds {table.stats().host_bytes} of {table.nbytes} bytes", flush=True
        )
    finally:
        jax.distributed.shutdown()


def launch(timeout_s: float = 240) -> int:
    """Write the table, start both processes on a free loopback port; stop both, whatever happens."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "table.npy")
        np.save(path, np.random.default_rng(0).standard_normal((ROWS, COLS), dtype=np.float32))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [
            subprocess.Popen([sys.executable, __file__, str(port), str(i), path], start_new_session=True)
            for i in range(2)
        ]
        try:
            return max(p.wait(timeout=timeout_s) for p in procs)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


if __name__ == "__main__":
    if len(sys.argv) == 4:
        main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(launch())
