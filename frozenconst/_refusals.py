"""JAX's refusals of a FrozenConst where it takes only a `jax.Array`, and what to write instead.

JAX checks the type of some arguments before it converts them (JEP 28661): an
index into a `jax.Array` (`a[idx]`, `a.at[idx]`), a `jax.lax` operand on JAX
releases where frozenconst cannot register the conversion (`_compat.register_array_type`),
the argument of a `jax.nn`/`jax.scipy` function that bypasses `jax.numpy`, a few
`jax.numpy` parameters. There JAX's own error names neither the FrozenConst nor the
fix. `refused_as_array` turns such an error into frozenconst's own, naming the
user's line, the call and the one-call fix, `jnp.asarray(x)`: `frozenconst.audit`
raises it, and so do `frozenconst.jit` and `filter_jit` for an error inside the
function they compile.
"""

from __future__ import annotations

import linecache

from ._compat_lowering import refusal
from ._errors import FrozenConstIndexError, FrozenConstTypeError, FrozenConstValueError
from ._frames import library_of

# Every JAX release the sweeps checked the tables below on: a row of `_EVERY_TESTED` refuses on each.
_EVERY_TESTED: tuple[str, ...] = ("0.8.1", "0.9.2", "0.10.2", "0.12.0.1", "0.12.1")

# Public functions of `jax.nn` and `jax.scipy` that refuse a FrozenConst where they
# take a NumPy array or a `jax.Array`, with the JAX versions on which they do:
# they hand their argument to `jax.lax` (which refuses a FrozenConst where
# `JAX_LAX_REFUSES` says) or, jitted, to `jnp.asarray`'s type check, without
# converting it first. The one-call fix: `jnp.asarray(x)`, the cached buffer.
# Found by the sweep over every public function of `jax.nn` and `jax.scipy`
# (tests/test_jax_integration.py), which checks this table on each version
# below; docs/jax.md lists it.
BYPASS_JAX_NUMPY: dict[str, tuple[str, ...]] = {
    "jax.nn.sigmoid": ("0.8.1", "0.9.2"),
    "jax.scipy.linalg.block_diag": _EVERY_TESTED,
    "jax.scipy.linalg.hessenberg": ("0.8.1", "0.9.2"),
    "jax.scipy.linalg.schur": ("0.8.1", "0.9.2"),
    "jax.scipy.stats.norm.isf": ("0.8.1", "0.9.2"),
}
# The JAX versions on which `jax.lax` refuses a FrozenConst operand: where frozenconst
# cannot register the conversion `jnp` makes (`_compat.register_array_type`). From jax
# 0.10 every `jax.lax` function takes one, as `jax.numpy` does, except the parameters
# `JAX_LAX_REFUSALS` lists (the sweep over every public `jax.lax` function,
# tests/test_lax_sweep.py, checks both on each version).
JAX_LAX_REFUSES: tuple[str, ...] = ("0.8.1", "0.9.2")
# Those that take their argument as a pytree, so that a FrozenConst there is a
# pytree node with one leaf rather than one array: `cg(A, b)` refuses a
# FrozenConst `b` (its result's structure differs), `Rotation(q)` keeps it as
# given. The same fix.
TAKE_PYTREES: dict[str, tuple[str, ...]] = {
    "jax.scipy.sparse.linalg.bicgstab": _EVERY_TESTED,
    "jax.scipy.sparse.linalg.cg": _EVERY_TESTED,
    "jax.scipy.sparse.linalg.gmres": _EVERY_TESTED,
    "jax.scipy.spatial.transform.Rotation": _EVERY_TESTED,
}

# Parameters of public `jax.numpy` functions that refuse a FrozenConst where they
# take a jax.Array, `function(parameter)`, with the JAX versions on which they do.
# Found by the sweep that passes a FrozenConst in each array parameter of every
# public jax.numpy function (tests/test_numpy_sweep.py), which checks this table
# on each version below; docs/jax.md lists it, with each one's reason. The fix is
# the same: `jnp.asarray(x)` in that argument.
JAX_NUMPY_REFUSALS: dict[str, tuple[str, ...]] = {
    "jax.numpy.array_split(indices_or_sections)": _EVERY_TESTED,
    "jax.numpy.dsplit(indices_or_sections)": _EVERY_TESTED,
    "jax.numpy.hsplit(indices_or_sections)": _EVERY_TESTED,
    "jax.numpy.split(indices_or_sections)": _EVERY_TESTED,
    "jax.numpy.vsplit(indices_or_sections)": _EVERY_TESTED,
    "jax.numpy.union1d(fill_value)": _EVERY_TESTED,
    "jax.numpy.unique(fill_value)": _EVERY_TESTED,
    "jax.numpy.unique_all(fill_value)": _EVERY_TESTED,
    "jax.numpy.unique_counts(fill_value)": _EVERY_TESTED,
    "jax.numpy.unique_inverse(fill_value)": _EVERY_TESTED,
    "jax.numpy.unique_values(fill_value)": _EVERY_TESTED,
}

