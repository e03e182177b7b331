"""Content fingerprints: a digest of dtype, shape and bytes."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

# SHA-256: collision-resistant, and on CPUs with SHA instructions as fast as
# the weaker digests (`python -m benchmarks core`, table "Fingerprints"; the
# figures are in docs/results/performance-results.md). hashlib releases the
# GIL while it hashes.
_ALGORITHM = "sha256"


def fingerprint(array: np.ndarray[Any, Any]) -> str:
    """`sha256:<hex>` over the dtype, the shape and the C-ordered bytes of `array`."""
    digest = hashlib.new(_ALGORITHM)
    digest.update(f"{array.dtype.str}|{array.dtype.name}|{array.shape}|".encode())
    data = np.ascontiguousarray(array)
    if data.size:
        digest.update(data.reshape(-1).view(np.uint8).data)
    return f"{_ALGORITHM}:{digest.hexdigest()}"
