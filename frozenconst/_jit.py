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
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast, overload

import jax

from ._argnums import Argnums, shift
from ._cache import Store, Use
from ._compat import SIMPLIFIED_CONSTANTS, Tracer
from ._embedding import EMBED_MAX_BYTES
from ._errors import FrozenConstRuntimeError, FrozenConstTypeError
from ._frozen import FrozenConst
from ._groups import Constants, Group
from ._hoisting import Diagnosis, Rediscover, diagnosed
from ._refusals import refused_as_array
from ._stages import Lowered, Traced, compiled
from ._tracebacks import boundary, hide_own_frames

# A call meets at most this many rounds of new constants; each round adds all
# constants it met, so this bounds pathological code only.
_MAX_ROUNDS = 64

# A call refused for a deleted buffer is fed afresh and made again at most this many times:
# each time, another thread donated a buffer it used in between (issue #37: two threads
# donating the constant, 17-32 of 1,000 calls refused once; none twice in a row).
_MAX_REFEEDS = 8

_NOTHING: tuple[jax.Array, ...] = ()

# The wrapped function's parameters and return type, kept for type checkers (`jax.jit`'s own
# wrapper returns `Any`).
_P = ParamSpec("_P")
_R = TypeVar("_R")
_R_co = TypeVar("_R_co", covariant=True)
_T = TypeVar("_T")


class _Compiled(Protocol[_R_co]):
    """The `jax.jit` function a `JitWrapped` calls: the constants first, then the arguments."""

    def __call__(self, *args: Any, **kwargs: Any) -> _R_co: ...
    def lower(self, *args: Any, **kwargs: Any) -> Any: ...
    def trace(self, *args: Any, **kwargs: Any) -> Any: ...


