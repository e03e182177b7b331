"""The device cache: one `jax.Array` per placement, transferred once from the frozen host buffer."""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np

from ._compat import default_device_setting, eval_context, x64_enabled


def _default_device(setting: Any) -> jax.Device:
    # Mirrors how `jax.device_put(x)` picks a device when given none: the
    # `jax_default_device` setting (a device or a platform name), else the
    # first local device of the default backend.
    if setting is None:
        return jax.local_devices()[0]
    if isinstance(setting, str):
        return jax.local_devices(backend=setting)[0]
    device: jax.Device = setting
    return device


class Store:
    """A frozen host buffer and the device buffers made from it.

    Several `FrozenConst` handles can share one store (`FrozenConst(other)`),
    so they share the device buffers too. The store dies with its last handle,
    and its device buffers with it.
    """

    __slots__ = ("__weakref__", "_by_device", "_by_setting", "_lock", "host")

    def __init__(self, host: np.ndarray[Any, Any]) -> None:
        self.host = host
        self._lock = threading.Lock()
        # (jax_default_device setting, x64 flag) -> array: the hit path, one
        # dict lookup. Several settings can resolve to the same device buffer.
        self._by_setting: dict[tuple[Any, bool], jax.Array] = {}
        # (device, device dtype) -> array: the buffers themselves.
        self._by_device: dict[tuple[jax.Device, np.dtype[Any]], jax.Array] = {}

    def default_array(self) -> jax.Array:
        """The buffer on the default device, in the dtype JAX would give the host data now."""
        key = (default_device_setting(), x64_enabled())
        array = self._by_setting.get(key)
        # A cached buffer can be deleted behind our back: by `Array.delete()`,
        # or by donation to a jitted function (`donate_argnums`).
        if array is None or array.is_deleted():
            return self._transfer_default(key)
        return array

    def _transfer_default(self, key: tuple[Any, bool]) -> jax.Array:
        device = _default_device(key[0])
        dtype = jax.dtypes.canonicalize_dtype(self.host.dtype)
        with self._lock:
            array = self._by_device.get((device, dtype))
            if array is None or array.is_deleted():
                with eval_context():
                    # No `device` argument: the result stays uncommitted, like
                    # `jnp.asarray(np_array)`, so it combines with arrays on any
                    # device. It lands on `device`, the current default.
                    array = jax.device_put(self.host)
                self._by_device[(device, dtype)] = array
            self._by_setting[key] = array
            return array

    def evict(self) -> None:
        """Forget every device buffer; the next use transfers again."""
        with self._lock:
            self._by_setting.clear()
            self._by_device.clear()

    def cached(self) -> list[jax.Array]:
        """The live cached device buffers, one per placement."""
        with self._lock:
            return [a for a in self._by_device.values() if not a.is_deleted()]
