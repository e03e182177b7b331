"""Which frame is the user's: the one policy every warning, the guard and every error follow.

A warning names the user's line: the first frame up the stack outside JAX, frozenconst and
the libraries that compile or rebuild trees for the user (`LIBRARIES`), never the standard
library's machinery that runs other code (`PLUMBING`: an orbax restore runs under `asyncio`).
The same rule says where a constant was made (`origin_module`), which frames the pytest
guard reports (`user_frames`), and where the derived-copy warning is told (`find_user`).

Errors: a warning that the filters make an error, met while a library rebuilds its tree, is
raised in the user's frame once the rebuild has returned (`raise_in`); JAX's refusal of a
FrozenConst names the user's line by the same rule (`_refusals`); an error leaving one of
frozenconst's entry points drops frozenconst's frames where JAX dropped its own
(`hide_own_frames`).
"""

from __future__ import annotations

import sys
import threading
import types
import warnings
import weakref
from typing import Any

from ._compat import JIT_MODULE, PACKAGE_DIR, frame_at, jax_filtered, traceback_filtering
from ._errors import FrozenConstWarning

# The packages whose frames are never the user's line: JAX, frozenconst, NumPy (a `__array__`
# or `__dlpack__` that warns is called from NumPy's code), and the libraries that compile,
# rebuild or restore trees on the user's behalf: training, checkpoints, samplers and solvers
# that jit internally, and the type checker that wraps a user's function.
LIBRARIES = frozenset(
    {"jax", "jaxlib", "frozenconst", "numpy", "optax", "equinox", "flax", "chex", "orbax"}
    | {"numpyro", "blackjax", "diffrax", "optimistix", "lineax", "jaxopt", "distrax", "jaxtyping"}
)
# The standard library's machinery that runs other code (event loops, thread pools, context
# managers, copies and pickles): never the user's line, and not a library's either.
PLUMBING = frozenset(
    {"asyncio", "concurrent", "threading", "contextlib", "functools", "selectors", "queue"}
    | {"pickle", "copy", "copyreg"}
)
# The packages that are the machinery of tracing and rebuilding, not a library with advice of
# its own for the derived-copy warning (`find_user`'s third answer).
_MACHINERY = frozenset({"frozenconst", "jax", "jaxlib", "numpy"})


def library_of(frame: types.FrameType) -> str:
    """The package among `LIBRARIES` or `PLUMBING` whose code `frame` runs, or "" for a user's."""
    package: str = frame.f_globals.get("__name__", "").partition(".")[0]
    return package if package in LIBRARIES or package in PLUMBING else ""


def find_user(frame: types.FrameType) -> tuple[types.FrameType, int, str]:
    """The user's frame at or above `frame`: the frame, how many frames up it is, and the
    library nearest it ("jit" where JAX's jit in Python is the nearest; "" where none is).
    On a stack with no user frame (a library's own worker thread), the outermost library
    frame, never the standard library's plumbing."""
    library, depth = "", 0
    outermost, outer_depth = frame, 0
    here: types.FrameType | None = frame
    while here is not None and (found := library_of(here)):
        if found not in PLUMBING:
            outermost, outer_depth = here, depth
            if found not in _MACHINERY:
                library = found  # the training library nearest the user's line gives the advice
            elif not library and here.f_globals.get("__name__") == JIT_MODULE:
                library = "jit"  # a jitted function's first call: JAX's jit in Python
        here, depth = here.f_back, depth + 1
    if here is None:
        return outermost, outer_depth, library
    return here, depth, library


def user_stacklevel() -> int:
    """The `stacklevel` that makes the caller's `warnings.warn` name the user's frame."""
    return find_user(frame_at(1))[1] + 1


def origin_module() -> str:
    """The module whose code is making a constant: the user's frame's ("" where there is none)."""
    user, _, _ = find_user(frame_at(1))
    name: str = user.f_globals.get("__name__", "")
    return "" if library_of(user) else name


# -- said once ----------------------------------------------------------------------------------


