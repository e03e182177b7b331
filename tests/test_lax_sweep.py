"""A FrozenConst in each array position of every public jax.lax function.

For every public function of `jax.lax` on the running JAX (computed, not listed by
hand), one or more example calls (`_EXAMPLES`, or a probe for the simple
elementwise ones) with a FrozenConst in one array position at a time (operands,
init values, updates, indices, values closed over in a body) give what the same
call gives with the FrozenConst's cached buffer there (`jnp.asarray(x)`): same
type, shape, dtype, weak type, committed flag, sharding and bits. Eagerly, closed
over in `jax.jit`, closed over in `frozenconst.jit` (a parameter of the program:
`embed_max_bytes=0`) and passed to `frozenconst.filter_jit`. Collectives run
inside `jax.vmap(..., axis_name=...)`, the FrozenConst closed over and mapped.

On the JAX versions in `JAX_LAX_REFUSES` (no hook to register FrozenConst's type
with), `jax.lax` refuses a FrozenConst operand: eagerly and under `jax.jit` in JAX's
own words, inside `frozenconst.jit` and `filter_jit` in frozenconst's, naming the
line, the call and the fix. Where a parameter takes a pytree, a FrozenConst is one
(a node with one leaf): what remains different is listed, per JAX version, in
`frozenconst._refusals.JAX_LAX_REFUSALS`. The functions that take no array,
or cannot run here, are listed with the reason; a test checks that every public
function is swept or listed.
"""

import functools
import inspect
import linecache
import pathlib
import re
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raw_numpy_lowers, single_device_sharding
from jax import lax

import frozenconst
from frozenconst import FrozenConst

# The refusal tables are the package's own list of what JAX refuses: the sweep checks them
# against JAX, so it reads them.
from frozenconst._refusals import JAX_LAX_REFUSALS, JAX_LAX_REFUSES

# -- example data: small, so that each compile costs little ---------------------------

V = np.array([0.5, 1.5, 2.5, -1.0], np.float32)
VP = np.array([1.0, 2.0, 0.5, 3.0], np.float32)  # positive
VB = V > 1.0
IV = np.array([3, 1, 2, 5], np.int32)
M = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], np.float32)
W3 = np.array([0.25, 1.0, 3.0], np.float32)
X = np.arange(12.0, dtype=np.float32).reshape(3, 4)  # rows: scan's xs, gather's operand
X2 = np.arange(8.0, dtype=np.float32).reshape(2, 4)  # mapped over an axis of size 2
X22 = np.arange(8.0, dtype=np.float32).reshape(2, 2, 2)
A3 = np.arange(12.0, dtype=np.float32).reshape(2, 2, 3)  # batch_matmul's lhs
B3 = np.arange(12.0, dtype=np.float32).reshape(2, 3, 2) / 4  # and rhs
C = np.array([1 + 2j, -0.5j, 3, 1j], np.complex64)
IMG = np.arange(32.0, dtype=np.float32).reshape(1, 2, 4, 4)  # NCHW
KER = np.full((3, 2, 2, 2), 0.5, np.float32)  # OIHW
KERL = np.full((3, 8, 3, 3), 0.25, np.float32)  # conv_general_dilated_local's: O, I*2*2, out H, W
IDX = np.array([[2], [0]], np.int32)  # gather and scatter indices
XT = X.T.copy()  # ragged_dot's lhs (its rhs: B3)
STARTS = np.array([1, 1], np.int32)
GROUPS = np.array([1, 3], np.int32)  # ragged_dot's group sizes
KEY = np.array([1, 2, 3, 4], np.uint32)
S = np.float32(2.0)
Z = np.float32(0.0)
N0, N1, N2, N3 = np.int32(0), np.int32(1), np.int32(2), np.int32(3)
T = np.bool_(True)

GATHER = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
SCATTER = lax.ScatterDimensionNumbers(
    update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,)
)
CONTRACT = (((1,), (0,)), ((), ()))
NCHW = ("NCHW", "OIHW", "NCHW")
PADS = [(0, 1), (1, 0)]
RAGGED = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (1,)), ((), ())), lhs_ragged_dimensions=(0,), rhs_group_dimensions=(0,)
)


class Example(NamedTuple):
    """A call as a function of its arrays (each NumPy array or scalar an array position,
    given a FrozenConst in turn), and the name of each position."""

    run: Callable[..., Any]
    arrays: tuple[Any, ...]
    labels: tuple[str, ...]


def ex(run: Callable[..., Any], *arrays: Any) -> Example:
    """An example: `run`'s parameters name its positions after the `jax.lax` parameter each
    is given to (`operands_0`, `operands_1`: two positions of `operands`)."""
    return Example(
        run, arrays, tuple(re.sub(r"_\d+$", "", name) for name in inspect.signature(run).parameters)
    )


# Collectives run in `jax.vmap(..., axis_name="i")` over an axis of size 2, the FrozenConst
# closed over (unmapped: `_AXIS` is mapped) or mapped itself.
_AXIS = np.arange(2, dtype=np.int32)


def _vmapped(f: Callable[[Any], Any], mapped: Any) -> Any:
    return jax.vmap(f, axis_name="i")(mapped)


def _newton(f: Any, x0: Any) -> Any:
    return x0 - f(x0)  # exact for `custom_root`'s example below (f linear, slope 1)


def _tangent_solve(g: Any, y: Any) -> Any:
    return y  # g is the identity there


def _sum(a: Any, b: Any) -> Any:
    # Not `lax.add`: JAX's path for a known monoid needs the init value concrete, which a
    # jax.Array closed over in `jax.jit` is not.
    return a + b


def _add_pairs(a: Any, b: Any) -> Any:
    return a[0] + b[0], a[1] + b[1]


def _one_device() -> Any:
    return single_device_sharding(jax.devices()[0])


