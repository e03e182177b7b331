"""Each fallback in `frozenconst/_compat.py` and `_compat_lowering.py`, forced: results stay
right, and a fallback that costs something says so once with a FrozenConstWarning.

Where the installed JAX has the public hook, the fallback is forced by
replacing what `_compat` (or `_compat_lowering`) found at import; the last test removes the
public hooks from JAX before frozenconst is imported, in a fresh process, so the
detection itself is exercised. On the older JAX releases `make test` runs,
several of these fallbacks are simply what runs.
"""

import json
import pickle
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import (
    SIMPLIFIED,
    assert_float32_close,
    enable_x64,
    live_copies,
    on_cpu,
    on_device,
    pinned_host_offered,
    run_bounded,
    subprocess_env,
    unique_data,
)

import frozenconst

# A fallback runs only where the compat modules found no hook: replacing what it found is the only way
# to reach one on a JAX that has them all.
from frozenconst import (
    FrozenConst,
    FrozenConstWarning,
    _cache,
    _compat,
    _compat_lowering,
    _dtypes,
    _frames,
    _host_memory,
    _targets,
)
from frozenconst._refusals import JAX_LAX_REFUSES


@pytest.fixture(autouse=True)
def _fresh_warnings():
    _frames.DEGRADED.forget()
    yield
    _frames.DEGRADED.forget()


def _degraded(record) -> list[str]:
    return [str(r.message) for r in record if issubclass(r.category, FrozenConstWarning)]


def test_settings_read_through_public_config_follow_thread_local_contexts(monkeypatch):
    # The fallback when JAX's state objects move: `jax.config.<name>`, slower, same answers.
    x64 = _compat._Setting("jax_enable_x64")
    device = _compat._Setting("jax_default_device")
    # The device cache is the one reader of both (`_cache.setting_key` and its inlined copy).
    monkeypatch.setattr(_cache, "X64", x64)
    monkeypatch.setattr(_cache, "DEFAULT_DEVICE", device)
    data = np.arange(5, dtype=np.int64) + 2**40  # needs x64 to keep its values
    cpu = jax.devices("cpu")[0]
    with enable_x64(True):
        x = FrozenConst(data)
        assert x64.value is True
        wide = jnp.asarray(x)
        assert wide.dtype == np.int64
        np.testing.assert_array_equal(np.asarray(wide), data)
        assert frozenconst.jit(lambda w: x + w)(jnp.int64(1)).dtype == np.int64
        with jax.default_device(cpu):
            assert device.value is cpu
            assert jnp.asarray(x).devices() == {cpu}
    assert x64.value is False


def test_without_eval_context_constants_met_in_traces_are_cached_concrete(monkeypatch):
    monkeypatch.setattr(_cache, "eval_context", jax.ensure_compile_time_eval)
    data = unique_data((4, 3))
    x = FrozenConst(data)
    shape = jax.eval_shape(lambda w: jnp.asarray(x) @ w, jnp.ones(3))
    inside = jax.jit(lambda w: jnp.asarray(x) @ w)(jnp.ones(3))
    eager = jnp.asarray(x)
    assert shape.shape == (4,)
    assert_float32_close(inside, on_device(data) @ np.ones(3), np.abs(data).sum(1))
    assert not isinstance(eager, jax.core.Tracer)
    np.testing.assert_array_equal(np.asarray(eager), data)
    assert not any(isinstance(a, jax.core.Tracer) for a in x._store.served.values())
    assert jnp.asarray(x) is eager  # cached from the first concrete transfer on


_WITHOUT_HOISTING = textwrap.dedent(
    """
    import json, warnings
    from jax._src.interpreters import mlir
    # A JAX whose hoisting frozenconst cannot reach: the switch hidden while frozenconst imports.
    fields = mlir.LoweringParameters.__dataclass_fields__
    hidden = fields.pop("hoist_constants_as_args")
    import jax, jax.numpy as jnp, numpy as np
    import frozenconst
    fields["hoist_constants_as_args"] = hidden
    warnings.simplefilter("always")
    table = frozenconst.FrozenConst(np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
    f = jax.jit(lambda w: table @ w)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = f(jnp.ones(64))
        f(jnp.ones(64) * 2)
    print(json.dumps({
        "hooks": frozenconst._compat_lowering.HOISTING is None,
        "right": bool(np.allclose(np.asarray(out), np.asarray(table) @ np.ones(64))),
        "hlo": len(f.lower(jnp.ones(64)).as_text()),
        "said": [str(r.message) for r in record if issubclass(r.category, frozenconst.FrozenConstWarning)],
    }))
    """
)


