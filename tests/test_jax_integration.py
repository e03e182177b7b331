"""FrozenConst where JAX expects a jax.Array: operators, methods, jax.numpy, transformations."""

import importlib
import inspect
import operator
import pathlib
import pkgutil
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import live_copies, on_cpu, raw_numpy_lowers, unique_data

import frozenconst
from frozenconst import FrozenConst

# The refusal tables are the package's own list of what JAX refuses: the sweep checks them
# against JAX, so it reads them.
from frozenconst._refusals import BYPASS_JAX_NUMPY, JAX_LAX_REFUSES, TAKE_PYTREES


def _same(a, b, values=True):
    """Equal results: same pytree structure, types, dtypes, shapes and values (NaN-aware).

    `values=False` leaves the values out, for arrays whose memory is uninitialised.
    """
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for u, v in zip(la, lb, strict=True):
        assert type(u) is type(v), (type(u), type(v))
        # (jax 0.8's `TypedNdArray`, a NumPy array with a JAX dtype, in some results: an array too.)
        if isinstance(u, (jax.Array, np.ndarray)) or type(u).__name__ == "TypedNdArray":
            assert u.dtype == v.dtype and u.shape == v.shape
            if values:
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        elif values:
            assert u == v or (u != u and v != v)


# -- operators ---------------------------------------------------------------

_BINARY = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.floordiv,
    operator.mod,
    operator.pow,
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    divmod,
]
_INT_BINARY = [operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift]
_UNARY = [operator.neg, operator.pos, abs, round]


@pytest.mark.parametrize("op", _BINARY, ids=lambda f: f.__name__)
@pytest.mark.parametrize("other", [2.0, 3, np.arange(1.0, 5.0), "jax"], ids=["float", "int", "numpy", "jax"])
def test_binary_operators_match_jax_array(op, other):
    data = np.arange(1.0, 5.0, dtype=np.float32)
    x, ref = FrozenConst(data), jnp.asarray(data)
    other = jnp.arange(4.0, 8.0) if isinstance(other, str) else other
    _same(op(x, other), op(ref, other))
    _same(op(other, x), op(other, ref))  # reflected
    _same(op(x, x), op(ref, ref))


@pytest.mark.parametrize("op", _INT_BINARY, ids=lambda f: f.__name__)
def test_integer_operators_match_jax_array(op):
    data = np.arange(1, 5, dtype=np.int32)
    x, ref = FrozenConst(data), jnp.asarray(data)
    for other in (2, np.int32(1), jnp.arange(4, dtype=jnp.int32)):
        _same(op(x, other), op(ref, other))
        _same(op(other, x), op(other, ref))
    _same(~x, ~ref)


@pytest.mark.parametrize("op", _UNARY, ids=lambda f: f.__name__)
def test_unary_operators_match_jax_array(op):
    data = np.array([-1.5, 0.25, 2.0], np.float32)
    _same(op(FrozenConst(data)), op(jnp.asarray(data)))


def test_matmul_and_indexing_match_jax_array():
    data = unique_data((4, 3))
    x, ref = FrozenConst(data), jnp.asarray(data)
    w = np.ones((3, 2), np.float32)
    _same(x @ w, ref @ w)
    _same(w.T @ x.T, w.T @ ref.T)
    _same(x @ FrozenConst(w), ref @ jnp.asarray(w))
    for index in [
        0,
        -1,
        slice(1, 3),
        (1, 2),
        (Ellipsis, 0),
        np.array([0, 2]),
        jnp.array([True, False, True, True]),
    ]:
        _same(x[index], ref[index])
    _same(x[FrozenConst(np.array([3, 0]))], ref[jnp.array([3, 0])])


def test_mixing_with_numpy_gives_jax_arrays():
    x = FrozenConst(np.ones(3, np.float32))
    for result in (np.ones(3) + x, x + np.ones(3), np.ones(3) * x, np.ones((2, 3)) @ x):
        assert isinstance(result, jax.Array)


def _same_outcome(fn, x, ref):
    """`fn(x)` and `fn(ref)` return equal results or raise the same exception type."""
    _same_outcome_as(fn, x, ref, _same)


def test_scalar_conversions_follow_jax_array():
    for data in (np.float32(2.5), np.array([7], np.int32), np.array(True), np.complex64(1 + 2j), np.ones(3)):
        x, ref = FrozenConst(data), jnp.asarray(data)
        for conv in (bool, int, float, complex, operator.index):
            _same_outcome(conv, x, ref)
    assert operator.index(FrozenConst(np.int32(3))) == 3
    with pytest.raises(TypeError):
        operator.index(FrozenConst(np.float32(3)))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(FrozenConst(np.ones(3)))


