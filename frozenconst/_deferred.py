"""A warning that Python's filters make an error, raised where it cannot leave a tree half built.

JAX calls `FrozenConst.tree_unflatten` from inside other libraries' rebuilding of
their trees: flax NNX's graph rebuild empties a module (`node_impl.clear`) and
then fills it child by child. A warning raised there as an error (`-W error`,
`warnings.simplefilter("error", FrozenConstWarning)`) would leave the module
empty, and every later call fail on a missing attribute (issue #47 row 1).
So the error is raised in the user's frame instead, at its next instruction, once
the call that rebuilt the tree has returned: the step raises, and the model is
whole. This is what a debugger does to stop at a frame (`pdb.set_trace` sets
`f_trace` on a running frame, then `sys.settrace`); where a tracer is already set
(a debugger, coverage) the error is raised at once, as any warning is.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

_PENDING = threading.local()


def raise_in(frame: types.FrameType, error: BaseException) -> bool:
    """Raise `error` in `frame` at its next instruction; False where it cannot (then the
    caller raises it). One error per thread is pending at a time: a rebuild of many
    constants raises the first."""
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
