"""The source is hammered from another thread during construction and transfer."""

import threading

import jax
import jax.numpy as jnp
import numpy as np

from frozenconst import FrozenConst


def test_device_copies_equal_the_construction_time_snapshot():
    source = np.zeros((2048, 2048), np.float32)  # 16 MiB
    stop = threading.Event()
    writes = [0]

    def hammer():
        value = 0.0
        while not stop.is_set():
            value += 1.0
            source[...] = value
            writes[0] += 1

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        constants = []
        for _ in range(4):
            x = FrozenConst(source)
            snapshot = np.array(x, copy=True)  # what construction captured
            device = jnp.asarray(x)  # transfer while the source keeps changing
            doubled = jax.jit(lambda v: v * 2)(x)
            constants.append((x, snapshot, device, doubled))
    finally:
        stop.set()
        thread.join()
    assert writes[0] > 4  # the source really was being written throughout
    for x, snapshot, device, doubled in constants:
        np.testing.assert_array_equal(np.asarray(x), snapshot)
        np.testing.assert_array_equal(np.asarray(device), snapshot)
        np.testing.assert_array_equal(np.asarray(doubled), snapshot * 2)
        for d in jax.local_devices():
            with jax.default_device(d):
                np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), snapshot)
