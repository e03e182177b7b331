"""frozenconst.audit, the guard, its pytest fixture, and the command line."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EMBED_LIMIT, SIMPLIFIED, program_parameters, simplified_copies_per_use, unique_data

import frozenconst

# The summary's wording is checked under both pipelines in one process, so its report is built
# with the audit's own byte count; which error a refusal raises follows the package's tables.
from frozenconst import FrozenConst, _audit, _compat
from frozenconst._refusals import JAX_LAX_REFUSES

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _seed(table, layers=40):
    def forward(w):
        return sum(jnp.sum(table @ w * i) for i in range(layers))

    return forward


def test_seed_scenario_with_numpy_is_flagged_with_its_duplicated_bytes():
    table = unique_data((512, 256))
    report = frozenconst.audit(_seed(table), jnp.ones((256, 4)))
    assert report.pipeline == ("simplified" if SIMPLIFIED else "default")
    (c,) = report.constants
    assert (c.kind, c.shape, c.dtype, c.nbytes, c.uses) == ("numpy", (512, 256), "float32", table.nbytes, 40)
    assert c.first_use is not None and "test_audit.py" in c.first_use
    assert c.fingerprint == FrozenConst(table).fingerprint
    assert report.total_bytes == table.nbytes
    # Under the simplified pipeline, 40 device copies where JAX makes one per use (jax 0.12.0
    # and before), one where it passes the array once (0.12.1); embedded once under the default.
    copies = 40 if simplified_copies_per_use() else 1
    assert c.device_copies == copies
    assert report.duplicate_bytes == ((copies - 1) if SIMPLIFIED else 0) * table.nbytes
    text = str(report)
    assert "numpy" in text and "FrozenConst" in text and "duplicated" in text
    assert any("raw NumPy constant" in line for line in report.lines())


@pytest.mark.skipif(not SIMPLIFIED, reason="the copies a NumPy closure costs are the simplified pipeline's")
@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_the_copies_the_audit_names_are_the_device_copies_jax_makes():
    # Each copy JAX makes is a parameter of the program it lowers, passed at every call: one
    # per use of the NumPy table (a literal each, jax 0.12.0 and before) or one (0.12.1).
    table = unique_data((512, 256))
    forward = _seed(table, layers=6)
    (c,) = frozenconst.audit(forward, jnp.ones((256, 4))).constants
    assert program_parameters(jax.jit(forward).lower(jnp.ones((256, 4)))) - 1 == c.device_copies


@pytest.mark.parametrize("pipeline", ["default", "simplified"])
def test_the_summary_says_duplicated_only_what_the_pipeline_duplicates(pipeline):
    # A NumPy constant used 40 times is 40 device copies under the simplified pipeline and
    # embedded once under the default one; two constants of equal content are two under both.
    mib = 1 << 20
    numpy = frozenconst.CapturedConstant("numpy", (512, 512), "float32", mib, 40, None, "sha256:a")
    twins = [frozenconst.CapturedConstant("jax", (8,), "float32", 32 << 10, 1, None, "sha256:b")] * 2
    constants = (numpy, *twins)
    report = frozenconst.AuditReport(
        constants, pipeline, mib + (64 << 10), _audit._duplicate_bytes(constants, pipeline)
    )
    summary = next(line for line in str(report).splitlines() if " in total, " in line)
    under_simplified = 39 * mib + (32 << 10)  # "39.0 MiB"
    if pipeline == "default":
        assert report.duplicate_bytes == 32 << 10
        assert summary.endswith(
            f"32.0 KiB duplicated ({_audit.human_bytes(under_simplified)} under JAX's simplified "
            "constant pipeline); JAX constant pipeline: default"
        ), summary
    else:
        assert report.duplicate_bytes == under_simplified
        assert summary.endswith(
            f"{_audit.human_bytes(under_simplified)} duplicated; JAX constant pipeline: simplified"
        ), summary


def test_same_code_with_a_frozenconst_reports_no_numpy_and_no_duplicates():
    table = FrozenConst(unique_data((1024, 256)))  # 1 MiB
    report = frozenconst.audit(_seed(table), jnp.ones((256, 4)))
    assert report.numpy_constants == ()
    assert report.duplicate_bytes == 0
    (c,) = report.constants
    assert c.kind == "frozenconst" and c.uses == 40
    # Whatever jit compiles it takes the constant as a parameter: nothing to fix.
    assert c.parameter and c.in_program(report.pipeline) == "parameter"
    assert "No problems" in str(report)


@pytest.mark.parametrize("above", [4, 256 << 10], ids=["just above", "far above"])
def test_a_frozenconst_above_the_threshold_is_a_parameter_of_jax_jit_as_the_audit_says(above):
    # Above `embed_max_bytes` (4 KiB) every jit takes a
    # FrozenConst as a parameter, and the audit says so: the program is the one with the table
    # passed as an argument, so the audit's "no problems" is true of the program JAX compiles,
    # however many times the table is used.
    nbytes = EMBED_LIMIT + above
    table = FrozenConst(unique_data((nbytes // 4,)))

    def uses(t, w):
        return sum(jnp.sum(t * w * i) for i in range(8))

    w = jnp.ones(nbytes // 4)
    closed = len(jax.jit(lambda w: uses(table, w)).lower(w).as_text())
    passed = len(jax.jit(uses).lower(table, w).as_text())
    report = frozenconst.audit(jax.jit(lambda w: uses(table, w)), w)
    assert closed < passed + 200  # the table's data (two hex digits a byte) is nowhere
    (c,) = report.constants
    assert c.in_program(report.pipeline) == "parameter"
    assert "No problems" in str(report)
    at_threshold = FrozenConst(unique_data((EMBED_LIMIT // 4,)))  # embedded by every jit
    report = frozenconst.audit(jax.jit(lambda w: at_threshold * w), jnp.ones(EMBED_LIMIT // 4))
    assert "No problems" in str(report)
    assert report.constants[0].in_program(report.pipeline) == ("parameter" if SIMPLIFIED else "embedded")


def test_a_copy_a_step_handed_back_is_a_parameter_as_the_audit_says():
    # A copy of a constant (a jitted step's output in its place), read by the audited function,
    # is kept out as the constant is, and the audit says so: no advice to make it a FrozenConst.
    with pytest.warns(frozenconst.FrozenConstWarning, match="put a copy"):
        copy = jax.jit(lambda t: t)(FrozenConst(unique_data((64, 64))))
    w = jnp.ones(64)
    report = frozenconst.audit(jax.jit(lambda w: copy @ w), w)
    (c,) = report.constants
    assert (c.kind, c.parameter, c.in_program(report.pipeline)) == ("frozenconst", True, "parameter")
    assert "No problems" in str(report)
    passed = len(jax.jit(lambda t, w: t @ w).lower(jnp.asarray(copy), w).as_text())
    assert len(jax.jit(lambda w: copy @ w).lower(w).as_text()) < passed + 200  # as it says


def test_frozenconst_jit_keeps_the_data_out_of_the_program():
    table = FrozenConst(unique_data((512, 256)))
    report = frozenconst.audit(frozenconst.jit(_seed(table)), jnp.ones((256, 4)))
    # The function captures the constant's buffer, as it captures any array; every jit,
    # frozenconst.jit among them, passes it to the executable.
    assert [(c.kind, c.fingerprint, c.uses, c.parameter) for c in report.constants] == [
        ("frozenconst", table.fingerprint, 40, True)
    ]
    assert report.duplicate_bytes == 0
    assert "No problems" in str(report)


def test_kinds_duplicates_by_content_nesting_and_shape_structs():
    data = unique_data((64, 64))
    jax_const = jnp.asarray(unique_data((64, 64)))
    copy_a, copy_b = data.copy(), data.copy()  # same content, two objects
    inner = jax.jit(lambda w: copy_b @ w)

    def f(w):
        y = jax.lax.scan(lambda c, _: (c + jax_const @ c, None), w, None, length=2)[0]
        return copy_a @ w + inner(w) + y

    report = frozenconst.audit(f, jax.ShapeDtypeStruct((64,), jnp.float32))
    kinds = sorted(c.kind for c in report.constants)
    assert kinds == ["jax", "numpy", "numpy"]
    assert report.duplicate_bytes == data.nbytes  # the two equal NumPy arrays
    assert any("intern" in line for line in report.lines())
    as_dict = report.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert set(as_dict) == {"pipeline", "total_bytes", "duplicate_bytes", "constants"}
    assert set(as_dict["constants"][0]) >= {
        "kind",
        "shape",
        "dtype",
        "nbytes",
        "uses",
        "first_use",
        "fingerprint",
    }


def test_audit_does_not_run_or_compile():
    calls = []
    table = unique_data((8, 8))

    def f(w):
        jax.debug.callback(lambda: calls.append(1))
        return table @ w

    frozenconst.audit(f, jnp.ones(8))
    assert calls == []


@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_guard_fails_on_numpy_constants_and_names_them():
    table = unique_data((64, 64))
    expected = pytest.raises(frozenconst.CapturedNumpyConstantError, match=r"numpy float32\[64,64\]")
    with expected as info, frozenconst.no_numpy_constants(max_bytes=1024):
        jax.jit(lambda w: table @ w)(jnp.ones(64))
    assert isinstance(info.value, AssertionError)
    assert "test_audit.py" in str(info.value) and "FrozenConst" in str(info.value)


def test_guard_allows_frozenconsts_jax_arrays_and_small_numpy():
    big = FrozenConst(unique_data((64, 64)))
    arr = jnp.asarray(unique_data((64, 64)))
    small = np.ones(8, np.float32)
    with frozenconst.no_numpy_constants(max_bytes=1024):
        jax.jit(lambda w: big @ w + arr @ w + small.sum())(jnp.ones(64)).block_until_ready()


def test_guard_passes_other_warnings_through():
    import warnings

    with pytest.warns(UserWarning, match="unrelated"), frozenconst.no_numpy_constants():
        warnings.warn("unrelated", UserWarning, stacklevel=1)


@pytest.mark.subprocess
@pytest.mark.usefixtures("needs_raw_numpy_lowering")
def test_pytest_fixture_through_the_plugin_entry_point(tmp_path):
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import jax, jax.numpy as jnp, numpy as np
            import frozenconst

            TABLE = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)

            def test_raw(no_numpy_constants):
                jax.jit(lambda w: TABLE @ w)(jnp.ones(64))

            def test_frozen(no_numpy_constants):
                t = frozenconst.FrozenConst(TABLE)
                jax.jit(lambda w: t @ w)(jnp.ones(64))
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_user.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert "1 failed, 1 passed" in out.stdout, out.stdout[-3000:]
    assert "CapturedNumpyConstantError" in out.stdout and "float32[64,64]" in out.stdout


@pytest.mark.subprocess
def test_command_line_audit():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "frozenconst", "audit", *a],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=ROOT,
    )
    before = run("examples/seed_model.py:forward", "--shapes", "float32[40,256,8]")
    assert before.returncode == 0, before.stderr
    if not simplified_copies_per_use():  # jax 0.12.1: one copy per program, nothing duplicated
        duplicated = "0 B duplicated;"
    elif SIMPLIFIED:
        duplicated = "39.0 MiB duplicated;"
    else:
        duplicated = "0 B duplicated (39.0 MiB under JAX's simplified"
    assert "numpy" in before.stdout and duplicated in before.stdout
    after = run("examples/seed_model.py:forward_fixed", "--shapes", "f32[40,256,8]", "--json")
    captured = json.loads(after.stdout)["constants"]
    assert [(c["kind"], c["parameter"]) for c in captured] == [("frozenconst", True)]
    failing = run("examples/seed_model.py:forward", "--shapes", "float32[40,256,8]", "--fail-on-problems")
    assert failing.returncode == 1
    bad = run("examples/seed_model.py:forward", "--shapes", "float32[40,256")
    assert bad.returncode == 2 and "DTYPE[DIMS]" in bad.stderr


# A FrozenConst where JAX takes only a jax.Array: as an index, or a lax operand.
_INDEX_USES = {
    "a[idx]": lambda a, idx: a[idx],
    "a.at[idx].set": lambda a, idx: a.at[idx].set(0.0),
    "lax.dynamic_slice": lambda a, idx: jax.lax.dynamic_slice(idx, (1,), (1,)) + a[0],
}


_WRAPS = [lambda f: f, jax.jit, frozenconst.jit]


def _jax_refuses_array_likes_as_indices() -> bool:
    # From jax 0.7, in these words; from 0.10, where a FrozenConst's type is registered
    # with JAX's `core.typeof`, an IndexError that names it. jax 0.6 calls `__jax_array__`
    # with a DeprecationWarning, then fails elsewhere (docs/jax.md, the version table).
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            jnp.arange(2.0)[FrozenConst(np.array([1]))]
    except ValueError as err:
        return "__jax_array__() during abstractification" in str(err)
    except IndexError as err:
        return "Got FrozenConst(" in str(err)
    return False


def _refusal(use):
    """What the audit raises for `use`, and the words of JAX's error it comes from."""
    if use != "lax.dynamic_slice" and _compat._aval_table is not None:
        return frozenconst.FrozenConstIndexError, "Got FrozenConst("
    return frozenconst.FrozenConstValueError, "__jax_array__"


