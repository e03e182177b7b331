"""Where a constant keeps what its transfers read: one class per kind of host memory.

Every constant holds its frozen NumPy copy (`_host`): what NumPy, DLPack, pickles and the
fingerprint read. A kind decides what else the host holds for transfers to the device:

- `Pageable`: nothing else. Each transfer is `jax.device_put` of the NumPy copy, which JAX
  stages through a page-locked buffer of its own.
- `Pinned`: a page-locked (`pinned_host`) `jax.Array` beside it, which the device reads by
  DMA at the link's speed. It is made from the constant's first device buffer, device to
  host, without waiting: on a TPU v5e filling page-locked memory from NumPy runs at
  0.3 GB/s and from the device at 1.0 GB/s (allocating page-locked memory is the slow
  step, 0.9 GB/s for zeros), while the first transfer itself runs at `jax.device_put`'s
  pageable speed either way. So construction costs nothing more, the first transfer
  nothing more, and every later transfer (after `evict()`, a donation, a memory budget's
  re-transfer) reads page-locked memory (docs/host-memory.md has the figures). NumPy
  cannot read JAX's page-locked buffer in place on a TPU (JAX lays it out for the
  device), so it is a second host copy, never a view handed to NumPy.

- `Resident` (`FrozenConst(a, residency="host")`): the constant's buffer itself lives in
  page-locked host memory, and no device buffer is kept. Each use gets it moved to the
  device for that use: inside a compiled program by the program itself (JAX's
  host-offloading idiom: the page-locked buffer is a parameter, `jax.device_put(..., device
  memory)` in the program), so `x[i]` in a `lax.scan` body moves one slice per step; eagerly,
  a device copy freed with its result.

Every kind has `transfer`, `made`, `nbytes` and `streams` (whether uses are moved in).
"""

from __future__ import annotations

import os
import threading
from types import EllipsisType, NoneType
from typing import Any, Literal, TypeAlias

import jax
import numpy as np
from jax.sharding import Sharding

from ._compat import (
    Device,
    Tracer,
    is_single_device_sharding,
    offers_pinned_host,
    single_device_sharding,
    uncommitted,
)
from ._dtypes import held_dtype
from ._errors import FrozenConstTypeError, FrozenConstValueError
from ._frames import warn_degraded

HostMemory: TypeAlias = Literal["auto", "pinned", "pageable"]
Residency: TypeAlias = Literal["device", "host"]
RESIDENCY_CHOICES: tuple[Residency, ...] = ("device", "host")
# Where a use of a host-resident constant is moved: device memory, on whichever device the
# program or the operation runs (public `jax.memory.Space`, jax 0.8.1 to 0.12).
DEVICE_MEMORY: Any = jax.memory.Space.Device
HOST_MEMORY_CHOICES: tuple[HostMemory, ...] = ("auto", "pinned", "pageable")
# The default for `host_memory=` when a call gives none.
HOST_MEMORY_VARIABLE = "FROZENCONST_HOST_MEMORY"


def host_memory_choice(value: object) -> HostMemory:
    """`host_memory=` checked; None reads `FROZENCONST_HOST_MEMORY` (unset or empty: "auto").

    Examples:
        >>> host_memory_choice("pinned")
        'pinned'
        >>> host_memory_choice("locked")
        Traceback (most recent call last):
        ...
        frozenconst.FrozenConstValueError: FrozenConst needs `host_memory` to be ... received 'locked'. ...
    """
    allowed = "'auto', 'pinned' or 'pageable'"
    if value is None:
        setting = os.environ.get(HOST_MEMORY_VARIABLE)
        if not setting:
            return "auto"
        for choice in HOST_MEMORY_CHOICES:
            if setting == choice:
                return choice
        raise FrozenConstValueError(
            f"The environment variable `{HOST_MEMORY_VARIABLE}` is {setting[:40]!r}, which FrozenConst "
            f"does not know: set it to {allowed} (the default for `host_memory=`), or unset it for 'auto'."
        )
    if not isinstance(value, str):
        raise FrozenConstTypeError(
            f"FrozenConst needs `host_memory` to be {allowed} (a string), but received a "
            f"`{type(value).__name__}`. Pass one of those strings, or None for the default "
            f"(`{HOST_MEMORY_VARIABLE}`, else 'auto')."
        )
    for choice in HOST_MEMORY_CHOICES:
        if value == choice:
            return choice
    raise FrozenConstValueError(
        f"FrozenConst needs `host_memory` to be {allowed}, but received {value[:40]!r}. 'auto' is "
        "pageable memory (a page-locked copy is a second host copy); docs/host-memory.md has the table."
    )


