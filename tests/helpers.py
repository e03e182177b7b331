"""Helpers shared by several test modules (fixtures stay in conftest.py)."""

import os
import pathlib
import signal
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT_S = 240


def subprocess_env():
    """The environment for a Python subprocess that imports this checkout, on the CPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def run_bounded(cmd, timeout=TIMEOUT_S, **kwargs):
    """Run `cmd` in its own process group; kill the whole group on timeout or failure.

    Returns (exit code, combined stdout and stderr).
    """
    proc = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out
