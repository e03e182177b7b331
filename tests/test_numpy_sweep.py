"""A FrozenConst in each array parameter of every public jax.numpy function.

For every public function of `jax.numpy`, `jax.numpy.linalg` and `jax.numpy.fft`,
and for each of its parameters that takes an array (annotated `ArrayLike`,
`Array` or a sequence of them; and the unannotated required ones, the generous
rule), one or more example calls (`_CALLS`, or a probe for the simple ones) with
a FrozenConst in that one position give what the same call gives with the
FrozenConst's cached buffer there (`jnp.asarray(x)`): same type, shape, dtype,
weak type, committed flag, sharding and bits. Eagerly, as `jax.jit` arguments,
closed over in `jax.jit`, and closed over in `frozenconst.jit` (as a parameter of
the program: `embed_max_bytes=0`). Where JAX refuses a FrozenConst in a position,
the refusal is listed, with the JAX versions, in `frozenconst._refusals` and docs/jax.md.
"""

import functools
import inspect
import io
import itertools
import pathlib
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raw_numpy_lowers
from jax import Array
from jax.typing import ArrayLike, DTypeLike

import frozenconst
from frozenconst import FrozenConst

# The refusal table is the package's own list of what JAX refuses: the sweep checks it
# against JAX, so it reads it.
from frozenconst._refusals import JAX_NUMPY_REFUSALS

# -- example data: small, so that each call costs little --------------------------

M = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], np.float32)  # symmetric positive definite
MB = M > 0.6
V = np.array([0.5, 1.5, 2.5, -1.0], np.float32)
VS = np.sort(V)  # sorted: bins, sample points
VP = np.array([1.0, 2.0, 0.5, 3.0], np.float32)  # positive: weights
VB = V > 1.0
V3 = np.array([1.0, -2.0, 0.5], np.float32)
W3 = np.array([0.25, 1.0, 3.0], np.float32)
IV = np.array([3, 1, 2, 5], np.int32)
IDX = np.array([2, 0], np.int32)
B = np.array([True, False, True])
S = np.float32(2.0)
Z = np.float32(0.0)
N1, N2, N3 = np.int32(1), np.int32(2), np.int32(3)
T3 = np.arange(16.0, dtype=np.float32).reshape(2, 2, 4)
U8 = np.array([3, 7, 255], np.uint8)


