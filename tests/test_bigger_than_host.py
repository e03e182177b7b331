"""Constants bigger than one host (docs/bigger-than-host.md): in one process, what needs
no other process; and 2- and 4-process runs over jax.distributed, bounded in time."""

import pathlib
import sys

import jax
import numpy as np
import pytest
from helpers import free_port, run_bounded, run_processes, subprocess_env

from frozenconst import FrozenConst, FrozenConstTypeError, FrozenConstValueError
from frozenconst._partial import lazily_sliceable

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "bigger_than_host_worker.py"
EXAMPLE = HERE.parent / "examples" / "bigger_than_host.py"
TIMEOUT_S = 240


def test_memory_mapped_sources_are_recognised(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(12.0).reshape(3, 4))
    loaded = np.load(path, mmap_mode="r")
    raw = np.memmap(tmp_path / "raw.bin", np.float32, mode="w+", shape=(4,))
    assert lazily_sliceable(loaded) and lazily_sliceable(raw)
    assert lazily_sliceable(np.asarray(loaded)[1:])  # a plain view of the map
    assert not lazily_sliceable(np.load(path))
    assert not lazily_sliceable(np.array(loaded))


def test_in_one_process_a_memory_mapped_source_is_frozen_whole(tmp_path):
    path = tmp_path / "a.npy"
    data = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    np.save(path, data)
    x = FrozenConst(np.load(path, mmap_mode="r"), sharding=jax.devices()[0])
    np.testing.assert_array_equal(np.asarray(x), data, strict=True)
    assert x.fingerprint == FrozenConst(data).fingerprint
    assert x.stats().host_bytes == data.nbytes


def test_from_callback_in_one_process_is_a_whole_constant():
    data = np.arange(24, dtype=np.int32).reshape(6, 4)
    indices = []
    returned = []

    def read(index):
        indices.append(index)
        returned.append(np.array(data[index]))
        return returned[-1]

    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    x = FrozenConst.from_callback(data.shape, sharding, read, dtype=np.float32)
    assert indices == [(slice(None), slice(None))]
    returned[0][...] = -1  # changing what the callback returned changes nothing
    np.testing.assert_array_equal(np.asarray(x), data.astype(np.float32), strict=True)
    assert x.declared_sharding == sharding and jax.numpy.asarray(x).committed
    assert x.fingerprint == FrozenConst(data, np.float32).fingerprint
    assert not np.asarray(x).flags.writeable


def test_from_callback_names_the_index_and_what_it_received():
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(
        FrozenConstValueError, match=r"shape \(3,\) for index \[:, :\], which selects shape \(2, 3\)"
    ):
        FrozenConst.from_callback((2, 3), sharding, lambda index: np.zeros(3), dtype=np.float32)
    with pytest.raises(FrozenConstTypeError, match=r"returned for index \[:\]"):
        FrozenConst.from_callback((2,), sharding, lambda index: np.array(["a", "b"]), dtype=np.float32)
    with pytest.raises(FrozenConstValueError, match=r"returned for index \[:\].*uint8"):
        FrozenConst.from_callback((2,), sharding, lambda index: np.array([1, 300]), dtype=np.uint8)
    with pytest.raises(FrozenConstTypeError, match="requested dtype"):
        FrozenConst.from_callback((2,), sharding, lambda index: np.zeros(2), dtype=object)


def _processes(count, path):
    """Run the worker in `count` processes; their exit codes and outputs."""
    port = free_port()
    worker = [sys.executable, str(WORKER), str(port)]
    return run_processes([[*worker, str(i), str(count), str(path)] for i in range(count)], TIMEOUT_S)


@pytest.mark.subprocess
@pytest.mark.parametrize("count", [2, 4])
def test_each_process_freezes_only_its_share(tmp_path, count):
    # 64 MiB: large enough that the share dominates every other allocation the
    # measurement could see, small enough for CI.
    path = tmp_path / "table.npy"
    table = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(8192, 2048))
    table[:] = np.random.default_rng(count).standard_normal(table.shape[1], dtype=np.float32)
    table[:, 0] = np.arange(table.shape[0])  # every row distinct
    table.flush()
    del table
    for _attempt in range(3):
        codes, outputs = _processes(count, path)
        if codes == [0] * count or not any("Address already in use" in o for o in outputs):
            break
    assert codes == [0] * count, "\n----\n".join(o[-4000:] for o in outputs)
    for i, out in enumerate(outputs):
        assert f"process {i} ok" in out, out[-4000:]
        (line,) = [ln for ln in out.splitlines() if ln.startswith("RSS ")]
        growth, share, whole = map(int, line.split()[1:])
        # Checked in the worker too; here the figures land in the test report.
        assert share * count == whole and 0.9 * share <= growth <= 1.1 * share, (growth, share, whole)


@pytest.mark.subprocess
def test_the_documented_example_runs():
    code, out = run_bounded([sys.executable, str(EXAMPLE)], TIMEOUT_S, env=subprocess_env(), cwd=HERE.parent)
    assert code == 0, out[-6000:]
    assert "process 0 ok: holds 2097152 of 4194304 bytes" in out and "process 1 ok" in out
