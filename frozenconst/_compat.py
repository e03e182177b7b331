"""The few places where frozenconst reads JAX internals, each with a reason and a fallback.

Everything version-dependent lives here so that the rest of the package reads
like plain JAX.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.core
from jax._src import config as _jax_config
from jax.extend import source_info_util

if TYPE_CHECKING:
    # jaxlib ships no type information for its devices (`jax.Device` is a
    # variable bound to a compiled class), so type checkers cannot use it as a
    # type. Annotations here say `Device` and mean `jax.Device`; statically it is
    # the part of a device's interface frozenconst relies on, which every real
    # device (typed Any by the checkers) satisfies and an int or a string does not.
    class Device(Protocol):
        @property
        def id(self) -> int: ...
        @property
        def platform(self) -> str: ...
        @property
        def process_index(self) -> int: ...

else:
    Device = jax.Device


def _state(name: str) -> Any:
    return getattr(_jax_config, name, None)


class _Setting:
    """A JAX setting read through the public `jax.config` (the slow path)."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def value(self) -> Any:
        return getattr(jax.config, self._name)


# Reading `jax.config.jax_enable_x64` goes through `Config.__getattr__` and costs
# about 2.5x the direct `State.value` read (measured on jax 0.10.2 and 0.12.0.1).
# The device-cache hit path reads both settings on every use, so it reads
# `X64.value` and `DEFAULT_DEVICE.value` on JAX's state objects where they exist;
# both honour thread-local contexts such as `jax.default_device(...)`.
def _setting(state: str, name: str) -> Any:
    found = _state(state)
    return _Setting(name) if found is None else found


X64: Any = _setting("enable_x64", "jax_enable_x64")
DEFAULT_DEVICE: Any = _setting("default_device", "jax_default_device")


# `jax.core.eval_context()` makes primitives evaluate eagerly even while a trace
# is active (inside `jit`, `grad`, `vmap`, `eval_shape`). `jax.device_put` under
# a trace otherwise returns a tracer, and caching that would leak it.
# `jax.ensure_compile_time_eval()` is not enough: under `eval_shape` on
# jax 0.12 it still returns a tracer (checked on 0.10.2 and 0.12.0.1).
eval_context: Callable[[], contextlib.AbstractContextManager[Any]] = jax.core.eval_context


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


def _make_epoch_state() -> Any:
    states: dict[str, Any] = _state("config_states") or {}
    existing = states.get("frozenconst_trace_epoch")
    if existing is not None:
        return existing
    int_state = _state("int_state")
    if int_state is None:  # pragma: no cover - newer JAX layouts
        return None
    try:
        return int_state(
            name="frozenconst_trace_epoch",
            default=0,
            help="Internal to frozenconst: isolates the traces made by frozenconst.jit.",
            include_in_trace_context=True,
        )
    except TypeError:  # pragma: no cover - a JAX without trace-context states
        return None


_epoch = _make_epoch_state()
trace_isolation = _epoch is not None


def isolated_trace() -> contextlib.AbstractContextManager[Any]:
    """A context in which JAX's tracing caches see a trace context used nowhere else."""
    if _epoch is None:  # pragma: no cover - newer JAX layouts
        return contextlib.nullcontext()
    cm: contextlib.AbstractContextManager[Any] = _epoch(next(_epochs))
    return cm


# The trace currently active in this thread. Without trace isolation,
# `frozenconst.jit` compares it with the trace it started, to keep uses inside
# nested traces concrete.
def current_trace() -> object:
    """An identity for the innermost active trace."""
    try:
        from jax._src.core import trace_ctx

        return trace_ctx.trace
    except (ImportError, AttributeError):  # pragma: no cover - newer JAX layouts
        # Unknown layout: every use counts as nested (see `_hoisting.resolve`).
        return object()


# Source locations JAX records (and shows in errors and `frozenconst.audit`)
# should point at the user's code, not at frozenconst's operator forwarding.
# JAX hides its own frames the same way.
source_info_util.register_exclusion(os.path.dirname(__file__) + os.sep)

Tracer: type = jax.core.Tracer
