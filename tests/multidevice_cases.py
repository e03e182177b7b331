"""Cases that need 4 devices. Run by test_multidevice.py in a pytest subprocess of
their own, because `jax_num_cpu_devices` must be set before JAX's backend starts."""

import jax

jax.config.update("jax_num_cpu_devices", 4)

import gc  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import assert_float32_close, in_device_memory, single_device_sharding  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import frozenconst  # noqa: E402
from frozenconst import FrozenConst, FrozenConstTypeError, FrozenConstValueError  # noqa: E402


def _data(rows=64, cols=32, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def _buffers_holding(data):
    """(device, shape, nbytes) of every live device buffer whose contents are a slice of `data`."""
    gc.collect()
    found = set()
    for arr in jax.live_arrays():
        if not in_device_memory(arr):  # a page-locked host copy (`host_memory="pinned"`)
            continue
        for shard in arr.addressable_shards:
            piece = np.asarray(shard.data)
            if (
                piece.dtype == data.dtype
                and np.array_equal(piece, data[shard.index])
                and arr.shape == data.shape
            ):
                found.add((shard.device, piece.shape, shard.data.unsafe_buffer_pointer(), shard.data.nbytes))
    return found


def test_four_devices():
    assert jax.device_count() == 4


@pytest.mark.host_memory
def test_sharded_placement_holds_a_quarter_per_device():
    data = _data()
    x = FrozenConst(data)
    mesh = jax.make_mesh((4,), ("x",))
    arr = x.on(NamedSharding(mesh, P("x")))
    assert arr.committed and arr.sharding == NamedSharding(mesh, P("x"))
    np.testing.assert_array_equal(np.asarray(arr), data)
    buffers = _buffers_holding(data)
    # Exactly one buffer per device, each a quarter, and no full copy anywhere.
    assert len(buffers) == 4
    assert {b[0] for b in buffers} == set(jax.devices())
    assert all(b[1] == (16, 32) and b[3] == data.nbytes // 4 for b in buffers)
    assert {tuple(sorted(p.device_bytes.values())) for p in x.placements} == {(data.nbytes // 4,) * 4}


@pytest.mark.host_memory
def test_cache_is_keyed_on_sharding_equality():
    x = FrozenConst(_data())
    a = x.on(NamedSharding(jax.make_mesh((4,), ("x",)), P("x")))
    b = x.on(NamedSharding(jax.make_mesh((4,), ("x",)), P("x")))  # equal, not identical
    assert a is b
    c = x.on(NamedSharding(jax.make_mesh((4,), ("x",)), P(None, "x")))
    assert c is not a
    assert len(x.placements) == 2


@pytest.mark.host_memory
def test_replicated_placement_and_partition_spec_under_set_mesh():
    data = _data(seed=1)
    x = FrozenConst(data)
    mesh = jax.make_mesh((2, 2), ("a", "b"))
    replicated = x.on(NamedSharding(mesh, P()))
    assert replicated.is_fully_replicated
    assert len(_buffers_holding(data)) == 4
    # `jax.set_mesh` is a context manager from jax 0.7.2; before, `jax.sharding.use_mesh`.
    with (jax.set_mesh if hasattr(jax, "set_mesh") else jax.sharding.use_mesh)(mesh):
        arr = x.on(P("a", "b"))
    assert arr.sharding == NamedSharding(mesh, P("a", "b"))
    assert {s.data.shape for s in arr.addressable_shards} == {(32, 16)}
    with pytest.raises(FrozenConstValueError, match="active mesh"):
        x.on(P("a"))


@pytest.mark.host_memory
def test_device_and_single_device_sharding_are_one_placement():
    data = _data(seed=2)
    x = FrozenConst(data)
    d2 = jax.devices()[2]
    a = x.on(d2)
    assert a is x.on(single_device_sharding(d2))
    assert a.devices() == {d2} and a.committed


@pytest.mark.host_memory
def test_default_placement_follows_default_device_one_buffer_each():
    data = _data(seed=3)
    x = FrozenConst(data)
    d0, d3 = jax.devices()[0], jax.devices()[3]
    a = jnp.asarray(x)
    with jax.default_device(d3):
        b = jnp.asarray(x)
        assert jnp.asarray(x) is b
    assert a.devices() == {d0} and b.devices() == {d3}
    assert not a.committed and not b.committed
    assert x.on(d0).unsafe_buffer_pointer() == a.unsafe_buffer_pointer()  # committing is free
    assert len(_buffers_holding(data)) == 2


@pytest.mark.host_memory
def test_evict_one_placement_or_all():
    data = _data(seed=4)
    x = FrozenConst(data)
    mesh = jax.make_mesh((4,), ("x",))
    sharded = NamedSharding(mesh, P("x"))
    x.on(sharded)
    x.on(NamedSharding(mesh, P()))
    jnp.asarray(x)
    assert len(x.placements) == 3
    x.evict(sharded)
    assert len(x.placements) == 2
    assert all(p.sharding != sharded for p in x.placements)
    x.evict()
    assert x.placements == ()
    assert len(_buffers_holding(data)) == 0


@pytest.mark.host_memory
def test_the_default_buffer_combines_with_arrays_on_any_device(_host_memory):
    data = _data(seed=7)
    x = FrozenConst(data)
    assert x.host_memory == ("pinned" if _host_memory == "pinned" else "pageable")
    d2 = jax.devices()[2]
    other = jax.device_put(np.ones(data.shape, np.float32), d2)
    total = jnp.asarray(x) + other  # uncommitted: moves to the committed operand's device
    assert total.devices() == {d2}
    np.testing.assert_array_equal(np.asarray(total), data + 1)
    with jax.default_device(jax.devices()[1]):  # another device than the host copy's: read through NumPy
        np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data, strict=True)
        assert jnp.asarray(x).devices() == {jax.devices()[1]}
    assert x.stats().transfers == 2


def test_bad_targets():
    x = FrozenConst(_data(rows=6))
    mesh = jax.make_mesh((4,), ("x",))
    with pytest.raises(FrozenConstValueError, match="does not fit"):
        x.on(NamedSharding(mesh, P("x")))  # 6 rows over 4 devices
    with pytest.raises(FrozenConstValueError, match="does not fit"):
        x.on(NamedSharding(mesh, P(None, None, "x")))  # more dimensions than the constant
    with pytest.raises(FrozenConstTypeError, match="placement target"):
        x.on("cpu:0")
    assert x.placements == ()


@pytest.mark.host_memory
def test_sharded_computation_closed_over_and_as_argument():
    data = _data(seed=5)
    x = FrozenConst(data)
    mesh = jax.make_mesh((4,), ("x",))
    w = jax.device_put(np.ones((32, 8), np.float32), NamedSharding(mesh, P(None, "x")))
    ones = np.ones((32, 8), np.float32)
    expected, magnitude = data @ ones, np.abs(data) @ ones
    assert_float32_close(jax.jit(lambda w: x @ w)(w), expected, magnitude)
    assert_float32_close(jax.jit(lambda c, w: c @ w)(x, w), expected, magnitude)
    f = frozenconst.jit(lambda w: x @ w)
    assert_float32_close(f(w), expected, magnitude)
    # Every program over the mesh was given it replicated over the mesh, one buffer for all of
    # them, not its default buffer on one device (which JAX would copy to the mesh per program).
    fed = [p.sharding for p in x.placements if p.committed]
    assert fed == [NamedSharding(mesh, P())]
    compiled = f.lower(w).compile()
    assert_float32_close(compiled(w), expected, magnitude)
    assert [p.sharding for p in x.placements if p.committed] == [NamedSharding(mesh, P())]


@pytest.mark.host_memory
def test_declared_sharding_is_used_everywhere():
    data = _data(seed=6)
    mesh = jax.make_mesh((4,), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    x = FrozenConst(data, sharding=sharding)
    assert jnp.asarray(x).sharding == sharding
    leaves = jax.tree_util.tree_leaves(x)
    assert leaves[0].sharding == sharding
    y = FrozenConst(data).placed(sharding)
    assert jnp.asarray(y).sharding == sharding
    f = frozenconst.jit(lambda v: jnp.sum(x * v))
    v = jnp.ones((64, 32))
    assert_float32_close(f(v), data.sum(), np.abs(data).sum(), rtol=1e-4)
    lowered = f.lower(v)
    # A parameter, with its declared sharding: the only placement that exists. (jax 0.8 and 0.9
    # cannot list a program's hoisted parameters in `Compiled.input_shardings`, for JAX's own
    # simplified pipeline too.)
    assert len(lowered.as_text()) < data.nbytes
    assert_float32_close(lowered.compile()(v), data.sum(), np.abs(data).sum(), rtol=1e-4)
    assert [p.sharding for p in x.placements] == [sharding]


def test_shard_map_over_explicit_axes_runs_as_under_jax_jit():
    # A constant closed over inside shard_map over `Explicit` mesh axes: a parameter of the
    # program, nothing said, the values jax.jit's.
    from jax.sharding import AxisType

    mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,))
    data = _data(64, 64, seed=5)
    w = FrozenConst(data)
    x = jax.device_put(jnp.asarray(_data(64, 64, seed=6)), NamedSharding(mesh, P("x")))
    body = jax.shard_map(lambda a: a @ w, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    array = jnp.asarray(data)
    reference = jax.shard_map(lambda b: b @ array, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    expected = np.asarray(jax.jit(reference)(x))
    out = frozenconst.jit(body)(x)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-6)
    assert_float32_close(out, np.asarray(x) @ data, np.abs(np.asarray(x)) @ np.abs(data))
    assert len(jax.jit(body).lower(x).as_text()) < data.nbytes  # not embedded


def test_on_inside_frozenconst_jit_runs_wherever_jax_jit_runs():
    # `x.on(d1)` is the committed buffer on d1 inside the traced function too: moved
    # to d0 there, it joins a computation on d0, as under `jax.jit`.
    d0, d1 = jax.devices()[:2]
    x = FrozenConst(_data())
    a = jax.device_put(jnp.ones(x.shape, jnp.float32), d0)

    def f(a):
        return a + jax.device_put(x.on(d1), d0)

    try:
        expected = jax.jit(f)(a)
    except ValueError:
        # The simplified pipeline passes the closed-over buffer on d1 to the
        # program on d0, which JAX refuses, for jax.jit as for frozenconst.jit.
        with pytest.raises(ValueError, match="incompatible devices"):
            frozenconst.jit(f)(a)
        return
    got = frozenconst.jit(f)(a)
    assert got.devices() == {d0}
    np.testing.assert_array_equal(got, expected)


@pytest.mark.host_memory
def test_device_bytes_count_the_default_buffer_whole_when_a_shard_aliases_its_start():
    # On CPU both the default buffer and the first row shard can alias the start
    # of the frozen host buffer: one address, two sizes. The default buffer's
    # bytes are all on its device whichever placement is listed last.
    x = FrozenConst(_data())
    default = jnp.asarray(x)
    rows = x.on(NamedSharding(jax.make_mesh((4,), ("x",)), P("x")))
    (device,) = default.devices()
    buffers = {}
    for arr in (default, rows):
        for shard in arr.addressable_shards:
            if shard.device == device:
                ptr = shard.data.unsafe_buffer_pointer()
                buffers[ptr] = max(buffers.get(ptr, 0), shard.data.nbytes)
    assert x.stats().device_bytes[device] == sum(buffers.values()) >= default.nbytes
    assert frozenconst.stats().device_bytes[device] >= default.nbytes


def test_dlpack_of_a_constant_on_several_devices_refuses_as_jax_does_unless_asked_for_the_cpu():
    data = _data(seed=11)
    x = FrozenConst(data).placed(NamedSharding(jax.make_mesh((4,), ("x",)), P("x")))
    for export in (lambda a: a.__dlpack_device__(), lambda a: a.__dlpack__(max_version=(1, 0))):
        with pytest.raises(BufferError):
            export(jnp.asarray(x))
        with pytest.raises(BufferError):
            export(x)
    view = np.from_dlpack(x, device="cpu")  # the whole host data, read-only, no copy
    np.testing.assert_array_equal(view, data)
    assert np.shares_memory(view, np.asarray(x)) and not view.flags.writeable


@pytest.mark.parametrize(
    "mesh_shape, spec",
    [((4,), P()), ((4,), P("x")), ((2, 2), P("x")), ((2, 2), P("x", "y"))],
    ids=["replicated", "sharded", "partly-replicated", "sharded-2d"],
)
def test_transfers_count_one_per_device_buffer_made_from_the_host(mesh_shape, spec):
    # "one per shard" (`ConstStats.transfers`): each addressable shard JAX holds
    # is a buffer of its own on its device, filled from the host data, whether
    # JAX read the data once for all (a replicated sharding) or once per shard.
    data = _data(seed=7)
    x = FrozenConst(data)
    mesh = jax.make_mesh(mesh_shape, ("x", "y")[: len(mesh_shape)])
    arr = x.on(NamedSharding(mesh, spec))
    shards = arr.addressable_shards
    assert len({(s.device, s.data.unsafe_buffer_pointer()) for s in shards}) == len(shards) == 4
    assert x.stats().transfers == len(shards)
    assert frozenconst.stats().transfers >= len(shards)
    x.on(NamedSharding(mesh, spec))  # a cache hit: no transfer
    assert x.stats().transfers == len(shards)


def _outcome(fun):
    try:
        fun()
    except Exception as err:
        return str(err).split(":")[1].strip().split(" transfer")[0]  # "Disallowed host-to-device"
    return "ran"


@pytest.mark.parametrize("level", ["disallow", "disallow_explicit"])
def test_under_a_transfer_guard_a_constant_on_the_device_runs_over_four_devices(level):
    # The program over four devices takes the constant replicated over them, a copy frozenconst
    # makes once at lowering: its own, never refused by the user's guard. (The same program
    # closing over a `jax.Array` runs there under JAX's default pipeline: its data is in the
    # program.)
    data = _data()
    x = FrozenConst(data)
    jnp.asarray(x)  # on the device before the guard
    mesh = jax.make_mesh((4,), ("x",))
    rows = jnp.linspace(-1.0, 1.0, 8 * 64, dtype=jnp.float32).reshape(8, 64)
    w = jax.device_put(rows, NamedSharding(mesh, P("x")))
    t = jax.device_put(data, NamedSharding(mesh, P()))
    expected = np.asarray(jax.jit(lambda w, t: jnp.tanh(w @ t))(w, t))
    ours = jax.jit(lambda w: jnp.tanh(w @ x))
    with jax.transfer_guard(level):
        first, again = ours(w), ours(w)
    np.testing.assert_array_equal(np.asarray(first), expected)
    np.testing.assert_array_equal(np.asarray(again), expected)
    # What the user's own code asks for stays under the guard, as JAX guards it: a constant's
    # first transfer goes as `jax.device_put` of its NumPy data goes (refused under
    # `disallow_explicit`).
    fresh = _data(seed=1)
    with jax.transfer_guard(level):
        ours_first = _outcome(lambda: jnp.asarray(FrozenConst(fresh)))
        theirs = _outcome(lambda: jax.device_put(fresh))
    assert ours_first == theirs == ("ran" if level == "disallow" else "Disallowed host-to-device"), (
        ours_first,
        theirs,
    )
