"""A program's constants as JAX records them: found at every level of nesting, named by the line
of user code they came from, and turned from embedded data into parameters.

`walk` finds each use of a constant (read by `frozenconst.audit`, the pytest guard and the
hoisting decision), `where` names its line, and `hoist` rewrites a program so that the constants
it is told to keep out are literals, the form JAX's own hoisting passes to the executable as
parameters (`_hoist`). The version differences of JAX's program objects are `_compat_lowering`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from jax.extend import source_info_util

from ._compat_lowering import Literal, Var, closed_parts, has_input_effects, is_program, rebuild


def walk(closed: Any, literals: bool = True) -> Iterator[tuple[Any, Any]]:
    """(constant value, equation) for every reference to a constant, at every level: the
    program's constants, and (`literals`) its literal arrays, the simplified pipeline's form
    and the form of a constant `hoist` keeps out."""
    jaxpr, constvars, values = closed_parts(closed)
    consts = dict(zip(constvars, values, strict=False))
    for eqn in jaxpr.eqns:
        for var in eqn.invars:
            if isinstance(var, Literal):
                if literals and np.ndim(var.val) > 0:
                    yield var.val, eqn
            elif var in consts:
                yield consts[var], eqn
        for param in eqn.params.values():
            for sub in sub_programs(param):
                yield from walk(sub, literals)


def sub_programs(param: Any) -> Iterator[Any]:
    """The programs in an equation parameter, closed ones whole."""
    # Closed programs keep their own constants (an inner `jax.jit`'s), which JAX's
    # `jaxprs_in_params` would drop by yielding the open program only.
    if is_program(param):
        yield param
    elif isinstance(param, tuple | list):
        for item in param:
            yield from sub_programs(item)


def where(eqn: Any) -> str | None:
    """The line of user code an equation came from, as JAX summarizes it, or None."""
    try:
        text = source_info_util.summarize(eqn.source_info)
    except Exception:  # pragma: no cover - JAX recorded nothing usable
        return None
    return text or None


def hoist(
    closed: Any, keep_out: dict[int, Any], placed: dict[int, Any] | None = None, stuck: set[int] | None = None
) -> Any:
    """`closed` with each constant whose value is in `keep_out` (by `id`) a literal, the form
    lowering with `hoist_constants_as_args` passes as a parameter, at every level, and each value
    in `placed` replaced by its placed copy; the same object where nothing changes. A level whose
    effects name its inputs by position keeps its constants (their ids go to `stuck`)."""
    return _Hoist(keep_out, placed or {}, set() if stuck is None else stuck).closed(closed)


class _Hoist:
    """One rewrite: shared sub-programs (one object used twice) are rewritten once."""

    __slots__ = ("done", "keep_out", "placed", "stuck")

    def __init__(self, keep_out: dict[int, Any], placed: dict[int, Any], stuck: set[int]) -> None:
        self.keep_out, self.placed, self.stuck = keep_out, placed, stuck
        # id -> (original, rewritten); the original kept so that its id stays its own.
        self.done: dict[int, tuple[Any, Any]] = {}

    def closed(self, closed: Any) -> Any:
        seen = self.done.get(id(closed))
        if seen is not None:
            return seen[1]
        jaxpr, constvars, values = closed_parts(closed)
        literals: dict[Any, Any] = {}
        kept_vars: list[Any] = []
        kept_values: list[Any] = []
        movable = not has_input_effects(jaxpr)
        swapped = False
        for var, value in zip(constvars, values, strict=True):
            placed = self.placed.get(id(value), value)
            swapped = swapped or placed is not value
            if self.keep_out.get(id(placed)) is placed:
                if movable:
                    literals[var] = Literal(placed, var.aval)
                    continue
                self.stuck.add(id(placed))
            kept_vars.append(var)
            kept_values.append(placed)
        eqns, outvars, changed = self._body(jaxpr, literals)
        out = closed
        if changed or literals or swapped:
            out = rebuild(closed, constvars=kept_vars, consts=kept_values, eqns=eqns, outvars=outvars)
        self.done[id(closed)] = (closed, out)
        return out

    def _body(self, jaxpr: Any, literals: dict[Any, Any]) -> tuple[list[Any], list[Any], bool]:
        changed = False
        eqns = []
        for eqn in jaxpr.eqns:
            invars = [self._atom(v, literals) for v in eqn.invars]
            params = {k: self._param(p) for k, p in eqn.params.items()}
            if any(a is not b for a, b in zip(invars, eqn.invars, strict=True)) or any(
                params[k] is not eqn.params[k] for k in params
            ):
                eqn = eqn.replace(invars=invars, params=params)
                changed = True
            eqns.append(eqn)
        outvars = [self._atom(v, literals) for v in jaxpr.outvars]
        changed = changed or any(a is not b for a, b in zip(outvars, jaxpr.outvars, strict=True))
        return eqns, outvars, changed

    def _atom(self, atom: Any, literals: dict[Any, Any]) -> Any:
        if isinstance(atom, Var):
            return literals.get(atom, atom)
        if isinstance(atom, Literal):
            placed = self.placed.get(id(atom.val))
            if placed is not None:
                return Literal(placed, atom.aval)
        return atom

    def _param(self, param: Any) -> Any:
        if is_program(param):
            return self.closed(param)
        if isinstance(param, tuple | list):
            items = [self._param(p) for p in param]
            if all(a is b for a, b in zip(items, param, strict=True)):
                return param
            if isinstance(param, list):
                return items
            if hasattr(param, "_fields"):  # a named tuple (`custom_linear_solve`'s `jaxprs`)
                return type(param)(*items)
            return tuple(items)
        return param