class Said:
    """The one "said once" rule every warning follows: what was said is forgotten where Python's
    warning filters change, as Python forgets what its registries showed, so no test's filters
    decide what another's see. The list replaced (`catch_warnings`) or changed in place
    (`simplefilter`, `filterwarnings`, `resetwarnings`) shows in its identity, length or first entry.
    """

    __slots__ = ("filters", "first", "length")

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Forget everything said, under the filters in force now."""
        filters = warnings.filters
        self.filters, self.length, self.first = filters, len(filters), filters[0] if filters else None

    def stale(self) -> bool:
        """Whether the filters changed since what is kept was said (then `forget` it)."""
        filters = warnings.filters
        return (
            filters is not self.filters
            or len(filters) != self.length
            or (filters[0] if filters else None) is not self.first
        )


class Told(Said):
    """What was said of each subject (held weakly: forgotten with it) since the filters last
    changed, each key once: asked first (`new`), recorded once shown (`record`), so a warning
    raised as an error is said again the next time it applies."""

    __slots__ = ("lock", "said")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        super().__init__()

    def forget(self) -> None:
        super().forget()
        self.said: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

    def new(self, subject: Any, key: str) -> bool:
        with self.lock:
            if self.stale():
                self.forget()
            return key not in self.said.get(subject, ())

    def record(self, subject: Any, key: str) -> None:
        with self.lock:
            self.said.setdefault(subject, set()).add(key)


DEGRADED = Told()


def warn_degraded(message: str) -> None:
    """Warn, with a FrozenConstWarning naming the user's line, that a fallback for this JAX or
    this machine is in use: said once (`Said`), at first need, where it keeps results right but
    costs something (a second trace, a copy, memory)."""
    # A fallback is the process's, not a constant's: its messages are kept under this function.
    if DEGRADED.new(warn_degraded, message):
        warnings.warn(message, FrozenConstWarning, stacklevel=user_stacklevel())
        DEGRADED.record(warn_degraded, message)


# A frame of the user's code, with the instruction and line it was at when recorded (the
# frame moves on afterwards): what a traceback entry needs (`types.TracebackType`).
Frame = tuple[types.FrameType, int, int]


def user_frames() -> tuple[Frame, ...]:
    """Every frame of the calling thread that is the user's, innermost first."""
    frames: list[Frame] = []
    frame: types.FrameType | None = frame_at(1)
    while frame is not None:
        if not library_of(frame):
            frames.append((frame, frame.f_lasti, frame.f_lineno))
        frame = frame.f_back
    return tuple(frames)


# -- errors raised in the user's frame --------------------------------------------------------

_PENDING = threading.local()


def raise_in(frame: types.FrameType, error: BaseException) -> bool:
    """Raise `error` in `frame` at its next instruction (the first of a thread's, one at a time);
    False where a tracer is already set (the caller raises it). A warning raised as an error
    inside flax NNX's graph rebuild would leave a module empty: raised once the rebuild has
    returned, the model is whole. A debugger stops at a frame so (`f_trace`, `sys.settrace`).
    """
    if getattr(_PENDING, "error", None) is not None:
        return True  # the first of this rebuild is already on its way
    if sys.gettrace() is not None:
        return False

    def local(traced: types.FrameType, event: str, arg: Any) -> Any:
        if traced is not frame:
            return None
        pending = _PENDING.error
        _PENDING.error = None
        frame.f_trace_opcodes = False
        frame.f_trace = None
        sys.settrace(None)
        if event == "exception":
            return None  # another error leaves the call first: it is the one raised
        raise pending

    _PENDING.error = error
    frame.f_trace_opcodes = True
    frame.f_trace = local
    # The global trace function is asked once per frame entered until then, and traces none.
    sys.settrace(lambda traced, event, arg: local if traced is frame else None)
    return True


# -- frozenconst's own frames in a user's traceback ---------------------------------------------
# Below a JAX API boundary (the function `frozenconst.jit` traces, a FrozenConst's operators
# inside `jax.numpy`) JAX removes frozenconst's frames as its own (`_compat` registers the
# package with it). Above it, the frames of frozenconst's entry points remain: `hide_own_frames`
# drops them from an error that JAX filtered, in the same mode, so the traceback goes from the
# user's call straight to the user's line that failed. Under `JAX_TRACEBACK_FILTERING=off`
# every frame stays.


def _own(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(PACKAGE_DIR)


def hide_own_frames(err: BaseException) -> None:
    """Drop frozenconst's frames from `err`'s traceback where JAX dropped its own (or mark them,
    under "tracebackhide"); leave them under "off", or where no JAX boundary filtered `err`."""
    mode = traceback_filtering()
    entries: list[types.TracebackType] = []
    tb = err.__traceback__
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if mode == "tracebackhide":
        # As JAX marks its own: IPython (and pytest) skip frames holding this local.
        for entry in entries:
            if _own(entry.tb_frame):
                entry.tb_frame.f_locals["__tracebackhide__"] = True
    elif mode in ("remove_frames", "quiet_remove_frames") and jax_filtered(err):
        # The others keep their own line and position (`tb_lasti`, not the frame's last
        # instruction, which a `finally:` block may have moved on).
        out: types.TracebackType | None = None
        for entry in reversed(entries):
            if not _own(entry.tb_frame):
                out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
        err.with_traceback(out)
