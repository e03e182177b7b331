"""The jit side's JAX internals, each with a reason and a fallback (`_compat` holds the core's):
JAX's lowering, hoisting and export, its program objects, and every text of a JAX message
frozenconst reads."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import re
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core
import jax.sharding
import numpy as np

from ._compat import JIT_MODULE, frame_at, single_device_sharding

# JAX's constant pipeline, read once at import as JAX itself reads it (jax
# 0.10.2 `array.py` makes `ArrayImpl` a literal type at import when it is on).
# `jax_use_simplified_jaxpr_constants` exists from jax 0.7; before, only the
# default pipeline exists.
SIMPLIFIED_CONSTANTS = bool(getattr(jax.config, "jax_use_simplified_jaxpr_constants", False))
# Whether the simplified pipeline makes a closed-over NumPy array a literal at each use (a
# device copy per use: jax 0.7 to 0.12.0) or one constant of the program (jax 0.12.1, whose
# `core.jaxpr_const_args` reads `jaxpr.consts`). A trace under that pipeline shows which it
# is (`_audit`); this answers for a process that runs the other one.
SIMPLIFIED_LITERAL_PER_USE = tuple(int(p) for p in jax.__version_info__[:3]) < (0, 12, 1)


# --- no_numpy_constants: seeing each program JAX lowers (used by _guard.py) ---
# Reason: the guard must see every constant of every program JAX compiles, as data. JAX's
# captured-constants report (`jax_captured_constants_warn_bytes`) is text and names only the five
# largest constants of a program (`heapq.nlargest(5, ...)` in `mlir.check_jaxpr_constants`).
# Public alternative: none that carries the program. `jax.monitoring` listeners get an event name, a
# duration and str/int keywords; JAX's `util.test_event("lower_jaxpr_to_module")` gets no arguments.
# The hook: `jax._src.interpreters.mlir.lower_jaxpr_to_module(module_name, jaxpr, *, ...)` lowers
# every top-level program: `jax.jit` (also nested, scan bodies, `.lower()`, eager primitives) and
# `pmap` reach it from `pxla._cached_lowering_to_hlo` as `mlir.lower_jaxpr_to_module` (jax 0.10.2:
# mlir.py:1287, pxla.py:736; jax 0.12.0.1: mlir.py:1374, pxla.py:756), and custom partitioners from
# `mlir.build_mlir_module_helper` by global name, so replacing the module attribute reaches both.
# Its second argument is the whole closed program: a `ClosedJaxpr` on 0.10.2, a `Jaxpr` carrying its
# `consts` on 0.12.0.1; both keep a closed-over array as a const (default pipeline) or a `Literal`
# (simplified pipeline), with nested programs in equation params.
# Fallback: `LOWERING_HOOK` is None when the function is missing; the guard then warns that it
# checks nothing (FrozenConstWarning) instead of passing.
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


# Which of a program's constants JAX passes to the executable as arguments rather than copying
# them into it: none where the lowering hoists nothing (the keyword `num_const_args`, jax >= 0.7,
# counts the hoisted ones: 0 under the default pipeline, when exporting, `jax.export` serializing a
# program that carries its constants, or when the program has none); else those that private
# `jax._src.core.jaxpr_const_args(jaxpr)` lists, which `mlir.lower_jaxpr_to_fun` hoists: the
# simplified pipeline's literal arrays on jax 0.9 to 0.12.0, and from 0.12.1 (where a closed-over
# array stays a constant of the program under either pipeline) the constants above
# `jax_embedded_constants_max_bytes`, 1 KiB there. Fallback where the function is missing: none
# hoisted, so what is said of a program errs towards "embedded".
def hoisted_by_jax(program: Any, kwargs: dict[str, Any]) -> frozenset[int]:
    """The ids of `program`'s constants that the lowering called with `kwargs` passes as arguments."""
    hoisted: int = kwargs.get("num_const_args", 0)
    if not hoisted:
        return frozenset()
    try:
        from jax._src import core as _core

        listed = _core.jaxpr_const_args(closed_parts(program)[0])
    except Exception:  # pragma: no cover - a future JAX layout: every constant counted embedded
        return frozenset()
    return frozenset(id(value) for value, _ in listed)


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

    __slots__ = ("const_args", "core", "default_parameters", "discharge", "lower", "pxla")

    def __init__(self) -> None:
        from jax._src import core as _core
        from jax._src.interpreters import mlir as _mlir
        from jax._src.interpreters import pxla as _pxla

        self.core: Any = _core
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
                    return single_device_sharding(device)
                continue
            mesh = getattr(found, "mesh", None)
            if not isinstance(mesh, jax.sharding.Mesh):
                try:
                    devices: Any = np.array(found._device_assignment)  # pyright: ignore[reportPrivateUsage]
                except Exception:  # a sharding without an order: the program decides
                    return None
                mesh = jax.sharding.Mesh(devices, ("frozenconst",))
            return jax.sharding.NamedSharding(mesh, _REPLICATED)
        context = kwargs.get("context_mesh")
        if isinstance(context, jax.sharding.Mesh) and not context.empty and context.size > 1:
            return jax.sharding.NamedSharding(context, _REPLICATED)
        return None

    @staticmethod
    def keeping_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
        """`lower`'s keyword arguments with every input of the program kept (`keep_unused`, which
        pjit passes by keyword): an exported program's constant inputs, which its function reads
        as closures and so never uses, are where frozenconst wires the constants; JAX's own VJP
        of an exported program (`Exported.vjp`) is jitted without `keep_unused`."""
        return {**kwargs, "keep_unused": True}

    def wrap_lowering(
        self, lower: Callable[..., Any], const_args: Callable[[Any], Any], discharged: Callable[..., Any]
    ) -> None:
        """Have JAX call `lower(original, ...)` where it lowers a program, `const_args` for a
        program's hoisted constants, and `discharged(original, ...)` where it makes a program with
        mutable references pure (where this JAX has `discharge`): each read through its module at
        call time, each wrapped once (`_install`)."""
        original = self.lower
        self.pxla.lower_sharding_computation = functools.wraps(original)(functools.partial(lower, original))
        self.core.jaxpr_const_args = functools.wraps(self.const_args)(const_args)
        if self.discharge is not None:
            wrapped = functools.wraps(self.discharge)(functools.partial(discharged, self.discharge))
            self.pxla._discharge_refs_jaxpr = wrapped

    def own_lowering(self, kwargs: dict[str, Any]) -> str | None:
        """None where `lower` runs with what `jax.jit` lowers with, else whose lowering it is:
        "export" (`jax.export`'s, `for_export`) or "lowering" (a custom lowering rule's)."""
        parameters = kwargs.get("lowering_parameters")
        if parameters == self.default_parameters:
            return None
        return "export" if getattr(parameters, "for_export", False) else "lowering"

    @staticmethod
    def hoisting(kwargs: dict[str, Any]) -> dict[str, Any]:
        """`lower`'s keyword arguments with JAX's hoisting of literal constants switched on."""
        on = dataclasses.replace(kwargs["lowering_parameters"], hoist_constants_as_args=True)
        return {**kwargs, "lowering_parameters": on}