class Call(NamedTuple):
    """Positional and keyword arguments; every NumPy array or scalar in them (also inside a
    list or tuple) is an array position, given a FrozenConst in turn."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def c(*args: Any, **kwargs: Any) -> Call:
    return Call(args, kwargs)


# Example calls, by function name (`linalg.` and `fft.` for those modules). A
# function not here gets the first call of `_probe` that works: the same
# candidate in every required array parameter.
_CALLS: dict[str, list[Call]] = {
    "all": [c(MB, where=MB)],
    "allclose": [c(V, V, rtol=S, atol=S)],
    "amax": [c(V, initial=S, where=VB)],
    "amin": [c(V, initial=S, where=VB)],
    "any": [c(MB, where=MB)],
    "append": [c(V, V3)],
    "apply_along_axis": [c(jnp.dot, 1, M, V3)],
    "apply_over_axes": [c(jnp.sum, M, [0])],
    "arange": [c(N1, np.int32(8), N2)],
    "argpartition": [c(V, 1)],
    "argwhere": [c(MB, size=9, fill_value=np.int32(-1))],
    "array": [c(M)],
    "array_repr": [c(V)],
    "array_split": [c(V, N3), c(V, np.array([1, 3], np.int32))],
    "array_str": [c(V)],
    "asarray": [c(M)],
    "astype": [c(V, jnp.int32)],
    "average": [c(V, weights=VP)],
    "bincount": [c(IV, VP, length=8)],
    "block": [c([[M, M]])],
    "broadcast_to": [c(V, (3, 4))],
    "can_cast": [c(V, jnp.float32)],
    "choose": [c(np.array([0, 1, 0, 1], np.int32), [V, VP])],
    "clip": [c(V, min=Z, max=S), c(a=V, a_min=Z, a_max=S)],  # the second: older names
    "column_stack": [c([V, VP]), c(M)],
    "compress": [c(B, M, axis=0, size=3, fill_value=S)],
    "concat": [c([V, VP])],
    "concatenate": [c([V, VP]), c(M)],
    "corrcoef": [c(M, y=M)],
    "cov": [c(M, y=M, fweights=np.array([1, 2, 1], np.int32), aweights=W3)],
    "cross": [c(V3, W3)],
    "delete": [c(V, IDX)],
    "diff": [c(V, prepend=VP, append=S)],
    "digitize": [c(V, VS)],
    "dsplit": [c(T3, np.array([1, 3], np.int32))],
    "dstack": [c([V, VP]), c(M)],
    "dtype": [c(V)],
    "ediff1d": [c(V, to_end=VP, to_begin=S)],
    "einsum": [c("ij,j->i", M, V3)],
    "einsum_path": [c("ij,j->i", M, V3)],
    "empty": [c(N3)],
    "empty_like": [c(V)],
    "expand_dims": [c(V, 0)],
    "extract": [c(MB, M, size=9, fill_value=S)],
    "eye": [c(3, k=N1)],
    "fill_diagonal": [c(M, S, inplace=False)],
    "finfo": [c(V)],
    "flatnonzero": [c(V, size=4, fill_value=np.int32(-1))],
    "from_dlpack": [c(V)],
    "fromfunction": [c(jnp.add, (N2, 3))],
    "full": [c(N3, S)],
    "full_like": [c(V, S)],
    "geomspace": [c(np.float32(1.0), np.float32(8.0), 4)],
    "gradient": [c(V, S)],
    "histogram": [c(V, VS, weights=VP), c(V, 3, range=(Z, S))],
    "histogram2d": [c(V, VP, VS, weights=VP), c(V, VP, 2, range=[(Z, S), (Z, S)])],
    "histogram_bin_edges": [c(V, VS, weights=VP), c(V, 3, range=(Z, S))],
    "histogramdd": [c(M, [VS, VS, VS], weights=W3), c(M, 2, range=[(Z, S), (Z, S), (Z, S)])],
    "hsplit": [c(M, np.array([1], np.int32))],
    "hstack": [c([V, VP]), c(M)],
    "iinfo": [c(IV)],
    "insert": [c(V, IDX, V3[:2])],
    "interp": [c(V, VS, VP, left=Z, right=S, period=np.float32(6.0))],
    "intersect1d": [c(V, VP, size=4), c(V, VP, size=4, fill_value=S)],
    "isclose": [c(V, V, rtol=S, atol=S)],
    "iscomplexobj": [c(V)],
    "isin": [c(V, VP)],
    "isrealobj": [c(V)],
    "isscalar": [c(S)],
    "iterable": [c(V)],
    "ix_": [c(IDX, IDX)],
    "kaiser": [c(4, S)],
    "lexsort": [c([IV, IV]), c(M)],
    "linspace": [c(Z, S, 5)],
    "logspace": [c(Z, S, 4, base=S)],
    "matvec": [c(M, V3)],
    "max": [c(V, initial=S, where=VB)],
    "mean": [c(V, where=VB)],
    "meshgrid": [c(V, V3)],
    "min": [c(V, initial=S, where=VB)],
    "minmax": [c(V, initial=(Z, S), where=VB)],
    "moveaxis": [c(M, 0, 1)],
    "nan_to_num": [c(V, nan=S, posinf=S, neginf=Z)],
    "nanmax": [c(V, initial=S, where=VB)],
    "nanmean": [c(V, where=VB)],
    "nanmin": [c(V, initial=S, where=VB)],
    "nanpercentile": [c(V, np.float32(50.0)), c(V, np.float32(50.0), weights=VP, method="inverted_cdf")],
    "nanprod": [c(V, initial=S, where=VB)],
    "nanquantile": [c(V, np.float32(0.5)), c(V, np.float32(0.5), weights=VP, method="inverted_cdf")],
    "nanstd": [c(V, where=VB), c(V, mean=S)],
    "nansum": [c(V, initial=S, where=VB)],
    "nanvar": [c(V, where=VB), c(V, mean=S)],
    "nonzero": [c(V, size=4, fill_value=np.int32(-1))],
    "ones": [c(N3)],
    "pad": [c(V, np.array([[1, 2]], np.int32), constant_values=S)],
    "partition": [c(V, 1)],
    "percentile": [c(V, np.float32(50.0)), c(V, np.float32(50.0), weights=VP, method="inverted_cdf")],
    "permute_dims": [c(M, (1, 0))],
    "piecewise": [c(V, [VB], [jnp.multiply, Z], S)],
    "place": [c(V, VB, S, inplace=False)],
    "polydiv": [c(V, V3)],
    "polyfit": [c(V, VP, 1, w=VP)],
    "polyint": [c(V, k=S)],
    "prod": [c(V, initial=S, where=VB)],
    "put": [c(V, IDX, V3[:2], inplace=False)],
    "put_along_axis": [c(V, IDX, V3[:2], axis=0, inplace=False)],
    "quantile": [c(V, np.float32(0.5)), c(V, np.float32(0.5), weights=VP, method="inverted_cdf")],
    "ravel_multi_index": [c([IDX, IDX], (3, 3))],
    "repeat": [c(V, np.array([1, 2, 1, 0], np.int32)), c(V, N2)],
    "reshape": [c(V, (2, 2))],
    "resize": [c(V, (2, 3))],
    "result_type": [c(V, IV)],
    "roll": [c(V, N2)],
    "rollaxis": [c(M, 1)],
    "save": [c(io.BytesIO(), V)],
    "savez": [c(io.BytesIO(), V, VP)],
    "searchsorted": [c(V, V3, sorter=np.argsort(V).astype(np.int32))],
    "select": [c([VB], [V], S)],
    "setdiff1d": [c(V, VP, size=4, fill_value=S)],
    "setxor1d": [c(V, VP, size=4, fill_value=S)],
    "split": [c(V, np.array([1, 3], np.int32)), c(V, N2)],
    "stack": [c([V, VP]), c(M)],
    "std": [c(V, where=VB), c(V, mean=S)],
    "sum": [c(V, initial=S, where=VB)],
    "swapaxes": [c(M, 0, 1)],
    "take": [c(V, IDX)],
    "take_along_axis": [c(V, IDX, 0)],
    "tile": [c(V, 2)],
    "top_k": [c(V, 2)],
    "trace": [c(M, N1)],
    "trapezoid": [c(V, x=VS, dx=S)],
    "union1d": [c(V, VP, size=8, fill_value=S)],
    "unique": [c(V, size=4, fill_value=S)],
    "unique_all": [c(V, size=4, fill_value=S)],
    "unique_counts": [c(V, size=4, fill_value=S)],
    "unique_inverse": [c(V, size=4, fill_value=S)],
    "unique_values": [c(V, size=4, fill_value=S)],
    "unpackbits": [c(U8)],
    "unravel_index": [c(IDX, (3, 3))],
    "unwrap": [c(V, discont=S, period=np.float32(6.0))],
    "var": [c(V, where=VB), c(V, mean=S)],
    "vecmat": [c(V3, M)],
    "vsplit": [c(M, np.array([1], np.int32))],
    "vstack": [c([V, VP]), c(M)],
    "where": [c(VB, V, S), c(VB, size=4, fill_value=np.int32(-1))],
    "zeros": [c(N3)],
    "linalg.cross": [c(V3, W3)],
    "linalg.lstsq": [c(M, V3)],
    "linalg.matrix_power": [c(M, 2)],
    "linalg.matrix_rank": [c(M, S), c(M, tol=S)],
    "linalg.multi_dot": [c([M, M, M])],
    "linalg.pinv": [c(M, S), c(M, rcond=S)],
    "linalg.solve": [c(M, V3)],
    "linalg.tensorinv": [c(M, 1)],
    "linalg.tensorsolve": [c(M, V3)],
    "fft.fftfreq": [c(4, np.float32(0.5))],
    "fft.rfftfreq": [c(4, np.float32(0.5))],
}

# Parameters the generous rule (every unannotated required one) names that take no array.
_NOT_ARRAYS = {
    "array": {"args"},  # the positional options after `dtype` (deprecated), not data
    "broadcast_shapes": {"shapes"},
    "can_cast": {"to"},
    "einsum": {"subscripts"},
    "einsum_path": {"subscripts"},
    "fromfunction": {"function"},
    "save": {"file"},
    "savez": {"file"},
    "vectorize": {"pyfunc"},
}
# Functions left out, each for its reason.
_LEFT_OUT = {
    # It reads the Python buffer protocol, which a Python class can only offer from
    # Python 3.12 on (PEP 688): a documented difference (docs/jax.md).
    "frombuffer",
    # NumPy's file and iterator readers, which JAX refuses for every input.
    "fromfile",
    "fromiter",
    "load",
    # Print options: no data.
    "printoptions",
    "set_printoptions",
    # NumPy's object type: `jnp.object_(a)` returns `a` itself, whatever it is.
    "object_",
}
_MODULES = {"": jnp, "linalg.": jnp.linalg, "fft.": jnp.fft}


# -- which parameters take an array ------------------------------------------------


def _annotation_takes_arrays(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    # A function's own annotation (`Callable[..., Array]`) says what it returns, not that
    # the parameter is an array: drop every Callable[...] before looking.
    while (start := text.find("Callable[")) >= 0:
        depth, end = 0, start + len("Callable")
        for end in range(start + len("Callable"), len(text)):
            depth += {"[": 1, "]": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[:start] + text[end + 1 :]
    return re.search(r"\b(ArrayLike|Array|ndarray|DuckTypedArray)\b", text) is not None


def array_parameters(fn: Any, name: str) -> set[str]:
    """The parameters of `fn` that take an array: annotated so, or unannotated and required."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return set()
    found = set()
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            continue
        bare = p.annotation is inspect.Parameter.empty or p.annotation in ("Any", Any)
        required = p.default is inspect.Parameter.empty or p.kind is p.VAR_POSITIONAL
        if (bare and required and p.kind is not p.KEYWORD_ONLY) or (
            not bare and _annotation_takes_arrays(p.annotation)
        ):
            found.add(p.name)
    return found - _NOT_ARRAYS.get(name, set())


