"""A library author's code using FrozenConst, type-checked by mypy --strict and pyright.

Checked by `make typecheck` (and tests/test_typing.py) with no ignores. Every
`assert_type` pins what the checkers infer; the module also runs.
"""

from __future__ import annotations

from typing import Any, assert_type

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

import frozenconst
from frozenconst import FrozenConst, Placement


def embed(table: FrozenConst, ids: jax.Array) -> jax.Array:
    """Look rows up in a constant table."""
    return jnp.take(table, ids, axis=0)


def project(table: FrozenConst, w: jax.Array) -> jax.Array:
    a = jnp.dot(table, w)
    b = table @ w
    c = table + 1
    d = 2.0 * table
    assert_type(a, jax.Array)
    assert_type(b, jax.Array)
    assert_type(c, jax.Array)
    assert_type(d, jax.Array)
    return a + b + c[:, :1] + d[:, :1]


def takes_array_like(x: ArrayLike) -> jax.Array:
    return jnp.asarray(x) * 2


# A library that returns what its compiled functions return: under `mypy --strict` this
# needs their return type (a plain `jax.jit` function returns `Any`: `no-any-return`).
@frozenconst.jit
def _scaled(table: FrozenConst, w: jax.Array, scale: float) -> jax.Array:
    return (table @ w) * scale


@frozenconst.jit(static_argnums=1)
def _first(w: jax.Array, n: int) -> tuple[jax.Array, int]:
    return w[:n], n


@frozenconst.filter_jit
def _lookup(model: dict[str, FrozenConst], ids: jax.Array) -> jax.Array:
    return jnp.take(model["table"], ids, axis=0)


def scaled(table: FrozenConst, w: jax.Array) -> jax.Array:
    out = _scaled(table, w, 2.0)
    assert_type(out, jax.Array)
    return out


def first(w: jax.Array) -> jax.Array:
    head, n = _first(w, 2)
    assert_type(n, int)
    return head


def lookup(table: FrozenConst, ids: jax.Array) -> jax.Array:
    return _lookup({"table": table}, ids)


def make_table() -> FrozenConst:
    return FrozenConst(np.arange(12.0, dtype=np.float32).reshape(4, 3))


def inspect_table(table: FrozenConst) -> None:
    host = np.asarray(table)
    assert_type(host, np.ndarray[tuple[Any, ...], np.dtype[Any]])
    assert_type(table.shape, tuple[int, ...])
    assert_type(table.dtype, np.dtype[Any])
    placed = table.on(jax.devices()[0])
    assert_type(placed, jax.Array)
    assert_type(table.on(jax.device_put(0.0).sharding), jax.Array)
    assert_type(table.placements, tuple[Placement, ...])
    assert_type(table.ndim, int)
    assert_type(table.nbytes, int)


if __name__ == "__main__":
    t = make_table()
    out = project(t, jnp.ones((3, 3), jnp.float32))
    print(out.shape, embed(t, jnp.array([0, 2])).shape, takes_array_like(t).shape)
    inspect_table(t)
    print(scaled(t, jnp.ones(3)).shape, first(jnp.ones(3)).shape, lookup(t, jnp.array([1])).shape)
