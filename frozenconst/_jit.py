"""`frozenconst.jit`: `jax.jit` that passes every FrozenConst in as a parameter.

Closed-over arrays are embedded into the compiled program by JAX's default
constant pipeline (jax #3220, #16278, #14655, #21300, #10596) and copied per
use or per executable by the simplified one. Passing the array as an argument
avoids both, and is what every workaround converges on. `frozenconst.jit` does
that rewrite for you: every FrozenConst the function reaches, however it
reaches it, becomes a parameter fed from the constant's cached device buffer.

This module is the wrapper and its call, as equinox's `_jit.py` is. What a
function knows of its constants, per static configuration, and what a call
feeds is `_groups`'; one trace and how constants resolve in it, `_hoisting`'s;
`jax.jit` itself and JAX's stage objects, `_stages`'.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import sys
import weakref
from collections.abc import Callable
from typing import Any, overload

import jax

from ._argnums import Argnums, shift
from ._cache import Use
from ._compat import SIMPLIFIED_CONSTANTS, renew_trace_contexts
from ._errors import FrozenConstRuntimeError, FrozenConstTypeError
from ._frozen import FrozenConst
from ._groups import Constants, Group
from ._hoisting import Rediscover
from ._stages import Lowered, Traced, compiled
from ._tracebacks import boundary, hide_own_frames

# Under JAX's default constant pipeline, a FrozenConst of at most this many
# bytes is captured as its device buffer, which JAX embeds in the program, as
# `jax.jit` embeds a closed-over array: each executable parameter adds to the
# cost of every call (`python -m benchmarks compare`, row "frozenconst.jit per
# call: ratio to jax.jit"; the figures are in `docs/results/`), so a function
# holding hundreds of small tables would pay more per call than their bytes
# are worth.
# `frozenconst.audit` gives no advice below the same size.
EMBED_MAX_BYTES = 1024

# A call meets at most this many rounds of new constants; each round adds all
# constants it met, so this bounds pathological code only.
_MAX_ROUNDS = 64

_NOTHING: tuple[jax.Array, ...] = ()


class JitWrapped:
    """A function compiled by [`frozenconst.jit`][frozenconst.jit]. Call it like the original.

    What it holds: the user's function; `_jitted`, `jax.jit` of that function
    with one parameter put first, the tuple of constants (`_make_traced`);
    `_plain`, `jax.jit` of the same trace without that parameter, called as the
    user calls it, for a configuration with no constant as a parameter; and
    `_constants` (`_groups.Constants`), what it knows of its constants: for each
    static configuration a `Group`, the constants that are parameters there, in order.

    What one call does (`__call__`): find the call's group; where it has no
    constants (none reached, or each captured: `Constants.captures`), call
    `_plain` with the arguments; else take each constant's cached device buffer
    (`Group.arrays`: the tuple fed last while nothing changed, else a
    `Store.array` per constant) and call `_jitted` with them in front of the
    arguments (`_call`).

    How a newly met constant gets in: the trace that meets it lets it stand in
    as zeros (`_hoisting.resolve`) and notes it; at the end of the trace
    (`_hoisting.Protocol.trace`) `Rediscover` is raised through `jax.jit`, so
    JAX caches no program of that trace (inner functions it traced may stay in
    JAX's caches, holding that trace: `_hoisting`); met first inside a nested
    trace, it stops the trace there. The constant joins the group, and the call
    is made again (`_again`, then `_call`). A constant JAX takes as a
    closed-over buffer (`Constants.captures`) never joins: the trace uses its
    buffer as `jax.jit` would.

    Its own state lives in slots: `functools.update_wrapper` copies the wrapped
    callable's `__dict__` into ours, as `jax.jit` copies it, and a wrapper of
    another frozenconst.jit function (`jax.grad(f)`, any `functools.wraps`
    decorator) carries that function's attributes. A slot is read before the
    instance dict, so those copies never stand in for this function's state.
    """

    __slots__ = (
        "__dict__",
        "__weakref__",
        "_constants",
        "_donated",
        "_donation_clash",
        "_fun",
        "_jit_kwargs",
        "_jitted",
        "_kwargs",
        "_plain",
    )

    def __init__(self, fun: Callable[..., Any], jit_kwargs: dict[str, Any]) -> None:
        self._fun = fun
        # What the user passed, for copies and for `jax.export` (`Traced.lower`).
        self._kwargs = dict(jit_kwargs)
        jit_kwargs = dict(jit_kwargs)
        embed_max_bytes = jit_kwargs.pop("embed_max_bytes", EMBED_MAX_BYTES)
        if isinstance(embed_max_bytes, bool) or not isinstance(embed_max_bytes, int) or embed_max_bytes < 0:
            raise FrozenConstTypeError(
                "frozenconst.jit's `embed_max_bytes` takes a non-negative int (bytes), but received "
                f"{embed_max_bytes!r}. Pass 0 to pass every FrozenConst as a parameter."
            )
        self._donated = Argnums.of(fun, jit_kwargs, "donate")
        # A function that donates arguments takes its constants as parameters
        # under the simplified pipeline too: a constant also passed as a donated
        # argument is then fed a copy (`_not_donated`), where some JAX versions
        # refuse a captured buffer donated in the same call (jax 0.9.2).
        capture_max = embed_max_bytes
        if SIMPLIFIED_CONSTANTS:
            capture_max = sys.maxsize if self._donated is None else -1
        self._constants = Constants(fun, Argnums.of(fun, jit_kwargs, "static"), capture_max)
        # Whether a call donated a buffer also fed as a constant (then every
        # call checks, and feeds a copy of such a constant instead).
        self._donation_clash = False
        kwargs = dict(jit_kwargs)
        for name in ("static_argnums", "donate_argnums"):
            if name in kwargs:
                kwargs[name] = shift(kwargs[name])
        if isinstance(kwargs.get("in_shardings"), (tuple, list)):
            # The user's shardings are for the user's arguments; the constants
            # come first and keep their own placement.
            kwargs["in_shardings"] = (None, *kwargs["in_shardings"])
        self._jit_kwargs = kwargs
        self._renew()
        self._constants.renew = weakref.WeakMethod(self._renew)
        functools.update_wrapper(self, fun)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The outer `try` is `_tracebacks.boundary`, inlined (free until something raises).
        try:
            group = self._constants.single or self._constants.group(args, kwargs)
            # `_call`, inlined: as a call it made every call slower by more than
            # the 3% bound (`python -m benchmarks compare`, row "frozenconst.jit
            # per call: ratio to jax.jit").
            if not group.uses:
                # No constant is a parameter (each captured, or none reached): the
                # arguments go to `jax.jit` as the user passed them. An empty tuple
                # of constants in front cost about a tenth of `jax.jit`'s own call
                # (issue #26: `python -m benchmarks constants`, 16 B constants).
                try:
                    return self._plain(*args, **kwargs)
                except Rediscover:
                    pass  # called again below: an error there is not raised "during handling" of this
                except (RuntimeError, ValueError):
                    if not self._constants.lost_captured():
                        raise
                    self._recapture()
                return self._called_again(args, kwargs)
            # Outside the inner `try`: inside another frozenconst.jit trace, feeding can
            # stop that trace (`Rediscover`), which is the outer call's to handle.
            consts = group.arrays(args, kwargs)
            if self._donation_clash:
                consts = self._not_donated(consts, args, kwargs)
            try:
                return self._jitted(consts, *args, **kwargs)
            except Rediscover:
                pass  # called again below: an error there is not raised "during handling" of this
            except (RuntimeError, ValueError) as err:
                if not self._constants.lost_captured():
                    return self._jitted(self._refed(consts, err, group, args, kwargs), *args, **kwargs)
                self._recapture()
            return self._called_again(args, kwargs)
        except Exception as err:
            hide_own_frames(err)
            if isinstance(err, TypeError) and (
                "as an abstract array" in str(err) or "valid JAX type" in str(err)
            ):
                # jax.jit's refusal of a non-array argument (an equinox module's activation).
                err.add_note(
                    "frozenconst.jit takes arrays only, as jax.jit does; "
                    "`frozenconst.filter_jit` holds every non-array leaf static, as `eqx.filter_jit` does."
                )
            raise

    def _called_again(self, args: Any, kwargs: Any) -> Any:
        """The call made again, until no trace meets a new constant (`_again`). Not inlined in
        `__call__`: a lambda there closing over the arguments made every call build cells."""
        return self._again(lambda g, c: self._call(g, c, args, kwargs), args, kwargs)

    def _call(self, group: Group, consts: tuple[jax.Array, ...], args: Any, kwargs: Any) -> Any:
        """Run the compiled function with `consts` for `group`'s constants, then the arguments
        (the call made again after a trace met new constants; `__call__` inlines it)."""
        if self._donation_clash:
            consts = self._not_donated(consts, args, kwargs)
        try:
            return self._run(consts, args, kwargs)
        except (RuntimeError, ValueError) as err:
            # XLA refuses a call before running it when a fed buffer was deleted
            # since (donated elsewhere) or is donated by this very call: feed
            # afresh, or a copy; where a buffer JAX captured was deleted, trace
            # again (`_recapture`). Any other error is the caller's.
            if not self._constants.lost_captured():
                return self._run(self._refed(consts, err, group, args, kwargs), args, kwargs)
            self._recapture()
            return self._run(group.arrays(args, kwargs), args, kwargs)

    def _run(self, consts: tuple[jax.Array, ...], args: Any, kwargs: Any) -> Any:
        """The compiled function called with `consts` in front of the arguments; `_plain` where
        there are none, so that a configuration's programs live in one of the two (`__call__`)."""
        if consts:
            return self._jitted(consts, *args, **kwargs)
        return self._plain(*args, **kwargs)

    def _again(self, step: Callable[[Group, tuple[jax.Array, ...]], Any], args: Any, kwargs: Any) -> Any:
        """`step(group, arrays)` with the call's group and its arrays, until no trace meets a new constant."""
        for _ in range(_MAX_ROUNDS):
            group = self._constants.group(args, kwargs)
            # Outside the `try`, as in `__call__`: inside another frozenconst.jit
            # trace, feeding can stop that trace, which is the outer call's to handle.
            consts = group.arrays(args, kwargs)
            try:
                return step(group, consts)
            except Rediscover:
                continue
        raise FrozenConstRuntimeError(
            f"frozenconst.jit traced {_MAX_ROUNDS} times and met FrozenConsts it did not know each "
            "time. This happens when `jax.clear_caches()` runs again and again during the call "
            "(each clears what the traces learned); otherwise it is a bug, please report it."
        )

    def _recapture(self) -> None:
        """A device buffer that JAX captured in this function's programs was deleted (donated
        to another function, issue #26): the next trace captures the constant's new buffer.

        JAX keeps a captured buffer in its caches, of this function and of inner functions
        traced inside it, and refuses every later call with "Buffer has been deleted or
        donated". A new traced function and new trace contexts miss all of those caches.
        """
        self._constants.forget()
        renew_trace_contexts()

    def _refed(
        self, consts: tuple[jax.Array, ...], err: Exception, group: Group, args: Any, kwargs: Any
    ) -> tuple[jax.Array, ...]:
        """The arrays to call again with after XLA refused `consts`; re-raises `err` if that is not why."""
        deleted = any(a.is_deleted() for a in consts)
        if deleted:
            group.forget()
            consts = group.arrays(args, kwargs)
        unclashed = self._not_donated(consts, args, kwargs)
        if unclashed is not consts:
            self._donation_clash = True
        elif not deleted:
            raise err
        return unclashed

    def _not_donated(self, consts: tuple[jax.Array, ...], args: Any, kwargs: Any) -> tuple[jax.Array, ...]:
        """`consts`, with a copy of each that this call also donates (`consts` itself if none)."""
        if self._donated is None:
            return consts
        donated = {id(leaf) for leaf in jax.tree_util.tree_leaves(self._donated.pick(args, kwargs))}
        if not any(id(c) in donated for c in consts):
            return consts
        # What jax.jit does with such a constant: the program reads a copy of
        # the data (embedded, or hoisted), never the donated buffer.
        return tuple(
            jax.device_put(c, c.sharding if c.committed else None, may_alias=False) if id(c) in donated else c
            for c in consts
        )

    def _renew(self) -> None:
        # New traced functions: JAX's caches of the old ones (and the device
        # buffers they captured) go with them.
        traced = _make_traced(self._fun, self._constants)
        self._jitted = compiled(traced, self._jit_kwargs, self._constants.static)
        self._plain = jax.jit(_without_constants(traced, self._fun), **_user_jit_kwargs(self._kwargs))

    def __copy__(self) -> JitWrapped:
        # As `jax.jit`'s functions copy: a new compiled function of the same callable.
        return JitWrapped(self._fun, self._kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> JitWrapped:
        return JitWrapped(copy.deepcopy(self._fun, memo), copy.deepcopy(self._kwargs, memo))

    @boundary
    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Like `jax.jit(f).lower`: the constants are parameters of the lowered program."""
        lowered: Lowered = self._again(
            lambda g, c: Lowered(self._jitted.lower(c, *args, **kwargs), g.uses[: len(c)]),
            args,
            kwargs,
        )
        return lowered

    @boundary
    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Like `jax.jit(f).trace`: the constants are parameters of the traced program."""
        traced: Traced = self._again(
            lambda g, c: Traced(
                self._jitted.trace(c, *args, **kwargs),
                g.uses[: len(c)],
                lambda: self._embedded().trace(*args, **kwargs),
            ),
            args,
            kwargs,
        )
        return traced

    def _embedded(self) -> Any:
        """`jax.jit` of the function itself: its constants closed over, as a serialized program needs."""
        return jax.jit(self._fun, **_user_jit_kwargs(self._kwargs))

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Like `jax.jit(f).eval_shape`: the output's shapes and dtypes, computing nothing."""
        return jax.eval_shape(self, *args, **kwargs)

    def clear_cache(self) -> None:
        """Like `jax.jit(f).clear_cache`: drop the compiled executables (the constants stay known)."""
        # Public on every supported jax.jit function, missing from jax 0.10's stubs.
        self._jitted.clear_cache()  # type: ignore[attr-defined,unused-ignore]
        self._plain.clear_cache()  # type: ignore[attr-defined,unused-ignore]

    @property
    def constants(self) -> int:
        """How many FrozenConsts this function passes as parameters, over its static configurations."""
        seen: list[Use] = []
        for group in list(self._constants.groups.values()):
            seen.extend(s for s in group.uses if s not in seen)
        return len(seen)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self, instance)


# -- the traced function, and jax's stage objects with the constants bound -------


def _make_traced(fun: Callable[..., Any], constants: Constants) -> Callable[..., Any]:
    """The function `jax.jit` traces: the constants as its first parameter, then `fun`'s."""

    def traced(consts: tuple[Any, ...], /, *args: Any, **kwargs: Any) -> Any:
        group = constants.group(args, kwargs)
        out = constants.protocol.trace(
            lambda: _resolved(fun(*args, **kwargs)),
            dict(zip(group.uses, consts, strict=False)),
            constants.captures,
            lambda frame: constants.learn(frame, args, kwargs),
        )
        constants.warn_embedded()
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


def _without_constants(traced: Callable[..., Any], fun: Callable[..., Any]) -> Callable[..., Any]:
    """`traced` with no constants, taking `fun`'s own parameters: what `jax.jit` traces for a
    configuration with no constant as a parameter (`JitWrapped._plain`)."""

    def plain(*args: Any, **kwargs: Any) -> Any:
        return traced(_NOTHING, *args, **kwargs)

    with contextlib.suppress(TypeError, ValueError):  # no signature: jax.jit's own error, if any
        # jax.jit maps `static_argnames`/`donate_argnames` to positions through it.
        plain.__signature__ = inspect.signature(fun)  # type: ignore[attr-defined]
    plain.__name__ = traced.__name__
    plain.__qualname__ = traced.__qualname__
    return plain


def _user_jit_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The user's `jax.jit` keyword arguments, without frozenconst's own."""
    return {k: v for k, v in kwargs.items() if k != "embed_max_bytes"}


def _resolved(out: Any) -> Any:
    """`out` with each FrozenConst in it standing for what it is in this trace (a parameter).

    JAX flattens a traced function's output after the function returns, when
    this trace's frame is gone: a constant returned as it is would be the
    device buffer there, closed over and embedded. Flattened here, each is
    what a use inside the function gets, and the caller receives what
    `jax.jit` returns for it (a FrozenConst holding the output array).
    """
    return jax.tree_util.tree_map(_within_trace, out, is_leaf=_is_frozen)


def _is_frozen(value: Any) -> bool:
    return isinstance(value, FrozenConst)


def _within_trace(value: Any) -> Any:
    if isinstance(value, FrozenConst):
        children, aux = value.tree_flatten()
        return FrozenConst.tree_unflatten(aux, children)
    return value


@overload
def jit(fun: Callable[..., Any], /, **jit_kwargs: Any) -> JitWrapped: ...
@overload
def jit(fun: None = None, /, **jit_kwargs: Any) -> Callable[[Callable[..., Any]], JitWrapped]: ...
def jit(
    fun: Callable[..., Any] | None = None, /, **jit_kwargs: Any
) -> JitWrapped | Callable[[Callable[..., Any]], JitWrapped]:
    """`jax.jit`, with the data of every FrozenConst the function reaches kept out of the program.

    Takes the same keyword arguments as `jax.jit`. A FrozenConst closed over,
    read from a global, held by a static argument, or used inside a nested
    `jax.jit`, `lax.scan`, `lax.cond`, `jax.grad` or `jax.vmap` is fed from its
    cached device buffer: as a parameter of the compiled program under JAX's
    default constant pipeline, or as the buffer itself, which JAX passes to the
    executable, under the simplified one. The program holds none of its data,
    and every function shares one device buffer per constant.

    Inside the traced function a FrozenConst that is a parameter is abstract,
    like an argument: Python control flow on its values (`if x[0] > 0:`) needs
    `jax.lax.cond`.

    Arguments:
        fun: the function to compile. Omit it to use `jit(...)` as a decorator factory.
        **jit_kwargs: anything `jax.jit` accepts (`static_argnums`, `donate_argnums`, ...),
            and `embed_max_bytes` (default 1024): under JAX's default pipeline, a
            FrozenConst of at most this many bytes is embedded, as `jax.jit` embeds
            it, which costs less per call than a parameter; 0 makes every one a parameter.

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
        raise FrozenConstTypeError(
            f"frozenconst.jit needs a callable, but received a `{type(fun).__name__}`."
        )
    return JitWrapped(fun, jit_kwargs)
