"""`frozenconst.jit`: `jax.jit` that passes every FrozenConst in as a parameter.

Closed-over arrays are embedded into the compiled program by JAX's default
constant pipeline (jax #3220, #16278, #14655, #21300, #10596) and copied per
use or per executable by the simplified one. Passing the array as an argument
avoids both, and is what every workaround converges on. `frozenconst.jit` does
that rewrite for you: every FrozenConst the function reaches, however it
reaches it, becomes a parameter fed from the constant's cached device buffer.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any, overload

import jax
from jax.sharding import NamedSharding, PartitionSpec

from . import _hoisting
from ._cache import ACCOUNTING, CACHE_EPOCH, Store
from ._compat import DEFAULT_DEVICE, X64, isolated_trace
from ._hoisting import Frame, Rediscover, Source, array_for, enter, leave, scope, source_array
from ._placement import mesh_of

# A trace meets at most this many new constants per retrace round; each round
# adds all constants it met, so this bounds pathological code only.
_MAX_ROUNDS = 64


def _shift(argnums: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    # The compiled function takes the constants as an extra first parameter, so
    # non-negative argument numbers move up by one. Negative ones count from the
    # end and stay.
    if argnums is None:
        return None
    if isinstance(argnums, int):
        return argnums + 1 if argnums >= 0 else argnums
    return tuple(i + 1 if i >= 0 else i for i in argnums)


def _feed(sources: Sequence[Source], args: Any, kwargs: Any) -> tuple[jax.Array, ...]:
    """The arrays to pass for `sources` in a call with these arguments."""
    if _hoisting.active and scope.frames:
        # Called while another frozenconst.jit traces: its parameters.
        return tuple([array_for(s) for s in sources])
    if _multi_device() and any(p is None for _, p in sources):
        # A constant with no declared placement follows the computation's mesh,
        # replicated: passing a single-device buffer into a sharded computation
        # would make JAX move it on every call.
        mesh = mesh_of((args, kwargs))
        if mesh is not None:
            replicated = NamedSharding(mesh, _REPLICATED)
            return tuple([st.placed(replicated) if p is None else st.placed(p) for st, p in sources])
    return tuple([source_array(s) for s in sources])


# PartitionSpec's constructor is unannotated in jax 0.10.
_REPLICATED: PartitionSpec = PartitionSpec()  # type: ignore[no-untyped-call,unused-ignore]


@functools.cache
def _multi_device() -> bool:
    return jax.device_count() > 1


def _visible_constants(fun: Callable[..., Any]) -> list[Source]:
    """The FrozenConsts `fun` closes over or names as globals (nested code included)."""
    from ._frozen import FrozenConst

    target: Any = inspect.unwrap(fun)
    code = getattr(target, "__code__", None)
    if code is None:
        return []
    values: list[Any] = [
        cell.cell_contents for cell in (getattr(target, "__closure__", None) or ()) if _filled(cell)
    ]
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if inspect.iscode(c))
    module_globals = getattr(target, "__globals__", {})
    values += [module_globals[n] for n in names if n in module_globals]
    found: list[Source] = []
    for value in values:
        if isinstance(value, FrozenConst) and value.is_concrete:
            source = value.__frozenconst_source__()
            if source not in found:
                found.append(source)
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


class _Known:
    """The constants a `frozenconst.jit` function has met, and what it fed last.

    Shared by the wrapper (which feeds the constants) and its traced function
    (which meets them), without the traced function holding the wrapper.
    """

    __slots__ = ("fast", "fed", "fed_key", "fed_stores", "lock", "sources")

    def __init__(self) -> None:
        self.sources: list[Source] = []
        self.lock = threading.Lock()
        # The stores fed their default buffers (None: some are fed otherwise).
        self.fast: list[Store] | None = []
        # The arrays fed last, the settings they were fed under, their stores.
        self.fed: tuple[jax.Array, ...] = ()
        self.fed_key: tuple[Any, ...] | None = None
        self.fed_stores: tuple[Store, ...] = ()

    def add(self, pending: list[Source]) -> None:
        with self.lock:
            self.sources.extend(s for s in pending if s not in self.sources)
            # Every constant is fed its default buffer when none declares a
            # placement and, with one device, there is no mesh to follow.
            if all(p is None for _, p in self.sources) and not _multi_device():
                self.fast = [store for store, _ in self.sources]
            else:
                self.fast = None
            self.fed_key = None


class JitWrapped:
    """A function compiled by [`frozenconst.jit`][frozenconst.jit]. Call it like the original."""

    def __init__(self, fun: Callable[..., Any], jit_kwargs: dict[str, Any]) -> None:
        self._fun = fun
        self._known = _Known()
        # Constants visible without tracing (closed over, or module globals the
        # code names) are parameters from the first trace on, which saves that
        # trace's redo; anything else is found by tracing.
        found = _visible_constants(fun)
        if found:
            self._known.add(found)
        kwargs = dict(jit_kwargs)
        for name in ("static_argnums", "donate_argnums"):
            if name in kwargs:
                kwargs[name] = _shift(kwargs[name])
        in_shardings = kwargs.get("in_shardings")
        if isinstance(in_shardings, (tuple, list)):
            kwargs["in_shardings"] = (None, *in_shardings)
        self._jitted = jax.jit(self._make_traced(), **kwargs)
        functools.update_wrapper(self, fun)

    def _make_traced(self) -> Callable[..., Any]:
        fun, known = self._fun, self._known

        def traced(consts: tuple[Any, ...], /, *args: Any, **kwargs: Any) -> Any:
            frame = Frame(dict(zip(known.sources, consts, strict=False)))
            enter(frame)
            try:
                with isolated_trace():
                    out = fun(*args, **kwargs)
            finally:
                leave()
                if frame.pending:
                    known.add(frame.pending)
            if frame.pending:
                raise Rediscover
            return out

        try:
            signature = inspect.signature(fun)
        except (TypeError, ValueError):
            signature = None
        if signature is not None:
            # jax.jit maps `static_argnames`/`donate_argnames` to positions through
            # the signature, so give it the user's, behind the constants.
            consts = inspect.Parameter("_frozenconst_consts", inspect.Parameter.POSITIONAL_ONLY)
            params = list(signature.parameters.values())
            traced.__signature__ = signature.replace(parameters=[consts, *params])  # type: ignore[attr-defined]
        traced.__name__ = getattr(fun, "__name__", "traced")
        traced.__qualname__ = getattr(fun, "__qualname__", traced.__name__)
        return traced

    def _retrying(self, step: Callable[[tuple[jax.Array, ...]], Any], args: Any, kwargs: Any) -> Any:
        for _ in range(_MAX_ROUNDS):
            try:
                return step(_feed(self._known.sources, args, kwargs))
            except Rediscover:
                continue
        raise RuntimeError(  # pragma: no cover - needs 64 rounds of new constants
            "frozenconst.jit kept meeting new FrozenConsts while tracing; this is a bug, please report it."
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The hot path: the constants' arrays from the last call, while no
        # device cache changed (`CACHE_EPOCH`) and the default device and x64
        # setting are the same. A buffer deleted since (donated elsewhere) makes
        # the call fail before it runs; it is then fed afresh and retried.
        known = self._known
        fed = known.fed_key
        if (
            fed is not None
            and CACHE_EPOCH.value == fed[2]
            and DEFAULT_DEVICE.value is fed[0]
            and X64.value is fed[1]
            and not _hoisting.active
        ):
            consts = known.fed
            if ACCOUNTING.enabled:
                for store in known.fed_stores:
                    store.hits += 1
        else:
            key = (DEFAULT_DEVICE.value, X64.value, CACHE_EPOCH.value)
            consts = self._feed(key, args, kwargs)
        try:
            return self._jitted(consts, *args, **kwargs)
        except Rediscover:
            return self._retrying(lambda c: self._jitted(c, *args, **kwargs), args, kwargs)
        except RuntimeError:
            if not any(a.is_deleted() for a in consts):
                raise
            known.fed_key = None
            key = (DEFAULT_DEVICE.value, X64.value, CACHE_EPOCH.value)
            return self._jitted(self._feed(key, args, kwargs), *args, **kwargs)

    def _feed(self, key: tuple[Any, ...], args: Any, kwargs: Any) -> tuple[jax.Array, ...]:
        known = self._known
        consts = _feed(known.sources, args, kwargs)
        if known.fast is not None and not _hoisting.active:
            # Reusable by later calls: the default buffers, for these settings.
            known.fed, known.fed_key, known.fed_stores = consts, key, tuple(known.fast)
        return consts

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Like `jax.jit(f).lower`: the constants are parameters of the lowered program."""
        lowered: Lowered = self._retrying(
            lambda c: Lowered(self._jitted.lower(c, *args, **kwargs), self._known.sources[: len(c)]),
            args,
            kwargs,
        )
        return lowered

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Like `jax.jit(f).trace`: the constants are parameters of the traced program."""
        traced: Traced = self._retrying(
            lambda c: Traced(self._jitted.trace(c, *args, **kwargs), self._known.sources[: len(c)]),
            args,
            kwargs,
        )
        return traced

    @property
    def constants(self) -> int:
        """How many FrozenConsts this function has met so far (each is one parameter)."""
        return len(self._known.sources)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self, instance)

    def __getattr__(self, name: str) -> Any:
        # `_cache_size`, `clear_cache`, `eval_shape`, ... of the underlying jax.jit.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._jitted, name)


class _Stage:
    """A jax stage object with the constants bound, so it is used like the original's."""

    def __init__(self, stage: Any, sources: list[Source]) -> None:
        self._stage = stage
        self._sources = list(sources)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._stage, name)


