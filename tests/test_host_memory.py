"""What transfers read: `host_memory="auto" | "pinned" | "pageable"` (docs/host-memory.md).

`auto` is pageable; `pinned` keeps a page-locked copy beside the frozen NumPy one, made from
the first device buffer, on any JAX whose devices offer `pinned_host` memory (the CPU's do from
jax 0.9.2; a device without it is tested in test_compat_fallbacks.py). Everything is observed
through JAX: the live `jax.Array`s in `pinned_host` memory, and JAX's transfer guard, which
refuses host data reaching a device and lets a page-locked `jax.Array` pass.
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
    single_device_sharding,
    subprocess_env,
    unique_data,
)

import frozenconst

# Nothing public shows whether `auto` asked a device or started a backend, nor makes page-locking
# fail or a once-a-process warning repeat: those are read or replaced inside.
from frozenconst import FrozenConst, FrozenConstTypeError, FrozenConstValueError, _host_memory

needs_pinned = pytest.mark.skipif(
    not pinned_host_offered(),
    reason=f"jax {jax.__version__}'s CPU devices offer no pinned_host memory (see test_compat_fallbacks.py)",
)


def _pinned_arrays():
    """Every live `jax.Array` JAX holds in page-locked host memory."""
    gc.collect()
    return [a for a in jax.live_arrays() if not a.is_deleted() and a.sharding.memory_kind == "pinned_host"]


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
    sharding = single_device_sharding(jax.devices()[0])
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
    requires_cpu("aliasing")
    for x in (FrozenConst(unique_data()), FrozenConst(unique_data(), host_memory="pageable")):
        assert x.host_memory == x.stats().host_memory == "pageable"
        assert jnp.asarray(x).unsafe_buffer_pointer() == np.asarray(x).ctypes.data  # 1.00x
        assert x.stats().zero_copy is True
        assert _page_locked_copies(np.asarray(x)) == []


def test_auto_is_pageable_and_building_a_constant_never_starts_a_backend():
    # A page-locked copy is a second host copy: `auto` never makes one, on any backend. And
    # building a constant never starts JAX's backend (`jax.distributed.initialize` must come
    # first): with no backend JAX could start, construction works and the first use raises JAX's error.
    code = """
        import numpy as np, jax.numpy as jnp
        from frozenconst import FrozenConst
        x = FrozenConst(np.ones(1024))
        y = FrozenConst(np.ones(1024), host_memory="pinned")
        assert x.host_memory == "pageable" and y.host_memory == "pinned"
        print("built")
        jnp.asarray(y)
        """
    env = {**subprocess_env(), "JAX_PLATFORMS": "no_such_platform"}
    rc, out = run_bounded([sys.executable, "-c", textwrap.dedent(code)], env=env)
    assert rc != 0 and "built" in out and "no_such_platform" in out, out


# -- page-locked: a second host copy, made from the first device buffer ------------------


def _page_locked_copies(data: np.ndarray):
    """The live page-locked buffers holding `data` (in the device dtype JAX gives it), an array
    for each: two `jax.Array`s over one buffer are one copy, as in `helpers.live_copies` (JAX
    may hold a second handle on an array a program closes over)."""
    copies = {}
    for a in _pinned_arrays():
        if a.shape == data.shape and np.array_equal(np.asarray(a), data):
            try:
                buffer = tuple(s.data.unsafe_buffer_pointer() for s in a.addressable_shards)
            except (jax.errors.JaxRuntimeError, NotImplementedError, ValueError):
                buffer = (id(a),)  # a backend that gives no address: each array its own
            copies.setdefault(buffer, a)
    return list(copies.values())


@contextlib.contextmanager
def _no_host_to_device():
    """Within: any transfer from host data (a NumPy array) to a device raises, as JAX's guard
    has it; a copy from a page-locked `jax.Array` is JAX's device-to-device and passes."""
    with jax.transfer_guard_host_to_device("disallow_explicit"):
        yield


@needs_pinned
def test_pinned_makes_its_page_locked_copy_at_the_first_transfer_and_reads_it_after():
    data = unique_data((256, 64))
    gc.collect()
    before = frozenconst.stats()
    x = FrozenConst(data, host_memory="pinned")
    # Construction makes no page-locked copy and transfers nothing.
    assert x.host_memory == x.stats().host_memory == "pinned"
    assert _page_locked_copies(data) == [] and live_copies(data) == 0
    assert (x.stats().host_bytes, x.stats().transfers) == (data.nbytes, 0)
    first = jnp.asarray(x)  # the first transfer reads the NumPy copy, as jax.device_put does
    np.testing.assert_array_equal(np.asarray(first), data, strict=True)
    assert not first.committed  # the default buffer follows `jax.default_device`
    (copy,) = _page_locked_copies(data)  # then the device copies itself into page-locked memory
    assert copy.dtype == first.dtype
    s, after = x.stats(), frozenconst.stats()
    assert (s.host_bytes, s.transfers, s.placements) == (2 * data.nbytes, 1, 1)
    assert after.pinned_bytes - before.pinned_bytes == data.nbytes
    assert after.host_bytes - before.host_bytes == 2 * data.nbytes
    # Every later transfer reads the page-locked copy: no host data reaches the device.
    x.evict()
    del first
    with _no_host_to_device():
        again = jnp.asarray(x)
        committed = x.on(jax.devices()[0])
    assert not again.committed and committed.committed
    np.testing.assert_array_equal(np.asarray(again), data, strict=True)
    np.testing.assert_array_equal(np.asarray(committed), data, strict=True)
    assert live_copies(data) == 1 and len(_page_locked_copies(data)) == 1
    # A pageable constant's second transfer reads host data: the guard refuses it.
    y = FrozenConst(data, host_memory="pageable")
    jnp.asarray(y)
    y.evict()
    with _no_host_to_device(), pytest.raises(Exception, match=r"(?i)disallowed host-to-device"):
        jnp.asarray(y)


