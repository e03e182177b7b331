"""DLPack: a FrozenConst exports what `jnp.asarray(x)` holds, where it lives, never writable.

docs/jax.md, "DLPack", is the table these check, on whatever device runs them: on a
CPU device the frozen host buffer (which the device buffer aliases there), on an
accelerator the cached device buffer, as `jax.Array` exports its own; the host buffer
wherever a consumer asks for the CPU; a copy for a consumer of DLPack < 1.0.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import on_cpu, unique_data

from frozenconst import FrozenConst


class _Legacy:
    """A consumer's view of `obj` through DLPack < 1.0: `__dlpack__` without `max_version`."""

    def __init__(self, obj):
        self.obj = obj

    def __dlpack__(self, stream=None):
        return self.obj.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.obj.__dlpack_device__()


class _Recording:
    """A NumPy array that records the keywords its `__dlpack__` is called with."""

    def __init__(self, array):
        self.array, self.calls = array, []

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@functools.cache
def _jax_asks_for_dlpack_1():
    """Whether `jnp.from_dlpack` asks for DLPack >= 1.0 (`max_version`): jax 0.12 on, not 0.11.2."""
    probe = _Recording(np.arange(4.0, dtype=np.float32))
    jnp.from_dlpack(probe)
    return tuple(probe.calls[0].get("max_version") or (0, 0)) >= (1, 0)


def _pointer(a):
    return a.unsafe_buffer_pointer()


@functools.cache
def _jax_exports_no_device_buffer():
    """Whether JAX's DLPack refuses this device's memory (a TPU: "only supported for CPU and
    GPU"); a constant then exports its host buffer (docs/jax.md, "DLPack")."""
    try:
        jnp.zeros(1).__dlpack_device__()
    except BufferError:
        return True
    return False


def _host_exported():
    """Whether `x.__dlpack__()` hands out the frozen host buffer: on one CPU device (whose buffer
    aliases it) and where JAX exports no device memory."""
    return on_cpu() or _jax_exports_no_device_buffer()


def _dlpack_device_of(array):
    """Where a `jax.Array` exports from: its own answer, or the CPU's where JAX refuses."""
    return (1, 0) if _jax_exports_no_device_buffer() else array.__dlpack_device__()  # kDLCPU


def test_the_dlpack_device_is_that_of_jnp_asarray():
    x = FrozenConst(unique_data())
    assert x.__dlpack_device__() == _dlpack_device_of(jnp.asarray(x))
    device = jax.devices()[0]
    placed = x.placed(device)
    assert placed.__dlpack_device__() == _dlpack_device_of(jnp.asarray(placed))


def test_jnp_from_dlpack_is_the_constant_on_its_device():
    data = unique_data()
    x = FrozenConst(data)
    cached = jnp.asarray(x)
    got = jnp.from_dlpack(x)
    # Where JAX exports no device memory, the host buffer: a CPU array, as from NumPy's.
    where = {jax.devices("cpu")[0]} if _jax_exports_no_device_buffer() else cached.devices()
    assert got.devices() == where and got.dtype == cached.dtype
    np.testing.assert_array_equal(np.asarray(got), data)
    if not _jax_asks_for_dlpack_1():
        # DLPack < 1.0 cannot mark memory read-only: JAX receives a copy (jax <= 0.11).
        assert _pointer(got) not in (_pointer(cached), np.asarray(x).ctypes.data)
    elif on_cpu() or _jax_exports_no_device_buffer():  # JAX's CPU client takes it as it is
        assert _pointer(got) == np.asarray(x).ctypes.data  # the host buffer, no copy
    else:
        assert _pointer(got) == _pointer(cached)  # the cached device buffer, no copy
    np.testing.assert_array_equal(np.asarray(x), data)


def test_numpy_gets_the_host_data_read_only_and_shared_wherever_it_asks_for_the_cpu():
    data = unique_data()
    x = FrozenConst(data)
    view = np.from_dlpack(x, device="cpu")
    np.testing.assert_array_equal(view, data, strict=True)
    assert np.shares_memory(view, np.asarray(x))  # no device round trip, no copy
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="WRITEABLE"):
        view.flags.writeable = True
    shared = np.from_dlpack(x, device="cpu", copy=False)
    assert np.shares_memory(shared, np.asarray(x)) and not shared.flags.writeable
    # The host data as it is, in its own dtype, as `np.asarray(x)` gives it (`dtype=` keeps a
    # float64 host copy; without it the host holds what `jnp.asarray` holds, float32 without x64).
    wide = FrozenConst(data.astype(np.float64), dtype=np.float64)
    assert np.from_dlpack(wide, device="cpu").dtype == np.float64 == np.asarray(wide).dtype


def test_numpy_without_a_device_does_what_it_does_for_the_cached_array():
    x = FrozenConst(unique_data())
    cached = jnp.asarray(x)
    if _jax_exports_no_device_buffer():  # a TPU: the host buffer, read-only, as asked with "cpu"
        got = np.from_dlpack(x)
        assert np.shares_memory(got, np.asarray(x)) and not got.flags.writeable
        return
    try:
        expected = np.from_dlpack(cached)
    except Exception as err:  # an accelerator's memory: NumPy refuses it
        with pytest.raises(type(err)):
            np.from_dlpack(x)
        return
    got = np.from_dlpack(x)
    np.testing.assert_array_equal(got, expected, strict=True)
    assert not got.flags.writeable and not expected.flags.writeable


def test_a_copy_asked_for_is_the_consumers_own():
    data = unique_data()
    x = FrozenConst(data)
    mine = np.from_dlpack(x, device="cpu", copy=True)
    assert mine.flags.writeable and not np.shares_memory(mine, np.asarray(x))
    mine[...] = -1
    np.testing.assert_array_equal(np.asarray(x), data)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data)


@pytest.mark.parametrize("consumer", ["numpy", "jax"])
def test_a_consumer_of_dlpack_before_1_0_gets_a_copy_it_may_write(consumer):
    data = unique_data()
    x = FrozenConst(data)
    legacy = _Legacy(x)
    if consumer == "numpy":
        if not _host_exported():
            pytest.skip("NumPy reads only host memory, and a legacy consumer cannot ask for the CPU")
        got = np.from_dlpack(legacy)
        assert not np.shares_memory(got, np.asarray(x))
        if got.flags.writeable:  # DLPack < 1.0 carries no read-only flag
            got[...] = -1
    else:
        got = jnp.from_dlpack(legacy)
        assert _pointer(got) not in (_pointer(jnp.asarray(x)), np.asarray(x).ctypes.data)
        where = {jax.devices("cpu")[0]} if _jax_exports_no_device_buffer() else jnp.asarray(x).devices()
        assert got.devices() == where
    np.testing.assert_array_equal(np.asarray(x), data)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data)


def test_no_copy_for_a_consumer_of_dlpack_before_1_0_is_refused():
    x = FrozenConst(unique_data())
    with pytest.raises(BufferError, match=r"read-?only"):
        x.__dlpack__(copy=False)
    with pytest.raises(BufferError, match=r"read-?only"):
        x.__dlpack__(copy=False, dl_device=(1, 0))  # the host buffer, asked for by name
