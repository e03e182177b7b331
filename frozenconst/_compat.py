"""The few places where frozenconst reads JAX internals, each with a public fallback.

Everything version-dependent lives here so that the rest of the package reads
like plain JAX.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import jax

# Reading `jax.config.jax_enable_x64` goes through `Config.__getattr__` and costs
# about 2.5x the direct `State.value` read (measured on jax 0.10.2 and 0.12.0.1).
# The device-cache hit path reads both settings on every use, so read the state
# objects directly where they exist.
try:
    from jax._src import config as _jax_config

    _x64_state: Any = _jax_config.enable_x64
    _default_device_state: Any = _jax_config.default_device

    def x64_enabled() -> bool:
        """Whether `jax_enable_x64` is on in this thread right now."""
        return bool(_x64_state.value)

    def default_device_setting() -> Any:
        """The value of `jax_default_device` in this thread right now."""
        return _default_device_state.value

except (ImportError, AttributeError):  # pragma: no cover - newer JAX layouts

    def x64_enabled() -> bool:
        return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined,unused-ignore]

    def default_device_setting() -> Any:
        return jax.config.jax_default_device  # type: ignore[attr-defined,unused-ignore]


# `jax.core.eval_context()` makes primitives evaluate eagerly even while a trace
# is active (inside `jit`, `grad`, `vmap`, `eval_shape`). `jax.device_put` under
# a trace otherwise returns a tracer, and caching that would leak it.
# `jax.ensure_compile_time_eval()` is not enough: under `eval_shape` on
# jax 0.12 it still returns a tracer (checked on 0.10.2 and 0.12.0.1).
eval_context: Callable[[], Any] = jax.core.eval_context  # type: ignore[attr-defined,unused-ignore]

Tracer: type = jax.core.Tracer


# Trace isolation for `frozenconst.jit`. While it traces, a FrozenConst
# resolves to a parameter of the compiled program: a tracer. A nested
# `jax.jit` (or `scan` body) that closes over the constant would cache its jaxpr
# with that tracer inside, keyed by function and argument types only, and a
# later trace would reuse it and leak the tracer; an inner function traced
# before, outside, would be reused with the data embedded. JAX keys those caches
# by the "trace context" too, so a config state of our own in that context,
# set to a fresh value for each `frozenconst.jit` trace, keeps every inner
# trace made there private to it (checked on jax 0.10.2 and 0.12.0.1).
_epochs = itertools.count(1)
try:
    _epoch: Any = _jax_config.config_states.get("frozenconst_trace_epoch") or _jax_config.int_state(
        name="frozenconst_trace_epoch",
        default=0,
        help="Internal to frozenconst: isolates the traces made by frozenconst.jit.",
        include_in_trace_context=True,
    )
    TRACE_ISOLATION = True

    def isolated_trace() -> contextlib.AbstractContextManager[Any]:
        """A context in which JAX's tracing caches see a trace context used nowhere else."""
        cm: contextlib.AbstractContextManager[Any] = _epoch(next(_epochs))
        return cm

except Exception:  # pragma: no cover - newer JAX layouts
    TRACE_ISOLATION = False

    def isolated_trace() -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


# The trace currently active in this thread. `frozenconst.jit` compares it with
# the trace it started to tell whether a constant is reached at the top level of
# the function or inside a nested trace (an inner `jit`, `scan` body, `grad`).
try:
    from jax._src.core import trace_ctx as _trace_ctx

    def current_trace() -> object:
        """An identity for the innermost active trace."""
        return _trace_ctx.trace

except (ImportError, AttributeError):  # pragma: no cover - newer JAX layouts

    def current_trace() -> object:
        # Unknown layout: every use counts as nested (see `_hoisting.resolve`).
        return object()


# Source locations JAX records (and shows in errors and `frozenconst.audit`)
# should point at the user's code, not at frozenconst's operator forwarding.
# JAX hides its own frames the same way.
import os as _os  # noqa: E402

from jax.extend import source_info_util as _source_info_util  # noqa: E402

_source_info_util.register_exclusion(_os.path.dirname(__file__) + _os.sep)
