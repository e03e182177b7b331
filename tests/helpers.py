"""Helpers shared by several test modules (fixtures stay in conftest.py)."""

import functools
import gc
import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys

import jax
import jax.experimental
import jax.numpy
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Where the frozenconst this process imports lives, found without importing it.
_PACKAGE_HOME = pathlib.Path(importlib.util.find_spec("frozenconst").origin).resolve().parent.parent
TIMEOUT_S = 240

# -- what holds only on JAX's CPU backend ------------------------------------------
# The suite checks each promise on whatever device runs it (an accelerator under
# `tools/device-run`). A few facts hold only where JAX's default backend is the CPU;
# a test checks one only behind `requires_cpu(fact)` or `if on_cpu():`, or in a
# subprocess started with `subprocess_env("cpu")`. tests/test_device_neutral.py
# checks that every such read is guarded.
CPU_ONLY = {
    "aliasing": "JAX's CPU backend aliases a 64-byte-aligned host buffer instead of copying it "
    "(jax #37830), so a device buffer can be the frozen host buffer; an accelerator's lives in "
    "its own memory",
    "host RSS": "device buffers count in the process's resident memory only on the CPU backend; on "
    "an accelerator its driver allocates host memory (staging and pinned buffers) of its own",
    "cpu devices": "several devices in one process exist only as CPU devices "
    "(`jax_num_cpu_devices`), set before the backend starts, in a subprocess of their own",
    "subnormal flush": "XLA's CPU backend computes with subnormal floats flushed to zero; an "
    "accelerator's arithmetic may or may not",
    "one arithmetic": "XLA's CPU backend compiled a library's program reading the data as its own "
    "argument and the one closing over it to the same arithmetic; a TPU's compiler fused the two "
    "programs otherwise, and a sampler's chain carried the last bits' difference to the 5th digit",
}


@functools.cache
def on_cpu() -> bool:
    """Whether JAX's default backend is the CPU. Asked on first need: it starts JAX's backend."""
    return jax.default_backend() == "cpu"


# frozenconst's documented default `embed_max_bytes` (docs: "Which jit"): a FrozenConst of at
# most this many bytes stays embedded under JAX's default pipeline, on every backend.
EMBED_LIMIT = 4096


def requires_cpu(fact: str) -> None:
    """Skip the calling test, with the reason, unless JAX's default backend is the CPU:
    `fact` (a key of `CPU_ONLY`) holds only there."""
    if not on_cpu():
        pytest.skip(
            f"{fact} is a CPU-backend fact ({CPU_ONLY[fact]}); the default backend is {jax.default_backend()}"
        )


def subprocess_env(platform=None):
    """The environment for a Python subprocess that imports this checkout.

    By default the subprocess runs on the devices this process runs on (JAX's
    platform variable inherited, not set), so its checks hold there too.
    `platform="cpu"` forces JAX's CPU backend: for a subprocess that makes
    several CPU devices or processes (`CPU_ONLY["cpu devices"]`) or measures
    host memory (`CPU_ONLY["host RSS"]`).
    """
    env = dict(os.environ)
    # The frozenconst this process imports first (the checkout's, or an installed wheel's where the
    # suite runs against one), then the checkout (`examples`, `benchmarks`, `tests`), then the
    # environment's own path (a machine may keep JAX there, as the lent TPU's image does).
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([str(_PACKAGE_HOME), str(ROOT), env.get("PYTHONPATH", "")])
    )
    if platform is not None:
        assert platform == "cpu", platform
        env["JAX_PLATFORMS"] = "cpu"
    return env


def single_device_sharding(device, memory_kind=None):
    """The sharding of one device, as this JAX makes it: jax 0.12.1 deprecates the name
    `jax.sharding.SingleDeviceSharding` for `jax.sharding.make_single_device_sharding`."""
    make = getattr(jax.sharding, "make_single_device_sharding", None)
    if make is not None:
        return make(device, memory_kind=memory_kind)
    return jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)