_spec: Callable[[], jax.sharding.PartitionSpec] = jax.sharding.PartitionSpec  # untyped constructor
_REPLICATED = _spec()
# `jax.clear_caches()`: every program JAX compiled is compiled again at its next call.
clear_caches: Callable[[], None] = jax.clear_caches  # untyped in JAX's stubs


# --- letting go of the programs of one jitted function (`_hoist.dropped`) ---
# Reason: a program that takes a constant's buffer as a parameter holds it (the executable's
# `const_args` on the C++ fast path, the buffer in its cached trace), so an evicted buffer stays
# on the device until they go. `jax.clear_caches()` drops them and every other program too, each
# compiled again at its next call. JAX drops one jitted function's programs with its public
# `jitted.clear_cache()`, but frozenconst meets a program at its lowering, not the `jax.jit`
# object, so it reads the function from the frame that lowers it: the `cache_miss` closure
# `pjit._cpp_pjit(fun, jit_info)` makes (free variables `fun`, `jit_info`: the first call), or
# `pjit.jit_trace(jit_func, ...)` (`.trace()`, `.lower()`). `_cpp_pjit(fun, jit_info)` made again
# shares the C++ executable cache of every `jax.jit(fun)` with those options (jaxlib's
# `PjitFunctionCache::Lookup` keys it by the function and the options), so its `_clear_cache()`
# drops their executables. Their traces are in weakref_lru_caches keyed by `fun`
# (`pe.trace_to_jaxpr`, `pjit._infer_params_cached`): `evict_weakref(fun)` drops that function's
# alone (jax >= 0.9); the programs keyed by a trace (`_pjit_lower`, `_cached_lowering_to_hlo`)
# go with it. jax 0.8.1's caches have no `evict_weakref`: there `clear_cache()`, JAX's own, which
# also forgets every function's traces (`_infer_params_cached.cache_clear()`), not their
# executables. Checked on jax 0.8.1, 0.9.2, 0.10.2, 0.12.0.1 and 0.12.1.
# Fallback: where a name is missing, `jit_entry` finds nothing, and `_hoist.dropped` clears every
# cache (`clear_caches`), as it does wherever a dropped buffer is still held after the release.
class _JitNames:
    """JAX's jit functions read at lowering and at a release, or None where one is missing."""

    __slots__ = ("cpp_pjit", "miss", "trace", "traces")

    def __init__(self) -> None:
        from jax._src import pjit as _pjit

        self.cpp_pjit: Callable[[Any, Any], Any] = _pjit._cpp_pjit  # pyright: ignore[reportPrivateUsage]
        misses = [c for c in self.cpp_pjit.__code__.co_consts if getattr(c, "co_name", "") == "cache_miss"]
        if len(misses) != 1 or not {"fun", "jit_info"} <= set(misses[0].co_freevars):
            raise AttributeError("cache_miss")
        self.miss: types.CodeType = misses[0]
        self.trace: types.CodeType = _pjit.jit_trace.__code__
        # The caches of traces keyed by the function, where each can forget one function's.
        from jax._src.interpreters import partial_eval as _pe

        found = [getattr(_pe, "trace_to_jaxpr", None), _pjit._infer_params_cached]  # pyright: ignore[reportPrivateUsage]
        self.traces: list[Any] | None = [c for c in found if c is not None]
        if not all(callable(getattr(c, "evict_weakref", None)) for c in self.traces):
            self.traces = None  # jax 0.8.1: `clear_cache()` forgets every function's traces