# Example calls, by function name; each lambda on one line where it fits, since a refusal
# names the line and the `jax.lax` call on it. A function not here (nor listed below)
# gets the probe: the same candidate in every required parameter, the first that works.
_EXAMPLES: dict[str, list[Example]] = {
    "all_gather": [
        ex(lambda x: _vmapped(lambda i: lax.all_gather(x, "i"), _AXIS), V),
        ex(lambda x: _vmapped(lambda r: lax.all_gather(r, "i"), x), X2),
    ],
    "all_gather_invariant": [ex(lambda x: _vmapped(lambda r: lax.all_gather_invariant(r, "i"), x), X2)],
    "all_to_all": [ex(lambda x: _vmapped(lambda r: lax.all_to_all(r, "i", 0, 0), x), X22)],
    "approx_max_k": [ex(lambda operand: lax.approx_max_k(operand, 2), V)],
    "approx_min_k": [ex(lambda operand: lax.approx_min_k(operand, 2), V)],
    "argmax": [ex(lambda operand: lax.argmax(operand, 0, np.int32), V)],
    "argmin": [ex(lambda operand: lax.argmin(operand, 0, np.int32), V)],
    "associative_scan": [
        ex(lambda elems: lax.associative_scan(lax.add, elems), V),
        ex(lambda elems, w: lax.associative_scan(lambda a, b: a + b * w[0], elems), V, VP),
    ],
    "batch_matmul": [ex(lambda lhs, rhs: lax.batch_matmul(lhs, rhs), A3, B3)],
    "bitcast_convert_type": [ex(lambda operand: lax.bitcast_convert_type(operand, np.int32), V)],
    "broadcast": [ex(lambda operand: lax.broadcast(operand, (2,)), V)],
    "broadcast_in_dim": [ex(lambda operand: lax.broadcast_in_dim(operand, (2, 4), (1,)), V)],
    "broadcast_like": [ex(lambda arr, like_arr: lax.broadcast_like(arr, like_arr), V, X)],
    "broadcast_to_rank": [ex(lambda x: lax.broadcast_to_rank(x, 2), V)],
    "clamp": [ex(lambda min, x, max: lax.clamp(min, x, max), Z, V, S)],
    "collapse": [ex(lambda operand: lax.collapse(operand, 0, 2), X)],
    "composite": [ex(lambda x, y, w: lax.composite(lambda a, b: a * b + w, "fc.scaled")(x, y), V, VP, S)],
    "concatenate": [ex(lambda operands_0, operands_1: lax.concatenate([operands_0, operands_1], 0), V, VP)],
    "cond": [
        ex(lambda pred, operand, w: lax.cond(pred, lambda a: a * w, jnp.sin, operand), T, V, VP),
        ex(lambda pred, operand: lax.cond(pred, jnp.sin, lambda a: a, operand), T, V),  # one gives it back
    ],
    "conv": [ex(lambda lhs, rhs: lax.conv(lhs, rhs, (1, 1), "SAME"), IMG, KER)],
    "conv_general_dilated": [
        ex(lambda lhs, rhs: lax.conv_general_dilated(lhs, rhs, (1, 1), "SAME"), IMG, KER),
    ],
    "conv_general_dilated_local": [
        ex(lambda lhs, rhs: lax.conv_general_dilated_local(lhs, rhs, (1, 1), "VALID", (2, 2)), IMG, KERL),
    ],
    "conv_general_dilated_patches": [
        ex(lambda lhs: lax.conv_general_dilated_patches(lhs, (2, 2), (1, 1), "SAME"), IMG),
    ],
    "conv_transpose": [
        ex(lambda lhs, rhs: lax.conv_transpose(lhs, rhs, (1, 1), "SAME", dimension_numbers=NCHW), IMG, KER),
    ],
    "conv_with_general_padding": [
        ex(lambda lhs, rhs: lax.conv_with_general_padding(lhs, rhs, (1, 1), PADS, None, None), IMG, KER),
    ],
    "convert_element_type": [ex(lambda operand: lax.convert_element_type(operand, np.int32), V)],
    "custom_linear_solve": [
        ex(lambda b, w: lax.custom_linear_solve(lambda v: v * w, b, lambda _, r: r / w), V, VP),
    ],
    "custom_root": [
        ex(
            lambda initial_guess, w: lax.custom_root(lambda v: v - w, initial_guess, _newton, _tangent_solve),
            V,
            VP,
        ),
    ],
    "dot": [ex(lambda lhs, rhs: lax.dot(lhs, rhs), M, W3)],
    "dot_general": [ex(lambda lhs, rhs: lax.dot_general(lhs, rhs, CONTRACT), M, W3)],
    "dynamic_index_in_dim": [ex(lambda operand, index: lax.dynamic_index_in_dim(operand, index, 0), X, N1)],
    "dynamic_slice": [
        ex(lambda operand, start_indices: lax.dynamic_slice(operand, start_indices, (2, 2)), X, STARTS),
        ex(
            lambda operand, start_0, start_1: lax.dynamic_slice(operand, (start_0, start_1), (2, 2)),
            X,
            N1,
            N2,
        ),
    ],
    "dynamic_slice_in_dim": [ex(lambda operand, start: lax.dynamic_slice_in_dim(operand, start, 2), V, N1)],
    "dynamic_update_index_in_dim": [
        ex(lambda operand, update, i: lax.dynamic_update_index_in_dim(operand, update, i, 0), X, V, N1),
    ],
    "dynamic_update_slice": [
        ex(lambda operand, update, starts: lax.dynamic_update_slice(operand, update, starts), X, X2, STARTS),
        ex(
            lambda operand, update, start_0: lax.dynamic_update_slice(operand, update, (start_0, 0)),
            X,
            X2,
            N1,
        ),
    ],
    "dynamic_update_slice_in_dim": [
        ex(lambda operand, update, i: lax.dynamic_update_slice_in_dim(operand, update, i, 0), V, VP[:2], N1),
    ],
    "expand_dims": [ex(lambda array: lax.expand_dims(array, (0,)), V)],
    "fft": [ex(lambda x: lax.fft(x, "FFT", (4,)), C)],
    "fori_loop": [
        ex(
            lambda lower, upper, init_val, w: lax.fori_loop(lower, upper, lambda _, c: c * w, init_val),
            N0,
            N3,
            V,
            VP,
        ),
    ],
    "full": [ex(lambda fill_value: lax.full((2, 3), fill_value), S)],
    "full_like": [ex(lambda x, fill_value: lax.full_like(x, fill_value), V, S)],
    "gather": [ex(lambda operand, indices: lax.gather(operand, indices, GATHER, (1, 4)), X, IDX)],
    "imag": [ex(lambda x: lax.imag(x), C)],
    "index_in_dim": [ex(lambda operand: lax.index_in_dim(operand, 1), X)],
    "index_take": [ex(lambda src, idxs: lax.index_take(src, (idxs,), (0,)), X, IDX[:, 0])],
    "integer_pow": [ex(lambda x: lax.integer_pow(x, 3), V)],
    "map": [
        ex(lambda xs, w: lax.map(lambda e: e * w, xs), X, VP),
        ex(lambda xs: lax.map(lambda e: e, xs), X),  # each element given back as it is
    ],
    "pad": [ex(lambda operand, padding_value: lax.pad(operand, padding_value, [(1, 2, 1)]), V, S)],
    "platform_dependent": [
        ex(lambda args, w: lax.platform_dependent(args, cpu=lambda a: a * w, default=jnp.sin), V, VP),
        ex(lambda args: lax.platform_dependent(args, cpu=lambda a: a, default=jnp.sin), V),
    ],
    "pmax": [
        ex(lambda x: _vmapped(lambda i: lax.pmax(x, "i"), _AXIS), V),
        ex(lambda x: _vmapped(lambda r: lax.pmax(r, "i"), x), X2),
    ],
    "pmean": [
        ex(lambda x: _vmapped(lambda i: lax.pmean(x, "i"), _AXIS), V),
        ex(lambda x: _vmapped(lambda r: lax.pmean(r, "i"), x), X2),
    ],
    "pmin": [
        ex(lambda x: _vmapped(lambda i: lax.pmin(x, "i"), _AXIS), V),
        ex(lambda x: _vmapped(lambda r: lax.pmin(r, "i"), x), X2),
    ],
    "polynomial": [
        ex(lambda x, coeffs_0, coeffs_1: lax.polynomial(x, [coeffs_0, coeffs_1, coeffs_0]), V, S, Z)
    ],
    "ppermute": [
        ex(lambda x: _vmapped(lambda i: lax.ppermute(x, "i", [(0, 1), (1, 0)]), _AXIS), V),
        ex(lambda x: _vmapped(lambda r: lax.ppermute(r, "i", [(0, 1), (1, 0)]), x), X2),
    ],
    "pshuffle": [ex(lambda x: _vmapped(lambda r: lax.pshuffle(r, "i", [1, 0]), x), X2)],
    "psum": [
        ex(lambda x: _vmapped(lambda i: lax.psum(x, "i"), _AXIS), V),
        ex(lambda x: _vmapped(lambda r: lax.psum(r, "i"), x), X2),
    ],
    "psum_scatter": [ex(lambda x: _vmapped(lambda r: lax.psum_scatter(r, "i", tiled=True), x), X2)],
    "pswapaxes": [ex(lambda x: _vmapped(lambda r: lax.pswapaxes(r, "i", 0), x), X22)],
    "pvary": [ex(lambda x: _vmapped(lambda r: lax.pvary(r, "i"), x), X2)],
    "ragged_dot": [ex(lambda lhs, rhs, group_sizes: lax.ragged_dot(lhs, rhs, group_sizes), XT, B3, GROUPS)],
    "ragged_dot_general": [
        ex(lambda lhs, rhs, groups: lax.ragged_dot_general(lhs, rhs, groups, RAGGED), XT, B3, GROUPS),
    ],
    "random_gamma_grad": [ex(lambda a, x: lax.random_gamma_grad(a, x), VP, VP)],
    "real": [ex(lambda x: lax.real(x), C)],
    "reduce": [
        ex(lambda operands, init_values: lax.reduce(operands, init_values, lax.add, (0,)), V, Z),
        ex(
            lambda operands_0, operands_1, init_values: lax.reduce(
                (operands_0, operands_1), (init_values, init_values), _add_pairs, (0,)
            ),
            V,
            VP,
            Z,
        ),
    ],
    "reduce_and": [ex(lambda operand: lax.reduce_and(operand, (0,)), VB)],
    "reduce_max": [ex(lambda operand: lax.reduce_max(operand, (0,)), V)],
    "reduce_min": [ex(lambda operand: lax.reduce_min(operand, (0,)), V)],
    "reduce_or": [ex(lambda operand: lax.reduce_or(operand, (0,)), VB)],
    "reduce_precision": [ex(lambda operand: lax.reduce_precision(operand, 5, 10), V)],
    "reduce_prod": [ex(lambda operand: lax.reduce_prod(operand, (0,)), V)],
    "reduce_sum": [ex(lambda operand: lax.reduce_sum(operand, (0,)), V)],
    "reduce_window": [
        ex(
            lambda operand, init_value: lax.reduce_window(operand, init_value, _sum, (2,), (1,), "SAME"),
            V,
            Z,
        ),
    ],
    "reduce_xor": [ex(lambda operand: lax.reduce_xor(operand, (0,)), IV)],
    "reshape": [ex(lambda operand: lax.reshape(operand, (2, 2)), V)],
    "rev": [ex(lambda operand: lax.rev(operand, (0,)), V)],
    "rng_bit_generator": [ex(lambda key: lax.rng_bit_generator(key, (2,)), KEY)],
    # Draws without a seed (XLA's RngUniform): each call draws anew, so what is compared
    # is that each draw lies within the bounds.
    "rng_uniform": [ex(lambda a, b: (lambda r: (r >= a) & (r < b))(lax.rng_uniform(a, b, (3,))), Z, S)],
    "scaled_dot": [ex(lambda lhs, rhs: lax.scaled_dot(lhs, rhs), M, M)],
    "scan": [
        ex(lambda init, xs, w: lax.scan(lambda c, e: (c * w + e, c - e), init, xs), V, X, VP),
        ex(lambda xs: lax.scan(lambda c, e: (c, e * 2), None, xs), X),
    ],
    "scatter": [ex(lambda operand, idx, updates: lax.scatter(operand, idx, updates, SCATTER), X, IDX, X2)],
    "scatter_add": [
        ex(lambda operand, idx, updates: lax.scatter_add(operand, idx, updates, SCATTER), X, IDX, X2),
    ],
    "scatter_apply": [
        ex(
            lambda operand, idx: lax.scatter_apply(operand, idx, jnp.sin, SCATTER, update_shape=(2, 4)),
            X,
            IDX,
        ),
    ],
    "scatter_max": [
        ex(lambda operand, idx, updates: lax.scatter_max(operand, idx, updates, SCATTER), X, IDX, X2),
    ],
    "scatter_min": [
        ex(lambda operand, idx, updates: lax.scatter_min(operand, idx, updates, SCATTER), X, IDX, X2),
    ],
    "scatter_mul": [
        ex(lambda operand, idx, updates: lax.scatter_mul(operand, idx, updates, SCATTER), X, IDX, X2),
    ],
    "scatter_sub": [
        ex(lambda operand, idx, updates: lax.scatter_sub(operand, idx, updates, SCATTER), X, IDX, X2),
    ],
    "select": [ex(lambda pred, on_true, on_false: lax.select(pred, on_true, on_false), VB, V, VP)],
    "select_n": [ex(lambda which, cases_0, cases_1: lax.select_n(which, cases_0, cases_1), VB, V, VP)],
    "slice": [ex(lambda operand: lax.slice(operand, (1,), (3,)), V)],
    "slice_in_dim": [ex(lambda operand: lax.slice_in_dim(operand, 1, 3), V)],
    "sort": [
        ex(lambda operand: lax.sort(operand), V),
        ex(lambda operand_0, operand_1: lax.sort((operand_0, operand_1), num_keys=1), V, IV),
    ],
    "sort_key_val": [ex(lambda keys, values: lax.sort_key_val(keys, values), V, IV)],
    "split": [ex(lambda operand: lax.split(operand, (1, 3)), V)],
    "squeeze": [ex(lambda array: lax.squeeze(array, (0,)), V[None])],
    "stack": [ex(lambda operands_0, operands_1: lax.stack([operands_0, operands_1]), V, VP)],
    "switch": [
        ex(lambda index, operand, w: lax.switch(index, [jnp.sin, lambda a: a * w], operand), N1, V, VP),
        ex(lambda index, operand: lax.switch(index, [jnp.sin, lambda a: a], operand), N1, V),
    ],
    "tile": [ex(lambda operand: lax.tile(operand, (2,)), V)],
    "top_k": [ex(lambda operand: lax.top_k(operand, 2), V)],
    "transpose": [ex(lambda operand: lax.transpose(operand, (1, 0)), X)],
    "unstack": [ex(lambda x: lax.unstack(x), X)],
    "while_loop": [
        ex(lambda init_val, w: lax.while_loop(lambda c: c[0] < w[1], lambda c: c + w, init_val), V, VP),
    ],
    "with_sharding_constraint": [ex(lambda x: lax.with_sharding_constraint(x, _one_device()), V)],
}


