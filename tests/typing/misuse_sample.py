"""Code the type checkers must reject (tests/test_typing.py expects one error per line marked ERROR)."""

import jax
import jax.numpy as jnp

from frozenconst import FrozenConst

plain: jax.Array = jnp.ones(3)
wrong: FrozenConst = plain  # ERROR: a jax.Array is not a FrozenConst
FrozenConst(jnp.ones(3)).on(3)  # ERROR: not a placement target
shape: str = FrozenConst(jnp.ones(3)).shape  # ERROR: shape is a tuple
