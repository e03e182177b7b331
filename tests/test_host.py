"""Construction: one copy into a host buffer that nothing can write to again."""

import copy
import gc
import pickle
import warnings
import weakref

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import enable_x64
from hypothesis import given, settings
from hypothesis import strategies as st

import frozenconst
from frozenconst import FrozenConst, FrozenConstTypeError, FrozenConstValueError, TracedValueError


def _public_numpy_views(x: FrozenConst) -> list[np.ndarray]:
    """Every public path that hands out host memory."""
    return [
        np.asarray(x),
        np.array(x, copy=False),
        np.array(x, copy=None),
        x.__array__(),
        x.__array__(copy=False),
        x.__array__(dtype=x.dtype, copy=None),
        np.from_dlpack(x, device="cpu"),  # the host buffer, wherever the device buffer lives
    ]


def _reachable_bases(arr: np.ndarray):
    base = arr
    while base is not None:
        yield base
        nxt = getattr(base, "base", None)
        base = getattr(base, "obj", None) if nxt is None else nxt


@pytest.mark.host_memory
@pytest.mark.parametrize("make_source", [np.arange(12.0).reshape, lambda s: np.arange(12.0)[::-1].reshape(s)])
def test_source_mutation_never_reaches_the_constant(make_source):
    src = make_source((3, 4))
    x = FrozenConst(src)
    snapshot = src.copy()
    device = jnp.asarray(x)
    src[...] = -1
    np.testing.assert_array_equal(np.asarray(x), snapshot)
    np.testing.assert_array_equal(np.asarray(device), snapshot.astype(device.dtype))


@pytest.mark.host_memory
def test_no_public_path_returns_writable_memory():
    x = FrozenConst(np.arange(100, dtype=np.float32))
    for view in _public_numpy_views(x):
        assert not view.flags.writeable
        for base in _reachable_bases(view):
            if isinstance(base, np.ndarray):
                with pytest.raises(ValueError, match="WRITEABLE"):
                    base.flags.writeable = True
            elif isinstance(base, memoryview):
                assert base.readonly  # page-locked: NumPy's read-only view of an immutable jax.Array
            else:
                # The owner is immutable: bytes, a DLPack capsule (opaque to Python), or the
                # page-locked jax.Array (`host_memory="pinned"`).
                assert isinstance(base, (bytes, jax.Array)) or type(base).__name__ == "PyCapsule", type(base)
    with pytest.raises(FrozenConstTypeError, match="immutable"):
        x[0] = 1.0


def test_views_are_independent_objects():
    x = FrozenConst(np.arange(6))
    v = np.asarray(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # deprecated in NumPy 2.5, still possible
        v.shape = (2, 3)  # in-place reshape of the caller's own view
    assert np.asarray(x).shape == (6,)
    assert np.shares_memory(v, np.asarray(x))


def test_host_buffer_is_64_byte_aligned():
    for n in [1, 3, 17, 1000, 123457]:
        x = FrozenConst(np.ones(n, np.int8))
        assert np.asarray(x).ctypes.data % 64 == 0


@pytest.mark.host_memory
def test_copy_true_gives_fresh_writable_copy():
    x = FrozenConst(np.arange(4.0))
    c = np.array(x, copy=True)
    assert c.flags.writeable and c.flags.owndata
    c[0] = 99
    assert np.asarray(x)[0] == 0
    d = x.__array__(dtype=np.float32, copy=True)
    assert d.dtype == np.float32 and d.flags.writeable


def test_dtype_conversion_semantics():
    x = FrozenConst(np.arange(4.0))
    converted = np.asarray(x, dtype=np.int32)
    assert converted.dtype == np.int32
    np.testing.assert_array_equal(converted, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="copy"):
        np.array(x, dtype=np.int32, copy=False)


@pytest.mark.parametrize(
    "obj",
    [
        np.float32(3.5),
        7,
        2.5,
        True,
        1 + 2j,
        [[1, 2], [3, 4]],
        ((1.0, 2.0), (3.0, 4.0)),
        np.zeros((0, 3)),
        np.zeros(()),
        np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1),
    ],
)
def test_accepts_numpy_values_scalars_and_sequences(obj):
    # Held as `jnp.asarray(obj)` holds it: float64 and int64 data as float32 and int32 without x64.
    x = FrozenConst(obj)
    expected = np.asarray(jnp.asarray(obj))
    assert x.shape == expected.shape and x.host_dtype == x.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(x), expected, strict=True)