@needs_pinned
def test_numpy_reads_the_frozen_copy_never_the_page_locked_one():
    data = np.arange(100, dtype=np.float32)
    x = FrozenConst(data, host_memory="pinned")
    jnp.asarray(x).block_until_ready()
    (copy,) = _page_locked_copies(data)
    views = [np.asarray(x), np.array(x, copy=False), x.__array__(), np.from_dlpack(x)]
    for view in views:
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            view.flags.writeable = True
        assert not np.shares_memory(view, np.asarray(copy))
    # Donating the page-locked array behind frozenconst's back: the next transfer is made from
    # the NumPy copy, and a new page-locked copy from it.
    sharding = copy.sharding
    with contextlib.suppress(Exception):  # a JAX that cannot compile for host memory: nothing donated
        jax.jit(lambda t: t * 0 - 7, donate_argnums=0, out_shardings=sharding)(copy).block_until_ready()
    copy.delete()
    x.evict()
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data)
    np.testing.assert_array_equal(np.asarray(x), data)
    assert len(_page_locked_copies(data)) == 1


@needs_pinned
def test_pinned_and_pageable_read_the_same_data_in_pickles_and_fingerprints():
    data = unique_data((16, 8))
    pinned, pageable = FrozenConst(data, host_memory="pinned"), FrozenConst(data, host_memory="pageable")
    jnp.asarray(pinned).block_until_ready()
    assert pinned.fingerprint == pageable.fingerprint
    assert pickle.dumps(pinned) == pickle.dumps(pageable)
    again = pickle.loads(pickle.dumps(pinned))  # the unpickling process's default (auto here)
    assert again.host_memory == FrozenConst(data).host_memory and again.fingerprint == pinned.fingerprint
    np.testing.assert_array_equal(np.asarray(again), data, strict=True)
    assert repr(pinned) == repr(pageable)


@needs_pinned
def test_frozenconst_of_a_constant_changes_its_host_memory_only_when_asked_sharing_the_numpy_copy():
    data = unique_data((8, 8))
    x = FrozenConst(data, host_memory="pinned")
    assert FrozenConst(x)._store is x._store and FrozenConst(x, host_memory="auto")._store is x._store
    assert FrozenConst(x, host_memory="pinned")._store is x._store
    y = FrozenConst(x, host_memory="pageable")
    z = FrozenConst(y, host_memory="pinned")
    assert (y.host_memory, z.host_memory) == ("pageable", "pinned")
    # The frozen NumPy copy nobody can write is shared, not copied.
    assert np.shares_memory(np.asarray(x), np.asarray(y)) and np.shares_memory(np.asarray(y), np.asarray(z))
    for c in (y, z):
        np.testing.assert_array_equal(np.asarray(c), data, strict=True)
        np.testing.assert_array_equal(np.asarray(jnp.asarray(c)), data, strict=True)
    half = FrozenConst(x, dtype=np.float16, host_memory="pinned")  # a converted copy, pinned too
    assert half.host_memory == "pinned" and half.host_dtype == np.float16


@needs_pinned
def test_a_donated_or_deleted_device_buffer_is_made_again_from_the_page_locked_copy():
    data = unique_data((64, 16))
    x = FrozenConst(data, host_memory="pinned")
    jnp.asarray(x).block_until_ready()
    # A jitted call donating the constant keeps its buffer: nothing to refill.
    with warnings.catch_warnings():
        warnings.simplefilter("error", frozenconst.FrozenConstWarning)
        jax.jit(lambda v: v * 2, donate_argnums=0)(x).block_until_ready()
    assert not jnp.asarray(x).is_deleted() and x.stats().transfers == 1
    # Donated to a program compiled ahead of time, it is deleted, and made again from the copy.
    jax.jit(lambda v: v * 2, donate_argnums=0).lower(x).compile()(x).block_until_ready()
    with pytest.warns(frozenconst.FrozenConstWarning, match="was deleted"), _no_host_to_device():
        again = jnp.asarray(x)
    np.testing.assert_array_equal(np.asarray(again), data)
    assert x.stats().transfers == 2


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
def test_pinned_memory_map_is_honoured(tmp_path):
    data = unique_data((512, 16))
    path = tmp_path / "t.npy"
    np.save(path, data)
    mapped = np.load(path, mmap_mode="r")
    assert FrozenConst(mapped).host_memory == "pageable"  # auto never pins
    x = FrozenConst(mapped, host_memory="pinned")  # asked for: honoured
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data, strict=True)
    assert x.host_memory == "pinned" and len(_page_locked_copies(data)) == 1
    np.testing.assert_array_equal(np.asarray(x), data, strict=True)


