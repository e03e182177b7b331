"""The device cache: one `jax.Array` per placement, transferred once from the frozen host buffer.

`Store.array` is the path every use takes, a hit one dict lookup (`Store.hot` for the default
placement). A buffer dropped (`evict`) or lost (donated, deleted) is told to `STATE.dropped`, so
that compiled programs holding it let go (`_hoist.dropped`) without this module knowing of jit.
While a device budget is in force (`_budget`), and for a host-resident constant, every use
comes to `Store._fill` instead, so the hit of every other constant is what it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeAlias

import jax
import numpy as np
from jax.sharding import Sharding
from numpy.typing import DTypeLike

from ._compat import (
    DEFAULT_DEVICE,
    X64,
    Device,
    Tracer,
    eval_context,
    is_single_device_sharding,
    shared_sharding,
    tracing,
    weakly_typed,
)
from ._convert import as_dtype, check_narrowing, frozen_copy
from ._dtypes import check_computes_on, follows_x64, held_dtype, native
from ._errors import FrozenConstWarning
from ._fingerprint import fingerprint
from ._frames import origin_module, user_stacklevel, warn_degraded
from ._host import human_bytes
from ._host_memory import PAGEABLE, HostMemory, Residency, Resident, host_copy, residency_choice
from ._targets import Target, as_sharding

_REPR_MAX_ELEMENTS = 64


@functools.lru_cache(maxsize=64)
def _default_device(setting: Any) -> Device:
    # As `jax.device_put(x)` picks one: the `jax_default_device` setting (a device or a platform
    # name), else the default backend's first. Cached: a process's devices never change.
    if isinstance(setting, str):
        setting = jax.local_devices(backend=setting)[0]
    device: Device = jax.local_devices()[0] if setting is None else setting
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

    @classmethod
    def of(cls, array: jax.Array) -> Placement:
        """The placement of a cached device buffer."""
        per_device: dict[Device, int] = {}
        for shard in array.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
        return cls(array.sharding, np.dtype(array.dtype), array.committed, types.MappingProxyType(per_device))


class Budget(Protocol):
    """What `Store._fill` asks of a device budget in force (`_budget.DeviceBudget`)."""

    # Taken before any store's lock while the budget makes room: it evicts other constants.
    lock: threading.RLock
    # Bytes per device (an int), or a fraction of each device's memory (a float).
    limit: int | float

    def make_room(self, store: Store, incoming: Mapping[Device, int]) -> None:
        """Evict other constants until `incoming` bytes per device fit, or raise."""


# A bucket of `LiveStores`: `(None, shape, dtype)` for whole constants not digested yet,
# `(fingerprint, weak type, host memory)` for those digested, `(_PARTIAL, None, None)` for
# constants of which this process holds slices (never anyone's twin).
_Bucket: TypeAlias = "tuple[str | None, Any, Any]"
_PARTIAL = "partial"  # never a fingerprint, which starts with its algorithm's name
_ABSENT = object()


class LiveStores:
    """Every live store, filed so that finding a constant's twin is one lookup, not a scan.

    A construction only adds to `fresh` (a dict: taking one entry out of a large set scans its
    table), with no digest and no lock. A lookup (`twin`) files the fresh stores by shape and
    dtype, then digests those of its own shape and dtype and files them by content: each
    constant is digested at most once, and only where its shape and dtype are looked up.
    `buckets` and `filed` change under `lock`; `lookups` lets one lookup at a time digest
    (outside `lock`), so that two lookups of one content find each other.
    """

    def __init__(self) -> None:
        self.fresh: dict[weakref.ref[Store], None] = {}
        # Reentrant: a store dying while the lock is held (its last reference dropped by the
        # holder) calls `gone` in the same thread.
        self.lock = threading.RLock()
        self.lookups = threading.Lock()
        # Each bucket in the order its stores were filed: the first live one of a content is
        # every lookup's answer, so lookups racing for one content agree on it.
        self.buckets: dict[_Bucket, dict[weakref.ref[Store], None]] = {}
        self.filed: dict[weakref.ref[Store], _Bucket] = {}

    def add(self, store: Store) -> None:
        """A new store: fresh, until a lookup files it."""
        self.fresh[weakref.ref(store, self.gone)] = None

    def gone(self, ref: weakref.ref[Store]) -> None:
        """A store died: its entry goes (a dead reference keeps its hash, and equals only itself)."""
        if self.fresh.pop(ref, _ABSENT) is not _ABSENT:
            return  # (where a lookup has taken it out, the lookup finds it dead, and files nothing)
        with self.lock:
            key = self.filed.pop(ref, None)
            if key is not None:
                self._unfile(ref, key)

    def _unfile(self, ref: weakref.ref[Store], key: _Bucket) -> None:
        """Take `ref` out of its bucket, and the bucket out where it empties (under `lock`)."""
        bucket = self.buckets.get(key)
        if bucket is None:
            return  # taken out by a lookup, which files only the living
        bucket.pop(ref, None)
        if not bucket:
            del self.buckets[key]
            if not self.buckets:
                # A dict keeps the size it grew to: the emptied ones are let go.
                self.buckets, self.filed = {}, {}

    def _file(self, filing: list[tuple[weakref.ref[Store], _Bucket]]) -> None:
        """File each live one of `filing` under its bucket (under `lock`)."""
        for ref, key in filing:
            if ref() is None:
                continue  # died since it was taken out: its `gone` found nothing to remove
            self.filed[ref] = key
            self.buckets.setdefault(key, {})[ref] = None

    def __iter__(self) -> Iterator[Store]:
        with self.lock:
            refs = [*self.fresh, *self.filed]
        return (store for store in (ref() for ref in refs) if store is not None)

    def twin(self, store: Store) -> Store | None:
        """Another live whole store with `store`'s content, weak type, host memory and residency,
        if any."""
        with self.lookups:
            filing: list[tuple[weakref.ref[Store], _Bucket]] = []
            while self.fresh:
                try:
                    ref, _ = self.fresh.popitem()  # the newest
                except KeyError:  # the last taken out by a death meanwhile
                    break
                other = ref()
                if other is not None:
                    key = (_PARTIAL, None, None) if other.partial else (None, other.shape, other.dtype)
                    filing.append((ref, key))
                del other
            filing.reverse()  # filed oldest first: a bucket's first live store is its oldest
            with self.lock:
                self._file(filing)
                undigested = self.buckets.pop((None, store.shape, store.dtype), {})
                for ref in undigested:
                    self.filed.pop(ref, None)
            # Digested outside `lock` (hashlib releases the GIL): constructions go on meanwhile.
            filing = []
            for ref in undigested:
                other = ref()
                if other is not None:
                    filing.append(
                        (ref, (other.fingerprint, other.weak, (other.host_memory, other.residency)))
                    )
                del other
            mine = (store.fingerprint, store.weak, (store.host_memory, store.residency))
            with self.lock:
                self._file(filing)
                # A copy: a store dying now (a collection, here) takes itself out of its bucket.
                for ref in list(self.buckets.get(mine, ())):
                    other = ref()
                    if other is not None:
                        # The first filed: `store` itself where it is (no twin: the one to keep).
                        return None if other is store else other
        return None


# The state the cache keeps for the whole process, in one object: `from ._cache
# import STATE` binds the object, so every module reads and writes the same fields.
class _State:
    __slots__ = (
        "accounting",
        "budget",
        "dropped",
        "live",
        "outlived",
        "retired_evictions",
        "retired_hits",
        "retired_retransfers",
        "retired_transfers",
    )

    def __init__(self) -> None:
        # Whether cache hits are counted (`frozenconst.set_accounting`).
        self.accounting = True
        # Counts carried over from constants that have been garbage-collected.
        self.retired_hits = self.retired_transfers = self.retired_evictions = self.retired_retransfers = 0
        # The device budget in force (`frozenconst.set_device_budget`), or None.
        self.budget: Budget | None = None
        # Every live store, for `frozenconst.stats()`, the audit's kind lookup and finding a
        # constant's twin (`live_twin`).
        self.live = LiveStores()
        # Told of a store whose device buffer was evicted or lost, after the fact, whether
        # anything besides the store still holds the old buffer (a trace JAX cached, a
        # program), and weak references to the evicted buffers (None: lost): whatever holds
        # them lets go of them (`_hoist.dropped`, appended by
        # `_install.install`, the seam through which the jit side plugs into the core).
        self.dropped: list[Callable[[Store, bool, list[weakref.ref[jax.Array]] | None], None]] = []
        # Told, as a store dies, of the device buffers it held and the module that made it: a
        # buffer something else still holds (a trace JAX keeps of a function that made the
        # constant, `frozenconst.intern(table)` inside a jitted function) is still known to the
        # lowering of that trace (`_hoist.outlived`, appended by `_install.install`).
        self.outlived: list[Callable[[list[jax.Array], str], None]] = []


STATE = _State()
# The order of uses, for a budget's least recently used (`Store.used`).
_CLOCK = itertools.count(1)
# The lock `_fill` takes where no budget is in force: none.
_UNLOCKED = contextlib.nullcontext()
# The key of a use `Store._cached` serves nothing under.
_UNSERVED = object()


def in_device_memory(array: jax.Array) -> bool:
    """Whether `array` lives in device memory, not in a host memory kind (`pinned_host`)."""
    return not str(array.sharding.memory_kind or "device").endswith("host")


def set_accounting(enabled: bool) -> None:
    """Count cache hits (the default), or not. Transfers and bytes are always accounted."""
    STATE.accounting = bool(enabled)


def _weakly_typed(array: jax.Array) -> jax.Array:
    """`array` marked weakly typed (a constant of a Python scalar), where this JAX can."""
    marked: jax.Array | None = weakly_typed(array)
    if marked is not None:
        return marked
    warn_degraded(  # pragma: no cover - every supported JAX takes it
        f"frozenconst cannot mark a device buffer weakly typed on jax {jax.__version__}: a "
        "FrozenConst of a Python scalar promotes as `jnp.asarray(np.float32(0.5))`, not as "
        "`jnp.asarray(0.5)`. Give it the dtype you compute with."
    )
    return array  # pragma: no cover


class Owners:
    """Whose cached array each device buffer is, so that a pytree rebuilt from the constant's own
    buffer (a jit output, `eqx.combine`, an NNX state round trip) is the constant again.

    `refs` (array id to weak store reference) is read without a lock; it changes under the
    reentrant lock (a dying store calls `forget` while it is held). Ids are reused, so a reader
    confirms by identity (`Store.sharding_of`).
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.refs: dict[int, weakref.ref[Store]] = {}

    def reference(self, store: Store, keys: set[int]) -> weakref.ref[Store]:
        """The weak reference `store`'s entries hold: when it dies, those of `keys` (the ids
        of its cached arrays, `Store.owned`) go."""
        return weakref.ref(store, lambda ref: self.forget(ref, keys))

    def add(self, array: jax.Array, store: Store) -> None:
        with self.lock:
            self.refs[id(array)] = store.owner
            store.owned.add(id(array))

    def discard(self, array: jax.Array, store: Store) -> None:
        with self.lock:
            if self.refs.get(id(array)) is store.owner:
                del self.refs[id(array)]
                store.owned.discard(id(array))

    def forget(self, ref: weakref.ref[Store], keys: set[int]) -> None:
        with self.lock:
            for key in keys:
                if self.refs.get(key) is ref:
                    del self.refs[key]