def public_functions():
    for prefix, module in _MODULES.items():
        for attr in sorted(dir(module)):
            fn = getattr(module, attr)
            name = prefix + attr
            if not attr.startswith("_") and callable(fn) and attr not in _LEFT_OUT:
                yield name, fn


# -- positions: the arrays of a call, each replaced in turn --------------------------


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic))


def _leaves(value: Any, path: tuple[Any, ...], out: list[tuple[tuple[Any, ...], Any]]) -> None:
    if _is_array(value):
        out.append((path, value))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _leaves(item, (*path, i), out)


def positions(call: Call) -> list[tuple[tuple[Any, ...], Any]]:
    """Every array in the call with its path: `(i, ...)` for positional, `(name, ...)` for keyword."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    for i, value in enumerate(call.args):
        _leaves(value, (i,), out)
    for key, value in call.kwargs.items():
        _leaves(value, (key,), out)
    return out


def _rebuild(value: Any, path: tuple[Any, ...], values: dict[tuple[Any, ...], Any]) -> Any:
    if path in values:
        return values[path]
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(item, (*path, i), values) for i, item in enumerate(value))
    return value


def build(call: Call, values: dict[tuple[Any, ...], Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with each array position replaced by its value in `values`."""
    args = tuple(_rebuild(v, (i,), values) for i, v in enumerate(call.args))
    kwargs = {k: _rebuild(v, (k,), values) for k, v in call.kwargs.items()}
    return args, kwargs


