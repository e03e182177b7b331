"""The core's JAX internals, each with a reason and a fallback (`_compat_lowering` holds the jit
side's), so that the rest of the package reads like plain JAX."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import jax
import jax.core
import jax.sharding
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


def _private(module: str, name: str) -> Any:
    """`name` in JAX's private `jax._src.<module>`, or None where this JAX has no such name."""
    try:
        return getattr(importlib.import_module(f"jax._src.{module}"), name)
    except (ImportError, AttributeError):  # pragma: no cover - newer JAX layouts
        return None


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
    found = _private("config", state)
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


# Tracebacks. An error raised through a JAX API (a `jax.jit` function, a `jax.numpy` call) leaves
# that API through its boundary (`traceback_util.api_boundary`), which removes JAX's internal frames
# from the traceback as `JAX_TRACEBACK_FILTERING` / `jax.config.jax_traceback_filtering` says
# ("auto", "tracebackhide", "remove_frames", "quiet_remove_frames", "off").
# `jax._src.traceback_util.register_exclusion(path)` makes it treat the frames of files under `path`
# as its own: frozenconst's frames below a JAX boundary (the function `frozenconst.jit` traces, a
# FrozenConst's operators) are then removed, kept or marked exactly as JAX's are. frozenconst's
# frames above JAX's boundary (`JitWrapped.__call__`) are dropped by `_frames`, which reads the mode
# (`_filtering_mode`, "auto" resolved as JAX resolves it) and JAX's marks on an error it filtered:
# its note (`_simplified_tb_msg`, quiet mode) or its cause, an `UnfilteredStackTrace` (remove_frames).
# Private, no public alternative; all four names in jax 0.8.1 to 0.12. Fallback: nothing registered,
# and `traceback_filtering` answers "off": frozenconst's frames stay (correct, only longer).
def _find_traceback_util() -> Any:
    try:
        from jax._src import traceback_util
    except ImportError:  # pragma: no cover - newer JAX layouts
        return None
    needed = ("register_exclusion", "_filtering_mode", "_simplified_tb_msg", "UnfilteredStackTrace")
    return traceback_util if all(hasattr(traceback_util, name) for name in needed) else None


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


# The class of JAX's concrete arrays: private `jax._src.array.ArrayImpl` (jax 0.8.1 to 0.12); making
# an array to ask its type would start a backend at import. Two uses: its public attributes, which
# it adds to `jax.Array`'s (`devices`, `is_ready`, `weak_type`, `aval`, `unsafe_buffer_pointer`,
# ...; `array_attributes`), and its operator functions, which an operator on a FrozenConst calls
# directly where the buffer is a concrete array, without looking them up by name on each use
# (`_frozen._forward_binary`). Fallback: None, so `jax.Array`'s names only (the API its stubs
# declare), and operators that look their function up by name.
ArrayImpl: type | None = _private("array", "ArrayImpl")


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
# (`FrozenConst.tree_unflatten` stops their gradient) without changing the programs of any other
# transformation: private `jax._src.interpreters.ad`'s `JVPTracer` and `LinearizeTracer` (jax 0.8.1
# to 0.12). Without them, every tracer (the same gradients, with a `stop_gradient` in every traced
# program that takes a FrozenConst).
_AD_TRACERS = (_private("interpreters.ad", "JVPTracer"), _private("interpreters.ad", "LinearizeTracer"))
DIFFERENTIATED: tuple[type, ...] = _AD_TRACERS if all(_AD_TRACERS) else (Tracer,)


