"""Constants bigger than one host (docs/bigger-than-host.md): in one process, what needs
no other process; and 2- and 4-process runs over jax.distributed, bounded in time."""

import pathlib
import sys

import jax
import numpy as np
import pytest
from helpers import free_port, run_bounded, run_processes, single_device_sharding, subprocess_env

from frozenconst import FrozenConst, FrozenConstTypeError, FrozenConstValueError

# Which sources are read slice by slice shows in memory only across processes: in one process
# the decision itself is checked.
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

    sharding = single_device_sharding(jax.devices()[0])
    x = FrozenConst.from_callback(data.shape, sharding, read, dtype=np.float32)
    assert indices == [(slice(None), slice(None))]
    returned[0][...] = -1  # changing what the callback returned changes nothing
    np.testing.assert_array_equal(np.asarray(x), data.astype(np.float32), strict=True)
    assert x.declared_sharding == sharding and jax.numpy.asarray(x).committed
    assert x.fingerprint == FrozenConst(data, np.float32).fingerprint
    assert not np.asarray(x).flags.writeable


def test_from_callback_names_the_index_and_what_it_received():
    sharding = single_device_sharding(jax.devices()[0])
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


@pytest.mark.parametrize(
    "data",
    [np.arange(6, dtype=np.int32), np.arange(6, dtype=np.uint8), np.ones(6, np.float16), np.ones(6, bool)],
)
def test_from_callback_without_dtype_keeps_the_slices_dtype_as_jax_does(data):
    sharding = single_device_sharding(jax.devices()[0])
    x = FrozenConst.from_callback(data.shape, sharding, lambda index: data[index], dtype=None)
    want = jax.make_array_from_callback(data.shape, sharding, lambda index: data[index])
    assert x.dtype == data.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(x), data, strict=True)
    assert jax.numpy.asarray(x).dtype == want.dtype


@pytest.mark.parametrize("shape", [(8.9, 4), (8, 4.0), 8.0, ("8", 4), (np.float64(8), 4)])
def test_from_callback_refuses_a_shape_that_is_not_ints_as_numpy_and_jax_do(shape):
    sharding = single_device_sharding(jax.devices()[0])
    with pytest.raises(TypeError):
        np.zeros(shape)
    with pytest.raises(TypeError):
        jax.make_array_from_callback(shape, sharding, lambda index: np.zeros((8, 4))[index])
    with pytest.raises(FrozenConstTypeError, match=r"needs `shape` as a tuple of ints, but received"):
        FrozenConst.from_callback(shape, sharding, lambda index: np.zeros((8, 4))[index], dtype=np.float32)


def test_from_callback_takes_any_integer_shape():
    sharding = single_device_sharding(jax.devices()[0])
    x = FrozenConst.from_callback((np.int64(2), 3), sharding, lambda index: np.ones((2, 3))[index])
    assert x.shape == (2, 3) and type(x.shape[0]) is int
    with pytest.raises(FrozenConstValueError, match="non-negative"):
        FrozenConst.from_callback((-1, 3), sharding, lambda index: np.ones((2, 3))[index])


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
def test_edges_across_two_processes(tmp_path):
    # A constant none of whose devices is in a process (from a callback and
    # from a memory map), `dtype` inferred from the slices, and a sharding
    # replicated across processes: the checks are in the worker (`edges`).
    for _attempt in range(3):
        codes, outputs = _processes(2, f"edges:{tmp_path / 'edges'}")
        if codes == [0, 0] or not any("Address already in use" in o for o in outputs):
            break
    assert codes == [0, 0], "\n----\n".join(o[-4000:] for o in outputs)
    assert "process 0 ok" in outputs[0] and "process 1 ok" in outputs[1]


@pytest.mark.subprocess
def test_the_documented_example_runs():
    free_port()  # the example's launcher binds one for jax.distributed's coordinator
    code, out = run_bounded(
        [sys.executable, str(EXAMPLE)], TIMEOUT_S, env=subprocess_env("cpu"), cwd=HERE.parent
    )  # processes of CPU devices
    assert code == 0, out[-6000:]
    assert "process 0 ok: holds 2097152 of 4194304 bytes" in out and "process 1 ok" in out
