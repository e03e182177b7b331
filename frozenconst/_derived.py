"""A value derived from a constant inside a transformation: what a `FrozenConst` holds there.

When a transformation rebuilds a FrozenConst from a pytree leaf that is not one
of a constant's own device buffers (a tracer inside `jit`/`grad`/`vmap`, a
gradient, a mapped result, whatever `tree_map` produced), the FrozenConst it
hands back holds a `Derived` where a constant holds its `_cache.Store`. It keeps
the type, so code written against FrozenConst runs unchanged (as JAX's `Tracer`
stands where a `jax.Array` stood), but it never claims the original's host data.

Why not a subclass of FrozenConst: JAX keys pytree nodes by exact type, so a
subclass is a node of its own, and `jax.tree.map(f, model, grads)` over a model
and its gradients would fail on the structure mismatch (tests/test_training.py).
The handle stays one type; what it holds is one of two classes with the same
methods, and neither the handle nor they branch on which kind it is.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding
from numpy.typing import DTypeLike

from ._cache import Store
from ._convert import to_numpy
from ._errors import FrozenConstTypeError
from ._host import freeze, frozen_copy


class Derived:
    """A transformation's value in a FrozenConst's place: a leaf, and, on request, a frozen copy of it."""

    __slots__ = ("_frozen", "leaf")

    concrete = False

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf
        self._frozen: Store | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The leaf's shape."""
        return tuple(self.leaf.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The leaf's dtype."""
        dtype: np.dtype[Any] = np.dtype(self.leaf.dtype)
        return dtype

    def device_dtype(self) -> np.dtype[Any]:
        """The leaf's dtype: a transformation's value is JAX's already."""
        return self.dtype

    def array(self, sharding: Sharding | None = None, traced: bool = True) -> Any:
        """The leaf itself (a derived value has no declared sharding)."""
        return self.leaf

    def frozen(self) -> Store:
        """A store of a frozen copy of the leaf, made once: no path hands out memory that
        JAX or anyone else could still write."""
        if self._frozen is None:
            self._frozen = Store(freeze(to_numpy(self.leaf, None)))
        return self._frozen

    def whole(self, what: str) -> np.ndarray[Any, Any]:
        """The frozen copy's host buffer."""
        return self.frozen().host

    @property
    def fingerprint(self) -> str:
        """The frozen copy's digest."""
        return self.frozen().fingerprint

    def constant(self, what: str) -> Store:
        """Refused: `what` needs the constant itself."""
        raise FrozenConstTypeError(
            f"`{what}` needs the constant itself, but this FrozenConst is a value derived "
            f"from one inside a transformation ({self.leaf!r}). Call it on the original, "
            "outside the transformation."
        )

    def with_dtype(self, dtype: DTypeLike | None) -> Store:
        """The store of `FrozenConst(x, dtype)`: a frozen copy of the leaf."""
        return Store(frozen_copy(self.leaf, dtype, "the `FrozenConst` it received"))

    def describe(self) -> str:
        """The derived value's `repr`."""
        return f"FrozenConst(derived from {self.leaf!r})"

    def arrays(self) -> list[jax.Array]:
        """None cached: a derived value has no device buffers of its own."""
        return []

    def evict(self, sharding: Sharding | None = None) -> None:
        """Nothing to evict."""
