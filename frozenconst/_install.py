"""Everything frozenconst changes in JAX's state (and in flax's and hypothesis's), in one place.

`import frozenconst` calls `install()` once; nothing else in the package changes another
library's state when imported. What it installs:

- FrozenConst as a pytree node (`jax.tree_util`), with its serialization in an exported
  program's calling convention (`jax.export`), and as an array type `jax.lax` takes as an
  operand where JAX has the tables (`_compat.register_array_type`);
- frozenconst's files among the frames JAX leaves out of source locations and tracebacks,
  as it leaves its own (`_compat.exclude_package_frames`);
- `frozenconst.filter_jit`'s static placeholder as a pytree node;
- JAX's lowering functions, each wrapped once (`_compat_lowering` names them, with where and
  on which versions): the lowering of every jitted program, where `_hoist.lower` keeps
  FrozenConsts out (or embeds them and says why), `_hoist.const_args` answers for its hoisted
  constants and `_hoist.discharged` keeps them out of the pure program JAX makes of one with
  mutable references; and the lowering every top-level program reaches, which shows the program
  to the observers registered here (each open `no_numpy_constants` guard; on a JAX whose
  hoisting frozenconst cannot reach, the warning of what is embedded);
- the seams between the core and the jit side: a dropped or lost device buffer is told to
  `_hoist.dropped` (`_cache.STATE.dropped`), which recompiles the programs that held it, and
  the buffers of a dying constant to `_hoist.RELICS` (`_cache.STATE.outlived`), which keeps
  those a trace still holds known to its lowering;
- `flax.serialization` and `st.from_type` learn FrozenConst, where flax or hypothesis is
  imported already (the other order: `register_flax()`, hypothesis's entry point).

Lowering happens once per program, never on a cached call, so none of this costs a call
anything. A program with no FrozenConst lowers exactly as JAX lowers it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import jax

from . import _compat, _compat_lowering, _hoist
from ._cache import STATE
from ._filter_jit import Static
from ._flax import register_if_imported as register_flax_if_imported
from ._frozen import FrozenConst
from ._hypothesis_hook import register_if_imported as register_strategy_if_imported

# An observer: `(program, kwargs)`, the closed program JAX lowers and the lowering's keyword
# arguments (which say what JAX hoists: `_compat_lowering.hoisted_by_jax`).
Observer = Callable[[Any, dict[str, Any]], None]


class _Installed:
    """What is installed, and the observers of programs, each change under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.observing = False
        # Rebound (never mutated) under the lock, so that a lowering reads a consistent tuple.
        self.observers: tuple[Observer, ...] = ()


_installed = _Installed()


def install() -> None:
    """Install everything above, once per process (`import frozenconst` calls it)."""
    with _installed.lock:
        if _installed.done:
            return
        _installed.done = True
        _compat.exclude_package_frames()
        # Registered with the methods themselves (not `register_pytree_with_keys_class`, which
        # calls them through `operator.methodcaller`): one call less per flatten. JAX's
        # annotation says a node unflattens to its own type; NumPy data in a constant's place
        # unflattens to that NumPy array (`_derived.rebuild`), as JAX itself allows.
        jax.tree_util.register_pytree_with_keys(
            FrozenConst,
            FrozenConst.tree_flatten_with_keys,
            FrozenConst.tree_unflatten,  # type: ignore[arg-type]
            FrozenConst.tree_flatten,
        )
        # A FrozenConst in an exported function's arguments or outputs (a params tree):
        # `jax.export` serializes the trees of its calling convention, each node type by the name
        # registered here. A constant's node has no auxiliary data.
        jax.export.register_pytree_node_serialization(
            FrozenConst,
            serialized_name="frozenconst.FrozenConst",
            serialize_auxdata=lambda aux: b"",
            deserialize_auxdata=lambda data: None,
        )
        # `core.typeof(x)` answers the cached buffer's type, where a jax.numpy function asks it
        # before converting (`jnp.bincount(x, weights)`), and `jax.lax` takes the buffer as an
        # operand, on the JAX versions that have the tables.
        _compat.register_array_type(FrozenConst, FrozenConst.__jax_array__)
        jax.tree_util.register_pytree_node(Static, lambda s: ((), s), lambda s, _: s)
        hooks = _compat_lowering.HOISTING
        if hooks is not None:
            hooks.wrap_lowering(_hoist.lower, _hoist.const_args, _hoist.discharged)
        elif _observe():
            # No hoisting to reach on this JAX: what programs embed is said instead.
            _installed.observers = (*_installed.observers, _hoist.observe_unhoisted)
        STATE.dropped.append(_hoist.dropped)
        STATE.outlived.append(_hoist.RELICS.outlived)
    register_flax_if_imported()
    register_strategy_if_imported()


def observe(observer: Observer) -> bool:
    """Show every program JAX lowers from now on to `observer`; False where this JAX has no
    lowering function frozenconst can see (nothing is shown then)."""
    with _installed.lock:
        if not _observe():
            return False
        _installed.observers = (*_installed.observers, observer)
    return True


def unobserve(observer: Observer) -> None:
    """Stop showing programs to `observer`."""
    with _installed.lock:
        _installed.observers = tuple(o for o in _installed.observers if o is not observer)


def _observe() -> bool:
    """Replace JAX's module lowering with the observing one, once (called under the lock)."""
    if _installed.observing:
        return True
    hook = _compat_lowering.LOWERING_HOOK
    original = None if hook is None else getattr(hook[0], hook[1], None)
    if hook is None or not callable(original):
        return False

    @functools.wraps(original)
    def lower(*args: Any, **kwargs: Any) -> Any:
        observers = _installed.observers
        if observers:
            program = _compat_lowering.lowered_program(args, kwargs)
            for observer in observers:
                observer(program, kwargs)
        return original(*args, **kwargs)

    setattr(hook[0], hook[1], lower)
    _installed.observing = True
    return True
