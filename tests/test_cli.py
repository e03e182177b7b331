"""`python -m frozenconst audit`: each user error is one line on stderr with its own exit code.

Every case runs from a directory holding a small model module: in this process
(`main(argv)`, stderr captured), and one case per exit code, `--help` and
`--traceback` again as the command line in a subprocess (two at a time). The
exit codes are `EXIT_CODES` in frozenconst/__main__.py, documented in `--help`
and docs/tools.md.
"""

import concurrent.futures
import os
import re
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT, TIMEOUT_S, subprocess_env

from frozenconst.__main__ import EXIT_CODES, EXIT_LOAD, EXIT_OK, EXIT_PROBLEMS, EXIT_TRACE, EXIT_USAGE, main

MODEL = """
    import jax, jax.numpy as jnp, numpy as np
    import frozenconst

    TABLE = np.ones((256, 256), np.float32)
    FROZEN = frozenconst.FrozenConst(TABLE)
    NOT_A_FUNCTION = 3

    def forward(x):
        return x @ FROZEN

    def leaky(x):
        return x @ TABLE

    def loss(params, batch):
        x, y = batch
        return jnp.sum((x @ TABLE @ params["w"] + params["b"] - y) ** 2)

    def example_args():
        params = {"w": jax.ShapeDtypeStruct((256, 8), jnp.float32), "b": jnp.zeros(8)}
        batch = (jax.ShapeDtypeStruct((4, 256), jnp.float32), jax.ShapeDtypeStruct((4, 8), jnp.float32))
        return params, batch

    def as_keywords():
        params, batch = example_args()
        return {"params": params, "batch": batch}

    def a_list():
        return [1, 2]

    def raising():
        raise RuntimeError("no data in this sandbox")

    jitted = jax.jit(loss)
    frozen_jitted = frozenconst.jit(loss)
    frozen_forward = frozenconst.jit(forward)
"""

# name: (arguments after `audit`, exit code, text stderr (or, for 0 and 1, stdout) must hold)
CASES = {
    # frozenconst.jit keeps the 256 KiB FrozenConst out of the program: nothing to report.
    "arrays": (["model:frozen_forward", "--shapes", "f32[4,256]"], EXIT_OK, "No problems found."),
    # The same function uncompiled: jax.jit would embed it under the default pipeline (reported
    # there as a problem; under the simplified pipeline there is none), exit 0 without the flag.
    "arrays-uncompiled": (["model:forward", "--shapes", "f32[4,256]"], EXIT_OK, "[256, 256]"),
    "problems-reported": (["model:leaky", "--shapes", "f32[4,256]"], EXIT_OK, "numpy"),
    "problems-fail": (
        ["model:leaky", "--shapes", "f32[4,256]", "--fail-on-problems"],
        EXIT_PROBLEMS,
        "numpy",
    ),
    "pytrees": (["model:loss", "--args-from", "model:example_args"], EXIT_OK, "[256, 256]"),
    "pytrees-same-module": (["model.py:loss", "--args-from", ":example_args"], EXIT_OK, "[256, 256]"),
    "pytrees-keywords": (["model:loss", "--args-from", ":as_keywords"], EXIT_OK, "[256, 256]"),
    "pytrees-jax-jit": (["model:jitted", "--args-from", ":example_args"], EXIT_OK, "[256, 256]"),
    "pytrees-frozenconst-jit": (
        ["model:frozen_jitted", "--args-from", ":example_args", "--fail-on-problems"],
        EXIT_PROBLEMS,
        "[256, 256]",
    ),
    "no-shapes": (["model:forward"], EXIT_USAGE, "missing a required argument: 'x'"),
    "too-many-shapes": (["model:forward", "--shapes", "f32[4,256]", "i32[]"], EXIT_USAGE, "too many"),
    "unreadable-shape": (["model:forward", "--shapes", "f32[4,256"], EXIT_USAGE, "DTYPE[DIMS]"),
    "unknown-dtype": (["model:forward", "--shapes", "float33[4]"], EXIT_USAGE, "unknown dtype 'float33'"),
    "no-colon": (["model"], EXIT_USAGE, "expected MODULE:FUNCTION"),
    "unknown-option": (["model:forward", "--output", "x.json"], EXIT_USAGE, "unrecognized arguments"),
    "shapes-and-args-from": (
        ["model:loss", "--shapes", "f32[1]", "--args-from", ":example_args"],
        EXIT_USAGE,
        "not allowed with",
    ),
    "factory-returns-a-list": (["model:loss", "--args-from", ":a_list"], EXIT_USAGE, "returned a list"),
    "no-module": (["no_such_module:f"], EXIT_LOAD, "no module named 'no_such_module'"),
    "no-file": (["missing/model.py:f"], EXIT_LOAD, "no file missing/model.py"),
    "no-name": (["model:forwrd", "--shapes", "f32[4,256]"], EXIT_LOAD, "did you mean 'forward'?"),
    "not-callable": (["model:NOT_A_FUNCTION"], EXIT_LOAD, "not a function"),
    "import-raises": (["broken:f"], EXIT_LOAD, "importing broken raised ZeroDivisionError"),
    "factory-raises": (["model:loss", "--args-from", ":raising"], EXIT_LOAD, "no data in this sandbox"),
    "trace-fails": (["model:forward", "--shapes", "f32[4,3]"], EXIT_TRACE, "tracing model:forward raised"),
}