# Parameters of public `jax.lax` functions where a FrozenConst does not give what its
# cached buffer gives, `function(parameter)`, with the JAX versions on which it does not
# (beyond `JAX_LAX_REFUSES`). Found by the sweep that passes a FrozenConst in each array
# position of every public `jax.lax` function (tests/test_lax_sweep.py), which checks
# this table on each version below; docs/jax.md lists it, with each one's reason. The
# fix is the same: `jnp.asarray(x)` in that argument.
JAX_LAX_REFUSALS: dict[str, tuple[str, ...]] = {
    # They take a pytree and give one of the same structure back: a FrozenConst (a node
    # with one leaf) comes back as a FrozenConst around the result, a derived copy that
    # a FrozenConstWarning names, where its cached buffer comes back as a jax.Array.
    "jax.lax.all_gather(x)": _EVERY_TESTED,
    "jax.lax.all_gather_invariant(x)": ("0.8.1",),
    "jax.lax.all_to_all(x)": _EVERY_TESTED,
    "jax.lax.associative_scan(elems)": _EVERY_TESTED,
    "jax.lax.map(xs)": _EVERY_TESTED,
    "jax.lax.optimization_barrier(operand)": _EVERY_TESTED,
    "jax.lax.pmax(x)": _EVERY_TESTED,
    "jax.lax.pmean(x)": _EVERY_TESTED,
    "jax.lax.pmin(x)": _EVERY_TESTED,
    "jax.lax.ppermute(x)": _EVERY_TESTED,
    "jax.lax.preduced(x)": ("0.8.1",),
    "jax.lax.pshuffle(x)": _EVERY_TESTED,
    "jax.lax.psum(x)": _EVERY_TESTED,
    "jax.lax.psum_scatter(x)": _EVERY_TESTED,
    "jax.lax.pswapaxes(x)": _EVERY_TESTED,
    "jax.lax.pvary(x)": ("0.8.1",),
    "jax.lax.stop_gradient(x)": _EVERY_TESTED,
    "jax.lax.with_sharding_constraint(x)": _EVERY_TESTED,
    # They compare the structure of a pytree argument with another's (the carry a loop body
    # returns, the init values, the solution): a FrozenConst is a node where a jax.Array
    # is a leaf, and JAX refuses the mismatch. `fori_loop(lower)`: inside frozenconst.jit
    # and filter_jit, where the bound is not concrete, JAX carries it through a while loop.
    "jax.lax.custom_linear_solve(b)": _EVERY_TESTED,
    "jax.lax.custom_root(initial_guess)": _EVERY_TESTED,
    "jax.lax.fori_loop(init_val)": _EVERY_TESTED,
    "jax.lax.fori_loop(lower)": ("0.10.2", "0.12.0.1", "0.12.1"),
    "jax.lax.reduce(init_values)": _EVERY_TESTED,
    "jax.lax.reduce(operands)": _EVERY_TESTED,
    "jax.lax.reduce_window(init_value)": _EVERY_TESTED,
    "jax.lax.reduce_window(operand)": _EVERY_TESTED,
    "jax.lax.scan(init)": _EVERY_TESTED,
    "jax.lax.while_loop(init_val)": _EVERY_TESTED,
    # They compare the structures of their branches' outputs: a branch that gives its
    # operand back as it is gives a FrozenConst (a node) where another gives a jax.Array.
    # `platform_dependent`, eagerly, runs one branch: the FrozenConst itself comes back.
    "jax.lax.cond(operand)": _EVERY_TESTED,
    "jax.lax.platform_dependent(args)": _EVERY_TESTED,
    "jax.lax.switch(operand)": _EVERY_TESTED,
    # They convert the argument with `jax.lax.asarray`, which takes only jax.Arrays, NumPy
    # arrays and Python scalars ("asarray: expected ArrayLike, got FrozenConst(...)").
    "jax.lax.conv_general_dilated_local(lhs)": _EVERY_TESTED,
    "jax.lax.conv_general_dilated_patches(lhs)": _EVERY_TESTED,
    "jax.lax.split(operand)": _EVERY_TESTED,
    "jax.lax.stack(operands)": ("0.10.2", "0.12.0.1", "0.12.1"),
    "jax.lax.unstack(x)": ("0.10.2", "0.12.0.1", "0.12.1"),
    # It takes a coefficient that is not a `jax.core.Tracer` for a constant and converts it
    # with NumPy: a FrozenConst passed to filter_jit (a FrozenConst around a tracer) raises
    # TracedValueError there.
    "jax.lax.polynomial(coeffs)": ("0.12.0.1", "0.12.1"),
}


