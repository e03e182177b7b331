"""`frozenconst.filter_jit`: `eqx.filter_jit`'s calling convention, on `frozenconst.jit`.

A function taking an equinox module (activations, static fields, Python
numbers beside its arrays) cannot go through `jax.jit`, which takes arrays
only; `eqx.filter_jit` traces the arrays and holds everything else static.
This does the same on top of `frozenconst.jit`, and adds what `eqx.filter_jit`
cannot: a FrozenConst the function returns as it received it comes back as
itself, with no output buffer and no copy (docs/training.md). Equinox itself
is not needed.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import jax
import numpy as np

from ._errors import FrozenConstTypeError
from ._frozen import FrozenConst, derived_leaf
from ._jit import JitWrapped, refuse_uncompilable

# The compiled function's parameters and return type: the wrapped function's.
_P = ParamSpec("_P")
_R = TypeVar("_R")

# What `eqx.is_array` traces: JAX and NumPy arrays, NumPy scalars.
_ARRAYS = (jax.Array, np.ndarray, np.generic)


def _traced_leaf(x: Any) -> bool:
    return isinstance(x, (FrozenConst, *_ARRAYS))


class Static:
    """Hashable static half of a call or an output: the tree, and its non-array leaves.

    A pytree node with no leaves, so that, returned from the traced function, it
    travels in JAX's output tree (cached with the program) rather than as an
    output buffer.
    """

    __slots__ = ("_hash", "leaves", "treedef")

    def __init__(self, treedef: Any, leaves: tuple[Any, ...]) -> None:
        self.treedef = treedef
        self.leaves = leaves
        self._hash: int | None = None

    def __hash__(self) -> int:
        if self._hash is None:
            try:
                self._hash = hash((self.treedef, self.leaves))
            except TypeError as err:
                kinds = sorted({type(v).__name__ for v in self.leaves if not _hashable(v)})
                raise FrozenConstTypeError(
                    "frozenconst.filter_jit holds every leaf that is not an array static, and "
                    f"static leaves must be hashable, but received unhashable {', '.join(kinds)}. "
                    "Make them arrays, hashable (a tuple, a frozen dataclass), or close over them."
                ) from err
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Static)
            and self.treedef == other.treedef
            and all(_same_static(a, b) for a, b in zip(self.leaves, other.leaves, strict=True))
        )


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _same_static(a: Any, b: Any) -> bool:
    # As `eqx.filter_jit`: equal by `==` where both sides are the same type
    # (1 and 1.0 and True are different static configurations). The same object first, as
    # `jax.jit` finds a static argument in its cache (Python's `tuple` and `dict` comparisons
    # do the same): a leaf unequal to itself (`float("nan")`) would otherwise compile anew
    # at every call.
    return a is b or (type(a) is type(b) and bool(a == b))


class _Dynamic:
    """A placeholder in a static half: the leaf is the traced argument at this position."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<traced>"


_DYNAMIC = _Dynamic()


@dataclasses.dataclass(frozen=True, slots=True)
class _Returned:
    """In an output's static half: the FrozenConst the call received at this traced position."""

    position: int


def _split(tree: Any) -> tuple[list[Any], Static]:
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: isinstance(x, FrozenConst))
    dynamic = [leaf if _traced_leaf(leaf) else None for leaf in leaves]
    static = tuple(_DYNAMIC if _traced_leaf(leaf) else leaf for leaf in leaves)
    return dynamic, Static(treedef, static)


