"""The programs JAX lowers, shown to frozenconst's observers before JAX lowers them.

JAX lowers every program it compiles through one function (`_compat.LOWERING_HOOK`):
`jax.jit` functions and the wrappers built on it (`eqx.filter_jit`, `nnx.jit`,
`frozenconst.jit`), `pmap`, primitives run eagerly, `jax.export`. frozenconst replaces
that function once, at import, with one that shows each program to the observers
registered here and then lowers it unchanged. The observers: the warning that JAX is
about to embed a FrozenConst (`_embedding`), always; the pytest guard
`no_numpy_constants` (`_guard`), while a guard is open. Lowering is what JAX does once
per program, never per call, so an observer costs nothing on a cache hit.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from . import _compat

# An observer: `(program, embeds_literals)`, the closed program JAX lowers and whether its
# literal arrays are copied into it (`_compat.lowering_embeds_literals`).
Observer = Callable[[Any, bool], None]

_lock = threading.Lock()
# Rebound (never mutated) under `_lock`, so the lowering reads a consistent tuple unlocked.
_observers: tuple[Observer, ...] = ()
_installed = False


def add(observer: Observer) -> bool:
    """Show every program JAX lowers from now on to `observer`; False where this JAX has no
    lowering function frozenconst can see (nothing is shown then)."""
    global _observers
    with _lock:
        if not _install():
            return False
        _observers = (*_observers, observer)
    return True


def remove(observer: Observer) -> None:
    """Stop showing programs to `observer`."""
    global _observers
    with _lock:
        _observers = tuple(o for o in _observers if o is not observer)


def _install() -> bool:
    """Replace JAX's lowering function with the observing one, once (called under `_lock`)."""
    global _installed
    if _installed:
        return True
    hook = _compat.LOWERING_HOOK
    original = None if hook is None else getattr(hook[0], hook[1], None)
    if hook is None or not callable(original):
        return False
    setattr(hook[0], hook[1], _observing(original))
    _installed = True
    return True


def _observing(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def lower(*args: Any, **kwargs: Any) -> Any:
        observers = _observers
        if observers:
            program = _compat.lowered_program(args, kwargs)
            embeds_literals = _compat.lowering_embeds_literals(kwargs)
            for observer in observers:
                observer(program, embeds_literals)
        return original(*args, **kwargs)

    return lower
