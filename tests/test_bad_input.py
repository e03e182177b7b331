"""Bad input is refused, or held exactly.

`FrozenConst(obj, dtype=...)` either raises a FrozenConst error (or OverflowError)
whose message names what it received, or holds on the host and on every device
the values `jnp.asarray(obj, dtype=...)` holds under the same x64 setting.
"""

import math
import warnings

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import enable_x64, on_cpu
from hypothesis import given
from hypothesis import strategies as st

import frozenconst
from frozenconst import FrozenConst, FrozenConstTypeError, FrozenConstValueError

# The narrowing rule is also checked alone, beside the constructor that applies it; the
# candidates are the package's list of every dtype jax.numpy names, held or not by this JAX.
from frozenconst._convert import check_narrowing
from frozenconst._dtypes import SUPPORTED_DTYPES, aborts_on, supported

REFUSALS = (FrozenConstTypeError, FrozenConstValueError, OverflowError)
# Every dtype `jax.numpy` names, whether or not this JAX can hold it (jax 0.10
# names float6 types it cannot transfer): sources and `dtype=` targets alike.
CANDIDATES = sorted(SUPPORTED_DTYPES, key=lambda d: d.name)


def _bits(a) -> np.ndarray:
    """Raw bytes, so NaN payloads and -0.0 compare exactly."""
    return np.ascontiguousarray(np.asarray(a)).reshape(-1).view(np.uint8)


def _assert_as_jax_converts(held, converted) -> None:
    """Bit for bit what JAX's conversion gives, but where that ran on an accelerator: XLA's TPU
    conversion makes every NaN +NaN (float8_e4m3b11fnuz NaN to bfloat16: 0x7fc0), where
    ml_dtypes and NumPy, converting on the host, keep its sign (0xffc0). There a NaN is
    judged as a NaN, in the same places; every other element still bit for bit."""
    held, converted = np.asarray(held), np.asarray(converted)
    if on_cpu() or not jnp.issubdtype(held.dtype, jnp.inexact):
        np.testing.assert_array_equal(_bits(held), _bits(converted))
        return
    wide = np.complex128 if jnp.issubdtype(held.dtype, jnp.complexfloating) else np.float64
    nan = np.isnan(held.astype(wide))
    assert np.array_equal(nan, np.isnan(converted.astype(wide))), (held, converted)
    held, converted = held.copy(), converted.copy()
    held[nan], converted[nan] = 0, 0
    np.testing.assert_array_equal(_bits(held), _bits(converted))


def _reference(obj, dtype):
    """(jnp.asarray(obj, dtype=dtype) on the default device, None), or (None, what it raised).
    Where the default backend is not the CPU, JAX's conversion runs on its CPU backend, the same
    function of the same values, and its result is moved to the default device: XLA's TPU
    compiler aborts the whole process on some conversions instead of raising (TPU v5e, jax
    0.10.2: into int2 or uint2, SIGILL; another draw of this sweep, SIGABRT)."""
    if on_cpu():
        return _reference_here(obj, dtype)
    with jax.default_device(jax.devices("cpu")[0]):
        converted, error = _reference_here(obj, dtype)
    return (None, error) if converted is None else (jax.device_put(converted, jax.devices()[0]), None)


def _reference_here(obj, dtype):
    with warnings.catch_warnings():
        # Its "int64 is not available" UserWarning and NumPy's cast RuntimeWarnings.
        warnings.simplefilter("ignore")
        try:
            return jnp.asarray(obj, dtype=dtype), None
        except Exception as err:  # OverflowError, ValueError, TypeError, XLA's runtime errors
            return None, err


def _native(obj):
    # jnp.asarray refuses byte-swapped arrays outright (a limitation, not a value
    # check); FrozenConst converts them. Judge it against the same values in
    # native byte order.
    if isinstance(obj, np.ndarray) and not obj.dtype.isnative:
        return obj.astype(obj.dtype.newbyteorder("="))
    return obj


