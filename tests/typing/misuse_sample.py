"""Code the type checkers must reject (tests/test_typing.py expects one error per line marked ERROR)."""

import jax
import jax.numpy as jnp

import frozenconst
from frozenconst import FrozenConst

plain: jax.Array = jnp.ones(3)
wrong: FrozenConst = plain  # ERROR: a jax.Array is not a FrozenConst
FrozenConst(jnp.ones(3)).on(3)  # ERROR: not a placement target
shape: str = FrozenConst(jnp.ones(3)).shape  # ERROR: shape is a tuple


@frozenconst.jit
def step(w: jax.Array, scale: float) -> jax.Array:
    return w * scale


@frozenconst.jit(static_argnums=1)
def head(w: jax.Array, n: int) -> jax.Array:
    return w[:n]


@frozenconst.filter_jit
def apply(model: dict[str, FrozenConst], x: jax.Array) -> jax.Array:
    return model["table"] @ x


step(plain, "two")  # ERROR: the wrapped function's parameter types are kept
step(plain)  # ERROR: and its parameters
count: int = step(plain, 2.0)  # ERROR: and its return type
head(plain, "two")  # ERROR: also through the decorator factory
apply([plain], plain)  # ERROR: and through filter_jit
# What a method computes from a constant is a jax.Array, as at run time.
FrozenConst(jnp.ones((2, 3))).T.evict()  # ERROR: a transpose is a jax.Array, not a constant
FrozenConst(jnp.ones((2, 3))).reshape(3, 2).evict()  # ERROR: so is a reshape
FrozenConst(jnp.ones(3)).copy().evict()  # ERROR: and a copy
FrozenConst(jnp.ones(3)).real.evict()  # ERROR: and the real part
(-FrozenConst(jnp.ones(3))).evict()  # ERROR: and a negation
