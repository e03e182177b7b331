"""The few places where frozenconst reads JAX internals, each with a reason and a fallback.

Everything version-dependent lives here so that the rest of the package reads
like plain JAX.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import os
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.core
import jax.extend.backend
import jax.extend.core
import jax.sharding
from jax._src import config as _jax_config
from jax.extend import source_info_util

from ._errors import FrozenConstWarning

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


# Where a fallback below keeps results right but costs something (a second
# trace, a copy, memory), frozenconst says so once per process, at first need.
@functools.cache
def warn_degraded(message: str) -> None:
    """Warn once, with a FrozenConstWarning, that a fallback for this JAX is in use."""
    warnings.warn(message, FrozenConstWarning, stacklevel=3)


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
# Public in `jax.core` (checked on 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1).
# Fallback: `jax.ensure_compile_time_eval()`, under which `jax.device_put` of
# host data is eager too under `jit`, `vmap`, `grad` and `eval_shape` (checked
# on the same versions); the cache never keeps a tracer in any case.
eval_context: Callable[[], contextlib.AbstractContextManager[Any]] = getattr(
    jax.core, "eval_context", jax.ensure_compile_time_eval
)


# Trace contexts for `frozenconst.jit`. While it traces, a FrozenConst
# resolves to a parameter of the compiled program: a tracer. JAX caches the
# traces of inner functions (a nested `jax.jit`, a `scan` body) by function,
# argument types and the "trace context", a tuple of config states. Two hazards:
# an inner function traced before, outside, would be reused with the constant's
# data embedded; and an inner function that met the constant inside one
# `frozenconst.jit` trace holds that trace's tracer, which a later trace would
# reuse and leak. A config state of our own in the trace context answers both:
# every `frozenconst.jit` trace runs with it set to a value shared by all of
# them (`shared_trace_context`; never the value outside, so nothing traced
# outside is reused), and a trace whose constants reach an inner trace runs with
# a value of its own (`unique_trace_context`).
# Only the second kind adds cache entries per trace: a fresh value for every
# trace would grow JAX's caches with every function made and dropped (issue
# #11). Built on the public `jax.make_user_context(default)` (checked on jax
# 0.9.2, 0.10.2 and 0.12.0.1): a config state in the trace context (and the
# jit key) that JAX's global config does not list, so nothing appears in
# `jax.config.values` when frozenconst is imported or traces. JAX's own test
# harness compares that dict around every test ("Test changed global config
# values", `test_util.assert_global_configs_unchanged`), and a library's private
# state appearing there mid-run failed it (issue #37; `tests/test_jit_seams.py`
# checks the dict). Where JAX lacks it (jax 0.8.x), the private
# `int_state(..., include_in_trace_context=True)` (jax/_src/config.py, jax >=
# 0.8; checked on jax 0.8.3, 0.9.2, 0.10.2 and 0.12.0.1), registered once, at
# import, as `frozenconst_trace_epoch`: listed in `jax.config.values` from the
# import on, always at its default outside frozenconst's traces.
#
# Before jax 0.8 (checked on 0.4.38, 0.6.2 and 0.7.2) `config.trace_context()`
# is a fixed tuple and `int_state` takes no `include_in_trace_context`. One
# state in that tuple changes nothing a program computes:
# `jax_hlo_source_file_canonicalization_regex`, a pattern removed from the
# file names in the HLO location metadata. There, a trace context is that
# pattern with a never-matching alternative appended, `(?!)frozenconst-trace-N`:
# it matches exactly what the pattern outside matched (nothing, by default),
# yet the trace context differs for every N. Before use it is checked to be
# in the trace context; without either, nested uses degrade (`_hoisting`
# embeds them under the default pipeline, with one FrozenConstWarning).
_unique = itertools.count(1)
_shared = next(_unique)

# Values of `unique_trace_context` free to be used again, per kind of trace
# (how its constants resolve). Issue #19: a value used once and dropped leaves
# JAX's caches keyed by trace context (`trace_to_jaxpr`, unbounded, and
# `_infer_params_cached` and friends) one entry per library function traced
# under it (`jnp.multiply`, `jnp.sum`, ...), about 20 KiB per function made and
# dropped, forever. A value is safe again once the trace that used it is gone:
# a cache entry that closed over one of its tracers holds the trace alive
# (every tracer holds its trace), so while any such entry lives the value is
# not reused; entries without our tracers are what any trace of that kind
# would cache. Kept per kind, so a reused entry resolved constants the way
# the new trace would. A stand-in for a constant met first (`_hoisting.placeholder`)
# is never handed to an inner trace, where an inner `jax.jit` would cache zeros
# without holding the trace (a later trace reusing the value computed with them:
# the composition property test found it; issue #26 moved the stand-ins out).
# Where user code caught a stop and an inner trace went on without the
# constant, the value is retired, never reused (`retire_trace_context`).
_free: dict[Hashable, list[int]] = {}
_retired: set[int] = set()
# Values handed out whose traces may still be alive.
_in_use: set[int] = set()
_free_lock = threading.Lock()


def _release(kind: Hashable, value: int) -> None:
    with _free_lock:
        _in_use.discard(value)
        if value in _retired:
            _retired.discard(value)
        else:
            _free.setdefault(kind, []).append(value)


def retire_trace_context(value: int) -> None:
    """Never hand out `value` again: what JAX cached under it may not hold this trace, or holds
    a device buffer since deleted (`_hoisting.buffer_lost`)."""
    with _free_lock:
        if value in _in_use:
            _retired.add(value)  # `_release` drops it when its trace is gone
            return
        for free in _free.values():
            if value in free:
                free.remove(value)


# The innermost active trace object, to learn when it is gone: private
# `jax._src.core.trace_ctx.trace` (jax >= 0.4.36; checked on 0.6.2, 0.9.2,
# 0.10.2 and 0.12.0.1, where `Trace` takes weak references). Without it a
# value is never reused (the memory of issue #19 comes back, nothing else).
def _find_trace_object() -> Callable[[], object] | None:
    try:
        from jax._src import core as _core
    except ImportError:  # pragma: no cover - newer JAX layouts
        return None
    context = getattr(_core, "trace_ctx", None)
    if context is None or not hasattr(context, "trace"):  # pragma: no cover - other JAX
        return None
    return lambda: context.trace


_trace_object = _find_trace_object()


# Values made in a trace while a trace nested in it is current: `frozenconst.jit`
# stands zeros in for a constant met first inside a nested trace (a `scan`
# body, an inner `jax.jit`), made in its own trace, so that the nested trace
# closes over a tracer of that trace, as it closes over a parameter: whatever
# JAX caches of the nested trace then holds the trace, and its trace-context
# value is not used again while it does (zeros made inside the nested trace are
# that trace's own, which JAX caches holding nothing of ours). Private
# `jax._src.core.set_current_trace(trace)` (a context manager) with the trace
# object above (jax >= 0.4.36; checked on 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1).
# Fallback: None, and such a constant stops the trace instead (one trace more
# for each constant met so).
def _find_trace_setter() -> Callable[[object], contextlib.AbstractContextManager[Any]] | None:
    try:
        from jax._src import core as _core
    except ImportError:  # pragma: no cover - newer JAX layouts
        return None
    setter: Callable[[object], contextlib.AbstractContextManager[Any]] | None = getattr(
        _core, "set_current_trace", None
    )
    return setter if callable(setter) else None


_trace_setter = _find_trace_setter()


def trace_handle() -> object | None:
    """The innermost active trace, to make values in it later (`in_trace`), or None where
    this JAX cannot."""
    if _trace_object is None or _trace_setter is None:
        return None
    return _trace_object()


def in_trace(handle: object) -> contextlib.AbstractContextManager[Any]:
    """A context in which JAX's operations make values in the trace `trace_handle()` gave."""
    setter = _trace_setter
    if setter is None:  # pragma: no cover - `trace_handle()` gives no handle then
        raise RuntimeError("this JAX cannot make values in an outer trace")
    return setter(handle)


