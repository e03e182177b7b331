"""The `no_numpy_constants` guard decides from the compiled programs themselves.

The fixture and the basic cases are in test_audit.py. The suite runs once per
JAX constant pipeline (`helpers.SIMPLIFIED`); every case here holds in both.
"""

import pathlib
import subprocess
import sys
import threading
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import SIMPLIFIED, subprocess_env, unique_data

import frozenconst

# Whether a guard still observes JAX's lowering shows only in the installer's registry, and a
# JAX without the lowering function only by replacing the hook `_compat_lowering` found.
from frozenconst import FrozenConst, _compat_lowering, _guard, _install

PACKAGE = pathlib.Path(frozenconst.__file__).resolve().parent
KIB8 = (32, 64)  # float32: 8 KiB


def _guards_observing():
    """How many guards are among the observers of JAX's lowering (`_install`): each open
    guard is one, and a closed one is none, so a closed guard costs a lowering nothing."""
    return sum(isinstance(getattr(o, "__self__", None), _guard._Guard) for o in _install._installed.observers)


def _observing():
    return _guards_observing() > 0


def _offending_lines(error):
    return [line for line in str(error).splitlines() if line.startswith("- ")]


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_six_larger_frozenconsts_do_not_hide_an_8kib_numpy_constant():
    # JAX's own report lists only the five largest constants of a program.
    frozen = [FrozenConst(unique_data((64, 64))) for _ in range(6)]  # 16 KiB each
    raw = unique_data(KIB8)
    assert all(c.nbytes > raw.nbytes for c in frozen)

    def f(w):
        return sum(c @ w for c in frozen) + (raw @ w).sum()

    report = frozenconst.audit(f, jnp.ones(64))
    assert report.pipeline == ("simplified" if SIMPLIFIED else "default")
    assert len(report.constants) == 7
    with (
        pytest.raises(frozenconst.CapturedNumpyConstantError) as info,
        frozenconst.no_numpy_constants(max_bytes=1024),
    ):
        jax.jit(f)(jnp.ones(64)).block_until_ready()
    (line,) = _offending_lines(info.value)
    assert "numpy float32[32,64] (8192 bytes) at " in line
    assert "test_guard.py" in line and "wrap it once in `frozenconst.FrozenConst`" in line


def _nested_jit(raw):
    inner = jax.jit(lambda w: (raw @ w).sum())
    return jax.jit(lambda w: w + inner(w))


def _scan_body(raw):
    return jax.jit(lambda w: jax.lax.scan(lambda c, _: (c + (raw @ c).sum(), None), w, None, length=3)[0])


def _cond_branch(raw):
    return jax.jit(lambda w: jax.lax.cond(w[0] > 0, lambda v: v + (raw @ v).sum(), lambda v: v, w))


