"""`jax.jit` of the traced function, and JAX's stage objects with the constants bound.

`compiled` makes the `jax.jit` function a `frozenconst.jit` function calls
(`_PerArity` where one sharding is given for every argument: the constants keep
their own); `Traced`, `Lowered` and `Compiled` are `jax.stages`' objects with
the constants bound as parameters, used like the originals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ._argnums import Argnums, shift
from ._cache import Use
from ._compat import EXPORT_LOWERING
from ._errors import FrozenConstTypeError
from ._groups import arrays_for


def compiled(traced: Callable[..., Any], kwargs: dict[str, Any], static: Argnums | None) -> Any:
    """`jax.jit` of `traced` (the constants first, then the user's arguments) with `kwargs`."""
    in_shardings = kwargs.get("in_shardings")
    if in_shardings is not None and not isinstance(in_shardings, tuple):
        return _PerArity(traced, kwargs, () if static is None else shift(static.argnums))
    return jax.jit(traced, **kwargs)


class _PerArity:
    """`jax.jit` told one sharding for every argument (`in_shardings=s`), with the constants left out.

    `jax.jit` applies such a sharding to each of its arguments, and the
    constants are one of them here: so each number of positional arguments
    gets its own `jax.jit`, told `(None, s, s, ...)`, as the user's `jax.jit`
    applies `s` to the arguments only.
    """

    def __init__(self, traced: Callable[..., Any], kwargs: dict[str, Any], static: Any) -> None:
        self._traced = traced
        self._kwargs = kwargs
        # The static positions (the constants counted): `jax.jit`'s shardings skip them.
        self._static: tuple[int, ...] = static
        self._by_count: dict[int, Any] = {}

    def _for(self, n: int) -> Any:
        # `n` counts the constants too; `jax.jit`'s shardings cover the non-static arguments.
        dynamic = n - len({i % n for i in self._static if -n <= i < n})
        jitted = self._by_count.get(dynamic)
        if jitted is None:
            shardings = (None, *[self._kwargs["in_shardings"]] * (dynamic - 1))
            kwargs: dict[str, Any] = {**self._kwargs, "in_shardings": shardings}
            jitted = self._by_count[dynamic] = jax.jit(self._traced, **kwargs)
        return jitted

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._for(len(args))(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self._for(len(args)).lower(*args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        return self._for(len(args)).trace(*args, **kwargs)

    def clear_cache(self) -> None:
        for jitted in list(self._by_count.values()):
            jitted.clear_cache()


class _Stage:
    """A jax stage object with the constants bound, so it is used like the original's."""

    def __init__(self, stage: Any, uses: list[Use]) -> None:
        self._stage = stage
        self._uses = list(uses)

    def __getattr__(self, name: str) -> Any:
        # The stage's public attributes (`jaxpr`, `cost_analysis`, `out_info`, ...).
        if name.startswith("_"):
            if name == "_lowering":
                # Read by `jax.export` from what `Traced.lower` returned: only a
                # JAX whose exporter `EXPORT_LOWERING` does not recognise gets here.
                raise FrozenConstTypeError(
                    "jax.export cannot export a frozenconst.jit function on this JAX: its constants "
                    "are parameters, and a serialized program has to carry them. Export "
                    "`jax.jit(f.__wrapped__)` instead, which embeds them."
                )
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return getattr(self._stage, name)


class Traced(_Stage):
    """`jax.stages.Traced` with the constants bound as parameters."""

    def __init__(self, stage: Any, uses: list[Use], embedded: Callable[[], Any]) -> None:
        super().__init__(stage, uses)
        self._embedded = embedded

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower the traced program."""
        if EXPORT_LOWERING in kwargs:
            # `jax.export.export` lowers this trace and serializes it: a program
            # that runs elsewhere must carry its constants, as `jax.jit(f)`'s
            # export does. So `jax.jit(f)`'s trace is lowered instead, and its
            # `jaxpr` answers the exporter's reads that follow.
            self._stage = self._embedded()
            return self._stage.lower(*args, **kwargs)
        return Lowered(self._stage.lower(*args, **kwargs), self._uses)


class Lowered(_Stage):
    """`jax.stages.Lowered` with the constants bound as parameters."""

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """The lowered program's text (no FrozenConst data appears in it)."""
        text: str = self._stage.as_text(*args, **kwargs)
        return text

    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        """Compile the lowered program."""
        return Compiled(self._stage.compile(*args, **kwargs), self._uses)


class Compiled(_Stage):
    """`jax.stages.Compiled`, called with the original arguments."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._stage(arrays_for(self._uses, args, kwargs), *args, **kwargs)