def residency_choice(value: object, host_memory: object = None) -> Residency:
    """`residency=` checked, with the `host_memory=` argument it goes with (None: not given).

    Examples:
        >>> residency_choice("host")
        'host'
        >>> residency_choice("cpu")
        Traceback (most recent call last):
        ...
        frozenconst.FrozenConstValueError: FrozenConst needs `residency` to be 'device' or 'host', ...
    """
    if not isinstance(value, str):
        raise FrozenConstTypeError(
            "FrozenConst needs `residency` to be 'device' or 'host' (a string), but received a "
            f"`{type(value).__name__}`."
        )
    for choice in RESIDENCY_CHOICES:
        if value == choice:
            if choice == "host" and host_memory == "pageable":
                raise FrozenConstValueError(
                    "FrozenConst cannot keep a constant in pageable host memory and stream it into "
                    "programs: `residency='host'` keeps it page-locked. Leave `host_memory` out (or "
                    "give 'pinned'), or keep `residency='device'`."
                )
            return choice
    raise FrozenConstValueError(
        f"FrozenConst needs `residency` to be 'device' or 'host', but received {value[:40]!r}. 'device' "
        "keeps a device buffer between uses; 'host' keeps the constant in page-locked host memory and "
        "moves what each program reads to the device (docs/host-memory.md)."
    )


class Pageable:
    """Transfers read the frozen NumPy copy: nothing else is held."""

    __slots__ = ()
    name = "pageable"
    nbytes = 0
    streams = False

    def transfer(self, sharding: Sharding | None, dtype: np.dtype[Any], default: Device) -> jax.Array | None:
        """A device buffer made from this kind's own copy, or None: the NumPy copy serves."""
        return None

    def made(self, array: jax.Array) -> None:
        """Told of a device buffer just made from the NumPy copy."""


PAGEABLE = Pageable()


class Pinned:
    """A page-locked copy beside the NumPy one, made from the first single-device buffer and
    read by every later transfer to that device (see the module docstring)."""

    __slots__ = ("_lock", "copy", "offered")
    streams = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The page-locked `jax.Array`, once made: the device dtype of the buffer it was made from.
        self.copy: jax.Array | None = None
        # False once a device turned out to offer no page-locked memory.
        self.offered = True

    @property
    def name(self) -> str:
        """ "pinned"; "pageable" once the device turned out to offer no page-locked memory."""
        return "pinned" if self.offered else "pageable"

    @property
    def nbytes(self) -> int:
        """Bytes of the page-locked copy (0 before the first transfer)."""
        copy = self.copy
        return 0 if copy is None or copy.is_deleted() else copy.nbytes

    def made(self, array: jax.Array) -> None:
        copy = self.copy
        if (copy is not None and not copy.is_deleted()) or len(array.devices()) != 1:
            return
        (device,) = array.devices()
        if not offers_pinned_host(device):
            self.offered = False
            warn_degraded(
                f"`host_memory='pinned'` was asked for, but {device.platform} devices offer no "
                f"page-locked (`pinned_host`) memory on jax {jax.__version__}: such constants are "
                "transferred from pageable memory (docs/host-memory.md)."
            )
            return
        with self._lock:
            if self.copy is not None and not self.copy.is_deleted():
                return
            try:
                self.copy = page_lock(array, device)
            except Exception as err:  # XLA's refusals (an allocation, a dtype) are errors of its own
                warn_degraded(
                    f"`host_memory='pinned'` was asked for, but JAX could not page-lock a copy "
                    f"({type(err).__name__}: {str(err)[:120]}): such constants are transferred from "
                    "pageable memory (docs/host-memory.md)."
                )

    def transfer(self, sharding: Sharding | None, dtype: np.dtype[Any], default: Device) -> jax.Array | None:
        """The device buffer for `sharding` (None: the default device `default`), copied from the
        page-locked one by the device itself, or None where the NumPy copy serves instead.

        It serves one device's placements of the page-locked copy's dtype: the default
        buffer (kept uncommitted, `_compat.uncommitted`) and `x.on(device)`. Other devices,
        memory kinds, sharded placements and another dtype (x64 switched since) read the
        NumPy copy.
        """
        copy = self.copy
        if copy is None or copy.is_deleted() or copy.dtype != dtype:
            return None
        (home,) = copy.devices()
        if sharding is None:
            if default != home:
                return None
        elif not (
            is_single_device_sharding(sharding)
            and sharding.device_set == {home}
            and sharding.memory_kind in (None, home.default_memory().kind)
        ):
            return None
        array: jax.Array = jax.device_put(
            copy, single_device_sharding(home) if sharding is None else sharding
        )
        if sharding is not None:
            return array
        free: jax.Array | None = uncommitted(array)
        if free is None:
            warn_degraded(
                "frozenconst cannot keep a default-device buffer made from page-locked memory "
                f"uncommitted on jax {jax.__version__}: such buffers are transferred from the NumPy "
                "copy instead, at pageable speed."
            )
        return free


