"""FrozenConst where JAX expects a jax.Array: operators, methods, jax.numpy, transformations."""

import inspect
import operator
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import live_copies, unique_data

from frozenconst import FrozenConst


def _same(a, b):
    """Equal results: same pytree structure, types, dtypes, shapes and values (NaN-aware)."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for u, v in zip(la, lb, strict=True):
        assert type(u) is type(v), (type(u), type(v))
        if isinstance(u, (jax.Array, np.ndarray)):
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        else:
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
    try:
        expected = fn(ref)
    except Exception as err:
        with pytest.raises(type(err)):
            fn(x)
        return
    _same(fn(x), expected)


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

# Methods whose call needs an argument: a value that works for the float matrix below.
_METHOD_ARGS = {
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
# Not comparable by value: buffer handles and identities, and the one call that frees.
_HANDLES = {
    "at",
    "device_buffer",
    "device_buffers",
    "addressable_data",
    "addressable_shards",
    "global_shards",
    "unsafe_buffer_pointer",
    "copy_to_host_async",
    "block_until_ready",
    "on_device_size_in_bytes",
    "traceback",
    "sharding",
    "format",
    "layout",
    "committed",
    "is_deleted",
}


def _public_array_members():
    names = sorted(n for n in dir(jax.Array) if not n.startswith("_"))
    assert len(names) > 60, names  # the sweep is over the real API, not a short list
    return names


@pytest.mark.parametrize("name", _public_array_members())
def test_every_jax_array_member_matches(name):
    data = np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4)
    x, ref = FrozenConst(data), jnp.asarray(data)
    if name == "delete":
        with pytest.raises(AttributeError, match="evict"):
            getattr(x, name)
        return
    if name in _HANDLES:
        # Present, and about the very buffer jnp.asarray(x) gives.
        assert hasattr(x, name)
        return
    if name == "nbytes":
        assert x.nbytes == data.nbytes  # host bytes; equal to the device's here (float32)
        return
    member = inspect.getattr_static(jax.Array, name)
    if name == "item":
        x, ref = FrozenConst(np.float32(2.0)), jnp.asarray(np.float32(2.0))
    if callable(member):
        args = _METHOD_ARGS.get(name, ())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _same_outcome(lambda a: getattr(a, name)(*args), x, ref)
    else:
        _same_outcome(lambda a: getattr(a, name), x, ref)


def test_at_updates_return_new_arrays_and_leave_the_constant():
    x = FrozenConst(np.zeros(3, np.float32))
    y = x.at[1].set(5.0)
    assert isinstance(y, jax.Array)
    np.testing.assert_array_equal(y, [0, 5, 0])
    np.testing.assert_array_equal(np.asarray(x), [0, 0, 0])
    np.testing.assert_array_equal(np.asarray(x + 0), [0, 0, 0])


# -- jax.numpy, jax.numpy.linalg, jax.numpy.fft: a sweep over public functions ------

_CANDIDATES = {
    "matrix": np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], np.float32),
    "vector": np.array([0.5, 1.5, 2.5, -1.0], np.float32),
    "ints": np.array([3, 1, 2, 5], np.int32),
    "bools": np.array([True, False, True]),
}
_CALL_FORMS = [lambda a: (a,), lambda a: (a, a), lambda a: (a, 1), lambda a: (a, 0, 1)]
# Functions that take array arguments but whose output is the input's identity or
# type-level information rather than a computed result.
_NOT_VALUE_FUNCTIONS = {"isdtype", "issubdtype", "dtype", "iinfo", "finfo", "promote_types", "can_cast"}
# Documented differences (docs/jax.md): these read the Python buffer protocol,
# which a Python class can only offer from Python 3.12 on (PEP 688).
_BUFFER_PROTOCOL = {"frombuffer"}


def _public_functions(module):
    for name in sorted(dir(module)):
        fn = getattr(module, name)
        if (
            name.startswith("_")
            or not callable(fn)
            or inspect.isclass(fn)
            or name in _NOT_VALUE_FUNCTIONS | _BUFFER_PROTOCOL
        ):
            continue
        if inspect.ismodule(fn):
            continue
        yield name, fn


def _sweep(module):
    tested, mismatched = [], []
    for name, fn in _public_functions(module):
        for candidate in _CANDIDATES.values():
            ref = jnp.asarray(candidate)
            for form in _CALL_FORMS:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        expected = fn(*form(ref))
                except Exception:
                    continue
                if not all(
                    isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool, complex))
                    for leaf in jax.tree_util.tree_leaves(expected)
                ):
                    break
                x = FrozenConst(candidate)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        got = fn(*form(x))
                    _same(got, expected)
                except Exception as err:  # collected and reported below
                    mismatched.append(f"{module.__name__}.{name}: {type(err).__name__}: {err}"[:300])
                tested.append(name)
                break
            else:
                continue
            break
    return tested, mismatched


@pytest.mark.parametrize(
    ("module", "minimum"), [(jnp, 280), (jnp.linalg, 20), (jnp.fft, 14)], ids=["jnp", "linalg", "fft"]
)
def test_every_numpy_function_accepts_a_frozenconst(module, minimum):
    tested, mismatched = _sweep(module)
    assert not mismatched, "\n".join(mismatched)
    assert len(tested) >= minimum, f"only {len(tested)} functions of {module.__name__} were exercised"


def test_lax_needs_asarray_by_design():
    x = FrozenConst(np.ones(3, np.float32))
    # jax.lax refuses __jax_array__ objects (JEP 28661); jnp.asarray is the documented bridge.
    with pytest.raises((TypeError, ValueError), match=r"__jax_array__|register"):
        jax.lax.add(x, x)
    _same(jax.lax.add(jnp.asarray(x), jnp.asarray(x)), jnp.full(3, 2.0))


# -- transformations and pytrees ---------------------------------------------------


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
    np.testing.assert_array_equal(np.asarray(grad), np.full((4, 3), 2.0, np.float32))
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
    y = FrozenConst(jax.tree_util.tree_map(lambda v: v + 1, x))
    assert y.is_concrete
    np.testing.assert_array_equal(np.asarray(y), [1.0, 2.0, 3.0])
