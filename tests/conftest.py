import os

import hypothesis
import jax
import pytest
from helpers import pinned_host_offered, raw_numpy_lowers

# The suite decides the host memory itself: tests marked `host_memory` run once
# as a constant's default has it (auto: pageable on CPU) and once with every
# constant page-locked, the path an accelerator takes (docs/host-memory.md).
os.environ.pop("FROZENCONST_HOST_MEMORY", None)

# `make test` shares JAX's persistent compilation cache between an environment's passes (the
# Makefile's COMPILE_CACHE: most programs are the same under both pipelines). Only this
# process uses it: the subprocesses tests start compile as a user's program does, and a run
# of `pytest` without the variable is a user's run. Every program is cached, however quick
# to compile: the suite's are small and many. Not with jax 0.12.0.1, whose XLA aborts writing
# a program with a float6 literal (the Makefile's COMPILE_CACHE says more).
_COMPILATION_CACHE = os.environ.get("FROZENCONST_TEST_COMPILATION_CACHE")
if _COMPILATION_CACHE:
    jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

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


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("host_memory") is not None:
        metafunc.fixturenames.append("_host_memory_variant")
        metafunc.parametrize("_host_memory_variant", ["default", "pinned"])


@pytest.fixture(autouse=True)
def _host_memory(request, monkeypatch):
    """A `host_memory` test's variant ("default" for every other test): "pinned" sets
    `FROZENCONST_HOST_MEMORY` for the test (subprocesses it starts inherit it)."""
    callspec = getattr(request.node, "callspec", None)
    mode = "default" if callspec is None else callspec.params.get("_host_memory_variant", "default")
    if mode == "pinned":
        if not pinned_host_offered():
            pytest.skip(
                f"jax {jax.__version__}'s CPU devices offer no pinned_host memory "
                "(its fallback is tested in test_compat_fallbacks.py)"
            )
        monkeypatch.setenv("FROZENCONST_HOST_MEMORY", "pinned")
    return mode