# Public functions that take no array, each with its reason.
_NO_ARRAY = {
    "ConvGeneralDilatedDimensionNumbers": "a type alias (typing), not a function",
    "DotDimensionNumbers": "a type alias (typing), not a function",
    "PrecisionLike": "a type alias (typing), not a function",
    "axis_index": "takes an axis name only",
    "axis_size": "takes an axis name only",
    "broadcast_shapes": "takes shapes (tuples of ints)",
    "broadcasted_iota": "takes a dtype, a shape and a dimension",
    "conv_dimension_numbers": "takes shapes and dimension-number specs",
    "conv_general_permutations": "takes dimension-number specs",
    "conv_general_shape_tuple": "takes shapes, strides and padding",
    "conv_shape_tuple": "takes shapes, strides and padding",
    "conv_transpose_shape_tuple": "takes shapes, strides and padding",
    "create_token": "makes a token; its one argument is ignored",
    "empty": "takes a shape and a dtype",
    "iota": "takes a dtype and a size",
    "padtype_to_pads": "takes shapes, strides and a padding name",
    "reduce_window_shape_tuple": "takes shapes, strides and padding",
    "shape_as_value": "takes a shape",
    # A dtype query, no array to compile or compare: `test_dtype_reads_a_frozenconst` checks it.
    "dtype": "returns a NumPy dtype, not an array",
    "after_all": "takes tokens (`create_token()`), not arrays",
}
# Public functions the sweep cannot run or compare here (one device, `jax.vmap` the only
# named axis), with the reason: they fail for a jax.Array too, or give no result.
_NOT_RUN_HERE = {
    "all_gather_done": "the second half of `all_gather_start`: no `jax.vmap` rule (`shard_map`)",
    "all_gather_start": "an asynchronous collective: no `jax.vmap` rule (`shard_map` over devices)",
    "psum_scatter_start": "an asynchronous collective: no `jax.vmap` rule (`shard_map` over devices)",
    "pbroadcast": "its `jax.vmap` rule fails for a jax.Array too (jax 0.10.2: `take requires ndarray`)",
    "pcast": "only under `jax.shard_map` (`pvary should be called under jax.shard_map`)",
    "precv": "a point-to-point receive, paired with `psend`, between devices under `shard_map`",
    "psend": "a point-to-point send, paired with `precv`, between devices under `shard_map`",
    "ragged_all_to_all": "only under `shard_map` over devices (no `jax.vmap` rule)",
    "infeed": "a host-to-device feed, which needs a host thread feeding the device",
    "outfeed": "a device-to-host feed, which needs a host thread reading it",
    "dce_sink": "returns nothing (keeps a value alive in the program): no result to compare",
    "all_gather_reduced": "only under `shard_map` over devices with reduced mesh axes (jax 0.8)",
    "unreduced_psum": "only under `shard_map` over devices with unreduced mesh axes (jax 0.8)",
    "unreduced_psum_scatter": "only under `shard_map` over devices with unreduced mesh axes (jax 0.8)",
}