@pytest.mark.subprocess
def test_without_jaxs_hoisting_a_program_embeds_the_constant_correctly_and_says_so_once():
    code, out = run_bounded([sys.executable, "-c", _WITHOUT_HOISTING], env=subprocess_env())
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["hooks"] is True and report["right"] is True
    if SIMPLIFIED:
        # JAX's own hoisting (a copy per use at worst) is what the simplified pipeline runs.
        assert report["said"] == []
    else:
        assert report["hlo"] > 64 * 64 * 4  # embedded, as JAX embeds any array
        (said,) = report["said"]
        assert "cannot reach JAX's lowering" in said and "as an argument" in said


def test_without_the_call_frame_a_donation_is_met_at_the_constants_next_use(monkeypatch):
    # The donating call is read off JAX's own frame (`_compat_lowering.donated_arguments`); without it
    # the loss is met where the constant is next used: said there, every program right.
    monkeypatch.setattr(_compat_lowering, "_CALL_FRAME", ("nowhere", "nothing"))
    data = unique_data((64, 64))
    x = FrozenConst(data)
    closure = jax.jit(lambda w: x @ w)
    closure(jnp.ones(64))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        warnings.simplefilter("error", FrozenConstWarning)  # nothing said at the donation
        jax.block_until_ready(jax.jit(lambda s: s * 2, donate_argnums=0)(x))
    with pytest.warns(FrozenConstWarning, match="was deleted"):
        np.testing.assert_array_equal(np.asarray(x + 0), data)
    assert_float32_close(closure(jnp.ones(64)), on_device(data) @ np.ones(64), np.abs(data).sum(1))


def test_a_level_with_input_effects_keeps_its_constants_and_programs_stay_right(monkeypatch):
    # A level whose effects name its inputs by position keeps its constants (`_compat_lowering
    # .has_input_effects`); forced on every level here: every FrozenConst embedded, as JAX does,
    # and said (under JAX's default pipeline, where the rewrite is frozenconst's).
    from frozenconst import _jaxprs

    monkeypatch.setattr(_jaxprs, "has_input_effects", lambda jaxpr: True)
    data = unique_data((64, 64))
    x = FrozenConst(data)
    f = jax.jit(lambda w: jax.lax.scan(lambda c, _: (x @ c, None), w, None, length=2)[0] + x[0])
    w = jnp.ones(64) / 64
    expected = on_device(data) @ (on_device(data) @ np.asarray(w)) + on_device(data)[0]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = f(w)
    assert_float32_close(got, expected, np.abs(data) @ (np.abs(data) @ np.asarray(w)) + np.abs(data)[0])
    told = [str(w.message) for w in said if issubclass(w.category, FrozenConstWarning)]
    if not SIMPLIFIED:
        assert len(f.lower(w).as_text()) > data.nbytes
        assert len(told) == 1 and "is embedded in the compiled program" in told[0], told
    else:
        assert told == []


def test_without_page_locked_memory_pinned_is_pageable_and_said_once(monkeypatch):
    # What a JAX whose devices offer no `pinned_host` runs; forced on any other.
    if pinned_host_offered():
        monkeypatch.setattr(_host_memory, "offers_pinned_host", lambda device: False)
    data = unique_data((16, 16))
    x = FrozenConst(data, host_memory="pinned")
    y = FrozenConst(data + 1, host_memory="pinned")
    assert x.host_memory == "pinned"  # as asked, until a device says otherwise
    with pytest.warns(FrozenConstWarning, match="offer no page-locked") as record:
        a = jnp.asarray(x)
        jnp.asarray(y)
    assert len(_degraded(record)) == 1
    assert x.host_memory == y.host_memory == x.stats().host_memory == "pageable"
    np.testing.assert_array_equal(np.asarray(a), data, strict=True)
    if on_cpu():  # today's path: the device buffer aliases the host copy
        assert a.unsafe_buffer_pointer() == np.asarray(x).ctypes.data
    assert x.stats().host_bytes == data.nbytes
    assert FrozenConst(data).host_memory == "pageable"  # auto asks nothing of the device, and says nothing


