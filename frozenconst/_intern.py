"""Interning: one FrozenConst per distinct content, held weakly."""

from __future__ import annotations

import threading
import weakref

from numpy.typing import ArrayLike, DTypeLike

from ._convert import as_dtype
from ._dtypes import native
from ._frozen import FrozenConst, content_key, with_live_twin


class _Interned:
    """The interned constants, held weakly, changed under the lock. Keyed by fingerprint and
    weak type: `intern(0.5)` (weakly typed, as `jnp.asarray(0.5)`) and
    `intern(np.float32(0.5))` hold the same bytes and promote differently."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.table: weakref.WeakValueDictionary[tuple[str, bool], FrozenConst] = weakref.WeakValueDictionary()


INTERNED = _Interned()


def intern(obj: ArrayLike | FrozenConst, dtype: DTypeLike | None = None) -> FrozenConst:
    """The live `FrozenConst` with this content, or a new one that later calls will find.

    Two parts of a program that load the same table get one host buffer and one
    device buffer per device. The table holds constants weakly: interning never
    keeps a constant alive. Content is compared by dtype, shape, weak type and bytes
    ([`FrozenConst.fingerprint`][frozenconst.FrozenConst.fingerprint]). A constant
    made without `intern` is found too (`FrozenConst(a)`, an unpickled one): the
    first `intern` of its content returns a handle on its buffers, which later
    calls return again. A Python scalar is weakly typed, as in `FrozenConst(0.5)`.

    The content is hashed from the frozen copy, never from the caller's array:
    a thread writing that array meanwhile cannot make a constant's key describe
    other bytes than its own. So every call copies once, as `FrozenConst` does
    (a non-contiguous or byte-swapped input too, only once); on a hit the copy
    is dropped and the live constant returned.

    Arguments:
        obj: anything `FrozenConst` accepts.
        dtype: as for `FrozenConst`.

    Raises:
        FrozenConstTypeError, FrozenConstValueError: as `FrozenConst` does.

    Examples:
        >>> import numpy as np, frozenconst
        >>> a = frozenconst.intern(np.arange(1000.0))
        >>> b = frozenconst.intern(np.arange(1000.0))   # loaded again elsewhere
        >>> a is b
        True
    """
    if not (isinstance(obj, FrozenConst) and obj.is_concrete) or (
        dtype is not None and native(as_dtype(dtype)) != obj.host_dtype
    ):
        obj = FrozenConst(obj, dtype)  # validated and copied once, or converted from its host data
    key = content_key(obj)  # of the frozen copy: the constant's own bytes, hashed once
    with INTERNED.lock:
        # Another thread may have interned the same content meanwhile: keep one.
        found = INTERNED.table.get(key)
        if found is None:
            INTERNED.table[key] = found = with_live_twin(obj)
        return found