def _join(dynamic: list[Any], static: Static, received: list[Any]) -> Any:
    leaves = [
        received[s.position] if isinstance(s, _Returned) else d if s is _DYNAMIC else s
        for d, s in zip(dynamic, static.leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(static.treedef, leaves)


class FilterJitted(Generic[_P, _R]):
    """A function compiled by [`frozenconst.filter_jit`][frozenconst.filter_jit].

    Call it like the original.
    """

    __slots__ = ("__dict__", "__weakref__", "_fun", "_jitted")

    def __init__(self, fun: Callable[_P, _R], jit_kwargs: dict[str, Any]) -> None:
        self._fun = fun
        call: Callable[..., Any] = fun  # called with the arguments rebuilt from the two halves

        def traced(dynamic: list[Any], static: Static) -> tuple[list[Any], Static]:
            args, kwargs = _join(dynamic, static, dynamic)
            # Each FrozenConst received holds a derived value around its parameter here.
            received = {id(leaf): i for i, leaf in enumerate(map(derived_leaf, dynamic)) if leaf is not None}
            out_dynamic, out_static = _split(call(*args, **kwargs))
            marks = list(out_static.leaves)
            for i, out in enumerate(out_dynamic):
                leaf = derived_leaf(out)
                position = None if leaf is None else received.get(id(leaf))
                if position is not None and derived_leaf(dynamic[position]) is leaf:
                    # Returned as received: the caller gets its own object back.
                    marks[i], out_dynamic[i] = _Returned(position), None
            return out_dynamic, Static(out_static.treedef, tuple(marks))

        # Its own signature for jax.jit, and the user's function behind `__wrapped__`, whose
        # file and line JAX names in its tracing errors.
        traced.__signature__ = inspect.signature(traced)  # type: ignore[attr-defined]
        traced.__wrapped__ = fun  # type: ignore[attr-defined]
        traced.__name__ = getattr(fun, "__name__", "filter_jit")
        traced.__qualname__ = getattr(fun, "__qualname__", traced.__name__)
        self._jitted = JitWrapped(traced, {**jit_kwargs, "static_argnums": 1})
        functools.update_wrapper(self, fun)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        dynamic, static = _split((args, kwargs))
        hash(static)  # an unhashable static leaf raises here, with its fix, not inside jax.jit
        out_dynamic, out_static = self._jitted(dynamic, static)
        out: _R = _join(out_dynamic, out_static, dynamic)  # what `fun` returned, as it traced it
        return out

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Like `eqx.filter_jit(f).lower`: the program for these arguments, constants as parameters."""
        dynamic, static = _split((args, kwargs))
        return self._jitted.lower(dynamic, static)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else functools.partial(self, instance)


def filter_jit(fun: Callable[_P, _R], /, *, embed_max_bytes: int | None = None) -> FilterJitted[_P, _R]:
    """`eqx.filter_jit`, with every FrozenConst the function reaches kept out of the program.

    Arrays (`jax.Array`, NumPy arrays and scalars) and FrozenConsts in the
    arguments are traced; every other leaf (an equinox module's activation
    functions and static fields, Python numbers, strings) is static: hashed,
    and a new value compiles anew, as `eqx.filter_jit` does. FrozenConsts
    received, closed over or reached through attributes are parameters fed
    from their cached device buffers (as `frozenconst.jit` feeds them), and a
    FrozenConst returned as it was received comes back as that same object,
    with no output buffer. Non-array outputs are returned as they were traced.

    Arguments:
        fun: the function to compile.
        embed_max_bytes: as for [`frozenconst.jit`][frozenconst.jit].

    Returns:
        A callable with `lower`.

    Raises:
        FrozenConstTypeError: (at call time) a static leaf is not hashable.

    Examples:
        >>> import numpy as np, jax, jax.numpy as jnp, frozenconst
        >>> table = frozenconst.FrozenConst(np.ones((256, 256), np.float32))
        >>> model = {"table": table, "act": jax.nn.relu, "scale": 2.0}
        >>> @frozenconst.filter_jit
        ... def apply(model, x):
        ...     return model["act"](model["table"] @ x) * model["scale"], model
        >>> y, same = apply(model, jnp.ones(256))
        >>> same["table"] is table, float(y[0])
        (True, 512.0)
    """
    refuse_uncompilable(fun, "frozenconst.filter_jit")
    kwargs: dict[str, Any] = {} if embed_max_bytes is None else {"embed_max_bytes": embed_max_bytes}
    return FilterJitted(fun, kwargs)