def test_without_an_uncommitted_wrapper_the_default_buffer_is_read_through_numpy(monkeypatch):
    if not pinned_host_offered():
        pytest.skip(f"jax {jax.__version__}'s CPU devices offer no pinned_host memory")
    monkeypatch.setattr(_host_memory, "uncommitted", lambda array: None)
    data = unique_data((16, 16))
    x, y = FrozenConst(data, host_memory="pinned"), FrozenConst(data + 1, host_memory="pinned")
    jnp.asarray(x), jnp.asarray(y)  # first transfers, from the NumPy copies; then page-locked copies
    x.evict(), y.evict()
    with pytest.warns(FrozenConstWarning, match="cannot keep a default-device buffer") as record:
        a = jnp.asarray(x)
        y.__jax_array__()
    assert len(_degraded(record)) == 1
    assert not a.committed and jnp.asarray(x) is a
    np.testing.assert_array_equal(np.asarray(a), data, strict=True)
    committed = x.on(jax.devices()[0])  # committing the default buffer: the same buffer
    assert committed.committed and committed.unsafe_buffer_pointer() == a.unsafe_buffer_pointer()
    assert live_copies(data) == 1
    # On CPU, JAX aliases the frozen NumPy copy (jax #37830) instead of copying it.
    assert (a.unsafe_buffer_pointer() == np.asarray(x).ctypes.data) == on_cpu()


def test_without_a_mesh_reader_a_bare_partition_spec_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(_targets, "active_mesh", lambda: None)
    mesh = jax.make_mesh((1,), ("x",))
    with (
        _use_mesh(mesh),
        pytest.raises(frozenconst.FrozenConstValueError, match=r"NamedSharding\(mesh, spec\)"),
    ):
        FrozenConst(np.ones(4), sharding=jax.sharding.PartitionSpec("x"))


def test_the_mesh_read_from_jaxs_state_when_get_mesh_is_missing(monkeypatch):
    monkeypatch.delattr(jax.sharding, "get_mesh", raising=False)
    mesh = jax.make_mesh((1,), ("x",))
    with _use_mesh(mesh):
        x = FrozenConst(np.arange(4.0), sharding=jax.sharding.PartitionSpec("x"))
    assert x.declared_sharding == jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    assert _compat.active_mesh() is None


def test_the_mesh_read_from_jaxs_state_inside_a_trace_where_get_mesh_refuses():
    # `jax.sharding.get_mesh` raises inside `jax.jit` (jax >= 0.8); the state it reads does not.
    mesh = jax.make_mesh((1,), ("x",))
    seen = []
    with _use_mesh(mesh):
        jax.jit(lambda v: seen.append(_compat.active_mesh()) or v)(1.0)
    assert seen == [mesh]


def test_without_any_mesh_reader_a_bare_partition_spec_is_refused_by_name(monkeypatch):
    monkeypatch.delattr(jax.sharding, "get_mesh", raising=False)
    monkeypatch.setattr(_compat, "_concrete_mesh", None)
    with pytest.raises(frozenconst.FrozenConstValueError, match=r"NamedSharding\(mesh, spec\)"):
        FrozenConst(np.ones(4), sharding=jax.sharding.PartitionSpec("x"))


def _use_mesh(mesh):
    # `jax.set_mesh` is public from jax 0.7.2; before, `jax.sharding.use_mesh`.
    return jax.set_mesh(mesh) if hasattr(jax, "set_mesh") else jax.sharding.use_mesh(mesh)


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n in dir(ml_dtypes)
        if isinstance(getattr(ml_dtypes, n), type) and n[:3] in ("flo", "int", "uin")
    ),
)
def test_ml_dtypes_categories_come_from_ml_dtypes_own_info(name):
    dtype = np.dtype(getattr(ml_dtypes, name))
    expected = "i" if name.startswith(("int", "uint")) else "f"
    assert _dtypes._ml_dtypes_kind(dtype) == expected
    assert _dtypes._ml_dtypes_kind(np.dtype(np.float32)) == ""


