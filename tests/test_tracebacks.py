"""Tracebacks point at the user's code: frozenconst's frames go where JAX's go.

JAX decides once per error, from `JAX_TRACEBACK_FILTERING` or
`jax.config.jax_traceback_filtering`, so each mode runs in a fresh process. The
child raises errors of three origins (the user's code, JAX, frozenconst itself)
through `frozenconst.jit` (a call, a call traced twice, `lower`) and through
`jax.jit` with a FrozenConst, and reports each traceback as Python prints it.
"""

import json
import pathlib
import sys

import pytest
from helpers import run_bounded, subprocess_env

import frozenconst

PACKAGE = str(pathlib.Path(frozenconst.__file__).resolve().parent)

# The fallback run checks that `_compat` saw the missing hook: only its own state says so.
CHILD = r"""
import json, sys, traceback
import numpy as np, jax, jax.numpy as jnp
from jax._src import traceback_util

if sys.argv[1] == "fallback":  # a JAX without one of the hooks `_compat` needs
    hook = traceback_util.UnfilteredStackTrace
    del traceback_util.UnfilteredStackTrace
import frozenconst

if sys.argv[1] == "fallback":
    traceback_util.UnfilteredStackTrace = hook
    assert frozenconst._compat._traceback_util is None
    assert frozenconst._compat.traceback_filtering() == "off"

if sys.argv[1] == "config-off":
    jax.config.update("jax_traceback_filtering", "off")

table = frozenconst.FrozenConst(np.arange(4096.0, dtype=np.float32))


def user(x):
    y = x + table
    raise ValueError("user says no")  # LINE user


def in_jax(x):
    return jnp.dot(x + table, jnp.ones(3))  # LINE jax


def by_frozenconst(x):
    return frozenconst.FrozenConst(x + table)  # LINE frozenconst


@jax.jit
def inner(x):
    return x * table


def retried(x):
    y = inner(x)  # a constant inside a nested trace: the first trace is stopped and redone
    raise ValueError("user says no, the second time")  # LINE retried


def nested(x):
    def body(carry, _):
        return carry + jnp.dot(x + table, jnp.ones(3)), None  # LINE nested

    return jax.lax.scan(body, 0.0, None, length=1)[0]


def lowered(x):
    raise ValueError("no lowering either")  # LINE lower


def plain_closure(x):
    return table @ x  # LINE plain_closure


def plain_argument(x, t):
    return t + x  # LINE plain_argument


cases = {
    "user": lambda: frozenconst.jit(user)(jnp.ones(4096)),
    "jax": lambda: frozenconst.jit(in_jax)(jnp.ones(4096)),
    "frozenconst": lambda: frozenconst.jit(by_frozenconst)(jnp.ones(4096)),
    "retried": lambda: frozenconst.jit(retried)(jnp.ones(4096)),
    "nested": lambda: frozenconst.jit(nested)(jnp.ones(4096)),
    "lower": lambda: frozenconst.jit(lowered).lower(jnp.ones(4096)),
    "plain_closure": lambda: jax.jit(plain_closure)(jnp.ones(3)),
    "plain_argument": lambda: jax.jit(plain_argument)(jnp.ones(3), table),
}


def chain(err):
    seen = []
    while err is not None:
        seen.append(type(err).__name__)
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    return seen


report = {}
for name, case in cases.items():
    try:
        case()
    except Exception as err:
        frames = []
        tb = err.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            position = traceback._get_code_position(frame.f_code, tb.tb_lasti)[0]
            frames.append({
                "file": frame.f_code.co_filename,
                "line": tb.tb_lineno,
                "position": position,
                "hidden": bool(frame.f_locals.get("__tracebackhide__")),
                "jax_internal": not traceback_util.include_frame(frame)
                    and "frozenconst" not in frame.f_code.co_filename,
            })
            tb = tb.tb_next
        report[name] = {"message": str(err), "frames": frames, "chain": chain(err)}
    else:
        report[name] = None
print("REPORT" + json.dumps(report))
"""

# "nested": a user's error in a nested trace, tried again with buffers there (`_hoisting`'s
# `TRYING`) before it is taken for the user's and raised.
FROZENCONST_JIT = ("user", "jax", "frozenconst", "retried", "nested", "lower")
PLAIN_JIT = ("plain_closure", "plain_argument")


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    path = tmp_path_factory.mktemp("tracebacks") / "child.py"
    path.write_text(CHILD)
    lines = {
        text.split("# LINE ")[1].strip(): number
        for number, text in enumerate(CHILD.splitlines(), start=1)
        if "# LINE " in text
    }
    return path, lines


def _run(child, mode):
    path, _ = child
    env = subprocess_env()
    env.pop("JAX_TRACEBACK_FILTERING", None)
    if mode not in ("unset", "config-off", "fallback"):
        env["JAX_TRACEBACK_FILTERING"] = mode
    code, out = run_bounded([sys.executable, str(path), mode], env=env)
    assert code == 0, out
    return json.loads(out.split("REPORT", 1)[1])


@pytest.fixture(scope="module")
def reports(child):
    modes = (
        "unset",
        "quiet_remove_frames",
        "remove_frames",
        "tracebackhide",
        "off",
        "config-off",
        "fallback",
    )
    return {mode: _run(child, mode) for mode in modes}


def _own(frame):
    return frame["file"].startswith(PACKAGE)


def _user_frame(child, report, case):
    path, lines = child
    frames = [f for f in report[case]["frames"] if f["file"] == str(path)]
    assert frames, f"{case}: the user's file is missing from the traceback: {report[case]['frames']}"
    last = frames[-1]
    assert last["line"] == lines[case], f"{case}: the user's line is {last['line']}, not {lines[case]}"
    # The line Python prints and the position it underlines are the same line.
    assert last["position"] == last["line"], f"{case}: {last}"