def _parameter_of(fn: Any, call: Call, path: tuple[Any, ...]) -> str:
    """The name of the parameter that the array at `path` is given to."""
    if isinstance(path[0], str):
        return path[0]
    try:
        bound = inspect.signature(fn).bind_partial(*call.args)
    except (TypeError, ValueError):
        return f"#{path[0]}"
    index = 0
    for name, value in bound.arguments.items():
        p = inspect.signature(fn).parameters[name]
        width = len(value) if p.kind is p.VAR_POSITIONAL else 1
        if index <= path[0] < index + width:
            return name
        index += width
    return f"#{path[0]}"


def _label(path: tuple[Any, ...], parameter: str) -> str:
    return parameter + "".join(f"[{i}]" for i in path[1:])


# -- running a call, and what came of it -----------------------------------------------


class Outcome(NamedTuple):
    """What a call gave: its result or its exception, and the warnings it raised."""

    ok: bool
    value: Any
    warned: frozenset[str]


def outcome(run: Any) -> Outcome:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The frozenconst.jit form closes over the call's other operands as jax.Arrays, as its
        # jax.Array twin does; the warning that JAX embeds them is about the harness, not the
        # parameter under test.
        warnings.filterwarnings("ignore", r"frozenconst\.jit: .* closes over", frozenconst.FrozenConstWarning)
        try:
            value, ok = run(), True
        except Exception as err:
            value, ok = err, False
    return Outcome(ok, value, frozenset(f"{w.category.__name__}: {str(w.message)[:80]}" for w in caught))


def _call(fn: Any, call: Call, values: dict[tuple[Any, ...], Any]) -> Any:
    args, kwargs = build(call, values)
    return fn(*args, **kwargs)


def _jitted(fn: Any) -> bool:
    # A `jax.jit` function (most of jax.numpy): its eager call runs the program it traces.
    return callable(getattr(fn, "trace", None)) and callable(getattr(fn, "lower", None))


class Program(NamedTuple):
    """What a `jax.jit` function traces for some arguments (no compilation), and how to run it."""

    traced: Outcome  # of (jaxpr text, in and out avals), consts
    run: Any


def program(jitted: Any, *args: Any, **kwargs: Any) -> Program:
    def trace():
        jaxpr = jitted.trace(*args, **kwargs).jaxpr
        return (str(jaxpr), jaxpr.in_avals, jaxpr.out_avals), list(jaxpr.consts)

    return Program(outcome(trace), lambda: jitted(*args, **kwargs))


# -- comparing -------------------------------------------------------------------------

# Results that differ by design: NumPy's `array_repr` names the class it is given.
_REPR_NAMES = re.compile(r"^(FrozenConst|ArrayImpl|Array)\(")