def page_lock(array: jax.Array, device: Device) -> jax.Array:
    """`array` copied into `device`'s page-locked host memory by the device, not waited for.

    frozenconst's own copy, not a transfer the user's program asks for: a transfer guard
    around the first use does not apply (JAX counts a copy between memory kinds as
    device to device).
    """
    with jax.transfer_guard("allow"):
        copied: jax.Array = jax.device_put(array, single_device_sharding(device, memory_kind="pinned_host"))
    return copied


# What a basic index is made of (a bool, an `int`, is not one).
_BASIC_INDEX = (NoneType, EllipsisType, slice, int, np.integer)


class Resident:
    """The constant's buffers themselves in page-locked host memory, moved to the device by
    each use (see the module docstring); `streams` turns False, and the constant is an ordinary
    device-resident one, where the device offers no page-locked memory or JAX refuses it."""

    __slots__ = ("host", "streams")
    name = "pinned"
    # Its page-locked buffers are the store's cached arrays, counted there (`Store.host_nbytes`).
    nbytes = 0

    def __init__(self, host: np.ndarray[Any, Any]) -> None:
        self.host = host
        self.streams = True

    def made(self, array: jax.Array) -> None:
        """Nothing to do: a device buffer is made only after a fallback."""

    def transfer(self, sharding: Sharding | None, dtype: np.dtype[Any], default: Device) -> jax.Array | None:
        """The constant in page-locked memory with `sharding`'s devices (None: the default
        device `default`), or None after a fallback to device residency (said once)."""
        if not self.streams:
            return None
        if sharding is None:
            pinned: Sharding = single_device_sharding(default, memory_kind="pinned_host")
        else:
            pinned = sharding.with_memory_kind("pinned_host")
        refused = next((d for d in pinned.device_set if not offers_pinned_host(d)), None)
        if refused is not None:
            self._fallback(
                f"{refused.platform} devices offer no page-locked (`pinned_host`) memory on jax "
                f"{jax.__version__}"
            )
            return None
        try:
            placed = place(self.host if self.host.dtype == dtype else self.host.astype(dtype), pinned)
        except Exception as err:  # XLA's refusals (an allocation, a dtype) are errors of its own
            self._fallback(f"JAX refused the placement ({type(err).__name__}: {str(err)[:160]})")
            return None
        return placed

    def _fallback(self, why: str) -> None:
        self.streams = False
        warn_degraded(
            f"`residency='host'` was asked for, but {why}: such constants are kept on the device "
            "instead, as `residency='device'` keeps them (docs/host-memory.md)."
        )

    @staticmethod
    def stream(array: jax.Array, committed: bool) -> jax.Array:
        """What a use gets: `array` (page-locked) moved to device memory. Inside a trace, a
        transfer in the program; eagerly a device copy, uncommitted unless `committed` (a
        declared placement's), as a device-resident constant's default buffer is."""
        moved: jax.Array = jax.device_put(array, DEVICE_MEMORY)
        if committed or isinstance(moved, Tracer):
            return moved
        free: jax.Array | None = uncommitted(moved)
        return moved if free is None else free

    def eager_index(self, index: Any) -> jax.Array | None:
        """`x[index]` outside a trace, for a basic index (ints, slices, `None`, `...`): that part
        of the frozen NumPy copy, transferred (NumPy and JAX agree on what a basic index
        selects). None for any other index, or data JAX holds in another dtype."""
        parts = index if isinstance(index, tuple) else (index,)
        basic = all(isinstance(p, _BASIC_INDEX) and not isinstance(p, bool) for p in parts)
        if not basic or held_dtype(self.host.dtype) != self.host.dtype:
            return None
        part: jax.Array = jax.device_put(self.host[index])
        return part

    @staticmethod
    def index(array: jax.Array, index: Any) -> jax.Array | None:
        """`array[index]` inside a trace (`Store.item`): the leading axis's selection taken in
        host memory and moved to device memory, the rest of the index taken there. None where
        the index is not of that form (the whole constant is then moved, and indexed there)."""
        split = leading_split(index, array.shape)
        if split is None:
            return None
        host, device = split
        moved: jax.Array = jax.device_put(array[host], DEVICE_MEMORY)
        return moved if device is None else moved[device]