def _make_context_state() -> Any:
    user_context = getattr(jax, "make_user_context", None)
    if user_context is not None:
        return user_context(None)
    states: dict[str, Any] = _state("config_states") or {}
    existing = states.get("frozenconst_trace_epoch")
    if existing is not None:
        return existing
    int_state = _state("int_state")
    if int_state is None:  # pragma: no cover - newer JAX layouts
        return _pattern_context()
    try:
        return int_state(
            name="frozenconst_trace_epoch",
            default=0,
            help="Internal to frozenconst: isolates the traces made by frozenconst.jit.",
            include_in_trace_context=True,
        )
    except TypeError:  # jax < 0.8: no trace-context states of our own
        return _pattern_context()


_MARKER = "(?!)frozenconst-trace-"


def _outside_pattern(current: str | None) -> str | None:
    """The pattern set outside frozenconst: `current` less a marker we appended."""
    if not current:
        return None
    at = current.rfind(_MARKER)
    if at < 0 or not current[at + len(_MARKER) :].isdigit():
        return current
    head = current[:at]
    if not head:
        return None
    if head.startswith("(?:") and head.endswith(")|"):
        return head[3:-2]
    return current  # pragma: no cover - a pattern that merely mentions the marker


class _PatternContext:
    """Trace contexts carried by `jax_hlo_source_file_canonicalization_regex` (jax < 0.8)."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def __call__(self, value: int) -> contextlib.AbstractContextManager[Any]:
        outside = _outside_pattern(self._state.value)
        marker = f"{_MARKER}{value}"
        cm: contextlib.AbstractContextManager[Any] = self._state(
            f"(?:{outside})|{marker}" if outside else marker
        )
        return cm


def _pattern_context() -> _PatternContext | None:
    state = _state("hlo_source_file_canonicalization_regex")
    trace_ctx = _state("trace_context")
    if state is None or not callable(state) or not callable(trace_ctx):  # pragma: no cover - other JAX
        return None
    context = _PatternContext(state)
    try:
        before = trace_ctx()
        with context(0):
            inside = trace_ctx()
    except Exception:  # pragma: no cover - other JAX layouts
        return None
    return context if inside != before else None


_context_state = _make_context_state()
trace_isolation = _context_state is not None


def trace_context(value: int) -> contextlib.AbstractContextManager[Any]:
    """A context in which JAX's tracing caches see `value` in the trace context."""
    if _context_state is None:  # pragma: no cover - a JAX without either hook
        return contextlib.nullcontext()
    cm: contextlib.AbstractContextManager[Any] = _context_state(value)
    return cm