def _jax_at_least(major, minor):
    return tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (major, minor)


def test_a_frozenconsts_type_is_registered_where_bind_converts_operands_first():
    # Found on jax 0.10.2 and 0.12.0.1, where `Primitive.bind` converts each operand
    # (`dtypes.canonicalize_value`, refusing unregistered `__jax_array__` objects) before
    # asking its type; not on 0.6.2 and 0.9.2 (see `_compat`).
    assert (_compat._aval_table is not None) is _jax_at_least(0, 10)
    assert (_compat._find_aval_table() is not None) is _jax_at_least(0, 10)
    x = FrozenConst(np.arange(3.0, dtype=np.float32))
    if _compat._aval_table is not None:
        # Registered in both tables: JAX's type of it, and `jax.lax` takes it, as `jnp` does.
        assert jax.typeof(x) == jax.typeof(jnp.asarray(x))
        np.testing.assert_array_equal(np.asarray(jax.lax.neg(x)), -np.arange(3.0, dtype=np.float32))
        assert jax.__version__ not in JAX_LAX_REFUSES
    else:  # the fallback: jax.lax refuses it (JEP 28661), as the table of versions says
        assert jax.__version__ in JAX_LAX_REFUSES
        with pytest.raises((ValueError, TypeError, DeprecationWarning), match="__jax_array__"):
            jax.lax.neg(x)


def _bind(body):
    # A `Primitive.bind` whose code names what `body` names, as JAX's own does.
    namespace = {}
    exec(f"def bind(self, *args, **params):\n    {body}\n", namespace)
    return namespace["bind"]


def test_the_type_table_is_used_only_where_bind_refuses_array_likes_first(monkeypatch):
    from jax._src import core, dtypes

    # jax 0.9.2's order: the type of each operand first, no refusal before it.
    monkeypatch.setattr(core.Primitive, "bind", _bind("return canonicalize_value(self, args, typeof(args))"))
    assert _compat._find_aval_table() is None
    # jax 0.10.2's and 0.12.0.1's: `dtypes.canonicalize_value` of each operand, then its type.
    monkeypatch.setattr(core.Primitive, "bind", _bind("return typeof(dtypes.canonicalize_value(args))"))
    refuses_first = hasattr(dtypes, "canonicalize_value")  # jax 0.6.2 has none
    assert _compat._find_aval_table() is (core.pytype_aval_mappings if refuses_first else None)
    if refuses_first:
        # ... but only where that conversion refuses an object with `__jax_array__`.
        monkeypatch.setattr(dtypes, "canonicalize_value", lambda value: value)
        assert _compat._find_aval_table() is None


def test_without_a_registered_type_the_functions_that_ask_it_refuse_and_asarray_fixes_them(monkeypatch):
    # The fallback (and what runs on jax 0.6.2 and 0.9.2): nothing registered with JAX's
    # `core.typeof`, so `jax.typeof` refuses a FrozenConst in JAX's words, as does
    # `jnp.bincount`'s `weights` where bincount asks it first (jax >= 0.10; before, bincount
    # converts its weights first and takes one); the fix docs/jax.md gives, `jnp.asarray(x)`,
    # works; functions that convert first are unchanged.
    x = FrozenConst(np.array([0.5, 2.0, 1.0], np.float32))
    counts = jnp.array([0, 2, 2])
    expected = jnp.bincount(counts, jnp.asarray(np.asarray(x)), length=3)
    registered = _compat._aval_table is not None
    if registered:
        np.testing.assert_array_equal(jnp.bincount(counts, x, length=3), expected)
        assert jax.typeof(x) == jax.typeof(jnp.asarray(x))
        monkeypatch.delitem(_compat._aval_table, FrozenConst)  # JAX's own table; put back afterwards
    with pytest.raises((ValueError, DeprecationWarning), match="__jax_array__"):
        jax.typeof(x)
    if registered:  # the JAX that asks `typeof` in bincount, unregistered: refused
        with pytest.raises(ValueError, match="__jax_array__"):
            jnp.bincount(counts, x, length=3)
    else:
        np.testing.assert_array_equal(jnp.bincount(counts, x, length=3), expected)
    np.testing.assert_array_equal(jnp.bincount(counts, jnp.asarray(x), length=3), expected)
    np.testing.assert_array_equal(jnp.sum(x), np.float32(3.5))