def _frozenconst_jit(raw):
    table = FrozenConst(unique_data((64, 64)))
    return frozenconst.jit(lambda w: table @ w + (raw @ w).sum())


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
@pytest.mark.parametrize("build", [_nested_jit, _scan_body, _cond_branch, _frozenconst_jit])
def test_constants_in_nested_programs_are_seen(build):
    raw = unique_data(KIB8)
    f = build(raw)
    with (
        pytest.raises(frozenconst.CapturedNumpyConstantError) as info,
        frozenconst.no_numpy_constants(max_bytes=1024),
        warnings.catch_warnings(),
    ):
        # frozenconst.jit says it embeds the NumPy array too (docs/jit.md); the guard is tested here.
        warnings.filterwarnings("ignore", "frozenconst.jit: .* closes over", frozenconst.FrozenConstWarning)
        f(jnp.ones(64)).block_until_ready()
    (line,) = _offending_lines(info.value)
    assert "numpy float32[32,64] (8192 bytes)" in line and "test_guard.py" in line


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_one_line_per_constant_however_often_it_is_used_and_compiled():
    raw = unique_data(KIB8)
    other = unique_data((16, 64), dtype=np.int32)  # 4 KiB
    with (
        pytest.raises(frozenconst.CapturedNumpyConstantError) as info,
        frozenconst.no_numpy_constants(max_bytes=1024),
    ):
        jax.jit(lambda w: sum((raw @ w * i).sum() for i in range(10)))(jnp.ones(64))
        jax.jit(lambda w: (raw @ w).sum() + 1)(jnp.ones(64))
        jax.jit(lambda w: (other @ w).sum())(jnp.ones(64, np.int32))
    lines = _offending_lines(info.value)
    assert len(lines) == 2
    assert "2 raw NumPy constant(s)" in str(info.value)
    assert "float32[32,64]" in lines[0] and "int32[16,64] (4096 bytes)" in lines[1]


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_frozenconsts_jax_arrays_and_numpy_up_to_the_limit_pass():
    frozen = [FrozenConst(unique_data((64, 64))) for _ in range(6)]
    arr = jnp.asarray(unique_data((64, 64)))
    at_limit = unique_data((256,))  # 1024 bytes
    with frozenconst.no_numpy_constants(max_bytes=1024):
        f = lambda w: sum(c @ w for c in frozen) + arr @ w + (at_limit * w[0]).sum()
        jax.jit(f)(jnp.ones(64)).block_until_ready()
        # (A function of its own: JAX shares the programs of one Python function between jits.)
        if SIMPLIFIED:  # JAX passes `arr` to the executable: nothing embedded, nothing said
            frozenconst.jit(lambda w: f(w))(jnp.ones(64)).block_until_ready()
        else:
            said = r"closes over a jax.Array float32\[64, 64\]"  # `arr`, embedded by JAX
            with pytest.warns(frozenconst.FrozenConstWarning, match=said):
                frozenconst.jit(lambda w: f(w))(jnp.ones(64)).block_until_ready()
    over = unique_data((257,))
    with (
        pytest.raises(frozenconst.CapturedNumpyConstantError, match=r"float32\[257\] \(1028 bytes\)"),
        frozenconst.no_numpy_constants(max_bytes=1024),
    ):
        jax.jit(lambda w: (over * w[0]).sum())(jnp.ones(64))


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_the_guard_stops_observing_after_the_block_an_error_inside_and_a_failing_guard():
    assert not _observing()
    with frozenconst.no_numpy_constants():
        assert _observing()
        with frozenconst.no_numpy_constants():  # nested: each guard observes, once
            assert _guards_observing() == 2
        assert _guards_observing() == 1
        assert _observing()
    assert not _observing()
    with pytest.raises(ZeroDivisionError), frozenconst.no_numpy_constants():
        assert _observing()
        _ = 1 / 0
    assert not _observing()
    raw = unique_data(KIB8)
    with pytest.raises(frozenconst.CapturedNumpyConstantError), frozenconst.no_numpy_constants():
        jax.jit(lambda w: raw @ w)(jnp.ones(64))
    assert not _observing()


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_an_error_inside_the_block_is_not_replaced_by_the_guard():
    raw = unique_data(KIB8)
    with pytest.raises(KeyError), frozenconst.no_numpy_constants():
        jax.jit(lambda w: raw @ w)(jnp.ones(64))
        raise KeyError("mine")


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_nested_guards_each_apply_their_own_limit():
    assert not _observing()
    raw_a, raw_b = unique_data(KIB8), unique_data((16, 64))  # 8 KiB, 4 KiB
    with (
        pytest.raises(frozenconst.CapturedNumpyConstantError) as info,
        frozenconst.no_numpy_constants(max_bytes=1024),
    ):
        with frozenconst.no_numpy_constants(max_bytes=1 << 20):
            jax.jit(lambda w: raw_a @ w)(jnp.ones(64))  # allowed by the inner guard
        assert _observing()  # the outer guard still sees
        jax.jit(lambda w: raw_b @ w)(jnp.ones(64))
    lines = _offending_lines(info.value)
    assert len(lines) == 2 and "float32[32,64]" in lines[0] and "float32[16,64]" in lines[1]
    assert not _observing()

    with (
        pytest.raises(frozenconst.CapturedNumpyConstantError, match=r"1 raw NumPy constant"),
        frozenconst.no_numpy_constants(max_bytes=1 << 20),  # lets the inner guard's error through
        frozenconst.no_numpy_constants(max_bytes=1024),
    ):
        jax.jit(lambda w: unique_data(KIB8) @ w)(jnp.ones(64))
    assert not _observing()


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_guards_in_many_threads_and_compilations_in_other_threads():
    assert not _observing()
    errors: list[BaseException | None] = [None] * 8
    start = threading.Barrier(len(errors))

    def worker(i):
        raw = unique_data(KIB8)
        start.wait()
        try:
            with frozenconst.no_numpy_constants(max_bytes=1024):
                jax.jit(lambda w: raw @ w)(jnp.ones(64)).block_until_ready()
        except BaseException as exc:
            errors[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(errors))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(e, frozenconst.CapturedNumpyConstantError) for e in errors), errors
    assert not _observing()

    raw = unique_data(KIB8)  # compiled by a thread the block starts
    with pytest.raises(frozenconst.CapturedNumpyConstantError), frozenconst.no_numpy_constants():
        t = threading.Thread(target=lambda: jax.jit(lambda w: raw @ w)(jnp.ones(64)))
        t.start()
        t.join()


