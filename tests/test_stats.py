"""Accounting, fingerprints and interning."""

import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import live_copies, unique_data

import frozenconst
from frozenconst import FrozenConst


@pytest.mark.host_memory
def test_per_constant_stats_count_transfers_hits_and_bytes():
    data = unique_data((32, 32))
    x = FrozenConst(data)
    s0 = x.stats()
    assert (s0.transfers, s0.hits, s0.placements, s0.zero_copy, s0.host_bytes) == (0, 0, 0, None, data.nbytes)
    x.__jax_array__()  # the miss: one transfer
    for _ in range(5):
        x.__jax_array__()  # five hits
    s = x.stats()
    assert s.transfers == 1 and s.hits == 5 and s.placements == 1
    # jax.numpy may ask for the buffer more than once per call: at least one hit each.
    for _ in range(3):
        jnp.asarray(x)
    jax.jit(lambda v: v + 1)(x)
    s = x.stats()
    assert s.transfers == 1 and s.hits >= 5 + 4
    assert sum(s.device_bytes.values()) == data.nbytes
    assert live_copies(data) == 1  # JAX agrees: one device copy


def test_each_form_of_use_counts_one_hit():
    x = FrozenConst(unique_data((8, 8)))
    f = jax.jit(lambda v: v * 2)
    w = jnp.ones((8, 8), jnp.float32)
    uses = {
        "x.__jax_array__()": lambda: x.__jax_array__(),
        "a jit argument (one flatten)": lambda: f(x),
        "tree_leaves": lambda: jax.tree_util.tree_leaves(x),
        "an operator": lambda: x @ w,
        "a reflected operator": lambda: w @ x,
        "jnp.dot": lambda: jnp.dot(x, w),
    }
    for use in uses.values():
        use()  # the first transfer, and whatever a first call of each costs
    for name, use in uses.items():
        before = x.stats().hits
        use()
        assert x.stats().hits == before + 1, name
    assert x.stats().transfers == 1


def test_zero_copy_is_reported_from_buffer_pointers():
    x = FrozenConst(unique_data((16, 16)))
    a = jnp.asarray(x)
    aliased = a.unsafe_buffer_pointer() == np.asarray(x).ctypes.data
    assert x.stats().zero_copy is aliased
    y = FrozenConst(np.arange(16), dtype=np.float64)  # float64 kept on the host, float32 on device: a copy
    jnp.asarray(y)
    assert y.stats().zero_copy is False


@pytest.mark.host_memory
def test_global_stats_cover_live_constants_and_keep_counts_of_dead_ones(_host_memory):
    gc.collect()
    before = frozenconst.stats()
    x = FrozenConst(unique_data((64, 64)))
    y = FrozenConst(x)  # shares the buffer: one constant
    x.__jax_array__()
    y.__jax_array__()
    during = frozenconst.stats()
    assert during.live_constants == before.live_constants + 1
    # A page-locked copy, made at the first transfer, is host memory too.
    pinned = during.pinned_bytes - before.pinned_bytes
    assert pinned == (x.nbytes if _host_memory == "pinned" else 0)
    assert during.host_bytes == before.host_bytes + x.nbytes + pinned
    device = jax.devices()[0]
    assert during.device_bytes[device] == before.device_bytes.get(device, 0) + x.nbytes
    assert (during.transfers - before.transfers, during.hits - before.hits) == (1, 1)
    del x, y
    gc.collect()
    after = frozenconst.stats()
    assert after.live_constants == before.live_constants
    assert after.transfers == during.transfers and after.hits == during.hits
    assert isinstance(after.to_dict()["device_bytes"], dict)


@pytest.mark.host_memory
def test_accounting_can_be_switched_off():
    x = FrozenConst(unique_data((4,)))
    x.__jax_array__()
    frozenconst.set_accounting(False)
    try:
        jnp.asarray(x)
        x.__jax_array__()
        assert x.stats().hits == 0
    finally:
        frozenconst.set_accounting(True)
    x.__jax_array__()
    assert x.stats().hits == 1


def test_fingerprint_is_content_identity():
    data = unique_data((8, 8))
    a, b = FrozenConst(data), FrozenConst(data.copy())
    assert a.fingerprint == b.fingerprint and a.fingerprint.startswith("sha256:")
    assert a.fingerprint != FrozenConst(data, dtype=np.float64).fingerprint  # dtype counts
    # float64 data is held as float32 without x64 (as `jnp.asarray` holds it): the same content.
    assert a.fingerprint == FrozenConst(data.astype(np.float64)).fingerprint
    assert a.fingerprint != FrozenConst(data.reshape(4, 16)).fingerprint  # shape counts
    changed = data.copy()
    changed[3, 3] += 1
    assert a.fingerprint != FrozenConst(changed).fingerprint
    assert FrozenConst(data.T).fingerprint == FrozenConst(np.ascontiguousarray(data.T)).fingerprint


def test_intern_shares_one_host_and_one_device_buffer():
    data = unique_data((128, 16))
    a = frozenconst.intern(data)
    b = frozenconst.intern(data.copy())
    assert a is b
    assert frozenconst.intern(a) is a
    assert jnp.asarray(a) is jnp.asarray(b)
    assert live_copies(data) == 1
    assert frozenconst.intern(data, dtype=np.float64) is not a
    assert frozenconst.intern(data.astype(np.float64)) is a  # held as float32 without x64: the same


@pytest.mark.host_memory
def test_intern_holds_constants_weakly():
    data = unique_data((8, 8))
    fp = frozenconst.intern(data).fingerprint
    gc.collect()
    fresh = frozenconst.intern(data)
    assert fresh.fingerprint == fp
    ref_count_before = frozenconst.stats().live_constants
    del fresh
    gc.collect()
    assert frozenconst.stats().live_constants == ref_count_before - 1


def test_concurrent_interning_of_equal_and_different_contents():
    tables = [unique_data((64, 64), seed=s) for s in range(4)]
    results = [[] for _ in range(4)]
    barrier = threading.Barrier(16)

    def work(i):
        barrier.wait()
        results[i % 4].append(frozenconst.intern(tables[i % 4].copy()))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for group in results:
        assert len(group) == 4 and all(r is group[0] for r in group)
    assert len({id(g[0]) for g in results}) == 4


def test_stats_refuses_derived_values():
    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        grad = jax.grad(lambda c: jnp.sum(c))(FrozenConst(np.ones(3, np.float32)))
    with pytest.raises(frozenconst.FrozenConstTypeError, match="derived"):
        grad.stats()
