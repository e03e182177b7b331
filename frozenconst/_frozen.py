"""`FrozenConst`: an immutable host array that JAX uses like a `jax.Array`."""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from numpy.typing import ArrayLike, DTypeLike

from ._cache import STATE, Placement, Store, live_twin
from ._compat import (
    DEFAULT_DEVICE,
    ArrayImpl,
    Tracer,
    array_attributes,
    is_single_device_sharding,
    single_device_sharding,
)
from ._convert import frozen_copy, host_plan
from ._derived import COPY, NO_LEAF, CopyMark, Derived, copy_record, know_copy, new_handle, rebuild
from ._dtypes import check_conversion
from ._errors import FrozenConstTypeError, FrozenConstValueError, FrozenConstWarning
from ._host_memory import HostMemory, Residency, host_memory_choice, residency_choice
from ._partial import as_shape, from_callback, frozen_store
from ._stats import ConstStats, const_stats
from ._targets import Target, as_sharding

# Taken by a handle making its copy's record (`FrozenConst._held`): one record per copy,
# whichever thread asks first.
_RECORD_LOCK = threading.Lock()

# `jax.Array` methods that free or invalidate the cached buffer. Everything else
# on `jax.Array` is offered on `FrozenConst` too, computed on the cached buffer.
_REFUSED = frozenset({"delete"})
# What a derived value may hold that is unhashable as a leaf: an array or a traced value.
_UNHASHABLE_LEAVES = (jax.Array, np.ndarray, Tracer)
# DLPack's device type of host memory (`kDLCPU`), as `jax.dlpack` and NumPy number it.
_DL_CPU = 1
# The platforms whose buffers `jax.Array.__dlpack__` exports (jax 0.8.1 to 0.12: "only supported
# for CPU and GPU"); a constant on any other exports its frozen host copy.
_DLPACK_PLATFORMS = frozenset({"cpu", "gpu", "cuda", "rocm"})
# `x.astype()` without a dtype: passed on as `jax.Array.astype()` takes it.
_NO_DTYPE: Any = object()


if TYPE_CHECKING:
    # Type checkers see a `jax.Array` subclass, so `jnp.dot(x, w)`, `x @ w` and
    # any parameter typed `jax.typing.ArrayLike` accept a FrozenConst, as they do
    # at run time through `__jax_array__`. At run time it is not a `jax.Array`
    # (`isinstance(x, jax.Array)` is False); docs/typing.md lists every difference.
    from jax import Array as _StaticBase
else:
    _StaticBase = object