def unique_trace_context(kind: Hashable = None) -> int:
    """A trace-context value used by no other trace in progress, nor by any trace whose
    tracers may still be held; `kind` says how the trace resolves constants (a value
    is reused only by traces of the same kind). Call it inside the trace."""
    with _free_lock:
        free = _free.get(kind)
        value = free.pop() if free else next(_unique)
        _in_use.add(value)  # in use from now: `retire_trace_context` finds it there
    trace = None if _trace_object is None else _trace_object()
    pooled = False
    if trace is not None:
        # A trace without weak references (none known): the value is never reused.
        with contextlib.suppress(TypeError):
            weakref.finalize(trace, _release, kind, value)
            pooled = True
    if not pooled:
        with _free_lock:
            _in_use.discard(value)
    return value


def shared_trace_context() -> int:
    """The trace-context value the traces of `frozenconst.jit` share."""
    return _shared


def renew_shared_trace_context() -> None:
    """Share a fresh value from now on: what JAX cached under the old one is never reused."""
    global _shared
    _shared = next(_unique)


# The trace currently active in this thread, compared with `==`: a use of a
# constant in a trace nested inside a `frozenconst.jit` trace (a `scan` body, an
# inner `jax.jit`, `grad`) needs that trace isolated (see `_hoisting.resolve`).
# Public: `jax.extend.core.get_opaque_trace_state` (jax >= 0.10; checked on
# jax 0.10.2 and 0.12.0.1). Older JAX has the same function only as
# `jax._src.core.get_opaque_trace_state` (jax 0.4.36 to 0.9.x; checked on
# 0.4.38, 0.6.2, 0.7.2, 0.8.0 and 0.9.2), where jax 0.4.x requires its
# `convention` argument, which it ignores. Its `OpaqueTraceState` compares the
# innermost trace by (weak) reference on every one of those versions.
def current_trace() -> object:
    """An identity for the innermost active trace, comparable with `==`."""
    return _opaque_trace_state()


def _unknown_trace() -> object:  # pragma: no cover - a JAX without either hook
    # Every use then counts as nested: correct, at the cost of isolating
    # (or, without isolation, embedding) every trace.
    return object()


def _find_opaque_trace_state() -> Callable[[], object]:
    public = getattr(jax.extend.core, "get_opaque_trace_state", None)
    if public is not None:
        return public  # type: ignore[no-any-return]
    try:
        from jax._src import core as _core
    except ImportError:  # pragma: no cover - newer JAX layouts
        return _unknown_trace
    private = getattr(_core, "get_opaque_trace_state", None)
    if private is None:  # pragma: no cover - a JAX older than 0.4.36
        return _unknown_trace
    return lambda: private(None)


_opaque_trace_state: Callable[[], object] = _find_opaque_trace_state()

# False where neither hook exists: `frozenconst.jit` then traces every function
# twice (the second time isolated), and warns once.
trace_identity = _opaque_trace_state is not _unknown_trace


# `jax.clear_caches()` calls `cache_clear()` on every cache registered with
# `jax.extend.backend.register_backend_cache` (public from jax 0.7, an alias of
# `jax._src.util.register_cache`; checked on jax 0.7.2, 0.8.0, 0.10.2 and 0.12.0.1).
# `frozenconst.jit` registers its table of constants per static configuration
# there, so that after `clear_caches()` it holds what `jax.jit` holds: nothing.
# Before jax 0.7 (checked on 0.4.38 and 0.6.2) `clear_caches()` calls every
# callable in the private `jax._src.util.cache_clearing_funs`, a WeakSet; the
# bound `cache_clear` put there is kept alive by the cache itself, so it lives
# exactly as long as the cache. Without either, the table lives as long as the
# function (and so do constants reached only through its static arguments).
def on_clear_caches(cache: Any, what: str) -> bool:
    """Have `jax.clear_caches()` call `cache.cache_clear()`; False if this JAX cannot."""
    register = getattr(jax.extend.backend, "register_backend_cache", None)
    if register is not None:
        register(cache, what)
        return True
    try:
        from jax._src import util as _util
    except ImportError:  # pragma: no cover - newer JAX layouts
        return False
    funs = getattr(_util, "cache_clearing_funs", None)
    if funs is None:  # pragma: no cover - a JAX without either hook
        return False
    clear = cache.cache_clear
    try:
        cache._frozenconst_cache_clear = clear  # the WeakSet holds it only while the cache lives
    except AttributeError:  # pragma: no cover - a cache without a __dict__
        return False
    funs.add(clear)
    return True


# Source locations JAX records (and shows in errors and `frozenconst.audit`)
# should point at the user's code, not at frozenconst's operator forwarding.
# JAX hides its own frames the same way.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
source_info_util.register_exclusion(PACKAGE_DIR)


