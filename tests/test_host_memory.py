"""Where the host copy lives: `host_memory="auto" | "pinned" | "pageable"` (docs/host-memory.md).

On CPU, `auto` is pageable (the device buffer aliases the host copy); forcing
`pinned` exercises the page-locked path an accelerator takes, on any JAX whose
CPU devices offer `pinned_host` memory (0.9.2 and later; 0.6.2 offers none, and
its fallback is tested in test_compat_fallbacks.py). What the page-locked copy
is, is observed through JAX: the live `jax.Array` in `pinned_host` memory.
"""

import contextlib
import gc
import pickle
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    enable_x64,
    live_copies,
    pinned_host_offered,
    requires_cpu,
    run_bounded,
    run_processes,
    subprocess_env,
    unique_data,
)
from jax.sharding import SingleDeviceSharding

import frozenconst

# Nothing public shows whether `auto` asked a device or started a backend, nor makes page-locking
# fail or a once-a-process warning repeat: those are read or replaced inside.
from frozenconst import FrozenConst, FrozenConstTypeError, FrozenConstValueError, _host

needs_pinned = pytest.mark.skipif(
    not pinned_host_offered(),
    reason=f"jax {jax.__version__}'s CPU devices offer no pinned_host memory (see test_compat_fallbacks.py)",
)


def _pinned_arrays():
    """Every live `jax.Array` JAX holds in page-locked host memory."""
    gc.collect()
    return [a for a in jax.live_arrays() if not a.is_deleted() and a.sharding.memory_kind == "pinned_host"]


def _owner(view: np.ndarray):
    """What a NumPy view's base chain ends in (the page-locked jax.Array, for a pinned constant)."""
    base = view
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _page_locked_buffer(x: FrozenConst):
    """The live page-locked `jax.Array` whose memory `np.asarray(x)` views, found through JAX, or None."""
    address = np.asarray(x).ctypes.data
    found = [a for a in _pinned_arrays() if a.unsafe_buffer_pointer() == address]
    return found[0] if found else None


# -- the choice, validated -----------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ("locked", FrozenConstValueError, r"'auto', 'pinned' or 'pageable', but received 'locked'"),
        ("PINNED", FrozenConstValueError, "received 'PINNED'"),
        ("", FrozenConstValueError, "received ''"),
        (1, FrozenConstTypeError, r"received a `int`"),
        (b"pinned", FrozenConstTypeError, r"received a `bytes`"),
        (np.array(["pinned"]), FrozenConstTypeError, r"received a `ndarray`"),
    ],
)
def test_a_bad_host_memory_is_refused_by_name(bad, error, match):
    with pytest.raises(error, match=match) as info:
        FrozenConst(np.ones(3), host_memory=bad)
    assert isinstance(info.value, (TypeError, ValueError)) and "host_memory" in str(info.value)
    sharding = SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(error, match=match):
        FrozenConst.from_callback((3,), sharding, lambda index: np.ones(3)[index], host_memory=bad)


def test_a_bad_environment_default_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("FROZENCONST_HOST_MEMORY", "fast")
    with pytest.raises(
        FrozenConstValueError, match=r"`FROZENCONST_HOST_MEMORY` is 'fast'.*'auto', 'pinned' or 'pageable'"
    ):
        FrozenConst(np.ones(3))
    FrozenConst(np.ones(3), host_memory="pageable")  # an argument overrides the environment
    monkeypatch.setenv("FROZENCONST_HOST_MEMORY", "")
    assert FrozenConst(np.ones(3)).host_memory == FrozenConst(np.ones(3), host_memory="auto").host_memory


def test_auto_and_pageable_keep_the_cpu_path_zero_copy(monkeypatch):
    monkeypatch.delenv("FROZENCONST_HOST_MEMORY", raising=False)
    requires_cpu("aliasing")  # on an accelerator, auto is page-locked memory
    for x in (FrozenConst(unique_data()), FrozenConst(unique_data(), host_memory="pageable")):
        assert x.host_memory == x.stats().host_memory == "pageable"
        assert _page_locked_buffer(x) is None
        assert jnp.asarray(x).unsafe_buffer_pointer() == np.asarray(x).ctypes.data  # 1.00x
        assert x.stats().zero_copy is True