def test_len_iteration_and_metadata():
    data = np.arange(12, dtype=np.int16).reshape(3, 4)
    x = FrozenConst(data)
    assert (x.shape, x.dtype, x.ndim, x.size, x.nbytes, len(x)) == ((3, 4), np.int16, 2, 12, 24, 3)
    rows = list(x)
    assert len(rows) == 3 and all(isinstance(r, jax.Array) for r in rows)
    _same(rows[1], jnp.asarray(data)[1])
    with pytest.raises(TypeError, match="len"):
        len(FrozenConst(1.0))
    with pytest.raises(TypeError):
        iter(FrozenConst(1.0)).__next__()


# -- jax.Array methods and properties: a sweep over the public API ---------------


def _same_result(a, b, values=True):
    """`_same`, and for every array the rest of its metadata: weak type, committed, sharding."""
    _same(a, b, values)
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        if isinstance(u, jax.Array):
            got, expected = (u.weak_type, u.committed, u.sharding), (v.weak_type, v.committed, v.sharding)
            assert got == expected, f"(weak_type, committed, sharding): {got} != {expected}"


def _same_outcome_as(fn, x, ref, same):
    """`fn(x)` and `fn(ref)` raise the same exception type, or return results that `same` accepts."""
    try:
        expected = fn(ref)
    except Exception as err:
        with pytest.raises(type(err)):
            fn(x)
        return
    same(fn(x), expected)


def _same_shards(a, b):
    # Shard objects are made per access and compare by identity: same devices, indices, buffers.
    def key(shards):
        return [(s.device, s.index, s.replica_id, s.data.unsafe_buffer_pointer()) for s in shards]

    assert key(a) == key(b)


def _same_update_helper(a, b):
    # `x.at`: an index-update helper made per access, bound to the very cached buffer.
    assert type(a) is type(b) and a.array is b.array


def _same_type(a, b):
    # `unsafe_raw_buffer()` (jax 0.12): a view made per call, with no equality; the address it
    # views is `unsafe_buffer_pointer()`, compared by value.
    assert type(a) is type(b)


def _itself(a, b):
    # `block_until_ready()` returns the object it was called on: the constant, as the array its.
    assert isinstance(a, FrozenConst) and isinstance(b, jax.Array)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# Members whose results have no equality of their own, each compared as its comment says.
_COMPARED_BY = {
    "block_until_ready": _itself,
    "addressable_shards": _same_shards,
    "global_shards": _same_shards,
    "at": _same_update_helper,
    "unsafe_raw_buffer": _same_type,
}
# Methods whose call needs an argument: a value that works for the float matrix below.
_METHOD_ARGS = {
    "addressable_data": (0,),
    "astype": (jnp.int32,),
    "choose": ([jnp.zeros(4), jnp.ones(4)],),
    "compress": (jnp.array([True, False, True]),),
    "dot": (jnp.ones(4),),
    "reshape": ((4, 3),),
    "repeat": (2,),
    "searchsorted": (0.5,),
    "swapaxes": (0, 1),
    "take": (jnp.array([0, 2]),),
    "view": (jnp.int32,),
    "argpartition": (1,),
    "to_device": (jax.devices()[0],),
}


def _public_array_members():
    # Those of `jax.Array` and of the class of its instances, which adds some
    # (`weak_type`, `aval`, `devices`, `is_ready`, `tolist`, ...).
    names = {n for n in dir(jax.Array) + dir(type(jnp.zeros(()))) if not n.startswith("_")}
    assert len(names) > 70, names  # the sweep is over the real API, not a short list
    return sorted(names)


