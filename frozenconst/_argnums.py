"""Which of a call's arguments are static or donated, as `jax.jit` infers them from its keywords.

`frozenconst.jit` tells static configurations apart by the static arguments
(`Argnums.pick`), finds the donated ones in a call, and passes `jax.jit` argument
numbers moved up by one (`shift`): its traced function takes the constants first.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple


def shift(argnums: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    # The compiled function takes the constants as an extra first parameter, so
    # non-negative argument numbers move up by one. Negative ones count from the
    # end and stay.
    if argnums is None:
        return None
    if isinstance(argnums, int):
        return argnums + 1 if argnums >= 0 else argnums
    return tuple(i + 1 if i >= 0 else i for i in argnums)


class Argnums(NamedTuple):
    """Where some of a call's arguments are (the static ones, the donated ones): positions and
    keyword names, as `jax.jit` infers them."""

    argnums: tuple[int, ...]
    argnames: tuple[str, ...]
    # These arguments of a call made without keywords (the common case, one
    # C call), as a tuple.
    positional: Callable[[tuple[Any, ...]], Any]

    @classmethod
    def of(cls, fun: Callable[..., Any], jit_kwargs: dict[str, Any], kind: str) -> Argnums | None:
        """The `kind` (`"static"`, `"donate"`) arguments, from `jit_kwargs`; None if there are none."""
        nums, names = jit_kwargs.get(f"{kind}_argnums"), jit_kwargs.get(f"{kind}_argnames")
        if nums is None and names is None:
            return None
        argnums = (nums,) if isinstance(nums, int) else tuple(nums or ())
        argnames = (names,) if isinstance(names, str) else tuple(names or ())
        try:
            parameters = list(inspect.signature(fun).parameters.values())
        except (TypeError, ValueError):
            parameters = []
        # As `jax.jit` does (`api_util.infer_argnums_and_argnames`): given only
        # positions, the names of those positions are static too, and the other way round.
        either = [(i, p.name) for i, p in enumerate(parameters) if p.kind is p.POSITIONAL_OR_KEYWORD]
        if nums is None:
            argnums = tuple(i for i, name in either if name in argnames)
        elif names is None:
            argnames = tuple(name for i, name in either if i in argnums)
        return cls(argnums, argnames, _getter(argnums))

    def pick(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """These arguments of a call (for the static ones: what tells a configuration from another)."""
        if not kwargs:
            try:
                return self.positional(args)
            except IndexError:
                pass
        n = len(args)
        return (
            tuple([args[i] for i in self.argnums if -n <= i < n]),
            tuple([(name, kwargs[name]) for name in self.argnames if name in kwargs]),
        )


def _getter(indices: tuple[int, ...]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    if not indices:
        return lambda _: ()
    get = operator.itemgetter(*indices)
    return (lambda args: (get(args),)) if len(indices) == 1 else get