def free_port():
    """A free TCP port on loopback. Another process could take it before the
    coordinator binds it; callers that care retry with a new one.

    Skips the calling test where the machine refuses TCP sockets on loopback (the lent TPU
    machine's sandbox: errno 97), which `jax.distributed`'s coordinator needs."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError as err:
        pytest.skip(f"this machine refuses TCP sockets on loopback ({err}), which jax.distributed needs")


def requires_peak_rss() -> None:
    """Skip the calling test where the kernel reports no peak resident memory (`VmHWM` in
    /proc/self/status, which the lent TPU machine's sandboxed kernel leaves out): the peak is
    what the test measures, in the processes it starts."""
    try:
        status = pathlib.Path("/proc/self/status").read_text()
    except OSError as err:
        pytest.skip(f"this machine has no /proc/self/status ({err}) to read a peak resident memory from")
    if "VmHWM:" not in status:
        pytest.skip("this machine's kernel reports no peak resident memory (no VmHWM in /proc/self/status)")


def run_processes(commands, timeout=TIMEOUT_S):
    """Run `commands` side by side on JAX's CPU backend, each in its own process group; kill
    every group still running once they are done or the time is up.

    Returns (exit codes, outputs with stderr merged).
    """
    procs = [
        subprocess.Popen(
            cmd,
            env=subprocess_env("cpu"),  # several processes of CPU devices (`jax.distributed`)
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cmd in commands
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        outputs.append("timed out")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs], outputs


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


# `jax.enable_x64` is public from jax 0.8; older JAX has it as `jax.experimental.enable_x64`.
enable_x64 = jax.enable_x64 if hasattr(jax, "enable_x64") else jax.experimental.enable_x64

# The constant pipeline this process runs, as JAX read it at import (from
# `JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS`): JAX's own answer, not the variable's spelling.
SIMPLIFIED = bool(getattr(jax.config, "jax_use_simplified_jaxpr_constants", False))
# The most bytes of a closed-over array the simplified pipeline embeds rather than passes
# (`jax_embedded_constants_max_bytes`: 32 on jax 0.10 to 0.12.0, 1024 from 0.12.1; -1 where
# JAX has no such limit, jax 0.8 and 0.9, which pass every non-scalar).
JAX_EMBED_MAX_BYTES: int = getattr(jax.config, "jax_embedded_constants_max_bytes", -1)


def closure_literal_per_use() -> bool:
    """Whether this process's JAX traces a closed-over NumPy array as a literal at each use (one
    device copy per use once the simplified pipeline hoists each: the copies of jax #5308 that a
    FrozenConst removes) rather than one constant of the program (`constvars`). Traced, never
    lowered or run."""
    c = np.arange(2048, dtype=np.float32)  # 8 KiB: above every embedding threshold
    closed = jax.make_jaxpr(lambda w: (w + c) * c)(jax.ShapeDtypeStruct(c.shape, c.dtype))
    return not closed.jaxpr.constvars


@functools.cache
def simplified_copies_per_use() -> bool:
    """Whether JAX's simplified pipeline makes a device copy of a closed-over NumPy array per
    use (jax 0.8 to 0.12.0), not one (jax 0.12.1 keeps it one constant of the program).

    Asked of JAX, under the simplified pipeline: in this process if it runs that pipeline (the
    flag is read at JAX's import), else in a subprocess on the CPU that runs it. Asked once."""
    if not hasattr(jax.config, "jax_use_simplified_jaxpr_constants"):
        return False  # no simplified pipeline to ask
    if SIMPLIFIED:
        return closure_literal_per_use()
    env = subprocess_env("cpu")
    env["JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS"] = "1"
    code, out = run_bounded(
        [sys.executable, "-c", "import helpers; print(helpers.closure_literal_per_use())"],
        cwd=pathlib.Path(__file__).parent,
        env=env,
    )
    answer = out.strip().splitlines()[-1] if out.strip() else ""
    assert code == 0 and answer in ("True", "False"), out
    return answer == "True"


@functools.cache
def raw_numpy_lowers() -> bool:
    """Whether this JAX can lower a program that closes over a NumPy array.

    jax 0.7 to 0.9 cannot under the simplified pipeline (seen on 0.7.2, 0.8.3 and
    0.9.2; fixed in 0.10). Asked on first need: it starts JAX's backend.
    """
    try:
        jax.jit(lambda w: w + np.arange(2, dtype=np.float32)).lower(jax.numpy.ones(2, np.float32))
    except Exception:
        return False
    return True


@functools.cache
def jax_donates_closed_over_buffers() -> bool:
    """Whether `jax.jit` runs a call that donates an array its function also closes over.

    jax 0.9 (seen on 0.9.2) refuses it under the simplified pipeline: the closed-over
    array is passed as an argument, and XLA refuses to donate a buffer used twice.
    """
    c = jax.numpy.arange(2.0, dtype=np.float32)
    try:
        jax.jit(lambda a: a * 0 + c * 0, donate_argnums=0)(c)
    except Exception:
        return False
    return True


@functools.cache
def pinned_host_offered() -> bool:
    """Whether the default device offers page-locked host memory (`host_memory="pinned"`
    pins there): the CPU backend of jax 0.9.2 and later does, 0.6.2's does not."""
    return any(m.kind == "pinned_host" for m in jax.devices()[0].addressable_memories())


def in_device_memory(arr: jax.Array) -> bool:
    """Whether `arr` lives in its devices' own memory: not a page-locked host copy."""
    kind = arr.sharding.memory_kind
    return kind is None or all(kind == d.default_memory().kind for d in arr.sharding.device_set)


def live_copies(data: np.ndarray) -> int:
    """Distinct device buffers JAX holds right now whose contents equal `data`.

    Observed through JAX alone (`jax.live_arrays()`). Two `jax.Array` objects over
    one buffer (same device, same `unsafe_buffer_pointer()`) are one copy: jax
    0.10 keeps a second handle on a closed-over array's buffer while compiling.
    A constant's page-locked host copy (`host_memory="pinned"`) is host memory,
    not a device copy.
    """
    gc.collect()
    buffers = set()
    for arr in jax.live_arrays():
        if arr.is_deleted() or arr.shape != data.shape or not in_device_memory(arr):
            continue
        if np.array_equal(np.asarray(arr), np.asarray(data, dtype=arr.dtype), equal_nan=True):
            for shard in arr.addressable_shards:
                buffers.add((shard.device, shard.data.unsafe_buffer_pointer()))
    return len(buffers)


def on_device(data):
    """`data` (NumPy data, or a FrozenConst's host data) as a plain `jax.Array` on the default device.

    The operand of a reference result: computed by JAX where the code under test
    computes, never by NumPy. An accelerator's float32 matmul rounds differently
    from NumPy's; the same computation on the same device does not.
    """
    return jax.numpy.asarray(np.asarray(data))


def assert_float32_close(actual, expected, magnitude, rtol=1e-5) -> None:
    """`actual` equals `expected` up to the float32 rounding of sums of terms of `magnitude`.

    `expected` is computed by JAX on the same device (operands from `on_device`):
    `on_device(a) @ b`, not `a @ b` in NumPy. `magnitude` is the sum of the terms'
    absolute values (`abs(a) @ abs(b)` for `a @ b`), in NumPy.

    XLA and NumPy sum in different orders. Where terms cancel, an entry can be
    far smaller than its terms, and a tolerance relative to the entry alone
    fails on rounding. A wrong constant, a stale buffer or a leaked tracer is
    off by the size of the terms, and still fails.
    """
    atol = rtol * float(np.max(np.abs(magnitude)))
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=rtol, atol=atol)


