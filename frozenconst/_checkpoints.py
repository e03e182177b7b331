"""Checkpoints: a model restored in one call, holding the real constants and never their copies.

A checkpoint need not hold a constant (it is data the program loads, not state training
produces), and a restored model should hold the constant itself, not a copy read back from disk.
`restore` works on pytrees alone, so it serves equinox, flax NNX (whose modules and states are
pytrees) and plain dicts, without importing any of them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeVar

import jax

from ._cache import owner_of
from ._errors import FrozenConstValueError
from ._frozen import FrozenConst

_T = TypeVar("_T")

# A path in a tree, as the names of its keys: `model.lin.kernel` and a state's
# `state["lin"]["kernel"]` (flax NNX) name the same place.
_Path = tuple[Hashable, ...]


def restore(template: _T, restored: Any) -> _T:
    """`template` with its state taken from `restored`, and its constants kept: a model
    restored from a checkpoint in one call.

    Save the model without its constants (an equinox model's arrays with
    `is_leaf=frozenconst.is_frozen`, a flax NNX model's `nnx.state(model,
    nnx.Variable)`), restore that tree with your checkpointer, and call this
    with a model built with the real constants: docs, "Checkpoints".

    Each leaf of `template` is matched with the leaf of `restored` at the same
    path, by key names, so a flax NNX module (`model.lin.kernel`) matches the
    state restored for it (`state["lin"]["kernel"]`). The result holds:

    - each constant of `template` itself (the same FrozenConst object, or, in
      a flax NNX state, the constant's own device buffer), whatever `restored`
      has in its place (nothing, `None`, a placeholder from `nnx.eval_shape`);
    - every other leaf from `restored`, where `restored` has one;
    - the leaf of `template` where `restored` has none (`None`, or absent):
      functions, static fields, anything that was not saved.

    The result is rebuilt as `jax.tree.map` rebuilds a tree: a flax NNX
    Variable shared by two modules (weight tying) comes back as two. Restore
    such a model with `nnx.update(model, restored)`, which leaves its
    constants in place.

    Arguments:
        template: a pytree (an equinox or flax NNX model, a dict) holding the real constants.
        restored: the restored state: a pytree with `template`'s paths, or some of them.

    Returns:
        A pytree with `template`'s structure.

    Raises:
        FrozenConstValueError: `restored` holds a leaf at a path `template` lacks, or a
            leaf whose shape or dtype differs from `template`'s there; the message
            names the paths and what each side holds.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, frozenconst
        >>> table = frozenconst.FrozenConst(np.ones(3))
        >>> template = {"w": jnp.zeros(2), "table": table}
        >>> restored = {"w": jnp.ones(2), "table": None}    # the checkpoint held no constant
        >>> model = frozenconst.restore(template, restored)
        >>> model["table"] is table, model["w"].tolist()
        (True, [1.0, 1.0])
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template, is_leaf=_is_frozen)
    constants = {_names(path) for path, leaf in leaves if _is_constant(leaf)}
    given, _ = jax.tree_util.tree_flatten_with_path(restored, is_leaf=_is_frozen)
    available = {_names(path): leaf for path, leaf in given}
    problems: list[str] = []
    out: list[Any] = []
    for path, leaf in leaves:
        names = _names(path)
        found = available.pop(names, None)
        constant = names in constants
        out.append(leaf if constant or found is None else found)
        # A constant's shape only: what stands in its place may be its host data (float64
        # without x64) or a placeholder of the dtype JAX computes with (`x.dtype`).
        if found is not None and _differs(leaf, found, dtype=not constant):
            held = f"the constant {_describe(leaf)}" if constant else f"{_describe(leaf)} in the template"
            problems.append(f"`{_show(names)}` is {held}, restored: {_describe(found)}")
    # What `restored` holds inside a constant's place (a flax NNX state holds
    # the constant's buffer under `.value`) is the constant's, not extra state.
    extra = [names for names in available if not any(names[: len(c)] == c for c in constants)]
    problems += [f"`{_show(n)}` ({_describe(available[n])}) is not in the template" for n in extra]
    if problems:
        shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise FrozenConstValueError(
            f"frozenconst.restore: the restored tree does not match the template ({len(problems)} "
            f"difference{'s' if len(problems) > 1 else ''}): {shown}. Build the template as the "
            "saved model was built, and restore the checkpoint into a tree with its structure."
        )
    rebuilt: _T = jax.tree_util.tree_unflatten(treedef, out)
    return rebuilt


def _is_frozen(x: object) -> bool:
    return isinstance(x, FrozenConst)


def _is_constant(leaf: object) -> bool:
    """A FrozenConst, or a constant's own cached device buffer (a flax NNX state holds that)."""
    return isinstance(leaf, FrozenConst) or owner_of(leaf) is not None


def _names(path: tuple[Any, ...]) -> _Path:
    """A key path as the names of its keys (attribute, dict key or index; else, for a key type JAX
    does not have today, its `str`)."""
    fields = ("name", "key", "idx")
    return tuple(next((getattr(key, f) for f in fields if hasattr(key, f)), str(key)) for key in path)


def _show(names: _Path) -> str:
    return ".".join(str(n) for n in names) or "<root>"


def _signature(x: object) -> tuple[tuple[int, ...], str] | None:
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None:
        return None
    return tuple(shape), str(dtype)


def _differs(a: object, b: object, dtype: bool = True) -> bool:
    """Whether two leaves have different shapes (or dtypes); leaves without either always agree."""
    sa, sb = _signature(a), _signature(b)
    if sa is None or sb is None:
        return False
    return sa != sb if dtype else sa[0] != sb[0]


def _describe(x: object) -> str:
    signature = _signature(x)
    if signature is None:
        return f"a `{type(x).__name__}`"
    shape, dtype = signature
    return f"{dtype}{list(shape)} (`{type(x).__name__}`)"
