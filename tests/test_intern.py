"""`intern` keeps weak types apart and finds constants however made."""

import gc
import pickle
import sys
import threading
import weakref

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
from helpers import enable_x64, live_copies, unique_data
from hypothesis import given, settings

import frozenconst

# That a dead twin leaves no store behind shows only in the table of live stores.
from frozenconst import FrozenConst, _cache

_SCALARS = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False, width=32),
    st.integers(-100, 100),
    st.complex_numbers(max_magnitude=1e3, allow_nan=False, allow_infinity=False, width=64),
)
_OPERANDS = st.sampled_from(
    [jnp.bfloat16, jnp.float16, jnp.float32, jnp.int8, jnp.uint8, jnp.int16, jnp.complex64]
)


@settings(max_examples=60, deadline=None)
@given(value=_SCALARS, dtype=_OPERANDS, op=st.sampled_from(["mul", "add", "sub"]))
def test_an_interned_python_scalar_promotes_as_jnp_asarray_does(value, dtype, op):
    operand = jnp.asarray(np.arange(1, 4).astype(dtype))
    expected = getattr(jnp.asarray(value), f"__{op}__")(operand)
    got = getattr(frozenconst.intern(value), f"__{op}__")(operand)
    assert jnp.asarray(frozenconst.intern(value)).weak_type
    assert got.dtype == expected.dtype, (value, dtype)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_a_weak_and_a_strong_constant_of_the_same_bytes_are_two_constants():
    weak, strong = frozenconst.intern(0.5), frozenconst.intern(np.float32(0.5))
    assert weak is not strong and weak.fingerprint == strong.fingerprint
    assert (jnp.asarray(weak).weak_type, jnp.asarray(strong).weak_type) == (True, False)
    assert frozenconst.intern(0.5) is weak and frozenconst.intern(np.float32(0.5)) is strong
    bf16 = jnp.ones(3, jnp.bfloat16)
    assert ((weak * bf16).dtype, (strong * bf16).dtype) == (jnp.bfloat16, jnp.float32)
    # A weak Python int: int8 wraps as `jnp.asarray(100) + int8` does.
    int8 = jnp.array([100, 1], jnp.int8)
    np.testing.assert_array_equal(frozenconst.intern(100) + int8, jnp.asarray(100) + int8)
    assert (frozenconst.intern(100) + int8).dtype == jnp.int8
    # And interning a weak FrozenConst finds the weak one.
    assert frozenconst.intern(FrozenConst(0.5)) is weak


def _pointer(x):
    return jnp.asarray(x).unsafe_buffer_pointer()


def test_intern_finds_a_constant_made_without_it():
    data = unique_data((64, 32))
    made = FrozenConst(data)
    found = frozenconst.intern(data.copy())
    # A handle on `made`'s host and device buffers: one of each, observed through JAX and NumPy.
    assert np.shares_memory(np.asarray(found), np.asarray(made))
    assert _pointer(found) == _pointer(made) and jnp.asarray(found) is jnp.asarray(made)
    assert live_copies(data) == 1
    assert frozenconst.intern(data) is found  # later calls return the handle the table holds
    # Other content, dtype or shape is another constant.
    assert frozenconst.intern(data, dtype=np.float16) is not found
    assert not np.shares_memory(np.asarray(frozenconst.intern(data.reshape(32, 64))), np.asarray(made))


def test_a_twin_that_died_is_not_found():
    data = unique_data((16, 16))
    made = FrozenConst(data)
    del made
    gc.collect()
    fresh = frozenconst.intern(data)
    np.testing.assert_array_equal(np.asarray(fresh), data)
    holding = [
        s for s in list(_cache.STATE.live) if s.shape == data.shape and s.fingerprint == fresh.fingerprint
    ]
    assert len(holding) == 1  # the new constant's store only


def test_unpickling_a_live_constant_gives_its_buffers_back():
    data = unique_data((32, 8))
    table = FrozenConst(data)
    device = _pointer(table)
    back = pickle.loads(pickle.dumps(table))
    assert np.shares_memory(np.asarray(back), np.asarray(table)) and _pointer(back) == device
    weak = FrozenConst(2.5)
    again = pickle.loads(pickle.dumps(weak))
    assert np.shares_memory(np.asarray(again), np.asarray(weak)) and jnp.asarray(again).weak_type
    # A placed constant keeps the pickled placement, over the live constant's host buffer.
    device0 = jax.devices()[0]
    placed = table.placed(device0)
    back = pickle.loads(pickle.dumps(placed))
    assert np.shares_memory(np.asarray(back), np.asarray(table))
    assert back.sharding == placed.sharding and jnp.asarray(back).committed


