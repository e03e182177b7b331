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

import warnings
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding
from numpy.typing import DTypeLike

from . import _hoisting
from ._cache import Store
from ._compat import Tracer, user_stacklevel
from ._convert import to_numpy
from ._errors import FrozenConstTypeError, FrozenConstWarning
from ._hoisting import next_serial
from ._host import freeze, frozen_copy, human_bytes


class Derived:
    """A transformation's value in a FrozenConst's place: a leaf, and, on request, a frozen copy of it.

    To autodiff it is a constant, as the constant it stands for is: a value
    being differentiated reaches it only through `lax.stop_gradient`
    (`FrozenConst.tree_unflatten`), so `jax.grad` with respect to a tree holding
    a FrozenConst gives it a zero gradient (docs/model.md, "What a FrozenConst
    is to pytree tools"). A concrete leaf
    (a jitted function's output, an optimizer's update) that `frozenconst.jit`
    meets while tracing is a parameter of the program there, as a constant is,
    never embedded in it.
    """

    __slots__ = ("__weakref__", "_frozen", "hits", "leaf", "serial")

    concrete = False
    # As a store's (`Store.hot`), read by `FrozenConst.__jax_array__`'s inlined cache hit:
    # a derived value serves nothing from it, every use is `array`'s.
    hot: jax.Array | None = None

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf
        self._frozen: Store | None = None
        # As a store's: `frozenconst.jit` numbers what it meets (`_hoisting.resolve`),
        # and counts the hits of what it feeds (`Store.count_hits`).
        self.serial = next_serial()
        self.hits = 0

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
        """The leaf (a derived value has no declared sharding), or, where `frozenconst.jit`
        traces and it is a concrete `jax.Array`, what it stands for there
        (`_hoisting.resolve`), as for a constant."""
        leaf = self.leaf
        concrete = isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer)
        if traced and concrete and _hoisting.active and _hoisting.scope.frames:
            value = _hoisting.resolve(self, sharding)
            if value is not None:
                return value
        return leaf

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
            f"`{what}` needs the constant itself, but this FrozenConst is a value derived from "
            f"one ({self.describe_leaf()}): what a transformation, a jitted function's output or "
            "an optimizer put in a constant's place. Call it on the original constant, and keep "
            "constants out of what you train and return (docs: Training)."
        )

    def describe_leaf(self) -> str:
        """What the leaf is, in words, without its data: kind, dtype, shape and size."""
        leaf = self.leaf
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            return f"a `{type(leaf).__name__}`"
        kind = (
            "a traced value"
            if isinstance(leaf, Tracer)
            else "a jax.Array"
            if isinstance(leaf, jax.Array)
            else f"a `{type(leaf).__name__}`"
        )
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return f"{kind}, {np.dtype(dtype)}{list(shape)}, {human_bytes(nbytes)}"

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


def warn_derived_copy(derived: Derived) -> None:
    """Say that a FrozenConst was rebuilt around a new concrete array: no longer the constant."""
    warnings.warn(
        f"A FrozenConst now holds {derived.describe_leaf()} that is not the constant's own "
        "buffer: what an optimizer's `init` or `update`, a gradient, or a jitted function "
        "returning the model (`nnx.jit`, `eqx.filter_jit`, `jax.jit`) puts in a constant's "
        "place. This derived copy is a second device buffer, an optimizer may change it "
        "(weight decay does), and it is no constant to `stats()`, `on` or `placed`. Keep "
        "constants out of what you train and return: train `frozenconst.partition(tree)[0]` "
        "(optax, plain JAX) or `eqx.partition(model, frozenconst.is_trainable, "
        "is_leaf=frozenconst.is_frozen)` (equinox), compile with `frozenconst.filter_jit`, "
        "and return only `nnx.state(..., nnx.Variable)` from a flax NNX step "
        '(docs: Training, "What each idiom does").',
        FrozenConstWarning,
        stacklevel=user_stacklevel(),
    )