def _same_leaf(u: Any, v: Any) -> None:
    assert type(u) is type(v), (type(u), type(v))
    # (jax 0.8's `TypedNdArray`, a NumPy array with a JAX dtype, in some results: an array too.)
    if isinstance(u, (jax.Array, np.ndarray, np.generic)) or type(u).__name__ == "TypedNdArray":
        assert (u.dtype, u.shape) == (v.dtype, v.shape), ((u.dtype, u.shape), (v.dtype, v.shape))
        assert np.asarray(u).tobytes() == np.asarray(v).tobytes(), (u, v)
    elif isinstance(u, str):
        assert _REPR_NAMES.sub("(", u) == _REPR_NAMES.sub("(", v), (u, v)
    elif type(u).__eq__ is object.__eq__:  # no equality of its own (`finfo`, `einsum_path`'s report)
        assert str(u) == str(v), (u, v)
    else:
        assert u == v or (u != u and v != v), (u, v)
    if isinstance(u, jax.Array):
        got, expected = (u.weak_type, u.committed, u.sharding), (v.weak_type, v.committed, v.sharding)
        assert got == expected, f"(weak_type, committed, sharding): {got} != {expected}"


def same_result(a: Any, b: Any) -> None:
    """Equal results: pytree structure, types, and for arrays shape, dtype, weak type,
    committed flag, sharding and bits."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for u, v in zip(la, lb, strict=True):
        _same_leaf(u, v)


def same_outcome(got: Outcome, expected: Outcome) -> None:
    """Fails where the array fails; where it works, the same result and no warning of its own."""
    if not expected.ok:
        # The array cannot be used so here either (a data-dependent shape, a static argument):
        # the FrozenConst fails too, its error perhaps its own.
        assert not got.ok, (
            f"differs: works with a FrozenConst only (with the array: {type(expected.value).__name__})"
        )
        return
    if not got.ok:
        raise AssertionError(f"{type(got.value).__name__}: {got.value}") from got.value
    _no_warning_of_its_own(got, expected)
    _same_or_differs(got.value, expected.value)


def _no_warning_of_its_own(got: Outcome, expected: Outcome) -> None:
    # JAX's warning that it converts a `__jax_array__` object (jax 0.6), or any naming the
    # FrozenConst. (Only those: other warnings come once per trace, and JAX may reuse a trace.)
    own = {w for w in got.warned - expected.warned if "__jax_array__" in w or "FrozenConst" in w}
    assert not own, f"warns: {sorted(own)}"


def _same_or_differs(got: Any, expected: Any) -> None:
    # A different result, told apart from a refusal (whose text starts with the error's name).
    try:
        same_result(got, expected)
    except AssertionError as err:
        raise AssertionError(f"differs: {err}") from None


def same_program(got: Program, expected: Program) -> None:
    """The same program over equal constants, or (another program) the same outcome when run."""
    if expected.traced.ok and got.traced.ok and got.traced.value[0] == expected.traced.value[0]:
        _no_warning_of_its_own(got.traced, expected.traced)
        _same_or_differs(got.traced.value[1], expected.traced.value[1])
    elif not expected.traced.ok or not got.traced.ok:
        same_outcome(got.traced, expected.traced)
    else:
        # Another program for the same result (`jnp.stack` takes a jax.Array as one array,
        # a FrozenConst as the sequence of its rows): run both.
        same_outcome(outcome(got.run), outcome(expected.run))


# -- the simple functions: a probe -----------------------------------------------------

_CANDIDATES = [M, V, IV, B]


def _is_result(value: Any) -> bool:
    """Whether `value` is data worth comparing (not a function, a context manager, a class)."""
    return not any(callable(leaf) or hasattr(leaf, "__enter__") for leaf in jax.tree_util.tree_leaves(value))


def _works(fn: Any, call: Call) -> bool:
    got = outcome(lambda: _call(fn, call, _refs(call)))
    return got.ok and _is_result(got.value)


def _probe(fn: Any) -> list[Call]:
    """The first call that works with plain arrays: the same candidate in every required parameter."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    required = [
        p
        for p in sig.parameters.values()
        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    var = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    counts = [len(required)] if not var else [getattr(fn, "nin", None) or 1, 2, 1]
    for count in dict.fromkeys(counts):
        for candidate in _CANDIDATES:
            call = c(*[candidate] * count)
            if count and _works(fn, call):
                return [call]
    return []


# -- the sweep ---------------------------------------------------------------------------


def _refs(call: Call) -> dict[tuple[Any, ...], Any]:
    # The cached buffers of FrozenConsts of the call's arrays: what a FrozenConst gives
    # wherever JAX converts it, so equal results mean equal metadata too.
    return {path: jnp.asarray(FrozenConst(value)) for path, value in positions(call)}


class Sweep(NamedTuple):
    tested: list[str]  # `function(parameter)`, one per position
    mismatched: dict[tuple[str, str, str], str]  # (function, parameter, `position how`) -> what differed
    covered: dict[str, set[str]]  # function -> the parameters a working call gave an array