@pytest.mark.skipif(
    not _jax_refuses_array_likes_as_indices(), reason=f"jax {jax.__version__} fails otherwise"
)
@pytest.mark.parametrize(
    "wrap", [lambda f: f, jax.jit, frozenconst.jit], ids=["plain", "jax.jit", "frozenconst.jit"]
)
@pytest.mark.parametrize("use", list(_INDEX_USES))
def test_audit_points_at_the_place_of_use_where_jax_refuses_a_frozenconst(use, wrap):
    idx = FrozenConst(np.array([1, 0], np.int32))
    if use == "lax.dynamic_slice" and jax.__version__ not in JAX_LAX_REFUSES:
        # jax.lax takes a FrozenConst here (_compat.register_array_type): nothing refused.
        report = frozenconst.audit(wrap(lambda a: _INDEX_USES[use](a, idx)), jnp.arange(4.0))
        assert report.constants or wrap is not jax.jit
        return

    place = _INDEX_USES[use]  # the error names the line of the lambda in _INDEX_USES
    refused, words = _refusal(use)
    with pytest.raises(refused, match=r"jnp\.asarray") as caught:
        frozenconst.audit(wrap(lambda a: place(a, idx)), jnp.arange(4.0))
    assert f"test_audit.py:{place.__code__.co_firstlineno} (<lambda>)" in str(caught.value)
    assert words in str(caught.value.__cause__)


