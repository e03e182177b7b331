"""Host-resident constants (`FrozenConst(a, residency="host")`): the constant's buffer in
page-locked host memory, moved onto the device by each use, inside the program under any jit.

Observed through JAX: the values against the same computation on a device-resident constant,
the lowered program's parameters (`mhlo.memory_kind = "pinned_host"`) and size, its jaxpr
(the slice taken in host memory, then moved), and `jax.live_arrays()` (no device copy kept;
one page-locked buffer). On JAX's CPU backend page-locked memory is host memory like the rest,
and the move in the program costs nothing; what it saves is measured on an accelerator
(`python -m benchmarks residency`).
"""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import live_copies, pinned_host_offered, raw_numpy_lowers, unique_data
from hypothesis import given, settings
from hypothesis import strategies as st

import frozenconst

# Nothing public makes JAX refuse a placement or repeat a once-a-process warning: those are
# replaced inside.
from frozenconst import (
    FrozenConst,
    FrozenConstTypeError,
    FrozenConstValueError,
    FrozenConstWarning,
    _frames,
    _host_memory,
)

needs_pinned = pytest.mark.skipif(
    not pinned_host_offered(), reason=f"jax {jax.__version__}'s devices offer no pinned_host memory"
)
pytestmark = needs_pinned

L, R = 6, 64  # layers, rows = columns


def _pinned(data):
    """Live page-locked `jax.Array`s holding `data`."""
    return [
        a
        for a in jax.live_arrays()
        if not a.is_deleted()
        and a.sharding.memory_kind == "pinned_host"
        and a.shape == data.shape
        and np.array_equal(np.asarray(a), data)
    ]


def _layers(table):
    """A scan over layers, each reading its layer's slice of `table` (JAX's host-offloading idiom)."""

    def f(h):
        def body(h, i):
            return jnp.tanh(table[i] @ h), None

        return jax.lax.scan(body, h, jnp.arange(L))[0]

    return f


@pytest.fixture
def table():
    return unique_data((L, R, R))


def test_a_scan_over_layers_computes_what_the_device_resident_constant_computes(table):
    resident, device = FrozenConst(table, residency="host"), FrozenConst(table)
    h = jnp.linspace(-1, 1, R, dtype=jnp.float32)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(_layers(resident))(h)), np.asarray(jax.jit(_layers(device))(h))
    )
    assert resident.residency == "host" and device.residency == "device"