# Tracebacks. An error raised through a JAX API (a `jax.jit` function, a
# `jax.numpy` call) leaves that API through its boundary
# (`traceback_util.api_boundary`), which removes JAX's internal frames from the
# traceback as `JAX_TRACEBACK_FILTERING` / `jax.config.jax_traceback_filtering`
# says ("auto", "tracebackhide", "remove_frames", "quiet_remove_frames", "off").
# `jax._src.traceback_util.register_exclusion(path)` makes it treat the frames
# of files under `path` as its own: frozenconst's frames below a JAX boundary
# (the function `frozenconst.jit` traces, a FrozenConst's operators) are then
# removed, kept or marked exactly as JAX's are. frozenconst's frames above
# JAX's boundary (`JitWrapped.__call__`) are dropped by `_tracebacks`, which
# reads the mode (`_filtering_mode`, "auto" resolved as JAX resolves it) and
# JAX's marks on an error it filtered: its note (`_simplified_tb_msg`, quiet
# mode) or its `UnfilteredStackTrace` cause (remove_frames mode).
# Private, no public alternative; all four names checked on jax 0.6.2, 0.9.2,
# 0.10.2 and 0.12.0.1. Fallback: nothing registered, and `traceback_filtering`
# answers "off": frozenconst's frames stay (correct, only longer).
def _find_traceback_util() -> Any:
    try:
        from jax._src import traceback_util
    except ImportError:  # pragma: no cover - newer JAX layouts
        return None
    needed = ("register_exclusion", "_filtering_mode", "_simplified_tb_msg", "UnfilteredStackTrace")
    if not all(hasattr(traceback_util, name) for name in needed):  # pragma: no cover - newer JAX
        return None
    traceback_util.register_exclusion(PACKAGE_DIR)
    return traceback_util


_traceback_util: Any = _find_traceback_util()


def traceback_filtering() -> str:
    """JAX's traceback filtering mode now ("auto" resolved), or "off" where this JAX cannot say."""
    if _traceback_util is None:  # pragma: no cover - a JAX without the hooks
        return "off"
    mode: str = _traceback_util._filtering_mode()
    return mode


def jax_filtered(err: BaseException) -> bool:
    """Whether a JAX API boundary removed its frames from `err`'s traceback (JAX's marks on it)."""
    if _traceback_util is None:  # pragma: no cover - a JAX without the hooks
        return False
    note: str = _traceback_util._simplified_tb_msg
    if any(isinstance(n, str) and note in n for n in getattr(err, "__notes__", ())):
        return True
    return isinstance(err.__cause__, _traceback_util.UnfilteredStackTrace)


Tracer: type = jax.core.Tracer


# The class of JAX's concrete arrays: private `jax._src.array.ArrayImpl` (checked on
# jax 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1); making an array to ask its type would
# start a backend at import. Two uses: its public attributes, which it adds to
# `jax.Array`'s (`devices`, `is_ready`, `weak_type`, `aval`, `unsafe_buffer_pointer`,
# ...; `array_attributes`), and its operator functions, which an operator on a
# FrozenConst calls directly where the buffer is a concrete array, without looking
# them up by name on each use (`_frozen._forward_binary`). Fallback: None, so
# `jax.Array`'s names only (the API its stubs declare), and operators that look
# their function up by name.
def _find_array_impl() -> type | None:
    try:
        from jax._src.array import ArrayImpl
    except ImportError:  # pragma: no cover - newer JAX layouts
        return None
    found: type = ArrayImpl
    return found


ArrayImpl: type | None = _find_array_impl()


# The public attributes a `jax.Array` answers: `jax.Array`'s, its instances' class's,
# and (`tracers`) a tracer's, what a FrozenConst derived inside a transformation
# wraps. `FrozenConst` forwards each to its buffer with a property of its own, not
# with `__getattr__`: a class with `__getattr__` makes every attribute read on its
# instances slower, its own slots' included, which was a fifth of what a cache hit
# cost beyond the one-slot floor (issue #26).
def array_attributes(tracers: bool = True) -> frozenset[str]:
    """The public attribute names of `jax.Array`, its instances' class and (`tracers`) tracers."""
    classes = [c for c in (jax.Array, ArrayImpl, Tracer if tracers else None) if c is not None]
    return frozenset(n for c in classes for n in dir(c) if not n.startswith("_"))


# The tracers of JAX's autodiff, so that a FrozenConst can be a constant to it
# (`FrozenConst.tree_unflatten` stops their gradient) without changing the
# programs of any other transformation: private `jax._src.interpreters.ad`'s
# `JVPTracer` and `LinearizeTracer` (checked on jax 0.6.2, 0.9.2, 0.10.2 and
# 0.12.0.1). Without them, every tracer (the same gradients, with a
# `stop_gradient` in every traced program that takes a FrozenConst).
def _find_ad_tracers() -> tuple[type, ...]:
    try:
        from jax._src.interpreters import ad
    except ImportError:  # pragma: no cover - newer JAX layouts
        return (Tracer,)
    found = tuple(t for t in (getattr(ad, "JVPTracer", None), getattr(ad, "LinearizeTracer", None)) if t)
    return found if len(found) == 2 else (Tracer,)