def _rounds_twice(obj, dtype, device_dtype) -> bool:
    # Integers asked for as float64 (complex128) without x64: the host holds them
    # rounded to float64 and the device rounds that to float32, where
    # jnp.asarray rounds once, straight to float32. The two can differ by one
    # float32 ulp (double rounding), so the device is judged against JAX's
    # narrowing of the host data there.
    if dtype is None or np.dtype(dtype) == device_dtype or np.dtype(dtype).kind not in "fc":
        return False
    return bool(jnp.issubdtype(np.asarray(_native(obj)).dtype, jnp.integer))


def check_rule(obj, dtype, x64: bool) -> str:
    """Assert the rule for one input; returns "refused" or "held"."""
    with enable_x64(x64):
        expected, expected_error = _reference(_native(obj), dtype)
        with warnings.catch_warnings():
            # Float narrowing overflows to inf with NumPy's RuntimeWarning, as in jnp.asarray.
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                x = FrozenConst(obj, dtype=dtype)
            except REFUSALS as err:
                assert f"`{type(obj).__name__}`" in str(err), str(err)
                return "refused"
            if aborts_on(jax.default_backend(), x.dtype):
                # A dtype the device's compiler aborts on (complex128 under x64 on a TPU): refused
                # at the transfer, with the host copy held.
                with pytest.raises(FrozenConstTypeError, match=f"cannot move {x.dtype} data"):
                    jnp.asarray(x)
                return "refused"
            device = jnp.asarray(x)
            host = np.asarray(x)
            # What JAX's transfer of the host copy gives (a TPU's float64 is not IEEE's: it rounds).
            transferred = jax.device_put(host.astype(device.dtype), *device.devices())
            if expected_error is None and _rounds_twice(obj, dtype, device.dtype):
                expected = _reference(host, None)[0]  # JAX's narrowing of the host data
    assert expected_error is None, f"FrozenConst accepted what jnp.asarray refuses: {expected_error!r}"
    assert device.dtype == expected.dtype and device.shape == expected.shape
    _assert_as_jax_converts(device, expected)
    # The host holds the same values as the device: equal after JAX's narrowing,
    # and, for integers, equal outright (nothing wrapped).
    assert host.shape == device.shape
    np.testing.assert_array_equal(_bits(transferred), _bits(device))
    if jnp.issubdtype(host.dtype, jnp.integer):
        assert np.array_equal(host, np.asarray(device))
    return "held"


# -- the inputs ---------------------------------------------------------------------

_EDGE_INTS = [
    *(2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32 - 1, 2**32),
    *(2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**100),
]
_EDGE_FLOATS = [math.nan, math.inf, -math.inf, 1e300, -1e300, 3.5e38, 2.0**31, -0.5, -1.5, 255.9, 256.0]

python_ints = st.integers() | st.sampled_from(_EDGE_INTS) | st.integers(-300, 300)
python_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(_EDGE_FLOATS)
python_complex = st.complex_numbers(allow_nan=True, allow_infinity=True)
python_scalars = st.one_of(st.booleans(), python_ints, python_floats, python_complex)


def _nest(flat, shape):
    if len(shape) == 1:
        return flat
    size = math.prod(shape[1:])
    return [_nest(flat[i * size : (i + 1) * size], shape[1:]) for i in range(shape[0])]


@st.composite
def nested_lists(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=3))
    leaves = draw(
        st.sampled_from(
            [st.booleans(), python_ints, python_floats, python_complex, python_ints | python_floats]
        )
    )
    flat = draw(st.lists(leaves, min_size=math.prod(shape), max_size=math.prod(shape)))
    nested = _nest(flat, shape)
    if draw(st.booleans()):
        nested = [tuple(row) if isinstance(row, list) else row for row in nested]  # tuples nest too
    return nested


