"""Constants in flax NNX modules: a `Variable` type that holds a FrozenConst, and `freeze`.

`freeze(model.encoder)` turns every `nnx.Param` of a pretrained submodule into a
[`Frozen`][frozenconst.nnx.Frozen] variable: NNX sees the constant's cached device buffer as
its value, and, not being an `nnx.Param`, it is left out of `nnx.grad` and of optimizers.

A value written back into it (docs: Training, "Flax NNX"): `nnx.jit` writes every variable back
after a step, and JAX returns an unchanged input in a new buffer. A `Frozen` variable drops such
a copy of its constant's shape and dtype (`nnx.jit`, `nnx.update`, `nnx.merge`), keeping one
device buffer across steps; another shape or dtype raises `FrozenConstValueError`. Only another
`FrozenConst` changes its value; any other assignment raises `FrozenConstTypeError`. Inside a
transformation it holds the traced value, as any variable does.

Importing this module imports flax; `import frozenconst` never does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx
from flax.nnx.filterlib import Filter

from ._cache import owner_of
from ._compat import ArrayImpl, Tracer
from ._errors import FrozenConstTypeError, FrozenConstValueError
from ._frozen import FrozenConst, derived_leaf

__all__ = ["Frozen", "freeze"]

_N = TypeVar("_N")

# Where a Variable keeps its value: a slot `_raw_value` since flax 0.12 (read and written by
# name, `get_raw_value`/`set_raw_value` and `object.__setattr__`, in graphlib, `nnx.jit`'s
# write-back and `jit_partial`'s `_apply_raw_updates`); `raw_value` in flax 0.11. `Frozen` puts
# a property of that name in front of the slot: every read and write of the value, whichever
# path flax takes, goes through `_read` and `_write` below.
_STORAGE = "_raw_value" if "_raw_value" in getattr(nnx.Variable, "__slots__", ()) else "raw_value"
# flax 0.12 has `get_value`/`set_value`, the public read and write (`variable[...]`,
# `variable.value`); flax 0.11 reads and writes through the `value` property.
_HAS_SET_VALUE = hasattr(nnx.Variable, "set_value")
# flax 0.12 makes every variable it rebuilds through `Variable._new` (0.11 inlines it).
_HAS_NEW = hasattr(nnx.Variable, "_new")
# What `Frozen._new` has flax write first: no value yet, both slots set to None.
_FRESH: Any = object()


class Frozen(nnx.Variable[jax.Array]):
    """A `nnx.Variable` holding a `FrozenConst`: a pretrained weight that training never changes.

    NNX sees the constant's cached device buffer (a `jax.Array`) as the variable's
    value, so every NNX module and `jnp` function takes it as it takes a
    `nnx.Param`'s. It is no `nnx.Param`: `nnx.grad` and optimizers built with
    `wrt=nnx.Param` leave it out. A copy of the constant written back into it
    (`nnx.jit` writes every variable back after a step) is dropped, so the module
    keeps the constant's one device buffer. Make one from a FrozenConst, or from an
    array (frozen into a new FrozenConst); `freeze` makes them from a module's
    parameters.

    Arguments:
        value: a `FrozenConst`, or an array frozen into one (a traced or abstract
            value, inside `nnx.eval_shape` or a trace, is held as it is).
        **metadata: the variable's metadata, as for any `nnx.Variable`.

    Raises:
        FrozenConstTypeError: assigning it anything but a `FrozenConst`
            (`variable[...] = x`, `variable.set_value(x)`).

    Examples:
        >>> import numpy as np, jax.numpy as jnp, frozenconst
        >>> from flax import nnx
        >>> table = frozenconst.FrozenConst(np.eye(3, dtype=np.float32))
        >>> variable = frozenconst.nnx.Frozen(table)
        >>> variable.const is table, bool(jnp.all(jnp.tile(variable, (2, 1))[3:] == table))
        (True, True)
    """

    __slots__ = ("_frozenconst_const", "_frozenconst_held")

    def __init__(self, value: Any, **metadata: Any) -> None:
        super().__init__(_frozen_value(value), **metadata)

    @property
    def const(self) -> FrozenConst | None:
        """The FrozenConst this variable holds; None while it holds a traced or abstract value."""
        return _const_of(self)

    if _HAS_SET_VALUE:

        def set_value(self, value: Any, **kwargs: Any) -> None:
            """Refused unless `value` is a `FrozenConst` (then it becomes the variable's constant)."""
            _write(self, _assignable(value, kwargs))

    def __setitem__(self, key: Any, value: Any) -> None:
        """Refused unless `key` is `...` and `value` a `FrozenConst` (the variable's new constant)."""
        _write(self, _assignable(value, {"index": key}))

    if _HAS_NEW:

        @classmethod
        def _new(cls, value: Any, metadata: dict[str, Any]) -> Any:
            """flax's own, on a variable whose slots are set before its value is written: unset,
            `_write`'s read of them would raise and catch an error on every pytree rebuild."""
            variable: Any = super()._new(_FRESH, metadata)
            if type(value) is ArrayImpl:
                # `_write` on a new variable given a concrete array, inlined (a functional loop
                # rebuilds every variable per step): the constant where it is its own buffer.
                owner = owner_of(value)
                if owner is None:
                    _HELD.__set__(variable, value)
                else:
                    _CONST.__set__(variable, FrozenConst._of(*owner))  # pyright: ignore[reportPrivateUsage]
                return variable
            _write(variable, value)
            return variable

    # `copy.copy` and `copy.deepcopy` look these up by name, and a Variable hands a name it
    # lacks to its value (`Variable.__getattr__`): without them a copy of a variable would
    # be a copy of its buffer. A constant is immutable: a copy holds the same one.
    def __copy__(self) -> Frozen:
        return self._copy(None)

    def __deepcopy__(self, memo: dict[int, Any]) -> Frozen:
        return self._copy(memo)

    def _copy(self, memo: dict[int, Any] | None) -> Frozen:
        const = _const_of(self)
        value = const if const is not None else _read(self)
        metadata = dict(self.get_metadata())
        if memo is not None:
            metadata = copy.deepcopy(metadata, memo)
            if const is None:
                value = copy.deepcopy(value, memo)
        made: Frozen = type(self).from_metadata(value, metadata)  # type: ignore[assignment]
        return made

    def __getstate__(self) -> dict[str, Any]:
        # The constant itself (pickled as its host data), not its device buffer.
        state: dict[str, Any] = super().__getstate__()  # type: ignore[no-untyped-call,unused-ignore]  # unannotated in flax
        const = _const_of(self)
        if const is not None:
            state[_STORAGE] = const
        return state


_CONST = Frozen.__dict__["_frozenconst_const"]
_HELD = Frozen.__dict__["_frozenconst_held"]


def _const_of(variable: Frozen) -> FrozenConst | None:
    # A variable made with `object.__new__` has no slot set before its first write: flax
    # 0.11's rebuilds, an unpickled one. flax 0.12 rebuilds through `Frozen._new`, which
    # sets them first.
    try:
        const: FrozenConst | None = _CONST.__get__(variable)
    except AttributeError:
        return None
    return const


def _read(variable: Frozen) -> Any:
    # `_const_of`, inlined: flax reads the value on every flatten of the variable.
    try:
        const: FrozenConst | None = _CONST.__get__(variable)
    except AttributeError:  # unset (see `_const_of`): no value written yet
        return None
    if const is not None:
        # The cached device buffer: the one a hit returns, a frozenconst.jit parameter
        # while one traces, transferred again if it was deleted.
        return const.__jax_array__()
    return _HELD.__get__(variable)  # set with `_CONST`, always (`_write`)


def _concrete(value: object) -> bool:
    return isinstance(value, (jax.Array, np.ndarray)) and not isinstance(value, Tracer)


def _write(variable: Frozen, value: Any) -> None:
    if value is _FRESH:
        _CONST.__set__(variable, None)
        _HELD.__set__(variable, None)
        return
    const: FrozenConst | None = None
    if isinstance(value, FrozenConst):
        leaf = derived_leaf(value)
        if leaf is None:
            const = value
        else:
            value = leaf
    # Read only where used: on a variable just made with `object.__new__` (flax 0.11's
    # rebuilds) the slot is unset, and the read raises and catches an error.
    held = None if const is not None else _const_of(variable)
    if const is None and isinstance(value, jax.Array):
        if held is not None and value is held.__jax_array__():
            # Its own constant's buffer, written back: nothing changes.
            return
        # A constant's own cached buffer (flax copies a variable by its value, and
        # rebuilds one from a pytree leaf): the variable holds that constant again.
        owner = owner_of(value)
        if owner is not None:
            const = FrozenConst._of(*owner)  # pyright: ignore[reportPrivateUsage] - a handle on a known store
    if const is not None:
        _CONST.__set__(variable, const)
        _HELD.__set__(variable, None)
        return
    if held is not None and _concrete(value):
        if tuple(value.shape) == held.shape and np.dtype(value.dtype) == held.dtype:
            # A copy of the constant written back (`nnx.jit` after a step): dropped.
            return
        raise FrozenConstValueError(
            f"A `Frozen` variable holds a constant of {held.dtype}{list(held.shape)}, and "
            f"a value of {np.dtype(value.dtype)}{list(value.shape)} was written into it. "
            "Its value changes only by assigning another FrozenConst: "
            "`variable.set_value(frozenconst.FrozenConst(array))`."
        )
    _CONST.__set__(variable, None)
    _HELD.__set__(variable, value)


def _assignable(value: Any, kwargs: Mapping[str, Any]) -> FrozenConst:
    """`value`, where a public assignment may write it: a constant, whole."""
    index = kwargs.get("index", ...)
    if isinstance(value, FrozenConst) and value.is_concrete and index is ...:
        return value
    received = type(value).__name__
    raise FrozenConstTypeError(
        f"A `Frozen` variable is frozen: it takes no `{received}`. Assign a whole "
        "FrozenConst to change its constant (`variable.set_value(frozenconst.FrozenConst(array))`), "
        "or keep what training changes in a `nnx.Param`."
    )


def _frozen_value(value: Any) -> Any:
    """`value` as a new `Frozen` variable holds it: a constant where it can be one."""
    if isinstance(value, FrozenConst):
        return value
    if isinstance(value, nnx.Variable):
        raise FrozenConstTypeError(
            f"`Frozen` takes a value, not a `{type(value).__name__}`: pass the module "
            "holding it to `frozenconst.nnx.freeze`."
        )
    if isinstance(value, (Tracer, jax.ShapeDtypeStruct)):
        # Inside `nnx.eval_shape` or a trace: the type now, the constant when concrete.
        return value
    if isinstance(value, jax.Array):
        owner = owner_of(value)
        if owner is not None:
            return FrozenConst._of(*owner)  # pyright: ignore[reportPrivateUsage] - a handle on a known store
        if not value.is_fully_addressable or len(value.sharding.device_set) > 1:
            return FrozenConst(value, sharding=value.sharding)
    return FrozenConst(value)


def _install() -> None:
    setattr(Frozen, _STORAGE, property(_read, _write, doc="The constant's device buffer, as flax reads it."))
    if not _HAS_SET_VALUE:
        # flax 0.11: the `value` property is the public read and write.
        value = nnx.Variable.__dict__["value"]

        def set_value(variable: Frozen, new: Any) -> None:
            _write(variable, _assignable(new, {}))

        Frozen.value = property(value.fget, set_value, doc=value.__doc__)  # type: ignore[assignment,method-assign,misc,unused-ignore]


_install()


def _set_child(parent: Any, key: Any, value: Any) -> None:
    if isinstance(parent, (MutableSequence, MutableMapping)) or (
        isinstance(key, int) and hasattr(parent, "__setitem__")
    ):
        parent[key] = value
    elif isinstance(parent, (tuple, Mapping)):
        raise FrozenConstTypeError(
            f"`freeze` cannot replace a variable inside a `{type(parent).__name__}` (immutable): "
            "hold it in a module, list or dict."
        )
    else:
        setattr(parent, str(key), value)


def _children(parent: Any) -> list[tuple[Any, Any]]:
    """The direct children of a graph node `iter_graph` yields: a mapping's items, a sequence's
    items by index, an object's attributes."""
    if isinstance(parent, Mapping):
        return list(parent.items())
    if isinstance(parent, Sequence) and not isinstance(parent, (str, bytes)):
        return list(enumerate(parent))
    if hasattr(parent, "__dict__"):
        return list(vars(parent).items())
    return []


def freeze(node: _N, wrt: Filter = nnx.Param) -> _N:
    """Freeze the parameters of a module in place: each becomes a `Frozen` variable holding a FrozenConst.

    The NNX way to say "this pretrained part is never trained": every variable of
    `node` that `wrt` selects (an NNX filter; by default every `nnx.Param`, so
    `nnx.LoRAParam`s too) is replaced, wherever `node`'s graph holds it, by a
    [`Frozen`][frozenconst.nnx.Frozen] variable with the same metadata holding a
    FrozenConst of its value (a variable holding a FrozenConst already keeps that
    very constant; a variable shared by two modules stays shared). Freeze before
    building the optimizer: `nnx.Optimizer` keeps state for what `wrt=` selects
    when it is built. Freezing again is harmless. Inside `nnx.eval_shape` the
    variables change type and keep their abstract values, so an abstract model
    for a checkpoint's restore can be frozen as the real one is.

    Arguments:
        node: a module (or any NNX graph node: a list or dict of modules).
        wrt: an NNX filter on `(path, variable)`: `nnx.Param` (the default),
            `nnx.PathContains("encoder")`, `nnx.All(nnx.Param, ...)`.

    Returns:
        `node`, frozen.

    Raises:
        FrozenConstTypeError: a selected variable sits in a tuple (NNX cannot
            replace it there), or is a hijax or ref variable.

    Examples:
        >>> import jax.numpy as jnp, optax, frozenconst
        >>> from flax import nnx
        >>> model = nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.Linear(8, 2, rngs=nnx.Rngs(1)))
        >>> _ = frozenconst.nnx.freeze(model.layers[0])
        >>> type(model.layers[0].kernel).__name__, type(model.layers[1].kernel).__name__
        ('Frozen', 'Param')
        >>> optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        >>> kernel = model.layers[0].kernel.const
        >>> @nnx.jit
        ... def step(model, optimizer, x):
        ...     grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
        ...     optimizer.update(model, grads)
        >>> step(model, optimizer, jnp.ones((3, 4)))
        >>> model.layers[0].kernel.const is kernel
        True
    """
    predicate = nnx.filterlib.to_predicate(wrt)
    made: dict[int, Frozen] = {}
    parents: list[Any] = []
    for path, value in nnx.iter_graph(node):
        if not isinstance(value, nnx.Variable):
            parents.append(value)
            continue
        if isinstance(value, Frozen):
            if value.const is None and _concrete(_read(value)):
                _write(value, _frozen_value(_read(value)))
            continue
        if not path or not predicate(path, value):
            continue
        metadata = dict(value.get_metadata())
        if metadata.get("hijax") or metadata.get("ref"):
            raise FrozenConstTypeError(
                f"`freeze` does not take hijax or ref variables ({'/'.join(map(str, path))})."
            )
        raw = getattr(value, _STORAGE)
        if isinstance(raw, FrozenConst) and not raw.is_concrete:
            raw = derived_leaf(raw)
        # As flax builds a variable from a value and its metadata (`from_metadata`):
        # no hooks run again, the metadata (sharding names, ...) kept as it was.
        frozen: Frozen = Frozen.from_metadata(_frozen_value(raw), metadata)  # type: ignore[assignment]
        made[id(value)] = frozen
    # Every place that holds a replaced variable (`iter_graph` visits a shared one once).
    for parent in parents:
        for key, child in _children(parent):
            if isinstance(child, nnx.Variable) and id(child) in made:
                _set_child(parent, key, made[id(child)])
    return node