class _Case:
    """One call of one function, with plain arrays (its cached buffers) everywhere: what each
    use gives, computed once, to compare each position's FrozenConst against."""

    def __init__(self, fn: Any, call: Call) -> None:
        self.fn, self.call, self.refs = fn, call, _refs(call)
        self.paths = list(self.refs)
        # A `jax.jit` function's eager call runs the program it traces for those arguments:
        # the same program over the same buffers gives the same result, so its programs are
        # compared (no compilation); any other function is run.
        self.jitted = _jitted(fn)
        self.eager = self.eagerly(self.refs)
        if self.jitted and not self.eager.traced.ok:
            # It cannot trace these arguments (it needs a value concrete): it is run.
            self.jitted = False
            self.eager = self.eagerly(self.refs)
        self.as_args = jax.jit(self._with_values)
        self.args = program(self.as_args, *self.refs.values())
        self.closed = self.closed_over(self.refs)

    def works(self) -> bool:
        if self.jitted:
            return True
        return self.eager.ok and _is_result(self.eager.value)

    def run(self, values: dict[tuple[Any, ...], Any]) -> Any:
        args, kwargs = build(self.call, values)
        return self.fn(*args, **kwargs)

    def _with_values(self, *values: Any) -> Any:
        return self.run(dict(zip(self.paths, values, strict=True)))

    def eagerly(self, values: dict[tuple[Any, ...], Any]) -> Any:
        if self.jitted:
            args, kwargs = build(self.call, values)
            return program(self.fn, *args, **kwargs)
        return outcome(lambda: self.run(values))

    def closed_over(self, values: dict[tuple[Any, ...], Any]) -> Program:
        return program(jax.jit(lambda: self.run(values)))

    def checks(self, path: tuple[Any, ...], x: FrozenConst, frozenconst_jit: bool) -> dict[str, Any]:
        """Each use of the call with `x` at `path`: a check that raises AssertionError where it differs."""
        values = {**self.refs, path: x}
        same = same_program if self.jitted else same_outcome
        checks = {
            "eagerly": lambda: same(self.eagerly(values), self.eager),
            "as jax.jit arguments": lambda: same_program(
                program(self.as_args, *[values[p] for p in self.paths]), self.args
            ),
            "closed over in jax.jit": lambda: same_program(self.closed_over(values), self.closed),
        }
        if frozenconst_jit:
            checks["closed over in frozenconst.jit"] = lambda: self._in_frozenconst_jit(path, x)
        return checks

    def _in_frozenconst_jit(self, path: tuple[Any, ...], x: FrozenConst) -> None:
        # The constant a parameter of frozenconst.jit's program (`embed_max_bytes=0`): what
        # jax.jit gives with the array passed in. Or what it gives with the array closed
        # over: under JAX's simplified pipeline frozenconst.jit leaves a constant to JAX,
        # which makes it a literal of the program (passed in at run time above
        # `jax_embedded_constants_max_bytes`, embedded and perhaps folded by XLA below it);
        # and where JAX refuses an argument (a static use: a shape, split points), so may
        # frozenconst.jit refuse a parameter (docs/jit.md). `x` is a free variable of the
        # function, so that frozenconst.jit finds it before tracing (one trace).
        refs = self.refs
        got = program(frozenconst.jit(lambda: self.run({**refs, path: x}), embed_max_bytes=0))
        as_argument = program(jax.jit(lambda r: self.run({**refs, path: r})), refs[path])
        if not as_argument.traced.ok and not got.traced.ok:
            return
        # (Neither form traces, yet frozenconst.jit does: compared with the argument, that differs.)
        expected = [p for p in (as_argument, self.closed) if p.traced.ok] or [as_argument]
        for program_ in expected:  # the same program first: nothing compiled
            if got.traced.ok and got.traced.value[0] == program_.traced.value[0]:
                same_program(got, program_)
                return
        failures = []
        for program_ in expected:
            try:
                same_program(got, program_)
            except AssertionError as err:
                failures.append(err)
            else:
                return
        raise failures[0]


def sweep(names: set[str] | None = None, frozenconst_jit: Any = lambda label: True) -> Sweep:
    """Each array position of each call of each public function (those in `names`, or all);
    `frozenconst_jit(label)` says whether that position is checked in frozenconst.jit too."""
    out = Sweep([], {}, {})
    for name, fn in public_functions():
        if names is not None and name not in names:
            continue
        for call in _CALLS.get(name) or _probe(fn):
            case = _Case(fn, call)
            if not case.works():
                continue  # not this JAX's signature: the coverage test names what is left
            for path, value in positions(call):
                parameter = _parameter_of(fn, call, path)
                out.covered.setdefault(name, set()).add(parameter)
                label = f"{name}({_label(path, parameter)})"
                for how, check in case.checks(path, FrozenConst(value), frozenconst_jit(label)).items():
                    try:
                        check()
                    except AssertionError as err:
                        out.mismatched[name, parameter, f"{_label(path, parameter)} {how}"] = str(err)[:300]
                out.tested.append(label)
    return out


