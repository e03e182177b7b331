"""A FrozenConst on two hosts: two processes form one 4-device mesh over jax.distributed.

    python examples/multihost.py              # launches both processes on 127.0.0.1
    python examples/multihost.py PORT ID      # one process (ID 0 or 1), as a launcher would

Each process has 2 CPU devices; on real hosts, run one process per host with the
coordinator's address instead of 127.0.0.1 and drop `jax_num_cpu_devices`.
"""

import os
import signal
import socket
import subprocess
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import frozenconst  # noqa: E402
from frozenconst import FrozenConst  # noqa: E402


def main(port: int, process_id: int) -> None:
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=120,
    )
    try:
        assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
        data = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)  # the same in both processes
        x = FrozenConst(data)
        mesh = jax.make_mesh((4,), ("x",))
        sharded = x.on(NamedSharding(mesh, P("x")))
        replicated = x.on(NamedSharding(mesh, P()))
        # Each process holds only its own shards: 2 local quarters, and 2 full replicas.
        assert [s.data.shape for s in sharded.addressable_shards] == [(16, 8), (16, 8)]
        assert [s.data.shape for s in replicated.addressable_shards] == [(64, 8), (64, 8)]
        for s in sharded.addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), data[s.index])

        total = jax.jit(lambda a, b: (a.sum(), (a * b).sum()))(sharded, replicated)
        expected = (data.sum(), (data * data).sum())
        for got, want in zip(total, expected, strict=True):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)

        w = jax.make_array_from_callback(
            (8, 4), NamedSharding(mesh, P(None, "x")), lambda i: np.ones((8, 4))[i]
        )
        f = frozenconst.jit(lambda w: jax.numpy.sum(x @ w))
        np.testing.assert_allclose(np.asarray(f(w)), (data @ np.ones((8, 4))).sum(), rtol=1e-5)
        print(f"process {process_id} ok", flush=True)
    finally:
        jax.distributed.shutdown()


def launch(timeout_s: float = 240) -> int:
    """Start both processes on a free loopback port; stop both, whatever happens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen([sys.executable, __file__, str(port), str(i)], start_new_session=True)
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
    if len(sys.argv) == 3:
        main(int(sys.argv[1]), int(sys.argv[2]))
    else:
        sys.exit(launch())