@pytest.mark.parametrize("name", _public_array_members())
def test_every_jax_array_member_matches(name):
    data = np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4)
    if name == "item":
        data = np.float32(2.0)  # `item` needs a single element
    x = FrozenConst(data)
    ref = jnp.asarray(x)  # the cached buffer: every member answers as it does
    if name == "delete":
        # Refused: it would free the buffer that every use of the constant shares.
        with pytest.raises(AttributeError, match="evict"):
            getattr(x, name)
        return
    if name == "nbytes":
        # FrozenConst's own: the bytes of the host data, the buffer's too for float32.
        assert x.nbytes == data.nbytes == ref.nbytes
        return
    member = inspect.getattr_static(type(ref), name, None) or inspect.getattr_static(jax.Array, name)
    args = _METHOD_ARGS.get(name, ())
    get = (lambda a: getattr(a, name)(*args)) if callable(member) else (lambda a: getattr(a, name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same_outcome_as(get, x, ref, _COMPARED_BY.get(name, _same_result))


def test_at_updates_return_new_arrays_and_leave_the_constant():
    x = FrozenConst(np.zeros(3, np.float32))
    y = x.at[1].set(5.0)
    assert isinstance(y, jax.Array)
    np.testing.assert_array_equal(y, [0, 5, 0])
    np.testing.assert_array_equal(np.asarray(x), [0, 0, 0])
    np.testing.assert_array_equal(np.asarray(x + 0), [0, 0, 0])


# -- jax.nn and jax.scipy: a sweep over public functions ----------------------------
# Each public callable, on the first candidate and call form it accepts, gives for a
# FrozenConst what it gives for the FrozenConst's cached buffer (`jnp.asarray(x)`):
# same value, dtype, weak type, committed and sharding, eagerly and under `jax.jit`,
# with the constants closed over and passed in as arguments. (jax.numpy has its own
# sweep, over each array parameter of every function: tests/test_numpy_sweep.py.)

_CANDIDATES = {
    "matrix": np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], np.float32),
    "vector": np.array([0.5, 1.5, 2.5, -1.0], np.float32),
    "ints": np.array([3, 1, 2, 5], np.int32),
    "bools": np.array([True, False, True]),
}
# The second constant of the two-argument form `(a, s)`: 0-d, so that `full_like(a, s)`,
# `add(a, s)`, `where(a, s, ...)` broadcast it. float32 like the candidates (a FrozenConst's
# `dtype` is its buffer's whatever the host holds: tests/test_annotations.py).
_SCALAR = np.float32(2.0)
_CALL_FORMS = [
    lambda a, s: (a,),
    lambda a, s: (a, s),
    lambda a, s: (a, a),
    lambda a, s: (a, 1),
    lambda a, s: (a, 0, 1),
]
# The one function left out, a documented difference (docs/jax.md): it reads the Python
# buffer protocol, which a Python class can only offer from Python 3.12 on (PEP 688).
_BUFFER_PROTOCOL = {"frombuffer"}
# Results compared: pytrees of these. Others (a dtype, `finfo`, a context manager) say
# nothing about the array and end the search for that function, untested.
_RESULT_LEAVES = (jax.Array, np.ndarray, np.generic, int, float, bool, complex)
# Functions whose results are uninitialised memory on an accelerator (on the CPU backend
# they happen to be zeros): their results are compared by everything but the values. JAX's
# own extensibility test of `empty_like` fails on a GPU for plain arrays.
_UNINITIALISED = {"empty", "empty_like"}


def _public_functions(module):
    """Every public callable: functions, and classes such as the scalar types (`jnp.float32(a)`)."""
    for name in sorted(dir(module)):
        fn = getattr(module, name)
        if not name.startswith("_") and callable(fn) and name not in _BUFFER_PROTOCOL:
            yield name, fn