DIFFERENTIATED: tuple[type, ...] = _find_ad_tracers()


# --- FrozenConst's type where JAX asks for it (`core.typeof`) ---
# Reason: a few jax.numpy functions ask JAX for the type of an argument before
# converting it: `jnp.bincount(x, weights)` reads `core.typeof(weights).sharding`
# (jax 0.10.2 and 0.12.0.1 `numpy/lax_numpy.py`). `typeof` looks the value's
# class up in the private table `jax._src.core.pytype_aval_mappings` (class ->
# function returning the value's aval; the same on 0.6.2, 0.9.2, 0.10.2 and
# 0.12.0.1) and refuses any other object with `__jax_array__`: "Triggering
# __jax_array__() during abstractification is no longer supported" (issue #26).
# Registered there, a FrozenConst's type is that of `x.__jax_array__()`: its
# cached buffer's, or inside `frozenconst.jit` its parameter's. No public hook
# answers `typeof`.
# And `jax.lax`'s operands (issue #35: `lax.dynamic_slice(table, (pos, 0), ...)`, how
# a decoder reads a rotary table). On jax 0.10.2 and 0.12.0.1 `Primitive.bind`
# passes each operand through `jax._src.dtypes.canonicalize_value` before it asks
# `typeof`; that function looks the operand's class up in a table of handlers
# (`register_canonicalize_value_handler`, in jaxlib's C++ there; a plain dict,
# `canonicalize_value_handlers`, in older jaxlibs of the same JAX) and refuses any
# other `__jax_array__` object. Registered there too, a FrozenConst operand becomes
# `x.__jax_array__()`, as `jnp` converts it: its cached buffer, or inside
# `frozenconst.jit` its parameter. JEP 28661 leaves `jax.lax` to refuse such objects
# by default; a library that registers its type is what it asks for. On 0.9.2
# `bind` asks `typeof` alone: registered, it would take the FrozenConst itself as an
# operand and fail later in other words ("No constant handler"); on 0.6.2 `typeof`
# converts such an object itself, with a DeprecationWarning. There, and on any other
# layout, nothing is registered (the fallback): `jax.lax` and the functions that ask
# `typeof` first refuse a FrozenConst, as docs/jax.md lists; inside `frozenconst.jit`
# the refusal is frozenconst's own error (`_refusals`), and `jnp.asarray(x)` at the
# call is the fix.
def _find_aval_table() -> dict[type, Callable[[Any], Any]] | None:
    try:
        from jax._src import core as _core
        from jax._src import dtypes as _dtypes
    except ImportError:  # pragma: no cover - newer JAX layouts
        return None
    table = getattr(_core, "pytype_aval_mappings", None)
    bind = getattr(getattr(_core, "Primitive", None), "bind", None)
    canonicalize = getattr(_dtypes, "canonicalize_value", None)
    code = getattr(bind, "__code__", None)
    if not isinstance(table, dict) or canonicalize is None or code is None:
        return None
    if not {"dtypes", "canonicalize_value", "typeof"} <= set(code.co_names):
        return None  # `bind` does not refuse `__jax_array__` objects before asking their type

    class _ArrayLike:  # what `canonicalize_value` must refuse: pure Python, no backend
        def __jax_array__(self) -> Any:  # pragma: no cover - never called
            raise AssertionError

    try:
        canonicalize(_ArrayLike())
    except ValueError:
        return table
    except Exception:  # pragma: no cover - another JAX's answer
        return None
    return None  # pragma: no cover - it took the object


_aval_table = _find_aval_table()


def register_array_type(cls: type, to_array: Callable[[Any], Any]) -> bool:
    """Have JAX's `core.typeof(x)` answer, for an instance of `cls`, the type of `to_array(x)`,
    and `jax.lax` take `to_array(x)` for an operand `x`. False where this JAX gets nothing
    registered (see above)."""
    if _aval_table is None:
        return False
    typeof = jax.typeof  # public wherever the table is found (jax >= 0.10)

    def aval(x: Any) -> Any:
        return typeof(to_array(x))

    _aval_table[cls] = aval
    from jax._src import dtypes as _dtypes

    register = getattr(_dtypes, "register_canonicalize_value_handler", None)
    if callable(register):
        register(cls, to_array)
    else:  # pragma: no cover - a jaxlib older than its JAX's C++ table
        _dtypes.canonicalize_value_handlers[cls] = to_array
    return True


# --- page-locked host buffers (issue #28, docs/host-memory.md) ---
# Whether a device offers page-locked host memory: public
# `Device.addressable_memories()`, the memory kinds it addresses. On the CPU
# backend jax 0.9.2, 0.10.2 and 0.12.0.1 list `device`, `pinned_host` and
# `unpinned_host`; jax 0.6.2 lists only `unpinned_host`. Fallback: a device
# without the method offers none, so constants stay in pageable memory (and an
# explicit `host_memory="pinned"` says so once, see `_host.pinning_device`).
def offers_pinned_host(device: Device) -> bool:
    """Whether `device` addresses `pinned_host` memory (asked once per device)."""
    key: Any = device  # every real device is hashable; the `Device` protocol does not say so
    return _offers_pinned_host(key)