@pytest.mark.parametrize("dtype", [">f8", ">i8", ">u8", ">c16", ">f4", ">i2"])
def test_byte_swapped_data_is_held_as_its_native_twin_is(dtype):
    # `jax.dtypes.canonicalize_dtype` narrows only the native byte order; the host holds what
    # JAX computes with whatever the source's byte order (float64 as float32 without x64).
    for x64 in (False, True):
        with enable_x64(x64):
            swapped = np.arange(6).astype(dtype)
            native = swapped.astype(swapped.dtype.newbyteorder("="))
            x, twin = FrozenConst(swapped), FrozenConst(native)
            assert x.host_dtype == twin.host_dtype == x.dtype == twin.dtype
            np.testing.assert_array_equal(np.asarray(x), np.asarray(twin), strict=True)


@pytest.mark.parametrize(
    "dtype",
    [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.int4, ml_dtypes.uint4],
)
def test_accepts_ml_dtypes(dtype):
    src = np.arange(6).astype(dtype).reshape(2, 3)
    x = FrozenConst(src)
    assert x.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(x), src)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), src)


def test_dtype_argument_converts_while_copying():
    x = FrozenConst([1.5, 2.5], dtype=ml_dtypes.bfloat16)
    assert x.dtype == np.dtype(ml_dtypes.bfloat16)
    y = FrozenConst(np.arange(3), dtype="float32")
    assert y.dtype == np.float32


def test_accepts_concrete_jax_array():
    a = jnp.arange(5.0)
    x = FrozenConst(a)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(a))
    assert not np.shares_memory(np.asarray(x), np.asarray(a))


@pytest.mark.host_memory
def test_frozenconst_of_frozenconst_shares_buffer():
    x = FrozenConst(np.arange(10.0))
    y = FrozenConst(x)
    assert np.shares_memory(np.asarray(x), np.asarray(y))
    assert jnp.asarray(x) is jnp.asarray(y)
    assert FrozenConst(x, dtype=np.float32)._store is x._store  # the dtype it holds: no copy
    z = FrozenConst(x, dtype=np.float16)
    assert z.dtype == np.float16 and not np.shares_memory(np.asarray(x), np.asarray(z))


@pytest.mark.parametrize(
    ("obj", "error", "match"),
    [
        (np.array([object(), 1], dtype=object), FrozenConstTypeError, "object dtype"),
        ([None, 1], FrozenConstTypeError, "object dtype"),
        ("abc", FrozenConstTypeError, "str"),
        (b"abc", FrozenConstTypeError, "bytes"),
        (bytearray(b"abc"), FrozenConstTypeError, "bytearray"),
        (np.array(["a", "b"]), FrozenConstTypeError, "string"),
        (np.array([b"a"]), FrozenConstTypeError, "string"),
        (np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]), FrozenConstTypeError, "structured"),
        (np.zeros(2, dtype="V4"), FrozenConstTypeError, "dtype"),
        (np.array(["2020-01-01"], dtype="M8[D]"), FrozenConstTypeError, "datetime"),
        ([[1, 2], [3]], FrozenConstValueError, "rectangular"),
        (np.ma.masked_array([1, 2], mask=[0, 1]), FrozenConstTypeError, "masked"),
        ({"a": 1}, FrozenConstTypeError, "object dtype"),
    ],
)
def test_bad_input_gets_a_clear_error(obj, error, match):
    with pytest.raises(error, match=match) as info:
        FrozenConst(obj)
    assert "FrozenConst" in str(info.value)
    assert isinstance(info.value, (TypeError, ValueError))
    assert type(info.value).__module__ == "frozenconst"


