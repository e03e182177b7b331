import hashlib
import os
import re

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
# to compile: the suite's are small and many. But not a program with a float6 type
# (`_writes_serializable_programs_only`).
_COMPILATION_CACHE = os.environ.get("FROZENCONST_TEST_COMPILATION_CACHE")
# float6_e2m3fn and float6_e3m2fn, as XLA's HLO text spells them.
_UNSERIALIZABLE_TYPE = re.compile(r"\bf6e(2m3|3m2)fn\[")


def _writes_serializable_programs_only():
    """The cache's writer, left out for a program with a float6 type: jax 0.12.0.1's XLA aborts
    the process serializing one with a float6 literal (`literal.cc:2746] Unhandled primitive
    type F6E2M3FN`, a check failure in HloModule::ToProto, not an exception), as
    `jnp.asarray(x, dtype=float6_e2m3fn)` in tests/test_bad_input.py compiles. Such a program
    compiles as without a cache. JAX's writer is private
    (`jax._src.compilation_cache.put_executable_and_time`, the same five parameters from jax
    0.6.2 to 0.12.0.1); where a JAX lacks it, the cache stays off."""
    try:
        from jax._src import compilation_cache
    except ImportError:
        return False
    put = getattr(compilation_cache, "put_executable_and_time", None)
    if put is None:
        return False

    def put_serializable(cache_key, module_name, executable, *args, **kwargs):
        # HloModule.to_string elides large constants: the types are what it is read for.
        if any(_UNSERIALIZABLE_TYPE.search(module.to_string()) for module in executable.hlo_modules()):
            return
        put(cache_key, module_name, executable, *args, **kwargs)

    compilation_cache.put_executable_and_time = put_serializable
    return True


if _COMPILATION_CACHE and _writes_serializable_programs_only():
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
def cpu_aborts_on_complex128(monkeypatch):
    """The CPU standing in for a TPU: its table of dtypes whose arithmetic aborts the process
    names complex128 (a private reach: CI has no TPU, where the table's entry applies)."""
    import numpy as np

    import frozenconst._dtypes

    table = {**frozenconst._dtypes._ABORTING_DTYPES, "cpu": frozenset({np.dtype(np.complex128)})}
    monkeypatch.setattr(frozenconst._dtypes, "_ABORTING_DTYPES", table)


@pytest.fixture
def needs_raw_numpy_lowering():
    """For tests that make such a program on purpose (the guard's, the audit's): nothing to check without."""
    if not raw_numpy_lowers():
        pytest.skip(f"jax {jax.__version__} cannot lower a NumPy closure under this constant pipeline")


def _shard():
    """`FROZENCONST_SHARD=i/n` (1 <= i <= n): which of n shares of the suite this run takes."""
    setting = os.environ.get("FROZENCONST_SHARD", "")
    if not setting:
        return None
    index, _, count = setting.partition("/")
    try:
        shard = (int(index), int(count))
    except ValueError:
        shard = (0, 0)
    if not 1 <= shard[0] <= shard[1]:
        raise pytest.UsageError(
            f"FROZENCONST_SHARD is {setting!r}: write i/n, 1 <= i <= n (2/3: the second of three)"
        )
    return shard


def _ran_already():
    """`FROZENCONST_RAN=file`: the ids of the tests that file lists (one a line, as
    `pytest_runtest_logreport` wrote them) have run; this run leaves them out and adds the ones
    it finishes."""
    path = os.environ.get("FROZENCONST_RAN", "")
    if not path:
        return frozenset()
    try:
        with open(path, encoding="utf-8") as lines:
            return frozenset(line.rstrip("\n") for line in lines)
    except FileNotFoundError:
        return frozenset()


def _digest(nodeid):
    return int(hashlib.sha256(nodeid.encode()).hexdigest(), 16)


def pytest_collection_modifyitems(config, items):
    # A share of the suite (a lent accelerator runs it over several calls): every n-th test, by
    # its id's digest, so that a share is the same set on every machine and in every order.
    # And where a call's time ran out, the next one goes on from there (FROZENCONST_RAN).
    shard = _shard()
    ran = _ran_already()
    if shard is None and not ran:
        return
    kept, dropped = [], []
    for item in items:
        in_share = shard is None or _digest(item.nodeid) % shard[1] == shard[0] - 1
        (kept if in_share and item.nodeid not in ran else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_runtest_logreport(report):
    # A test has run once its teardown is reported (pass, failure or skip alike). Under
    # pytest-xdist the controller and the worker both see it: the list is read as a set.
    # A test whose worker the backend aborted is reported once, in a phase xdist names "???".
    path = os.environ.get("FROZENCONST_RAN", "")
    if path and report.when in ("teardown", "???"):
        with open(path, "a", encoding="utf-8") as ran:
            ran.write(report.nodeid + "\n")


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