# -- the tests -------------------------------------------------------------------------

# Parameters that take no jax.Array in this JAX, so that no call gives one a FrozenConst:
# `jnp.intersect1d`'s `fill_value` is a static argument (a jax.Array is unhashable there),
# and JAX's CPU backend cannot convert to these dtypes at all (jax 0.10.2: "Invalid XLA
# PrimitiveType"; 1-bit integers: a stablehlo verifier error; jax 0.12.1's `bcomplex32`,
# `complex32` and `float8_e5m3fnu`: "Invalid element type" eagerly, a stablehlo verifier
# error or "PRIMITIVE_TYPE_INVALID" under `jax.jit`, for a jax.Array too).
_NO_ARRAY_HERE = {
    "intersect1d": {"fill_value"},
    "bcomplex32": {"x"},
    "complex32": {"x"},
    "float8_e5m3fnu": {"x"},
    "float4_e2m1fn": {"x"},
    "float6_e2m3fn": {"x"},
    "float6_e3m2fn": {"x"},
    "int1": {"x"},
    "uint1": {"x"},
}
# jax 0.7 to 0.9 under the simplified pipeline cannot lower a program that closes over a
# NumPy array (helpers.raw_numpy_lowers): these close over one inside, and fail there for
# a jax.Array too ('TypedNdArray' object has no attribute 'sharding'; `polyder` on 0.8).
_NO_ARRAY_WITHOUT_NUMPY_LOWERING = {"polyadd": {"a1", "a2"}, "polysub": {"a1", "a2"}, "polyder": {"p"}}
# By platform, parameters no call gives an array there, a jax.Array included (on a TPU v5e,
# jax 0.10.2): `jnp.roots`, `jnp.linalg.eig` and `eigvals` ("MLIR translation rule for
# primitive 'eig' not found for platform tpu"), `jnp.from_dlpack` ("__dlpack__ device only
# supported for CPU and GPU"; a FrozenConst's own `__dlpack__` exports its host copy,
# tests/test_dlpack.py), `jnp.int2` and `jnp.uint2` ("INT2 is not supported for rank 1").
_NO_ARRAY_ON = {
    "tpu": {
        "roots": {"p"},
        "linalg.eig": {"a"},
        "linalg.eigvals": {"a"},
        "from_dlpack": {"x"},
        "int2": {"x"},
        "uint2": {"x"},
    }
}
# The sweep in parts, so that each test stays short; the same calls in every part.
_PARTS = {
    "jnp[a-e]": lambda name: "." not in name and name < "f",
    "jnp[f-m]": lambda name: "." not in name and "f" <= name < "n",
    "jnp[n-r]": lambda name: "." not in name and "n" <= name < "s",
    "jnp[s-z]": lambda name: "." not in name and name >= "s",
    "linalg": lambda name: name.startswith("linalg."),
    "fft": lambda name: name.startswith("fft."),
}


@functools.cache
def _swept(part: str) -> Sweep:
    names = {name for name, _ in public_functions() if _PARTS[part](name)}
    # frozenconst.jit's program is traced for every third position (each a new function
    # and trace there): a sample, to keep the sweep short; the other uses, every position.
    every_third = itertools.count()
    return sweep(names, lambda label: next(every_third) % 3 == 0)


def _qualified(name: str) -> str:
    return f"jax.numpy.{name}"


def _refusals_here(part: str) -> set[str]:
    return {key for key in JAX_NUMPY_REFUSALS if _PARTS[part](key.split("(")[0].removeprefix("jax.numpy."))}


@pytest.mark.slow  # a compile per function and position: the suite's longest test
@pytest.mark.parametrize("part", list(_PARTS))
def test_each_array_parameter_takes_a_frozenconst_or_is_listed(part):
    out = _swept(part)
    found: dict[str, list[str]] = {}
    for (name, parameter, how), what in out.mismatched.items():
        if not raw_numpy_lowers() and "'TypedNdArray' object" in what:
            continue  # JAX's bug (jax 0.7 to 0.9, simplified pipeline), with a jax.Array too
        found.setdefault(f"{_qualified(name)}({parameter})", []).append(f"{how}: {what}")
    unlisted = {key: lines for key, lines in found.items() if key not in JAX_NUMPY_REFUSALS}
    assert not unlisted, "\n".join(line for lines in unlisted.values() for line in lines)
    for lines in found.values():
        # A refusal in JAX's words (an exception or a warning), never a different result.
        assert not any(line.split(": ", 2)[1] == "differs" for line in lines), lines
    known = {v for versions in JAX_NUMPY_REFUSALS.values() for v in versions}
    if jax.__version__ in known:
        listed = {key for key in _refusals_here(part) if jax.__version__ in JAX_NUMPY_REFUSALS[key]}
        assert set(found) == listed, (sorted(found), sorted(listed))
    assert out.tested  # how many: the next test checks that every array parameter is among them


