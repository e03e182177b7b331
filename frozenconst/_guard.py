"""A guard for test suites: fail when traced code captures a raw NumPy constant.

While a guard is open, frozenconst watches the one function through which JAX
lowers every program it compiles (`_compat.LOWERING_HOOK`) and walks each
program it is given, with the walk `frozenconst.audit` uses, nested programs
included. The decision is made from the constants themselves, under either
constant pipeline, whatever else the program captures.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Generator, Sequence
from typing import Any

import jax
import numpy as np

from . import _compat
from ._errors import CapturedNumpyConstantError, FrozenConstWarning
from ._jaxprs import walk, where

# One host array, by the memory it shows: a TypedNdArray view JAX made of a
# user's array and the array itself are one constant.
_BufferId = tuple[Any, ...]


class _Guard:
    """What one open `no_numpy_constants` block has found."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.lines: list[str] = []
        self.blind: list[str] = []  # programs that could not be inspected, and why
        # Reported arrays stay referenced until the block ends, so their keys
        # (memory addresses) cannot be reused by another array meanwhile.
        self._reported: dict[_BufferId, np.ndarray] = {}

    def record(self, found: Sequence[tuple[_BufferId, np.ndarray, Any]]) -> None:
        for key, host, eqn in found:
            if host.nbytes > self.max_bytes and key not in self._reported:
                self._reported[key] = host
                self.lines.append(_line(host, eqn))


# The guards open now, in any thread, and the patch that feeds them. `_open` is
# only rebound (never mutated) under `_lock`, so the patched function reads a
# consistent tuple without taking the lock.
_lock = threading.Lock()
_open: tuple[_Guard, ...] = ()
_patch: tuple[Any, str, Callable[..., Any], Callable[..., Any]] | None = None  # module, name, original, ours


def _host_array(value: Any) -> np.ndarray | None:
    """The host data of a captured constant, or None for a device array (a FrozenConst's included)."""
    if isinstance(value, jax.Array):
        return None
    if isinstance(value, np.ndarray):  # also JAX's TypedNdArray, a subclass
        return value
    try:
        host = np.asarray(value)
    except Exception:  # not array data: nothing NumPy would hold
        return None
    return None if host.dtype == object else host


def _key(host: np.ndarray) -> _BufferId:
    return (host.__array_interface__["data"][0], host.shape, host.strides, host.dtype.str)


def _numpy_constants(program: Any) -> list[tuple[_BufferId, np.ndarray, Any]]:
    """Each distinct host-array constant of `program`, with the equation that first uses it."""
    if program is None:
        raise TypeError("the lowering function was called without a program in its `jaxpr` argument")
    found: dict[_BufferId, tuple[_BufferId, np.ndarray, Any]] = {}
    for value, eqn in walk(program):
        host = _host_array(value)
        if host is not None and (key := _key(host)) not in found:
            found[key] = (key, host, eqn)
    return list(found.values())


def _observe(program: Any, guards: tuple[_Guard, ...]) -> None:
    try:
        found = _numpy_constants(program)
    except Exception as exc:  # a JAX this walk does not understand: say so at block end
        with _lock:
            for guard in guards:
                guard.blind.append(f"{type(exc).__name__}: {exc}")
        return
    with _lock:
        for guard in guards:
            guard.record(found)


def _observing(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def lower(*args: Any, **kwargs: Any) -> Any:
        guards = _open
        if guards:
            _observe(_compat.lowered_program(args, kwargs), guards)
        return original(*args, **kwargs)

    return lower


def _attach(guard: _Guard) -> bool:
    """Open `guard`, patching JAX if it is the first; False where JAX has no hook to patch."""
    global _open, _patch
    with _lock:
        if _patch is None:
            hook = _compat.LOWERING_HOOK
            original = None if hook is None else getattr(hook[0], hook[1], None)
            if hook is None or not callable(original):
                return False
            ours = _observing(original)
            setattr(hook[0], hook[1], ours)
            _patch = (hook[0], hook[1], original, ours)
        _open = (*_open, guard)
    return True


def _detach(guard: _Guard) -> None:
    """Close `guard`, restoring JAX when it was the last one open."""
    global _open, _patch
    with _lock:
        _open = tuple(g for g in _open if g is not guard)
        if _open or _patch is None:
            return
        module, name, original, ours = _patch
        # Someone may have wrapped the function since (a test's monkeypatch):
        # theirs stays, and ours underneath passes calls through untouched.
        if getattr(module, name, None) is ours:
            setattr(module, name, original)
        _patch = None


def _line(host: np.ndarray, eqn: Any) -> str:
    aval = f"{host.dtype.name}[{','.join(map(str, host.shape))}]"
    return (
        f"numpy {aval} ({host.nbytes} bytes) at {where(eqn) or '?'}: raw NumPy constant captured "
        "by a traced function; fix: wrap it once in `frozenconst.FrozenConst`"
    )


@contextlib.contextmanager
def no_numpy_constants(max_bytes: int = 1024) -> Generator[None]:
    """Fail when code run inside captures a raw NumPy constant larger than `max_bytes`.

    Checks every program JAX lowers for compilation while the block is open (in
    any thread), under either constant pipeline: each `jax.jit` or
    `frozenconst.jit` function, the functions it calls, `scan` and `cond`
    bodies. A FrozenConst, a `jax.Array` and a NumPy array of at most
    `max_bytes` pass. JAX caches what it compiled: a function compiled before
    the block and called again with the same argument types is not lowered
    again, so not checked; tracing alone (`jax.make_jaxpr`) is not checked
    either, use [`audit`][frozenconst.audit] for that. Warnings raised inside
    pass through untouched.

    Arguments:
        max_bytes: the largest NumPy constant allowed.

    Raises:
        CapturedNumpyConstantError: at the end of the block, with one line per
            offending constant: dtype and shape, bytes, first use, and the fix.

    Warns:
        FrozenConstWarning: when the block opens, if this JAX gives no way to
            see its compilations (nothing inside is checked then), and at the
            end if a compiled program could not be inspected.

    Example:
        >>> import numpy as np, jax, jax.numpy as jnp, frozenconst
        >>> table = np.ones((64, 64), np.float32)
        >>> with frozenconst.no_numpy_constants():
        ...     _ = jax.jit(lambda w: table @ w)(jnp.ones(64))
        Traceback (most recent call last):
        ...
        frozenconst.CapturedNumpyConstantError: 1 raw NumPy constant(s) captured...
    """
    guard = _Guard(max_bytes)
    if not _attach(guard):
        warnings.warn(
            f"frozenconst.no_numpy_constants cannot see the programs jax {jax.__version__} "
            "compiles (no lowering hook in frozenconst._compat for this version): "
            "nothing inside this block is checked",
            FrozenConstWarning,
            stacklevel=3,
        )
        yield
        return
    try:
        yield
    finally:
        _detach(guard)
    if guard.blind:
        warnings.warn(
            f"frozenconst.no_numpy_constants could not inspect {len(guard.blind)} compiled "
            f"program(s), which are not checked: {guard.blind[0]}",
            FrozenConstWarning,
            stacklevel=3,
        )
    if guard.lines:
        raise CapturedNumpyConstantError(
            f"{len(guard.lines)} raw NumPy constant(s) captured by traced code:\n"
            + "\n".join(f"- {line}" for line in guard.lines)
        )