def test_auto_never_starts_a_backend_and_never_pins_a_memory_map(tmp_path):
    def no_device():
        raise AssertionError("auto asked for the default device")

    host = np.ones(4, np.float32)
    assert _host.host_buffer(host, "auto", no_device, mapped=True) == (host, None)
    assert _host.host_buffer(host, "pageable", no_device) == (host, None)
    code = """
        import jax, numpy as np
        from frozenconst import FrozenConst, _compat
        x = FrozenConst(np.ones(1024))
        assert not _compat.backends_started(), "building a constant started JAX's backend"
        jax.devices()
        assert _compat.backends_started(), "the probe cannot see a started backend"
        assert x.host_memory == "pageable"
        print("not started")
        """
    rc, out = run_bounded([sys.executable, "-c", textwrap.dedent(code)], env=subprocess_env())
    assert rc == 0 and "not started" in out, out


# -- page-locked: one host copy, read-only, the same data ------------------------------


@needs_pinned
def test_pinned_holds_one_host_copy_that_numpy_views_in_place():
    data = unique_data((256, 64))
    x = FrozenConst(data, host_memory="pinned")
    assert x.host_memory == x.stats().host_memory == "pinned"
    buffer = _page_locked_buffer(x)
    assert buffer is not None, "np.asarray(x) is not a view of a page-locked jax.Array"
    assert buffer.shape == data.shape and buffer.dtype == data.dtype
    # One page-locked array holds the data, and no device copy before the first use.
    # JAX may hold two handles on one buffer (as it does while compiling): buffers are addresses.
    holding = {a.unsafe_buffer_pointer() for a in _pinned_arrays() if np.array_equal(np.asarray(a), data)}
    assert holding == {buffer.unsafe_buffer_pointer()} and _owner(np.asarray(x)) is x._store._pinned
    assert live_copies(data) == 0
    np.testing.assert_array_equal(np.asarray(x), data, strict=True)
    assert np.shares_memory(np.asarray(x), np.asarray(x))  # each view is of the one buffer
    s = x.stats()
    assert (s.host_bytes, s.transfers, s.placements, s.zero_copy) == (data.nbytes, 0, 0, None)


@needs_pinned
def test_pinned_device_buffers_are_device_memory_counted_apart_from_the_host_copy():
    data = unique_data((128, 32))
    gc.collect()
    before = frozenconst.stats()
    x = FrozenConst(data, host_memory="pinned")
    a = jnp.asarray(x)
    assert a.sharding.memory_kind == jax.devices()[0].default_memory().kind
    assert not a.committed  # the default buffer follows `jax.default_device`, as jnp.asarray(np_array)
    assert jnp.asarray(x) is a
    committed = x.on(jax.devices()[0])
    assert committed.committed and committed.unsafe_buffer_pointer() == a.unsafe_buffer_pointer()
    # JAX copies page-locked memory into device memory, also on CPU: no alias.
    assert a.unsafe_buffer_pointer() != np.asarray(x).ctypes.data
    assert live_copies(data) == 1
    s = x.stats()
    device = jax.devices()[0]
    assert (s.host_bytes, dict(s.device_bytes), s.transfers, s.zero_copy) == (
        data.nbytes,
        {device: data.nbytes},
        1,
        False,
    )
    after = frozenconst.stats()
    assert after.host_bytes - before.host_bytes == data.nbytes
    assert after.pinned_bytes - before.pinned_bytes == data.nbytes
    assert after.device_bytes[device] - before.device_bytes.get(device, 0) == data.nbytes
    assert after.aliased_bytes == before.aliased_bytes