@pytest.mark.parametrize(
    "hook", [None, (types.SimpleNamespace(), "lower_jaxpr_to_module")], ids=["no-hook", "hook-missing"]
)
@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_without_a_hook_the_guard_warns_that_it_checks_nothing(monkeypatch, hook):
    # A JAX without the lowering function: nothing was installed at import.
    monkeypatch.setattr(_install._installed, "observing", False)
    monkeypatch.setattr(_compat_lowering, "LOWERING_HOOK", hook)
    raw = unique_data(KIB8)
    with (
        pytest.warns(frozenconst.FrozenConstWarning, match="cannot see the programs jax"),
        frozenconst.no_numpy_constants(),
    ):
        jax.jit(lambda w: raw @ w)(jnp.ones(64))
    assert not _observing()


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_a_program_the_guard_cannot_read_is_reported_not_passed(monkeypatch):
    monkeypatch.setattr(_compat_lowering, "lowered_program", lambda args, kwargs: None)
    with (
        pytest.warns(frozenconst.FrozenConstWarning, match="could not inspect"),
        frozenconst.no_numpy_constants(),
    ):
        jax.jit(lambda w: unique_data(KIB8) @ w)(jnp.ones(64)).block_until_ready()


def test_no_regular_expression_over_jax_messages():
    guard = (PACKAGE / "_guard.py").read_text()
    assert "import re" not in guard and "catch_warnings" not in guard
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()
        assert "Closed-over constant" not in text and "captured during lowering" not in text, path
        # The command line parses its DTYPE[DIMS] shapes; `_compat_lowering` is the one home of
        # JAX's message texts (a call of an exported program, renumbered in the user's words).
        if path.name not in ("__main__.py", "_compat_lowering.py"):
            assert "import re\n" not in text, path


_FAILING_SAMPLE = """
import jax, jax.numpy as jnp, numpy as np


TABLE = np.ones((64, 64), np.float32)


def test_embeds(no_numpy_constants):
    w = jnp.ones(64)
    jax.jit(lambda v: TABLE @ v)(w)


def test_fails_itself(no_numpy_constants):
    jax.jit(lambda v: TABLE @ v + 1)(jnp.ones(64))
    assert 1 == 2
"""


@pytest.mark.subprocess
@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_the_fixtures_report_is_the_tests_own_line_and_the_message(tmp_path):
    # The report a user reads: the test's line that compiled the program, and the guard's
    # message, without frozenconst's source (nor the guard's docstring).
    (tmp_path / "test_sample.py").write_text(_FAILING_SAMPLE)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sample.py"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=240,
        cwd=tmp_path,
    )
    assert "2 failed" in out.stdout, out.stdout[-3000:]
    report = out.stdout.split(" FAILURES ")[1].split(" short test summary info ")[0]
    embeds, fails_itself = report.split(" test_fails_itself ")
    lines = [line for line in embeds.splitlines() if line.strip() and not line.startswith("_")]
    assert len(lines) <= 8, embeds
    assert ">       jax.jit(lambda v: TABLE @ v)(w)" in embeds
    assert "E       frozenconst.CapturedNumpyConstantError: 1 raw NumPy constant(s) captured" in embeds
    assert "numpy float32[64,64] (16384 bytes) at " in embeds and "wrap it once" in embeds
    line = _FAILING_SAMPLE.splitlines().index("    jax.jit(lambda v: TABLE @ v)(w)") + 1
    assert f"test_sample.py:{line}: CapturedNumpyConstantError" in embeds
    for library in ("_guard.py", "_frozenconst_pytestplugin.py", "contextlib", "pluggy", "__exit__"):
        assert library not in report, library
    # A test that fails on its own shows its own error; what the guard found is a note on it.
    line = _FAILING_SAMPLE.splitlines().index("    assert 1 == 2") + 1
    assert (
        ">       assert 1 == 2" in fails_itself and f"test_sample.py:{line}: AssertionError" in fails_itself
    )
    assert "E       frozenconst.no_numpy_constants also found 1 raw NumPy constant(s)" in fails_itself