def _quietly(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def _jitted(fn, form, a, s, closed_over):
    """`fn(*form(a, s))` under `jax.jit`, with `a` and `s` closed over or passed in; and its arguments."""
    if closed_over:
        return jax.jit(lambda: fn(*form(a, s))), ()
    return jax.jit(lambda b, c: fn(*form(b, c))), (a, s)


def _program(fn, form, a, s, closed_over):
    """What `jax.jit` traces: the jaxpr, its types (weak types and shardings included), its constants."""
    jitted, args = _jitted(fn, form, a, s, closed_over)
    jaxpr = jitted.trace(*args).jaxpr
    return (str(jaxpr), jaxpr.in_avals, jaxpr.out_avals), list(jaxpr.consts)


def _run(fn, form, a, s, closed_over):
    jitted, args = _jitted(fn, form, a, s, closed_over)
    return jitted(*args)


def _same_under_jit(fn, form, x, sx, ref, sref, values=True):
    for closed_over in (True, False):
        how = "closed over" if closed_over else "as arguments"
        try:
            expected, expected_consts = _quietly(_program, fn, form, ref, sref, closed_over)
        except Exception:
            # The array cannot be traced here either (a data-dependent shape, a static
            # argument): the FrozenConst must fail too. Its error may be its own: a derived
            # value refuses host conversion with TracedValueError, a TypeError as JAX's.
            try:
                _quietly(_program, fn, form, x, sx, closed_over)
            except Exception:
                continue
            raise AssertionError(f"under jax.jit ({how}) succeeds for a FrozenConst only") from None
        try:
            got, got_consts = _quietly(_program, fn, form, x, sx, closed_over)
        except Exception as err:
            raise AssertionError(f"under jax.jit ({how}): {type(err).__name__}: {err}") from err
        if got == expected:
            # One program over equal constants: equal results, down to the metadata.
            _same_result(got_consts, expected_consts)
        else:
            # Another program for the same result (jnp.stack takes a jax.Array as one
            # array, a FrozenConst as the sequence of its rows): run both and compare.
            got_result = _quietly(_run, fn, form, x, sx, closed_over)
            _same_result(got_result, _quietly(_run, fn, form, ref, sref, closed_over), values)


def _sweep(module):
    tested, mismatched = [], []
    # Made once: no jax.numpy function changes a constant or its cached buffer.
    constants = [FrozenConst(candidate) for candidate in _CANDIDATES.values()]
    sx = FrozenConst(_SCALAR)
    sref = jnp.asarray(sx)  # its cached buffer
    for name, fn in _public_functions(module):
        for x in constants:
            ref = jnp.asarray(x)
            for form in _CALL_FORMS:
                try:
                    expected = _quietly(fn, *form(ref, sref))
                except Exception:
                    continue
                if not all(isinstance(leaf, _RESULT_LEAVES) for leaf in jax.tree_util.tree_leaves(expected)):
                    break
                values = name not in _UNINITIALISED
                try:
                    _same_result(_quietly(fn, *form(x, sx)), expected, values)
                    _same_under_jit(fn, form, x, sx, ref, sref, values)
                except Exception as err:  # collected and reported below
                    mismatched.append(f"{module.__name__}.{name}: {type(err).__name__}: {err}"[:300])
                tested.append(name)
                break
            else:
                continue
            break
    return tested, mismatched


# Over every public module of jax.nn and jax.scipy, each function gives for a FrozenConst
# what it gives for its cached buffer, or is one of those that bypass jax.numpy, listed in
# `_refusals` and docs/jax.md with the JAX versions on which they refuse: on those versions
# the sweep finds exactly the listed ones.


def _public_modules(package):
    """`package` and every public module below it (`jax.scipy.stats.norm`, ...), by walking its path."""
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(importlib.import_module(info.name))
    return found


_BYPASS_MODULES = [*_public_modules(jax.nn), *_public_modules(jax.scipy)]
_LISTED = {**BYPASS_JAX_NUMPY, **TAKE_PYTREES}


@pytest.mark.slow
@pytest.mark.parametrize("module", _BYPASS_MODULES, ids=lambda m: m.__name__)
def test_every_nn_and_scipy_function_accepts_a_frozenconst_or_is_listed(module):
    tested, mismatched = _sweep(module)
    found = {line.split(":")[0]: line for line in mismatched}
    if not raw_numpy_lowers():
        # jax 0.7 to 0.9 under the simplified pipeline cannot lower a function that closes
        # over a NumPy array (`ndtri`'s coefficient tables): `jax.jit(ndtri)` of a jax.Array
        # fails there too, with this error. JAX's bug, not a refusal of FrozenConst.
        found = {n: line for n, line in found.items() if "'TypedNdArray' object" not in line}
    unlisted = [line for name, line in found.items() if name not in _LISTED]
    assert not unlisted, "\n".join(unlisted)
    for name in found:
        if name in BYPASS_JAX_NUMPY:  # refused in JAX's words, not a wrong result
            words = ("__jax_array__", "got FrozenConst(", "is not a valid JAX type")  # the last: jax 0.6
            assert any(w in found[name] for w in words), found[name]
    if jax.__version__ in {v for versions in _LISTED.values() for v in versions}:
        here = {n for n, versions in _LISTED.items() if n.rsplit(".", 1)[0] == module.__name__}
        assert set(found) == {n for n in here if jax.__version__ in _LISTED[n]}, found
    # The fix docs/jax.md gives works for each: the sweep compared the cached buffer's results.
    assert all(name.rsplit(".", 1)[1] in tested for name in found)


def test_the_sweeps_cover_nn_and_scipy():
    names = [m.__name__ for m in _BYPASS_MODULES]
    assert {"jax.nn", "jax.scipy.linalg", "jax.scipy.special", "jax.scipy.stats.norm"} <= set(names)
    assert len(names) > 30, names


def test_docs_list_the_functions_that_bypass_jax_numpy():
    text = (pathlib.Path(__file__).parent.parent / "docs" / "jax.md").read_text()
    section = text.split("## jax.nn and jax.scipy: the functions that bypass jax.numpy")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([\w.]+)` \| ([\d., ]+) \|", section, re.MULTILINE)
    assert {name: tuple(v.strip() for v in versions.split(",")) for name, versions in rows} == _LISTED


@pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 7),
    reason="jax 0.6 takes the constant with a DeprecationWarning, then fails in other words (docs/jax.md)",
)
@pytest.mark.parametrize(
    "call",
    [
        lambda x: jax.nn.sigmoid(x),
        lambda x: jax.scipy.linalg.block_diag(x),
        lambda x: jax.scipy.linalg.hessenberg(x),
    ],
    ids=["sigmoid", "block_diag", "hessenberg"],
)
def test_audit_names_the_function_that_bypasses_jax_numpy(call):
    x = FrozenConst(np.eye(3, dtype=np.float32) + 1)
    (name,) = [n for n in BYPASS_JAX_NUMPY if n.rsplit(".", 1)[1] in call.__code__.co_names]
    try:
        call(jnp.asarray(np.asarray(x)))
    except NotImplementedError as err:  # `hessenberg` on a TPU: JAX lowers it on CPU and GPU only
        pytest.skip(f"JAX computes {name} on no {jax.default_backend()}: {str(err).splitlines()[0]}")
    if jax.__version__ not in BYPASS_JAX_NUMPY[name]:
        _same(call(x), call(jnp.asarray(x)))  # takes it: `jax.lax` does, on this JAX
        return
    with pytest.raises((ValueError, TypeError)):
        call(x)
    with pytest.raises((frozenconst.FrozenConstValueError, frozenconst.FrozenConstTypeError)) as caught:
        frozenconst.audit(lambda: call(x))
    message = str(caught.value)
    assert f"test_jax_integration.py:{call.__code__.co_firstlineno} (<lambda>)" in message
    assert f"`{name}`" in message and "jnp.asarray" in message
    _same(call(jnp.asarray(x)), call(jnp.asarray(np.asarray(x))))


def test_lax_takes_a_frozenconst_where_frozenconst_registers_it():
    x = FrozenConst(np.ones(3, np.float32))
    # jax.lax refuses __jax_array__ objects unless their type is registered (JEP 28661);
    # frozenconst registers FrozenConst where JAX has the table (jax >= 0.10), and
    # `JAX_LAX_REFUSES` lists the others. Before jax 0.7 JAX still takes such objects,
    # with a DeprecationWarning (an error under pytest here). jnp.asarray is the bridge.
    if jax.__version__ in JAX_LAX_REFUSES:
        with pytest.raises((TypeError, ValueError, DeprecationWarning), match=r"__jax_array__|register"):
            jax.lax.add(x, x)
    else:
        _same(jax.lax.add(x, x), jax.lax.add(jnp.asarray(x), jnp.asarray(x)))
        _same(jax.jit(lambda y: jax.lax.add(x, y))(jnp.ones(3)), jnp.full(3, 2.0))
    _same(jax.lax.add(jnp.asarray(x), jnp.asarray(x)), jnp.full(3, 2.0))


# -- transformations and pytrees ---------------------------------------------------


# Each result here is a derived copy, warned: that warning is tests/test_frameworks.py's.
@pytest.mark.filterwarnings("ignore:.*put a copy of FrozenConst:frozenconst.FrozenConstWarning")
def test_transformations_preserve_the_type_and_never_claim_host_data():
    data = unique_data((4, 3))
    x = FrozenConst(data)
    seen = []

    def f(c):
        seen.append(type(c))
        return jnp.sum(c * 2)

    jax.jit(f)(x)
    jax.grad(f)(x)
    jax.vmap(f)(x)
    jax.eval_shape(f, x)
    jax.lax.scan(lambda carry, c: (carry + f(c), None), 0.0, x)
    assert seen and all(t is FrozenConst for t in seen)

    grad = jax.grad(f)(x)
    assert isinstance(grad, FrozenConst) and not grad.is_concrete
    np.testing.assert_array_equal(np.asarray(grad), np.zeros((4, 3), np.float32))  # a constant has none
    assert not np.shares_memory(np.asarray(grad), np.asarray(x))

    mapped = jax.vmap(lambda c: jax.tree_util.tree_map(lambda v: v * 3, c))(x)
    assert isinstance(mapped, FrozenConst) and not mapped.is_concrete
    np.testing.assert_allclose(np.asarray(mapped), data * 3)

    doubled = jax.tree_util.tree_map(lambda leaf: leaf * 2, {"t": x})["t"]
    assert isinstance(doubled, FrozenConst) and not doubled.is_concrete
    np.testing.assert_allclose(np.asarray(doubled), data * 2)
    assert not np.asarray(doubled).flags.writeable

    shapes = jax.eval_shape(lambda c: c, x)
    assert isinstance(shapes, FrozenConst) and shapes.shape == (4, 3)


def test_jit_argument_costs_no_transfer_and_never_retraces():
    traces = []

    @jax.jit
    def f(c):
        traces.append(1)
        return c * 2

    a, b = FrozenConst(unique_data()), FrozenConst(unique_data())
    f(a)
    with jax.transfer_guard("disallow"):
        jnp.asarray(b)  # explicit: allowed
    with jax.transfer_guard_host_to_device("disallow_explicit"):
        f(a)
        f(b)  # a different instance, same shape and dtype
    assert len(traces) == 1
    assert live_copies(np.asarray(a)) == 1


def test_pytree_structure():
    x = FrozenConst(np.ones(3))
    leaves, treedef = jax.tree_util.tree_flatten({"a": x, "b": 1})
    assert leaves[0] is jnp.asarray(x)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(x)[0]]
    assert paths == [".value"]
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(rebuilt["a"], FrozenConst)


def test_constructing_from_a_derived_value_copies_it():
    x = FrozenConst(np.arange(3.0, dtype=np.float32))
    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        derived = jax.tree_util.tree_map(lambda v: v + 1, x)
    y = FrozenConst(derived)
    assert y.is_concrete
    np.testing.assert_array_equal(np.asarray(y), [1.0, 2.0, 3.0])


# -- array protocols, as a jax.Array answers them ---------------------------------------------------


def test_array_api_code_takes_a_constant_as_it_takes_a_jax_array():
    data = unique_data((4, 3))
    x, a = FrozenConst(data), jnp.asarray(data)
    assert x.__array_namespace__() is a.__array_namespace__() is jnp
    version = jnp.__array_api_version__  # the version this JAX offers ("2024.12" to "2025.12")
    with pytest.raises(ValueError, match="api_version") as theirs:
        a.__array_namespace__(api_version="1999.01")
    with pytest.raises(ValueError, match="api_version") as ours:
        x.__array_namespace__(api_version="1999.01")
    assert str(ours.value) == str(theirs.value)
    assert x.__array_namespace__(api_version=version) is a.__array_namespace__(api_version=version)

    def standardized(v):  # array-API code: whatever namespace its argument names
        xp = v.__array_namespace__()
        return (v - xp.mean(v, axis=0)) / xp.std(v, axis=0)

    np.testing.assert_array_equal(np.asarray(standardized(x)), np.asarray(standardized(a)))


def test_in_compares_as_a_jax_array_does_not_element_by_element(monkeypatch):
    # `-1.0 in x` compares as for a jax.Array, never by iterating the constant in Python,
    # element by element.
    data = np.arange(20_000, dtype=np.float32)
    x, a = FrozenConst(data), jnp.asarray(data)

    def iterated(self):
        raise AssertionError("`in` iterated the constant in Python")

    monkeypatch.setattr(FrozenConst, "__iter__", iterated)
    for value in (-1.0, 5.0, 19_999, FrozenConst(7.0)):
        assert (value in x) == (value in a)


def test_block_until_ready_returns_the_constant_and_device_get_its_numpy_data():
    data = unique_data((8, 8))
    x, a = FrozenConst(data), jnp.asarray(data)
    assert x.block_until_ready() is x  # as `a.block_until_ready() is a`
    assert a.block_until_ready() is a
    got, expected = jax.device_get(x), jax.device_get(a)
    assert type(got) is type(expected) is np.ndarray  # NumPy data, not a FrozenConst wrapping it
    assert got.dtype == expected.dtype and not got.flags.writeable
    np.testing.assert_array_equal(got, expected)
    tree = jax.device_get({"t": x, "a": a, "n": 3})
    assert type(tree["t"]) is np.ndarray and tree["n"] == 3
    if on_cpu():  # the CPU device buffer aliases the frozen host data: no copy at all
        assert np.shares_memory(got, np.asarray(x))


# -- jax.numpy's ufunc methods and jax.lax.linalg --------------------------------------

# The methods JAX computes with a loop of its own (`lax.scan`, `fori_loop`: there is no XLA
# operation for them), which converts the argument with `jax.lax.asarray`; it takes only
# arrays and scalars. The same on every JAX tested (0.8.1, 0.9.2, 0.10.2, 0.12.1), listed in
# docs/jax.md. `frompyfunc` stands for any ufunc made with `jnp.frompyfunc`.
_UFUNC_METHODS_REFUSED = {
    "add": ("reduceat",),
    "bitwise_and": ("reduce", "accumulate", "reduceat", "at"),
    "bitwise_or": ("accumulate", "reduceat", "at"),
    "bitwise_xor": ("accumulate", "reduceat", "at"),
    "frompyfunc": ("reduce", "accumulate", "reduceat", "at"),
    "logaddexp": ("accumulate", "reduceat", "at"),
    "logaddexp2": ("accumulate", "reduceat", "at"),
    "logical_and": ("accumulate", "reduceat", "at"),
    "logical_or": ("accumulate", "reduceat", "at"),
    "logical_xor": ("accumulate", "reduceat", "at"),
    "maximum": ("accumulate", "reduceat", "at"),
    "minimum": ("accumulate", "reduceat", "at"),
    "multiply": ("reduceat",),
    "negative": ("at",),
    "subtract": ("reduce", "accumulate", "reduceat"),
}
# Where `jax.lax` takes a FrozenConst operand (JAX_LAX_REFUSES: where it refuses every one),
# `jax.lax.linalg` takes it too, but for these functions, which convert it with `lax.asarray`
# on the JAX versions named.
_LAX_LINALG_REFUSED = {
    "cholesky": ("0.12.1",),
    "eigh": ("0.12.1",),
    "tridiagonal": ("0.10.2", "0.12.1"),
}
_IDX = np.array([0, 2], np.int32)


def _ufuncs():
    found = {name: fn for name in dir(jnp) if isinstance(fn := getattr(jnp, name), jnp.ufunc)}
    return {**found, "frompyfunc": jnp.frompyfunc(lambda a, b: a * b + 1, nin=2, nout=1, identity=0)}


def _ufunc_calls(ufunc):
    calls = {"call": lambda a: ufunc(*[a] * ufunc.nin)}
    if ufunc.nin == 1:
        calls["at"] = lambda a: ufunc.at(a, _IDX, inplace=False)
    if ufunc.nin == 2 and ufunc.nout == 1:
        calls["reduce"] = lambda a: ufunc.reduce(a, axis=0)
        calls["accumulate"] = lambda a: ufunc.accumulate(a, axis=0)
        calls["reduceat"] = lambda a: ufunc.reduceat(a, _IDX, axis=0)
        calls["outer"] = lambda a: ufunc.outer(a[0], a[1])
        calls["at"] = lambda a: ufunc.at(a, _IDX, a[0, 0], inplace=False)
    return calls


def _refused(call, data):
    """Whether `call` refuses a FrozenConst of `data` where it takes its cached buffer (then
    with the same result); None where the cached buffer is refused too (not this call's data)."""
    try:
        expected = call(jnp.asarray(data))
    except (TypeError, ValueError, NotImplementedError):  # `eig` and `schur` only on a CPU
        return None
    try:
        got = call(FrozenConst(data))
    except (TypeError, ValueError) as err:
        assert "asarray" in str(err) or "__jax_array__" in str(err), err  # JAX's conversion
        return True
    _same(got, expected)
    return False


def test_the_ufunc_methods_jax_runs_as_a_loop_are_the_ones_listed():
    floats = np.arange(1, 13, dtype=np.float32).reshape(4, 3) / 4
    ints = np.arange(1, 13, dtype=np.int32).reshape(4, 3)
    ufuncs = _ufuncs()
    found, tested = set(), 0
    for name, ufunc in ufuncs.items():
        for method, call in _ufunc_calls(ufunc).items():
            verdicts = [v for v in (_refused(call, floats), _refused(call, ints)) if v is not None]
            tested += bool(verdicts)
            if any(verdicts):
                found.add((name, method))
    assert found == {(name, m) for name, methods in _UFUNC_METHODS_REFUSED.items() for m in methods}
    assert len(ufuncs) >= 15 and tested >= 80, (len(ufuncs), tested)


def _linalg_examples():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4)).astype(np.float32)
    spd = (a @ a.T + 4 * np.eye(4)).astype(np.float32)
    b = rng.standard_normal((4, 2)).astype(np.float32)
    band = rng.standard_normal(4).astype(np.float32)
    lower = np.concatenate([[0], band[1:]]).astype(np.float32)
    upper = np.concatenate([band[:-1], [0]]).astype(np.float32)
    tau = rng.standard_normal(3).astype(np.float32)
    linalg = jax.lax.linalg
    return {
        "cholesky": (lambda m: linalg.cholesky(m), spd),
        "cholesky_update": (
            lambda r: linalg.cholesky_update(r, b[:, 0].copy()),
            np.linalg.cholesky(spd).T.copy(),
        ),
        "eig": (
            lambda m: linalg.eig(m, compute_left_eigenvectors=False, compute_right_eigenvectors=False),
            a,
        ),
        "eigh": (lambda m: linalg.eigh(m), spd),
        "hessenberg": (lambda m: linalg.hessenberg(m), a),
        "householder_product": (lambda m: linalg.householder_product(m, tau), a),
        "lu": (lambda m: linalg.lu(m), a),
        "lu_pivots_to_permutation": (
            lambda p: linalg.lu_pivots_to_permutation(p, 4),
            np.array([1, 1, 3, 3], np.int32),
        ),
        "ormqr": (lambda m: linalg.ormqr(m, tau, b), a),
        "qdwh": (lambda m: linalg.qdwh(m), a),
        "qr": (lambda m: linalg.qr(m), a),
        "schur": (lambda m: linalg.schur(m), a),
        "svd": (lambda m: linalg.svd(m), a),
        "symmetric_product": (lambda m: linalg.symmetric_product(m, spd), a),
        "triangular_solve": (
            lambda m: linalg.triangular_solve(m, b.T.copy(), left_side=False, lower=True),
            spd,
        ),
        "tridiagonal": (lambda m: linalg.tridiagonal(m), spd),
        "tridiagonal_solve": (lambda d: linalg.tridiagonal_solve(lower, d, upper, b), band + 5),
    }


@pytest.mark.skipif(jax.__version__ in JAX_LAX_REFUSES, reason="jax.lax refuses every FrozenConst operand")
def test_jax_lax_linalg_takes_a_frozenconst_but_where_listed():
    examples = _linalg_examples()
    public = {
        name
        for name in dir(jax.lax.linalg)
        if not name.startswith("_")
        and not name.endswith("_p")
        and inspect.isfunction(getattr(jax.lax.linalg, name))
    }
    assert public <= set(examples), sorted(public - set(examples))  # a new function needs an example
    found, unrun = set(), set()
    for name, (call, data) in examples.items():
        for use in (call, jax.jit(call)):
            verdict = _refused(use, data)
            if verdict is None:
                unrun.add(name)
            elif verdict:
                found.add(name)
    # Every example runs with the cached buffer: but where JAX computes the function on no
    # device of this platform (these three on the CPU only).
    assert unrun <= (set() if on_cpu() else {"eig", "hessenberg", "schur"}), sorted(unrun)
    assert found == {name for name, versions in _LAX_LINALG_REFUSED.items() if jax.__version__ in versions}


def test_docs_list_the_ufunc_methods_and_lax_linalg_functions_that_refuse():
    text = (pathlib.Path(__file__).parent.parent / "docs" / "jax.md").read_text()
    section = text.split("## jax.numpy's ufunc methods and jax.lax.linalg")[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| `jax\.numpy\.(\w+)` \| ([\w, `]+) \|", section, re.MULTILINE))
    assert {name: tuple(m.strip(" `") for m in methods.split(",")) for name, methods in rows.items()} == (
        _UFUNC_METHODS_REFUSED
    )
    rows = re.findall(r"^\| `jax\.lax\.linalg\.(\w+)` \| ([\d., ]+) \|", section, re.MULTILINE)
    assert {name: tuple(v.strip() for v in versions.split(",")) for name, versions in rows} == (
        _LAX_LINALG_REFUSED
    )