def test_bad_dtype_argument():
    with pytest.raises(FrozenConstTypeError, match="dtype"):
        FrozenConst([1, 2], dtype="not-a-dtype")
    with pytest.raises(FrozenConstTypeError, match="object"):
        FrozenConst([1, 2], dtype=object)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: jax.jit(f)(jnp.ones(3)),
        lambda f: jax.grad(lambda v: f(v).sum())(jnp.ones(3)),
        lambda f: jax.vmap(f)(jnp.ones((2, 3))),
        lambda f: jax.eval_shape(f, jnp.ones(3)),
    ],
    ids=["jit", "grad", "vmap", "eval_shape"],
)
def test_tracer_input_needs_a_concrete_value(transform):
    def build(v):
        return FrozenConst(v)

    with pytest.raises(TracedValueError, match="concrete value"):
        transform(build)


@pytest.mark.host_memory
def test_failed_construction_leaves_nothing_behind():
    gc.collect()
    before = len(jax.live_arrays())
    for bad in ([[1, 2], [3]], "x", np.zeros(2, dtype="V4")):
        with pytest.raises((FrozenConstTypeError, FrozenConstValueError)):
            FrozenConst(bad)
    gc.collect()
    assert len(jax.live_arrays()) == before


def test_pickle_carries_host_data_and_unpickles_frozen():
    x = FrozenConst(np.arange(6.0).reshape(2, 3))
    jnp.asarray(x)  # a device buffer exists, and must not travel
    payload = pickle.dumps(x)
    assert b"ArrayImpl" not in payload and b"jaxlib" not in payload
    y = pickle.loads(payload)
    assert isinstance(y, FrozenConst)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert not np.asarray(y).flags.writeable
    with pytest.raises(ValueError, match="WRITEABLE"):
        np.asarray(y).base.flags.writeable = True


def test_copy_and_deepcopy_return_the_same_object():
    x = FrozenConst(np.ones(3))
    assert copy.copy(x) is x
    assert copy.deepcopy(x) is x
    assert copy.deepcopy({"t": x})["t"] is x


def test_unhashable_and_elementwise_equality():
    x = FrozenConst(np.array([1, 2, 3]))
    with pytest.raises(TypeError, match="unhashable"):
        hash(x)
    eq = x == np.array([1, 0, 3])
    assert isinstance(eq, jax.Array)
    np.testing.assert_array_equal(eq, [True, False, True])


_KEYS = [
    pytest.param(id, id="id"),  # numpyro's `MCMC` keys its compiled sampler so
    pytest.param(lambda a: a.shape, id="shape"),
    pytest.param(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), id="ShapeDtypeStruct"),
    pytest.param(lambda a: np.asarray(a).tobytes(), id="bytes"),
    pytest.param(lambda a: None, id="None"),
]


