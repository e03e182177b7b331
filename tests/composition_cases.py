"""frozenconst.jit composed with JAX's transformations, compared with the same composition built
with `jax.jit`.

Imported by test_composition.py on this process's devices, and run by it in a pytest subprocess
of its own with two CPU devices (`FROZENCONST_CPU_DEVICES=2`), under each constant pipeline:
`jax_num_cpu_devices` must be set before JAX's backend starts.
"""

import os

import jax

if os.environ.get("FROZENCONST_CPU_DEVICES"):
    jax.config.update("jax_num_cpu_devices", int(os.environ["FROZENCONST_CPU_DEVICES"]))

import functools
import gc

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import single_device_sharding
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import frozenconst
from frozenconst import FrozenConst

# 8 KiB: above `embed_max_bytes`, so a parameter of frozenconst.jit's programs under both pipelines
# (a captured buffer under the simplified one on a single device).
TABLE = np.random.default_rng(19).standard_normal((512, 4)).astype(np.float32)
CONST = FrozenConst(TABLE)


def _base(w):
    return jnp.sum(jnp.tanh(CONST @ w) ** 2)


def _summed(fun):
    """A plain decorator, as users write them: `functools.wraps`, and the output summed."""

    @functools.wraps(fun)
    def wrapper(*args, **kwargs):
        return jnp.sum(fun(*args, **kwargs))

    return wrapper


def _scaled(fun):
    """`functools.partial` around the function, with a keyword it passes on."""

    def call(w, *, scale):
        return fun(w) * scale

    return functools.partial(call, scale=0.5)


# Each layer: (name, build(fun, jit) -> fun, what it needs of the output, what it does to the shapes).
LAYERS = ("grad", "vmap", "jit", "frozenconst.jit", "partial", "decorator")


def build(stack, jit_for_frozenconst):
    """The function `stack` builds around `_base`, bottom first, and the input's shape.

    `jit_for_frozenconst` is what a "frozenconst.jit" layer (and the base, when wrapped) is built
    with: `frozenconst.jit` for the stack under test, `jax.jit` for the reference. A `grad` layer on
    a function whose output is not a scalar gets a summing decorator first.
    """
    fun, scalar, batch = _base, True, 0
    for layer in stack:
        if layer == "grad":
            if not scalar:
                fun = _summed(fun)
            fun, scalar = jax.grad(fun), False
        elif layer == "vmap":
            fun, scalar, batch = jax.vmap(fun), False, batch + 1
        elif layer == "jit":
            fun = jax.jit(fun)
        elif layer == "frozenconst.jit":
            fun = jit_for_frozenconst(fun)
        elif layer == "partial":
            fun = _scaled(fun)
        else:
            fun, scalar = _summed(fun), True
    return fun, (3,) * batch + (4,)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.lists(st.sampled_from(LAYERS), min_size=1, max_size=4))
def test_a_stack_of_transformations_computes_what_the_jax_jit_stack_computes(at_the_bottom, layers):
    # frozenconst.jit on top, and often at the bottom too: a wrapper of a frozenconst.jit function,
    # wrapped again, must run the wrapper.
    stack = (["frozenconst.jit"] if at_the_bottom else []) + layers + ["frozenconst.jit"]
    ours, shape = build(stack, frozenconst.jit)
    theirs, _ = build(stack, jax.jit)
    w = jnp.asarray(np.random.default_rng(len(stack)).standard_normal(shape).astype(np.float32))
    got, want = ours(w), theirs(w)
    assert jnp.shape(got) == jnp.shape(want), stack
    # Where the constant is a parameter rather than embedded, XLA folds and fuses the program
    # differently, so float32 rounding differs by a few ulps of the terms summed: an element
    # that cancels to near zero keeps an error of the array's scale, not its own.
    want = np.asarray(want)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-6 * scale, err_msg=str(stack))


def test_a_function_traced_after_one_that_met_its_constant_late_computes_with_the_constant():
    # `frozenconst.jit(partial(jax.jit(_base)))` meets CONST only by tracing (a partial hides the
    # code): its first trace stands zeros in for it inside the inner `jax.jit`, and is redone.
    # The next function's trace must not reuse that trace's context value: it would get JAX's
    # cached inner trace, zeros and all, and return zeros.
    for stack in (["jit", "partial", "frozenconst.jit"], ["jit", "frozenconst.jit"]):
        ours, _ = build(stack, frozenconst.jit)
        theirs, _ = build(stack, jax.jit)
        w = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
        np.testing.assert_allclose(np.asarray(ours(w)), np.asarray(theirs(w)), rtol=2e-5, err_msg=str(stack))
        del ours, theirs
        gc.collect()  # the first function's traces gone: their context values free again