# --- FrozenConst's type where JAX asks for it (`core.typeof`) ---
# Reason: a few jax.numpy functions ask JAX for the type of an argument before converting it:
# `jnp.bincount(x, weights)` reads `core.typeof(weights).sharding` (jax 0.10.2 and 0.12.0.1
# `numpy/lax_numpy.py`). `typeof` looks the value's class up in the private table
# `jax._src.core.pytype_aval_mappings` (class -> function returning the value's aval; the same on
# 0.6.2, 0.9.2, 0.10.2 and 0.12.0.1) and refuses any other object with `__jax_array__`: "Triggering
# __jax_array__() during abstractification is no longer supported". Registered there, a
# FrozenConst's type is that of `x.__jax_array__()`: its cached buffer's, or inside
# `frozenconst.jit` its parameter's. No public hook answers `typeof`.
# And `jax.lax`'s operands (`lax.dynamic_slice(table, (pos, 0), ...)`, how a decoder reads a rotary
# table). On jax 0.10.2 and 0.12.0.1 `Primitive.bind` passes each operand through
# `jax._src.dtypes.canonicalize_value` before it asks `typeof`; that function looks the operand's
# class up in a table of handlers (`register_canonicalize_value_handler`, in jaxlib's C++ there; a
# plain dict, `canonicalize_value_handlers`, in older jaxlibs of the same JAX) and refuses any other
# `__jax_array__` object. Registered there too, a FrozenConst operand becomes `x.__jax_array__()`,
# as `jnp` converts it: its cached buffer, or inside `frozenconst.jit` its parameter. JEP 28661
# leaves `jax.lax` to refuse such objects by default; a library that registers its type is what it
# asks for. On 0.9.2 `bind` asks `typeof` alone: registered, it would take the FrozenConst itself as
# an operand and fail later in other words ("No constant handler"); on 0.6.2 `typeof` converts such
# an object itself, with a DeprecationWarning. There, and on any other layout, nothing is registered
# (the fallback): `jax.lax` and the functions that ask `typeof` first refuse a FrozenConst, as
# docs/jax.md lists; inside `frozenconst.jit` the refusal is frozenconst's own error (`_refusals`),
# and `jnp.asarray(x)` at the call is the fix.
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


# --- a sharding of one device ---
# jax 0.12.1 deprecates the name `jax.sharding.SingleDeviceSharding` (every access warns) for
# `jax.sharding.make_single_device_sharding` and `is_single_device_sharding`, and says the
# first may return a `NamedSharding` one day. Fallback, before 0.12.1: the class itself.
_MAKE_SINGLE: Any = getattr(jax.sharding, "make_single_device_sharding", None)
_IS_SINGLE: Any = getattr(jax.sharding, "is_single_device_sharding", None)


def single_device_sharding(device: Any, memory_kind: str | None = None) -> jax.sharding.Sharding:
    """The sharding of one device (with `memory_kind`), as this JAX makes it."""
    if _MAKE_SINGLE is not None:
        made: jax.sharding.Sharding = _MAKE_SINGLE(device, memory_kind=memory_kind)
        return made
    return jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)


def is_single_device_sharding(sharding: object) -> TypeGuard[jax.sharding.Sharding]:
    """Whether `sharding` is what `single_device_sharding` makes."""
    if _IS_SINGLE is not None:
        return isinstance(sharding, jax.sharding.Sharding) and bool(_IS_SINGLE(sharding))
    return isinstance(sharding, jax.sharding.SingleDeviceSharding)


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
_trace_state_clean: Callable[[], bool] | None = _private("core", "trace_state_clean")


def tracing() -> bool:
    """Whether a JAX trace (`jit`, `grad`, `vmap`, a loop body) is active in this thread."""
    return _trace_state_clean is not None and not _trace_state_clean()


# The three rewraps below of a concrete array's device buffers (no copy), which no public call
# makes. Private: `jax._src.array.ArrayImpl(aval, sharding, buffers, committed=...)` (the class
# `ArrayImpl` above; jax 0.8.1 to 0.12, on one device and two). Fallback: None, then each caller's.
def _rewrapped(array: Any, sharding: Any, committed: bool, weak: bool = False) -> Any | None:
    """`array`'s buffers over `sharding`, `committed`, (`weak`) weakly typed; None where JAX cannot."""
    if ArrayImpl is None:
        return None
    try:
        if not weak:
            return ArrayImpl(array.aval, sharding, [array], committed=committed)
        shards = [shard.data for shard in array.addressable_shards]
        return ArrayImpl(array.aval.update(weak_type=True), sharding, shards, committed=committed)
    except Exception:  # a changed private constructor: any failure means "cannot"
        return None


