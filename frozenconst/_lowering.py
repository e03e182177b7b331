"""Everything frozenconst installs into JAX, installed by one call, `install()`, at import.

Three of JAX's lowering functions are wrapped, each once, each read by JAX through its module
at call time (`_compat` says where and on which versions):

- `pxla.lower_sharding_computation`, which lowers every jitted program: `_hoist.lower` keeps
  FrozenConsts out of it (or embeds them and says why);
- `core.jaxpr_const_args`, a program's hoisted constants: `_hoist.const_args` answers for the
  lowering `_hoist.lower` runs, and JAX's own function answers everywhere else;
- `mlir.lower_jaxpr_to_module`, which every top-level program reaches: it shows the program to
  the observers registered here (the pytest guard `no_numpy_constants`, while a guard is open;
  on a JAX whose hoisting frozenconst cannot reach, the warning of what is embedded).

Lowering happens once per program, never on a cached call, so none of this costs a call
anything. A program with no FrozenConst lowers exactly as JAX lowers it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from . import _compat, _hoist
from ._cache import DROPPED

# An observer: `(program, embeds_literals)`, the closed program JAX lowers and whether its
# literal arrays are copied into it (`_compat.lowering_embeds_literals`).
Observer = Callable[[Any, bool], None]


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
    """Install frozenconst's lowering into JAX, once per process (`import frozenconst` calls it)."""
    with _installed.lock:
        if _installed.done:
            return
        _installed.done = True
        hooks = _compat.HOISTING
        if hooks is not None:
            original = hooks.lower
            hooks.pxla.lower_sharding_computation = functools.wraps(original)(
                functools.partial(_hoist.lower, original)
            )
            hooks.core.jaxpr_const_args = functools.wraps(hooks.const_args)(_hoist.const_args)
        elif _observe():
            # No hoisting to reach on this JAX: what programs embed is said instead.
            _installed.observers = (*_installed.observers, _hoist.observe_unhoisted)
        DROPPED.append(_hoist.dropped)


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
    hook = _compat.LOWERING_HOOK
    original = None if hook is None else getattr(hook[0], hook[1], None)
    if hook is None or not callable(original):
        return False
    setattr(hook[0], hook[1], _observing(original))
    _installed.observing = True
    return True


def _observing(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def lower(*args: Any, **kwargs: Any) -> Any:
        observers = _installed.observers
        if observers:
            program = _compat.lowered_program(args, kwargs)
            embeds_literals = _compat.lowering_embeds_literals(kwargs)
            for observer in observers:
                observer(program, embeds_literals)
        return original(*args, **kwargs)

    return lower
