"""A guard for test suites: fail when traced code captures a raw NumPy constant."""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Generator
from typing import Any

import numpy as np

from ._errors import CapturedNumpyConstantError

# JAX reports captured constants itself when `jax_captured_constants_warn_bytes`
# is set (a documented option, JAX_CAPTURED_CONSTANTS_WARN_BYTES): at lowering,
# as a warning that names each constant's Python type, abstract value and place
# of use. The two pipelines word it differently (checked on 0.10.2 and 0.12.0.1).
_DEFAULT_PIPELINE = re.compile(
    r"Constant <class '(?P<type>[^']+)'>, (?P<aval>\S+), \S+ captured at:\n(?P<where>(?:[ \t]+\S.*\n?)+)"
)
_SIMPLIFIED_PIPELINE = re.compile(
    r"Closed-over constant <class '(?P<type>[^']+)'>: (?P<aval>\S+) in .*? used at:\n"
    r"(?P<where>(?:[ \t]+\S.*\n?)+)"
)
# NumPy data reaches jaxprs as numpy.ndarray or JAX's TypedNdArray wrapper.
_NUMPY_TYPES = ("numpy.", "TypedNdArray")


def _aval_bytes(aval: str) -> int:
    match = re.fullmatch(r"(?P<dtype>[a-z0-9_]+)\[(?P<dims>[0-9,]*)\]", aval)
    if match is None:
        return 0
    dims = [int(d) for d in match["dims"].split(",") if d]
    return int(np.prod(dims, dtype=np.int64)) * np.dtype(match["dtype"]).itemsize


def _numpy_captures(message: str, max_bytes: int) -> list[str]:
    found: list[str] = []
    for pattern in (_DEFAULT_PIPELINE, _SIMPLIFIED_PIPELINE):
        for m in pattern.finditer(message):
            if not any(t in m["type"] for t in _NUMPY_TYPES):
                continue
            nbytes = _aval_bytes(m["aval"])
            if nbytes > max_bytes:
                where = m["where"].strip().splitlines()[0].strip()
                found.append(
                    f"numpy {m['aval']} ({nbytes} bytes) at {where}: raw NumPy constant captured by a "
                    "traced function; fix: wrap it once in `frozenconst.FrozenConst`"
                )
    return found


@contextlib.contextmanager
def no_numpy_constants(max_bytes: int = 1024) -> Generator[None]:
    """Fail when code run inside captures a raw NumPy constant larger than `max_bytes`.

    Checks every function JAX compiles inside the block, under either constant
    pipeline, with JAX's own captured-constants report. Functions compiled before
    the block (JAX caches executables) are not compiled again, so not checked.

    Arguments:
        max_bytes: the largest NumPy constant allowed.

    Raises:
        CapturedNumpyConstantError: at the end of the block, with one audit line
            per offending constant.

    Example:
        >>> import numpy as np, jax, jax.numpy as jnp, frozenconst
        >>> table = np.ones((64, 64), np.float32)
        >>> with frozenconst.no_numpy_constants():
        ...     _ = jax.jit(lambda w: table @ w)(jnp.ones(64))
        Traceback (most recent call last):
        ...
        frozenconst.CapturedNumpyConstantError: 1 raw NumPy constant(s) captured...
    """
    from jax._src import config as jax_config

    offending: list[str] = []
    others: list[warnings.WarningMessage] = []
    with contextlib.ExitStack() as stack:
        records = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        stack.enter_context(jax_config.captured_constants_warn_bytes(max_bytes + 1))
        stack.enter_context(jax_config.captured_constants_report_frames(1))
        yield
    for record in records:
        caught = _numpy_captures(str(record.message), max_bytes)
        if caught:
            offending += caught
        elif not _is_constants_report(str(record.message)):
            others.append(record)
    for record in others:  # not ours: pass them on as they were
        warnings.warn_explicit(
            record.message, record.category, record.filename, record.lineno, source=record.source
        )
    if offending:
        raise CapturedNumpyConstantError(
            f"{len(offending)} raw NumPy constant(s) captured by traced code:\n"
            + "\n".join(f"- {line}" for line in offending)
        )


def _is_constants_report(message: Any) -> bool:
    return "constants were captured during lowering" in message or "Closed-over constant" in message