# In a subprocess too: one case per exit code (and the pytree form).
IN_SUBPROCESS = ["arrays", "problems-fail", "pytrees", "no-shapes", "no-module", "trace-fails"]


def _run(cwd, args):
    env = subprocess_env()
    # The checkout, the model's folder, then what the environment itself puts on the path (where
    # a machine keeps JAX there, as the lent TPU's image does).
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(cwd), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "frozenconst", "audit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _write_model(cwd):
    (cwd / "model.py").write_text(textwrap.dedent(MODEL))
    (cwd / "broken.py").write_text("1 / 0\n")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cli")
    _write_model(cwd)
    runs = {name: CASES[name][0] for name in IN_SUBPROCESS}
    runs["traceback"] = ["model:loss", "--args-from", ":raising", "--traceback"]
    runs["help"] = ["--help"]
    runs["pytrees-json"] = ["model:loss", "--args-from", ":example_args", "--json"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = {name: pool.submit(_run, cwd, args) for name, args in runs.items()}
        return {name: future.result() for name, future in done.items()}


def _check(name, code, stdout, stderr):
    _, expected, text = CASES[name]
    assert code == expected, (stdout[-2000:], stderr[-2000:])
    if code in (EXIT_OK, EXIT_PROBLEMS):
        assert text in stdout and "error" not in stderr, (stdout, stderr)
        return
    assert "Traceback" not in stderr and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr  # one line, whatever went wrong
    # argparse's own errors name the parser that found them: the command's or `audit`'s.
    assert re.match(r"python -m frozenconst( audit)?: error: ", lines[0]) and text in lines[0], lines[0]


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    _write_model(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    yield tmp_path
    for name in ("model", "broken"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_exit_code_and_message(model_dir, capsys, name):
    try:
        code = main(["audit", *CASES[name][0]])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    out = capsys.readouterr()
    _check(name, code, out.out, out.err)


@pytest.mark.subprocess
@pytest.mark.parametrize("name", IN_SUBPROCESS)
def test_exit_code_and_message_of_the_command_line(results, name):
    out = results[name]
    _check(name, out.returncode, out.stdout, out.stderr)


@pytest.mark.subprocess
def test_every_exit_code_is_exercised_and_documented(results):
    assert {code for _, code, _ in CASES.values()} == set(EXIT_CODES)
    assert {CASES[name][1] for name in IN_SUBPROCESS} == set(EXIT_CODES)
    helped = results["help"].stdout
    for code, what in EXIT_CODES.items():
        assert f"  {code}  {what.split()[0]}" in helped, helped
    docs = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    for code in EXIT_CODES:
        assert f"| {code} |" in docs


@pytest.mark.subprocess
def test_traceback_on_request(results):
    out = results["traceback"]
    assert out.returncode == EXIT_LOAD
    assert "Traceback (most recent call last)" in out.stderr and 'raise RuntimeError("no data' in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("python -m frozenconst audit: error: calling")


@pytest.mark.subprocess
def test_pytrees_are_audited_as_the_python_call_is(results):
    # The factory's pytrees reach the function: the report is the one frozenconst.audit gives.
    import json
    import types

    import frozenconst

    module = types.ModuleType("cli_model")
    exec(textwrap.dedent(MODEL), module.__dict__)
    expected = frozenconst.audit(module.loss, *module.example_args()).to_dict()
    got = json.loads(results["pytrees-json"].stdout)
    for report in (expected, got):
        for constant in report["constants"]:
            del constant["first_use"]  # the file's path, or <string> here
    assert got == expected
    assert [c["kind"] for c in got["constants"]] == ["numpy"]
