import gc
import os

import hypothesis
import jax
import numpy as np
import pytest

# JAX compiles on first use of each shape, so examples are slow: no deadline.
# Under CI the examples are derived from each test rather than drawn at random
# (Hypothesis's advice for CI), so a clean clone runs exactly the examples that
# `CI=true make test` ran here; local runs keep exploring new ones.
hypothesis.settings.register_profile(
    "frozenconst",
    deadline=None,
    max_examples=int(os.environ.get("FROZENCONST_EXAMPLES", "40")),
    derandomize=os.environ.get("CI") == "true",
)
hypothesis.settings.load_profile("frozenconst")

SIMPLIFIED = os.environ.get("JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS", "") not in ("", "0", "false", "False")


def live_copies(data: np.ndarray) -> int:
    """Distinct device buffers JAX holds right now whose contents equal `data`.

    Observed through JAX alone (`jax.live_arrays()`). Two `jax.Array` objects over
    one buffer (same device, same `unsafe_buffer_pointer()`) are one copy: jax
    0.10 keeps a second handle on a closed-over array's buffer while compiling.
    """
    gc.collect()
    buffers = set()
    for arr in jax.live_arrays():
        if arr.is_deleted() or arr.shape != data.shape:
            continue
        if np.array_equal(np.asarray(arr), np.asarray(data, dtype=arr.dtype), equal_nan=True):
            for shard in arr.addressable_shards:
                buffers.add((shard.device, shard.data.unsafe_buffer_pointer()))
    return len(buffers)


def assert_float32_close(actual, expected, magnitude, rtol=1e-5) -> None:
    """`actual` equals `expected` up to the float32 rounding of sums of terms of `magnitude`.

    `magnitude` is the sum of the terms' absolute values (`abs(a) @ abs(b)` for
    `a @ b`).

    XLA and NumPy sum in different orders. Where terms cancel, an entry can be
    far smaller than its terms, and a tolerance relative to the entry alone
    fails on rounding (it did in CI: 1.3e-5 relative on an entry of 0.022,
    the sum of eight products of about 1). A wrong constant, a stale buffer or
    a leaked tracer is off by the size of the terms, and still fails.
    """
    atol = rtol * float(np.max(np.abs(magnitude)))
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=rtol, atol=atol)


def unique_data(shape=(64, 32), dtype=np.float32, seed=None) -> np.ndarray:
    """Random data unlikely to equal any other live array in the process."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture(autouse=True)
def _clean_jax_state():
    yield
    gc.collect()