@pytest.mark.parametrize("jit", ["jax.jit", "frozenconst.jit", "eqx.filter_jit", "no jit"])
def test_every_jit_and_eager_use_computes_the_same_values(table, jit):
    if jit == "eqx.filter_jit":
        eqx = pytest.importorskip("equinox")
        wrap = eqx.filter_jit
    else:
        wrap = {"jax.jit": jax.jit, "frozenconst.jit": frozenconst.jit, "no jit": lambda f: f}[jit]
    resident, device = FrozenConst(table, residency="host"), FrozenConst(table)
    h = jnp.linspace(-1, 1, R, dtype=jnp.float32)

    def uses(t):
        return (
            jnp.einsum("lrc,c->lr", t, h),  # the whole constant
            t[2] @ h,  # a static slice
            t[jnp.int32(3)] @ h,  # a dynamic slice
            t[1:3, ::2],  # a strided slice
            jax.vmap(lambda i: t[i] @ h)(jnp.arange(L)),  # a gather
            t + 1,
            t.sum(axis=0),
        )

    for got, want in zip(wrap(lambda: uses(resident))(), wrap(lambda: uses(device))(), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_program_takes_it_as_a_page_locked_parameter_and_holds_none_of_its_data(table):
    resident = FrozenConst(table, residency="host")
    h = jnp.ones(R, jnp.float32)
    text = jax.jit(_layers(resident)).lower(h).as_text()
    main = next(line for line in text.splitlines() if "func.func public @main" in line)
    assert main.count('mhlo.memory_kind = "pinned_host"') == 1, main
    assert len(text) < table.nbytes / 10  # a parameter, not the data
    # frozenconst.jit and a library's jit lower it the same way.
    assert frozenconst.jit(_layers(resident)).lower(h).as_text().count('"pinned_host"') >= 1


def test_inside_a_scan_the_slice_is_taken_in_host_memory_and_only_it_moved(table):
    resident = FrozenConst(table, residency="host")
    jaxpr = str(jax.make_jaxpr(_layers(resident))(jnp.ones(R, jnp.float32)))
    # The scan takes the page-locked table; its body cuts the layer's slice from it and moves
    # that slice: one layer on the device per step, never the table.
    assert f"f32<host>[{L},{R},{R}]" in jaxpr and "scan[" in jaxpr
    sliced = jaxpr.split(f"f32<host>[1,{R},{R}] = dynamic_slice", 1)
    assert len(sliced) == 2 and "device_put" in sliced[1].split("dot_general", 1)[0]
    assert f"f32[{L},{R},{R}] = device_put" not in jaxpr


def test_no_device_copy_is_kept_and_one_page_locked_buffer_is(table):
    resident = FrozenConst(table, residency="host")
    h = jnp.ones(R, jnp.float32)
    f = jax.jit(_layers(resident))
    for _ in range(3):
        f(h).block_until_ready()
        float(jnp.sum(resident))  # an eager use: a device copy, freed with its result
    assert live_copies(table) == 0
    assert len(_pinned(table)) == 1
    stats = resident.stats()
    assert stats.residency == "host" and dict(stats.device_bytes) == {}
    assert stats.host_bytes == 2 * table.nbytes and stats.transfers == 1  # the NumPy and page-locked copies
    assert frozenconst.stats().pinned_bytes >= table.nbytes


def test_a_budget_never_counts_a_host_resident_constant(table):
    resident = FrozenConst(table, residency="host")
    h = jnp.ones(R, jnp.float32)
    want = np.asarray(jax.jit(_layers(FrozenConst(table)))(h))
    with frozenconst.device_budget(1024):  # smaller than the table
        np.testing.assert_array_equal(np.asarray(jax.jit(_layers(resident))(h)), want)
    assert resident.stats().evictions == 0


def test_eager_uses_are_uncommitted_as_a_device_resident_constants_are(table):
    resident = FrozenConst(table, residency="host")
    moved = jnp.asarray(resident)
    assert moved.committed is jnp.asarray(FrozenConst(table)).committed is False
    assert moved.sharding.memory_kind in (None, jax.devices()[0].default_memory().kind)
    del moved
    # A basic index reads only its part: the whole constant is never moved for it.
    for index in (4, (slice(1, 3), 5), (Ellipsis, 0), (None, -1)):
        part = resident[index]
        np.testing.assert_array_equal(np.asarray(part), table[index])
        assert not part.committed
    assert live_copies(table) == 0
    # An index array gathers from the whole constant, moved for the call.
    np.testing.assert_array_equal(np.asarray(resident[jnp.array([0, 2])]), table[[0, 2]])


def test_construction_choices_and_copies(table):
    device = FrozenConst(table)
    resident = FrozenConst(device, residency="host")  # shares the frozen NumPy copy
    assert resident.residency == "host" and device.residency == "device"
    assert np.shares_memory(np.asarray(resident), np.asarray(device))
    assert FrozenConst(resident).residency == "host"  # the same constant
    back = FrozenConst(resident, residency="device")
    assert back.residency == "device" and back.host_memory == "pageable"
    pinned = FrozenConst(resident, residency="device", host_memory="pinned")
    assert pinned.residency == "device" and pinned.host_memory == "pinned"
    assert np.shares_memory(np.asarray(back), np.asarray(pinned))
    assert FrozenConst(resident, dtype=np.float16).residency == "host"  # a copy, resident as its source
    again = pickle.loads(pickle.dumps(resident))
    assert again.residency == "host"
    np.testing.assert_array_equal(np.asarray(again), table)
    placed = FrozenConst(table, residency="host", sharding=jax.devices()[0])
    again = pickle.loads(pickle.dumps(placed))
    assert again.residency == "host" and again.declared_sharding == placed.declared_sharding


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"residency": "cpu"}, FrozenConstValueError, "'device' or 'host', but received 'cpu'"),
        ({"residency": "HOST"}, FrozenConstValueError, "received 'HOST'"),
        ({"residency": 1}, FrozenConstTypeError, "received a `int`"),
        (
            {"residency": "host", "host_memory": "pageable"},
            FrozenConstValueError,
            "cannot keep a constant in pageable",
        ),
    ],
)
def test_a_bad_residency_is_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        FrozenConst(np.ones(3), **kwargs)
    with pytest.raises(error, match=match):
        FrozenConst(FrozenConst(np.ones(3)), **kwargs)


def test_a_host_resident_source_asked_for_pageable_memory_is_refused():
    resident = FrozenConst(np.ones(3), residency="host")
    with pytest.raises(FrozenConstValueError, match="cannot keep a constant in pageable"):
        FrozenConst(resident, host_memory="pageable")
    assert FrozenConst(resident, host_memory="pageable", residency="device").host_memory == "pageable"


