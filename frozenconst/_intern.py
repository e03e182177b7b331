"""Interning: one FrozenConst per distinct content, held weakly."""

from __future__ import annotations

import threading
import weakref

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ._fingerprint import fingerprint
from ._frozen import FrozenConst
from ._host import native, to_numpy

_TABLE: weakref.WeakValueDictionary[str, FrozenConst] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def intern(obj: ArrayLike | FrozenConst, dtype: DTypeLike | None = None) -> FrozenConst:
    """The live `FrozenConst` with this content, or a new one that later calls will find.

    Two parts of a program that load the same table get one host buffer and one
    device buffer per device. The table holds constants weakly: interning never
    keeps a constant alive. Content is compared by dtype, shape and bytes
    ([`FrozenConst.fingerprint`][frozenconst.FrozenConst.fingerprint]).

    Arguments:
        obj: anything `FrozenConst` accepts.
        dtype: as for `FrozenConst`.

    Example:
        >>> import numpy as np, frozenconst
        >>> a = frozenconst.intern(np.arange(1000.0))
        >>> b = frozenconst.intern(np.arange(1000.0))   # loaded again elsewhere
        >>> a is b
        True
    """
    if isinstance(obj, FrozenConst) and obj.is_concrete and (dtype is None or np.dtype(dtype) == obj.dtype):
        key = obj.fingerprint
        with _LOCK:
            found = _TABLE.get(key)
            if found is None:
                _TABLE[key] = found = obj
            return found
    array = to_numpy(obj, dtype)
    if dtype is not None:
        array = array.astype(native(np.dtype(dtype)), copy=False)
    elif not array.dtype.isnative:
        array = array.astype(native(array.dtype))
    key = fingerprint(array)  # hashed before copying: a hit costs no copy
    with _LOCK:
        found = _TABLE.get(key)
        if found is not None:
            return found
    made = FrozenConst(array)
    made._store._fingerprint = key  # type: ignore[union-attr]  # the same bytes
    with _LOCK:
        # Another thread may have interned the same content meanwhile: keep one.
        found = _TABLE.get(key)
        if found is None:
            _TABLE[key] = found = made
        return found
