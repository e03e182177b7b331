"""The few places where frozenconst reads JAX internals, each with a reason and a fallback.

Everything version-dependent lives here so that the rest of the package reads
like plain JAX.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.core
import jax.extend.core
import jax.sharding
import numpy as np
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
# Public in `jax.core` (jax 0.8.1 to 0.12).
# Fallback: `jax.ensure_compile_time_eval()`, under which `jax.device_put` of
# host data is eager too under `jit`, `vmap`, `grad` and `eval_shape` (checked
# on the same versions); the cache never keeps a tracer in any case.
eval_context: Callable[[], contextlib.AbstractContextManager[Any]] = getattr(
    jax.core, "eval_context", jax.ensure_compile_time_eval
)


# Source locations JAX records (and shows in errors and `frozenconst.audit`)
# should point at the user's code, not at frozenconst's operator forwarding.
# JAX hides its own frames the same way.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


# Tracebacks. An error raised through a JAX API (a `jax.jit` function, a
# `jax.numpy` call) leaves that API through its boundary
# (`traceback_util.api_boundary`), which removes JAX's internal frames from the
# traceback as `JAX_TRACEBACK_FILTERING` / `jax.config.jax_traceback_filtering`
# says ("auto", "tracebackhide", "remove_frames", "quiet_remove_frames", "off").
# `jax._src.traceback_util.register_exclusion(path)` makes it treat the frames
# of files under `path` as its own: frozenconst's frames below a JAX boundary
# (the function `frozenconst.jit` traces, a FrozenConst's operators) are then
# removed, kept or marked exactly as JAX's are. frozenconst's frames above
# JAX's boundary (`JitWrapped.__call__`) are dropped by `_frames`, which
# reads the mode (`_filtering_mode`, "auto" resolved as JAX resolves it) and
# JAX's marks on an error it filtered: its note (`_simplified_tb_msg`, quiet
# mode) or its `UnfilteredStackTrace` cause (remove_frames mode).
# Private, no public alternative; all four names in jax 0.8.1 to
# 0.12. Fallback: nothing registered, and `traceback_filtering`
# answers "off": frozenconst's frames stay (correct, only longer).
def _find_traceback_util() -> Any:
    try:
        from jax._src import traceback_util
    except ImportError:  # pragma: no cover - newer JAX layouts
        return None
    needed = ("register_exclusion", "_filtering_mode", "_simplified_tb_msg", "UnfilteredStackTrace")
    if not all(hasattr(traceback_util, name) for name in needed):  # pragma: no cover - newer JAX
        return None
    return traceback_util


_traceback_util: Any = _find_traceback_util()


def exclude_package_frames() -> None:
    """Have JAX treat frozenconst's frames as its own, in source locations and tracebacks
    (`_install.install` calls it once)."""
    source_info_util.register_exclusion(PACKAGE_DIR)
    if _traceback_util is not None:
        _traceback_util.register_exclusion(PACKAGE_DIR)


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


# The class of JAX's concrete arrays: private `jax._src.array.ArrayImpl` (jax 0.8.1
# to 0.12); making an array to ask its type would
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
# cost beyond the one-slot floor.
def array_attributes(tracers: bool = True) -> frozenset[str]:
    """The public attribute names of `jax.Array`, its instances' class and (`tracers`) tracers."""
    classes = [c for c in (jax.Array, ArrayImpl, Tracer if tracers else None) if c is not None]
    return frozenset(n for c in classes for n in dir(c) if not n.startswith("_"))


# The tracers of JAX's autodiff, so that a FrozenConst can be a constant to it
# (`FrozenConst.tree_unflatten` stops their gradient) without changing the
# programs of any other transformation: private `jax._src.interpreters.ad`'s
# `JVPTracer` and `LinearizeTracer` (jax 0.8.1 to
# 0.12). Without them, every tracer (the same gradients, with a
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
# __jax_array__() during abstractification is no longer supported".
# Registered there, a FrozenConst's type is that of `x.__jax_array__()`: its
# cached buffer's, or inside `frozenconst.jit` its parameter's. No public hook
# answers `typeof`.
# And `jax.lax`'s operands (`lax.dynamic_slice(table, (pos, 0), ...)`, how
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