@functools.cache
def _offers_pinned_host(device: Any) -> bool:
    memories = getattr(device, "addressable_memories", None)
    if memories is None:  # pragma: no cover - every supported JAX has it
        return False
    return any(m.kind == "pinned_host" for m in memories())


# Whether JAX's backends have started, asked without starting them:
# `host_memory="auto"` consults the default device only then, so that building a
# constant never starts a backend (`jax.distributed.initialize` and
# `jax_num_cpu_devices` must come before that). Private
# `jax._src.xla_bridge.backends_are_initialized` (checked on jax 0.6.2, 0.9.2,
# 0.10.2 and 0.12.0.1); no public alternative (`jax.devices()` starts them).
# Fallback: never started, so `auto` keeps constants pageable (`pinned` still pins).
def _find_backends_started() -> Callable[[], bool]:
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - newer JAX layouts
        return lambda: False
    found: Any = getattr(xla_bridge, "backends_are_initialized", None)
    if not callable(found):  # pragma: no cover - every supported JAX has it
        return lambda: False
    return lambda: bool(found())


backends_started: Callable[[], bool] = _find_backends_started()


# A default-device buffer made from a page-locked host buffer must stay
# uncommitted, as `jnp.asarray(np_array)` is (it follows `jax.default_device` and
# combines with arrays on any device). `jax.device_put` of a `jax.Array` to a
# sharding always commits its result (`_device_put_sharding_impl` in
# jax/_src/dispatch.py), and no public call makes an uncommitted array of an
# existing buffer. Private: `jax._src.array.ArrayImpl(aval, sharding, [buffer],
# committed=False)` wraps the same device buffer, uncommitted (checked on jax
# 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1; tried once, on first need). Fallback: None,
# and the caller transfers from the NumPy view of the host buffer, which JAX
# reads as pageable memory (correct, at pageable speed), saying so once.
_uncommitted_impl: Callable[..., Any] | None = None
_uncommitted_tried = False


def uncommitted(array: Any) -> Any:
    """`array` (a committed single-device `jax.Array`) uncommitted, over the same buffer; or None."""
    global _uncommitted_impl, _uncommitted_tried
    if not _uncommitted_tried:
        _uncommitted_tried = True
        try:
            from jax._src.array import ArrayImpl

            _uncommitted_impl = ArrayImpl
        except ImportError:  # pragma: no cover - newer JAX layouts
            _uncommitted_impl = None
    if _uncommitted_impl is None:
        return None
    try:
        made = _uncommitted_impl(array.aval, array.sharding, [array], committed=False)
    except Exception:  # a changed private constructor: any failure means "cannot"
        _uncommitted_impl = None
        return None
    if made.committed or made.unsafe_buffer_pointer() != array.unsafe_buffer_pointer():  # pragma: no cover
        _uncommitted_impl = None
        return None
    return made


# A constant made from a Python scalar (`FrozenConst(0.5)`, `FrozenConst(3)`) is weakly
# typed, as `jnp.asarray(0.5)` is: `x * bf16_array` stays bfloat16 (issue #37). Its device
# buffer must then carry JAX's weak type, which decides the promotion everywhere JAX meets it
# (eager operators, `jax.numpy` calls, jit arguments, closed over, `frozenconst.jit`'s
# parameters, `core.typeof`). `jax.device_put` of NumPy data makes a strong array, and no
# public call marks an existing array weak (`jax.device_put(0.5)` is weak but takes the
# dtype of the Python scalar under the x64 setting now, which can differ from the
# constant's). Private: `jax._src.array.ArrayImpl(aval.update(weak_type=True), sharding,
# per-device buffers, committed=...)` wraps the same device buffers (the class `ArrayImpl`
# above; checked on jax 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1, on one device and two). Fallback:
# the strong array (the promotion of `jnp.asarray(np.float32(0.5))`), said once.
def weakly_typed(array: Any) -> Any:
    """`array` (a concrete `jax.Array`) marked weakly typed, over the same device buffers."""
    if ArrayImpl is not None:
        try:
            shards = [shard.data for shard in array.addressable_shards]
            aval = array.aval.update(weak_type=True)
            made = ArrayImpl(aval, array.sharding, shards, committed=array.committed)
        except Exception:  # a changed private constructor: any failure means "cannot"
            made = None
        if made is not None and made.weak_type:
            return made
    warn_degraded(  # pragma: no cover - every supported JAX takes it
        f"frozenconst cannot mark a device buffer weakly typed on jax {jax.__version__}: a "
        "FrozenConst of a Python scalar promotes as `jnp.asarray(np.float32(0.5))`, not as "
        "`jnp.asarray(0.5)`. Give it the dtype you compute with."
    )
    return array  # pragma: no cover


