"""The device cache: one buffer per device, transferred once, concrete even when first used in a trace."""

import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import enable_x64, live_copies, requires_cpu, single_device_sharding, unique_data

import frozenconst
from frozenconst import FrozenConst, FrozenConstTypeError, FrozenConstWarning

# The dtypes are the package's list of what jax.numpy names; `follows_x64` is the table a cache
# hit reads instead of x64, checked against JAX.
from frozenconst._dtypes import SUPPORTED_DTYPES, aborts_on, follows_x64, supported


@pytest.mark.host_memory
def test_first_use_transfers_once_then_returns_the_same_array():
    data = unique_data()
    x = FrozenConst(data)
    assert live_copies(data) == 0
    a = jnp.asarray(x)
    assert live_copies(data) == 1
    assert jnp.asarray(x) is a
    assert x.__jax_array__() is a
    with jax.transfer_guard("disallow"):
        # A cache hit is no transfer at all, explicit or implicit.
        assert jnp.asarray(x) is a
        jnp.sum(x).block_until_ready()
        jax.jit(lambda v: v * 2)(x).block_until_ready()
    assert live_copies(data) == 1


@pytest.mark.host_memory
def test_mixed_eager_and_jitted_uses_leave_one_live_copy():
    data = unique_data()
    x = FrozenConst(data)
    w = jnp.ones((32, 8))
    for _ in range(3):
        (x @ w).block_until_ready()
        jnp.dot(x, w).block_until_ready()
        jax.jit(lambda v, w: v @ w)(x, w).block_until_ready()
        jax.jit(lambda w: sum(x @ w for _ in range(5)))(w).block_until_ready()
        jnp.tanh(x).block_until_ready()
    assert live_copies(data) == 1


@pytest.mark.parametrize(
    "first_use",
    [
        lambda x: jax.jit(lambda w: x @ w)(jnp.ones(32)),
        lambda x: jax.grad(lambda w: jnp.sum(x @ w))(jnp.ones(32)),
        lambda x: jax.vmap(lambda w: x @ w)(jnp.ones((2, 32))),
        lambda x: jax.eval_shape(lambda w: x @ w, jnp.ones(32)),
        lambda x: jax.lax.scan(lambda c, _: (c + jnp.sum(x), None), 0.0, None, length=3),
        lambda x: jax.make_jaxpr(lambda w: x @ w)(jnp.ones(32)),
    ],
    ids=["jit", "grad", "vmap", "eval_shape", "scan", "make_jaxpr"],
)
@pytest.mark.host_memory
def test_first_use_inside_a_trace_caches_a_concrete_buffer(first_use):
    data = unique_data()
    x = FrozenConst(data)
    first_use(x)
    cached = x.__jax_array__()
    assert not isinstance(cached, jax.core.Tracer)
    # The cached buffer is usable eagerly afterwards (a leaked tracer would raise).
    np.testing.assert_allclose(np.asarray(cached + 0), data)
    assert live_copies(data) == 1


@pytest.mark.host_memory
def test_default_device_is_followed():
    data = unique_data()
    x = FrozenConst(data)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        a = jnp.asarray(x)
    assert a.devices() == {cpu}
    with jax.default_device(cpu):
        assert jnp.asarray(x) is a  # cached per device
    # Outside the context: the default device's buffer (the same one where that is the CPU,
    # another where an accelerator is the default).
    default = jax.devices()[0]
    outside = jnp.asarray(x)
    assert outside.devices() == {default}
    assert (outside is a) == (default == cpu)


def test_x64_flip_never_returns_the_wrong_dtype():
    x = FrozenConst(np.arange(4), dtype=np.float64)  # float64 on the host, whatever x64 says
    assert jnp.asarray(x).dtype == jnp.float32
    with enable_x64(True):
        assert jnp.asarray(x).dtype == jnp.float64
        assert (x + 1).dtype == jnp.float64
    assert jnp.asarray(x).dtype == jnp.float32
    # float32 data has one device dtype either way: one buffer.
    y = FrozenConst(np.arange(4, dtype=np.float32))
    a = jnp.asarray(y)
    with enable_x64(True):
        assert jnp.asarray(y) is a


# Every dtype this JAX holds: x64 keys the cache exactly where it changes the dtype.
_HELD = sorted((d for d in SUPPORTED_DTYPES if supported(d)), key=lambda d: d.name)


