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

    Examples:
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
    if isinstance(x, FrozenConst) or not isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return False
    return bool(jnp.issubdtype(x.dtype, jnp.inexact))


def partition(tree: _T) -> tuple[_T, _T]:
    """Split a pytree into (trainable, rest): what an optimizer should train, and everything else.

    `trainable` holds the leaves [`is_trainable`][frozenconst.is_trainable]
    accepts (floating-point arrays that are not FrozenConsts); `rest` holds all
    other leaves: FrozenConsts, integer and boolean arrays, functions (an
    `eqx.nn.MLP`'s activation), strings and other Python objects. Each half has
    `None` where the other has a value (as in `eqx.partition`), so
    `optimizer.init(trainable)` and `jax.grad` with respect to `trainable` see
    only what they can train, and weight decay cannot reach a constant.
    [`combine`][frozenconst.combine] is the inverse: `combine(*partition(tree))`
    rebuilds `tree` from the very same leaf objects.

    Arguments:
        tree: any pytree; FrozenConsts are kept whole (never flattened).

    Returns:
        `(trainable, rest)`, two pytrees with the structure of `tree`.

    Examples:
        >>> import numpy as np, jax.numpy as jnp, frozenconst
        >>> params = {"w": jnp.ones(2), "step": jnp.zeros((), jnp.int32),
        ...           "table": frozenconst.FrozenConst(np.ones(3))}
        >>> trainable, rest = frozenconst.partition(params)
        >>> sorted(k for k, v in trainable.items() if v is not None)
        ['w']
        >>> sorted(k for k, v in rest.items() if v is not None)
        ['step', 'table']
        >>> frozenconst.combine(trainable, rest)["table"] is params["table"]
        True
    """
    trainable: _T = jax.tree_util.tree_map(lambda x: x if is_trainable(x) else None, tree, is_leaf=is_frozen)
    rest: _T = jax.tree_util.tree_map(lambda x: None if is_trainable(x) else x, tree, is_leaf=is_frozen)
    return trainable, rest


def combine(*trees: _T) -> _T:
    """Merge trees produced by [`partition`][frozenconst.partition]: the first non-`None` value wins."""

    def first(*values: Any) -> Any:
        return next((v for v in values if v is not None), None)

    merged: _T = jax.tree_util.tree_map(first, *trees, is_leaf=lambda x: x is None or is_frozen(x))
    return merged