def test_a_pageable_default_from_the_environment_does_not_refuse_host_residency(monkeypatch):
    monkeypatch.setenv("FROZENCONST_HOST_MEMORY", "pageable")
    assert FrozenConst(np.ones(3), residency="host").residency == "host"


# -- where the backend cannot -------------------------------------------------------------


@pytest.mark.parametrize("why", ["no pinned_host memory", "JAX refuses the placement"])
def test_a_backend_that_cannot_warns_once_and_keeps_the_constant_on_the_device(monkeypatch, table, why):
    if why == "no pinned_host memory":
        monkeypatch.setattr(_host_memory, "offers_pinned_host", lambda device: False)
        match = "offer no page-locked"
    else:

        def refuse(host, sharding):
            raise ValueError("memory kind pinned_host is not supported")

        monkeypatch.setattr(_host_memory, "place", refuse)
        match = "JAX refused the placement.*not supported"
    _frames.DEGRADED.forget()
    resident = FrozenConst(table, residency="host")
    h = jnp.ones(R, jnp.float32)
    other = FrozenConst(unique_data((L, R, R)), residency="host")
    with pytest.warns(FrozenConstWarning, match=f"residency='host'.*{match}.*kept on the device") as record:
        got = jax.jit(_layers(resident))(h)
        jnp.sum(other).block_until_ready()  # said once (under these filters)
    assert len([r for r in record if issubclass(r.category, FrozenConstWarning)]) == 1
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(_layers(FrozenConst(table)))(h)))
    assert resident.residency == other.residency == "device" and live_copies(table) == 1


def _index():
    """Indices of an (L, R, R) table: basic ones (ints, slices with and without a stride, None,
    `...`), and an integer array first followed by slices."""
    bound = st.one_of(st.none(), st.integers(-R - 2, R + 2))
    a_slice = st.builds(slice, bound, bound, st.sampled_from([None, 1, -1, 2, -2, 5]))
    part = st.one_of(st.integers(-L, L - 1), st.none(), a_slice)
    basic = st.lists(part, max_size=4).map(tuple) | st.tuples(part, st.just(Ellipsis), part)
    rows = st.lists(st.integers(0, L - 1), min_size=1, max_size=3).map(np.asarray)
    leading = st.tuples(rows, st.lists(a_slice, max_size=2)).map(lambda t: (t[0], *t[1]))
    return basic | leading


def _host_reads(jaxpr, found=None):
    """(primitive, narrowed axes, strides) of each slice, dynamic slice and gather of an operand
    in host memory, in `jaxpr` and every jaxpr inside it."""
    found = [] if found is None else found
    for eqn in jaxpr.eqns:
        operand = eqn.invars[0].aval if eqn.invars else None
        if "<host>" in str(operand) and eqn.primitive.name in ("slice", "dynamic_slice", "gather"):
            shape, params = operand.shape, eqn.params
            if eqn.primitive.name == "slice":
                sizes = [b - a for a, b in zip(params["start_indices"], params["limit_indices"], strict=True)]
            else:
                sizes = list(params["slice_sizes"])
            narrowed = {d for d, (n, size) in enumerate(zip(sizes, shape, strict=True)) if n != size}
            found.append((eqn.primitive.name, narrowed, params.get("strides")))
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _host_reads(inner, found)
    return found


@settings(max_examples=40, deadline=None)
@given(index=_index())
def test_an_index_is_taken_in_host_memory_along_the_leading_axis_only(index):
    # XLA's TPU compiler refuses a slice of a page-locked operand in more than one dimension,
    # or one with a stride, and has computed such a slice wrong (docs/device-memory.md): the
    # leading axis's rows are cut in host memory, the rest of the index taken on the device.
    # The values are NumPy's and the device-resident constant's, for every index of the sweep.
    table = unique_data((L, R, R))
    try:
        want = table[index]
    except IndexError:  # out of range (an int): JAX clamps, NumPy refuses; not this test's case
        return
    if not raw_numpy_lowers():  # jax 0.8 and 0.9 lower no closure over a NumPy array (simplified)
        index = tuple(jnp.asarray(p) if isinstance(p, np.ndarray) else p for p in index)
    resident, device = FrozenConst(table, residency="host"), FrozenConst(table)
    got = jax.jit(lambda: resident[index])()
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(lambda: device[index])()))
    for primitive, narrowed, strides in _host_reads(jax.make_jaxpr(lambda: resident[index])().jaxpr):
        assert narrowed <= {0}, (index, primitive, narrowed)
        assert strides is None or set(strides) == {1}, (index, primitive, strides)
