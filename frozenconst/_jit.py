"""`frozenconst.jit`: `jax.jit` with the wrapped function's types, and frozenconst's own errors.

Every jit keeps FrozenConsts out of the programs it compiles once frozenconst is imported
(`_hoist`): `jax.jit` itself, and what is built on it. This wrapper adds the wrapped
function's types for type checkers, its own threshold for small constants (`embed_max_bytes`,
read by `_hoist`), and frozenconst's error where JAX refuses a FrozenConst that only a
`jax.Array` may be.
"""

from __future__ import annotations

import copy
import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast, overload

import jax

from ._compat_lowering import deleted_buffer, non_array_refused
from ._errors import FrozenConstTypeError
from ._frames import hide_own_frames
from ._frozen import FrozenConst
from ._hoist import EMBED_MAX_BYTES, WRAPPER_FRAMES, Options, meet_losses
from ._refusals import refused_as_array

# The wrapped function's parameters and return type, kept for type checkers (`jax.jit`'s own
# wrapper returns `Any`).
_P = ParamSpec("_P")
_R = TypeVar("_R")

# A call refused for a FrozenConst argument's buffer that another thread donated meanwhile is
# made again at most this many times (two threads donating one constant, 1,000 calls each:
# never twice in a row).
_MAX_REFEEDS = 8