class Traced(_Stage):
    """`jax.stages.Traced` with the constants bound as parameters."""

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lower the traced program."""
        return Lowered(self._stage.lower(*args, **kwargs), self._sources)


class Lowered(_Stage):
    """`jax.stages.Lowered` with the constants bound as parameters."""

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """The lowered program's text (no FrozenConst data appears in it)."""
        text: str = self._stage.as_text(*args, **kwargs)
        return text

    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        """Compile the lowered program."""
        return Compiled(self._stage.compile(*args, **kwargs), self._sources)


class Compiled(_Stage):
    """`jax.stages.Compiled`, called with the original arguments."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._stage(_feed(self._sources, args, kwargs), *args, **kwargs)


@overload
def jit(fun: Callable[..., Any], /, **jit_kwargs: Any) -> JitWrapped: ...
@overload
def jit(fun: None = None, /, **jit_kwargs: Any) -> Callable[[Callable[..., Any]], JitWrapped]: ...
def jit(
    fun: Callable[..., Any] | None = None, /, **jit_kwargs: Any
) -> JitWrapped | Callable[[Callable[..., Any]], JitWrapped]:
    """`jax.jit`, with every FrozenConst the function reaches passed in as a parameter.

    Takes the same keyword arguments as `jax.jit`. A FrozenConst closed over,
    read from a global, held by a static argument, or used inside a nested
    `jax.jit`, `lax.scan`, `lax.cond`, `jax.grad` or `jax.vmap` becomes a
    parameter of the compiled program fed from its cached device buffer: the
    program holds none of its data, and every function shares one device
    buffer per constant.

    Inside the traced function a FrozenConst is abstract, like an argument:
    Python control flow on its values (`if x[0] > 0:`) needs `jax.lax.cond`.

    Arguments:
        fun: the function to compile. Omit it to use `jit(...)` as a decorator factory.
        **jit_kwargs: anything `jax.jit` accepts (`static_argnums`, `donate_argnums`, ...).

    Returns:
        A callable with `lower` and `trace` like a `jax.jit` function.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> import frozenconst
        >>> table = frozenconst.FrozenConst(np.ones((512, 512), np.float32))
        >>> @frozenconst.jit
        ... def f(w):
        ...     return jnp.sum(table @ w)
        >>> f(jnp.ones(512))
        Array(262144., dtype=float32)
        >>> len(f.lower(jnp.ones(512)).as_text()) < 2_000   # no 1 MiB constant inside
        True
    """
    if fun is None:
        return functools.partial(jit, **jit_kwargs)
    if not callable(fun):
        raise TypeError(f"frozenconst.jit needs a callable, but received a `{type(fun).__name__}`.")
    return JitWrapped(fun, jit_kwargs)
