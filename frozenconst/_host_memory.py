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

The next kind (a host-resident constant streamed into programs, say) is one more class
with `transfer`, `made` and `nbytes`.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Literal, TypeAlias

import jax
import numpy as np
from jax.sharding import Sharding, SingleDeviceSharding

from ._compat import Device, offers_pinned_host, uncommitted, warn_degraded
from ._errors import FrozenConstTypeError, FrozenConstValueError

HostMemory: TypeAlias = Literal["auto", "pinned", "pageable"]
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


class Pageable:
    """Transfers read the frozen NumPy copy: nothing else is held."""

    __slots__ = ()
    name = "pageable"
    nbytes = 0

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
            isinstance(sharding, SingleDeviceSharding)
            and sharding.device_set == {home}
            and sharding.memory_kind in (None, home.default_memory().kind)
        ):
            return None
        array: jax.Array = jax.device_put(copy, SingleDeviceSharding(home) if sharding is None else sharding)
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
        copied: jax.Array = jax.device_put(array, SingleDeviceSharding(device, memory_kind="pinned_host"))
    return copied


HostCopy: TypeAlias = Pageable | Pinned


def host_copy(choice: HostMemory) -> HostCopy:
    """The kind a constant built with `host_memory=choice` keeps: `auto` is pageable."""
    return Pinned() if choice == "pinned" else PAGEABLE