@pytest.mark.slow
@pytest.mark.parametrize("part", list(_PARTS))
def test_the_sweep_gives_every_array_parameter_a_frozenconst(part):
    out = _swept(part)
    exempt = {
        **_NO_ARRAY_HERE,
        **({} if raw_numpy_lowers() else _NO_ARRAY_WITHOUT_NUMPY_LOWERING),
        **_NO_ARRAY_ON.get(jax.default_backend(), {}),
    }
    missing = {
        name: sorted(left)
        for name, fn in public_functions()
        if _PARTS[part](name)
        and (left := array_parameters(fn, name) - out.covered.get(name, set()) - exempt.get(name, set()))
    }
    assert not missing, "no working call gives these an array: " + "; ".join(
        f"jax.numpy.{name}: {parameters}" for name, parameters in missing.items()
    )


def test_the_parameter_rule_finds_arrays_and_only_arrays():
    def f(
        a: "ArrayLike",
        b: "Sequence[ArrayLike] | None" = None,
        c: "int" = 0,
        *,
        d: "DTypeLike" = None,
        e: "Callable[..., Array] | None" = None,
        g: "list[ArrayLike | Callable[..., Array]]" = (),
        h=None,
    ):
        pass

    def unannotated(x, y=None, *rest, z=None):
        pass

    def evaluated(a: ArrayLike, d: DTypeLike = None, e: Callable[..., Array] | None = None, s: Any = 0):
        pass

    assert array_parameters(f, "f") == {"a", "b", "g"}
    assert array_parameters(unannotated, "unannotated") == {"x", "rest"}
    assert array_parameters(evaluated, "evaluated") == {"a"}  # `Any` with a default: an option
    assert {name for name, _ in public_functions()} >= {"bincount", "linalg.solve", "fft.fft", "where"}


def test_positions_reach_into_sequences_and_keywords():
    call = c(V, [V, (S, IV)], 3, where=VB, shape=(2, 3))
    assert [path for path, _ in positions(call)] == [(0,), (1, 0), (1, 1, 0), (1, 1, 1), ("where",)]
    args, kwargs = build(call, {(1, 1, 0): "s", ("where",): "w"})
    assert args[1][1] == ("s", IV) and kwargs == {"where": "w", "shape": (2, 3)} and args[2] == 3
    assert _parameter_of(jnp.where, c(VB, V, S), (2,)) == "y"
    assert _parameter_of(jnp.add, c(V, V), (1,)) == "args"


def test_a_refusal_and_a_different_result_are_told_apart():
    ok = Outcome(True, jnp.ones(2), frozenset())
    with pytest.raises(AssertionError, match=r"^differs"):
        same_outcome(Outcome(True, jnp.zeros(2), frozenset()), ok)
    with pytest.raises(AssertionError, match=r"^differs"):
        same_outcome(Outcome(True, jnp.ones(2, jnp.int32), frozenset()), ok)
    with pytest.raises(AssertionError, match=r"^ValueError: no"):
        same_outcome(Outcome(False, ValueError("no"), frozenset()), ok)
    with pytest.raises(AssertionError, match=r"^warns"):
        warned = frozenset({"DeprecationWarning: Triggering of __jax_array__() during abstractification"})
        same_outcome(Outcome(True, jnp.ones(2), warned), ok)
    # Bits, not values: -0.0 and 0.0 compare equal but are different results.
    with pytest.raises(AssertionError, match=r"^differs"):
        same_outcome(
            Outcome(True, jnp.array([-0.0]), frozenset()), Outcome(True, jnp.array([0.0]), frozenset())
        )
    same_outcome(Outcome(False, TypeError("a"), frozenset()), Outcome(False, ValueError("b"), frozenset()))


def test_docs_list_the_jax_numpy_parameters_that_refuse_a_frozenconst():
    text = (pathlib.Path(__file__).parent.parent / "docs" / "jax.md").read_text()
    section = text.split("## jax.numpy: the parameters that refuse a FrozenConst")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([\w.]+\(\w+\))` \| ([\d., ]+) \|", section, re.MULTILINE)
    assert {
        name: tuple(v.strip() for v in versions.split(",")) for name, versions in rows
    } == JAX_NUMPY_REFUSALS
