"""What a user sees of an error raised through frozenconst: its frames hidden where JAX hides its own.

Below a JAX API boundary (the function `frozenconst.jit` traces, a FrozenConst's
operators inside `jax.numpy`), JAX itself removes frozenconst's frames, as it
removes its own (`_compat` registers the package with it). Above it, the frames
of `frozenconst.jit`'s own entry points remain: `hide_own_frames` drops them from
an error that JAX filtered, in the same mode, so the traceback goes from the
user's call straight to the user's line that failed. Under
`JAX_TRACEBACK_FILTERING=off` every frame stays, each showing its own line.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from ._compat import PACKAGE_DIR, jax_filtered, traceback_filtering
from ._refusals import refused_as_array

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _own(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(PACKAGE_DIR)


def hide_own_frames(err: BaseException) -> None:
    """Drop frozenconst's frames from `err`'s traceback where JAX dropped its own (or mark them,
    under "tracebackhide"); leave them under "off", or where no JAX boundary filtered `err`."""
    mode = traceback_filtering()
    if mode == "tracebackhide":
        # As JAX marks its own: IPython (and pytest) skip frames holding this local.
        tb = err.__traceback__
        while tb is not None:
            if _own(tb.tb_frame):
                tb.tb_frame.f_locals["__tracebackhide__"] = True
            tb = tb.tb_next
    elif mode in ("remove_frames", "quiet_remove_frames") and jax_filtered(err):
        err.with_traceback(_without_own(err.__traceback__))


def _without_own(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback less frozenconst's entries; the others keep their own line and position
    (`tb_lasti`, not the frame's last instruction, which a `finally:` block may have moved on)."""
    kept: list[types.TracebackType] = []
    while tb is not None:
        if not _own(tb.tb_frame):
            kept.append(tb)
        tb = tb.tb_next
    out: types.TracebackType | None = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def boundary(fun: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fun` as an entry point of frozenconst: an error leaving it drops frozenconst's frames
    where JAX dropped its own, and JAX's refusal of a FrozenConst is frozenconst's error
    (`JitWrapped.__call__` does the same inline, without the extra call)."""

    @functools.wraps(fun)
    def entry(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fun(*args, **kwargs)
        except Exception as err:
            hide_own_frames(err)
            refused = refused_as_array(err)
            if refused is not None:
                # JAX refused a FrozenConst where it takes only a jax.Array: frozenconst's own
                # error, naming the user's line and the fix (`_refusals`).
                raise refused.with_traceback(err.__traceback__) from err
            raise

    return entry