# The concrete mesh set by `jax.set_mesh` (or, before jax 0.7.2, by the
# context manager `jax.sharding.use_mesh`), for a bare PartitionSpec and for a
# constant that follows a multi-device computation's mesh.
# Public: `jax.sharding.get_mesh` (jax >= 0.8; checked on 0.8.3, 0.10.2 and
# 0.12.0.1). But inside a trace (a `jax.jit`, `grad` or `vmap` around
# frozenconst code, or `x.on(P(...))` inside a jitted function) it raises
# "`get_mesh` can only be used outside of `jax.jit`". What it returns there is
# `jax._src.mesh.get_concrete_mesh()` (jax 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1),
# the config state `device_context`, which is part of every jit cache key
# (`include_in_jit_key`), so reading it while tracing is safe: the program is
# cached per mesh. Fallback where neither exists: no mesh, so a bare
# PartitionSpec is refused with an error that names `NamedSharding(mesh, spec)`.
_concrete_mesh: Callable[[], Any] | None
try:
    from jax._src.mesh import get_concrete_mesh as _concrete_mesh
except ImportError:  # pragma: no cover - every supported JAX has it
    _concrete_mesh = None


def active_mesh() -> Any:
    """The concrete mesh set in this thread, or None."""
    get_mesh = getattr(jax.sharding, "get_mesh", None)
    mesh: Any = None
    try:
        if get_mesh is not None:
            mesh = get_mesh()
        elif _concrete_mesh is not None:
            mesh = _concrete_mesh()
    except ValueError:  # inside a trace
        mesh = None if _concrete_mesh is None else _concrete_mesh()
    return mesh if isinstance(mesh, jax.sharding.Mesh) and not mesh.empty else None


# `jax.export.export(f)` calls `f.trace(*specs).lower(..., _private_parameters=
# mlir.LoweringParameters(for_export=True, ...))`, then reads the lowered
# stage's private `_lowering` (jax 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1, in
# `jax/_src/export/_export.py`). The keyword tells frozenconst.jit's traced
# stage that the program will be serialized, so it lowers `jax.jit(f)` with the
# constants in it. Fallback, if JAX renames it: the stage raises a
# FrozenConstTypeError naming `jax.jit(f.__wrapped__)` when `_lowering` is read.
EXPORT_LOWERING = "_private_parameters"


# `jnp.issubdtype` places an ml_dtypes number type (float6_e2m3fn, int2, ...)
# among the floats or integers only from the JAX release that names it: jax
# 0.6.2 answers neither for float6 (kind "V"), so frozenconst would take float6
# data for non-numbers and refuse to convert it (`dtype=np.float32`). The
# public alternative is ml_dtypes' own `finfo`/`iinfo` (ml_dtypes >= 0.4, which
# every JAX from 0.4.38 requires), asked only when JAX does not know the type.
def ml_dtypes_category(dtype: Any) -> str:
    """`f` or `i` for a floating or integer ml_dtypes type, else an empty string."""
    if getattr(dtype.type, "__module__", "") != "ml_dtypes":
        return ""
    import ml_dtypes

    for category, info in (("f", ml_dtypes.finfo), ("i", ml_dtypes.iinfo)):
        try:
            info(dtype)
        except (TypeError, ValueError):
            continue
        return category
    return ""


# JAX's constant pipeline, read once at import as JAX itself reads it (jax
# 0.10.2 `array.py` makes `ArrayImpl` a literal type at import when it is on).
# `jax_use_simplified_jaxpr_constants` exists from jax 0.7; before, only the
# default pipeline exists.
SIMPLIFIED_CONSTANTS = bool(getattr(jax.config, "jax_use_simplified_jaxpr_constants", False))


# --- no_numpy_constants: seeing each program JAX lowers (used by _guard.py) ---
# Reason: the guard must see every constant of every program JAX compiles,
# as data. JAX's captured-constants report (`jax_captured_constants_warn_bytes`)
# is text and names only the five largest constants of a program
# (`heapq.nlargest(5, ...)` in `mlir.check_jaxpr_constants`).
# Public alternative: none that carries the program. `jax.monitoring`
# listeners get an event name, a duration and str/int keywords; JAX's
# `util.test_event("lower_jaxpr_to_module")` gets no arguments.
# The hook: `jax._src.interpreters.mlir.lower_jaxpr_to_module(module_name,
# jaxpr, *, ...)` lowers every top-level program: `jax.jit` (also nested, scan
# bodies, `.lower()`, eager primitives) and `pmap` reach it from
# `pxla._cached_lowering_to_hlo` as `mlir.lower_jaxpr_to_module` (jax 0.10.2:
# mlir.py:1287, pxla.py:736; jax 0.12.0.1: mlir.py:1374, pxla.py:756), and
# custom partitioners from `mlir.build_mlir_module_helper` by global name, so
# replacing the module attribute reaches both. Its second argument is the whole
# closed program: a `ClosedJaxpr` on 0.10.2, a `Jaxpr` carrying its `consts` on
# 0.12.0.1; both keep a closed-over array as a const (default pipeline) or a
# `Literal` (simplified pipeline), with nested programs in equation params.
# Fallback: `LOWERING_HOOK` is None when the function is missing; the guard
# then warns that it checks nothing (FrozenConstWarning) instead of passing.
def _find_lowering_hook() -> tuple[Any, str] | None:
    try:
        from jax._src.interpreters import mlir
    except ImportError:  # pragma: no cover - newer JAX layouts
        return None
    if not callable(getattr(mlir, "lower_jaxpr_to_module", None)):  # pragma: no cover - newer JAX
        return None
    return mlir, "lower_jaxpr_to_module"