@st.composite
def numpy_arrays(draw):
    dtype = draw(st.sampled_from(CANDIDATES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4))
    if dtype.type.__module__ == "numpy":
        data = draw(hnp.arrays(dtype, shape, elements=hnp.from_dtype(dtype, allow_nan=True)))
        if draw(st.booleans()) and dtype.itemsize > 1:
            data = data.astype(dtype.newbyteorder("S"))  # the other byte order, same values
        return data
    # ml_dtypes types: draw wide, round into the narrow type.
    try:
        info = ml_dtypes.iinfo(dtype)
        wide = draw(hnp.arrays(np.int64, shape, elements=st.integers(int(info.min), int(info.max))))
    except ValueError:
        finfo = ml_dtypes.finfo(dtype)
        big = float(finfo.max)
        wide = draw(hnp.arrays(np.float64, shape, elements=st.floats(-big, big) | st.just(math.nan)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return wide.astype(dtype)


targets = st.none() | st.sampled_from(CANDIDATES)


@given(python_scalars, targets, st.booleans())
def test_python_scalars(obj, dtype, x64):
    check_rule(obj, dtype, x64)


@given(nested_lists(), targets, st.booleans())
def test_nested_sequences(obj, dtype, x64):
    check_rule(obj, dtype, x64)


@given(numpy_arrays(), targets, st.booleans())
def test_numpy_arrays_of_every_dtype_and_byte_order(obj, dtype, x64):
    check_rule(obj, dtype, x64)


# -- named cases, each pinned ----------------------------------------------------------


def test_python_int_beyond_int32_without_x64_is_refused_as_jnp_refuses_it():
    with enable_x64(False):
        with pytest.raises(OverflowError):
            jnp.asarray(2**40)
        with pytest.raises(FrozenConstValueError, match=r"`int` it received.*1099511627776.*int32"):
            FrozenConst(2**40)
        with pytest.raises(FrozenConstValueError, match="jax_enable_x64"):
            FrozenConst([1, 2**40])


@pytest.mark.parametrize(
    "data", [np.array([1, 2**40]), np.array([-(2**31) - 1]), np.array([2**32], np.uint64)]
)
def test_64_bit_integers_jax_would_wrap_are_refused_without_x64(data):
    with enable_x64(False):
        with pytest.raises(FrozenConstValueError, match="`ndarray` it received"):
            FrozenConst(data)
        FrozenConst(data.astype(np.float64))  # a float64 copy is fine: it rounds
    with enable_x64(True):
        x = FrozenConst(data)
        np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data)


def test_64_bit_integers_inside_the_narrow_range_are_held():
    with enable_x64(False):
        data = np.array([-(2**31), 0, 2**31 - 1])
        x = FrozenConst(data)
        assert (x.host_dtype, x.dtype) == (np.int32, np.int32)  # held as `jnp.asarray` holds it
        np.testing.assert_array_equal(np.asarray(x), data)
        np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data)
        wide = FrozenConst(data, dtype=np.int64)  # asked for: int64 on the host, int32 on devices
        assert (wide.host_dtype, wide.dtype) == (np.int64, np.int32)
        np.testing.assert_array_equal(np.asarray(jnp.asarray(wide)), data)


def test_check_narrowing():
    wide = np.array([0, 2**40])
    check_narrowing(wide, np.int64)
    check_narrowing(wide, np.float32)  # not an integer narrowing
    check_narrowing(np.array([0, 2**31 - 1]), np.int32)
    check_narrowing(np.array([1e300]), np.float32)  # rounds to inf, as jnp.asarray does
    with pytest.raises(FrozenConstValueError, match=r"1099511627776.*int32"):
        check_narrowing(wide, np.int32)
    with pytest.raises(FrozenConstValueError, match="uint32"):
        check_narrowing(np.array([2**32], np.uint64), np.uint32)


def test_a_transfer_after_x64_is_switched_off_does_not_wrap():
    with enable_x64(True):
        x = FrozenConst(np.array([1, 2**40]))
        assert int(jnp.asarray(x)[1]) == 2**40
    with enable_x64(False), pytest.raises(FrozenConstValueError, match="jax_enable_x64"):
        jnp.asarray(x)