def _find_jit_names() -> _JitNames | None:
    try:
        return _JitNames()
    except (ImportError, AttributeError):  # pragma: no cover - a future JAX layout
        return None


_JIT: _JitNames | None = _find_jit_names()


def jit_entry(depth: int = 2, limit: int = 60) -> tuple[Any, Any] | None:
    """The jitted function (`fun`, `jit_info`) whose program is being lowered (within `limit`
    frames up), or None: another caller (`pmap`, an eager primitive of a transformed program)."""
    names = _JIT
    if names is None:
        return None
    frame: types.FrameType | None = frame_at(depth)
    for _ in range(limit):
        if frame is None:
            return None
        code = frame.f_code
        if code is names.miss:
            found = frame.f_locals
            return found["fun"], found["jit_info"]
        if code is names.trace:
            jitted = frame.f_locals.get("jit_func")
            fun, info = getattr(jitted, "_fun", None), getattr(jitted, "_jit_info", None)
            return None if fun is None or info is None else (fun, info)
        frame = frame.f_back
    return None


def release_jitted(fun: Any, jit_info: Any) -> None:
    """Drop the compiled programs and the traces of `jax.jit(fun)` with `jit_info`'s options."""
    names = _JIT
    assert names is not None
    jitted = names.cpp_pjit(fun, jit_info)
    if names.traces is None:
        jitted.clear_cache()
        return
    jitted._clear_cache()
    for cache in names.traces:
        cache.evict_weakref(fun)


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
    return _has_effect(jaxpr, ("effects", "JaxprInputEffect"))


def mutates(jaxpr: Any) -> bool:
    """Whether a program uses mutable references (`jax.new_ref`, a reference argument), which
    JAX's lowering makes pure by tracing it again (`Hooks.discharge`): an effect of it names an
    input (`JaxprInputEffect`, private `jax._src.effects`) or a reference made inside
    (`InternalMutableArrayEffect`, private `jax._src.core`), jax 0.8.1 to 0.12. Fallback where
    either class is gone: any effect counts."""
    return _has_effect(jaxpr, ("effects", "JaxprInputEffect"), ("core", "InternalMutableArrayEffect"))