# Functions of some of the JAX versions tested only, by the versions that have them.
_ELSEWHERE = {
    *("all_gather_invariant", "infeed", "outfeed", "pvary", "zeros_like_array"),  # 0.6.2
    *("all_gather_reduced", "preduced", "unreduced_psum", "unreduced_psum_scatter"),  # 0.8.1
    *("all_gather_done", "all_gather_start"),  # 0.9.2
    *("precv", "psend"),  # 0.9.2, 0.10.2
    *("dce_sink", "empty", "pcast", "scaled_dot", "tile"),  # 0.9.2, 0.10.2, 0.12.0.1
    *("broadcast_like", "mulhi", "stack", "stage", "unstack"),  # 0.10.2, 0.12.0.1
    *("log2", "one_minus_square", "polynomial", "psum_scatter_start"),  # 0.12.0.1
    # Type aliases that are callable `typing` unions up to 0.10.2 (`X | Y` in 0.12.0.1).
    *("ConvGeneralDilatedDimensionNumbers", "PrecisionLike"),
}


def _listed() -> dict[str, str]:
    return {**_NO_ARRAY, **_NOT_RUN_HERE}


def public_functions() -> dict[str, Any]:
    """Every public callable of `jax.lax` that is not a class, on this JAX."""
    return {
        name: fn
        for name in sorted(dir(lax))
        if not name.startswith("_") and callable(fn := getattr(lax, name)) and not inspect.isclass(fn)
    }