@pytest.mark.parametrize("dtype", _HELD, ids=str)
def test_each_use_gets_the_dtype_jax_gives_under_each_x64_setting(dtype):
    # `dtype=` keeps a 64-bit host dtype whatever x64 says at construction (without it the
    # host holds what `jnp.asarray` holds then: test_host.py), so x64 decides each use's.
    data = np.zeros(3, dtype)
    x = FrozenConst(data, dtype=dtype)
    given = {}
    for x64 in (False, True, False):
        with enable_x64(x64):
            given[x64] = jnp.asarray(data).dtype  # JAX's own answer for the same data
            if aborts_on(jax.default_backend(), given[x64]):  # complex128 under x64 on a TPU
                with pytest.raises(FrozenConstTypeError, match=f"cannot move {given[x64]} data"):
                    jax.tree_util.tree_leaves(x)
                continue
            (leaf,) = jax.tree_util.tree_leaves(x)  # what a jit argument gets
            assert jnp.asarray(x).dtype == leaf.dtype == given[x64]
    # The table that lets a hit skip reading x64 agrees with JAX.
    assert follows_x64(np.dtype(dtype)) == (given[False] != given[True])


def test_a_buffer_deleted_behind_our_back_is_refilled_for_every_form_of_use():
    data = unique_data()
    x = FrozenConst(data)
    f = jax.jit(lambda v: v * 1)
    uses = {
        "jnp.asarray": lambda: jnp.asarray(x),
        "a jit argument": lambda: f(x),
        "an operator": lambda: x + 0,
        "tree_leaves": lambda: jax.tree_util.tree_leaves(x)[0],
    }
    for name, use in uses.items():
        jnp.asarray(x).delete()
        with pytest.warns(FrozenConstWarning, match="was deleted"):
            out = use()
        np.testing.assert_array_equal(np.asarray(out), data, err_msg=name)
    assert live_copies(data) == 1


@pytest.mark.host_memory
def test_sixteen_threads_cause_one_transfer():
    data = unique_data((256, 256))
    x = FrozenConst(data)
    barrier = threading.Barrier(16)
    results = [None] * 16

    def use(i):
        barrier.wait()
        results[i] = jnp.asarray(x)

    threads = [threading.Thread(target=use, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is results[0] for r in results)
    assert live_copies(data) == 1


@pytest.mark.host_memory
def test_evict_drops_buffers_and_next_use_transfers_again():
    data = unique_data()
    x = FrozenConst(data)
    a = jnp.asarray(x)
    x.evict()
    del a
    assert live_copies(data) == 0
    b = jnp.asarray(x)
    assert live_copies(data) == 1
    np.testing.assert_array_equal(np.asarray(b), data)


@pytest.mark.host_memory
def test_deleted_or_donated_buffer_is_transferred_again():
    data = unique_data()
    x = FrozenConst(data)
    jnp.asarray(x).delete()
    with pytest.warns(frozenconst.FrozenConstWarning, match="was deleted"):
        np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data)
    donating = jax.jit(lambda v: v * 2, donate_argnums=0)
    donating(x).block_until_ready()  # a jitted call keeps the constant's buffer out of the donation
    assert not jnp.asarray(x).is_deleted()
    ahead = jax.jit(lambda v: v * 3, donate_argnums=0).lower(x).compile()
    ahead(x).block_until_ready()  # compiled ahead of time: donated, deleted
    with pytest.warns(frozenconst.FrozenConstWarning, match="was deleted"):
        np.testing.assert_array_equal(np.asarray(x + 0), data)
    np.testing.assert_array_equal(np.asarray(x), data)  # the host buffer is untouched by donation
    assert live_copies(data) == 1


def test_delete_is_not_offered():
    x = FrozenConst(np.ones(2))
    with pytest.raises(AttributeError, match="evict"):
        x.delete()


@pytest.mark.host_memory
def test_garbage_collection_frees_device_buffers():
    data = unique_data()
    x = FrozenConst(data)

    def use(c):
        jax.jit(lambda w: c @ w)(jnp.ones(32)).block_until_ready()

    use(x)
    assert live_copies(data) >= 1
    del x
    gc.collect()
    jax.clear_caches()  # executables may hold the constant they embedded
    gc.collect()
    assert live_copies(data) == 0


def test_cpu_device_buffer_aliases_the_frozen_host_buffer():
    # JAX's CPU backend aliases 64-byte aligned host buffers (jax #37830); the
    # frozen buffer is aligned and immutable, so the device copy is free.
    requires_cpu("aliasing")
    x = FrozenConst(unique_data())
    a = jnp.asarray(x)
    assert a.unsafe_buffer_pointer() == np.asarray(x).ctypes.data