@pytest.mark.parametrize(
    ("obj", "dtype", "match"),
    [
        ([300, -1], np.uint8, "uint8"),
        ([np.nan, 1e20], np.int32, "nan"),
        ([1e20], np.int32, "int32"),
        (np.array([300]), np.uint8, "300"),
        (np.array([np.nan]), np.int32, "nan"),
        (np.array([np.inf]), np.int64, "inf"),
        (np.array([-1.5]), np.uint8, "-1.5"),
        (np.array([200.0], ml_dtypes.bfloat16), np.int8, "200"),
        ([20], ml_dtypes.int4, "int4"),
        (np.arange(20), ml_dtypes.uint4, "uint4"),
        (FrozenConst([300, 1]), np.uint8, "300"),
    ],
)
def test_conversions_that_change_a_value_are_refused(obj, dtype, match):
    with pytest.raises(FrozenConstValueError, match=match) as info:
        FrozenConst(obj, dtype=dtype)
    assert f"`{type(obj).__name__}` it received" in str(info.value)
    with pytest.raises(FrozenConstValueError):
        frozenconst.intern(obj, dtype=dtype)


def test_conversions_within_range_truncate_like_numpy_and_jnp():
    x = FrozenConst([1.5, 2.7, -0.5, 255.9], dtype=np.uint8)
    np.testing.assert_array_equal(np.asarray(x), [1, 2, 0, 255])
    np.testing.assert_array_equal(
        np.asarray(jnp.asarray(x)), np.asarray(jnp.asarray([1.5, 2.7, -0.5, 255.9], np.uint8))
    )
    y = FrozenConst(np.array([2**31 - 0.5, -(2**31) - 0.5]), dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(y), [2**31 - 1, -(2**31)])


def test_complex_to_real_is_refused():
    with pytest.raises(FrozenConstTypeError, match="imaginary"):
        FrozenConst(np.array([1 + 2j]), dtype=np.float32)
    with pytest.raises(FrozenConstTypeError, match="imaginary"):
        FrozenConst(1 + 0j, dtype=np.int32)


def test_float_narrowing_rounds_and_overflows_to_inf_as_jnp_asarray_does():
    with enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "overflow encountered in cast", from both
        x = FrozenConst([1e300, -1e300, 1.1])
        assert (x.host_dtype, x.dtype) == (np.float32, np.float32)  # held as `jnp.asarray` holds it
        np.testing.assert_array_equal(_bits(x), _bits(jnp.asarray([1e300, -1e300, 1.1])))
        wide = FrozenConst([1e300, -1e300, 1.1], dtype=np.float64)  # asked for: the host keeps float64
        assert (wide.host_dtype, wide.dtype) == (np.float64, np.float32)
        np.testing.assert_array_equal(np.asarray(wide), [1e300, -1e300, 1.1])
        device = jnp.asarray(wide)
        np.testing.assert_array_equal(_bits(device), _bits(jnp.asarray([1e300, -1e300, 1.1])))
        np.testing.assert_array_equal(np.asarray(device)[:2], [np.inf, -np.inf])
        y = FrozenConst([1e300], dtype=np.float16)
        np.testing.assert_array_equal(_bits(y), _bits(jnp.asarray([1e300], dtype=np.float16)))


def test_python_ints_beyond_int64_are_refused():
    for obj in (2**63, [2**64], [[1.5], [2**70]], (1, -(2**63) - 1)):
        with pytest.raises(FrozenConstValueError, match="outside the int64 range"):
            FrozenConst(obj)


@pytest.mark.parametrize("dtype", [ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn])
def test_dtypes_are_decided_by_what_this_jax_can_hold(dtype):
    data = np.array([0.5, 1.0]).astype(dtype)
    if supported(np.dtype(dtype)):
        x = FrozenConst(data)
        np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), data)
        return
    with pytest.raises(FrozenConstTypeError, match=rf"{np.dtype(dtype).name}.*such as float32") as info:
        FrozenConst(data)
    assert "`ndarray` it received" in str(info.value)
    with pytest.raises(FrozenConstTypeError, match="requested dtype"):
        FrozenConst([1.0], dtype=dtype)
    # Converted to a dtype this JAX holds, it is fine.
    x = FrozenConst(data, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), [0.5, 1.0])


def test_every_dtype_accepted_transfers():
    for dtype in CANDIDATES:
        if supported(dtype) and aborts_on(jax.default_backend(), jax.dtypes.canonicalize_dtype(dtype)):
            with pytest.raises(FrozenConstTypeError, match="aborts the process"):
                jnp.asarray(FrozenConst(np.zeros(2, dtype)))
        elif supported(dtype):
            x = FrozenConst(np.zeros(2, dtype))
            assert np.asarray(jnp.asarray(x)).dtype == jax.dtypes.canonicalize_dtype(dtype)
        else:
            with pytest.raises(FrozenConstTypeError, match=dtype.name):
                FrozenConst(np.zeros(2, dtype))