LOWERING_HOOK: tuple[Any, str] | None = _find_lowering_hook()


def lowered_program(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The program in a call to the lowering hook (its `jaxpr` argument), or None."""
    program = args[1] if len(args) > 1 else kwargs.get("jaxpr")
    return program if hasattr(program, "eqns") or hasattr(program, "jaxpr") else None


# Which of a program's constants the lowering copies into it. A constant of the closed
# program (`consts`, the default pipeline's form of a closed-over array, at any level of
# nesting) always. A `Literal` array (the simplified pipeline's form) only where nothing is
# hoisted as an executable argument: the keyword `num_const_args` (jax >= 0.7) counts the
# hoisted ones, 0 when exporting (`jax.export` serializes a program that carries its
# constants) or when the program has none; JAX embeds literals of at most
# `jax_embedded_constants_max_bytes` (32) too, far below any size frozenconst warns of
# (jax 0.9.2, 0.10.2 and 0.12.0.1: `core.jaxpr_const_args`, `mlir.lower_jaxpr_to_module`;
# measured by the HLO's size there). jax 0.6.2 has no such keyword and no literal arrays.
def lowering_embeds_literals(kwargs: dict[str, Any]) -> bool:
    """Whether the lowering called with `kwargs` copies a program's literal arrays into it."""
    hoisted: int = kwargs.get("num_const_args", 0)
    return hoisted == 0


# --- end of no_numpy_constants block ---


# Whether no trace is active in this thread: a FrozenConst's static index or slice
# (`x[:8]`, `x[3]`) inside a trace is taken from the frozen host data, as NumPy slices
# an array there, rather than from the whole device buffer, which a `jax.jit` trace
# would capture and JAX's default pipeline embed in full (issue #35). Private
# `jax._src.core.trace_ctx.is_top_level()` (checked on jax 0.6.2, 0.9.2, 0.10.2 and
# 0.12.0.1; about 0.2 us); the public `jax.core.trace_state_clean` is deprecated on
# 0.6.2 and gone after. Fallback: always at the top level, so indexing stays JAX's own
# (the whole constant is embedded, and the embedding warning says so).
def _find_top_level() -> Callable[[], bool]:
    try:
        from jax._src import core as _core
    except ImportError:  # pragma: no cover - newer JAX layouts
        return lambda: True
    context = getattr(_core, "trace_ctx", None)
    found = getattr(context, "is_top_level", None)
    if not callable(found):  # pragma: no cover - other JAX
        return lambda: True
    return found  # type: ignore[no-any-return]


top_level: Callable[[], bool] = _find_top_level()


# A warning about what a user's own line did (an optimizer's `init` that made a
# derived copy, a donation) names that line: the frames of these packages are
# skipped, so Python shows it once per such line, not once per tree operation
# inside them. (Python 3.12's `warnings.warn(skip_file_prefixes=...)` does the same
# by file; 3.11 has no such argument.)
_LIBRARIES = frozenset({"jax", "jaxlib", "frozenconst", "optax", "equinox", "flax", "chex", "orbax"})


def user_stacklevel() -> int:
    """The `stacklevel` that makes the caller's `warnings.warn` name the first frame outside
    JAX, frozenconst and the training libraries."""
    here = inspect.currentframe()
    level, frame = 1, None if here is None else here.f_back
    while frame is not None:
        if frame.f_globals.get("__name__", "").partition(".")[0] not in _LIBRARIES:
            return level
        level += 1
        frame = frame.f_back
    return level


# The frame `depth` calls up the stack: CPython's `sys._getframe`, bound here once. Public in
# spirit (`inspect.currentframe` is built on it, and `sys._getframe` is documented), it is the
# C function itself, no Python frame of its own: `FrozenConst.tree_unflatten` reads the
# frame of the code that called JAX's tree function on every derived copy (issue #35).
# Every supported interpreter (CPython 3.11 to 3.13) has it.
frame_at: Callable[[int], types.FrameType] = sys._getframe  # pyright: ignore[reportPrivateUsage]


def library_of(frame: types.FrameType) -> str:
    """The library among `_LIBRARIES` whose code `frame` runs (its top-level package), or an
    empty string for a user's frame."""
    package: str = frame.f_globals.get("__name__", "").partition(".")[0]
    return package if package in _LIBRARIES else ""


# The concrete arrays the innermost trace has captured so far (closed over, read
# from a global): what JAX's default constant pipeline embeds in the program.
# `frozenconst.jit` names the large ones it did not keep out (issue #25). Private
# `jax._src.core.trace_ctx.trace.frame.constvar_to_val` (a dict of constvar to
# value; checked on jax 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1, where NumPy values
# are wrapped as `TypedNdArray` views from 0.9 on); empty under the simplified
# pipeline, which hoists them instead. Without it: no list, and no warning.
def captured_arrays() -> list[Any]:
    """The concrete values the innermost active trace closed over so far (none where unknown)."""
    trace = None if _trace_object is None else _trace_object()
    consts = getattr(getattr(trace, "frame", None), "constvar_to_val", None)
    if not isinstance(consts, dict):
        return []
    return list(consts.values())