# Every public hook removed from JAX before frozenconst is imported: what
# `_compat` then finds, and a workload that touches each of them.
_WITHOUT_PUBLIC_HOOKS = textwrap.dedent(
    """
    import gc, json, warnings, weakref
    import jax, jax.core, jax.extend.backend, jax.extend.core, jax.sharding
    import numpy as np, jax.numpy as jnp
    for module, name in [(jax.core, "eval_context")]:
        if hasattr(module, name):
            delattr(module, name)
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as record:
        import frozenconst
        from frozenconst import FrozenConst, _compat
        data = np.arange(64, dtype=np.float32).reshape(8, 8)
        c = FrozenConst(data)
        f = frozenconst.jit(lambda w: jax.lax.scan(lambda h, _: (c @ h, None), c @ w, None, length=1)[0])
        out = np.asarray(f(jnp.ones(8)))
        shape = jax.eval_shape(lambda w: c @ w, jnp.ones(8)).shape
    print(json.dumps({
        "eval_context_fallback": _compat.eval_context is jax.ensure_compile_time_eval,
        "right": bool(np.allclose(out, data @ (data @ np.ones(8)), rtol=1e-6)),
        "shape": list(shape),
        "warnings": [str(w.message) for w in record if w.category is frozenconst.FrozenConstWarning],
    }))
    """
)


@pytest.mark.subprocess
def test_with_public_hooks_removed_the_private_ones_are_found_and_results_hold():
    code, out = run_bounded([sys.executable, "-c", _WITHOUT_PUBLIC_HOOKS], env=subprocess_env())
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["eval_context_fallback"] is True
    assert report["right"] is True and report["shape"] == [8]
    assert report["warnings"] == []  # nothing these fallbacks do costs anything


def test_without_jaxs_autodiff_tracers_every_tracer_is_stopped_and_gradients_are_the_same(monkeypatch):
    # `_compat.DIFFERENTIATED` falls back to every tracer: the constant still has no
    # gradient, and the others are what they are; traced programs gain a stop_gradient.
    from frozenconst import _derived

    tree = {"w": jnp.full(3, 0.5), "c": FrozenConst(np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3))}

    def loss(t):
        return jnp.sum(jnp.tanh(t["c"] @ t["w"]) ** 2)

    with pytest.warns(FrozenConstWarning, match="not the constant's own buffer"):
        expected = jax.grad(loss)(tree)
    monkeypatch.setattr(_derived, "DIFFERENTIATED", (_compat.Tracer,))
    with pytest.warns(FrozenConstWarning, match="not the constant's own buffer"):
        got = jax.jit(jax.grad(loss))(tree)
    np.testing.assert_array_equal(np.asarray(got["c"]), np.zeros((2, 3)))
    np.testing.assert_allclose(np.asarray(got["w"]), np.asarray(expected["w"]), rtol=1e-6)
    assert "stop_gradient" in str(jax.make_jaxpr(lambda t: t["c"] * 1)(tree))
    monkeypatch.undo()
    assert "stop_gradient" not in str(jax.make_jaxpr(lambda t: t["c"] * 1)(tree))
    assert (_compat.Tracer,) != _compat.DIFFERENTIATED  # found on every supported JAX


@pytest.mark.parametrize("name", ["__matmul__", "__add__", "__rsub__", "__truediv__", "__lt__", "__eq__"])
def test_without_jaxs_array_class_operators_and_attributes_are_found_by_name(monkeypatch, name):
    # `_compat.ArrayImpl` (private `jax._src.array.ArrayImpl`) falls back to None: each
    # operator looks `jax.Array`'s function up by name on the buffer, with the same result,
    # and the forwarded attributes are still every name `jax.Array` declares.
    from frozenconst import _frozen

    assert _compat.ArrayImpl is not None  # found on every supported JAX
    x = FrozenConst(unique_data((3, 3)))
    w = jnp.asarray(unique_data((3, 3)))
    expected = getattr(jnp.asarray(x), name)(w)
    monkeypatch.setattr(_compat, "ArrayImpl", None)
    monkeypatch.setattr(_frozen, "ArrayImpl", None)
    public = {n for n in dir(jax.Array) if not n.startswith("_")}
    assert public <= _compat.array_attributes()
    by_name = _frozen._forward_binary(name)
    np.testing.assert_array_equal(np.asarray(by_name(x, w)), np.asarray(expected))
    np.testing.assert_array_equal(np.asarray(by_name(x, FrozenConst(w))), np.asarray(expected))
    # Inside a transformation the buffer is a tracer, found by name with or without the class.
    traced = jax.jit(lambda v: by_name(FrozenConst(np.asarray(x)), v))(w)
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(expected))


