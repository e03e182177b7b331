"""Constants in models are never trained: filters for equinox, optax and plain JAX."""

from __future__ import annotations

from typing import Any, TypeGuard, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from ._frozen import FrozenConst

_T = TypeVar("_T")


def is_frozen(x: object) -> TypeGuard[FrozenConst]:
    """Whether `x` is a FrozenConst. Pass it as `is_leaf=` so tree utilities stop at constants.

    Example:
        >>> import numpy as np, frozenconst
        >>> frozenconst.is_frozen(frozenconst.FrozenConst(np.ones(2))), frozenconst.is_frozen(np.ones(2))
        (True, False)
    """
    return isinstance(x, FrozenConst)


def is_trainable(x: object) -> bool:
    """Whether `x` is an array leaf an optimizer should train: a floating-point
    `jax.Array` or NumPy array, and not a FrozenConst.

    The filter for `eqx.partition(model, is_trainable, is_leaf=is_frozen)`.
    """
    if isinstance(x, FrozenConst):
        return False
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return bool(jnp.issubdtype(x.dtype, jnp.inexact))
    return False


def partition(tree: _T) -> tuple[_T, _T]:
    """Split a pytree into (trainable, frozen): FrozenConsts go to the second, all else to the first.

    Each half has `None` where the other has a value (as in `eqx.partition`), so
    `optimizer.init(trainable)` and `jax.grad` w.r.t. `trainable` never see a
    constant, and weight decay cannot reach one.

    Example:
        >>> import numpy as np, jax.numpy as jnp, frozenconst
        >>> params = {"w": jnp.ones(2), "table": frozenconst.FrozenConst(np.ones(3))}
        >>> trainable, frozen = frozenconst.partition(params)
        >>> trainable["table"] is None, frozen["w"] is None
        (True, True)
        >>> frozenconst.combine(trainable, frozen)["table"] is params["table"]
        True
    """
    frozen: _T = jax.tree_util.tree_map(lambda x: x if is_frozen(x) else None, tree, is_leaf=is_frozen)
    rest: _T = jax.tree_util.tree_map(lambda x: None if is_frozen(x) else x, tree, is_leaf=is_frozen)
    return rest, frozen


def combine(*trees: _T) -> _T:
    """Merge trees produced by [`partition`][frozenconst.partition]: the first non-`None` value wins."""

    def first(*values: Any) -> Any:
        return next((v for v in values if v is not None), None)

    merged: _T = jax.tree_util.tree_map(first, *trees, is_leaf=lambda x: x is None or is_frozen(x))
    return merged
