"""Interning under a concurrent writer: a key always describes its constant's bytes."""

import threading
import time

import numpy as np

import frozenconst

# The race is made deterministic by replacing the hash the cache calls, and every key of the
# intern table is checked against its constant's bytes.
import frozenconst._cache
from frozenconst import _intern
from frozenconst._fingerprint import fingerprint


def _table_is_truthful() -> None:
    for (digest, _weak), const in list(_intern.INTERNED.table.items()):
        assert fingerprint(np.asarray(const)) == digest


def test_the_key_is_hashed_from_the_frozen_copy(monkeypatch):
    # Deterministic: the caller writes its array right after the content is
    # hashed. Hashing the caller's array, then copying it, would give a
    # constant whose key describes bytes it does not hold.
    src = np.arange(1000.0, dtype=np.float32)  # the dtype the constant holds: no conversion to blur it
    original = src.copy()
    real = fingerprint
    calls = []

    def hash_then_write(array):
        digest = real(array)
        calls.append(array)
        src[...] = -1.0
        return digest

    monkeypatch.setattr(frozenconst._cache, "fingerprint", hash_then_write)
    monkeypatch.setattr(_intern, "fingerprint", hash_then_write, raising=False)
    c = frozenconst.intern(src)
    monkeypatch.undo()
    np.testing.assert_array_equal(np.asarray(c), original)
    assert c.fingerprint == fingerprint(np.asarray(c)) == fingerprint(original)
    # What was hashed is the constant's own frozen buffer, not the caller's array.
    # (Other live constants of this shape and dtype are hashed too, once each, to find a twin.)
    (hashed,) = [a for a in calls if np.shares_memory(a, np.asarray(c))]
    assert not hashed.flags.writeable and not any(np.shares_memory(a, src) for a in calls)
    again = frozenconst.intern(src)  # now all -1: other content, another constant
    assert again is not c
    np.testing.assert_array_equal(np.asarray(again), -np.ones(1000))
    _table_is_truthful()


def test_a_non_contiguous_input_is_copied_once(monkeypatch):
    hashed = []
    real = fingerprint
    monkeypatch.setattr(frozenconst._cache, "fingerprint", lambda a: hashed.append(a) or real(a))
    src = np.arange(64.0).reshape(8, 8).T[::2]  # neither C- nor F-contiguous
    c = frozenconst.intern(src, dtype=">f8")  # and byte-swapped on the way
    (array,) = [a for a in hashed if np.shares_memory(a, np.asarray(c))]  # (and any live twin's)
    # The hash read the frozen copy itself: contiguous, so `fingerprint` made no copy of it.
    assert array.flags.c_contiguous and not any(np.shares_memory(a, src) for a in hashed)
    np.testing.assert_array_equal(np.asarray(c), src)
    assert frozenconst.intern(np.ascontiguousarray(src), dtype=np.float64) is c
    assert frozenconst.intern(np.ascontiguousarray(src)) is not c  # held as float32 without x64


def test_a_concurrent_writer_never_makes_a_key_lie():
    # 2 MiB, so copies and writes overlap (NumPy and hashlib release the GIL).
    src = np.zeros(1 << 18)
    stop = threading.Event()
    writes = [0]

    def writer():
        value = 0.0
        while not stop.is_set():
            value += 1.0
            src[: src.size // 2] = value
            src[src.size // 2 :] = -value
            writes[0] += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    seen = []
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and len(seen) < 200:
            c = frozenconst.intern(src)
            assert c.fingerprint == fingerprint(np.asarray(c))
            # A lookup by the same content finds a constant holding exactly that content.
            found = frozenconst.intern(np.array(c, copy=True))
            np.testing.assert_array_equal(np.asarray(found), np.asarray(c))
            assert found.fingerprint == c.fingerprint
            seen.append(c)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert writes[0] > 1 and len(seen) > 1
    _table_is_truthful()