# A default-device buffer made from a page-locked host buffer must stay uncommitted, as
# `jnp.asarray(np_array)` is (it follows `jax.default_device` and combines with arrays on any
# device). `jax.device_put` of a `jax.Array` to a sharding always commits its result
# (`_device_put_sharding_impl` in jax/_src/dispatch.py), and no public call makes an uncommitted
# array of an existing buffer. Fallback: None, and the caller transfers from the NumPy view of the
# host buffer, which JAX reads as pageable memory (correct, at pageable speed), saying so once.
class _Uncommitted:
    """Whether JAX's private constructor still makes an uncommitted twin: False after its first
    failure, which is not tried again."""

    works = True


_UNCOMMITTED = _Uncommitted()


def uncommitted(array: Any) -> Any:
    """`array` (a committed single-device `jax.Array`) uncommitted, over the same buffer; or None."""
    if ArrayImpl is None or not _UNCOMMITTED.works:
        return None
    made = _rewrapped(array, array.sharding, committed=False)
    if made is None or made.committed or made.unsafe_buffer_pointer() != array.unsafe_buffer_pointer():
        _UNCOMMITTED.works = False
        return None
    return made


# One sharding object per device and memory kind for every constant's single-device buffer.
# `jax.device_put(np_array)` gives each result a sharding object of its own
# (`make_single_device_sharding` in jax/_src/dispatch.py builds one per call), while the results
# of one compiled program share theirs. A jitted call checks each parameter's sharding, and that
# check is dearer between distinct objects: in plain JAX, 1,000 closed-over arrays of 2 KiB from
# `jax.device_put` cost 1.15x per call against the same buffers over one shared object (the CPU,
# jax 0.10.2, simplified pipeline, where closed-over arrays are parameters; `python -m benchmarks
# anyjit` shows it as closed-over FrozenConsts against closed-over `jax.Array`s: 1.07x to 1.13x
# with an object each, 0.93x to 1.00x with one shared, CPU and TPU v5e). No public call gives an
# existing buffer another sharding object without committing it. Fallback: the array as it is
# (correct, at the dearer per-call check).
_SHARED_SHARDINGS: dict[Any, Any] = {}


def shared_sharding(array: Any) -> Any:
    """`array` (a concrete single-device `jax.Array`) over the same buffer, with the one sharding
    object kept for its device and memory kind; `array` itself where it has it already or this JAX
    cannot."""
    sharding = array.sharding
    if ArrayImpl is None or not is_single_device_sharding(sharding):
        return array
    shared = _SHARED_SHARDINGS.setdefault(sharding, sharding)  # atomic: one object per key
    if shared is sharding:
        return array
    made = _rewrapped(array, shared, committed=array.committed)
    return array if made is None else made


# The Python scalar types JAX types weakly (`jnp.asarray(0.5)`, `jnp.asarray(3)`, not
# `jnp.asarray(True)`): exactly these types, as `jax._src.dtypes`' `_weak_types` lists them.
WEAK_TYPES = (int, float, complex)


# A constant made from a Python scalar (`FrozenConst(0.5)`, `FrozenConst(3)`) is weakly
# typed, as `jnp.asarray(0.5)` is: `x * bf16_array` stays bfloat16. Its device
# buffer must then carry JAX's weak type, which decides the promotion everywhere JAX meets it
# (eager operators, `jax.numpy` calls, jit arguments, closed over, `frozenconst.jit`'s
# parameters, `core.typeof`). `jax.device_put` of NumPy data makes a strong array, and no
# public call marks an existing array weak (`jax.device_put(0.5)` is weak but takes the
# dtype of the Python scalar under the x64 setting now, which can differ from the
# constant's). Fallback: the strong array (the promotion of `jnp.asarray(np.float32(0.5))`),
# said once.
def weakly_typed(array: Any) -> Any | None:
    """`array` (a concrete `jax.Array`) marked weakly typed, over the same device buffers; None
    where this JAX cannot."""
    made = _rewrapped(array, array.sharding, array.committed, weak=True)
    return made if made is not None and made.weak_type else None


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
_concrete_mesh: Callable[[], Any] | None = _private("mesh", "get_concrete_mesh")


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