def test_without_jaxs_array_class_a_constant_rebuilds_as_itself_and_a_new_array_as_a_copy(monkeypatch):
    # `FrozenConst.tree_unflatten` takes a concrete `ArrayImpl` leaf's case first; with the
    # class not found (`_compat.ArrayImpl` None) every leaf goes the other way, which must
    # still find the constant's own buffer (the identity through `jax.jit`) and NumPy data.
    from frozenconst import _derived

    x = FrozenConst(unique_data((3, 3)))
    own = jnp.asarray(x)
    monkeypatch.setattr(_derived, "ArrayImpl", None)
    back = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(x), [own])
    assert back.is_concrete and jnp.asarray(back) is own
    through = jax.jit(lambda t: t)(x)  # the output is a new buffer: a copy, not the constant
    assert not through.is_concrete
    np.testing.assert_array_equal(np.asarray(through), np.asarray(x))
    host = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(x), [np.asarray(x)])
    assert type(host) is np.ndarray


@pytest.mark.parametrize("jax_functions", [True, False], ids=["jax's functions", "the class"])
def test_a_one_device_sharding_is_made_and_known_with_or_without_jaxs_functions(monkeypatch, jax_functions):
    # jax 0.12.1 makes and recognises it through `jax.sharding.make_single_device_sharding` and
    # `is_single_device_sharding`; before, through the class alone (forced here where JAX has both).
    if not jax_functions:
        monkeypatch.setattr(_compat, "_MAKE_SINGLE", None)
        monkeypatch.setattr(_compat, "_IS_SINGLE", None)
    device = jax.devices()[0]
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", "jax.sharding.SingleDeviceSharding is deprecated", DeprecationWarning
        )
        made = _compat.single_device_sharding(device, memory_kind=None)
        named = jax.sharding.NamedSharding(jax.make_mesh((1,), ("x",)), jax.sharding.PartitionSpec())
        assert _compat.is_single_device_sharding(made) and made.device_set == {device}
        assert not _compat.is_single_device_sharding(named) and not _compat.is_single_device_sharding(device)
        data = unique_data((4, 4))
        x = FrozenConst(data, sharding=made)
        assert x.declared_sharding == made == x.placed(device).declared_sharding
        y = pickle.loads(pickle.dumps(x))  # the sharding described and rebuilt
        assert y.declared_sharding == made
        np.testing.assert_array_equal(np.asarray(y.on(device)), data, strict=True)


@pytest.mark.parametrize("broken", ["absent", "raises"])
def test_without_jaxs_array_constructor_each_constant_keeps_the_buffer_jax_made(monkeypatch, broken):
    # `_compat.shared_sharding` rewraps a constant's buffer with one sharding object per device
    # through private `ArrayImpl`; absent or refusing, each buffer keeps the object
    # `jax.device_put` gave it (one per call, on every supported JAX: the day that changes, this
    # count says the workaround can go): correct values, uncommitted, one transfer each.
    def refuse(*args, **kwargs):
        raise TypeError("a changed constructor")

    monkeypatch.setattr(_compat, "ArrayImpl", None if broken == "absent" else refuse)
    data = [unique_data((4, 4)) for _ in range(3)]
    consts = [FrozenConst(d) for d in data]
    buffers = [jnp.asarray(c) for c in consts]
    assert len({id(b.sharding) for b in buffers}) == 3
    for c, b, d in zip(consts, buffers, data, strict=True):
        assert not b.committed and jnp.asarray(c) is b
        np.testing.assert_array_equal(np.asarray(b), d)
    monkeypatch.undo()
    assert _compat.ArrayImpl is not None  # found on every supported JAX