@needs_pinned
def test_pinned_memory_can_never_be_written():
    x = FrozenConst(np.arange(100, dtype=np.float32), host_memory="pinned")
    buffer = _page_locked_buffer(x)
    views = [np.asarray(x), np.array(x, copy=False), x.__array__(), np.from_dlpack(x)]
    views += [np.asarray(buffer), np.from_dlpack(buffer)]  # JAX's own exports of the page-locked array
    for view in views:
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            view.flags.writeable = True
        base = view
        while base is not None:
            if isinstance(base, np.ndarray):
                with pytest.raises(ValueError, match="WRITEABLE"):
                    base.flags.writeable = True
            elif isinstance(base, memoryview):
                assert base.readonly
            base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(base, "obj", None)
    # Donating the page-locked array copies instead (JAX keeps a buffer NumPy views): the data stays.
    sharding = buffer.sharding
    with contextlib.suppress(Exception):  # jax 0.9.2 cannot compile for host memory: nothing donated
        jax.jit(lambda t: t * 0 - 7, donate_argnums=0, out_shardings=sharding)(buffer).block_until_ready()
    np.testing.assert_array_equal(np.asarray(x), np.arange(100, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), np.arange(100, dtype=np.float32))


@needs_pinned
def test_pinned_and_pageable_read_the_same_data_in_pickles_and_fingerprints():
    data = unique_data((16, 8))
    pinned, pageable = FrozenConst(data, host_memory="pinned"), FrozenConst(data, host_memory="pageable")
    assert pinned.fingerprint == pageable.fingerprint
    assert pickle.dumps(pinned) == pickle.dumps(pageable)
    again = pickle.loads(pickle.dumps(pinned))  # the unpickling process's default (auto here)
    assert again.host_memory == FrozenConst(data).host_memory and again.fingerprint == pinned.fingerprint
    np.testing.assert_array_equal(np.asarray(again), data, strict=True)
    assert repr(pinned) == repr(pageable)


@needs_pinned
def test_frozenconst_of_a_constant_moves_its_host_copy_only_when_asked():
    data = unique_data((8, 8))
    x = FrozenConst(data, host_memory="pinned")
    assert FrozenConst(x)._store is x._store and FrozenConst(x, host_memory="auto")._store is x._store
    assert FrozenConst(x, host_memory="pinned")._store is x._store
    y = FrozenConst(x, host_memory="pageable")
    assert y.host_memory == "pageable" and not np.shares_memory(np.asarray(x), np.asarray(y))
    z = FrozenConst(y, host_memory="pinned")
    assert z.host_memory == "pinned" and _page_locked_buffer(z) is not None
    for c in (y, z):
        np.testing.assert_array_equal(np.asarray(c), data, strict=True)
        np.testing.assert_array_equal(np.asarray(jnp.asarray(c)), data, strict=True)
    half = FrozenConst(x, dtype=np.float16, host_memory="pinned")  # a converted copy, page-locked too
    assert half.host_memory == "pinned" and half.host_dtype == np.float16


@needs_pinned
def test_eviction_donation_and_deletion_transfer_again_from_the_host_copy():
    data = unique_data((64, 16))
    x = FrozenConst(data, host_memory="pinned")
    buffer = _page_locked_buffer(x)
    a = jnp.asarray(x)
    x.evict()
    del a
    assert live_copies(data) == 0 and _page_locked_buffer(x) is buffer  # eviction keeps the host copy
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data)
    # A jitted call donating the constant keeps its buffer: nothing to refill.
    with warnings.catch_warnings():
        warnings.simplefilter("error", frozenconst.FrozenConstWarning)
        jax.jit(lambda v: v * 2, donate_argnums=0)(x).block_until_ready()
    assert not jnp.asarray(x).is_deleted() and x.stats().transfers == 2
    # Donated to a program compiled ahead of time, it is deleted, and transferred again.
    jax.jit(lambda v: v * 2, donate_argnums=0).lower(x).compile()(x).block_until_ready()
    with pytest.warns(frozenconst.FrozenConstWarning, match="was deleted"):
        np.testing.assert_array_equal(np.asarray(x + 0), data)  # refilled
    assert x.stats().transfers == 3
    # The page-locked array deleted behind frozenconst's back (reached through the view's
    # base): its memory lives on while NumPy views it, and transfers read it through NumPy.
    _owner(np.asarray(x)).delete()
    x.evict()
    again = jnp.asarray(x)
    assert not again.committed
    np.testing.assert_array_equal(np.asarray(again), data)
    np.testing.assert_array_equal(np.asarray(x), data)