def unique_data(shape=(64, 32), dtype=np.float32, seed=None) -> np.ndarray:
    """Random data unlikely to equal any other live array in the process."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


def check_a_caught_stop_never_poisons_later_functions():
    """An inner `jax.jit` that catches every exception (`except Exception:`) around its use of a
    constant, traced first inside a frozenconst.jit function; four later functions, each kept
    alive by a module-level `jax.jit` closing over a constant, must each compute with the
    constant."""
    import frozenconst

    kind = {"embed_max_bytes": 12_345}
    known = frozenconst.FrozenConst(unique_data((64, 64)))  # 16 KiB: a parameter
    box = {"late": frozenconst.FrozenConst(np.full((64, 64), 10.0, np.float32))}

    @jax.jit
    def helper(v):
        try:
            return v + box["late"]
        except Exception:  # catches whatever the use raises
            return v * 0

    def fun(v):
        def body(c, _):
            extra = jax.numpy.sum(helper(v)) if v.ndim == 2 else 0.0
            return c + jax.numpy.sum(known) * 0 + extra, None

        return jax.lax.scan(body, 0.0, None, length=1)[0]

    want = 64 * 64 * 11.0
    first = frozenconst.jit(fun, **kind)
    first(jax.numpy.ones(4)).block_until_ready()  # isolated from now on
    # Isolated, this trace meets `late` first inside `helper`, whose stop `helper` catches.
    assert float(first(jax.numpy.ones((64, 64)))) == want
    del first
    gc.collect()
    pin = jax.jit(lambda v: v * jax.numpy.sum(known))
    later = []
    for _ in range(4):
        f = frozenconst.jit(lambda v: fun(v) + jax.numpy.sum(pin(v)) * 0, **kind)
        assert float(f(jax.numpy.ones((64, 64)))) == want
        later.append(f)


def program_parameters(lowered) -> int:
    """How many parameters the lowered program's entry function takes (JAX's own text of it):
    the arguments kept after JAX's dead-code elimination, and each constant passed to the
    executable (one per FrozenConst, however many uses)."""
    text = lowered.as_text()
    signature = text.split("func.func public @main(", 1)[1].split(") -> ", 1)[0]
    return signature.count("%arg")


def jax_passes(data) -> bool:
    """Whether `jax.jit` passes a closed-over `jax.Array` of `data`'s shape and dtype to the
    executable as a parameter rather than embedding it: JAX's own lowering as the oracle (never
    under its default pipeline; under the simplified one, per JAX's version and limit)."""
    array = jax.device_put(np.zeros_like(np.asarray(data)))
    return program_parameters(jax.jit(lambda: array * 2).lower()) == 1