@pytest.mark.subprocess  # each mode in a child interpreter (`reports`)
@pytest.mark.parametrize("mode", ["unset", "quiet_remove_frames", "remove_frames"])
def test_filtered_tracebacks_go_from_the_call_to_the_users_line(child, reports, mode):
    report = reports[mode]
    for case in FROZENCONST_JIT + PLAIN_JIT:
        assert report[case] is not None, case
        _user_frame(child, report, case)
        frames = report[case]["frames"]
        assert not any(f["jax_internal"] for f in frames), f"{case}: JAX kept its frames: {frames}"
        assert not any(_own(f) for f in frames), f"{case}: frozenconst's frames remain: {frames}"


@pytest.mark.subprocess  # each mode in a child interpreter (`reports`)
@pytest.mark.parametrize("mode", ["off", "config-off"])
def test_unfiltered_tracebacks_keep_every_frame_each_on_its_own_line(child, reports, mode):
    report = reports[mode]
    for case in FROZENCONST_JIT + PLAIN_JIT:
        _user_frame(child, report, case)
        frames = report[case]["frames"]
        assert any(f["jax_internal"] for f in frames), case
        own = [f for f in frames if _own(f)]
        assert own, f"{case}: frozenconst's frames are missing with filtering off: {frames}"
        # Each shows the line it was running when the error passed through it.
        assert all(f["position"] == f["line"] for f in own), f"{case}: {own}"


@pytest.mark.subprocess  # each mode in a child interpreter (`reports`)
def test_tracebackhide_marks_frozenconsts_frames_as_jax_marks_its_own(child, reports):
    report = reports["tracebackhide"]
    for case in FROZENCONST_JIT + PLAIN_JIT:
        frames = report[case]["frames"]
        assert [f for f in frames if _own(f)], case
        assert all(f["hidden"] for f in frames if _own(f)), f"{case}: {frames}"
        assert all(f["hidden"] for f in frames if f["jax_internal"]), f"{case}: {frames}"
        assert not any(f["hidden"] for f in frames if f["file"] == str(child[0])), case


@pytest.mark.subprocess  # each mode in a child interpreter (`reports`)
def test_the_message_is_the_same_in_every_mode_and_nothing_internal_is_chained(reports):
    expected = {
        "user": "user says no",
        "jax": "dot_general requires contracting dimensions",
        "frozenconst": "FrozenConst needs a concrete value",
        "retried": "user says no, the second time",
        "nested": "dot_general requires contracting dimensions",
        "lower": "no lowering either",
        "plain_closure": "dot_general requires contracting dimensions",
        "plain_argument": "incompatible shapes for broadcasting",
    }
    for case, start in expected.items():
        messages = {mode: report[case]["message"] for mode, report in reports.items()}
        assert len(set(messages.values())) == 1, f"{case}: {messages}"
        assert start in messages["off"], f"{case}: {messages['off']}"
        for mode, report in reports.items():
            # frozenconst's internal retry (`Rediscover`) never shows as the error's context.
            assert "Rediscover" not in report[case]["chain"], f"{case} ({mode}): {report[case]['chain']}"


@pytest.mark.subprocess  # each mode in a child interpreter (`reports`)
def test_without_jaxs_hooks_frozenconsts_frames_stay_and_the_users_line_is_there(child, reports):
    # The fallback: nothing registered with JAX, so nothing of frozenconst's is filtered.
    report = reports["fallback"]
    for case in FROZENCONST_JIT + PLAIN_JIT:
        _user_frame(child, report, case)
        assert not any(f["jax_internal"] for f in report[case]["frames"]), case
        assert any(_own(f) for f in report[case]["frames"]), case
        assert report[case]["message"] == reports["off"][case]["message"], case


def test_a_user_error_outside_any_trace_keeps_its_traceback():
    # Not raised through JAX: nothing is filtered, frozenconst's frames included.
    code, out = run_bounded(
        [
            sys.executable,
            "-c",
            "import frozenconst\ntry:\n    frozenconst.FrozenConst('text')\n"
            "except Exception as err:\n    import traceback; traceback.print_exception(err)\n",
        ],
        env=subprocess_env(),
    )
    assert code == 0, out
    assert "FrozenConstTypeError" in out and PACKAGE in out, out


def _branches_on_its_argument(x):  # the user's function: JAX names this file and line
    if x[0] > 0:
        return x * TABLE
    return x


TABLE = frozenconst.FrozenConst([1.0, 2.0, 3.0, 4.0])


@pytest.mark.parametrize("embed_max_bytes", [0, 1024], ids=["parameter", "captured"])
def test_a_tracing_error_names_the_users_function_and_line_as_under_jax_jit(embed_max_bytes):
    # JAX names the function it traced: the user's, never frozenconst's own
    # ("... while tracing the function ... at .../frozenconst/_jit.py").
    import jax
    import jax.numpy as jnp

    def said(wrap):
        with pytest.raises(jax.errors.ConcretizationTypeError) as raised:
            wrap(_branches_on_its_argument)(jnp.ones(4))
        return next(line for line in str(raised.value).splitlines() if "while tracing the function" in line)

    line = _branches_on_its_argument.__code__.co_firstlineno
    theirs = said(jax.jit)
    assert f"_branches_on_its_argument at {__file__}:{line} " in theirs, theirs
    assert said(lambda f: frozenconst.jit(f, embed_max_bytes=embed_max_bytes)) == theirs
    ours = said(frozenconst.filter_jit)  # the same place; the argument as filter_jit passes it
    assert f"_branches_on_its_argument at {__file__}:{line} " in ours, ours