@needs_pinned
def test_pinned_jit_paths_pass_the_device_buffer_and_embed_nothing():
    data = unique_data((512, 64))  # 128 KiB
    x = FrozenConst(data, host_memory="pinned")
    w = jnp.ones(64, np.float32)
    want = np.asarray(jax.jit(lambda d, v: d @ v)(jnp.asarray(data), w))
    closure = frozenconst.jit(lambda v: x @ v)
    np.testing.assert_array_equal(np.asarray(closure(w)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda c, v: c @ v)(x, w)), want)
    assert len(closure.lower(w).as_text()) * 20 < data.nbytes  # a parameter: no constant data in the program
    assert live_copies(data) == 1 and x.stats().transfers == 1


@needs_pinned
def test_pinned_memory_map_is_honoured_and_copied_from_the_map(tmp_path):
    data = unique_data((512, 16))
    path = tmp_path / "t.npy"
    np.save(path, data)
    mapped = np.load(path, mmap_mode="r")
    assert FrozenConst(mapped).host_memory == "pageable"  # auto never pins a map
    x = FrozenConst(mapped, host_memory="pinned")  # asked for: honoured
    assert x.host_memory == "pinned" and _page_locked_buffer(x) is not None
    np.testing.assert_array_equal(np.asarray(x), data, strict=True)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data, strict=True)


@needs_pinned
def test_from_callback_assembled_whole_is_pinned_where_asked():
    data = unique_data((8, 4))
    sharding = SingleDeviceSharding(jax.devices()[0])
    x = FrozenConst.from_callback((8, 4), sharding, lambda index: data[index], host_memory="pinned")
    assert x.host_memory == "pinned" and _page_locked_buffer(x) is not None
    np.testing.assert_array_equal(np.asarray(x.on(sharding)), data, strict=True)


@needs_pinned
@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: FrozenConst(np.arange(6), dtype=jnp.int4, host_memory="pinned"), "JAX packs int4"),
        (lambda: FrozenConst(np.arange(6.0), dtype=np.float64, host_memory="pinned"), "no float64 array"),
    ],
    ids=["int4", "float64 without x64"],
)
def test_what_numpy_cannot_view_in_page_locked_memory_stays_pageable_with_one_warning(make, why):
    frozenconst._compat.warn_degraded.cache_clear()
    with pytest.warns(frozenconst.FrozenConstWarning, match=why):
        x = make()
    assert x.host_memory == "pageable"
    np.testing.assert_array_equal(
        np.asarray(jnp.asarray(x)).astype(np.float32), np.arange(6.0, dtype=np.float32)
    )
    with enable_x64(True):  # with x64 on, JAX holds float64: page-locked as asked
        assert FrozenConst(np.arange(6.0), host_memory="pinned").host_memory == "pinned"


# -- memory, measured by the kernel ---------------------------------------------------

_RSS = """
import gc, json, os, sys
import jax, jax.numpy as jnp, numpy as np
import frozenconst
x64, host_memory, dtype = sys.argv[1] == "x64", sys.argv[2], sys.argv[3]
jax.config.update("jax_enable_x64", x64)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
jnp.zeros(1).block_until_ready()
src = np.random.default_rng(0).random((2048, 1024))  # NumPy's default dtype, float64: 16 MiB
gc.collect(); before = rss()
x = frozenconst.FrozenConst(src, dtype=None if dtype == "default" else dtype, host_memory=host_memory)
gc.collect(); built = rss()
device = jnp.asarray(x); device.block_until_ready()
gc.collect(); used = rss()
s = x.stats()
print(json.dumps({
    "host_dtype": str(x.host_dtype), "device_dtype": str(device.dtype), "host_memory": s.host_memory,
    "host_bytes": s.host_bytes, "device_bytes": sum(s.device_bytes.values()), "zero_copy": s.zero_copy,
    "built": built - before, "used": used - before,
}))
"""