def _function(name: str) -> str:
    """The bare function name of a table entry: `split` for `jax.numpy.split(indices_or_sections)`."""
    return name.split("(")[0].rsplit(".", 1)[1]


def _calls(line: str, function: str) -> bool:
    """Whether `line` calls a function named `function` (`name(`, `module.name (`)."""
    start = line.find(function)
    while start >= 0:
        before = line[start - 1] if start else " "
        after = line[start + len(function) :].lstrip()
        if not (before.isalnum() or before == "_") and after.startswith("("):
            return True
        start = line.find(function, start + 1)
    return False


def _lax_calls(line: str) -> list[str]:
    """The `jax.lax` functions `line` calls, as users write them: `lax.dynamic_slice(`, `jax.lax.dot (`."""
    found: list[str] = []
    start = line.find("lax.")
    while start >= 0:
        before = line[start - 1] if start else " "
        end = start + len("lax.")
        while end < len(line) and (line[end].isalnum() or line[end] == "_"):
            end += 1
        name = line[start + len("lax.") : end]
        if name and not (before.isalnum() or before == "_") and line[end:].lstrip().startswith("("):
            found.append(name)
        start = line.find("lax.", start + 1)
    return found


def _called(filename: str, lineno: int) -> list[str]:
    """The functions of the tables above, and the `jax.lax` functions, that the source line at
    the place of use calls."""
    line = linecache.getline(filename, lineno)
    tables = (*BYPASS_JAX_NUMPY, *TAKE_PYTREES, *JAX_NUMPY_REFUSALS)
    found = [name for name in tables if _calls(line, _function(name))]
    return found + [f"jax.lax.{name}" for name in dict.fromkeys(_lax_calls(line))]


Refusal = FrozenConstValueError | FrozenConstTypeError | FrozenConstIndexError
_OURS: tuple[type[Refusal], ...] = (FrozenConstValueError, FrozenConstTypeError, FrozenConstIndexError)


def refused_as_array(err: BaseException) -> Refusal | None:
    """The fix at the place of use, when JAX refused a FrozenConst where it wants a jax.Array."""
    kind = refusal(err)  # JAX's builtin error, known by its words
    if kind is None:
        return None
    refused = next(ours for ours in _OURS if issubclass(ours, kind))
    place, called = "an unknown place", []
    tb = err.__traceback__
    while tb is not None:  # the innermost of the user's frames (`_frames`: whose frame is whose)
        code = tb.tb_frame.f_code
        if not library_of(tb.tb_frame):
            place = f"{code.co_filename}:{tb.tb_lineno} ({code.co_name})"
            called = _called(code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    if called:
        there = (
            f" in the call to {', '.join(f'`{name}`' for name in called)}, which passes its argument "
            "to `jax.lax`, asks for its type or takes it as a pytree without converting it"
        )
    elif refused is FrozenConstIndexError:
        there = ", as an index into a `jax.Array`"
    else:
        there = ""
    return refused(
        f"JAX refused a value with `__jax_array__`, a FrozenConst for instance, where it takes only "
        f"a jax.Array, at {place}{there}: as an index (`a[idx]`, `a.at[idx]`), a `jax.lax` operand, "
        "the argument of a `jax.nn`/`jax.scipy` function that bypasses `jax.numpy`, a pytree whose "
        "structure JAX compares with an array's (a loop's carry, `lax.reduce`'s operands), or one "
        "of the `jax.numpy` parameters that refuse one (docs/jax.md lists them). JAX checks the "
        "type of such a value before it converts it. "
        "Convert it there with `jnp.asarray(...)`, which returns a FrozenConst's cached device "
        "buffer and copies nothing: `a[jnp.asarray(idx)]`, `lax.dynamic_slice(jnp.asarray(table), ...)`, "
        '`jax.nn.sigmoid(jnp.asarray(x))`. See docs/jax.md, "jax.lax and indexing".'
    )