# -- the simple functions: a probe -----------------------------------------------------

_CANDIDATES = [V, IV, VB]


@functools.cache
def _probe(name: str, fn: Any) -> list[Example]:
    """The first call that works with plain arrays: the same candidate in every required
    positional parameter (one or two for `*args`)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    params = list(sig.parameters.values())
    required = [
        p.name
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    var = [p.name for p in params if p.kind is p.VAR_POSITIONAL]
    tries = [required] if required or not var else [var, var * 2]
    for labels in tries:
        for candidate in _CANDIDATES:
            example = Example(lambda *a: fn(*a), (candidate,) * len(labels), tuple(labels))
            got = outcome(lambda e=example: e.run(*_refs(e)))
            if got.ok and _is_result(got.value):
                return [example]
    return []


def examples(name: str, fn: Any) -> list[Example]:
    return _EXAMPLES.get(name) or _probe(name, fn)


# -- running a call, and what came of it -----------------------------------------------


class Outcome(NamedTuple):
    """What a call gave: its result or its exception, and the warnings it raised."""

    ok: bool
    value: Any
    warned: frozenset[str]


def outcome(run: Callable[[], Any]) -> Outcome:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # jax 0.6's conversion of a `__jax_array__` object, an error under this suite's
        # `filterwarnings = error` as under any user's: JAX's refusal there.
        warnings.filterwarnings("error", r".*__jax_array__", DeprecationWarning)
        # frozenconst.jit closes over the call's other arrays, as jax.Arrays; the warning that
        # JAX embeds them is about the harness, not the position under test.
        warnings.filterwarnings("ignore", r"frozenconst\.jit: .* closes over", frozenconst.FrozenConstWarning)
        try:
            value, ok = run(), True
        except Exception as err:
            value, ok = err, False
    return Outcome(ok, value, frozenset(f"{w.category.__name__}: {str(w.message)[:100]}" for w in caught))


class Program(NamedTuple):
    """What a jitted function traces (no compilation), and how to run it."""

    traced: Outcome  # of (jaxpr text, in and out avals, output tree), consts
    run: Callable[[], Any]


def program(jitted: Any, *args: Any) -> Program:
    def trace() -> Any:
        traced = jitted.trace(*args)
        jaxpr, out_tree = traced.jaxpr, jax.tree_util.tree_structure(traced.out_info)
        return (str(jaxpr), jaxpr.in_avals, jaxpr.out_avals, str(out_tree)), list(jaxpr.consts)

    return Program(outcome(trace), lambda: jitted(*args))


def _is_result(value: Any) -> bool:
    leaves = jax.tree_util.tree_leaves(value)
    return bool(leaves) and all(isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in leaves)


# -- comparing -------------------------------------------------------------------------


def _same_leaf(u: Any, v: Any) -> None:
    assert type(u) is type(v), (type(u), type(v))
    if isinstance(u, (jax.Array, np.ndarray, np.generic)):
        assert (u.dtype, u.shape) == (v.dtype, v.shape), ((u.dtype, u.shape), (v.dtype, v.shape))
        # Bits, not values: NaN equals NaN, -0.0 differs from 0.0.
        assert np.asarray(u).tobytes() == np.asarray(v).tobytes(), (u, v)
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
        # The array cannot be used so here either: the FrozenConst fails too.
        assert not got.ok, f"differs: works with a FrozenConst only (with the array: {expected.value!r:.100})"
        return
    if not got.ok:
        raise AssertionError(f"{type(got.value).__name__}: {got.value}") from got.value
    own = {w for w in got.warned - expected.warned if "__jax_array__" in w or "FrozenConst" in w}
    assert not own, f"warns: {sorted(own)}"
    try:
        same_result(got.value, expected.value)
    except AssertionError as err:
        raise AssertionError(f"differs: {err}") from None


def same_program(got: Program, expected: Program) -> None:
    """The same program over equal constants, or (another program) the same outcome when run."""
    both = expected.traced.ok and got.traced.ok
    if not both or got.traced.value[0] == expected.traced.value[0]:
        same_outcome(got.traced, expected.traced)
    else:
        same_outcome(outcome(got.run), outcome(expected.run))


# -- JAX's refusal, and frozenconst's -------------------------------------------------

_HERE = pathlib.Path(__file__).name
_OWN_REFUSALS = (
    frozenconst.FrozenConstValueError,
    frozenconst.FrozenConstTypeError,
    frozenconst.FrozenConstIndexError,
)


def _lines(code: Any) -> set[int]:
    """The source lines of a code object and of the functions defined in it."""
    found = {line for _, _, line in code.co_lines() if line is not None}
    for const in code.co_consts:
        if inspect.iscode(const):
            found |= _lines(const)
    return found


class Refused(Exception):
    """A check's verdict: the FrozenConst was refused, in the words the JAX version and the
    form of use call for."""


def jax_refuses(got: Outcome, expected: Outcome) -> None:
    """Raises `Refused` where JAX refused the FrozenConst in its own words (eagerly, under
    `jax.jit`) and the array worked; otherwise compares."""
    if expected.ok and not got.ok and "__jax_array__" in str(got.value):
        assert isinstance(got.value, (ValueError, TypeError, DeprecationWarning)), repr(got.value)
        raise Refused
    same_outcome(got, expected)


def frozenconst_refuses(got: Outcome, expected: Outcome, example: Example) -> None:
    """Raises `Refused` where frozenconst turned JAX's refusal into its own error, naming this
    file's line of the call, the call where that line names one, and `jnp.asarray`."""
    err = got.value
    if not expected.ok or got.ok or not isinstance(err, _OWN_REFUSALS):
        same_outcome(got, expected)
        return
    message = str(err)
    place = re.search(rf"{re.escape(_HERE)}:(\d+) ", message)
    assert place is not None, f"the refusal names no line of {_HERE}: {message[:300]}"
    lineno = int(place[1])
    assert lineno in _lines(example.run.__code__), (
        f"it names line {lineno}, not the example's: {message[:300]}"
    )
    assert "jnp.asarray" in message, message[:300]
    for called in re.findall(r"\blax\.(\w+)\s*\(", linecache.getline(__file__, lineno)):
        assert f"`jax.lax.{called}`" in message, f"the line calls jax.lax.{called}: {message[:400]}"
    raise Refused


