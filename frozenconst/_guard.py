"""A guard for test suites: fail when traced code captures a raw NumPy constant.

While a guard is open, frozenconst is shown each program JAX lowers for
compilation (`_install`, the one place frozenconst installs into JAX)
and walks it, with the walk `frozenconst.audit` uses, nested programs
included. The decision is made from the constants themselves, under either
constant pipeline, whatever else the program captures.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Literal

import jax
import numpy as np

from ._errors import CapturedNumpyConstantError, FrozenConstWarning
from ._frames import Frame, user_frames
from ._install import Observer, observe, unobserve
from ._jaxprs import walk, where

# One host array, by the memory it shows: a TypedNdArray view JAX made of a
# user's array and the array itself are one constant.
_BufferId = tuple[Any, ...]


class _Guard:
    """What one open `no_numpy_constants` block has found."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.lock = threading.Lock()  # programs are lowered in any thread
        self.lines: list[str] = []
        self.blind: list[str] = []  # programs that could not be inspected, and why
        # Reported arrays stay referenced until the block ends, so their keys
        # (memory addresses) cannot be reused by another array meanwhile.
        self._reported: dict[_BufferId, np.ndarray] = {}
        # The user's frames when the first offending program was lowered, innermost
        # first: the pytest plugin shows the test's own line from them.
        self.stack: tuple[Frame, ...] = ()
        # The bound method, kept: `unobserve` finds an observer by identity.
        self.observer: Observer = self.observe

    def observe(self, program: Any, kwargs: dict[str, Any]) -> None:
        """Record what `program`, a program JAX lowers while this guard is open, captures:
        the guard's observer in `_install`'s registry."""
        try:
            found = _numpy_constants(program)
        except Exception as exc:  # a JAX this walk does not understand: said at block end
            with self.lock:
                self.blind.append(f"{type(exc).__name__}: {exc}")
            return
        with self.lock:
            for key, host, eqn in found:
                if host.nbytes > self.max_bytes and key not in self._reported:
                    self._reported[key] = host
                    self.lines.append(_line(host, eqn))
                    if not self.stack:
                        self.stack = user_frames()


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


def _line(host: np.ndarray, eqn: Any) -> str:
    aval = f"{host.dtype.name}[{','.join(map(str, host.shape))}]"
    return (
        f"numpy {aval} ({host.nbytes} bytes) at {where(eqn) or '?'}: raw NumPy constant captured "
        "by a traced function; fix: wrap it once in `frozenconst.FrozenConst`"
    )


def no_numpy_constants(max_bytes: int = 1024) -> _NoNumpyConstants:
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

    A context manager, and a decorator: `@frozenconst.no_numpy_constants()` checks
    each call of the function it decorates.

    Arguments:
        max_bytes: the largest NumPy constant allowed.

    Raises:
        CapturedNumpyConstantError: at the end of the block, with one line per
            offending constant: dtype and shape, bytes, first use, and the fix.

    Warns:
        FrozenConstWarning: when the block opens, if this JAX gives no way to
            see its compilations (nothing inside is checked then), and at the
            end if a compiled program could not be inspected.

    Examples:
        A FrozenConst passes; the same code closing over the NumPy array
        `np.ones((64, 64), np.float32)` raises `CapturedNumpyConstantError`
        when the block ends, naming it and the line that used it.

        >>> import numpy as np, jax, jax.numpy as jnp, frozenconst
        >>> table = frozenconst.FrozenConst(np.ones((64, 64), np.float32))
        >>> with frozenconst.no_numpy_constants():
        ...     _ = frozenconst.jit(lambda w: table @ w)(jnp.ones(64))
    """
    return _NoNumpyConstants(max_bytes)


class _NoNumpyConstants(contextlib.ContextDecorator):
    """What [`no_numpy_constants`][frozenconst.no_numpy_constants] returns: a context
    manager and decorator; each `with` block (each decorated call) is checked on its own."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # The guards of this object's open blocks, innermost last (None: nothing checked).
        self._open: list[_Guard | None] = []

    def __enter__(self) -> None:
        guard = _Guard(self.max_bytes)
        watching = observe(guard.observer)
        if not watching:
            warnings.warn(
                f"frozenconst.no_numpy_constants cannot see the programs jax {jax.__version__} "
                "compiles (no lowering hook in frozenconst._compat_lowering for this version): "
                "nothing inside this block is checked",
                FrozenConstWarning,
                stacklevel=2,
            )
        self._open.append(guard if watching else None)

    def __exit__(
        self, kind: type[BaseException] | None, raised: BaseException | None, _: object
    ) -> Literal[False]:
        # pytest leaves this frame out of a failure's report: it shows the user's line and
        # the message (the pytest plugin's fixture: the test's line), not this source.
        __tracebackhide__ = True
        guard = self._open.pop()
        if guard is None:
            return False
        unobserve(guard.observer)
        found = f"{len(guard.lines)} raw NumPy constant(s) captured by traced code:\n" + "\n".join(
            f"- {line}" for line in guard.lines
        )
        if raised is not None:  # the block's own error is the one raised; what was found, a note
            if guard.lines:
                raised.add_note(f"frozenconst.no_numpy_constants also found {found}")
            return False
        if guard.blind:
            warnings.warn(
                f"frozenconst.no_numpy_constants could not inspect {len(guard.blind)} compiled "
                f"program(s), which are not checked: {guard.blind[0]}",
                FrozenConstWarning,
                stacklevel=2,
            )
        if guard.lines:
            error = CapturedNumpyConstantError(found)
            error.user_frames = guard.stack
            raise error
        return False