# --- page-locked host buffers (docs/host-memory.md) ---
# Whether a device offers page-locked host memory: public
# `Device.addressable_memories()`, the memory kinds it addresses. On the CPU
# backend jax 0.9.2, 0.10.2 and 0.12.0.1 list `device`, `pinned_host` and
# `unpinned_host`; jax 0.6.2 lists only `unpinned_host`. Fallback: a device
# without the method offers none, so constants stay in pageable memory (and an
# explicit `host_memory="pinned"` says so once, see `_host_memory.Pinned`).
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


# Whether a trace is active: a host-resident constant indexed inside a compiled program
# (`x[i]`) is sliced in host memory and only the slice moved to the device, where the same
# indexing done eagerly would run on host memory, which an accelerator's programs may not
# compute on (XLA offloads only copies and slices there). Private:
# `jax._src.core.trace_state_clean()`, False while `jit`, `grad`, `vmap`, `scan` trace (jax
# 0.8.1 to 0.12). Fallback: "not tracing", so indexing moves the whole constant to the
# device first, then indexes it: the same values, more device memory.
def _find_trace_state_clean() -> Callable[[], bool] | None:
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover - every supported JAX has it
        return None
    found: Callable[[], bool] = trace_state_clean
    return found


_TRACE_STATE_CLEAN = _find_trace_state_clean()


def tracing() -> bool:
    """Whether a JAX trace (`jit`, `grad`, `vmap`, a loop body) is active in this thread."""
    return _TRACE_STATE_CLEAN is not None and not _TRACE_STATE_CLEAN()


# A default-device buffer made from a page-locked host buffer must stay
# uncommitted, as `jnp.asarray(np_array)` is (it follows `jax.default_device` and
# combines with arrays on any device). `jax.device_put` of a `jax.Array` to a
# sharding always commits its result (`_device_put_sharding_impl` in
# jax/_src/dispatch.py), and no public call makes an uncommitted array of an
# existing buffer. Private: `jax._src.array.ArrayImpl(aval, sharding, [buffer],
# committed=False)` wraps the same device buffer, uncommitted (jax 0.8.1 to 0.12; the
# class `ArrayImpl` found above). Fallback: None,
# and the caller transfers from the NumPy view of the host buffer, which JAX
# reads as pageable memory (correct, at pageable speed), saying so once.
class _Uncommitted:
    """Whether JAX's private constructor still makes an uncommitted twin: False after its first
    failure, which is not tried again."""

    works = True


_UNCOMMITTED = _Uncommitted()


def uncommitted(array: Any) -> Any:
    """`array` (a committed single-device `jax.Array`) uncommitted, over the same buffer; or None."""
    impl = ArrayImpl
    if impl is None or not _UNCOMMITTED.works:
        return None
    try:
        made = impl(array.aval, array.sharding, [array], committed=False)
    except Exception:  # a changed private constructor: any failure means "cannot"
        _UNCOMMITTED.works = False
        return None
    if made.committed or made.unsafe_buffer_pointer() != array.unsafe_buffer_pointer():  # pragma: no cover
        _UNCOMMITTED.works = False
        return None
    return made