@pytest.mark.parametrize("key_of", _KEYS)
def test_a_state_mapped_to_a_cache_key_is_a_key_as_with_a_jax_array_in_its_place(key_of):
    table = FrozenConst(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    w = jnp.ones(3)
    # The oracle: the same state with the constant's buffer, a jax.Array, in its place; a rerun
    # maps the state again, and finds what the first run cached.
    for state in ((w, jnp.asarray(table)), (w, table)):
        cache = {jax.tree.map(key_of, state): "compiled"}
        assert cache[jax.tree.map(key_of, state)] == "compiled"
    ours = jax.tree.map(key_of, (w, table))
    assert isinstance(ours[1], FrozenConst)  # a derived value stands in the constant's place
    # ... and is its leaf: equal to it and hashed as it, as JAX asks of a pytree's aux data.
    leaf = key_of(jnp.asarray(table))
    assert ours[1] == leaf and hash(ours[1]) == hash(leaf)


_HASHABLE = st.one_of(st.integers(), st.text(max_size=8), st.tuples(st.integers(), st.booleans()))


@settings(max_examples=40, deadline=None)
@given(leaf=_HASHABLE)
def test_a_derived_value_hashes_and_compares_as_its_hashable_leaf(leaf):
    derived = jax.tree.map(lambda a: leaf, FrozenConst(np.ones(2, np.float32)))
    assert hash(derived) == hash(leaf) and derived == leaf
    assert (derived != leaf) is False


def test_a_derived_value_around_an_array_stays_unhashable_as_the_array_is():
    table = FrozenConst(np.arange(3.0, dtype=np.float32))
    with pytest.warns(frozenconst.FrozenConstWarning, match="put a copy"):
        copy = jax.tree.map(lambda a: a + 1, table)
    for unhashable in (copy, jax.tree.map(lambda a: [a.shape], table)):
        with pytest.raises(TypeError, match="unhashable"):
            hash(unhashable)
    with pytest.raises(TypeError, match="unhashable"):
        hash(jnp.asarray(table) + 1)  # as a jax.Array is
    jax.jit(lambda t: _unhashable_inside(t))(table)


def _unhashable_inside(t):
    with pytest.raises(TypeError, match="unhashable"):
        hash(jax.tree.map(lambda a: a * 2, t))  # around a traced value
    return jnp.sum(t)


@pytest.mark.host_memory
def test_buffers_freed_with_the_constant():
    x = FrozenConst(np.random.default_rng(1).standard_normal(1000).astype(np.float32))
    ref = weakref.ref(jnp.asarray(x))
    assert ref() is not None
    del x
    gc.collect()
    assert ref() is None


def test_every_public_name_imports_and_is_documented():
    import pathlib

    assert isinstance(frozenconst.__version__, str)
    api = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    public = [n for n in dir(frozenconst) if not n.startswith("_")]
    assert "FrozenConst" in public and "jit" in public and "audit" in public
    for name in public:
        obj = getattr(frozenconst, name)
        if isinstance(obj, type(frozenconst)):  # submodules such as `strategies`
            continue
        assert obj.__module__.startswith("frozenconst"), name
        assert f"::: frozenconst.{name}\n" in api, f"{name} is missing from docs/api.md"


@pytest.mark.host_memory
@pytest.mark.parametrize("mode", ["r", "c", "r+"])
@pytest.mark.parametrize("shape", [(1000, 7), (3, 5000), (8193,)])
def test_a_memory_mapped_source_is_copied_exactly_block_by_block(tmp_path, monkeypatch, mode, shape):
    from frozenconst import _host  # the block size, which nothing public sets

    monkeypatch.setattr(_host, "_RELEASE_BLOCK_BYTES", 5000)  # many blocks, edges inside pages
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    path = tmp_path / "c.npy"
    np.save(path, data)
    source = np.load(path, mmap_mode=mode)
    if mode == "c":
        source[0] = 7.0  # a private change, only in this map: it must survive
        data[0] = 7.0
    x = FrozenConst(source)
    np.testing.assert_array_equal(np.asarray(x), data)
    np.testing.assert_array_equal(np.asarray(source), data)  # the map still reads the same
    view = FrozenConst(source[1:])  # a view into the map, not at its start
    np.testing.assert_array_equal(np.asarray(view), data[1:])


class _Wrapper:
    """A user type that stands for an array through `__jax_array__` alone (JEP 28661)."""

    def __init__(self, value):
        self.value = value

    def __jax_array__(self):
        return self.value


@pytest.mark.parametrize(
    "value",
    [
        jnp.arange(6.0).reshape(2, 3),
        jnp.array([1, 2], jnp.int8),
        np.arange(4, dtype=np.uint16),  # `__jax_array__` may return NumPy data; jnp.asarray takes it
        jnp.asarray(2.5),
    ],
)
def test_an_object_with_jax_array_is_held_as_jnp_asarray_holds_it(value):
    obj = _Wrapper(value)
    want = jnp.asarray(obj)
    x = FrozenConst(obj)
    assert (x.shape, x.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(want), strict=True)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), np.asarray(want), strict=True)
    y = FrozenConst(obj, dtype=np.float32)  # with a conversion, as `jnp.asarray(obj, dtype=...)`
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jnp.asarray(obj, dtype=np.float32)), strict=True)


def test_an_object_with_jax_array_standing_for_a_traced_value_is_refused():
    def build(v):
        FrozenConst(_Wrapper(v * 2))
        return v

    with pytest.raises(TracedValueError, match=r"traced value \w+\[3\]"):
        jax.jit(build)(jnp.ones(3))


@pytest.mark.host_memory
def test_an_object_with_jax_array_is_frozen_a_copy():
    source = np.arange(4.0)
    x = FrozenConst(_Wrapper(source))
    source[0] = 99.0  # the caller's array, changed after construction
    assert np.asarray(x)[0] == 0.0 and not np.asarray(x).flags.writeable