# (x64, host_memory, dtype) of every measurement, each in a CPU process of its own.
_CASES = [(False, "pageable", "default"), (True, "pageable", "default"), (False, "pageable", "float64")]


@pytest.fixture(scope="module")
def measured():
    """What each case's process measured, the processes run side by side (host RSS: CPU only)."""
    import json

    cases = _CASES + ([(False, "pinned", "default")] if pinned_host_offered() else [])
    commands = [[sys.executable, "-c", _RSS, "x64" if x64 else "x32", h, d] for x64, h, d in cases]
    codes, outputs = run_processes(commands)
    assert codes == [0] * len(cases), outputs
    return {case: json.loads(out.strip().splitlines()[-1]) for case, out in zip(cases, outputs, strict=True)}


MIB = 1 << 20


@pytest.mark.subprocess
@pytest.mark.parametrize("x64", [False, True], ids=["x64 off", "x64 on"])
def test_numpys_default_dtype_costs_what_jax_holds_once(measured, x64):
    # `FrozenConst(np.random.rand(2048, 1024))`: 16 MiB of float64 source. Held as
    # `jnp.asarray` holds it, and on CPU the device buffer aliases the host copy:
    # 8 MiB in all without x64, 16 MiB with it (README: "1.00x").
    m = measured[(x64, "pageable", "default")]
    held = 16 * MIB if x64 else 8 * MIB
    assert (m["host_dtype"], m["device_dtype"]) == (("float64",) * 2 if x64 else ("float32",) * 2)
    assert (m["host_bytes"], m["device_bytes"], m["zero_copy"]) == (held, held, True)
    assert 0.9 * held <= m["built"] <= 1.1 * held + 2 * MIB, m
    assert 0.9 * held <= m["used"] <= 1.1 * held + 2 * MIB, m


@pytest.mark.subprocess
def test_float64_asked_for_without_x64_costs_both_copies(measured):
    m = measured[(False, "pageable", "float64")]
    assert (m["host_dtype"], m["device_dtype"], m["zero_copy"]) == ("float64", "float32", False)
    assert (m["host_bytes"], m["device_bytes"]) == (16 * MIB, 8 * MIB)
    assert 0.9 * 24 * MIB <= m["used"] <= 1.1 * 24 * MIB + 2 * MIB, m


@pytest.mark.subprocess
@needs_pinned
def test_pinned_on_cpu_holds_one_host_copy_and_a_device_copy_after_first_use(measured):
    m = measured[(False, "pinned", "default")]
    assert (m["host_memory"], m["host_bytes"], m["device_bytes"], m["zero_copy"]) == (
        "pinned",
        8 * MIB,
        8 * MIB,
        False,
    )
    assert 0.9 * 8 * MIB <= m["built"] <= 1.1 * 8 * MIB + 2 * MIB, m  # one host copy, none kept beside it
    assert 0.9 * 16 * MIB <= m["used"] <= 1.1 * 16 * MIB + 2 * MIB, m  # plus the device copy


@needs_pinned
def test_a_refused_page_locked_allocation_leaves_the_constant_pageable(monkeypatch):
    def refuse(host, device):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of pinned memory")

    monkeypatch.setattr(_host, "pin", refuse)
    frozenconst._compat.warn_degraded.cache_clear()
    data = unique_data((8, 8))
    with pytest.warns(frozenconst.FrozenConstWarning, match="could not page-lock it.*RESOURCE_EXHAUSTED"):
        x = FrozenConst(data, host_memory="pinned")
    assert x.host_memory == "pageable"
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data, strict=True)


@pytest.mark.host_memory
def test_the_pinned_variant_of_a_marked_test_pins_every_constant(_host_memory):
    # tests/conftest.py runs each `host_memory` test twice; this one checks that the
    # second run is what it says (every constant page-locked), the first the default.
    x = FrozenConst(np.ones(8, np.float32))
    if _host_memory == "pinned":
        assert x.host_memory == "pinned" and _page_locked_buffer(x) is not None
    else:
        assert x.host_memory == FrozenConst(np.ones(8, np.float32), host_memory="auto").host_memory