# A constant made from a Python scalar (`FrozenConst(0.5)`, `FrozenConst(3)`) is weakly
# typed, as `jnp.asarray(0.5)` is: `x * bf16_array` stays bfloat16. Its device
# buffer must then carry JAX's weak type, which decides the promotion everywhere JAX meets it
# (eager operators, `jax.numpy` calls, jit arguments, closed over, `frozenconst.jit`'s
# parameters, `core.typeof`). `jax.device_put` of NumPy data makes a strong array, and no
# public call marks an existing array weak (`jax.device_put(0.5)` is weak but takes the
# dtype of the Python scalar under the x64 setting now, which can differ from the
# constant's). Private: `jax._src.array.ArrayImpl(aval.update(weak_type=True), sharding,
# per-device buffers, committed=...)` wraps the same device buffers (the class `ArrayImpl`
# above; jax 0.8.1 to 0.12, on one device and two). Fallback:
# the strong array (the promotion of `jnp.asarray(np.float32(0.5))`), said once.
def weakly_typed(array: Any) -> Any | None:
    """`array` (a concrete `jax.Array`) marked weakly typed, over the same device buffers; None
    where this JAX cannot."""
    if ArrayImpl is not None:
        try:
            shards = [shard.data for shard in array.addressable_shards]
            aval = array.aval.update(weak_type=True)
            made = ArrayImpl(aval, array.sharding, shards, committed=array.committed)
        except Exception:  # a changed private constructor: any failure means "cannot"
            made = None
        if made is not None and made.weak_type:
            return made
    return None  # pragma: no cover - every supported JAX takes it


# The concrete mesh set by `jax.set_mesh` (or, before jax 0.7.2, by the
# context manager `jax.sharding.use_mesh`), for a bare PartitionSpec and for a
# constant that follows a multi-device computation's mesh.
# Public: `jax.sharding.get_mesh` (jax >= 0.8). But inside a trace (a `jax.jit`, `grad` or `vmap` around
# frozenconst code, or `x.on(P(...))` inside a jitted function) it raises
# "`get_mesh` can only be used outside of `jax.jit`". What it returns there is
# `jax._src.mesh.get_concrete_mesh()` (jax 0.8.1, 0.9.2, 0.10.2 and 0.12.0.1),
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


# The frame `depth` calls up the stack: CPython's `sys._getframe`, bound here once. Public in
# spirit (`inspect.currentframe` is built on it, and `sys._getframe` is documented), it is the
# C function itself, no Python frame of its own: a rebuilt leaf reads the frame of the code
# that called JAX's tree function on every derived copy (`_derived.rebuild`).
# Every supported interpreter (CPython 3.11 to 3.13) has it.
frame_at: Callable[[int], types.FrameType] = sys._getframe  # pyright: ignore[reportPrivateUsage]


# The module of JAX's jit in Python (`pjit`), whose frame is on the stack at a jitted function's
# first call: the derived-copy warning names "your jitted function" as the copy's maker there.
# Private: `jax._src.pjit`, the module since JAX 0.4; elsewhere nothing matches, and the warning
# gives its general advice.
JIT_MODULE = "jax._src.pjit"


# The modules whose code rebuilds the arguments of a callback from the values the program
# passed it (`tree_unflatten(in_tree, args)`): `jax.debug.print` and `jax.debug.callback`'s
# (`jax._src.debugging`), `jax.pure_callback` and `jax.experimental.io_callback`'s
# (`_FlatCallback.__call__` in `jax._src.callback`). There a FrozenConst's new array is the value
# the callback receives, as a `jax.Array`'s is, not a copy of the constant to warn of. Private:
# the modules since JAX 0.4 (jax 0.8.1 to 0.12 checked); elsewhere nothing matches, and the
# callback receives a derived copy, with the warning.
DEBUG_CALLBACKS = frozenset({"jax._src.debugging", "jax._src.callback"})