@needs_pinned
def test_from_callback_assembled_whole_is_pinned_where_asked():
    data = unique_data((8, 4))
    sharding = single_device_sharding(jax.devices()[0])
    x = FrozenConst.from_callback((8, 4), sharding, lambda index: data[index], host_memory="pinned")
    np.testing.assert_array_equal(np.asarray(x.on(sharding)), data, strict=True)
    assert x.host_memory == "pinned" and len(_page_locked_copies(data)) == 1


@needs_pinned
@pytest.mark.parametrize(
    ("dtype", "x64"),
    [
        *((jnp.int4, False), (jnp.float4_e2m1fn, False)),
        *((np.float64, False), (np.float64, True), (np.int64, True)),
    ],
    ids=["int4", "float4", "float64 without x64", "float64 with x64", "int64 with x64"],
)
def test_pinned_holds_every_dtype_jax_holds_in_the_device_dtype_without_a_warning(dtype, x64):
    if dtype is jnp.float4_e2m1fn and not frozenconst._dtypes.supported(np.dtype(dtype)):
        pytest.skip(f"jax {jax.__version__} holds no {np.dtype(dtype)}")
    source = np.arange(6.0) % 4
    with enable_x64(x64), warnings.catch_warnings():
        warnings.simplefilter("error", frozenconst.FrozenConstWarning)
        x = FrozenConst(source, dtype=dtype, host_memory="pinned")
        with warnings.catch_warnings():  # JAX's own "float64 is not available" without x64
            warnings.simplefilter("ignore", UserWarning)
            want = jnp.asarray(source, dtype=dtype)  # JAX's own answer, in the device dtype
        first = jnp.asarray(x)
        np.testing.assert_array_equal(np.asarray(first), np.asarray(want), strict=True)
        x.evict()
        with _no_host_to_device():  # the second transfer reads the page-locked copy
            again = jnp.asarray(x)
        assert again.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(again), np.asarray(want), strict=True)
    assert x.host_memory == "pinned"


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
# A pinned constant's page-locked copy is made without waiting: every buffer JAX holds, done.
jax.block_until_ready(jax.live_arrays())
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
def test_pinned_on_cpu_holds_the_frozen_copy_and_a_page_locked_copy_after_first_use(measured):
    m = measured[(False, "pinned", "default")]
    # The device buffer aliases the frozen copy (CPU), and the page-locked copy is the second.
    assert (m["host_memory"], m["host_bytes"], m["device_bytes"], m["zero_copy"]) == (
        "pinned",
        16 * MIB,
        8 * MIB,
        True,
    )
    assert 0.9 * 8 * MIB <= m["built"] <= 1.1 * 8 * MIB + 2 * MIB, m  # one host copy until the first use
    assert 0.9 * 16 * MIB <= m["used"] <= 1.1 * 16 * MIB + 2 * MIB, m  # plus the page-locked copy


@needs_pinned
def test_a_refused_page_locked_allocation_leaves_the_constant_on_its_numpy_copy(monkeypatch):
    def refuse(array, device):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of pinned memory")

    monkeypatch.setattr(_host_memory, "page_lock", refuse)
    frozenconst._frames.DEGRADED.forget()
    data = unique_data((8, 8))
    x = FrozenConst(data, host_memory="pinned")
    with pytest.warns(
        frozenconst.FrozenConstWarning, match="could not page-lock a copy.*RESOURCE_EXHAUSTED"
    ) as record:
        np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data, strict=True)
        x.evict()
        np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data, strict=True)
    assert len([r for r in record if issubclass(r.category, frozenconst.FrozenConstWarning)]) == 1
    assert _page_locked_copies(data) == []


@pytest.mark.host_memory
def test_the_pinned_variant_of_a_marked_test_pins_every_constant(_host_memory):
    # tests/conftest.py runs each `host_memory` test twice; this one checks that the
    # second run is what it says (every constant page-locked), the first the default.
    x = FrozenConst(np.ones(8, np.float32))
    if _host_memory == "pinned":
        jnp.asarray(x).block_until_ready()
        assert x.host_memory == "pinned" and len(_page_locked_copies(np.ones(8, np.float32))) >= 1
    else:
        assert x.host_memory == FrozenConst(np.ones(8, np.float32), host_memory="auto").host_memory
