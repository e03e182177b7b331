"""The device cache: one `jax.Array` per placement, transferred once from the frozen host buffer.

`Store.array` is the path every use of a constant takes, a hit one dict lookup (one slot,
`Store.hot`, for the default placement while no `jax.default_device` is in force). Where a
buffer is dropped (`evict`) or lost (donated, deleted), the functions in `STATE.dropped` are told:
that is how compiled programs holding it let go (`_hoist.dropped`), without this module
knowing of any jit.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias

import jax
import numpy as np
from jax.sharding import Sharding, SingleDeviceSharding
from numpy.typing import DTypeLike

from ._compat import (
    DEFAULT_DEVICE,
    X64,
    Device,
    Tracer,
    eval_context,
    uncommitted,
    warn_degraded,
    weakly_typed,
)
from ._convert import as_dtype, check_narrowing
from ._dtypes import follows_x64, native
from ._errors import FrozenConstWarning
from ._fingerprint import fingerprint
from ._frames import origin_module, user_stacklevel
from ._host import HostMemory, freeze, frozen_copy, host_buffer, human_bytes
from ._targets import Target, as_sharding

_REPR_MAX_ELEMENTS = 64


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

    @classmethod
    def of(cls, array: jax.Array) -> Placement:
        """The placement of a cached device buffer."""
        per_device: dict[Device, int] = {}
        for shard in array.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
        return cls(array.sharding, np.dtype(array.dtype), array.committed, types.MappingProxyType(per_device))


# A bucket of `LiveStores`: `(None, shape, dtype)` for whole constants not digested yet,
# `(fingerprint, weak type, host memory)` for those digested, `(_PARTIAL, None, None)` for
# constants of which this process holds slices (never anyone's twin).
_Bucket: TypeAlias = "tuple[str | None, Any, Any]"
_PARTIAL = "partial"  # never a fingerprint, which starts with its algorithm's name
_ABSENT = object()


class LiveStores:
    """Every live store, filed so that finding a constant's twin is one lookup, not a scan.

    A new store is only added to `fresh`, as to a `weakref.WeakSet`: a plain construction
    computes no fingerprint, takes no lock, and costs what the set of live stores always cost.
    (`fresh` is a dict, not a set: taking one entry out of a set once large scans its whole
    table, and of a dict takes the last.)
    A lookup (`twin`) files the fresh stores under their shape and dtype, then digests those of
    its own shape and dtype filed since the last such lookup and files each again under its
    content (`fingerprint`, weak type, host memory), where it reads its twin: each constant is
    filed once, digested at most once, and only where one of its shape and dtype is looked up.
    A store's entry goes when it dies, and an emptied bucket with it.

    `fresh` changes by single dict operations (atomic under the GIL, locked in free-threaded
    builds); `buckets` and `filed` (each filed store's bucket) change under `lock`; `lookups`
    lets one lookup at a time file and digest (outside `lock`, so a construction never
    waits on a digest), so that two lookups of one content find each other.
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
            bucket = self.buckets.get(key)
            if bucket is None:
                self.buckets[key] = {ref: None}
            else:
                bucket[ref] = None

    def __iter__(self) -> Iterator[Store]:
        with self.lock:
            refs = [*self.fresh, *self.filed]
        return (store for store in (ref() for ref in refs) if store is not None)

    def twin(self, store: Store) -> Store | None:
        """Another live whole store with `store`'s content, weak type and host memory, if any."""
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
                    filing.append((ref, (other.fingerprint, other.weak, other.host_memory)))
                del other
            mine = (store.fingerprint, store.weak, store.host_memory)
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
    __slots__ = ("accounting", "dropped", "live", "retired_hits", "retired_transfers")

    def __init__(self) -> None:
        # Whether cache hits are counted (`frozenconst.set_accounting`).
        self.accounting = True
        # Counts carried over from constants that have been garbage-collected.
        self.retired_hits = 0
        self.retired_transfers = 0
        # Every live store, for `frozenconst.stats()`, the audit's kind lookup and finding a
        # constant's twin (`live_twin`).
        self.live = LiveStores()
        # Told of a store whose device buffer was evicted or lost, after the fact: whatever
        # holds the old buffer lets go of it (`_hoist.dropped`, appended by `_install.install`,
        # the seam through which the jit side plugs into the core).
        self.dropped: list[Callable[[Store], None]] = []


STATE = _State()


def set_accounting(enabled: bool) -> None:
    """Count cache hits (the default), or not. Transfers and bytes are always accounted.

    The benchmark suite measures the cost of counting against not counting.
    """
    STATE.accounting = bool(enabled)


def device_dtype(host_dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype JAX gives data of `host_dtype` now: narrower without x64 (float64 to float32).

    Read at each call, so it follows `jax.enable_x64` contexts and config changes
    as the device buffers do (`Store.array` keys them on the x64 setting).
    """
    dtype: np.dtype[Any] = jax.dtypes.canonicalize_dtype(host_dtype)
    return dtype


def dtype_words(host_dtype: np.dtype[Any]) -> str:
    """The dtypes a `repr` shows: `dtype=` what JAX computes with, `host_dtype=` where the host's differs."""
    dtype = device_dtype(host_dtype)
    return f"dtype={dtype}" if dtype == host_dtype else f"dtype={dtype}, host_dtype={host_dtype}"


# The key of a use of a constant in `Store.served`: its declared sharding (None: the
# default device), the `jax_default_device` setting, the x64 flag; for the default
# placement of a constant whose device dtype x64 does not change, the setting alone
# (`Store._by_device`). Several keys can resolve to one device buffer. `Store.array`
# builds it, inlined there (the one place).


class Owners:
    """Whose cached array each device buffer is: a pytree rebuilt from the constant's own
    buffer (a jit output passed through, `eqx.combine`, a flax NNX state round trip) is the
    constant again.

    `refs` maps the id of a cached array to a weak reference to its store, read with one
    dict lookup and no lock (by `owner_of`, and inlined in `_derived.rebuild`); it changes
    under the lock (reentrant: a store's weak reference may die, and call `forget`, while
    the lock is held). Ids can be reused after an array dies, so a reader confirms by
    identity (`Store.sharding_of`). A store's entries go when the store dies.
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
    if store is None:
        return None
    return store.sharding_of(leaf)


def live_twin(store: Store) -> Store | None:
    """Another live constant with `store`'s content (dtype, shape, bytes, weak type) in the same
    host memory (page-locked or not), if any: one lookup (`LiveStores`)."""
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
        "_pinned",
        "device_dtypes",
        "dtype",
        "hits",
        "hot",
        "origin",
        "owned",
        "owner",
        "served",
        "shape",
        "transfers",
        "volatile",
        "weak",
    )

    # The page-locked `jax.Array` whose memory `_host` views, or None (pageable memory).
    _pinned: jax.Array | None
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
        mapped: bool = False,
        weak: bool = False,
    ) -> None:
        # `host_memory` (validated, `_host.host_memory_choice`) says where the frozen
        # `host` lives from now on; `mapped`: it was copied from a memory map; `weak`: it
        # holds a Python scalar, weakly typed as `jnp.asarray` types one.
        placed, pinned = host_buffer(host, host_memory, lambda: _default_device(DEFAULT_DEVICE.value), mapped)
        self._setup(host.shape, host.dtype)
        self._host, self._pinned = placed, pinned
        self.weak = weak
        STATE.live.add(self)  # once whole: another thread's lookup may digest it at once

    def _setup(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.shape: tuple[int, ...] = shape
        self.dtype: np.dtype[Any] = dtype
        # `device_dtype()` under x64 off and on, each found on first need.
        self.device_dtypes: list[np.dtype[Any] | None] = [None, None]
        self._pinned = None
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
        self._fingerprint: str | None = None
        # Accounting (`frozenconst.stats()`): uses served from the cache, and
        # host-to-device transfers made (one per device buffer filled from the host).
        self.hits = 0
        self.transfers = 0
        # The ids of this store's cached arrays, and the weak reference `OWNERS` holds for each.
        self.owned: set[int] = set()
        self.owner = OWNERS.reference(self, self.owned)
        # What each use gets, one dict lookup: keyed as the note above `FedArrays` says, except the
        # default placement where x64 does not change the device dtype (`_by_device`).
        self.served: dict[Any, jax.Array] = {}
        # `served[None]`, where there is one: the default placement's buffer while
        # `jax_default_device` is unset, the use nearly every program makes. The hit
        # that `FrozenConst.__jax_array__` inlines reads this slot
        # instead of the dict (`_serve` keeps the two in step): the lookup was a
        # third of what a hit cost beyond the one-slot floor.
        self.hot: jax.Array | None = None
        # Whether the default placement is served under the `jax_default_device`
        # setting alone: where x64 does not change the device dtype (float32 is
        # the same buffer under both settings), the x64 read and the tuple key
        # were a measurable part of a hit for nothing (`python -m benchmarks
        # compare`, rows "cache hit ...: ratio to the one-slot floor").
        self._by_device = self.home is None and not follows_x64(dtype)
        # (declared sharding or None, default device or None, device dtype) -> array:
        # the device buffers themselves.
        self._made: dict[tuple[Sharding | None, Device | None, np.dtype[Any]], jax.Array] = {}

    def device_dtype(self) -> np.dtype[Any]:
        """The dtype JAX computes this constant's data with now (`x.dtype`), kept per x64 setting.

        JAX reads `x.dtype` in its own calls (`jnp.add(x, 1)`), so this is on the
        cache-hit path: a list index, where `device_dtype` canonicalizes afresh
        (`python -m benchmarks compare`, "cache hit jnp.add(x, 1)").
        """
        x64: bool = X64.value
        found = self.device_dtypes[x64]
        if found is None:
            found = self.device_dtypes[x64] = device_dtype(self.dtype)
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
        """Where the host buffer lives: "pinned" (page-locked) or "pageable"."""
        return "pageable" if self._pinned is None else "pinned"

    def in_host_memory(self, host_memory: HostMemory) -> Store:
        """The store of `FrozenConst(x, host_memory=...)`: this one where its host memory is what
        `host_memory` asks for (`auto` takes either), else a copy in that memory."""
        if host_memory in ("auto", self.host_memory):
            return self
        host = self.whole(f"FrozenConst(x, host_memory={host_memory!r})")
        # To pinned: `host_buffer` copies into page-locked memory. To pageable: a fresh copy,
        # never a view of the page-locked buffer (it lives as long as any view of it).
        return Store(host if host_memory == "pinned" else freeze(host), host_memory, weak=self.weak)

    @property
    def host_nbytes(self) -> int:
        """Bytes of the frozen host buffers this process holds."""
        return sum(b.nbytes for b in self.host_buffers())

    def check_device_dtype(self, dtype: np.dtype[Any]) -> None:
        """Raise unless the host data keeps every integer on a device as `dtype`."""
        check_narrowing(self._host, dtype)

    def declare(self, target: Target) -> Sharding:
        """The sharding `target` names, declared for this constant: checked now against it."""
        return as_sharding(target, self.shape)

    def constant(self, what: str) -> Store:
        """This store: `what` (an operation, in words) needs a constant, and this is one."""
        return self

    def with_dtype(self, dtype: DTypeLike | None) -> Store:
        """The store of `FrozenConst(x, dtype)`: this one where the dtype is the same (no copy)."""
        if dtype is None or native(as_dtype(dtype)) == self.dtype:
            return self
        host = self.whole(f"FrozenConst(x, dtype={dtype!r})")
        return Store(frozen_copy(host, dtype, "the `FrozenConst` it received"))

    def describe(self) -> str:
        """The constant's `repr`: the host values, and the dtype JAX computes with (`dtype_words`)."""
        host = self._host
        dtype = dtype_words(host.dtype)
        if host.size <= _REPR_MAX_ELEMENTS:
            body = np.array2string(host, separator=", ", prefix="FrozenConst(")
            shape = f", shape={host.shape}" if host.size == 0 else ""
            weak = ", weak_type=True" if self.weak else ""  # as a `jax.Array`'s repr says it
            return f"FrozenConst({body}{shape}, {dtype}{weak})"
        nbytes = host.size * device_dtype(host.dtype).itemsize  # `x.nbytes`: what JAX holds
        return f"FrozenConst(shape={host.shape}, {dtype}, nbytes={human_bytes(nbytes)})"

    # -- the device side -------------------------------------------------------

    def array(self, sharding: Sharding | None = None) -> jax.Array:
        """What a use of the constant gets: its device buffer with `sharding` (None: on the
        default device, in the dtype JAX would give the host data now), concrete inside a
        trace too, as a closed-over `jax.Array` is.

        The one cache-hit path: every use (`jnp` calls, jit arguments, `x.on`) comes here, and
        a hit is one dict lookup; it builds the key of `served` (see above `Store`) itself,
        which as a call cost a measurable part of a hit (`python -m benchmarks compare`, rows
        "cache hit ...: ratio to the one-slot floor"). `FrozenConst.__jax_array__` inlines the
        hit of the default placement under no `jax.default_device` (`hot`), its one marked
        copy, and comes here for the rest.
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
        """The device buffer for a use with `sharding` under the `jax_default_device`
        `setting`, made where none is cached, and served from now on under `key`."""
        sharding = self.home if sharding is None else sharding
        dtype = jax.dtypes.canonicalize_dtype(self.dtype)
        device = _default_device(setting) if sharding is None else None
        made = (sharding, device, dtype)
        with self._lock:
            array = self._made.get(made)
            lost = array is not None and array.is_deleted()
            if array is None or lost:
                self.check_device_dtype(dtype)  # x64 may have been switched off since construction
                with eval_context():
                    fresh = self._transfer(sharding, dtype)
                if isinstance(fresh, Tracer):  # never cached: it would leak (see `_compat.eval_context`)
                    return fresh
                if self.weak and not fresh.weak_type:
                    fresh = weakly_typed(fresh)
                old, array = array, fresh
                self._made[made] = array
                OWNERS.add(array, self)
                if old is not None:
                    self._disown(old)
            self._serve(key, array)
        if lost:
            self._lost()
        return array

    def _disown(self, array: jax.Array) -> None:
        """Drop `array`, a buffer no longer served, from `OWNERS` (called under the lock): a
        buffer deleted behind our back or evicted, replaced over and over, would otherwise
        leave an entry per replacement while the constant lives."""
        if not any(a is array for a in self._made.values()):
            OWNERS.discard(array, self)

    def _serve(self, key: Any, array: jax.Array) -> None:
        """Serve `array` to uses under `key` from now on (called under the lock)."""
        self.served[key] = array
        if key is None:  # the default placement under no `jax_default_device` (`_by_device`)
            self.hot = array

    def _lost(self) -> None:
        """A device buffer of this constant was deleted behind our back (donated to a jitted
        function, or `jnp.asarray(x).delete()`), and a new one made: programs that held the old
        one let go of it (`STATE.dropped`), and from now on programs embed the constant (`volatile`)
        rather than hold a buffer the next donation deletes. The user hears of it at each line that
        meets the loss. (A jitted call never donates a constant's buffer: `_hoist._undonated`.)"""
        self.volatile = True
        for hook in STATE.dropped:
            hook(self)
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
        if self._pinned is not None:
            from_pinned = self._from_pinned(self._pinned, sharding, dtype)
            if from_pinned is not None:
                return from_pinned
        if sharding is None:
            # No `device` argument: the result stays uncommitted, like
            # `jnp.asarray(np_array)`, so it combines with arrays on any device.
            # It lands on the current default device.
            default: jax.Array = jax.device_put(self.host)
            self.transfers += not isinstance(default, Tracer)
            return default
        if isinstance(sharding, SingleDeviceSharding):
            (device,) = sharding.device_set
            existing = self._made.get((None, device, dtype))
            if existing is not None and not existing.is_deleted():
                # Committing the default buffer on the same device is free:
                # JAX hands back the same buffer (jax 0.10 and 0.12).
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
            part: np.ndarray[Any, Any] = host[index]
            return part.astype(dtype) if convert else part

        made: jax.Array = jax.make_array_from_callback(host.shape, sharding, shard)
        # One transfer per device buffer filled from the host, as the words say
        # ("one per shard"): JAX reads a fully replicated sharding's data once
        # and puts it on every device, so the callback's calls undercount.
        self.transfers += len(made.addressable_shards)
        return made

    def _from_pinned(
        self, pinned: jax.Array, sharding: Sharding | None, dtype: np.dtype[Any]
    ) -> jax.Array | None:
        """A device buffer copied from the page-locked one by the device itself, or None where
        the NumPy view serves instead (called under the lock).

        `jax.device_put` of the page-locked `jax.Array` into the device memory of
        its own device is a DMA copy; of a NumPy view of it, JAX stages the data
        as pageable memory. So it serves one device's placements of the host
        dtype: the default buffer (kept uncommitted, `_compat.uncommitted`) and
        `x.on(device)`. Other devices, other memory kinds, sharded placements and
        a dtype conversion (x64 switched since construction) take the NumPy view,
        as does a page-locked buffer deleted behind our back.
        """
        if dtype != self.dtype or pinned.is_deleted():
            return None
        (home,) = pinned.devices()
        if sharding is None:
            if _default_device(DEFAULT_DEVICE.value) != home:
                return None
        elif not (
            isinstance(sharding, SingleDeviceSharding)
            and sharding.device_set == {home}
            and sharding.memory_kind in (None, home.default_memory().kind)
        ):
            return None
        existing = self._made.get((None, home, dtype)) if sharding is not None else None
        if existing is not None and not existing.is_deleted():
            committed: jax.Array = jax.device_put(existing, sharding)  # the same buffer, committed
            return committed
        array: jax.Array = jax.device_put(
            pinned, SingleDeviceSharding(home) if sharding is None else sharding
        )
        if sharding is None:
            free = uncommitted(array)
            if free is None:
                warn_degraded(
                    "frozenconst cannot keep a default-device buffer made from page-locked memory "
                    f"uncommitted on jax {jax.__version__}: such buffers are transferred from the host "
                    "buffer's NumPy view instead, at pageable speed."
                )
                return None
            array = free
        self.transfers += 1
        return array

    # -- eviction and what is cached ---------------------------------------------

    def evict(self, sharding: Sharding | None = None) -> None:
        """Forget device buffers: all of them, or those with `sharding` (and, for a
        single-device sharding, the default buffer on that device). The next use transfers again,
        and compiled programs that held a dropped buffer are compiled again (`STATE.dropped`)."""
        with self._lock:
            if sharding is None:
                dropped = list(self._made.values())
                self._made.clear()
                self.served.clear()
                for array in dropped:
                    self._disown(array)
            else:
                device = (
                    next(iter(sharding.device_set)) if isinstance(sharding, SingleDeviceSharding) else None
                )
                for made in [m for m in self._made if m[0] == sharding or (m[0] is None and m[1] == device)]:
                    self._disown(self._made.pop(made))
                kept = {id(a) for a in self._made.values()}
                for key in [k for k, a in self.served.items() if id(a) not in kept]:
                    del self.served[key]
            self.hot = self.served.get(None)
        for hook in STATE.dropped:
            hook(self)

    def meet_losses(self) -> bool:
        """Make again each served buffer of this constant deleted behind our back (`_fill`, which
        tells of the loss): True where there was one."""
        with self._lock:
            lost = [key for key, array in self.served.items() if array.is_deleted()]
        for key in lost:
            # The keys `array` serves under: `(sharding, setting, x64)`, or the setting alone.
            sharding, setting = (key[0], key[1]) if isinstance(key, tuple) and len(key) == 3 else (None, key)
            self._fill(sharding, setting, key)
        return bool(lost)

    def arrays(self) -> list[jax.Array]:
        """The live cached device buffers, one per placement, default ones first."""
        with self._lock:
            made = sorted(self._made.items(), key=lambda item: item[0][0] is not None)
        return [a for _, a in made if not a.is_deleted()]

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
        # The default argument keeps the state reachable at interpreter
        # shutdown, when module globals may already be gone.
        _state.retired_hits += self.hits
        _state.retired_transfers += self.transfers
