"""The device cache: one `jax.Array` per placement, transferred once from the frozen host buffer."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Sharding, SingleDeviceSharding

from ._compat import DEFAULT_DEVICE, X64, Device, Tracer, eval_context
from ._fingerprint import fingerprint
from ._host import check_narrowing

_K = TypeVar("_K")


@functools.lru_cache(maxsize=64)
def _default_device(setting: Any) -> Device:
    # Mirrors how `jax.device_put(x)` picks a device when given none: the
    # `jax_default_device` setting (a device or a platform name), else the
    # first local device of the default backend. Cached: the devices of a
    # process never change once its backends are up.
    device: Device
    if setting is None:
        device = jax.local_devices()[0]
    elif isinstance(setting, str):
        device = jax.local_devices(backend=setting)[0]
    else:
        device = setting
    return device


@dataclasses.dataclass(frozen=True)
class Placement:
    """One cached device placement of a constant (see `FrozenConst.placements`).

    Attributes:
        sharding: where the buffers live.
        dtype: the device dtype.
        committed: `False` for the default placement, which follows
            `jax.default_device` and combines with arrays on any device, like
            `jnp.asarray(np_array)`; `True` for `x.on(target)` placements.
        device_bytes: bytes held on each addressable device.
    """

    sharding: Sharding
    dtype: np.dtype[Any]
    committed: bool
    device_bytes: Mapping[Device, int]


def _placement(array: jax.Array) -> Placement:
    per_device: dict[Device, int] = {}
    for shard in array.addressable_shards:
        per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return Placement(
        array.sharding, np.dtype(array.dtype), array.committed, types.MappingProxyType(per_device)
    )


def _drop(table: dict[_K, jax.Array], doomed: Callable[[_K, jax.Array], bool]) -> None:
    for key in [k for k, a in table.items() if doomed(k, a)]:
        del table[key]


class _Accounting:
    """Whether cache hits are counted (`frozenconst.set_accounting`)."""

    enabled = True


ACCOUNTING = _Accounting()


class _Epoch:
    """Bumped whenever any constant's default-device cache changes (a transfer,
    an eviction), so `frozenconst.jit` can reuse the arrays it fed last time."""

    value = 0


CACHE_EPOCH = _Epoch()


class FedArrays:
    """Base of what keeps device arrays it fed to a compiled function (`frozenconst.jit`),
    so that an eviction reaches it: after `x.evict()` nothing frozenconst holds is
    on the evicted buffers."""

    __slots__ = ("__weakref__",)

    def forget(self, store: Store | None = None) -> None:
        """Drop the arrays kept (those of `store`, or all)."""


# Every live holder of fed arrays, held weakly.
FED: weakref.WeakSet[FedArrays] = weakref.WeakSet()

# Constants are numbered in order of creation: `frozenconst.jit` takes a number
# when a trace starts, and a constant numbered above it was made by that trace.
_SERIALS = itertools.count(1)


def next_serial() -> int:
    """A number above that of every constant made so far."""
    return next(_SERIALS)


def set_accounting(enabled: bool) -> None:
    """Count cache hits (the default), or not. Transfers and bytes are always accounted.

    The benchmark suite measures the cost of counting against not counting.
    """
    ACCOUNTING.enabled = bool(enabled)


class _Retired:
    """Counts carried over from constants that have been garbage-collected."""

    hits = 0
    transfers = 0


RETIRED = _Retired()
# Every live store, for `frozenconst.stats()` and the audit's kind lookup.
LIVE: weakref.WeakSet[Store] = weakref.WeakSet()
# id(cached array) -> its store, held weakly: lets a pytree rebuilt from the
# constant's own buffer (a jit output passed through, `eqx.combine`, a flax
# NNX state round trip) be the constant again. Ids can be reused after an
# array dies, so `owner_of` confirms by identity.
OWNERS: weakref.WeakValueDictionary[int, Store] = weakref.WeakValueDictionary()


def owner_of(leaf: object) -> tuple[Store, Sharding | None] | None:
    """The store and placement whose cached array `leaf` is (the very object), if any."""
    store = OWNERS.get(id(leaf))
    if store is None:
        return None
    return store.placement_of(leaf)


class Store:
    """A frozen host buffer and the device buffers made from it.

    Several `FrozenConst` handles can share one store (`FrozenConst(other)`,
    `x.placed(...)`), so they share the device buffers too. The store dies with
    its last handle, and its device buffers with it.
    """

    __slots__ = (
        "__weakref__",
        "_by_device",
        "_fingerprint",
        "_host",
        "_lock",
        "_placed",
        "_placed_by_dtype",
        "by_setting",
        "dtype",
        "hits",
        "serial",
        "shape",
        "transfers",
    )

    # Whether this process holds only some slices (`_partial.PartialStore`).
    partial: bool = False

    def __init__(self, host: np.ndarray[Any, Any]) -> None:
        self._host = host
        self._setup(host.shape, host.dtype)

    def _setup(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.shape: tuple[int, ...] = shape
        self.dtype: np.dtype[Any] = dtype
        self.serial = next_serial()
        self._lock = threading.Lock()
        self._fingerprint: str | None = None
        # Accounting (`frozenconst.stats()`): uses served from the cache, and
        # host-to-device transfers made (one per shard).
        self.hits = 0
        self.transfers = 0
        LIVE.add(self)
        # (jax_default_device setting, x64 flag) -> array: the hit path, one
        # dict lookup. Several settings can resolve to the same device buffer.
        self.by_setting: dict[tuple[Any, Any], jax.Array] = {}
        # (device, device dtype) -> array: the default buffers themselves.
        self._by_device: dict[tuple[Device, np.dtype[Any]], jax.Array] = {}
        # (sharding, x64 flag) -> array, and (sharding, device dtype) -> array:
        # the committed placements made by `on`.
        self._placed: dict[tuple[Sharding, Any], jax.Array] = {}
        self._placed_by_dtype: dict[tuple[Sharding, np.dtype[Any]], jax.Array] = {}

    # -- the host side ---------------------------------------------------------

    @property
    def host(self) -> np.ndarray[Any, Any]:
        """The whole frozen host buffer."""
        return self._host

    def whole(self, what: str) -> np.ndarray[Any, Any]:
        """The whole frozen host buffer, which `what` (an operation, in words) needs."""
        return self._host

    def host_buffers(self) -> tuple[np.ndarray[Any, Any], ...]:
        """Every frozen host buffer this process holds for the constant."""
        return (self._host,)

    @property
    def host_nbytes(self) -> int:
        """Bytes of the frozen host buffers this process holds."""
        return sum(b.nbytes for b in self.host_buffers())

    def check_device_dtype(self, dtype: np.dtype[Any]) -> None:
        """Raise unless the host data keeps every integer on a device as `dtype`."""
        check_narrowing(self._host, dtype)

    # -- the default placement -------------------------------------------------

    def default_array(self) -> jax.Array:
        """The buffer on the default device, in the dtype JAX would give the host data now."""
        key = (DEFAULT_DEVICE.value, X64.value)
        array = self.by_setting.get(key)
        # A cached buffer can be deleted behind our back: by `Array.delete()`,
        # or by donation to a jitted function (`donate_argnums`).
        if array is None or array.is_deleted():
            return self._transfer_default(key)
        if ACCOUNTING.enabled:
            self.hits += 1
        return array

    def _transfer_default(self, key: tuple[Any, Any]) -> jax.Array:
        device = _default_device(key[0])
        dtype = jax.dtypes.canonicalize_dtype(self.dtype)
        with self._lock:
            array = self._by_device.get((device, dtype))
            if array is None or array.is_deleted():
                self.check_device_dtype(dtype)  # x64 may have been switched off since construction
                with eval_context():
                    # No `device` argument: the result stays uncommitted, like
                    # `jnp.asarray(np_array)`, so it combines with arrays on any
                    # device. It lands on `device`, the current default.
                    fresh: jax.Array = jax.device_put(self.host)
                array = fresh
                traced = isinstance(array, Tracer)  # never cached: it would leak (see `_compat.eval_context`)
                if traced:
                    return array
                self.transfers += 1
                self._by_device[(device, dtype)] = array
                OWNERS[id(array)] = self
            self.by_setting[key] = array
            CACHE_EPOCH.value += 1
            return array

    # -- explicit placements ---------------------------------------------------

    def placed(self, sharding: Sharding) -> jax.Array:
        """The committed array with exactly `sharding`, built once per distinct sharding."""
        key = (sharding, X64.value)
        array = self._placed.get(key)
        if array is None or array.is_deleted():
            return self._place(key)
        if ACCOUNTING.enabled:
            self.hits += 1
        return array

    def _place(self, key: tuple[Sharding, Any]) -> jax.Array:
        sharding = key[0]
        dtype = jax.dtypes.canonicalize_dtype(self.dtype)
        with self._lock:
            array = self._placed_by_dtype.get((sharding, dtype))
            if array is None or array.is_deleted():
                self.check_device_dtype(dtype)
                with eval_context():
                    array = self._build(sharding, dtype)
                traced = isinstance(array, Tracer)  # never cached: it would leak (see `_compat.eval_context`)
                if traced:
                    return array
                self._placed_by_dtype[(sharding, dtype)] = array
                OWNERS[id(array)] = self
            self._placed[key] = array
            return array

    def _build(self, sharding: Sharding, dtype: np.dtype[Any]) -> jax.Array:
        if isinstance(sharding, SingleDeviceSharding):
            (device,) = sharding.device_set
            existing = self._by_device.get((device, dtype))
            if existing is not None and not existing.is_deleted():
                # Committing the default buffer on the same device is free:
                # JAX hands back the same buffer (checked on 0.10.2 and 0.12.0.1).
                committed: jax.Array = jax.device_put(existing, sharding)
                return committed
            single: jax.Array = jax.device_put(self.host, sharding)
            self.transfers += 1
            return single
        host = self.host
        convert = host.dtype != dtype

        # Each process builds only its addressable shards, each straight from
        # the frozen host buffer: never a full copy on one device first.
        def shard(index: Any) -> np.ndarray[Any, Any]:
            self.transfers += 1  # called under the lock, once per addressable shard
            part: np.ndarray[Any, Any] = host[index]
            return part.astype(dtype) if convert else part

        return jax.make_array_from_callback(host.shape, sharding, shard)

    # -- eviction and accounting -----------------------------------------------

    def evict(self, sharding: Sharding | None = None) -> None:
        """Forget device buffers: all of them, or those with `sharding` (and, for a
        single-device sharding, the default buffer on that device). The next use transfers again."""
        CACHE_EPOCH.value += 1
        for holder in list(FED):
            holder.forget(self)
        with self._lock:
            if sharding is None:
                for table in (self.by_setting, self._by_device, self._placed, self._placed_by_dtype):
                    table.clear()
                return
            _drop(self._placed, lambda key, _: key[0] == sharding)
            _drop(self._placed_by_dtype, lambda key, _: key[0] == sharding)
            if isinstance(sharding, SingleDeviceSharding):
                (device,) = sharding.device_set
                gone = {id(a) for k, a in self._by_device.items() if k[0] == device}
                _drop(self._by_device, lambda key, _: key[0] == device)
                _drop(self.by_setting, lambda _, array: id(array) in gone)

    def placements(self) -> tuple[Placement, ...]:
        """The live cached placements, defaults first."""
        with self._lock:
            arrays = [*self._by_device.values(), *self._placed_by_dtype.values()]
        return tuple(_placement(a) for a in arrays if not a.is_deleted())

    def placement_of(self, leaf: object) -> tuple[Store, Sharding | None] | None:
        """(self, placement) if `leaf` is one of this store's cached arrays, else None."""
        with self._lock:
            if any(a is leaf for a in self._by_device.values()):
                return self, None
            for (sharding, _), array in self._placed_by_dtype.items():
                if array is leaf:
                    return self, sharding
        return None

    @property
    def fingerprint(self) -> str:
        """The content digest, computed once on first request."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.whole("x.fingerprint"))
        return self._fingerprint

    def __del__(self, _retired: _Retired = RETIRED) -> None:
        # The default argument keeps the counter reachable at interpreter
        # shutdown, when module globals may already be gone.
        _retired.hits += self.hits
        _retired.transfers += self.transfers

    def cached(self) -> list[jax.Array]:
        """The live cached device arrays, one per placement."""
        with self._lock:
            arrays = [*self._by_device.values(), *self._placed_by_dtype.values()]
        return [a for a in arrays if not a.is_deleted()]
