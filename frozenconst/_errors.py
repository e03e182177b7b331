"""Exception classes. Each subclasses the builtin a caller would expect."""

from __future__ import annotations

import types


class FrozenConstTypeError(TypeError):
    """Raised when a value of an unsupported kind is given to `frozenconst`.

    Examples: object, string, bytes, structured or datetime arrays, masked
    arrays, and traced values (see [`TracedValueError`][frozenconst.TracedValueError]).
    """


class TracedValueError(FrozenConstTypeError):
    """Raised when a `FrozenConst` is built from a traced (abstract) value.

    A `FrozenConst` holds concrete data on the host. Inside `jax.jit`,
    `jax.grad`, `jax.vmap` and friends, build it outside the transformation and
    close over it, or pass it in as an argument.
    """


class FrozenConstValueError(ValueError):
    """Raised when a value has a supported type but unusable contents or options.

    Examples: ragged nested sequences, `copy=False` where a copy is unavoidable,
    or a placement target that is not a device or sharding.
    """


class FrozenConstIndexError(IndexError):
    """Raised by [`audit`][frozenconst.audit] where JAX refused a FrozenConst index with an `IndexError`.

    On jax 0.10 and newer `a[idx]` with a FrozenConst `idx` raises JAX's
    `IndexError`; the audit raises this instead, naming the place of use and the
    fix, `a[jnp.asarray(idx)]` (docs/jax.md, "jax.lax and indexing").
    """


class NotAddressableError(FrozenConstValueError):
    """Raised when an operation needs slices of a constant that this process does not hold.

    A constant built with a sharding that spans several processes, from a
    memory-mapped array or [`from_callback`][frozenconst.FrozenConst.from_callback],
    holds only the slices this process's devices address. Whole-array host
    access (`np.asarray(x)`, `x.fingerprint`, pickling) and placements that
    need other slices raise this; the message names the slices and the
    collective to use instead (docs: "Constants bigger than one host").
    """


class FrozenConstRuntimeError(RuntimeError):
    """Raised when `frozenconst` cannot finish what was asked, for reasons of the run, not of a value.

    Examples: a constant that does not fit the device budget beside the constants
    in use; a program [`save`][frozenconst.Exported.save] cannot write, or one
    [`load`][frozenconst.load] cannot call on this JAX; an
    [`export`][frozenconst.export] whose lowering on this JAX cannot keep the
    constants out.
    """


class CapturedNumpyConstantError(AssertionError):
    """Raised by [`no_numpy_constants`][frozenconst.no_numpy_constants] when a traced
    function captured a raw NumPy constant above its size threshold.

    An `AssertionError`, so a test that trips the guard fails rather than errors.

    Attributes:
        user_frames: the frames of your code (each `(frame, last instruction, line)`,
            innermost first) when the first offending program was compiled; the
            pytest fixture shows the test's own line from them.
    """

    user_frames: tuple[tuple[types.FrameType, int, int], ...] = ()


class FrozenConstWarning(UserWarning):
    """Warns, once per line of your code, of what costs memory or time that you can fix:
    a FrozenConst a program embeds (and why, and the fix), a copy of a constant a step
    handed back, a constant's device buffer deleted behind frozenconst's back, a
    fallback of this JAX or machine (page-locked memory refused), or a deprecated name
    and what replaces it. Said again once the warning filters change.

    Example: [`no_numpy_constants`][frozenconst.no_numpy_constants] on a JAX
    whose compilations it cannot see checks nothing, and says so.
    """


for _cls in (
    FrozenConstTypeError,
    TracedValueError,
    FrozenConstValueError,
    FrozenConstIndexError,
    NotAddressableError,
    FrozenConstRuntimeError,
    CapturedNumpyConstantError,
    FrozenConstWarning,
):
    _cls.__module__ = "frozenconst"
del _cls