def _has_effect(jaxpr: Any, *classes: tuple[str, str]) -> bool:
    """Whether an effect of `jaxpr` is of one of these classes (`jax._src` module, name); any
    effect is where one of them is gone."""
    effects = getattr(jaxpr, "effects", ())
    if not effects:
        return False
    try:
        found = tuple(getattr(importlib.import_module(f"jax._src.{m}"), name) for m, name in classes)
    except (ImportError, AttributeError):  # pragma: no cover - a future JAX layout
        return True
    return any(isinstance(e, found) for e in effects)


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
            # In hoisted constant `i - first`'s place, the program's array input carrying it.
            operands = [
                given[position[i]] if i in position else given[first + inputs[i - first]]
                for i in range(len(types))
            ]
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


# --- JAX's messages: every text of one that frozenconst reads ---
# JAX raises builtin errors, so the kind of refusal is in its words; each text below with the
# versions it holds for. Fallback for all: an error in other words is raised as JAX raised it.
# JAX's own words when `core.typeof` meets an object with `__jax_array__` that is not one of its
# array types (jax >= 0.7; 0.6 calls it with a DeprecationWarning): a `jax.lax` operand, or
# (jax 0.7 to 0.9) an index (`a[idx]`, `a.at[idx]`). From jax 0.10, where a FrozenConst's type is
# registered with `typeof` (`_compat.register_array_type`), the indexer refuses it in other
# words, an `IndexError` that names it (`Got FrozenConst(...)`).
_ABSTRACTIFICATION = "__jax_array__() during abstractification"
_INDEXED = "Got FrozenConst("
# And where a jitted JAX function hands a FrozenConst argument (there a value derived from its
# tracer) to `jnp.asarray`'s type check, or compares the pytree structure of its argument with
# that of a result (`jax.scipy.sparse.linalg.cg`, `lax.custom_root`: a `TypeError`;
# `lax.reduce`: a `ValueError`), or the type of a loop's carry with what its body returns
# (`lax.scan`, `while_loop`: a `TypeError`).
_TYPE_REFUSALS = ("got FrozenConst(", "CustomNode(FrozenConst", "<class 'frozenconst._frozen.FrozenConst'>")


def refusal(err: BaseException) -> type[Exception] | None:
    """The builtin error (`ValueError`, `TypeError`, `IndexError`) with which JAX refused a value
    with `__jax_array__` where it takes only a `jax.Array` (`_refusals`), or None."""
    text = str(err)
    # jax 0.6 refuses with a DeprecationWarning, an exception where warnings are errors.
    if isinstance(err, (ValueError, DeprecationWarning)) and _ABSTRACTIFICATION in text:
        return ValueError
    if isinstance(err, (TypeError, ValueError)) and any(words in text for words in _TYPE_REFUSALS):
        return TypeError if isinstance(err, TypeError) else ValueError
    return IndexError if isinstance(err, IndexError) and _INDEXED in text else None


def device_mismatch(err: BaseException) -> bool:
    """Whether `err` is JAX's refusal of an input placed on other devices than the program's
    (`DeviceAssignmentMismatchError`, "incompatible devices"; jax 0.8.1, 0.9.2 and 0.10.2)."""
    return "DeviceAssignmentMismatch" in type(err).__name__ or "incompatible devices" in str(err)


def non_array_refused(err: BaseException) -> bool:
    """Whether `err` is `jax.jit`'s refusal of an argument that is not an array (an equinox
    module's activation): "... as an abstract array", "... not a valid JAX type" (jax 0.8.1, 0.9.2
    and 0.10.2)."""
    return isinstance(err, TypeError) and ("as an abstract array" in str(err) or "valid JAX type" in str(err))


def deleted_buffer(err: BaseException) -> bool:
    """Whether `err` is XLA's refusal of a deleted (donated) buffer: "Array has been deleted",
    "Buffer has been deleted or donated" (jax 0.8.1 to 0.12.0.1)."""
    return isinstance(err, (RuntimeError, ValueError)) and "deleted" in str(err)


# A call of an exported program (`frozenconst.load`).
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
