import gc
import os

import hypothesis
import jax
import pytest
from helpers import raw_numpy_lowers

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


@pytest.fixture
def needs_raw_numpy_lowering():
    """For tests that make such a program on purpose (the guard's, the audit's): nothing to check without."""
    if not raw_numpy_lowers():
        pytest.skip(f"jax {jax.__version__} cannot lower a NumPy closure under this constant pipeline")


@pytest.fixture(autouse=True)
def _clean_jax_state():
    yield
    gc.collect()
