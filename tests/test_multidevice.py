"""Multi-device and multi-process JAX, each in subprocesses bounded in time."""

import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest
from helpers import run_bounded, subprocess_env

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "multihost.py"
TIMEOUT_S = 240


def _env():
    return subprocess_env()


def _run(cmd, **kwargs):
    return run_bounded(cmd, TIMEOUT_S, **kwargs)


@pytest.mark.subprocess
def test_four_cpu_devices_in_one_process():
    code, out = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "multidevice_cases.py")],
        env=_env(),
        cwd=HERE,
    )
    assert code == 0, out[-6000:]
    assert " passed" in out and "failed" not in out


def _free_port():
    # Ask the OS for a free port on loopback. Another process could take it
    # before the coordinator binds it; the test then retries with a new one.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(port):
    procs = [
        subprocess.Popen(
            [sys.executable, str(EXAMPLE), str(port), str(i)],
            env=_env(),
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT_S)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        outputs.append("timed out")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs], outputs


@pytest.mark.subprocess
def test_two_processes_with_jax_distributed():
    for _attempt in range(3):
        codes, outputs = _two_processes(_free_port())
        if codes == [0, 0]:
            break
        if not any("Address already in use" in o or "bind" in o.lower() for o in outputs):
            break
    assert codes == [0, 0], "\n----\n".join(o[-4000:] for o in outputs)
    for i, out in enumerate(outputs):
        assert f"process {i} ok" in out, out[-4000:]


@pytest.mark.subprocess
def test_the_documented_launcher_runs():
    code, out = _run([sys.executable, str(EXAMPLE)], env=_env(), cwd=HERE.parent)
    assert code == 0, out[-6000:]
    assert "process 0 ok" in out and "process 1 ok" in out
