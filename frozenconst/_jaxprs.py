"""A program's constants as JAX records them: `walk` finds each use, at every level of nesting,
and `where` names the line of user code it came from. Read by `frozenconst.audit` and by
`frozenconst.no_numpy_constants`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from jax.extend import core as jex_core
from jax.extend import source_info_util


def walk(closed: Any, literals: bool = True) -> Iterator[tuple[Any, Any]]:
    """(constant value, equation) for every reference to a constant, at every level: the
    program's constants, and (`literals`) its literal arrays, the simplified pipeline's form."""
    jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
    consts = dict(zip(jaxpr.constvars, getattr(closed, "consts", ()), strict=False))
    for eqn in jaxpr.eqns:
        for var in eqn.invars:
            if isinstance(var, jex_core.Literal):
                if literals and np.ndim(var.val) > 0:
                    yield var.val, eqn
            elif var in consts:
                yield consts[var], eqn
        for param in eqn.params.values():
            for sub in _sub_jaxprs(param):
                yield from walk(sub, literals)


def _sub_jaxprs(param: Any) -> Iterator[Any]:
    # Closed jaxprs keep their own constants (an inner jax.jit's, on jax 0.10),
    # which `jaxprs_in_params` would drop by yielding the open jaxpr only.
    if isinstance(param, jex_core.ClosedJaxpr | jex_core.Jaxpr):
        yield param
    elif isinstance(param, tuple | list):
        for item in param:
            yield from _sub_jaxprs(item)


def where(eqn: Any) -> str | None:
    """The line of user code an equation came from, as JAX summarizes it, or None."""
    try:
        text = source_info_util.summarize(eqn.source_info)
    except Exception:  # pragma: no cover - JAX recorded nothing usable
        return None
    return text or None
