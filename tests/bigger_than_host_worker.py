"""One process of a multi-process run of constants bigger than one host (test_bigger_than_host.py).

    python bigger_than_host_worker.py PORT PROCESS_ID NUM_PROCESSES NPY_PATH

Each process has 2 CPU devices and joins the others over jax.distributed (gloo)
on 127.0.0.1. NPY_PATH is a float32 .npy written by the test, the same for all.
The process prints `RSS <growth> <share>` and `process <id> ok`; any failed
check exits non-zero. With NPY_PATH `edges:<path>` it runs the edge cases
instead (`edges`): a constant none of whose devices is in this process, and
one replicated across processes.
"""

import gc
import pickle
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import single_device_sharding  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import frozenconst  # noqa: E402
from frozenconst import (  # noqa: E402
    FrozenConst,
    FrozenConstTypeError,
    FrozenConstValueError,
    NotAddressableError,
)


def rss_anon() -> int:
    """This process's anonymous resident memory, in bytes (file-backed pages of the map excluded)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def frozen_buffers(x):
    return x._store.host_buffers()  # the frozen slices, to compare with JAX's device pointers


def assert_read_only_all_the_way_down(array):
    base = array
    while base is not None:
        if isinstance(base, np.ndarray):
            assert not base.flags.writeable
            with pytest.raises(ValueError):
                base.flags.writeable = True
        nxt = getattr(base, "base", None)
        base = getattr(base, "obj", None) if nxt is None else nxt


def buffers_holding(data):
    """(device, pointer) of every live device buffer that holds a slice of `data` at its index."""
    gc.collect()
    found = set()
    for arr in jax.live_arrays():
        if arr.shape != data.shape or arr.dtype != data.dtype:
            continue
        for shard in arr.addressable_shards:
            if np.array_equal(np.asarray(shard.data), data[shard.index]):
                found.add((shard.device, shard.data.unsafe_buffer_pointer()))
    return found


def gather(array):
    """The whole value of a global array, on every process (a collective)."""
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def same_everywhere(text):
    """Whether every process computed the same string (one all-gather of its bytes)."""
    mine = np.frombuffer(text.encode().ljust(128), np.uint8)
    every = np.asarray(multihost_utils.process_allgather(mine))
    return all((row == every[0]).all() for row in every)


def main(port, process_id, num_processes, path):
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=120,
    )
    try:
        if path.startswith("edges:"):
            edges(path.removeprefix("edges:"))
        else:
            run(num_processes, path)
        print(f"process {process_id} ok", flush=True)
    finally:
        jax.distributed.shutdown()


def run(num_processes, path):
    local = jax.local_device_count()
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    rows = NamedSharding(mesh, P("x"))

    # Warm up every code path on a small constant, so the measurement below
    # sees the big constant's memory, not JAX's first-use allocations.
    small = f"{path}.{jax.process_index()}.npy"
    np.save(small, np.ones((64, 8), np.float32))
    warm = FrozenConst(np.load(small, mmap_mode="r"), sharding=rows)
    jnp.asarray(warm).block_until_ready()
    del warm
    gc.collect()

    # -- memory: this process freezes only its share ------------------------
    before = rss_anon()
    x = FrozenConst(np.load(path, mmap_mode="r"), sharding=rows)
    arr = jnp.asarray(x)  # the first transfer
    arr.block_until_ready()
    growth = rss_anon() - before
    data = np.load(path, mmap_mode="r")  # for the checks: read through the map, never copied whole
    share = x.stats().host_bytes
    assert share * num_processes == data.nbytes, (share, data.nbytes)
    print(f"RSS {growth} {share} {data.nbytes}", flush=True)
    assert growth <= 1.1 * share, f"anonymous RSS grew {growth} bytes for a share of {share}"
    assert growth >= 0.9 * share, (
        f"anonymous RSS grew {growth} bytes: the measurement missed the share {share}"
    )

    # -- one buffer per device, each an alias of its frozen slice -------------
    assert arr.sharding == rows and not arr.is_fully_addressable
    assert jnp.asarray(x) is arr and x.on(rows) is arr
    assert x.stats().transfers == local
    slices = {b.ctypes.data: b for b in frozen_buffers(x)}
    assert len(slices) == local
    for b in slices.values():
        assert_read_only_all_the_way_down(b)
    for shard in arr.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index], strict=True)
        assert shard.data.unsafe_buffer_pointer() in slices
    held = buffers_holding(data)
    assert len(held) == local and {p for _, p in held} == set(slices), held
    s = x.stats()
    assert (
        s.zero_copy is True and sorted(s.device_bytes.values()) == [data.nbytes // jax.device_count()] * local
    )
    assert frozenconst.stats().aliased_bytes >= share

    # -- jit: plain jax.jit and frozenconst.jit, results exact against the whole data
    whole = FrozenConst(np.array(data), sharding=rows)  # the same data, frozen whole on this host
    w = jax.make_array_from_callback(
        (data.shape[1], 4),
        NamedSharding(mesh, P()),
        lambda i: np.linspace(-1, 1, data.shape[1] * 4, dtype=np.float32).reshape(-1, 4)[i],
    )
    f = jax.jit(lambda a, w: jnp.sum(a @ w, axis=0))
    g = frozenconst.jit(lambda w: jnp.sum(x @ w, axis=0))
    g_whole = frozenconst.jit(lambda w: jnp.sum(whole @ w, axis=0))
    transfers = frozenconst.stats().transfers
    got = [gather(f(x, w)), gather(g(w))]
    want = [gather(f(whole, w)), gather(g_whole(w))]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b, strict=True)
    twice = jax.jit(lambda a: a * 2)
    doubled = twice(x)
    for shard in doubled.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index] * 2, strict=True)
    # Fed as it is: nothing crosses processes for an elementwise program, and
    # no constant was transferred again.
    hlo = twice.lower(x).compile().as_text()
    assert not any(op in hlo for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce")), hlo
    assert frozenconst.stats().transfers - transfers == local  # `whole`'s own first transfer only

    # -- a constant the function also returns: a parameter, as any use, never closed over
    returned_tree, total = frozenconst.jit(lambda w: ({"t": x}, jnp.sum(x @ w, axis=0)))(w)
    np.testing.assert_array_equal(gather(total), want[1], strict=True)
    assert type(returned_tree["t"]) is FrozenConst
    for shard in jnp.asarray(returned_tree["t"]).addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index], strict=True)

    # -- placements that need slices this process does not hold ---------------
    for other in (NamedSharding(mesh, P(None, "x")), NamedSharding(mesh, P())):
        with pytest.raises(NotAddressableError, match=r"needs slices this process does not hold: \["):
            x.on(other)
        with pytest.raises(NotAddressableError, match="out_shardings"):
            x.placed(other)
    # The collective the message names reshards it.
    columns = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P(None, "x")))(x.on(x.declared_sharding))
    for shard in columns.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index], strict=True)

    # -- whole-array host access: refused, naming the collective; the collective works
    for attempt in (lambda: np.asarray(x), lambda: x.fingerprint, lambda: pickle.dumps(x)):
        with pytest.raises(NotAddressableError, match="process_allgather"):
            attempt()
    with pytest.raises(NotAddressableError, match=r"FrozenConst\(x, dtype="):
        FrozenConst(x, dtype=np.float16)
    gathered = np.asarray(multihost_utils.process_allgather(x.on(x.declared_sharding), tiled=True))
    np.testing.assert_array_equal(gathered, data, strict=True)
    fingerprint = FrozenConst(gathered).fingerprint
    assert fingerprint == whole.fingerprint and same_everywhere(fingerprint)
    del gathered
    assert "holds [" in repr(x)

    # -- audit: this process's bytes ------------------------------------------
    report = frozenconst.audit(lambda v: x @ v, jnp.ones((data.shape[1],), jnp.float32))
    (captured,) = report.constants
    assert captured.kind == "frozenconst" and captured.shape == data.shape and captured.nbytes == share

    # -- a slice replicated over this process's two devices: frozen once ----
    grid = Mesh(np.array(jax.devices()).reshape(num_processes, local), ("p", "d"))
    per_process = NamedSharding(grid, P("p"))
    y = FrozenConst(np.load(path, mmap_mode="r"), sharding=per_process)
    (frozen,) = frozen_buffers(y)
    yarr = jnp.asarray(y)
    assert y.stats().host_bytes == share
    assert {s.data.unsafe_buffer_pointer() for s in yarr.addressable_shards} == {frozen.ctypes.data}
    # A finer sharding inside what is held: served from views, no collective.
    finer = y.on(NamedSharding(grid, P(("p", "d"))))
    for shard in finer.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index], strict=True)

    # -- from_callback, and a copy that the callback's arrays cannot change ---
    returned = []

    def read(index):
        returned.append(np.array(data[index]))
        return returned[-1]

    z = FrozenConst.from_callback(data.shape, rows, read, dtype=np.float32)
    assert len(returned) == local
    for r in returned:
        r[...] = -1  # the caller's arrays, changed after construction
    for shard in jnp.asarray(z).addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index], strict=True)
    with pytest.raises(FrozenConstValueError, match=r"returned an array of shape \(.*\) for index \["):
        FrozenConst.from_callback(data.shape, rows, lambda index: data, dtype=np.float32)


def edges(path):
    """A constant none of whose devices is here, and one every process holds whole."""
    data = np.arange(32, dtype=np.int32).reshape(8, 4)
    small = f"{path}.{jax.process_index()}.npy"
    np.save(small, data)
    called = []

    def read(index):
        called.append(index)
        return data[index]

    # -- on a device of another process: as `jax.device_put` to that device ----
    remote = next(d for d in jax.devices() if d.process_index != jax.process_index())
    elsewhere = single_device_sharding(remote)
    try:
        want = jax.device_put(data, elsewhere)
        assert not want.addressable_shards and want.dtype == np.int32  # what JAX gives
    except RuntimeError:  # jax 0.6.2: "Cannot copy array to non-addressable device"
        want = None
    for x in (
        FrozenConst.from_callback(data.shape, elsewhere, read, dtype=np.int32),
        FrozenConst(np.load(small, mmap_mode="r"), sharding=elsewhere),
    ):
        assert not called, called
        assert x.stats().host_bytes == 0, (x.stats(), jax.process_index(), remote, x._store)
        if want is None:
            # jax 0.6.2 builds no array without addressable shards unless told
            # to, and says how: its error comes through as it is.
            with pytest.raises(ValueError, match="enable_empty_arrays"):
                jnp.asarray(x)
        else:
            got = jnp.asarray(x)
            assert (got.shape, got.dtype, got.sharding) == (want.shape, want.dtype, want.sharding)
            assert (got.shape, got.dtype, got.sharding) == (data.shape, data.dtype, elsewhere)
            assert not got.addressable_shards and not got.is_fully_addressable
            assert x.on(elsewhere) is got
        assert "holds no slice (none of its devices is in this process), 0 B" in repr(x), repr(x)
        with pytest.raises(NotAddressableError, match=r"holds only .*: no slice"):
            np.asarray(x)
    # Without `dtype=` there is no slice to take it from (JAX needs it too).
    with pytest.raises(ValueError, match=r"dtype|enable_empty_arrays"):  # the latter: jax 0.6.2
        jax.make_array_from_callback(data.shape, elsewhere, read)
    with pytest.raises(FrozenConstValueError, match="needs `dtype=` here: none of the devices"):
        FrozenConst.from_callback(data.shape, elsewhere, read)

    # -- without `dtype=`: the slices' dtype, as JAX keeps it ------------------
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    rows = NamedSharding(mesh, P("x"))
    y = FrozenConst.from_callback(data.shape, rows, lambda index: data[index])
    reference = jax.make_array_from_callback(data.shape, rows, lambda index: data[index])
    assert y.dtype == reference.dtype == np.int32, (y.dtype, reference.dtype)
    for shard in jnp.asarray(y).addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index], strict=True)
    first = []

    def mixed(index):  # this process's first slice int32, its second float32
        first.append(index)
        return data[index].astype(np.int32 if len(first) == 1 else np.float32)

    with pytest.raises(ValueError, match="dtype"):  # JAX refuses them too
        jax.make_array_from_callback(data.shape, rows, mixed)
    first.clear()
    with pytest.raises(FrozenConstTypeError, match="without `dtype=`, every slice must have the dtype"):
        FrozenConst.from_callback(data.shape, rows, mixed)

    # -- replicated across processes: each process holds it whole -------------
    everywhere = NamedSharding(mesh, P())
    for z in (
        FrozenConst.from_callback(data.shape, everywhere, lambda index: data[index]),
        FrozenConst(np.load(small, mmap_mode="r"), sharding=everywhere),
    ):
        np.testing.assert_array_equal(np.asarray(z), data, strict=True)
        assert z.fingerprint == FrozenConst(data).fingerprint
        np.testing.assert_array_equal(np.asarray(FrozenConst(z, dtype=np.float32)), data.astype(np.float32))
        np.testing.assert_array_equal(np.asarray(pickle.loads(pickle.dumps(z))), data, strict=True)
        total = jax.jit(jnp.sum)(z)  # a computation every process runs
        assert int(total.addressable_shards[0].data) == int(data.sum())
        assert "holds [:, :]" in repr(z), repr(z)

    # -- host_memory="pinned": the slices of a partial constant stay pageable, said once
    frozenconst._frames.DEGRADED.forget()  # said once under these filters: forget earlier ones
    with pytest.warns(frozenconst.FrozenConstWarning, match="spans several processes") as record:
        pinned = (
            FrozenConst(np.load(small, mmap_mode="r"), sharding=rows, host_memory="pinned"),
            FrozenConst.from_callback(data.shape, rows, lambda index: data[index], host_memory="pinned"),
        )
    assert sum(issubclass(r.category, frozenconst.FrozenConstWarning) for r in record) == 1
    for p in pinned:
        assert p.host_memory == p.stats().host_memory == "pageable"
        assert p.stats().host_bytes == data.nbytes // jax.process_count()
        for shard in jnp.asarray(p).addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index], strict=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