def test_unpickling_with_no_twin_live_makes_a_new_constant():
    data = unique_data((8, 8))
    blob = pickle.dumps(FrozenConst(data))
    gc.collect()
    back = pickle.loads(blob)
    np.testing.assert_array_equal(np.asarray(back), data)
    assert not np.asarray(back).flags.writeable


# Finding a live twin is one lookup: the table of live constants digests each constant at most
# once, only where one of its shape and dtype is looked up, and forgets each as it dies. The
# digests are counted where the table takes them (`_cache.fingerprint`), and the table's
# contents are read from the table.


def _count_digests(monkeypatch):
    digested = []
    real = _cache.fingerprint
    monkeypatch.setattr(_cache, "fingerprint", lambda a: digested.append(a.shape) or real(a))
    return digested


def test_a_lookup_digests_each_constant_once_and_only_those_of_its_shape_and_dtype(monkeypatch):
    digested = _count_digests(monkeypatch)
    shape = (5, 3, 7)  # no other test's
    alive = [FrozenConst(np.full(shape, i, np.float32)) for i in range(1000)]
    others = [FrozenConst(np.full((7, 3, 5), i, np.float32)) for i in range(100)]
    assert digested == []  # a plain construction digests nothing
    frozenconst.intern(np.full(shape, -1, np.float32))
    assert digested == [shape] * 1001  # the 1,000 of its shape and itself, once each
    digested.clear()
    for i in range(50):
        frozenconst.intern(np.full(shape, -2 - i, np.float32))
        pickle.loads(pickle.dumps(alive[i]))  # found: a handle on `alive[i]`
    assert digested == [shape] * 100  # each call its own content, once: no scan
    found = pickle.loads(pickle.dumps(alive[999]))
    assert np.shares_memory(np.asarray(found), np.asarray(alive[999]))
    assert (7, 3, 5) not in digested and len(others) == 100


def test_a_hundred_thousand_interns_then_drops_leave_the_table_empty():
    live, interned = _cache.STATE.live, frozenconst._intern.INTERNED.table
    gc.collect()
    before = (len(live.fresh) + len(live.filed), len(live.buckets), len(interned))
    witnesses = []
    for batch in range(100):
        kept = [frozenconst.intern(np.full(3, batch * 1000 + i, np.float32)) for i in range(1000)]
        witnesses.append(weakref.ref(kept[batch]._held()))  # one store of each batch
        assert len(interned) >= before[2] + 1000  # all held while kept
        del kept
    gc.collect()
    assert [w for w in witnesses if w() is not None] == []
    assert (len(live.fresh) + len(live.filed), len(live.buckets), len(interned)) == before
    # The table's own memory follows what it held at once (the constants alive before, and a
    # batch), not the 100,000 it saw.
    bound = sys.getsizeof(dict.fromkeys(range(4 * (before[0] + 1000))))
    assert max(sys.getsizeof(t) for t in (live.fresh, live.filed, live.buckets)) <= bound, bound


def test_threads_unpickling_one_content_share_one_constant():
    data = unique_data((16, 16))
    blob = pickle.dumps(FrozenConst(data))
    gc.collect()
    barrier = threading.Barrier(8)
    results = [None] * 8

    def load(i):
        barrier.wait()
        results[i] = pickle.loads(blob)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = np.asarray(results[0])
    assert all(np.shares_memory(np.asarray(r), first) for r in results)
    assert live_copies(data) <= 1


def test_a_constant_interned_in_another_dtype_is_converted_from_its_host_data():
    # As `FrozenConst(x, dtype)` converts: from the host copy, never through the device buffer,
    # which holds float64 as float32 and refuses int64 beyond int32 while x64 is off.
    with enable_x64(True):
        wide = FrozenConst(np.array([1, 2**40]))
    close = 1 + 2.0**-11 + 2.0**-30  # float16 rounds it up from float64, down from float32
    fine = FrozenConst(np.array([close]), dtype=np.float64)
    with enable_x64(False):
        for x, dtype in ((wide, np.float32), (fine, np.float16)):
            interned = frozenconst.intern(x, dtype=dtype)
            assert interned.host_dtype == dtype
            np.testing.assert_array_equal(np.asarray(interned), np.asarray(FrozenConst(x, dtype=dtype)))
        assert np.asarray(frozenconst.intern(fine, dtype=np.float16))[0] == np.float16(close) != 1
