"""Multi-device and multi-process JAX, each in subprocesses bounded in time."""

import pathlib
import sys

import pytest
from helpers import free_port, run_bounded, run_processes, subprocess_env

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "multihost.py"
TIMEOUT_S = 240


def _env():
    return subprocess_env("cpu")  # four CPU devices, or two processes of CPU devices


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


def _two_processes(port):
    return run_processes([[sys.executable, str(EXAMPLE), str(port), str(i)] for i in range(2)], TIMEOUT_S)


@pytest.mark.subprocess
def test_two_processes_with_jax_distributed():
    for _attempt in range(3):
        codes, outputs = _two_processes(free_port())
        if codes == [0, 0]:
            break
        if not any("Address already in use" in o or "bind" in o.lower() for o in outputs):
            break
    assert codes == [0, 0], "\n----\n".join(o[-4000:] for o in outputs)
    for i, out in enumerate(outputs):
        assert f"process {i} ok" in out, out[-4000:]


@pytest.mark.subprocess
def test_the_documented_launcher_runs():
    free_port()  # the launcher binds one for jax.distributed's coordinator
    code, out = _run([sys.executable, str(EXAMPLE)], env=_env(), cwd=HERE.parent)
    assert code == 0, out[-6000:]
    assert "process 0 ok" in out and "process 1 ok" in out
