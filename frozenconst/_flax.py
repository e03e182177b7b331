"""`flax.serialization` for constants, registered without making flax a dependency."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ._compat import Tracer
from ._frozen import FrozenConst, derived_leaf


def _to_state(x: FrozenConst) -> Any:
    # A constant: its host data in its own dtype, restored bit for bit whatever the x64 setting.
    # A derived value: the array it holds, as flax keeps a `jax.Array` (linen asks the state of
    # each attribute `setup()` assigns, traced ones included, where `np.asarray` would raise).
    leaf = derived_leaf(x)
    return np.asarray(x) if leaf is None else leaf


def _from_state(template: FrozenConst, state: Any) -> FrozenConst:
    # flax calls its first argument the restore "target"; here it is the template
    # constant (the glossary keeps "target" for what names a placement).
    if isinstance(state, Tracer):
        # A traced state (linen maps over a traced module's attributes): a derived value, as
        # `jax.jit` rebuilds one (a tracer never unflattens to NumPy data).
        return cast(FrozenConst, FrozenConst.tree_unflatten(None, (state,)))
    restored = np.asarray(state)
    if template.is_concrete:
        host = np.asarray(template)
        if (
            restored.dtype == host.dtype
            and restored.shape == host.shape
            and np.array_equal(_bytes_of(restored), _bytes_of(host))
        ):
            # The template's own constant holds these bytes: keep it (its device
            # buffers too), as `tree_unflatten` keeps a constant rebuilt from its buffer.
            return template
    # In the dtype it was saved in (float64 stays float64 whatever the x64 setting here).
    return FrozenConst(restored, restored.dtype)


def _bytes_of(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    # Contiguous first: a NumPy view of a device buffer may be strided (a TPU's layout), and
    # only a contiguous last axis can be viewed as bytes.
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def register_flax() -> None:
    """Teach `flax.serialization` (`to_bytes`, `from_bytes`, `to_state_dict`) to handle constants.

    A constant is saved as its host data, as a `jax.Array` is saved as its
    values, and restores as a FrozenConst: the template's own constant where
    the bytes are the same, else a new constant of the restored data. Called
    by `import frozenconst` when flax is already imported; call it yourself
    where flax may be imported later. Calling it again does nothing.

    Examples:
        >>> import numpy as np, frozenconst
        >>> from flax import serialization
        >>> frozenconst.register_flax()
        >>> x = frozenconst.FrozenConst(np.arange(3.0))
        >>> data = serialization.to_bytes({"t": x})
        >>> serialization.from_bytes({"t": x}, data)["t"] is x
        True
    """
    from flax import serialization

    # flax's registry functions carry no annotations.
    is_serializable: Callable[[type], bool] = serialization.is_serializable
    register: Callable[..., None] = serialization.register_serialization_state
    if not is_serializable(FrozenConst):
        # `override`: two threads may both get here; the second writes the same pair.
        register(FrozenConst, _to_state, _from_state, override=True)


def register_if_imported() -> None:
    """`register_flax()` if flax is imported already; flax is never imported here."""
    if "flax" in sys.modules:
        register_flax()
