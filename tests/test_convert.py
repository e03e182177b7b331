"""A construction is decided once (`host_plan`), and each of its checks reads the data once.

Every range check (a conversion by `dtype=` that could change a value's integer, JAX's
narrowing of 64-bit integers without x64) finds its bad values through `_out_of_range`,
so counting the values that function reads, per range, counts each check's passes over
the data: a check run twice reads every value twice.
"""

import collections
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import enable_x64

import frozenconst

# The function every range check scans with, the plan maker and the copy, counted and
# driven here: they have no public seam.
from frozenconst import FrozenConst, FrozenConstValueError, _convert, _dtypes, _frozen, _host

_ROWS = 300_000  # int64 rows: more than two of `_host`'s checked blocks (1 MiB each)


def _counted(monkeypatch, make: Callable[[], object]) -> tuple[dict[tuple[int, int], int], int, object]:
    """What `make()` read per range (values read by range checks, keyed by (lo, hi)), how many
    plans it made, and what it made."""
    scanned: collections.Counter[tuple[int, int]] = collections.Counter()
    plans = []
    real_scan, real_plan = _dtypes._out_of_range, _convert.host_plan

    def scan(values, lo, hi):
        scanned[lo, hi] += values.size
        return real_scan(values, lo, hi)

    def plan(*args, **kwargs):
        plans.append(args)
        return real_plan(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(_dtypes, "_out_of_range", scan)
        patch.setattr(_convert, "host_plan", plan)
        patch.setattr(_frozen, "host_plan", plan)
        made = make()
    return dict(scanned), len(plans), made


_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)
_INT8 = (-128, 127)
_INT16 = (-(2**15), 2**15 - 1)


def _cases(x64: bool):
    """(a name, the arguments, the ranges of the checks that must read every value once)."""
    narrow = not x64
    big = np.arange(_ROWS, dtype=np.int64) - _ROWS // 2
    floats = np.linspace(-1e6, 1e6, _ROWS)
    constant = FrozenConst(np.arange(1000), dtype=np.int64)
    yield "int64, as JAX holds it", (big,), [_INT32] if narrow else []
    yield "uint64, as JAX holds it", (big.astype(np.uint64) & 0xFFFF,), [_UINT32] if narrow else []
    yield "int64 asked as int64", (big, np.int64), [_INT32] if narrow else []
    yield "int64 to int32", (big, np.int32), [_INT32]
    yield "int64 to int16 (values fit)", (big // 16, np.int16), [_INT16]
    yield "float64 to int64", (floats, np.int64), [_INT64, _INT32] if narrow else [_INT64]
    yield "float64, as JAX holds it", (floats,), []
    yield "a byte-swapped int64", (big.astype(">i8"),), [_INT32] if narrow else []
    yield "a Python int", (3,), [_INT32] if narrow else []
    yield "a Python list of ints", ([1, 2, 3] * 100,), [_INT32] if narrow else []
    yield "a Python list to int8", ([1.5, -2.5] * 100, np.int8), [_INT8]
    yield "a Python float to int32", (2.5, np.int32), [_INT32]
    yield "a jax.Array to int8", (jnp.arange(100), np.int8), [_INT8]
    yield "a FrozenConst to int16", (constant, np.int16), [_INT16]
    yield "a FrozenConst as it is", (constant, np.int64), []


@pytest.mark.parametrize("build", [FrozenConst, frozenconst.intern], ids=["FrozenConst", "intern"])
@pytest.mark.parametrize("x64", [False, True], ids=["x64 off", "x64 on"])
def test_each_check_reads_the_data_once_per_construction(monkeypatch, build, x64):
    with enable_x64(x64):
        for name, args, ranges in _cases(x64):
            size = np.size(np.asarray(args[0]))
            copies = 0 if name == "a FrozenConst as it is" else 1
            scanned, plans, made = _counted(monkeypatch, lambda args=args: build(*args))
            assert scanned == {r: size for r in ranges}, name
            assert plans == copies, name  # decided once, where anything is copied
            held = np.asarray(args[0]).astype(made.host_dtype)  # what a cast holds (in range, truncated)
            np.testing.assert_array_equal(np.asarray(made), held, err_msg=name)


def test_the_count_sees_a_check_run_twice(monkeypatch):
    # The counting above can fail: the narrowing check run once more beside a construction
    # (as it was, before and during the copy) reads every value twice.
    data = np.arange(_ROWS, dtype=np.int64)
    with enable_x64(False):
        scanned, _, _ = _counted(
            monkeypatch, lambda: (_convert.check_narrowing(data, np.int32), FrozenConst(data))
        )
    assert scanned == {_INT32: 2 * data.size}


def test_the_plan_holds_every_decision():
    with enable_x64(False):
        plan = _convert.host_plan(np.array([1, 2**20]))
        assert (plan.dtype, plan.weak, plan.held_check) == (np.dtype(np.int32), False, None)
        plan.check(plan.source)  # the narrowing check: every value fits
        with pytest.raises(FrozenConstValueError, match=r"on a device as int32.*jax_enable_x64"):
            plan.check(np.array([2**40]))
        wide = _convert.host_plan(np.array([1, 2**40]), np.int64)
        assert (wide.dtype, wide.check) == (np.dtype(np.int64), None)
        with pytest.raises(FrozenConstValueError, match=r"on a device as int32.*1099511627776"):
            _host.freeze(wide)
        scalar = _convert.host_plan(0.5)
        assert (scalar.dtype, scalar.weak, scalar.check, scalar.held_check) == (np.float32, True, None, None)
    with enable_x64(True):
        plan = _convert.host_plan(np.array([1, 2**40]))
        assert (plan.dtype, plan.check, plan.held_check) == (np.dtype(np.int64), None, None)


@pytest.mark.parametrize("mode", ["r", "c"])
def test_a_checked_memory_map_is_copied_exactly_block_by_block(tmp_path, monkeypatch, mode):
    # Converted with a check, a memory-mapped source is read block by block too (pages handed
    # back as copied), and a bad value in its last block is still found.
    monkeypatch.setattr(_host, "_CHECKED_BLOCK_BYTES", 4000)
    data = np.arange(10_000, dtype=np.int64).reshape(1000, 10)
    path = tmp_path / "c.npy"
    np.save(path, data)
    with enable_x64(False):
        x = FrozenConst(np.load(path, mmap_mode=mode))
        assert x.host_dtype == np.int32
        np.testing.assert_array_equal(np.asarray(x), data)
        data[-1, -1] = 2**40
        np.save(path, data)
        with pytest.raises(FrozenConstValueError, match="1099511627776"):
            FrozenConst(np.load(path, mmap_mode=mode))