# -- the sweep ---------------------------------------------------------------------------


def _refs(example: Example) -> list[Any]:
    # The cached buffers of FrozenConsts of the example's arrays: what a FrozenConst gives
    # wherever JAX converts it, so equal results mean equal metadata too.
    return [jnp.asarray(FrozenConst(a)) for a in example.arrays]


def _with(values: list[Any], i: int, value: Any) -> list[Any]:
    return [*values[:i], value, *values[i + 1 :]]


class _Case:
    """One example, with plain arrays (its cached buffers) everywhere: what each use gives,
    computed once, to compare each position's FrozenConst against."""

    def __init__(self, example: Example) -> None:
        self.example, self.refs = example, _refs(example)
        run, refs = example.run, self.refs
        self.eager = outcome(lambda: run(*refs))
        self.closed = program(jax.jit(lambda: run(*refs)))

    def works(self) -> bool:
        return self.eager.ok and _is_result(self.eager.value)

    def checks(self, i: int, x: FrozenConst) -> dict[str, Callable[[], None]]:
        """Each use of the example with `x` in position `i`: a check that raises AssertionError
        where it differs, `Refused` where it is refused in the words expected there."""
        run, refs = self.example.run, self.refs
        values = _with(refs, i, x)
        return {
            "eagerly": lambda: jax_refuses(outcome(lambda: run(*values)), self.eager),
            "closed over in jax.jit": lambda: self._closed_over_in_jax_jit(values),
            "closed over in frozenconst.jit": lambda: self._in_frozenconst_jit(i, x),
            "passed to frozenconst.filter_jit": lambda: self._in_filter_jit(i, x),
        }

    def _closed_over_in_jax_jit(self, values: list[Any]) -> None:
        run = self.example.run
        got = program(jax.jit(lambda: run(*values)))
        if not got.traced.ok:
            jax_refuses(got.traced, self.closed.traced)
        else:
            same_program(got, self.closed)

    def _as_argument(self, i: int) -> Program:
        run, refs = self.example.run, self.refs
        return program(jax.jit(lambda r: run(*_with(refs, i, r))), refs[i])

    def _in_frozenconst_jit(self, i: int, x: FrozenConst) -> None:
        # The constant a parameter of frozenconst.jit's program (`embed_max_bytes=0`): what
        # jax.jit gives with the array passed in. Or what it gives with the array closed
        # over: under JAX's simplified pipeline frozenconst.jit leaves a constant to JAX
        # (docs/jit.md). `x` is a free variable of the function, so that frozenconst.jit
        # finds it before tracing (one trace).
        run, refs = self.example.run, self.refs
        got = program(frozenconst.jit(lambda: run(*_with(refs, i, x)), embed_max_bytes=0))
        as_argument = self._as_argument(i)
        if not got.traced.ok:
            # Refused at the trace (`trace`, through `_frames.boundary`; filter_jit's check
            # below calls, through `JitWrapped.__call__`).
            frozenconst_refuses(got.traced, as_argument.traced, self.example)
            return
        expected = [p for p in (as_argument, self.closed) if p.traced.ok] or [as_argument]
        for program_ in expected:  # the same program first: nothing compiled
            if got.traced.value[0] == program_.traced.value[0]:
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

    def _in_filter_jit(self, i: int, x: FrozenConst) -> None:
        # The constant an argument of filter_jit's program: what filter_jit gives with the
        # array passed in. The same lowered program and output tree over equal inputs give
        # the same result (nothing compiled); otherwise both are run.
        run, refs = self.example.run, self.refs
        f = frozenconst.filter_jit(lambda r: run(*_with(refs, i, r)))

        def lowered(arg: Any) -> Outcome:
            return outcome(lambda: (lambda low: (low.as_text(), low.out_tree))(f.lower(arg)))

        got, expected = lowered(x), lowered(refs[i])
        if got.ok and expected.ok and got.value == expected.value and got.warned == expected.warned:
            return
        if not got.ok:
            # Refused at the lowering (`lower`) and at the call (`__call__`) alike.
            _both(frozenconst_refuses, got, outcome(lambda: f(x)), expected, self.example)
            return
        frozenconst_refuses(outcome(lambda: f(x)), outcome(lambda: f(refs[i])), self.example)