@pytest.mark.parametrize(
    "wrap", [lambda f: f, jax.jit, frozenconst.jit], ids=["plain", "jax.jit", "frozenconst.jit"]
)
@pytest.mark.parametrize("use", list(_INDEX_USES))
def test_the_fix_the_audit_names_works_and_copies_nothing(use, wrap):
    idx = FrozenConst(np.array([1, 0], np.int32))
    a = jnp.arange(4.0)
    expected = _INDEX_USES[use](a, np.asarray(idx))
    out = wrap(lambda a: _INDEX_USES[use](a, jnp.asarray(idx)))(a)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
    assert jnp.asarray(idx) is jnp.asarray(idx)  # the cached buffer, not a copy


def test_audit_passes_other_value_errors_through():
    with pytest.raises(ValueError, match="not this") as caught:
        frozenconst.audit(lambda a: (_ for _ in ()).throw(ValueError("not this")), jnp.ones(2))
    assert not isinstance(caught.value, frozenconst.FrozenConstValueError)


@pytest.mark.skipif(SIMPLIFIED, reason="the simplified pipeline embeds nothing: no warning to hold back")
def test_auditing_a_frozenconst_jit_reports_what_its_call_warns_of():
    # The audit lists the closed-over NumPy array as a problem and does not also warn of it (a
    # warning under `-W error` would stop the audit); the function's own traces still warn.
    table = np.ones((64, 64), np.float32)
    f = frozenconst.jit(lambda x: x @ table)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = frozenconst.audit(f, jnp.ones(64))
    (found,) = report.constants
    assert found.kind == "numpy" and any("embedded" in p for p in found.problems(report.pipeline))
    with pytest.warns(frozenconst.FrozenConstWarning, match=r"closes over a NumPy array float32\[64, 64\]"):
        f(jnp.ones((2, 64)))