@pytest.mark.host_memory
def test_evicting_the_default_devices_placement_drops_the_default_buffer_too():
    # `evict(sharding)` with a single-device sharding drops the default buffer on that
    # device as well: every use made after it transfers again, and nothing of ours keeps
    # the old buffer alive (the default placement's hit reads one slot, `Store.hot`).
    data = unique_data()
    x = FrozenConst(data)
    device = jax.devices()[0]
    old = jnp.asarray(x)
    x.on(device)  # committing the default buffer: the same device memory
    before = x.stats().transfers
    x.evict(single_device_sharding(device))
    assert x.placements == ()
    del old
    assert live_copies(data) == 0
    new = jnp.asarray(x)
    assert x.stats().transfers == before + 1 and live_copies(data) == 1
    np.testing.assert_array_equal(np.asarray(new), data)


def test_buffers_made_again_and_again_keep_no_entry_for_the_old_ones():
    # The table from a device buffer to its constant holds no entry for a buffer the constant
    # no longer has: none per eviction or deletion, so a loop that donates the constant each
    # step grows nothing. Observed as the weak references to the constant's store.
    x = FrozenConst(unique_data((4, 4)))
    device = jax.devices()[0]
    counts = []
    for _ in range(5):
        jnp.asarray(x).block_until_ready()
        x.on(device)
        counts.append(weakref.getweakrefcount(x._store))
        x.evict()
    for _ in range(5):
        with pytest.warns(frozenconst.FrozenConstWarning, match="was deleted"):
            jnp.asarray(x).delete()
            jnp.asarray(x).block_until_ready()  # made again
        counts.append(weakref.getweakrefcount(x._store))
    assert len(set(counts[:5])) == 1 and len(set(counts[5:])) == 1, counts  # (two placements, then one)


# The hit of the default placement is read inline by `__jax_array__` and `tree_flatten` (a call
# there is a measurable part of a hit); `Store.array` is the one rule they copy. This test reaches
# inside (`_held`, `_declared`) to ask that rule itself, in every state a handle can be in.
def _answers(x):
    inline = x.__jax_array__()
    (flattened,) = jax.tree_util.tree_leaves(x)
    rule = x._held().array(x._declared())
    return inline, flattened, rule


def _agree(x):
    inline, flattened, rule = _answers(x)
    assert inline is flattened is rule, (inline, flattened, rule)
    return inline


def test_the_inline_hits_answer_what_the_one_rule_answers():
    data = unique_data((8, 8))
    x = FrozenConst(data)
    first = _agree(x)  # the first use: nothing served yet, then the default buffer
    assert _agree(x) is first  # a hit of the default placement
    with jax.default_device(jax.devices()[-1]):  # a default device in force: not the slot
        _agree(x)
    first.delete()  # deleted behind frozenconst's back: a new buffer, the same for all three
    with pytest.warns(FrozenConstWarning, match="was deleted"):
        renewed = _agree(x)
    assert renewed is not first and not renewed.is_deleted()
    placed = FrozenConst(data + 1, sharding=single_device_sharding(jax.devices()[0]))
    _agree(placed)  # a declared sharding
    with pytest.warns(FrozenConstWarning, match="put a copy of FrozenConst values"):
        copy = jax.tree.map(lambda a: a + 1, x)  # a copy: its own new array
    assert _agree(copy) is not renewed
    seen = []

    def traced(t):
        seen.append(_answers(t))  # a derived value inside a trace: its tracer, for all three
        return jnp.sum(t)

    jax.jit(traced)(x)
    (answers,) = seen
    assert answers[0] is answers[1] is answers[2]


def test_the_constants_on_one_device_share_one_sharding_object():
    # A jitted call checks each parameter's sharding, dearer between distinct objects than with
    # one (`_compat.shared_sharding`; 1.15x per call with 1,000 parameters). Every dtype, a weakly
    # typed scalar, a larger table, on each device: one object per device, and each buffer still
    # uncommitted, as `jnp.asarray(np_array)` is.
    for device in jax.local_devices()[:2]:
        with jax.default_device(device):
            consts = [FrozenConst(np.zeros(3, d)) for d in _HELD if not aborts_on(jax.default_backend(), d)]
            consts += [FrozenConst(0.5), FrozenConst(unique_data())]
            buffers = [jnp.asarray(c) for c in consts]
        assert len({id(b.sharding) for b in buffers}) == 1
        assert buffers[0].sharding.device_set == {device}
        for c, b in zip(consts, buffers, strict=True):
            assert not b.committed
            assert jax.tree_util.tree_leaves(c)[0] is c.__jax_array__() is b  # what a jit argument gets
            np.testing.assert_array_equal(np.asarray(b), np.asarray(c))
        assert buffers[-2].weak_type