def _both(check: Callable[..., None], first: Outcome, second: Outcome, *args: Any) -> None:
    """`check` of two outcomes: an AssertionError from either, else `Refused` from either."""
    try:
        check(first, *args)
    finally:
        check(second, *args)


class Sweep(NamedTuple):
    swept: set[str]  # the functions with a working example
    tested: list[str]  # `function(label)`, one per position
    verdicts: dict[
        tuple[str, str], dict[str, str]
    ]  # (function, label) -> use -> "same", "refused" or what differed


def sweep(names: set[str]) -> Sweep:
    """Each array position of each example of each public function in `names`."""
    out = Sweep(set(), [], {})
    for name, fn in public_functions().items():
        if name not in names:
            continue
        for example in examples(name, fn):
            case = _Case(example)
            if not case.works():
                continue  # not this JAX's signature: the coverage test names what is left
            out.swept.add(name)
            for i, (label, value) in enumerate(zip(example.labels, example.arrays, strict=True)):
                out.tested.append(f"{name}({label})")
                verdicts = out.verdicts.setdefault((name, label), {})
                for how, check in case.checks(i, FrozenConst(value)).items():
                    try:
                        check()
                    except Refused:
                        verdict = "refused"
                    except AssertionError as err:
                        verdict = str(err)[:300]
                    else:
                        verdict = "same"
                    # Of two examples with a position of this name, the worse verdict.
                    if verdicts.get(how, "same") in ("same", "refused"):
                        verdicts[how] = verdict
    return out


def differences(out: Sweep) -> dict[str, list[str]]:
    """`jax.lax.function(label)` -> what differed in each use, for the positions where a
    FrozenConst does not give what its cached buffer gives: a different result, an error of
    JAX's, or a refusal where this JAX takes the FrozenConst."""
    found: dict[str, list[str]] = {}
    refuses = jax.__version__ in JAX_LAX_REFUSES
    for (name, label), verdicts in out.verdicts.items():
        key = f"jax.lax.{name}({label})"
        for how, verdict in verdicts.items():
            # A refusal (JAX's eagerly, frozenconst's inside its wrappers) is no difference where
            # this JAX refuses every operand; where the table lists the position, it is the
            # difference listed.
            if verdict == "same" or (verdict == "refused" and refuses and key not in _refusals_here()):
                continue
            if not raw_numpy_lowers() and "'TypedNdArray' object" in verdict:
                continue  # JAX's bug (jax 0.7 to 0.9, simplified pipeline), with a jax.Array too
            found.setdefault(key, []).append(f"{key} {how}: {verdict}")
    return found


def _refusals_here() -> set[str]:
    return {key for key, versions in JAX_LAX_REFUSALS.items() if jax.__version__ in versions}


# -- the tests -------------------------------------------------------------------------

# The sweep in parts, so that each test stays short.
_PARTS = {
    "lax[a-c]": lambda name: name.lower() < "d",
    "lax[d-o]": lambda name: "d" <= name.lower() < "p",
    "lax[p-r]": lambda name: "p" <= name.lower() < "s",
    "lax[s-z]": lambda name: name.lower() >= "s",
}


def _in_part(part: str) -> set[str]:
    return {name for name in public_functions() if _PARTS[part](name) and name not in _listed()}


@functools.cache
def _swept(part: str) -> Sweep:
    return sweep(_in_part(part))


@pytest.mark.slow  # a trace or a lowering per function, position and use; a compile where they differ
@pytest.mark.parametrize("part", list(_PARTS))
def test_each_array_position_takes_a_frozenconst_or_is_listed(part):
    found = differences(_swept(part))
    unlisted = {key: lines for key, lines in found.items() if key not in _refusals_here()}
    assert not unlisted, "\n".join(line for lines in unlisted.values() for line in lines)
    # And each listed for this JAX differs here: the table says where, on each version.
    listed = {key for key in _refusals_here() if key.removeprefix("jax.lax.").split("(")[0] in _in_part(part)}
    assert set(found) == listed, f"listed for jax {jax.__version__} but taken: {sorted(listed - set(found))}"


@pytest.mark.slow
@pytest.mark.parametrize("part", list(_PARTS))
def test_the_sweep_runs_an_example_of_every_function(part):
    out = _swept(part)
    unswept = _in_part(part) - out.swept
    assert not unswept, f"no example works on jax {jax.__version__}: {sorted(unswept)}"
    assert len(out.tested) >= len(out.swept)