def boundary(fun: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fun` as an entry point of frozenconst: an error leaving it drops frozenconst's frames where
    JAX dropped its own, and JAX's refusal of a FrozenConst is frozenconst's (as `JitWrapped.__call__`)."""

    @functools.wraps(fun)
    def entry(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fun(*args, **kwargs)
        except Exception as err:
            hide_own_frames(err)
            refused = refused_as_array(err)
            if refused is not None:
                raise refused.with_traceback(err.__traceback__) from err
            raise

    return entry


class JitWrapped(Generic[_P, _R]):
    """A function compiled by [`frozenconst.jit`][frozenconst.jit]. Call it like the original.

    Each call is `jax.jit(fun)`'s (`_jitted`), on JAX's C++ fast path. Its state lives in slots,
    read before the `__dict__` that `functools.update_wrapper` copies from the wrapped callable.
    """

    __slots__ = ("__dict__", "__weakref__", "_fun", "_jitted", "_kwargs", "_options")

    def __init__(self, fun: Callable[_P, _R], jit_kwargs: dict[str, Any]) -> None:
        self._fun = fun
        # What the user passed, for copies.
        self._kwargs = dict(jit_kwargs)
        kwargs = dict(jit_kwargs)
        embed_max_bytes = kwargs.pop("embed_max_bytes", EMBED_MAX_BYTES)
        if isinstance(embed_max_bytes, bool) or not isinstance(embed_max_bytes, int) or embed_max_bytes < 0:
            raise FrozenConstTypeError(
                "frozenconst.jit's `embed_max_bytes` takes a non-negative int (bytes), but received "
                f"{embed_max_bytes!r}. Pass 0 to pass every FrozenConst as a parameter."
            )
        self._options = Options(embed_max_bytes, fun)
        self._jitted: Any = jax.jit(fun, **kwargs)
        functools.update_wrapper(self, fun)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return self._jitted(*args, **kwargs)  # type: ignore[no-any-return]
        except Exception as err:
            # A deleted buffer of a constant this call passes, or of one a program holds (a
            # closure): each made again, and the call made again.
            if not (deleted_buffer(err) and (_holds_constant(args, kwargs) or meet_losses())):
                hide_own_frames(err)
                refused = refused_as_array(err)
                if refused is not None:
                    # JAX refused a FrozenConst where it takes only a jax.Array: frozenconst's
                    # error (`_refusals`), with the traceback that reaches the user's line.
                    raise refused.with_traceback(err.__traceback__) from err
                _note_non_array(err)
                raise
            failed = err
        # Outside the handler: an error raised below is not "during handling" of this one.
        return self._called_again(failed, args, kwargs)

    def _called_again(self, err: Exception, args: Any, kwargs: Any) -> _R:
        """The call made again (a few times at most) after XLA refused a FrozenConst argument's
        buffer that another thread donated meanwhile: each call flattens it afresh."""
        try:
            for _ in range(_MAX_REFEEDS):
                try:
                    return self._jitted(*args, **kwargs)  # type: ignore[no-any-return]
                except Exception as again:
                    if not (deleted_buffer(again) and (_holds_constant(args, kwargs) or meet_losses())):
                        raise
                    err = again
            raise err
        finally:
            del err  # its traceback holds this frame: no cycle outlives the call

    def __copy__(self) -> JitWrapped[_P, _R]:
        # As `jax.jit`'s functions copy: a new compiled function of the same callable.
        return JitWrapped(self._fun, self._kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> JitWrapped[_P, _R]:
        return JitWrapped(copy.deepcopy(self._fun, memo), copy.deepcopy(self._kwargs, memo))

    @boundary
    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Like `jax.jit(f).lower`: the program for these arguments, its constants parameters."""
        return self._jitted.lower(*args, **kwargs)

    @boundary
    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """Like `jax.jit(f).trace`."""
        return self._jitted.trace(*args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Like `jax.jit(f).eval_shape`: the output's shapes and dtypes, computing nothing."""
        return self._jitted.eval_shape(*args, **kwargs)

    def clear_cache(self) -> None:
        """Like `jax.jit(f).clear_cache`: drop the compiled executables."""
        self._jitted.clear_cache()

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else functools.partial(self, instance)


def _note_non_array(err: Exception) -> None:
    if non_array_refused(err):
        err.add_note(
            "frozenconst.jit takes arrays only, as jax.jit does; "
            "`frozenconst.filter_jit` holds every non-array leaf static, as `eqx.filter_jit` does."
        )


def _holds_constant(args: Any, kwargs: Any) -> bool:
    """Whether the call's arguments hold a FrozenConst: each call flattens it to its buffer afresh."""
    leaves = jax.tree_util.tree_leaves((args, kwargs), is_leaf=lambda x: isinstance(x, FrozenConst))
    return any(isinstance(leaf, FrozenConst) for leaf in leaves)


def _options_of(frame: types.FrameType) -> Options | None:
    wrapped = frame.f_locals.get("self")
    return wrapped._options if isinstance(wrapped, JitWrapped) else None  # pyright: ignore[reportPrivateUsage]


# The frames where a program is lowered for a `JitWrapped` (its first call for new argument
# types, `.lower`, `.trace`): `_hoist` reads the function's options there.
for _method in (JitWrapped.__call__, JitWrapped.lower.__wrapped__, JitWrapped.trace.__wrapped__):  # type: ignore[attr-defined]
    WRAPPER_FRAMES[_method.__code__] = _options_of


class _Decorator(Protocol):
    """What `frozenconst.jit(**jit_kwargs)` returns: `frozenconst.jit` with those arguments."""

    def __call__(self, fun: Callable[_P, _R], /) -> JitWrapped[_P, _R]: ...


@overload
def jit(fun: Callable[_P, _R], /, **jit_kwargs: Any) -> JitWrapped[_P, _R]: ...
@overload
def jit(fun: None = None, /, **jit_kwargs: Any) -> _Decorator: ...
def jit(fun: Callable[_P, _R] | None = None, /, **jit_kwargs: Any) -> JitWrapped[_P, _R] | _Decorator:
    """`jax.jit`, keeping the wrapped function's types, with frozenconst's own errors.

    Takes the same keyword arguments as `jax.jit` and compiles with it. Every
    FrozenConst the function reaches (closed over, a global, an attribute, inside
    a nested `jax.jit`, `lax.scan`, `lax.cond`, `jax.grad` or `jax.vmap`) is a
    parameter of the compiled program, fed its cached device buffer: the program
    holds none of its data. Since `import frozenconst`, `jax.jit` itself does the
    same ([Which jit](jit.md)); this wrapper adds the wrapped function's parameter
    and return types for type checkers, `embed_max_bytes`, and frozenconst's own
    error where JAX refuses a FrozenConst that only a `jax.Array` may be.

    Arguments:
        fun: the function to compile. Omit it to use `jit(...)` as a decorator factory.
        **jit_kwargs: anything `jax.jit` accepts (`static_argnums`, `donate_argnums`, ...),
            and `embed_max_bytes` (default 4096): under JAX's default pipeline, a
            FrozenConst of at most this many bytes is embedded, as `jax.jit` embeds
            it, which costs less per call than a parameter; 0 makes every one a parameter.

    Returns:
        A callable with `lower`, `trace` and `eval_shape` like a `jax.jit` function.

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
    refuse_uncompilable(fun, "frozenconst.jit")
    return JitWrapped(fun, jit_kwargs)


def refuse_uncompilable(fun: Callable[..., Any], name: str) -> None:
    """Refuse what is not a callable, or a generator function, as `jax.jit` does (its call would
    only make a generator, which no program can return)."""
    if not callable(fun):
        raise FrozenConstTypeError(f"{name} needs a callable, but received a `{type(fun).__name__}`.")
    if inspect.isgeneratorfunction(fun):
        raise FrozenConstTypeError(
            f"{name} needs a function that returns arrays, but received the generator function "
            f"`{getattr(fun, '__qualname__', fun)!s}`, as jax.jit refuses it. Compile the body of "
            "the loop instead, or collect what it yields into a list and return that."
        )