# --- keeping constants out of programs at lowering (`_hoist`, `_install`) ---
# Reason: under JAX's default constant pipeline, a `jax.jit` program (and every wrapper built
# on it: `eqx.filter_jit`, `nnx.jit`, a library's own jit, `pmap`) embeds the data of each array
# it closes over. JAX's own simplified pipeline already knows how to pass a closed-over buffer
# to the executable instead ("hoisted const args", docs/internals/constants.md in the JAX
# repository), kept through the C++ fast path (`MeshExecutableFastpathData.const_args`). A
# FrozenConst's buffer is exactly what that machinery needs, so frozenconst hands JAX's program
# to that machinery with the FrozenConst buffers as literals.
# Private, no public alternative: `jax._src.interpreters.pxla.lower_sharding_computation(
# closed_jaxpr, ..., lowering_parameters=...)`, which lowers every jitted program (reached from
# pjit by module attribute), and `jax._src.core.jaxpr_const_args(jaxpr)`, the list of a
# program's hoisted constants, read through `core.` by pxla, mlir, pjit, lax and shard_map and
# by `core.eqn_params_const_args`. `mlir.LoweringParameters.hoist_constants_as_args` turns the
# hoisting on. The same signatures in jax 0.8.1 to 0.12. Before
# 0.8.1 JAX's own hoisting fails (`pxla.hoist_constants_as_args` raises TypeError on 0.7.1 to
# 0.8.0) or is absent: the supported floor. Fallback where a name is missing (a future
# layout): `HOISTING` is None, nothing is installed, and JAX embeds FrozenConsts as any array,
# which the embedding warning names (`_hoist`).
# A program with mutable references (`jax.new_ref`, a reference argument) is made pure inside
# `lower_sharding_computation` by `pxla._discharge_refs_jaxpr(closed_jaxpr, ...)` (private, its
# first result the new program; the same signature in jax 0.8.1 to 0.12), which traces the
# program again and so turns the literals frozenconst made back into embedded constants under
# the default pipeline: `_hoist.discharged` hoists its result again. Fallback where it is
# missing: `discharge` is None, and a constant such a program uses is embedded and said.
class Hooks:
    """JAX's lowering functions frozenconst wraps, and what reads their arguments."""

    __slots__ = ("const_args", "core", "default_parameters", "discharge", "lower", "mlir", "pxla")

    def __init__(self) -> None:
        from jax._src import core as _core
        from jax._src.interpreters import mlir as _mlir
        from jax._src.interpreters import pxla as _pxla

        self.core: Any = _core
        self.mlir: Any = _mlir
        self.pxla: Any = _pxla
        self.lower: Callable[..., Any] = _pxla.lower_sharding_computation
        self.const_args: Callable[[Any], list[tuple[Any, Any]]] = _core.jaxpr_const_args
        self.discharge: Callable[..., Any] | None = getattr(_pxla, "_discharge_refs_jaxpr", None)
        # What `jax.jit` lowers with: any other parameters (`jax.export`'s `for_export`, a
        # custom lowering rule) are someone's own lowering, left as JAX does it.
        self.default_parameters: Any = _mlir.LoweringParameters()

    @staticmethod
    def donates(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether `lower(closed, *args, **kwargs)` lowers a program that donates an input: its
        seventh argument after `closed`, `donated_invars`, one flag per input."""
        donated = kwargs.get("donated_invars", args[6] if len(args) > 6 else ())
        return any(donated)

    @staticmethod
    def undonated(
        args: tuple[Any, ...], kwargs: dict[str, Any], kept: set[int]
    ) -> tuple[Any, dict[str, Any]]:
        """`lower`'s arguments with the inputs at the positions in `kept` no longer donated."""
        if "donated_invars" in kwargs:
            donated = tuple(d and i not in kept for i, d in enumerate(kwargs["donated_invars"]))
            return args, {**kwargs, "donated_invars": donated}
        donated = tuple(d and i not in kept for i, d in enumerate(args[6]))
        return (*args[:6], donated, *args[7:]), kwargs

    @staticmethod
    def devices_of(args: tuple[Any, ...], kwargs: dict[str, Any], single: bool = False) -> Any:
        """A replicated sharding over the devices a program spans, where it spans several: over
        the mesh of its first input sharding across devices (its third argument after `closed`,
        `in_shardings`, resolved from the call's arguments), else of the context mesh
        (`jax.set_mesh`); None for a program on one device, or (`single`) the device of its first
        input placed on one. The device order is the mesh's, which is the program's device
        assignment (`_device_assignment`, private, on every sharding class; jax 0.8.1
        to 0.12)."""
        in_shardings = kwargs.get("in_shardings", args[2] if len(args) > 2 else ())
        for found in in_shardings:
            if not isinstance(found, jax.sharding.Sharding):
                continue
            if len(found.device_set) < 2:
                if single:
                    (device,) = found.device_set
                    return jax.sharding.SingleDeviceSharding(device)
                continue
            mesh = getattr(found, "mesh", None)
            if not isinstance(mesh, jax.sharding.Mesh):
                try:
                    devices: Any = np.array(found._device_assignment)  # pyright: ignore[reportPrivateUsage]
                except Exception:  # a sharding without an order: the program decides
                    return None
                mesh = jax.sharding.Mesh(devices, ("frozenconst",))
            return jax.sharding.NamedSharding(mesh, _replicated())
        context = kwargs.get("context_mesh")
        if isinstance(context, jax.sharding.Mesh) and not context.empty and context.size > 1:
            return jax.sharding.NamedSharding(context, _replicated())
        return None

    @staticmethod
    def keeping_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
        """`lower`'s keyword arguments with every input of the program kept (`keep_unused`, which
        pjit passes by keyword): an exported program's constant inputs, which its function reads
        as closures and so never uses, are where frozenconst wires the constants; JAX's own VJP
        of an exported program (`Exported.vjp`) is jitted without `keep_unused`."""
        return {**kwargs, "keep_unused": True}

    def replace_discharge(self, wrapped: Callable[..., Any]) -> None:
        """Have JAX's lowering call `wrapped` where it makes a program with mutable references
        pure (`discharge`, above; read through its module at call time)."""
        self.pxla._discharge_refs_jaxpr = wrapped

    def hoisting(self, parameters: Any) -> Any:
        """`parameters` with JAX's hoisting of literal constants switched on."""
        import dataclasses

        return dataclasses.replace(parameters, hoist_constants_as_args=True)


def _replicated() -> jax.sharding.PartitionSpec:
    spec: Callable[[], jax.sharding.PartitionSpec] = jax.sharding.PartitionSpec  # untyped constructor
    return spec()


def clear_caches() -> None:
    """`jax.clear_caches()`: every program JAX compiled is compiled again at its next call."""
    clear: Callable[[], None] = jax.clear_caches  # untyped in JAX's stubs
    clear()


def _find_hooks() -> Hooks | None:
    try:
        hooks = Hooks()
    except (ImportError, AttributeError):  # pragma: no cover - a future JAX layout
        return None
    fields = getattr(type(hooks.default_parameters), "__dataclass_fields__", {})
    if "hoist_constants_as_args" not in fields or not callable(
        getattr(hooks.pxla, "hoist_constants_as_args", None)
    ):
        return None  # pragma: no cover - a JAX before 0.8.1 (below the declared floor)
    return hooks


HOISTING: Hooks | None = _find_hooks()


# JAX's program objects, per version. Up to jax 0.11 a closed program is a `ClosedJaxpr`
# (`.jaxpr`, an open `Jaxpr`, and `.consts`); from 0.12 there is one class, `Jaxpr`, whose
# constants are its first inputs with values attached (`jax.extend.core.ClosedJaxpr` is the
# same class). `Literal` and `Var` are public in `jax.extend.core` (jax 0.8.1
# to 0.12).
Literal: Any = jax.extend.core.Literal
Var: Any = jax.extend.core.Var
_ClosedJaxpr: Any = jax.extend.core.ClosedJaxpr
_Jaxpr: Any = jax.extend.core.Jaxpr
_UNIFIED = _ClosedJaxpr is _Jaxpr


def jax_embed_max_bytes() -> int:
    """The most bytes of a closed-over array JAX's simplified pipeline embeds rather than passes to
    the executable: `jax_embedded_constants_max_bytes` (from jax 0.10, default 32;
    `core.is_hoistable`), -1 where this JAX has no such limit (jax 0.8, 0.9:
    `core.jaxpr_const_args` passes any non-scalar)."""
    limit: int = getattr(jax.config, "jax_embedded_constants_max_bytes", -1)
    return limit


def numpy_of(value: Any) -> np.ndarray[Any, Any] | None:
    """The NumPy array a program's constant is, where it is one: the array, or JAX's wrapper of
    it (`jax._src.literals.TypedNdArray`: a view of it from jax 0.9, holding it as `.val` on
    0.8), else None."""
    if isinstance(value, np.ndarray):
        return value
    held = getattr(value, "val", None)
    return held if type(value).__name__ == "TypedNdArray" and isinstance(held, np.ndarray) else None


def is_program(value: object) -> bool:
    """Whether `value` is a program (open or closed) that an equation's parameters may hold."""
    return isinstance(value, (_ClosedJaxpr, _Jaxpr))


def closed_parts(program: Any) -> tuple[Any, list[Any], list[Any]]:
    """(its open program, its constant variables, their values): what a closed program closes
    over; no constants for an open one."""
    if _UNIFIED:
        return program, list(program.constvars), list(program.consts)
    if isinstance(program, _ClosedJaxpr):
        return program.jaxpr, list(program.jaxpr.constvars), list(program.consts)
    return program, [], []


def rebuild(
    program: Any, *, constvars: list[Any], consts: list[Any], eqns: list[Any], outvars: list[Any]
) -> Any:
    """`program` with these constants, equations and outputs (its inputs and names kept)."""
    if _UNIFIED:
        return program.replace(
            constvars=constvars, consts=consts, eqns=eqns, outvars=outvars, debug_info=program.debug_info
        )
    if isinstance(program, _ClosedJaxpr):
        open_ = program.jaxpr
        new = open_.replace(constvars=constvars, eqns=eqns, outvars=outvars, debug_info=open_.debug_info)
        return _ClosedJaxpr(new, consts)
    return program.replace(eqns=eqns, outvars=outvars, debug_info=program.debug_info)


def has_input_effects(jaxpr: Any) -> bool:
    """Whether an effect of `jaxpr` names one of its inputs by position (`JaxprInputEffect`,
    private `jax._src.effects`; jax 0.8.1 to 0.12): removing a constant would move it.
    Fallback where the class is gone: any effect counts."""
    effects = getattr(jaxpr, "effects", ())
    if not effects:
        return False
    try:
        from jax._src.effects import JaxprInputEffect
    except ImportError:  # pragma: no cover - a future JAX layout
        return True
    return any(isinstance(e, JaxprInputEffect) for e in effects)


def mutates(jaxpr: Any) -> bool:
    """Whether a program uses mutable references (`jax.new_ref`, a reference argument), which
    JAX's lowering makes pure by tracing it again (`Hooks.discharge`): an effect of it names an
    input (`JaxprInputEffect`, private `jax._src.effects`) or a reference made inside
    (`InternalMutableArrayEffect`, private `jax._src.core`), jax 0.8.1 to 0.12. Fallback where
    either class is gone: any effect counts."""
    effects = getattr(jaxpr, "effects", ())
    if not effects:
        return False
    try:
        from jax._src.core import InternalMutableArrayEffect
        from jax._src.effects import JaxprInputEffect
    except ImportError:  # pragma: no cover - a future JAX layout
        return True
    return any(isinstance(e, JaxprInputEffect | InternalMutableArrayEffect) for e in effects)


# The call whose program is being lowered, to see which of its arguments it donates: JAX's
# Python path of a jitted call, `jax._src.pjit._pjit_call_impl_python(*args, jaxpr,
# donated_invars, ...)`, through which the first call of every `jax.jit` program (and of the
# wrappers built on it) reaches lowering; `args` are the call's flat arguments, in the order of
# `donated_invars`. Private, jax 0.8.1 to 0.12. Fallback: a
# frame of another shape answers nothing, so a donation is seen at the constant's next use
# instead (`_cache.Store._fill`).
_CALL_FRAME = (JIT_MODULE, "_pjit_call_impl_python")


def donated_arguments(depth: int = 2, limit: int = 40) -> list[tuple[int, Any]]:
    """The arguments the jitted call now being compiled donates (within `limit` frames up), each
    with its position among the program's inputs."""
    frame: types.FrameType | None = frame_at(depth)
    for _ in range(limit):
        if frame is None:
            return []
        code = frame.f_code
        if code.co_name == _CALL_FRAME[1] and frame.f_globals.get("__name__") == _CALL_FRAME[0]:
            names = frame.f_locals
            args, donated = names.get("args"), names.get("donated_invars")
            if not isinstance(args, tuple) or donated is None or len(donated) != len(args):
                return []
            return [(i, a) for i, (a, d) in enumerate(zip(args, donated, strict=True)) if d]
        frame = frame.f_back
    return []


# --- programs exported without their constants (`_export`) ---
# Reason: `jax.export` embeds every constant (its lowering never hoists: "the export
# serialization does not currently support serialization of arrays", JAX's constants doc).
# `frozenconst.export` exports `g(constants, *args)` instead, and lowers it with JAX's own
# hoisting on, the FrozenConst buffers as the hoisted constants: JAX threads each through every
# nested function as a parameter of `main` (marked `jax.const`), placed after the platform index,
# dimension and token arguments and before the array inputs. `rewire_hoisted` then gives `main`
# the program's own signature: a new public `main` without those parameters, calling the
# lowered one with, in each hoisted constant's place, the input of `g` that carries it. That is
# how `jax.export` itself wraps `main` for shape polymorphism (`_export._wrap_main_func`).
# Private, no public alternative: `pxla.MeshComputation._hlo` (the lowered module, which
# `jax.export` copies before its own rewriting) and `.const_args` (the hoisted values, in the
# order of `main`'s parameters), and JAX's MLIR bindings (`jax._src.interpreters.mlir.ir`,
# `jax._src.lib.mlir.dialects.func`). jax 0.8.1 to 0.12.
# Fallback: where any is missing, False, and `frozenconst.export` refuses with a clear error
# rather than writing a program that embeds the constants.
def hoisted_values(lowering: Any) -> list[Any] | None:
    """The constants a lowering hoisted as parameters of its `main`, in order, or None."""
    values = getattr(lowering, "const_args", None)
    return None if values is None else list(values)


def rewire_hoisted(lowering: Any, inputs: list[int]) -> bool:
    """Give the lowered `main` the program's own signature: hoisted constant `j` (of
    `hoisted_values`) is the program's array input `inputs[j]`. False where it cannot."""
    try:
        _mlir: Any = importlib.import_module("jax._src.interpreters.mlir")
        _func: Any = importlib.import_module("jax._src.lib.mlir.dialects").func
        ir: Any = _mlir.ir
        module: Any = lowering._hlo
    except (ImportError, AttributeError):  # pragma: no cover - a future layout
        return False
    with module.context, ir.Location.unknown(module.context):
        table = ir.SymbolTable(module.operation)
        main = table["main"]
        attrs = list(ir.ArrayAttr(main.arg_attrs))
        hoisted = [i for i, a in enumerate(attrs) if "jax.const" in ir.DictAttr(a)]
        if not hoisted:
            return not inputs
        first = hoisted[0]
        if hoisted != list(range(first, first + len(hoisted))) or len(hoisted) != len(inputs):
            return False
        types = list(main.type.inputs)
        kept = [i for i in range(len(types)) if i not in set(hoisted)]
        # A name no other function of the module has: one that calls an exported program holds
        # that program's functions too (merged by JAX), frozenconst's renamed `main` among them.
        taken = {
            ir.StringAttr(op.attributes["sym_name"]).value
            for op in module.body.operations
            if "sym_name" in op.attributes
        }
        name, suffix = "_frozenconst_export_main", 0
        while name in taken:
            suffix += 1
            name = f"_frozenconst_export_main_{suffix}"
        main.attributes["sym_visibility"] = ir.StringAttr.get("private")
        main.attributes["sym_name"] = ir.StringAttr.get(name)
        new_main = _func.FuncOp(
            "main",
            ir.FunctionType.get([types[i] for i in kept], list(main.type.results)),
            ip=ir.InsertionPoint.at_block_begin(module.body),
        )
        new_main.attributes["sym_visibility"] = ir.StringAttr.get("public")
        new_main.arg_attrs = ir.ArrayAttr.get([attrs[i] for i in kept])
        with contextlib.suppress(KeyError):  # (a module without result attributes)
            new_main.result_attrs = main.result_attrs
        block = new_main.add_entry_block()
        with ir.InsertionPoint(block):
            given = list(block.arguments)
            position = {old: new for new, old in enumerate(kept)}
            operands = []
            for i in range(len(types)):
                if i in position:
                    operands.append(given[position[i]])
                else:  # hoisted constant `i - first`: the program's array input carrying it
                    operands.append(given[first + inputs[i - first]])
            call = _func.CallOp(list(main.type.results), ir.FlatSymbolRefAttr.get(name), operands)
            _func.ReturnOp(call.results)
    _strip_hoisted(lowering, len(hoisted))
    return True


def _strip_hoisted(lowering: Any, count: int) -> None:
    """The lowering's own record of its inputs without the `count` hoisted constants in front
    (`pxla.hoist_constants_as_args` put them there), as `jax.export` reads it."""
    lowering.const_args = []
    lowering._donated_invars = tuple(lowering._donated_invars)[count:]
    args = lowering.compile_args
    for name in ("global_in_avals", "in_shardings", "in_layouts", "donated_invars", "inout_aliases"):
        value = args.get(name)
        if value is not None:
            args[name] = type(value)(list(value)[count:]) if not isinstance(value, tuple) else value[count:]
    if args.get("kept_var_idx") is not None:
        args["kept_var_idx"] = {k - count for k in args["kept_var_idx"] if k >= count}
    mut = args.get("mut")
    if mut is not None:
        args["mut"] = mut._replace(out_mut=[None if i is None else i - count for i in mut.out_mut])
    info = args.get("all_args_info")
    if info is not None:
        names = info.debug_info.arg_names
        args["all_args_info"] = type(info)(
            list(info.in_avals)[count:],
            info.debug_info._replace(arg_names=None if names is None else tuple(names)[count:]),
        )


# --- JAX's messages for a call of an exported program (`frozenconst.load`) ---
_ARGUMENT = re.compile(r"args\[(\d+)\](\[(\d+)\])?")
_LENGTHS = re.compile(r"args is a tuple of length (\d+) in the invocation and a tuple of length (\d+)")


def exported_call_message(message: str) -> str | None:
    """JAX's message about a call of an exported `g(constants, *args)` in the words of the
    user's function: `args[1]` is the user's `args[0]`; None where it names no argument.

    JAX's checks of the call (`jax._src.export._export`, `call_exported`: "args[i]" and the
    tuple lengths, jax 0.8.1 to 0.12) name its positional arguments from 0, the constants
    first. Fallback: a message in other words is raised as JAX wrote it."""

    def argument(found: re.Match[str]) -> str:
        index = int(found.group(1))
        if index:
            return f"args[{index - 1}]{found.group(2) or ''}"
        which = "constants" if found.group(3) is None else f"constant {found.group(3)}"
        return f"frozenconst's {which} (the program's own first input)"

    def lengths(found: re.Match[str]) -> str:
        called, exported = (int(n) - 1 for n in found.groups())
        return f"args is a tuple of length {called} in the invocation and a tuple of length {exported}"

    told = _LENGTHS.sub(lengths, _ARGUMENT.sub(argument, message))
    return None if told == message else told