@pytest.mark.slow
def test_jax_lax_refuses_a_frozenconst_operand_on_the_versions_listed():
    # Where `JAX_LAX_REFUSES` names this JAX, a plain operand is refused in every use: JAX's
    # words eagerly and under jax.jit, frozenconst's (naming the line, the call and the fix)
    # inside its wrappers. Elsewhere it is taken (and a refusal anywhere but where
    # `JAX_LAX_REFUSALS` says is a difference the sweep's test reports).
    out = _swept("lax[a-c]")
    expected = "refused" if jax.__version__ in JAX_LAX_REFUSES else "same"
    for label in ("x", "y"):
        assert set(out.verdicts["add", label].values()) == {expected}, out.verdicts["add", label]


def test_every_public_function_is_swept_or_listed():
    # A function a new JAX adds fails here until someone gives it an example or a reason.
    listed = _listed()
    assert not set(listed) & set(_EXAMPLES) & set(public_functions()), "both swept and listed"
    unplaced = [
        name for name, fn in public_functions().items() if name not in listed and not examples(name, fn)
    ]
    assert not unplaced, (
        f"jax {jax.__version__}: neither an example, a probe that works, nor a reason: {unplaced}"
    )
    # A name in the tables that this JAX lacks is one that another JAX tested has: a typo
    # there would exempt nothing, silently.
    named = {*_EXAMPLES, *_NO_ARRAY, *_NOT_RUN_HERE}
    named |= {key.removeprefix("jax.lax.").split("(")[0] for key in JAX_LAX_REFUSALS}
    assert named - set(public_functions()) <= _ELSEWHERE, sorted(named - set(public_functions()) - _ELSEWHERE)


def test_dtype_reads_a_frozenconst():
    x = FrozenConst(V)
    assert lax.dtype(x) == lax.dtype(jnp.asarray(x)) == np.float32


@pytest.mark.parametrize(
    "use",
    [
        lambda t, i: lax.dynamic_slice(t, (i, 0), (1, 4)),
        lambda t, i: lax.dynamic_index_in_dim(t, i),
        lambda t, i: jax.lax.add(t, t),
    ],
    ids=["dynamic_slice", "dynamic_index_in_dim", "add"],
)
def test_a_refusal_names_the_jax_lax_call_on_its_line(use):
    # A decoder's rotary-table read: takes the constant from jax 0.10; where
    # jax.lax refuses it, frozenconst's error names this line, the call and the fix.
    table = FrozenConst(X)
    expected = jax.jit(lambda i: use(jnp.asarray(table), i))(N1)
    for wrap in (lambda f: frozenconst.jit(f, embed_max_bytes=0), frozenconst.filter_jit):
        if jax.__version__ not in JAX_LAX_REFUSES:
            same_result(wrap(lambda i: use(table, i))(N1), expected)
            continue
        with pytest.raises(_OWN_REFUSALS, match=r"jnp\.asarray") as caught:
            wrap(lambda i: use(table, i))(N1)
        message = str(caught.value)
        assert f"{_HERE}:{use.__code__.co_firstlineno} (<lambda>)" in message
        (called,) = re.findall(r"lax\.(\w+)\(", linecache.getline(__file__, use.__code__.co_firstlineno))
        assert f"`jax.lax.{called}`" in message


def test_the_checks_tell_a_refusal_a_mismatch_and_a_match_apart():
    ok = Outcome(True, jnp.ones(2), frozenset())
    with pytest.raises(AssertionError, match=r"^differs"):
        same_outcome(Outcome(True, jnp.zeros(2), frozenset()), ok)
    with pytest.raises(AssertionError, match=r"^differs"):
        same_outcome(Outcome(True, jnp.ones(2, jnp.int32), frozenset()), ok)
    with pytest.raises(AssertionError, match=r"^differs"):  # bits: -0.0 is not 0.0
        same_outcome(
            Outcome(True, jnp.array([-0.0]), frozenset()), Outcome(True, jnp.array([0.0]), frozenset())
        )
    same_outcome(
        Outcome(True, jnp.array([np.nan]), frozenset()), Outcome(True, jnp.array([np.nan]), frozenset())
    )
    with pytest.raises(AssertionError, match=r"^differs"):  # weak type
        same_outcome(
            Outcome(True, jnp.asarray(1.0) * 1, frozenset()), Outcome(True, jnp.ones(()), frozenset())
        )
    with pytest.raises(AssertionError, match=r"^warns"):
        warned = frozenset({"FrozenConstWarning: A jitted function ... put a copy of FrozenConst"})
        same_outcome(Outcome(True, jnp.ones(2), warned), ok)
    refusal = ValueError("Triggering __jax_array__() during abstractification is no longer supported.")
    with pytest.raises(Refused):
        jax_refuses(Outcome(False, refusal, frozenset()), ok)
    with pytest.raises(AssertionError, match=r"^ValueError: other"):
        jax_refuses(Outcome(False, ValueError("other"), frozenset()), ok)
    example = _EXAMPLES["dynamic_slice"][0]
    with pytest.raises(AssertionError, match="names no line"):
        frozenconst_refuses(
            Outcome(False, frozenconst.FrozenConstValueError("jnp.asarray"), frozenset()), ok, example
        )
    assert [e.labels for e in _EXAMPLES["scan"]] == [("init", "xs", "w"), ("xs",)]
    assert _EXAMPLES["stack"][0].labels == ("operands", "operands")  # `operands_0`, `operands_1`


def test_docs_list_the_jax_lax_parameters_that_refuse_a_frozenconst():
    text = (pathlib.Path(__file__).parent.parent / "docs" / "jax.md").read_text()
    heading = "## jax.lax: the parameters that refuse a FrozenConst"
    assert heading in text, f"docs/jax.md has no section `{heading}`"
    section = text.split(heading)[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([\w.]+\(\w+\))` \| ([\d., ]+) \|", section, re.MULTILINE)
    assert {
        name: tuple(v.strip() for v in versions.split(",")) for name, versions in rows
    } == JAX_LAX_REFUSALS