@pytest.mark.parametrize("target", ["default", "on", "host-resident"])
def test_a_dtype_the_device_aborts_on_is_refused_before_any_transfer(cpu_aborts_on_complex128, target):
    data = np.arange(6).reshape(2, 3) * (1 + 2j)
    with enable_x64(True):
        # The host copy is made: nothing reached a device yet.
        x = FrozenConst(data, residency="host") if target == "host-resident" else FrozenConst(data)
        before = {id(a) for a in jax.live_arrays()}
        here = jax.default_backend().upper()  # a TPU's own entry, or the CPU standing in for one
        uses = {
            "default": [(here, lambda: jnp.asarray(x))],
            "on": [("CPU", lambda: x.on(jax.devices("cpu")[0]))],
            # An eager basic index moves only that part of the host copy: refused all the same.
            "host-resident": [(here, lambda: x[0]), (here, lambda: x[0, 1:]), (here, lambda: jnp.asarray(x))],
        }[target]
        jitted = [(here, lambda: jax.jit(lambda c: c + 0)(x)), (here, lambda: jax.jit(lambda c: c[1])(x))]
        for platform, attempt in [*uses, *jitted]:
            with pytest.raises(
                FrozenConstTypeError, match=rf"cannot move complex128 data to a {platform} .*complex64"
            ):
                attempt()
        # Nothing of it reached the device, and the constant holds its data on the host still.
        made = [a for a in jax.live_arrays() if id(a) not in before]
        assert not [a for a in made if a.dtype == np.complex128], made
        np.testing.assert_array_equal(np.asarray(x), data)
        # The fix the message names: the device computes in complex64.
        narrow = FrozenConst(data, dtype=np.complex64)
        np.testing.assert_array_equal(np.asarray(narrow + 0), data.astype(np.complex64))
    # Without x64 JAX holds it as complex64 on the device, which is computed with.
    np.testing.assert_array_equal(np.asarray(x + 0), data.astype(np.complex64))


@pytest.mark.parametrize(
    "obj",
    [
        [np.ma.masked_array([1, 2], mask=[0, 1])],
        [[1.0, 2.0], np.ma.masked_array([1.0, 2.0])],
        ([1.0], (np.ma.masked_array([1.0]),)),
        [1.0, np.ma.masked],
        np.ma.masked,
    ],
)
def test_masked_arrays_are_refused_anywhere_inside(obj):
    with pytest.raises(FrozenConstTypeError, match="masked") as info:
        FrozenConst(obj)
    assert f"`{type(obj).__name__}` it received" in str(info.value)


def test_a_bad_dtype_is_a_frozenconst_error_on_every_path():
    x = FrozenConst([1, 2])
    for call in (
        lambda: FrozenConst(x, dtype="foo"),
        lambda: FrozenConst([1, 2], dtype="foo"),
        lambda: frozenconst.intern([1, 2], dtype="foo"),
        lambda: frozenconst.intern(x, dtype="foo"),
    ):
        with pytest.raises(FrozenConstTypeError, match="'foo'"):
            call()


def test_format_matches_jax_array():
    x, a = FrozenConst(1.5), jnp.asarray(1.5)
    assert f"{x:.2f}" == f"{a:.2f}" == "1.50"
    assert format(x, "10.3e") == format(a, "10.3e")
    assert f"{FrozenConst(7):>5d}" == f"{jnp.asarray(7):>5d}"
    # An empty spec is str(x), as for jax.Array (whose str is its values).
    assert format(x, "") == str(x) == f"{x}"
    assert format(a, "") == str(a)
    v = FrozenConst(np.arange(3.0))
    assert format(v, "") == str(v)
    with pytest.raises(TypeError):
        format(jnp.arange(3.0), ".2f")
    with pytest.raises(TypeError):
        format(v, ".2f")


# -- what the messages say NumPy and JAX do, checked against NumPy and JAX ------