def test_wrapping_a_wrapper_of_a_frozenconst_jit_function_runs_the_wrapper():
    # Both forms must run the transformation around the inner function, not skip it.
    loss = frozenconst.jit(lambda w: jnp.sum(w**2))
    np.testing.assert_array_equal(frozenconst.jit(jax.grad(loss))(jnp.arange(4.0)), [0.0, 2.0, 4.0, 6.0])
    row_sums = frozenconst.jit(jax.vmap(frozenconst.jit(lambda r: jnp.sum(r))))(jnp.ones((8, 4)))
    np.testing.assert_array_equal(row_sums, np.full(8, 4.0, np.float32))


@pytest.mark.parametrize("name", ["_constants", "_jitted", "_plain", "_fun", "single", "_kwargs"])
def test_a_callable_whose_attributes_share_our_names_is_run_as_it_is(name):
    class Scaled:
        def __call__(self, w):
            return jnp.sum(CONST @ w) * 2

    fun = Scaled()
    setattr(fun, name, {"not": "frozenconst's"})
    w = jnp.ones(4)
    np.testing.assert_allclose(frozenconst.jit(fun)(w), jax.jit(fun)(w), rtol=1e-6)
    # JAX copies the callable's attributes onto its wrapper; so does frozenconst.jit.
    assert getattr(frozenconst.jit(fun), "__dict__", {}).get(name) == {"not": "frozenconst's"}


# -- the transformations of a frozenconst.jit function, on one device or several ------------------

TRANSFORMS = {
    "grad": lambda f, w: jax.grad(f)(w),
    "vmap": lambda f, w: jax.vmap(f)(jnp.stack([w, 2 * w, 3 * w])),
    "jax.jit": lambda f, w: jax.jit(f)(w),
    "eval_shape": lambda f, w: jax.eval_shape(f, w),
    "make_jaxpr": lambda f, w: jax.make_jaxpr(f)(w).out_avals,
    "vjp": lambda f, w: jax.vjp(f, w)[1](jnp.float32(1.0)),
    "linearize": lambda f, w: jax.linearize(f, w)[1](w),
    "jacfwd": lambda f, w: jax.jacfwd(f)(w),
}


def _assert_same(got, want):
    if isinstance(want, (jax.ShapeDtypeStruct, jax.core.ShapedArray)):
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    else:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_a_transformation_of_a_frozenconst_jit_function_computes_what_jax_jit_computes(name):
    # A constant without a declared sharding: on several devices it follows the computation's mesh.
    w = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    got = TRANSFORMS[name](frozenconst.jit(_base), w)
    want = TRANSFORMS[name](jax.jit(_base), w)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    jax.tree.map(_assert_same, got, want)


def _set_mesh(mesh):
    # `jax.set_mesh` is public from jax 0.7.2; before, `jax.sharding.use_mesh`.
    return jax.set_mesh(mesh) if hasattr(jax, "set_mesh") else jax.sharding.use_mesh(mesh)


@pytest.mark.parametrize("jit", [jax.jit, frozenconst.jit], ids=["jax.jit", "frozenconst.jit"])
def test_on_a_partition_spec_under_set_mesh_inside_a_jitted_function(jit):
    n = jax.device_count()
    data = np.arange(n * 256 * 2, dtype=np.float32).reshape(n * 256, 2)
    x = FrozenConst(data)
    mesh = jax.make_mesh((n,), ("i",))
    with _set_mesh(mesh):
        out = jit(lambda w: x.on(P("i")) * w)(jnp.float32(2.0))
        placed = x.on(P("i"))
    np.testing.assert_array_equal(np.asarray(out), data * 2)
    assert placed.sharding == NamedSharding(mesh, P("i"))


def test_in_shardings_given_once_applies_to_the_arguments_not_to_the_constants():
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("i",))
    sharding = NamedSharding(mesh, P("i"))
    # Rows that no device count above one divides: the constant cannot take the arguments' sharding.
    odd = FrozenConst(np.ones((2 * n + 1, 300), np.float32))

    def fun(w, v):
        return jnp.sum(odd) + w * v

    w = jax.device_put(jnp.arange(2.0 * n, dtype=jnp.float32), sharding)
    want = jax.jit(fun, in_shardings=sharding)(w, w)
    got = frozenconst.jit(fun, in_shardings=sharding)(w, w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Equivalent placements (jax 0.6.2 names a one-device mesh's output `P()` where it names `P("i")`).
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got.sharding, want.sharding)
    # The constant keeps its own placement: one buffer, on the default device.
    assert odd.on(jax.devices()[0]).sharding == single_device_sharding(jax.devices()[0])
    lowered = frozenconst.jit(fun, in_shardings=sharding).lower(w, w)
    assert len(lowered.as_text()) < odd.nbytes