OWNERS = Owners()
# The table itself (never rebound), for the readers on the hot path.
OWNER_REFS = OWNERS.refs


def owner_of(leaf: object) -> Use | None:
    """The store and declared sharding whose cached array `leaf` is (the very object), if any."""
    ref = OWNER_REFS.get(id(leaf))
    store: Store | None = None if ref is None else ref()
    return None if store is None else store.sharding_of(leaf)


def live_twin(store: Store) -> Store | None:
    """Another live constant with `store`'s content (dtype, shape, bytes, weak type) in the same
    host memory (page-locked or not) and residency, if any: one lookup (`LiveStores`)."""
    return None if store.partial else STATE.live.twin(store)


# A use of a constant: its store, and the declared sharding (None: the default device).
Use: TypeAlias = "tuple[Store, Sharding | None]"


class Store:
    """A constant: its frozen host buffer and the device buffers made from it.

    Several `FrozenConst` handles can share one store (`FrozenConst(other)`,
    `x.placed(...)`), so they share the device buffers too. The store dies with
    its last handle, and its device buffers with it.

    Each device buffer is made once per placement: on the default device
    (uncommitted, following `jax.default_device`, like `jnp.asarray(np_array)`)
    or with a declared sharding (committed, like `jax.device_put(x, sharding)`).
    """

    __slots__ = (
        "__weakref__",
        "_by_device",
        "_fingerprint",
        "_host",
        "_lock",
        "_made",
        "device_dtypes",
        "dtype",
        "evicted",
        "evictions",
        "hits",
        "hot",
        "memory",
        "origin",
        "owned",
        "owner",
        "retransfers",
        "served",
        "shape",
        "transfers",
        "used",
        "volatile",
        "weak",
    )

    # A constant with host data (`_derived.Derived` is not).
    concrete = True
    # What a derived value is served from (`_derived.Derived.leaf`); a constant has none.
    leaf: None = None
    # Whether this process holds only some slices (`_partial.PartialStore`).
    partial = False

    def __init__(
        self,
        host: np.ndarray[Any, Any],
        host_memory: HostMemory = "pageable",
        weak: bool = False,
        residency: Residency = "device",
        digest: str | None = None,
    ) -> None:
        # `host_memory` (validated, `_host_memory.host_memory_choice`) says what the host holds
        # for transfers besides the frozen `host` (a constant's own copy, or a loaded constant's
        # read-only map of its file); `weak`: as `_setup` says; `residency`
        # (`_host_memory.residency_choice`): "host" keeps its buffers in page-locked host memory,
        # moved to the device at each use; `digest`: `host`'s fingerprint, where the caller has
        # just hashed it (a loaded constant's, checked against its manifest).
        self._setup(host.shape, host.dtype)
        self._host = host
        self.memory = host_copy(host_memory, residency, host)
        self.weak = weak
        self._fingerprint = digest
        STATE.live.add(self)  # once whole: another thread's lookup may digest it at once

    def _setup(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.shape: tuple[int, ...] = shape
        self.dtype: np.dtype[Any] = dtype
        # `device_dtype()` under x64 off and on, each found on first need.
        self.device_dtypes: list[np.dtype[Any] | None] = [None, None]
        # What the host holds for transfers besides `_host` (`_host_memory`: pageable or pinned).
        self.memory = PAGEABLE
        # The module whose code made the constant (a library's, for its tables), which the
        # warnings about it name, so that a library can filter those of its own constants with
        # one line (`made in `mylib`, docs: "Which jit").
        self.origin: str = origin_module()
        # Whether the constant was made from a Python scalar (`FrozenConst(0.5)`): its device
        # buffers are weakly typed, and it promotes as `jnp.asarray(0.5)` does.
        self.weak = False
        # Whether a device buffer of it was donated or deleted behind our back: compiled
        # programs then embed it rather than hold a buffer the next donation deletes (`_hoist`).
        self.volatile = False
        self._lock = threading.Lock()
        self._fingerprint = None  # given at construction, or computed on first request
        # Accounting (`frozenconst.stats()`): uses served from the cache, and
        # host-to-device transfers made (one per device buffer filled from the host).
        self.hits = self.transfers = 0
        # What a device budget did to it: buffers evicted, and transfers of a placement evicted
        # before (`evicted`, its keys in `_made`); and when it was last used (`_CLOCK`).
        self.evictions = self.retransfers = 0
        self.evicted: set[tuple[Sharding | None, Device | None, np.dtype[Any]]] = set()
        self.used = 0
        # The ids of this store's cached arrays, and the weak reference `OWNERS` holds for each.
        self.owned: set[int] = set()
        self.owner = OWNERS.reference(self, self.owned)
        # What each use gets, one dict lookup, keyed by its declared sharding (None: the default
        # device), the `jax_default_device` setting and the x64 flag, or by the setting alone for
        # the default placement where x64 does not change the device dtype (`_by_device`).
        # Several keys can resolve to one device buffer; `array` builds the key inline.
        self.served: dict[Any, jax.Array] = {}
        # `served[None]`, where there is one: the default placement's buffer while `jax_default_device`
        # is unset, the use nearly every program makes. The hit that `FrozenConst.__jax_array__` inlines
        # reads this slot instead of the dict (`_serve` keeps the two in step): the lookup was a third
        # of what a hit cost beyond the one-slot floor.
        self.hot: jax.Array | None = None
        # Whether the default placement is served under the `jax_default_device` setting alone: where
        # x64 does not change the device dtype (float32 is the same buffer under both settings), the x64
        # read and the tuple key were a measurable part of a hit for nothing (`python -m benchmarks
        # compare`, rows "cache hit ...: ratio to the one-slot floor").
        self._by_device = self.home is None and not follows_x64(dtype)
        # (declared sharding or None, default device or None, device dtype) -> array:
        # the device buffers themselves.
        self._made: dict[tuple[Sharding | None, Device | None, np.dtype[Any]], jax.Array] = {}

    def device_dtype(self) -> np.dtype[Any]:
        """The dtype JAX computes this constant's data with now (`x.dtype`), kept per x64 setting:
        JAX reads it on the cache-hit path (`jnp.add(x, 1)`), where `held_dtype` costs more."""
        x64: bool = X64.value
        found = self.device_dtypes[x64]
        if found is None:
            found = self.device_dtypes[x64] = held_dtype(self.dtype)
        return found

    @property
    def home(self) -> Sharding | None:
        """The sharding a use without one gets: None, the default device (`PartialStore`: declared)."""
        return None

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
    def host_memory(self) -> str:
        """What transfers read: "pinned" (a page-locked copy) or "pageable" (the NumPy copy)."""
        return self.memory.name

    @property
    def residency(self) -> Residency:
        """Where its buffers live between uses: "device", or "host" (page-locked, moved in by each use)."""
        return "host" if self.memory.streams else "device"

    def in_host_memory(self, host_memory: HostMemory) -> Store:
        """The store of `FrozenConst(x, host_memory=...)`: this one where it holds that kind (`auto`:
        either), else one sharing its frozen NumPy copy."""
        if host_memory in ("auto", self.host_memory):
            return self
        return Store(self.whole(f"FrozenConst(x, host_memory={host_memory!r})"), host_memory, weak=self.weak)

    @property
    def host_nbytes(self) -> int:
        """Bytes of host memory this process holds for the constant: frozen buffers, page-locked copy."""
        resident = sum(a.nbytes for a in self.arrays(device=False)) if self.memory.streams else 0
        return sum(b.nbytes for b in self.host_buffers()) + self.memory.nbytes + resident

    def check_device_dtype(self, dtype: np.dtype[Any]) -> None:
        """Raise unless the host data keeps every integer on a device as `dtype`."""
        check_narrowing(self._host, dtype)

    def declare(self, target: Target) -> Sharding:
        """The sharding `target` names, declared for this constant: checked now against it."""
        return as_sharding(target, self.shape)

    def constant(self, what: str) -> Store:
        """This store: `what` (an operation, in words) needs a constant, and this is one."""
        return self

    def remade(
        self,
        dtype: DTypeLike | None,
        choice: HostMemory,
        host_memory: HostMemory | None,
        residency: Residency | None,
    ) -> Store:
        """The store of `FrozenConst(x, dtype, host_memory=..., residency=...)`: this one where nothing
        changes, else a new one (a dtype asked for makes it strongly typed, as `jnp.asarray` does)."""
        resides = residency_choice(self.residency, host_memory) if residency is None else residency
        if dtype is not None and native(as_dtype(dtype)) != self.dtype:
            host = self.whole(f"FrozenConst(x, dtype={dtype!r})")
            return Store(frozen_copy(host, dtype, "the `FrozenConst` it received"), choice, residency=resides)
        if dtype is not None and self.weak:
            return Store(self.host, choice, residency=resides)
        store = self
        if resides != self.residency:
            # Sharing its frozen NumPy copy. (A device-resident constant made from a host-resident
            # one keeps no page-locked copy unless `host_memory="pinned"` asks for one.)
            what = f"FrozenConst(x, residency={resides!r})"
            store = Store(self.whole(what), "pageable", weak=self.weak, residency=resides)
        return store if host_memory is None else store.in_host_memory(choice)

    def describe(self) -> str:
        """The constant's `repr`: the host values, and the dtype JAX computes with (`dtype=`), with
        the host's (`host_dtype=`) where it differs."""
        host = self._host
        held = held_dtype(host.dtype)
        dtype = f"dtype={held}" if held == host.dtype else f"dtype={held}, host_dtype={host.dtype}"
        if host.size <= _REPR_MAX_ELEMENTS:
            body = np.array2string(host, separator=", ", prefix="FrozenConst(")
            shape = f", shape={host.shape}" if host.size == 0 else ""
            weak = ", weak_type=True" if self.weak else ""  # as a `jax.Array`'s repr says it
            return f"FrozenConst({body}{shape}, {dtype}{weak})"
        nbytes = host.size * held.itemsize  # `x.nbytes`: what JAX holds
        return f"FrozenConst(shape={host.shape}, {dtype}, nbytes={human_bytes(nbytes)})"

    # -- the device side -------------------------------------------------------

    def array(self, sharding: Sharding | None = None) -> jax.Array:
        """What a use gets: its device buffer with `sharding` (None: the default device), concrete
        inside a trace too. The one cache-hit path (one dict lookup, its key built inline: a call
        costs a measurable part of a hit); `FrozenConst.__jax_array__` inlines the `hot` hit.
        """
        setting = DEFAULT_DEVICE.value
        key = setting if sharding is None and self._by_device else (sharding, setting, X64.value)
        array = self.served.get(key)
        # A cached buffer can be deleted behind our back: by `Array.delete()`,
        # or by donation to a jitted function (`donate_argnums`).
        if array is None or array.is_deleted():
            return self._fill(sharding, setting, key)
        if STATE.accounting:
            self.hits += 1
        return array

    def _fill(self, sharding: Sharding | None, setting: Any, key: Any) -> jax.Array:
        """The device buffer for a use with `sharding` under the `jax_default_device` `setting`,
        made where none is cached; a host-resident constant's moved to the device (`Resident.stream`)."""
        array, lost = self._cached(sharding, setting, key)
        if lost:
            self._lost()
        memory = self.memory
        if isinstance(memory, Resident) and memory.streams and not isinstance(array, Tracer):
            return memory.stream(array, sharding is not None or self.home is not None)
        return array

    def _cached(self, sharding: Sharding | None, setting: Any, key: Any) -> tuple[jax.Array, bool]:
        """The cached buffer for a use with `sharding` under `setting`, made where none is, and
        whether it replaced one deleted behind our back; served from now on under `key` where
        neither a budget nor host residency is in force (`_UNSERVED`: not served)."""
        sharding = self.home if sharding is None else sharding
        dtype = self.device_dtype()
        device = _default_device(setting) if sharding is None else None
        made = (sharding, device, dtype)
        budget = STATE.budget
        if budget is not None or self.memory.streams:
            # Every use of these comes here: a cached buffer is served without a lock (one the
            # budget evicts meanwhile is held by this use, so the budget takes it back).
            array = self._made.get(made)
            if array is not None and not array.is_deleted():
                if STATE.accounting:
                    self.hits += 1
                self.used = next(_CLOCK)
                return array, False
        with _UNLOCKED if budget is None else budget.lock, self._lock:
            array = self._made.get(made)
            lost = array is not None and array.is_deleted()
            if array is None or lost:
                self.check_device_dtype(dtype)  # x64 may have been switched off since construction
                self._check_computes(sharding, device, dtype)
                with eval_context():
                    if budget is not None and not self.memory.streams:
                        budget.make_room(self, self.incoming(sharding, device, dtype))
                    fresh = self._transfer(sharding, dtype)
                if isinstance(fresh, Tracer):  # never cached: it would leak (see `_compat.eval_context`)
                    return fresh, False
                fresh = shared_sharding(fresh)
                if self.weak and not fresh.weak_type:
                    fresh = _weakly_typed(fresh)
                old, array = array, fresh
                self._made[made] = array
                OWNERS.add(array, self)
                if old is not None:
                    self._disown(old)
                if made in self.evicted:
                    self.evicted.discard(made)
                    self.retransfers += 1
            elif STATE.accounting and (budget is not None or self.memory.streams):
                self.hits += 1
            if budget is None and not self.memory.streams and key is not _UNSERVED:
                self._serve(key, array)
            # (While no budget is in force, a use served from `served` never comes here: the
            # recency a budget starts from is the order of first uses.)
            self.used = next(_CLOCK)
        return array, lost

    @staticmethod
    def _check_computes(sharding: Sharding | None, device: Device | None, dtype: np.dtype[Any]) -> None:
        """Raise where computing with `dtype` on this use's devices (`sharding`'s, else `device`)
        would end the process: before any of it is transferred, so before XLA compiles any."""
        for target in sharding.device_set if sharding is not None else {device}:
            assert target is not None
            check_computes_on(target.platform, dtype)

    def item(self, sharding: Sharding | None, index: Any) -> jax.Array | None:
        """`x[index]` of a host-resident constant, only the slice moved to the device (traced: sliced
        in host memory; eager: a basic index of the host copy); None for any other use."""
        memory = self.memory
        if not isinstance(memory, Resident) or not memory.streams:
            return None
        if not tracing():
            if sharding is not None or self.weak:
                return None
            # Where `eager_index` puts the part: the default device. (It takes no data JAX holds
            # in another dtype, so no narrowing to check: that use goes through `_cached`.)
            self._check_computes(None, _default_device(DEFAULT_DEVICE.value), self.device_dtype())
            return memory.eager_index(index)
        array, lost = self._cached(sharding, DEFAULT_DEVICE.value, _UNSERVED)
        if lost:
            self._lost()
        memory = self.memory
        if isinstance(array, Tracer) or not isinstance(memory, Resident) or not memory.streams:
            return None
        try:
            return memory.index(array, index)
        except (TypeError, ValueError):
            # JAX computes a gather (an index array, `vmap`) only on operands in one memory
            # space: the whole constant is moved to the device, then indexed.
            return None

    # -- what a device budget asks (`_budget`) -----------------------------------------------

    def incoming(
        self, sharding: Sharding | None, device: Device | None, dtype: np.dtype[Any]
    ) -> dict[Device, int]:
        """The device bytes per device a new buffer for this placement takes."""
        itemsize = np.dtype(dtype).itemsize
        if sharding is None:
            assert device is not None
            return {device: math.prod(self.shape) * itemsize}
        if sharding.memory_kind not in (None, "device"):
            return {}
        if is_single_device_sharding(sharding):
            (single,) = sharding.device_set
            existing = self._made.get((None, single, dtype))
            if existing is not None and not existing.is_deleted():
                return {}  # committing the default buffer on that device makes none (`_transfer`)
        shard = math.prod(sharding.shard_shape(self.shape)) * itemsize
        return {d: shard for d in sharding.addressable_devices}

    def device_buffers(self, locked: bool = False) -> list[tuple[Any, jax.Array]]:
        """Each cached buffer in device memory, with its key in `_made` (`locked`: the lock is held)."""
        with _UNLOCKED if locked else self._lock:
            return [(k, a) for k, a in self._made.items() if not a.is_deleted() and in_device_memory(a)]

    def release(self, made: Any) -> jax.Array | None:
        """Drop the buffer cached under `made` (a budget's eviction): the array, or None."""
        with self._lock:
            array = self._made.pop(made, None)
            if array is None:
                return None
            for key in [k for k, a in self.served.items() if a is array]:
                del self.served[key]
            self.hot = self.served.get(None)
            self._disown(array)
            return array

    def unserve(self) -> None:
        """Serve nothing from `served` and `hot`, so that a budget set now sees every use."""
        with self._lock:
            self.served.clear()
            self.hot = None

    def readopt(self, made: Any, array: jax.Array) -> None:
        """Cache `array` under `made` again: a dropped buffer still held elsewhere."""
        with self._lock:
            if made not in self._made:
                self._made[made] = array
                OWNERS.add(array, self)

    def _disown(self, array: jax.Array) -> None:
        """Drop `array`, a buffer no longer served, from `OWNERS` (under the lock), so that buffers
        replaced over and over leave no entry each."""
        if not any(a is array for a in self._made.values()):
            OWNERS.discard(array, self)

    def _serve(self, key: Any, array: jax.Array) -> None:
        """Serve `array` to uses under `key` from now on (called under the lock)."""
        self.served[key] = array
        if key is None:  # the default placement under no `jax_default_device` (`_by_device`)
            self.hot = array

    def _lost(self) -> None:
        """A device buffer was deleted behind our back and made again: programs holding it let go
        (`STATE.dropped`), and embed the constant from now on (`volatile`), out of a donation's reach."""
        self.volatile = True
        for hook in STATE.dropped:
            hook(self, False, None)
        made = f" (made in `{self.origin}`)" if self.origin else ""
        warnings.warn(
            f"The device buffer of FrozenConst {self.dtype}{list(self.shape)}{made} was deleted (donated "
            "to a program compiled ahead of time, `jax.jit(f, donate_argnums=...).lower(...)"
            ".compile()`, or deleted through `jnp.asarray(x)`), so frozenconst transferred it "
            "again. Compiled programs that held it are compiled again at their "
            "next call, and embed this constant from now on, as JAX embeds any array. Keep "
            "constants out of donated arguments: donate `frozenconst.partition(state)[0]` and "
            "pass the rest undonated (docs: Training).",
            FrozenConstWarning,
            stacklevel=user_stacklevel(),
        )

    def _transfer(self, sharding: Sharding | None, dtype: np.dtype[Any]) -> jax.Array:
        """A new device buffer (called under the lock)."""
        if self.memory.streams:
            resident = self.memory.transfer(sharding, dtype, _default_device(DEFAULT_DEVICE.value))
            if resident is not None:
                self.transfers += 1
                return resident
        if is_single_device_sharding(sharding):
            (device,) = sharding.device_set
            existing = self._made.get((None, device, dtype))
            if existing is not None and not existing.is_deleted():
                # Committing the default buffer on the same device is free:
                # JAX hands back the same buffer (jax 0.10 and 0.12).
                committed: jax.Array = jax.device_put(existing, sharding)
                return committed
        served = self.memory.transfer(sharding, dtype, _default_device(DEFAULT_DEVICE.value))
        if served is not None:
            self.transfers += 1
            return served
        if sharding is None or is_single_device_sharding(sharding):
            # Without a sharding (None): uncommitted, like `jnp.asarray(np_array)`.
            single: jax.Array = jax.device_put(self.host, sharding)
            if not isinstance(single, Tracer):
                self.transfers += 1
                self.memory.made(single)
            return single
        host = self.host
        convert = host.dtype != dtype

        # Each process builds only its addressable shards, straight from the frozen host buffer.
        def shard(index: Any) -> np.ndarray[Any, Any]:
            part: np.ndarray[Any, Any] = host[index]
            return part.astype(dtype) if convert else part

        made: jax.Array = jax.make_array_from_callback(host.shape, sharding, shard)
        # One transfer per shard: JAX reads replicated data once, so the callback undercounts.
        self.transfers += len(made.addressable_shards)
        return made

    # -- eviction and what is cached ---------------------------------------------

    def evict(self, sharding: Sharding | None = None) -> None:
        """Forget device buffers: all, or those with `sharding` (and the default buffer on a single
        such device); programs that held one are compiled again (`STATE.dropped`)."""
        with self._lock:
            if sharding is None:
                dropped = list(self._made.values())
                self._made.clear()
                self.served.clear()
            else:
                device = next(iter(sharding.device_set)) if is_single_device_sharding(sharding) else None
                which = [m for m in self._made if m[0] == sharding or (m[0] is None and m[1] == device)]
                dropped = [self._made.pop(made) for made in which]
                kept = {id(a) for a in self._made.values()}
                for key in [k for k, a in self.served.items() if id(a) not in kept]:
                    del self.served[key]
            self.hot = self.served.get(None)
            left = self._let_go(dropped)
            del dropped
        # Whether anything besides this store still holds a dropped buffer: a trace JAX cached
        # (`jax.eval_shape`, `jax.make_jaxpr`, `jax.jit(f).trace`, which a later `jax.jit(f)`
        # lowers with that buffer), a compiled program, a caller's `jnp.asarray(x)`.
        held = any(ref() is not None for ref in left)
        for hook in STATE.dropped:
            hook(self, held, left)

    def _let_go(self, dropped: list[jax.Array]) -> list[weakref.ref[jax.Array]]:
        """Weak references to `dropped`, each dropped from `OWNERS` (under the lock)."""
        for array in dropped:
            self._disown(array)
        return [weakref.ref(array) for array in dropped]

    def meet_losses(self) -> bool:
        """Make again each buffer deleted behind our back (telling of the loss): True where there was one."""
        with self._lock:
            lost = [key for key, array in self.served.items() if array.is_deleted()]
            # Under a budget, and for a host-resident constant, nothing is served: its buffers
            # by their keys in `_made`, `(declared sharding or None, default device, dtype)`.
            unserved = [made for made, array in self._made.items() if array.is_deleted() and not self.served]
        for key in lost:
            # The keys `array` serves under: `(sharding, setting, x64)`, or the setting alone.
            sharding, setting = (key[0], key[1]) if isinstance(key, tuple) and len(key) == 3 else (None, key)
            self._fill(sharding, setting, key)
        for made_sharding, device, _ in unserved:
            if self._cached(None if device is not None else made_sharding, device, _UNSERVED)[1]:
                self._lost()
        return bool(lost or unserved)

    def arrays(self, device: bool | None = None) -> list[jax.Array]:
        """The live cached buffers, default ones first: all, or those in device memory (or not)."""
        with self._lock:
            made = sorted(self._made.items(), key=lambda item: item[0][0] is not None)
        return [
            a for _, a in made if not a.is_deleted() and (device is None or in_device_memory(a) == device)
        ]

    def sharding_of(self, leaf: object) -> Use | None:
        """(self, declared sharding) if `leaf` is one of this store's cached buffers, else None."""
        with self._lock:
            for (sharding, _, _), array in self._made.items():
                if array is leaf:
                    return self, sharding
        return None

    @property
    def fingerprint(self) -> str:
        """The content digest, computed once on first request."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.whole("x.fingerprint"))
        return self._fingerprint

    def __del__(self, _state: _State = STATE) -> None:
        # The default argument keeps the state reachable at shutdown, when globals may be gone.
        _state.retired_hits += self.hits
        _state.retired_transfers += self.transfers
        _state.retired_evictions += self.evictions
        _state.retired_retransfers += self.retransfers
        if self._made:
            for hook in _state.outlived:
                hook(list(self._made.values()), self.origin)