Split: TypeAlias = tuple[tuple[Any, ...], tuple[Any, ...] | None]


def leading_split(index: Any, shape: tuple[int, ...]) -> Split | None:
    """`index` of an array of `shape` as the part taken in host memory, which selects along the
    leading axis only, without a stride, and the part then taken on the device (None: nothing
    left). XLA's TPU compiler refuses a slice of a `pinned_host` operand in more than one
    dimension, or computes it wrong ("Async slice only supports slicing in 1 dimension"; a
    strided one, "Expected instruction to have shape equal to f32[2,64,64]", jax 0.10.2 on a TPU
    v5e), so frozenconst never asks it for one. None for an index of another form: booleans, an
    integer array anywhere but first, or one first with an integer after it.

    >>> leading_split((1, slice(None, None, 2)), (4, 6))
    ((1,), (slice(None, None, 2),))
    >>> leading_split(slice(5, 0, -2), (8, 3))
    ((slice(1, 6, None),), (slice(4, None, -2),))
    """
    parts = index if isinstance(index, tuple) else (index,)
    consuming = [p for p in parts if p is not None and p is not Ellipsis]
    if sum(1 for p in parts if p is Ellipsis) > 1 or len(consuming) > len(shape) or not shape:
        return None
    if any(not (isinstance(p, slice) or _integer_scalar(p)) for p in consuming[1:]):
        return None
    fill = [slice(None)] * (len(shape) - len(consuming))
    expanded = [q for p in parts for q in (fill if p is Ellipsis else [p])]
    lead = next((i for i, p in enumerate(expanded) if p is not None), len(expanded))
    if lead == len(expanded):
        return (), tuple(expanded) or None
    first, rest = expanded[lead], expanded[lead + 1 :]
    if isinstance(first, slice):
        host, kept = _span(first, shape[0])
        device = [None] * lead + [kept, *rest]
    elif _integer_scalar(first):
        host, device = first, [None] * lead + rest
    elif _integer_array(first) and all(isinstance(p, slice) for p in rest):
        host, device = first, [None] * lead + [slice(None)] * np.ndim(first) + rest
    else:
        return None
    trivial = all(isinstance(p, slice) and p == slice(None) for p in device)
    return (host,), None if trivial else tuple(device)


def _span(part: slice, size: int) -> tuple[slice, slice]:
    """`part` of a dimension of `size` as the unstrided slice spanning what it selects, and the
    slice of that span giving what it selects."""
    start, stop, step = part.indices(size)
    picked = range(start, stop, step)
    if step == 1 or not picked:
        return (part if step == 1 else slice(0, 0)), slice(None)
    low, high = min(picked[0], picked[-1]), max(picked[0], picked[-1])
    first, last = picked[0] - low, picked[-1] - low
    end = last + (1 if step > 0 else -1)
    return slice(low, high + 1), slice(first, None if end < 0 else end, step)


def _integer_array(part: Any) -> bool:
    dtype = getattr(part, "dtype", None)
    return dtype is not None and np.issubdtype(dtype, np.integer)


def _integer_scalar(part: Any) -> bool:
    if isinstance(part, int):
        return not isinstance(part, bool)
    return getattr(part, "shape", None) == () and _integer_array(part)


def place(host: np.ndarray[Any, Any], sharding: Sharding) -> jax.Array:
    """`host` placed with `sharding` (page-locked: a host-resident constant's buffer)."""
    placed: jax.Array = jax.device_put(host, sharding)
    return placed


HostCopy: TypeAlias = Pageable | Pinned | Resident


def host_copy(choice: HostMemory, residency: Residency, host: np.ndarray[Any, Any]) -> HostCopy:
    """The kind a constant built with `host_memory=choice` and `residency` keeps, beside `host`
    (its frozen NumPy copy): `auto` is pageable; `residency="host"` is `Resident`."""
    if residency == "host":
        return Resident(host)
    return Pinned() if choice == "pinned" else PAGEABLE