class FrozenConst(_StaticBase):
    """An immutable constant array for JAX.

    `FrozenConst(obj)` copies `obj` once into a host buffer that nothing can
    write to again, and transfers it to each device at most once, on first use,
    caching the device buffer. `jax.numpy` functions, operators and jitted
    functions accept it wherever they accept a `jax.Array`.

    Arguments:
        obj: a NumPy array or scalar, a nested sequence of numbers, a concrete
            `jax.Array`, or another `FrozenConst` (which shares its buffers,
            no copy).
        dtype: convert to this dtype while copying. Default: the dtype
            `jnp.asarray(obj)` would have under the x64 setting now (float64 data
            is held as float32 without x64), so the host holds what JAX computes
            with. Pass `dtype=np.float64` to keep float64 on the host regardless.
        sharding: the declared sharding, which every use of this constant gets
            (`jnp` calls, jit arguments and `frozenconst.jit`): a `jax.Device`,
            a `Sharding`, or a `PartitionSpec` under `jax.set_mesh`. Default:
            follow `jax.default_device`. See [`placed`][frozenconst.FrozenConst.placed].
        host_memory: where the host copy lives: `"pinned"` (page-locked, which an
            accelerator reads by DMA), `"pageable"`, or `"auto"`: page-locked
            where JAX's running backend is an accelerator that offers it, else
            pageable (on CPU the device buffer aliases the host copy). Default:
            the environment variable `FROZENCONST_HOST_MEMORY`, else `"auto"`.
            See [Host memory](host-memory.md).
        residency: where the constant lives between uses: `"device"` (one
            device buffer per placement, transferred once) or `"host"`: in
            page-locked host memory, never held on a device, each program that
            uses it moving what it reads onto the device (`x[i]` in a `lax.scan`
            body moves one slice per step). For constants bigger than the
            device's memory. Default: a `FrozenConst` source's, else `"device"`.
            See [Host memory](host-memory.md).

    Raises:
        FrozenConstTypeError: `obj` is not numeric data JAX can hold (object,
            string, bytes, structured or datetime dtypes, masked arrays).
        TracedValueError: `obj` is a traced value (inside `jit`, `grad`, ...).
        FrozenConstValueError: `obj` is a ragged nested sequence, `host_memory`
            (or `FROZENCONST_HOST_MEMORY`) is not one of the three choices, or
            `residency` is not `"device"` or `"host"`.

    Examples:
        >>> import numpy as np, jax.numpy as jnp
        >>> from frozenconst import FrozenConst
        >>> table = FrozenConst(np.arange(6.0).reshape(2, 3))   # float64 data, x64 off
        >>> table
        FrozenConst([[0., 1., 2.],
                     [3., 4., 5.]], dtype=float32)
        >>> jnp.sum(table @ jnp.ones(3))
        Array(15., dtype=float32)
    """

    __slots__ = ("__weakref__", "_record", "_sharding", "_store")
    # NumPy defers mixed operations (`np_array + x`) to us, as it does to `jax.Array`.
    __array_priority__: ClassVar[int] = 100

    # What the handle stands for: a constant (`_cache.Store`, or its partial kind
    # `_partial.PartialStore`), or a value a transformation derived from one
    # (`_derived.Derived`). They answer the same calls, so no method here asks which
    # (`_held`). A copy `tree_unflatten` made (`_sharding` is `COPY`) holds its
    # `jax.Array` here, and its `Derived` in `_record` once asked for: one object per
    # copy, where a step rebuilds many.
    _store: Store | Derived
    # The declared sharding every use gets (`sharding=`, `placed`); None: the
    # default device, following `jax.default_device`; `COPY`: a copy (`_declared`).
    _sharding: jax.sharding.Sharding | CopyMark | None
    _record: Derived

    def __init__(
        self,
        obj: ArrayLike | FrozenConst,
        dtype: DTypeLike | None = None,
        *,
        sharding: Target | None = None,
        host_memory: HostMemory | None = None,
        residency: Residency | None = None,
    ) -> None:
        choice = host_memory_choice(host_memory)
        resides = None if residency is None else residency_choice(residency, host_memory)
        if isinstance(obj, FrozenConst):
            # The same store where nothing changes (no copy), else a frozen copy.
            store = obj._held().remade(dtype, choice, host_memory, resides)
            declared = store.home if sharding is None else store.declare(sharding)
        else:
            # Validated, its dtype, weak type and checks decided once (`host_plan`), placed,
            # then copied once: whole, or, for a memory-mapped source placed across
            # processes, only the slices this process's devices address.
            plan = host_plan(obj, dtype)
            declared = None if sharding is None else as_sharding(sharding, plan.source.shape)
            store = frozen_store(plan, declared, choice, resides or "device")
        self._store = store
        self._sharding = declared

    @classmethod
    def from_callback(
        cls,
        shape: Sequence[int],
        sharding: Target,
        data_callback: Callable[[tuple[slice, ...]], ArrayLike],
        *,
        dtype: DTypeLike | None = None,
        host_memory: HostMemory | None = None,
    ) -> FrozenConst:
        """A constant built slice by slice, as `jax.make_array_from_callback` builds an array.

        `data_callback(index)` is called once per distinct index that this process's
        devices address under `sharding` (devices that replicate a slice share one
        call) and returns that slice, `whole[index]`. Each slice is validated and
        copied into frozen host memory, so changing what the callback returned
        later changes nothing. Where `sharding` spans several processes, this
        process holds only its slices (docs: "Constants bigger than one host");
        otherwise the slices are assembled into one whole constant.

        Arguments:
            shape: the global shape.
            sharding: the constant's declared sharding: a `Sharding`, a device, or a
                `PartitionSpec` under `jax.set_mesh`.
            data_callback: `index -> array`, `index` a tuple of slices.
            dtype: the constant's dtype; slices of another dtype are converted with
                the checks of `FrozenConst(obj, dtype)`. Default: the dtype of the
                first slice, which every slice must then have, as in
                `jax.make_array_from_callback`. Each process infers its own, so pass
                it where processes could disagree, and where none of `sharding`'s
                devices is in this process (no slice to infer it from). Without it,
                slices are held as `jnp.asarray` holds them (float64 as float32 without x64).
            host_memory: as for `FrozenConst`, for a constant assembled whole; a
                constant whose sharding spans several processes keeps its slices
                in pageable memory (and `"pinned"` says so once).

        Raises:
            FrozenConstValueError: a slice of the wrong shape, the sharding does
                not fit `shape`, or no `dtype` and no slice to infer it from.
            FrozenConstTypeError: a slice or dtype JAX cannot hold, slices of
                different dtypes without `dtype`, or a `shape` that is not ints.

        Examples:
            >>> import jax, numpy as np
            >>> from frozenconst import FrozenConst
            >>> whole = np.arange(6.0).reshape(2, 3)
            >>> device = jax.devices()[0]
            >>> x = FrozenConst.from_callback((2, 3), device, lambda index: whole[index], dtype=np.float32)
            >>> x
            FrozenConst([[0., 1., 2.],
                         [3., 4., 5.]], dtype=float32)
        """
        full = as_shape(shape)
        declared = as_sharding(sharding, full)
        choice = host_memory_choice(host_memory)
        return cls._of(from_callback(full, declared, data_callback, dtype, choice), declared)

    def _held(self) -> Store | Derived:
        """What the handle stands for: its store, or a copy's record, made on first need (the
        hot paths serve a copy from its array without one)."""
        if self._sharding is not COPY:
            return self._store
        try:
            return self._record
        except AttributeError:
            pass
        with _RECORD_LOCK:
            try:
                return self._record
            except AttributeError:
                record = self._record = copy_record(self._store)
                return record

    def _declared(self) -> jax.sharding.Sharding | None:
        """The declared sharding: None for a copy, as for a derived value."""
        sharding = self._sharding
        return None if sharding is COPY else sharding  # type: ignore[return-value]

    @classmethod
    def _of(cls, store: Store | Derived, sharding: jax.sharding.Sharding | None = None) -> FrozenConst:
        """A handle on `store`, every use of which gets `sharding`: no validation, no copy."""
        handle = new_handle(cls)
        handle._store = store
        handle._sharding = sharding
        return handle

    # -- the pytree protocol (registered below the class) ----------------------

    def tree_flatten(self) -> tuple[tuple[jax.Array], None]:
        """A pytree with one leaf, the device buffer, and no auxiliary data.

        So jit arguments cost no transfer and never retrace for another constant
        of the same shape and dtype, and transformations keep the type (JEP 28661).
        A copy's array is passed along as it is, not filed as read (`__jax_array__`).
        """
        if self._sharding is COPY:
            return (self._store,), None  # type: ignore[return-value]  # a copy's own array
        return (self.__jax_array__(),), None

    def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, jax.Array]], None]:
        """As `tree_flatten`, with the leaf's key path `.value`."""
        return ((jax.tree_util.GetAttrKey("value"), self.tree_flatten()[0][0]),), None

    # What a rebuilt leaf becomes, and the derived-copy warning, live in `_derived` (`rebuild`):
    # bound here as the classmethod itself, so JAX calls it with no frame of its own between.
    tree_unflatten: classmethod[FrozenConst, [None, Any], FrozenConst | np.ndarray[Any, Any]]
    tree_unflatten = classmethod(rebuild)

    # -- the device side -------------------------------------------------------

    def __jax_array__(self) -> jax.Array:
        """The cached device array: on the default device, or with the declared sharding.

        Inside a trace too: a compiled program that uses it takes it as a parameter (`_hoist`).
        """
        # The one inline copy of `Store.array`'s rule: its hit for the default placement with
        # no `jax_default_device` set (`Store.hot`), read here because the call was a
        # measurable part of a cache hit (`python -m benchmarks compare`). Anything else (a
        # `jax.default_device` in force, a buffer not served yet or deleted, a declared
        # sharding) is `Store.array`'s; a derived value's leaf and a copy's array are their
        # own. `tests/test_cache.py` checks that this copy answers what the rule answers.
        sharding = self._sharding
        if sharding is None:
            store = self._store
            array = store.hot
            if array is not None and DEFAULT_DEVICE.value is None and not array.is_deleted():
                if STATE.accounting:
                    store.hits += 1
                return array
            leaf = store.leaf  # a derived value's (`Derived.array`)
            if leaf is not None:
                return leaf  # type: ignore[no-any-return]
            return store.array(None)
        if sharding is COPY:
            # A copy's own array, known from now on (a program closing over it keeps it out).
            return know_copy(self._store)  # type: ignore[no-any-return]
        return self._store.array(sharding)  # type: ignore[arg-type]  # a sharding, `COPY` is not

    def on(self, target: Target) -> jax.Array:
        """The constant as a committed `jax.Array` with exactly this placement, cached.

        Arguments:
            target: a `jax.Device`, any `jax.sharding.Sharding` (a `NamedSharding`
                with any `PartitionSpec`, a `SingleDeviceSharding`), or a bare
                `PartitionSpec` inside `with jax.set_mesh(mesh):`.

        Returns:
            The same `jax.Array` for every equal target (equal shardings, not only
            identical objects). Each process transfers only its addressable shards,
            each straight from the frozen host buffer.

        Raises:
            FrozenConstTypeError: `target` is not a device, sharding or PartitionSpec.
            FrozenConstValueError: the sharding does not fit the constant's shape, or
                a bare PartitionSpec is given with no active mesh.

        Examples:
            >>> import jax, numpy as np
            >>> from frozenconst import FrozenConst
            >>> x = FrozenConst(np.arange(4.0))
            >>> cpu0 = jax.devices()[0]
            >>> x.on(cpu0) is x.on(x.on(cpu0).sharding)  # a device, or its one-device sharding
            True
            >>> x.on(cpu0).committed
            True
        """
        store = self._held().constant("on")
        return store.array(as_sharding(target, store.shape))

    def placed(self, target: Target) -> FrozenConst:
        """A handle on the same constant whose every use gets this placement.

        `jnp` calls, jit arguments and `frozenconst.jit` all receive `x.on(target)`
        instead of the default-device buffer. The host buffer and the device
        cache are shared with `self`: no copy.

        Examples:
            >>> import jax, numpy as np
            >>> from frozenconst import FrozenConst
            >>> x = FrozenConst(np.arange(4.0)).placed(jax.devices()[0])
            >>> jax.numpy.asarray(x).committed
            True
        """
        store = self._held().constant("placed")
        return FrozenConst._of(store, store.declare(target))

    @property
    def declared_sharding(self) -> jax.sharding.Sharding | None:
        """The declared sharding (from `sharding=` or `placed`), or None to follow `jax.default_device`.

        Examples:
            >>> import jax, numpy as np
            >>> from frozenconst import FrozenConst
            >>> x = FrozenConst(np.zeros(4, np.float32))
            >>> x.declared_sharding is None
            True
            >>> device = jax.devices()[0]
            >>> x.placed(device).declared_sharding.device_set == {device}
            True
        """
        return self._declared()

    @property
    def sharding_target(self) -> jax.sharding.Sharding | None:
        """Deprecated: `declared_sharding`, under its old name (it returns a sharding, not a target)."""
        warnings.warn(
            "`x.sharding_target` is deprecated: it returns the declared sharding, so it is now "
            "`x.declared_sharding`. Use that name; this one will be removed.",
            FrozenConstWarning,
            stacklevel=2,
        )
        return self._declared()

    @property
    def placements(self) -> tuple[Placement, ...]:
        """The cached device placements, each with its sharding, dtype and bytes per device.

        Examples:
            >>> import jax, numpy as np
            >>> from frozenconst import FrozenConst
            >>> x = FrozenConst(np.zeros(256, np.float32))
            >>> _ = jax.numpy.asarray(x)
            >>> (placement,) = x.placements
            >>> dict(placement.device_bytes) == {jax.devices()[0]: 1024}
            True
        """
        return tuple(Placement.of(a) for a in self._held().arrays())

    def evict(self, target: Target | None = None) -> None:
        """Drop cached device buffers; the next use transfers again.

        Arguments:
            target: drop only this placement (for a device, also the default
                buffer on it). Default: drop every cached placement.

        Examples:
            >>> import jax, numpy as np
            >>> from frozenconst import FrozenConst
            >>> x = FrozenConst(np.ones(3))
            >>> a = jax.numpy.asarray(x)
            >>> x.evict()
            >>> jax.numpy.asarray(x) is a
            False
        """
        self._held().evict(None if target is None else as_sharding(target, self.shape))

    @property
    def fingerprint(self) -> str:
        """A digest of dtype, shape and bytes (`sha256:<hex>`), computed once, on first request.

        Examples:
            >>> import numpy as np
            >>> from frozenconst import FrozenConst
            >>> FrozenConst(np.arange(3)).fingerprint == FrozenConst([0, 1, 2]).fingerprint
            True
        """
        return self._held().fingerprint

    def stats(self) -> ConstStats:
        """This constant's accounting: host and device bytes, transfers, hits, zero-copy.

        Examples:
            >>> import numpy as np, jax.numpy as jnp
            >>> from frozenconst import FrozenConst
            >>> x = FrozenConst(np.ones(16, np.float32))
            >>> _ = x.__jax_array__(); _ = x.__jax_array__()   # a transfer, then a hit
            >>> s = x.stats()
            >>> s.transfers, s.hits, s.host_bytes
            (1, 1, 64)
        """
        return const_stats(self._held().constant("stats"))

    @property
    def host_memory(self) -> str:
        """Where the host copy lives: `"pinned"` (page-locked) or `"pageable"`.

        What `host_memory="auto"` (the default) chose; see [Host memory](host-memory.md).

        Examples:
            >>> import numpy as np
            >>> from frozenconst import FrozenConst
            >>> FrozenConst(np.ones(4), host_memory="pageable").host_memory
            'pageable'
        """
        return self._held().constant("host_memory").host_memory

    @property
    def residency(self) -> str:
        """Where the constant lives between uses: `"device"`, or `"host"` (page-locked host
        memory, moved onto the device by each use; see [Host memory](host-memory.md)).

        Examples:
            >>> import numpy as np
            >>> from frozenconst import FrozenConst
            >>> FrozenConst(np.ones(4)).residency
            'device'
        """
        return self._held().constant("residency").residency

    @property
    def is_concrete(self) -> bool:
        """Whether this is a constant with host data (False for a traced or transformed value)."""
        # A copy is not, and is asked per call (`frozenconst.jit`'s arguments): no record for it.
        return self._sharding is not COPY and self._store.concrete

    # -- the host side ---------------------------------------------------------

    def __array__(
        self, dtype: DTypeLike | None = None, context: None = None, copy: bool | None = None
    ) -> np.ndarray[Any, Any]:
        host = self._held().whole("np.asarray(x)")
        if copy:
            return np.array(host, dtype=dtype, copy=True)
        if dtype is None or np.dtype(dtype) == host.dtype:
            # A fresh read-only view each time: a caller that reshapes it in
            # place (`v.shape = ...`) changes only its own view.
            return host.view()
        if copy is False:
            raise FrozenConstValueError(
                f"`np.asarray(x, dtype={np.dtype(dtype)}, copy=False)` cannot avoid a copy: "
                f"the FrozenConst holds {host.dtype}. Drop `copy=False`, or ask for "
                f"dtype={host.dtype}."
            )
        return host.astype(dtype)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Export through DLPack, read-only, from where `__dlpack_device__` says, as `jax.Array` does.

        On a GPU, the cached device buffer (`jnp.asarray(x).__dlpack__`); where that is
        a CPU device, a device JAX's DLPack does not speak (a TPU), or where `dl_device`
        asks for the CPU, the frozen host buffer (its dtype, no device round trip). A consumer that only
        speaks DLPack < 1.0 cannot be told that the memory is read-only, so it
        receives a copy instead (`BufferError` with `copy=False`). docs/jax.md, "DLPack".
        """
        array = None if dl_device is not None and int(dl_device[0]) == _DL_CPU else self._dlpack_array()
        if array is None:
            host = self._held().whole("x.__dlpack__()")
            try:
                return host.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
            except BufferError:
                if copy is False:
                    raise
                return np.array(host).__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device)
        if max_version is None or tuple(max_version) < (1, 0):
            if copy is False:
                raise BufferError(
                    "`x.__dlpack__(copy=False)` from a consumer of DLPack < 1.0 would hand out the "
                    "constant's device memory writable: DLPack before 1.0 cannot mark it read-only. "
                    "Use a consumer of DLPack >= 1.0, or allow a copy."
                )
            copy = True
        return array.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack device `x.__dlpack__()` exports from: that of `jnp.asarray(x)`.

        `(kDLCPU, 0)` on a CPU device (the host buffer, which the device buffer
        aliases there) and on a TPU (the host buffer: JAX exports no TPU memory); the
        GPU's otherwise (`(kDLCUDA, id)` on a CUDA GPU).
        """
        array = self._dlpack_array()
        exporter = self._held().whole("x.__dlpack_device__()") if array is None else array
        device: tuple[int, int] = exporter.__dlpack_device__()
        return device

    def _dlpack_array(self) -> Any:
        # The device buffer DLPack exports, or None where that is the host buffer: a
        # constant used on one CPU device, one on a device JAX's DLPack does not speak
        # (a TPU: "__dlpack__ device only supported for CPU and GPU"), or a traced value
        # (whose host copy refuses). On several GPUs, the array: JAX's BufferError, as
        # for a sharded jax.Array.
        # `Any`: jax.Array's stubs declare `__dlpack__()` without DLPack's keywords, and
        # no `__dlpack_device__` (jax 0.10); its implementation has both.
        array: Any = self._held().array(self._declared())
        if isinstance(array, Tracer):
            return None
        platforms = {device.platform for device in array.devices()}
        if platforms - _DLPACK_PLATFORMS or (platforms == {"cpu"} and len(array.devices()) == 1):
            return None
        return array

    # -- metadata --------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return self._held().shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype JAX computes with: that of every device buffer and of `jnp.asarray(x)`.

        The host dtype canonicalized under the current x64 setting (float64 data is
        float32 without x64), read at each call, so it follows `jax.enable_x64`
        contexts as the device buffers do. Runtime annotation checkers (jaxtyping)
        and `np.dtype(x)` see this one; the host data's own is `host_dtype`.

        Examples:
            >>> import numpy as np
            >>> from frozenconst import FrozenConst
            >>> x = FrozenConst(np.arange(4.0), dtype=np.float64)   # float64 kept on the host, x64 off
            >>> x.dtype, x.host_dtype
            (dtype('float32'), dtype('float64'))
        """
        return self._held().device_dtype()

    @property
    def host_dtype(self) -> np.dtype[Any]:
        """The dtype of the frozen host data (`np.asarray(x).dtype`, pickles, the fingerprint)."""
        return self._held().dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the array JAX computes with (`size * dtype.itemsize`, as `jax.Array.nbytes`).

        The host buffer's bytes are `x.stats().host_bytes`.
        """
        return self.size * self.dtype.itemsize

    @property
    def _committed(self) -> bool:
        # JAX reads this private flag off its inputs (`getattr(x, "_committed",
        # True)` in `lax.full_like`, behind `jnp.zeros_like` and friends), so it
        # is that of the buffer `jnp.asarray(x)` gives: False for the default
        # buffer, which follows `jax.default_device`; True for a declared
        # placement. Where that buffer has none (a tracer inside a
        # transformation), AttributeError, and JAX takes its default as it does
        # for the tracer itself. docs/jax.md, "Attributes JAX reads off its inputs".
        committed: bool = getattr(self.__jax_array__(), "_committed")  # noqa: B009 - not in jax.Array's stubs
        return committed

    def __getitem__(self, index: Any) -> jax.Array:
        """`x[index]`, as `jnp.asarray(x)[index]`: the cached device buffer indexed. Inside a
        compiled program, a part of the constant's parameter: no data, no new device buffer.
        Of a host-resident constant inside a compiled program, the part sliced in host memory
        and only that part moved to the device."""
        store = self._store
        if isinstance(store, Store) and store.memory.streams:
            part = store.item(self._declared(), _unwrap(index))
            if part is not None:
                return part
        return _getitem(self, index)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __contains__(self, value: Any) -> bool:
        """`value in x`, as `value in jnp.asarray(x)`: one comparison on the device where JAX
        has one (jax >= 0.10), not Python's fallback (`__iter__`), element by element."""
        return _unwrap(value) in self.__jax_array__()

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        """The array API namespace of `jnp.asarray(x)`: `jax.numpy`, so that array-API code
        (`xp = x.__array_namespace__()`, `array_api_compat.array_namespace(x)`) takes a constant
        as it takes a `jax.Array`. `api_version` as JAX takes it."""
        return self.__jax_array__().__array_namespace__(api_version=api_version)

    def astype(self, dtype: Any = _NO_DTYPE, copy: bool = False, device: Any = None) -> jax.Array:
        """`jnp.asarray(x).astype(dtype, copy, device)`, refused with a `FrozenConstTypeError`
        where the device's compiler would abort the process on the conversion (into int2 or
        uint2 on a TPU): `FrozenConst(x, dtype=...)` converts on the host instead."""
        array = self.__jax_array__()
        if dtype is _NO_DTYPE:  # as `jax.Array.astype()` answers it
            return array.astype(copy=copy, device=device)
        # A traced use compiles for the default backend.
        platforms = (
            {jax.default_backend()} if isinstance(array, Tracer) else {d.platform for d in array.devices()}
        )
        if dtype is not None:
            for platform in platforms:
                check_conversion(platform, np.dtype(dtype), f"x.astype({np.dtype(dtype)})")
        return array.astype(dtype, copy=copy, device=device)

    def block_until_ready(self) -> FrozenConst:
        """Wait until the cached device buffer is ready; returns `x` itself, as
        `jax.Array.block_until_ready` returns its array."""
        self.__jax_array__().block_until_ready()
        return self

    def __repr__(self) -> str:
        return self._held().describe()

    if TYPE_CHECKING:
        # What runs: a `jax.Array`, computed from the constant's buffer. JAX 0.12's stubs type
        # these `-> Self`, which would make each a FrozenConst to a type checker (`x.T.evict()`
        # passing mypy and pyright, failing when run). The ignores name the
        # override of `Self`; on a JAX whose stubs return `Array` there is nothing to ignore.
        def __round__(self, ndigits: Any = None) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def __neg__(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def __pos__(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def __abs__(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def __invert__(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def __iter__(self) -> Iterator[jax.Array]: ...
        def conj(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def conjugate(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def copy(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def flatten(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def ravel(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def repeat(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def reshape(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def round(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def squeeze(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def swapaxes(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def take(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def transpose(self, *args: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def view(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def addressable_data(self, index: int) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        def to_device(self, *args: Any, **kwargs: Any) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        @property
        def T(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        @property
        def mT(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        @property
        def real(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]
        @property
        def imag(self) -> jax.Array: ...  # type: ignore[override, unused-ignore]

    # -- immutability, identity, pickling --------------------------------------

    def __setitem__(self, index: Any, value: Any) -> None:
        raise FrozenConstTypeError(
            "FrozenConst is immutable and does not support item assignment. "
            "Use `x.at[index].set(value)`, which returns a new `jax.Array`."
        )

    def __hash__(self) -> int:
        """A constant is unhashable, as a `jax.Array` is; a value derived from one hashes as its leaf.

        `jax.tree.map(f, tree)` over a tree holding a constant puts `f`'s result, the leaf, in
        the constant's place, inside a FrozenConst (a derived value). Where that leaf is
        hashable (an `id`, a shape, bytes, a `jax.ShapeDtypeStruct`), the derived value is a
        stand-in for it: equal to what its leaf equals (`==` is the leaf's, as every operator
        is) and hashed as the leaf, so a tree mapped to a cache key (numpyro's `MCMC` keys its
        compiled sampler that way) is a key, as it is with a `jax.Array` in the constant's
        place. Around an array or a traced value it is unhashable, as they are.

        Examples:
            >>> import jax, numpy as np
            >>> from frozenconst import FrozenConst
            >>> table = FrozenConst(np.arange(3.0))
            >>> key = jax.tree.map(lambda a: a.shape, (table,))
            >>> {key: "compiled"}[jax.tree.map(lambda a: a.shape, (table,))]
            'compiled'
        """
        if self._sharding is None:
            held = self._store
            leaf = held.leaf
            if not held.concrete and not isinstance(leaf, _UNHASHABLE_LEAVES):
                return hash(leaf)
        raise TypeError("unhashable type: 'FrozenConst'")

    def __copy__(self) -> FrozenConst:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenConst:
        return self

    def __reduce__(self) -> tuple[Callable[..., FrozenConst], tuple[Any, ...]]:
        # The host data, and the declared sharding described by device platform
        # and id (JAX's devices, and so its shardings, do not pickle). Device
        # buffers are recreated on first use after unpickling, and the unpickled
        # copy is frozen again. The read-only host buffer itself is pickled: the
        # unpickled array is the caller's, and `FrozenConst` copies it.
        # The dtype travels too: the host data is unpickled as it was held, whatever
        # the x64 setting of the unpickling process (float64 stays float64).
        if self._store is NO_LEAF:
            # The placeholder a tree of `None`s holds in a constant's place (`eqx.partition`'s
            # other half, `jax.tree.map(lambda v: None, tree)`): pickled as that, as the tree
            # would be with a `jax.Array` there.
            return (_placeholder, ())
        held = self._held()
        host = held.whole("pickle.dumps(x)")
        sharding = self._declared()
        if getattr(held, "residency", "device") == "host":
            # Host-resident again: a constant bigger than the device stays loadable.
            state = None if sharding is None else _sharding_state(sharding)
            return (_unpickle_resident, (host, state))
        if sharding is None:
            if getattr(held, "weak", False):
                return (_unpickle_weak, (host,))  # weakly typed again (`FrozenConst(0.5)`)
            return (_unpickle, (host,))
        return (_unpickle_placed, (host, _sharding_state(sharding)))

    def __format__(self, format_spec: str) -> str:
        """`format(x, spec)` as `format(jnp.asarray(x), spec)`: `f"{x:.2f}"` formats the values.

        An empty spec gives `str(x)` (`f"{x}"` shows a FrozenConst, as `f"{a}"`
        equals `str(a)` for a `jax.Array`).
        """
        if not format_spec:
            return str(self)
        return format(self.__jax_array__(), format_spec)

    def __dir__(self) -> list[str]:
        # What a constant answers: its own names and its buffer's, not the refused ones nor
        # a tracer's own (forwarded too, for a value derived inside a transformation).
        return sorted(set(super().__dir__()) - _UNLISTED)

    # Every other public `jax.Array` attribute and method (`sum`, `reshape`, `T`, `at`,
    # `sharding`, ...) is a property installed below the class (`_install`)
    # that reads it off the cached device buffer.


# -- pickling a declared sharding -------------------------------------------------
# A sharding travels as plain values: the kind of sharding, the devices by
# platform and id, mesh shape, axis names and types, the PartitionSpec's entries
# and the memory kind. Unpickling rebuilds it from the devices of that process;
# where it cannot (no such device, another kind of sharding), it warns once and
# the constant loads without one.


_partition_spec: Callable[..., PartitionSpec] = PartitionSpec  # untyped constructor


def _spec_state(spec: PartitionSpec) -> tuple[Any, ...] | None:
    entries = tuple(spec)
    simple = all(
        e is None or isinstance(e, str) or (isinstance(e, tuple) and all(isinstance(a, str) for a in e))
        for e in entries
    )
    if not simple or getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
        return None
    return entries


def _sharding_state(sharding: jax.sharding.Sharding) -> tuple[Any, ...]:
    """A picklable description of `sharding` (built from ints and strings only)."""
    if is_single_device_sharding(sharding):
        device: Any
        (device,) = sharding.device_set
        return ("single", device.platform, device.id, sharding.memory_kind)
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        mesh = sharding.mesh
        spec = _spec_state(sharding.spec)
        devices: list[Any] = list(mesh.devices.flat)
        if spec is not None and devices:
            return (
                "named",
                devices[0].platform,
                tuple(mesh.devices.shape),
                tuple(d.id for d in devices),
                tuple(mesh.axis_names),
                tuple(t.name for t in mesh.axis_types),
                spec,
                sharding.memory_kind,
            )
    return ("unsupported", str(sharding))


def _find_device(platform: str, device_id: int) -> Any:
    try:
        devices = jax.devices(platform)
    except RuntimeError as err:
        raise LookupError(f"this process has no {platform} devices ({err})") from err
    for device in devices:
        if device.id == device_id:
            return device
    raise LookupError(f"this process has no {platform} device with id {device_id} ({len(devices)} in all)")


def _rebuild_sharding(state: tuple[Any, ...]) -> jax.sharding.Sharding:
    if state[0] == "single":
        _, platform, device_id, memory_kind = state
        return single_device_sharding(_find_device(platform, device_id), memory_kind=memory_kind)
    if state[0] == "named":
        _, platform, shape, ids, axis_names, axis_types, spec, memory_kind = state
        devices = np.array([_find_device(platform, device_id) for device_id in ids], dtype=object)
        mesh = Mesh(
            devices.reshape(shape),
            axis_names,
            axis_types=tuple(jax.sharding.AxisType[name] for name in axis_types),
        )
        return NamedSharding(mesh, _partition_spec(*spec), memory_kind=memory_kind)
    raise LookupError(f"frozenconst cannot carry a placement of this kind through pickle ({state[1]})")


def _placeholder() -> FrozenConst:
    """Unpickle the placeholder of a tree of `None`s: the one `tree_unflatten` makes of `None`."""
    made = FrozenConst.tree_unflatten(None, (None,))
    assert isinstance(made, FrozenConst)
    return made


def _unpickle(host: np.ndarray[Any, Any]) -> FrozenConst:
    """Unpickle a constant: the live one of this content where there is one, else a new one."""
    return with_live_twin(FrozenConst(host, host.dtype))


def _unpickle_weak(host: np.ndarray[Any, Any]) -> FrozenConst:
    """Unpickle a constant made from a Python scalar: its host data as it was held, weakly typed."""
    store = Store(frozen_copy(host, host.dtype), host_memory_choice(None), weak=True)
    return with_live_twin(FrozenConst._of(store))  # pyright: ignore[reportPrivateUsage] - its own class's constructor


def _unpickle_resident(host: np.ndarray[Any, Any], state: tuple[Any, ...] | None) -> FrozenConst:
    """Unpickle a host-resident constant (its placement, where there was one)."""
    made = _unpickle(host) if state is None else _unpickle_placed(host, state)
    resident = FrozenConst(made, residency="host")
    declared = made._declared()  # pyright: ignore[reportPrivateUsage] - its own class's
    return resident if declared is None else resident.placed(declared)


def _unpickle_placed(host: np.ndarray[Any, Any], state: tuple[Any, ...]) -> FrozenConst:
    """Unpickle a constant with its placement, or, where it cannot be rebuilt here, without."""
    try:
        sharding = as_sharding(_rebuild_sharding(state), host.shape)
    except Exception as err:  # any failure to rebuild: JAX raises several kinds
        warnings.warn(
            f"Unpickled a FrozenConst without its declared sharding: {err}. It now follows "
            "`jax.default_device`; declare one with `x.placed(...)`.",
            FrozenConstWarning,
            stacklevel=2,
        )
        return _unpickle(host)
    return with_live_twin(FrozenConst(host, host.dtype, sharding=sharding))


def with_live_twin(x: FrozenConst) -> FrozenConst:
    """`x`, or where a constant of the same content is live, a handle on that one with `x`'s
    declared sharding: its host and device buffers, never a second copy."""
    store = x._held()  # pyright: ignore[reportPrivateUsage] - its own class's
    declared = x._declared()  # pyright: ignore[reportPrivateUsage]
    twin = live_twin(store) if isinstance(store, Store) else None  # a whole store: `home` is None
    return x if twin is None else FrozenConst._of(twin, declared)  # pyright: ignore[reportPrivateUsage]


def content_key(x: FrozenConst) -> tuple[str, bool]:
    """What `intern` compares of a concrete constant: its fingerprint and whether it is weakly typed."""
    store = x._held()  # pyright: ignore[reportPrivateUsage] - its own class's
    return store.fingerprint, bool(getattr(store, "weak", False))


def derived_leaf(x: object) -> Any | None:
    """The value a FrozenConst holding a derived value holds (a tracer inside a transformation);
    None for a constant or anything else."""
    if not isinstance(x, FrozenConst):
        return None
    # A copy's array itself, without making its record: `frozenconst.filter_jit` asks this of
    # every argument and output on every call. A constant's store has no leaf (None).
    held = x._store  # pyright: ignore[reportPrivateUsage]
    return held if x._sharding is COPY else held.leaf  # pyright: ignore[reportPrivateUsage]


def _unwrap(value: Any) -> Any:
    return value.__jax_array__() if isinstance(value, FrozenConst) else value


def _forward(name: str) -> Any:
    def method(self: FrozenConst, *args: Any) -> Any:
        return getattr(self.__jax_array__(), name)(*map(_unwrap, args))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Same as `jax.Array.{name}` on the cached device buffer."
    return method


def _forward_binary(name: str) -> Any:
    # The common case, one operand, without `*args` and `map`, and with `jax.Array`'s own
    # function where the buffer is a concrete array (a tracer's is looked up by name):
    # `x @ w` was the cache hit furthest from the one-slot floor.
    # `impl` is None where the class lacks the operator (or JAX lacks the class): every
    # buffer's is then looked up by name, at no extra check per call.
    on_array = getattr(ArrayImpl, name, None)
    impl = None if on_array is None else ArrayImpl

    def method(self: FrozenConst, other: Any) -> Any:
        if isinstance(other, FrozenConst):
            other = other.__jax_array__()
        array = self.__jax_array__()
        if type(array) is impl:
            return on_array(array, other)  # type: ignore[misc]
        return getattr(array, name)(other)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Same as `jax.Array.{name}` on the cached device buffer."
    return method


# Operators: each forwards to `jax.Array`'s own, so results, dtype promotion and
# errors are exactly those of `jnp.asarray(x) <op> other`.
_OPERATORS = [
    *("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__"),
    *("__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__divmod__", "__rdivmod__"),
    *("__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__"),
    *("__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__"),
    *("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"),
]
# Those taking other than exactly one operand (`round(x)` and `round(x, 2)`), and the scalar
# conversions and iteration, which `jax.Array` allows as well.
_NOT_BINARY = [
    *("__neg__", "__pos__", "__abs__", "__invert__", "__round__"),
    *("__bool__", "__int__", "__float__", "__complex__", "__index__", "__iter__"),
]


# `x[index]` wherever `FrozenConst.__getitem__` does not read the host data.
_getitem: Callable[[FrozenConst, Any], jax.Array] = _forward_binary("__getitem__")


def _forwarded(name: str) -> property:
    def get(self: FrozenConst) -> Any:
        return getattr(self.__jax_array__(), name)

    get.__name__ = get.__qualname__ = name
    return property(get, doc=f"Same as `jax.Array.{name}`, read off the cached device buffer.")


def _refused(name: str) -> property:
    def get(self: FrozenConst) -> Any:
        raise AttributeError(
            f"FrozenConst does not offer `{name}`: it would free the shared, cached "
            "device buffer. Use `x.evict()` to drop the cached buffers."
        )

    get.__name__ = get.__qualname__ = name
    return property(get)


def _install() -> None:
    for name in _OPERATORS:
        setattr(FrozenConst, name, _forward_binary(name))
    for name in _NOT_BINARY:
        setattr(FrozenConst, name, _forward(name))
    # A name FrozenConst defines itself (`shape`, `dtype`, ...) stays its own. A name no
    # JAX array has raises the usual AttributeError; one that the buffer lacks (a tracer's
    # own, on a concrete constant) raises the buffer's, as `getattr(jnp.asarray(x), name)`.
    for name in sorted(array_attributes()):
        if name in _REFUSED:
            setattr(FrozenConst, name, _refused(name))
        elif not hasattr(FrozenConst, name):
            setattr(FrozenConst, name, _forwarded(name))


_install()
_UNLISTED = _REFUSED | (array_attributes() - array_attributes(tracers=False))