class JitWrapped(Generic[_P, _R]):
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
    arguments (`_call`). A call XLA refuses for a buffer deleted since (donated,
    by this call or another thread's) is fed afresh and made again (`_recover`);
    any other error is raised as it is.

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

    _jitted: _Compiled[_R]
    _plain: Callable[..., _R]

    def __init__(self, fun: Callable[_P, _R], jit_kwargs: dict[str, Any]) -> None:
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

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
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
                except Rediscover as stop:
                    diagnosis, failed = stop.diagnosis, None
                except (RuntimeError, ValueError) as err:
                    diagnosis, failed = None, err
                # Below, not inside the handlers: an error raised there is not "during handling" of these.
                if failed is not None:
                    return self._recover(failed, group, _NOTHING, args, kwargs)
                return self._called_again(args, kwargs, diagnosis)
            # Outside the inner `try`: inside another frozenconst.jit trace, feeding can
            # stop that trace (`Rediscover`), which is the outer call's to handle.
            consts = group.arrays(args, kwargs)
            if self._donation_clash:
                consts = self._not_donated(consts, args, kwargs, group)
            try:
                return self._jitted(consts, *args, **kwargs)
            except Rediscover as stop:
                diagnosis, failed = stop.diagnosis, None
            except (RuntimeError, ValueError) as err:
                diagnosis, failed = None, err
            # Below, not inside the handlers: an error raised there is not "during handling" of these.
            if failed is not None:
                return self._recover(failed, group, consts, args, kwargs)
            return self._called_again(args, kwargs, diagnosis)
        except Exception as err:
            hide_own_frames(err)
            refused = refused_as_array(err)
            if refused is not None:
                # JAX refused a FrozenConst where it takes only a jax.Array (an index into
                # an array, ...): frozenconst's own error, naming the user's line and the fix,
                # with the traceback that reaches that line.
                raise refused.with_traceback(err.__traceback__) from err
            if isinstance(err, TypeError) and (
                "as an abstract array" in str(err) or "valid JAX type" in str(err)
            ):
                # jax.jit's refusal of a non-array argument (an equinox module's activation).
                err.add_note(
                    "frozenconst.jit takes arrays only, as jax.jit does; "
                    "`frozenconst.filter_jit` holds every non-array leaf static, as `eqx.filter_jit` does."
                )
            raise

    def _called_again(self, args: Any, kwargs: Any, diagnosis: Diagnosis | None = None) -> _R:
        """The call made again, until no trace meets a new constant (`_again`), `diagnosis` its
        next step where it has one. Not inlined in `__call__`: a lambda there closing over the
        arguments made every call build cells."""
        return self._again(lambda g, c: self._call(g, c, args, kwargs), args, kwargs, diagnosis)

    def _call(self, group: Group, consts: tuple[jax.Array, ...], args: Any, kwargs: Any) -> _R:
        """Run the compiled function with `consts` for `group`'s constants, then the arguments
        (the call made again after a trace met new constants; `__call__` inlines it)."""
        if self._donation_clash:
            consts = self._not_donated(consts, args, kwargs, group)
        try:
            return self._run(consts, args, kwargs)
        except (RuntimeError, ValueError) as err:
            failed = err
        try:
            return self._recover(failed, group, consts, args, kwargs)
        finally:
            # The error's traceback holds this frame: a cycle that would keep the call's
            # arguments and buffers until Python's collector runs, on every refed call.
            del failed

    def _recover(
        self, err: Exception, group: Group, consts: tuple[jax.Array, ...], args: Any, kwargs: Any
    ) -> _R:
        """The call made again after it raised `err`, where a buffer it used was deleted; else
        `err`, raised as it is (the user's error, or JAX's).

        XLA refuses a call before running it when a fed buffer was deleted since (donated
        elsewhere, maybe by another thread between our feeding and the call), when the call
        donates a buffer also fed as a constant, or when a FrozenConst argument's buffer was
        donated by another thread after the call flattened it: feed afresh, a copy, or flatten
        again (`_refed`), a few times at most. Where a buffer that JAX captured was deleted,
        the function traces again (`_recapture`). Raised after the handler of `err`, never
        "during handling" of it: the user's error keeps its own context (issue #37).
        """
        failed: Exception | None = None
        try:
            for _ in range(_MAX_REFEEDS):
                lost = self._constants.lost_captured()
                if lost:
                    self._recapture(lost)
                    return self._called_again(args, kwargs)
                consts = self._refed(consts, err, group, args, kwargs)
                failed = None
                try:
                    return self._run(consts, args, kwargs)
                except Rediscover:
                    pass  # the program was dropped since (`jax.clear_caches()`): a new call, below
                except (RuntimeError, ValueError) as again:
                    failed = again
                if failed is None:
                    return self._called_again(args, kwargs)
                err = failed
            raise err
        finally:
            # As in `_call`: the errors' tracebacks hold this frame; no cycle outlives the call.
            del err, failed

    def _run(self, consts: tuple[jax.Array, ...], args: Any, kwargs: Any) -> _R:
        """The compiled function called with `consts` in front of the arguments; `_plain` where
        there are none, so that a configuration's programs live in one of the two (`__call__`)."""
        if consts:
            return self._jitted(consts, *args, **kwargs)
        return self._plain(*args, **kwargs)

    def _again(
        self,
        step: Callable[[Group, tuple[jax.Array, ...]], _T],
        args: Any,
        kwargs: Any,
        diagnosis: Diagnosis | None = None,
    ) -> _T:
        """`step(group, arrays)` with the call's group and its arrays, until no trace meets a new
        constant; each trace of this call takes the step of its diagnosis, if it has one
        (`_hoisting.Diagnosis`: it lives and ends with this call)."""
        protocol = self._constants.protocol
        for _ in range(_MAX_ROUNDS):
            group = self._constants.group(args, kwargs)
            # Outside the `try`, as in `__call__`: inside another frozenconst.jit
            # trace, feeding can stop that trace, which is the outer call's to handle.
            consts = group.arrays(args, kwargs)
            try:
                return diagnosed(diagnosis, lambda: step(group, consts))  # noqa: B023 - called at once
            except Rediscover as stop:
                found = stop.diagnosis
            # A diagnosis of this function's own (not of a function nested in it) carries on.
            diagnosis = found if found is not None and found.protocol is protocol else None
        raise FrozenConstRuntimeError(
            f"frozenconst.jit traced {_MAX_ROUNDS} times and met FrozenConsts it did not know each "
            "time. This happens when `jax.clear_caches()` runs again and again during the call "
            "(each clears what the traces learned); otherwise it is a bug, please report it."
        )

    def _recapture(self, lost: list[Store]) -> None:
        """A device buffer that JAX captured in this function's programs was deleted (donated
        to another function, issue #26): the next trace takes the constant as a parameter.

        JAX keeps a captured buffer in its caches, of this function and of inner functions
        traced inside it, and refuses every later call with "Buffer has been deleted or
        donated". A new traced function misses the first; the trace-context values under
        which inner functions captured it are retired (`Store.drop_lost`,
        `_hoisting.buffer_lost`), and no others (issue #37).
        """
        for store in lost:
            store.drop_lost()
        self._constants.forget()

    def _refed(
        self, consts: tuple[jax.Array, ...], err: Exception, group: Group, args: Any, kwargs: Any
    ) -> tuple[jax.Array, ...]:
        """The arrays to call again with after XLA refused `consts`; raises `err` if that is not why.

        Inside another frozenconst.jit trace the arrays fed are that trace's values (tracers),
        which nothing deletes: the user's error there is raised as it is (issue #37).
        """
        deleted = any(not isinstance(a, Tracer) and a.is_deleted() for a in consts)
        # Another thread donated a buffer this call used (a FrozenConst argument's, flattened
        # afresh by the next call; a fed one, or the buffer a copy was made from, fed afresh).
        raced = not deleted and _deleted_buffer(err) and _holds_constant(args, kwargs)
        if deleted or raced:
            group.forget()
            consts = group.arrays(args, kwargs)
        unclashed = self._not_donated(consts, args, kwargs, group)
        if unclashed is not consts:
            self._donation_clash = True
            return unclashed
        if deleted or raced:
            return consts
        raise err

    def _not_donated(
        self, consts: tuple[jax.Array, ...], args: Any, kwargs: Any, group: Group
    ) -> tuple[jax.Array, ...]:
        """`consts`, with a copy of each that this call also donates (`consts` itself if none)."""
        if self._donated is None:
            return consts
        donated = {id(leaf) for leaf in jax.tree_util.tree_leaves(self._donated.pick(args, kwargs))}
        if not any(id(c) in donated for c in consts):
            return consts
        # What jax.jit does with such a constant: the program reads a copy of
        # the data (embedded, or hoisted), never the donated buffer.
        return tuple(
            _copy(c, use) if id(c) in donated else c for c, use in zip(consts, group.uses, strict=False)
        )

    def _renew(self) -> None:
        # New traced functions: JAX's caches of the old ones (and the device
        # buffers they captured) go with them.
        traced = _make_traced(self._fun, self._constants)
        self._jitted = compiled(traced, self._jit_kwargs, self._constants.static)
        self._plain = jax.jit(_without_constants(traced, self._fun), **_user_jit_kwargs(self._kwargs))

    def __copy__(self) -> JitWrapped[_P, _R]:
        # As `jax.jit`'s functions copy: a new compiled function of the same callable.
        return JitWrapped(self._fun, self._kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> JitWrapped[_P, _R]:
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
    # JAX names the traced function's file and line in its tracing errors ("The error occurred
    # while tracing the function f at file.py:12"), found through `inspect.unwrap`
    # (`api_util.fun_sourceinfo`, jax 0.6.2 to 0.12.0.1): the user's, as under `jax.jit`, not
    # this module's (issue #37). `inspect.signature` stops at `__signature__` above.
    traced.__wrapped__ = fun  # type: ignore[attr-defined]
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
    plain.__wrapped__ = fun  # type: ignore[attr-defined]  # the user's file and line (`_make_traced`)
    return plain


def _copy(array: jax.Array, use: Use) -> jax.Array:
    """A copy of `array`, the buffer of the constant `use` fed to a call that also donates it:
    the program reads the copy, never the donated buffer. Where another thread donated `array`
    since, a copy of the buffer made again (issue #37)."""
    if isinstance(array, Tracer):
        return array  # inside another trace: a value of that trace, which nothing donates
    for _ in range(_MAX_REFEEDS):
        try:
            return _device_copy(array)
        except (RuntimeError, ValueError):
            if not array.is_deleted():
                raise
        store, sharding = use
        array = store.array(sharding)  # made again, from the host
    return _device_copy(array)


def _device_copy(array: jax.Array) -> jax.Array:
    copied: jax.Array = jax.device_put(array, array.sharding if array.committed else None, may_alias=False)
    return copied


def _deleted_buffer(err: BaseException) -> bool:
    """Whether `err` is JAX's refusal of a deleted (donated) buffer: "Array has been deleted",
    "Buffer has been deleted or donated" (jax 0.6.2 to 0.12.0.1); on jax 0.6.2's CPU client a
    buffer that another thread's call was donating also shows as "Executable expected parameter
    0 of size 16384 but got buffer with incompatible size 4", refused before anything ran."""
    text = str(err)
    return "deleted" in text or "incompatible size" in text


def _holds_constant(args: Any, kwargs: Any) -> bool:
    """Whether the call's arguments hold a FrozenConst: each call flattens it to its buffer afresh."""
    leaves = jax.tree_util.tree_leaves((args, kwargs), is_leaf=_is_frozen)
    return any(isinstance(leaf, FrozenConst) for leaf in leaves)


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


class _Decorator(Protocol):
    """What `frozenconst.jit(**jit_kwargs)` returns: `frozenconst.jit` with those arguments."""

    def __call__(self, fun: Callable[_P, _R], /) -> JitWrapped[_P, _R]: ...


@overload
def jit(fun: Callable[_P, _R], /, **jit_kwargs: Any) -> JitWrapped[_P, _R]: ...
@overload
def jit(fun: None = None, /, **jit_kwargs: Any) -> _Decorator: ...
def jit(fun: Callable[_P, _R] | None = None, /, **jit_kwargs: Any) -> JitWrapped[_P, _R] | _Decorator:
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

    Examples:
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
        return cast(_Decorator, functools.partial(jit, **jit_kwargs))
    if not callable(fun):
        raise FrozenConstTypeError(
            f"frozenconst.jit needs a callable, but received a `{type(fun).__name__}`."
        )
    refuse_generator(fun, "frozenconst.jit")
    return JitWrapped(fun, jit_kwargs)


def refuse_generator(fun: Callable[..., Any], name: str) -> None:
    """Refuse a generator function when it is wrapped, as `jax.jit` does (its call would only
    make a generator, which no program can return)."""
    if inspect.isgeneratorfunction(fun):
        raise FrozenConstTypeError(
            f"{name} needs a function that returns arrays, but received the generator function "
            f"`{getattr(fun, '__qualname__', fun)!s}`, as jax.jit refuses it. Compile the body of "
            "the loop instead, or collect what it yields into a list and return that."
        )
