"""What the type checkers infer for functions compiled by frozenconst: the wrapped
function's return type, where `jax.jit`'s wrapper gives `Any`. tests/test_typing.py
expects each `reveal_type` line to reveal, in both mypy and pyright, the type its
comment names (module paths dropped). Never run.
"""

from __future__ import annotations

from typing import reveal_type

import jax
import jax.numpy as jnp
import numpy as np

import frozenconst
from frozenconst import FrozenConst

TABLE = FrozenConst(np.ones((4, 3), np.float32))


@frozenconst.jit
def project(w: jax.Array, scale: float) -> jax.Array:
    return jnp.tanh(TABLE @ w) * scale


@frozenconst.jit(static_argnums=1)
def pick(w: jax.Array, n: int) -> tuple[jax.Array, int]:
    return w[:n], n


@frozenconst.filter_jit
def apply(model: dict[str, FrozenConst], x: jax.Array) -> list[jax.Array]:
    return [model["table"] @ x]


def plain(w: jax.Array) -> float:
    return float(jnp.sum(w))


reveal_type(project(jnp.ones(3), 2.0))  # reveals: Array
reveal_type(pick(jnp.ones(3), 2))  # reveals: tuple[Array, int]
reveal_type(apply({"table": TABLE}, jnp.ones(3)))  # reveals: list[Array]
reveal_type(frozenconst.jit(plain)(jnp.ones(3)))  # reveals: float
reveal_type(frozenconst.jit(donate_argnums=0)(plain)(jnp.ones(3)))  # reveals: float
reveal_type(jax.jit(plain)(jnp.ones(3)))  # reveals: Any
