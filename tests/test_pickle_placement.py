"""Pickling keeps a declared sharding where the unpickling process can rebuild it."""

import pathlib
import pickle
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import single_device_sharding, subprocess_env
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# The payload's form is read off `__reduce__`, whose rebuilder is the package's; a placement
# that cannot be rebuilt is made by replacing how one is described.
import frozenconst._frozen
from frozenconst import FrozenConst, FrozenConstWarning

HERE = pathlib.Path(__file__).resolve().parent
TIMEOUT_S = 240


def _loads_without_warnings(payload: bytes):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return pickle.loads(payload)


def _loads_recording(payload: bytes):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = pickle.loads(payload)
    return loaded, [w for w in caught if issubclass(w.category, FrozenConstWarning)], caught


def test_sharding_target_is_a_deprecated_alias_of_declared_sharding():
    device = jax.devices()[0]
    for x in (FrozenConst(np.arange(3.0)), FrozenConst(np.arange(3.0), sharding=device)):
        with pytest.warns(FrozenConstWarning, match=r"sharding_target.*deprecated.*x\.declared_sharding"):
            old = x.sharding_target
        assert old is x.declared_sharding
    assert x.declared_sharding == single_device_sharding(device)


def test_single_device_placement_survives_a_round_trip():
    device = jax.devices()[0]
    x = FrozenConst(np.arange(6.0).reshape(2, 3), sharding=device)
    jnp.asarray(x)  # a device buffer exists, and must not travel
    payload = pickle.dumps(x)
    assert b"jaxlib" not in payload and b"ArrayImpl" not in payload
    y = _loads_without_warnings(payload)
    assert y.declared_sharding == x.declared_sharding == single_device_sharding(device)
    arr = jnp.asarray(y)
    assert arr.committed and arr.sharding == single_device_sharding(device)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert not np.asarray(y).flags.writeable


@pytest.mark.host_memory
def test_named_sharding_and_placed_handles_survive_a_round_trip():
    mesh = jax.make_mesh((1,), ("x",))
    sharding = NamedSharding(mesh, P("x", None))
    x = FrozenConst(np.ones((4, 2), np.float32)).placed(sharding)
    y = _loads_without_warnings(pickle.dumps(x))
    assert y.declared_sharding == sharding
    assert jnp.asarray(y).sharding == sharding
    # Inside containers, with other protocols, and when nothing was declared.
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        z = _loads_without_warnings(pickle.dumps({"w": x, "v": FrozenConst([1, 2])}, protocol=protocol))
        assert z["w"].declared_sharding == sharding and z["v"].declared_sharding is None


def test_without_a_placement_the_payload_is_the_host_data_only():
    x = FrozenConst(np.arange(3))
    reconstruct, args = x.__reduce__()
    # The host data, with its dtype: unpickled as held, whatever the x64 setting there (and
    # as the live constant of that content where one is live).
    assert reconstruct is frozenconst._frozen._unpickle and len(args) == 1
    assert args[0].dtype == x.host_dtype
    np.testing.assert_array_equal(args[0], np.arange(3))


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (("single", "cpu", 10**6, None), "no cpu device with id 1000000"),
        (("single", "nosuchplatform", 0, None), "no nosuchplatform devices"),
        (("named", "cpu", (2,), (0, 10**6), ("x",), ("Explicit",), ("x",), None), "no cpu device"),
        (("unsupported", "SomeSharding(...)"), "cannot carry a placement of this kind"),
    ],
)
def test_a_placement_that_cannot_be_rebuilt_warns_once_and_loads(monkeypatch, state, reason):
    x = FrozenConst(np.arange(4.0), sharding=jax.devices()[0])
    monkeypatch.setattr(frozenconst._frozen, "_sharding_state", lambda sharding: state)
    payload = pickle.dumps(x)
    monkeypatch.undo()
    y, ours, everything = _loads_recording(payload)
    assert len(ours) == 1 and len(everything) == 1, [str(w.message) for w in everything]
    assert reason in str(ours[0].message) and "x.placed" in str(ours[0].message)
    assert y.declared_sharding is None
    np.testing.assert_array_equal(np.asarray(y), np.arange(4.0))
    np.testing.assert_array_equal(np.asarray(jnp.asarray(y)), np.arange(4.0))


# -- many devices: in subprocesses with 4 CPU devices, and back in this process ---

_SCRIPT = textwrap.dedent(
    """
    import sys, pickle, warnings
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import numpy as np, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from frozenconst import FrozenConst

    warnings.simplefilter("error")
    # jax 0.8's `jax.make_mesh` announces its new default axis types, on every call.
    warnings.filterwarnings("ignore", "The default axis_types will change", DeprecationWarning)
    mode, path = sys.argv[1], sys.argv[2]
    data = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    mesh = jax.make_mesh((2, 2), ("a", "b"))
    named = NamedSharding(mesh, P("a", "b"))
    make = getattr(jax.sharding, "make_single_device_sharding", None)  # jax >= 0.12.1
    single = (make or jax.sharding.SingleDeviceSharding)(jax.devices()[3])

    def check(constants):
        x, y = constants
        assert x.declared_sharding == named, x.declared_sharding
        assert y.declared_sharding == single, y.declared_sharding
        arr = jnp.asarray(x)
        assert arr.sharding == named and {s.data.shape for s in arr.addressable_shards} == {(4, 4)}
        assert jnp.asarray(y).devices() == {jax.devices()[3]}
        for c in constants:
            np.testing.assert_array_equal(np.asarray(c), data)

    if mode == "dump":
        constants = [FrozenConst(data, sharding=named), FrozenConst(data).placed(single)]
        payload = pickle.dumps(constants)
        check(pickle.loads(payload))  # the round trip in this process
        with open(path, "wb") as f:
            f.write(payload)
    else:
        with open(path, "rb") as f:
            check(pickle.loads(f.read()))  # rebuilt in another process with the same devices
    print("ok", mode)
    """
)


def _run(*args):
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *args],
        env=subprocess_env("cpu"),  # four CPU devices
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert f"ok {args[0]}" in out.stdout


@pytest.mark.subprocess
def test_multi_device_placements_survive_pickle_across_processes(tmp_path):
    path = tmp_path / "constants.pkl"
    _run("dump", str(path))
    _run("load", str(path))
    if jax.device_count() >= 4:
        pytest.skip("this process has the 4 devices; the fallback needs fewer")
    # Here (fewer devices) neither placement can be rebuilt: each warns once and loads.
    constants, ours, everything = _loads_recording(path.read_bytes())
    assert len(ours) == len(everything) == 2, [str(w.message) for w in everything]
    assert "no cpu device with id" in str(ours[0].message)
    for c in constants:
        assert c.declared_sharding is None
        np.testing.assert_array_equal(np.asarray(jnp.asarray(c)), np.arange(64.0).reshape(8, 8))