def _numpy_wraps_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array([300]).astype(np.uint8)[0] == 44
    with pytest.raises(OverflowError):
        jnp.asarray([300], jnp.uint8)


def _numpy_gives_an_arbitrary_integer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert np.array([1e20]).astype(np.int32)[0] != 1e20
    with pytest.raises(OverflowError):
        jnp.asarray([1e20], jnp.int32)
    with pytest.raises(ValueError):
        jnp.asarray([float("nan")], jnp.int32)


def _complex_cast_drops_the_imaginary_part():
    with pytest.warns(np.exceptions.ComplexWarning if hasattr(np, "exceptions") else np.ComplexWarning):
        assert np.array([1 + 2j]).astype(np.float32)[0] == 1
    with pytest.raises(TypeError):
        jnp.asarray([1 + 2j], jnp.float32)


def _complex_to_bool_is_nonzero():
    # Neither refuses it: both say True for 1j, whose real part is zero.
    assert np.asarray([1j], dtype=bool).tolist() == [True]
    assert np.asarray(jnp.asarray([1j], dtype=bool)).tolist() == [True]
    assert np.asarray(jnp.asarray(np.array([1j, 0j]), dtype=bool)).tolist() == [True, False]


def _jax_wraps_64_bit_integers_without_x64():
    with enable_x64(False):
        assert int(np.asarray(jax.device_put(np.array([2**40])))[0]) == 0  # wrapped, silently
        with pytest.raises(OverflowError):
            jnp.asarray(2**40)


def _jnp_refuses_python_ints_beyond_int64():
    with enable_x64(True), pytest.raises(OverflowError):
        jnp.asarray(2**64)


def _numpy_drops_the_mask():
    masked = np.ma.masked_array([1, 2], mask=[False, True])
    assert type(np.asarray(masked)) is np.ndarray  # the mask is gone


def _no_numpy_conversion():
    pair = next(
        ((a, b) for a in CANDIDATES for b in CANDIDATES if not np.can_cast(a, b, casting="unsafe")), None
    )
    if pair is None:  # pragma: no cover - an ml_dtypes with every conversion
        pytest.skip("every pair of dtypes converts in this ml_dtypes")
    with pytest.raises(TypeError):
        np.zeros(2, pair[0]).astype(pair[1])
    return pair


@pytest.mark.parametrize(
    ("build", "claim", "check"),
    [
        (lambda: FrozenConst([300], np.uint8), "NumPy's cast would wrap it silently", _numpy_wraps_silently),
        (
            lambda: FrozenConst(np.array([1e20]), np.int32),
            "arbitrary integer.*OverflowError, or ValueError for NaN",
            _numpy_gives_an_arbitrary_integer,
        ),
        (
            lambda: FrozenConst([1 + 2j], np.float32),
            "NumPy's cast drops them with a ComplexWarning.*"
            "refuses a complex Python value there with a TypeError",
            _complex_cast_drops_the_imaginary_part,
        ),
        (
            lambda: FrozenConst([1j], dtype=bool),
            "NumPy and `jnp.asarray` make each value True wherever its real or imaginary part is non-zero",
            _complex_to_bool_is_nonzero,
        ),
        (
            lambda: FrozenConst(np.array([1, 2**40])),
            "would wrap that value silently \\(`jnp.asarray` raises OverflowError",
            _jax_wraps_64_bit_integers_without_x64,
        ),
        (
            lambda: FrozenConst([2**64]),
            "`jnp.asarray` raises OverflowError",
            _jnp_refuses_python_ints_beyond_int64,
        ),
        (lambda: FrozenConst(np.ma.masked_array([1.0])), "the mask would be lost", _numpy_drops_the_mask),
        (
            lambda: FrozenConst(np.zeros(2, _no_numpy_conversion()[0]), _no_numpy_conversion()[1]),
            "NumPy has no such conversion",
            _no_numpy_conversion,
        ),
    ],
)
def test_what_a_message_says_numpy_and_jax_do_is_what_they_do(build, claim, check):
    with enable_x64(False), pytest.raises(REFUSALS, match=claim):
        build()
    check()
