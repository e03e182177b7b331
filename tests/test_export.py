"""Programs exported without their constants, the constants stored once, by content.

Round trips run in fresh processes: one exports and saves (it has the function's code), another
loads (it has only frozenconst and NumPy) and compares with what the first computed, bitwise.
Figures of size are JAX's own: the serialized program's bytes, beside `jax.export`'s.
"""

import gc
import hashlib
import json
import os
import pathlib
import re
import sys
import textwrap
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    enable_x64,
    free_port,
    on_cpu,
    requires_peak_rss,
    run_bounded,
    run_processes,
    subprocess_env,
)

import frozenconst
from frozenconst import FrozenConst
from frozenconst._export import MANIFEST, PROGRAM

# -- in this process ----------------------------------------------------------------------------


def _table(shape=(256, 256), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _matvec(seed=8):
    data = _table((64, 64), seed)
    table = FrozenConst(data)
    return data, frozenconst.export(lambda x: table @ x, jax.ShapeDtypeStruct((64,), jnp.float32))


def _loads_as_the_argument_form(path, data):
    x = jnp.linspace(-1.0, 1.0, 64)
    want = jax.jit(lambda t, v: t @ v)(jnp.asarray(data), x)  # JAX's own, the table an argument
    np.testing.assert_array_equal(frozenconst.load(path)(x), want)


def _program():
    table, bias = FrozenConst(_table()), FrozenConst(_table((256,), 1))
    inner = jax.jit(lambda v: table @ v)
    inner(jnp.ones(256))  # traced before: its cached program holds the buffer

    def f(x):
        y = jax.lax.scan(lambda c, _: (jnp.tanh(table @ c), None), x, None, length=2)[0]
        return inner(y) + jax.checkpoint(lambda v: table @ v)(y) + 2 * bias

    return f, table, bias


SPEC = jax.ShapeDtypeStruct((256,), jnp.float32)
SPEC64 = jax.ShapeDtypeStruct((64,), jnp.float32)


def test_the_exported_program_holds_none_of_the_constants_data():
    f, table, bias = _program()
    exported = frozenconst.export(f, SPEC)
    # The bias (1 KiB, below `embed_max_bytes`) stays in the program, as under any jit.
    assert [c.fingerprint for c in exported.constants] == [table.fingerprint] and bias.nbytes == 1024
    ours = len(exported.program.mlir_module_serialized)
    with pytest.warns(frozenconst.FrozenConstWarning, match="`frozenconst.export` keeps them out"):
        theirs = len(jax.export.export(jax.jit(f))(SPEC).mlir_module_serialized)  # JAX's own
    assert ours < 8192 < table.nbytes < theirs, (ours, theirs)
    x = jnp.linspace(-1.0, 1.0, 256)
    np.testing.assert_array_equal(exported(x), jax.jit(f)(x))


def test_the_exported_function_called_in_a_users_jit_keeps_the_constants_parameters(tmp_path):
    f, table, _ = _program()
    loaded = frozenconst.load(frozenconst.export(f, SPEC).save(tmp_path / "f"))
    user = jax.jit(lambda x: loaded(x) * 2)
    assert len(user.lower(SPEC).as_text()) < table.nbytes // 8  # never embedded again
    x = jnp.linspace(-1.0, 1.0, 256)
    np.testing.assert_array_equal(user(x), jax.jit(lambda x: f(x) * 2)(x))


def test_arrays_that_are_not_frozenconsts_are_embedded_and_named():
    plain = jnp.asarray(_table((64, 64), 2))
    table = FrozenConst(_table((64, 64), 3))
    with pytest.warns(frozenconst.FrozenConstWarning, match=r"embeds 1 array\(s\) that are not FrozenConsts"):
        exported = frozenconst.export(lambda x: plain @ (table @ x), jax.ShapeDtypeStruct((64,), jnp.float32))
    ((kind, array, nbytes, line),) = exported.embedded
    assert (kind, array, nbytes) == ("jax.Array", "float32[64, 64]", plain.nbytes)
    assert line is not None and __file__ in line
    assert len(exported.constants) == 1


def test_a_shared_store_keeps_each_constant_once_and_writes_nothing_twice(tmp_path, monkeypatch):
    table = FrozenConst(_table((128, 128), 4))
    store = tmp_path / "constants"
    first = frozenconst.export(lambda x: table @ x, jax.ShapeDtypeStruct((128,), jnp.float32))
    second = frozenconst.export(lambda x: jnp.tanh(x @ table), jax.ShapeDtypeStruct((128,), jnp.float32))
    first.save(tmp_path / "first", constants=store)
    (blob,) = store.glob("*.npy")
    stamp = blob.stat().st_mtime_ns
    writes = []
    real = np.lib.format.write_array
    monkeypatch.setattr(np.lib.format, "write_array", lambda *a, **k: writes.append(a) or real(*a, **k))
    second.save(tmp_path / "second", constants=store)
    first.save(tmp_path / "first", constants=store)  # saved again: the program replaced, no constant
    assert writes == [] and list(store.glob("*.npy")) == [blob] and blob.stat().st_mtime_ns == stamp
    assert np.array_equal(np.load(blob), np.asarray(table))  # NumPy alone reads the store
    a, b = frozenconst.load(tmp_path / "first"), frozenconst.load(tmp_path / "second")
    # Interned: one host buffer and one device buffer, shared with the live constant too.
    assert a.constants[0] is b.constants[0]
    assert jnp.asarray(a.constants[0]).unsafe_buffer_pointer() == jnp.asarray(table).unsafe_buffer_pointer()
    x = jnp.ones(128)
    np.testing.assert_array_equal(a(x), first(x))
    np.testing.assert_array_equal(b(x), second(x))


def test_frozenconsts_in_the_arguments_and_outputs_save_and_load_as_jax_arrays_do(tmp_path):
    # A params tree holding a FrozenConst, in and out: its node is part of the program's calling
    # convention, which `jax.export` serializes by registered name.
    w, b = _table((64, 64), 12), _table((64,), 13)
    table = FrozenConst(_table((64, 64), 14))  # kept out, beside the program

    def f(params, x):
        y = jnp.tanh(params["w"] @ x + params["b"]) @ table
        return {"y": y, "params": params}

    params = {"w": FrozenConst(w), "b": jnp.asarray(b)}
    x = jnp.linspace(-1.0, 1.0, 64)
    exported = frozenconst.export(f, params, SPEC64)
    assert "FrozenConst" in str(exported.program.in_tree) and "FrozenConst" in str(exported.program.out_tree)
    loaded = frozenconst.load(exported.save(tmp_path / "prog"))
    assert loaded.program.in_tree == exported.program.in_tree
    assert loaded.program.out_tree == exported.program.out_tree
    want = jax.jit(f)({"w": jnp.asarray(w), "b": jnp.asarray(b)}, x)  # the jax.Array form
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", frozenconst.FrozenConstWarning)  # the returned copy of `w`
        for program in (exported, loaded):
            got = program(params, x)
            assert isinstance(got["params"]["w"], FrozenConst)
            for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("exported_x64", [False, True])
def test_a_program_runs_under_either_x64_setting_with_its_constants_in_the_exported_dtypes(
    tmp_path, exported_x64
):
    # `dtype=np.float64` keeps float64 on the host: the program takes the constant as float32
    # (exported with x64 off) or float64 (on), and is fed that whatever the caller's setting.
    data = np.linspace(-1.0, 1.0, 64 * 64).reshape(64, 64)
    x = np.linspace(0.0, 1.0, 64, dtype=np.float32)
    with enable_x64(exported_x64):
        table = FrozenConst(data, dtype=np.float64)
        exported = frozenconst.export(lambda v: jnp.tanh(table @ v), SPEC64)
        path = exported.save(tmp_path / "prog")
        # The argument form, computed by JAX under the setting the program was exported with.
        want = np.asarray(jax.jit(lambda t, v: jnp.tanh(t @ v))(jnp.asarray(data), jnp.asarray(x)))
    assert want.dtype == (np.float64 if exported_x64 else np.float32)
    for setting in (not exported_x64, exported_x64):
        with enable_x64(setting):
            for program in (exported, frozenconst.load(path)):
                got = np.asarray(program(jnp.asarray(x)))
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want)


def test_a_store_reached_through_a_link_is_found_through_it_after_the_link_moves(tmp_path):
    # The blobs moved to another disk and the link re-pointed: the manifest names the link.
    data, exported = _matvec(15)
    (tmp_path / "disk1").mkdir()
    (tmp_path / "disk2").mkdir()
    (tmp_path / "disk1" / "blobs").mkdir()
    (tmp_path / "work").mkdir()
    link = tmp_path / "work" / "store"
    link.symlink_to(tmp_path / "disk1" / "blobs")
    path = exported.save(tmp_path / "work" / "prog", constants=link)
    assert json.loads((path / "manifest.json").read_text())["constants_dir"] == "../store"
    (tmp_path / "disk1" / "blobs").rename(tmp_path / "disk2" / "blobs")
    link.unlink()
    link.symlink_to(tmp_path / "disk2" / "blobs")
    _loads_as_the_argument_form(path, data)


def test_a_program_moved_with_its_store_or_alone_loads(tmp_path):
    data, exported = _matvec(16)
    exported.save(tmp_path / "a" / "prog", constants=tmp_path / "a" / "store")
    (tmp_path / "a").rename(tmp_path / "b")  # the two together: found relative to the program
    _loads_as_the_argument_form(tmp_path / "b" / "prog", data)
    (tmp_path / "b" / "prog").rename(tmp_path / "prog")  # the program alone: its store where it was
    with pytest.raises(frozenconst.FrozenConstValueError, match=r"is missing \(nor at .*a/store/"):
        frozenconst.load(tmp_path / "prog")
    exported.save(tmp_path / "c" / "prog", constants=tmp_path / "c" / "store")
    (tmp_path / "c" / "prog").rename(tmp_path / "moved")
    _loads_as_the_argument_form(tmp_path / "moved", data)


def _tanh_energy(t, v):  # the argument form: the table passed in
    return jnp.sum(jnp.tanh(t @ v) ** 2)


def _second(fun):
    """Reverse over reverse: the gradient of a function of `fun`'s gradient."""
    return jax.grad(lambda v: jnp.sum(jnp.sin(jax.grad(fun)(v))))


def _saved_with_derivatives(tmp_path, rows):
    """The saved program's sizes at `vjp_order` 0, 1 and 2, its values and derivatives checked."""
    data = _table((rows, 64), 17)
    table = FrozenConst(data)
    exported = frozenconst.export(lambda v: _tanh_energy(table, v), SPEC64)
    sizes = []
    for order in (0, 1, 2):
        path = exported.save(tmp_path / f"{rows}-{order}", vjp_order=order)
        sizes.append((path / "program.jaxexport").stat().st_size)
    loaded, t, x = frozenconst.load(path), jnp.asarray(data), jnp.linspace(-1.0, 1.0, 64)
    np.testing.assert_array_equal(loaded(x), jax.jit(_tanh_energy)(t, x))
    np.testing.assert_array_equal(jax.grad(loaded)(x), jax.jit(jax.grad(_tanh_energy, argnums=1))(t, x))
    if rows <= 256:  # bitwise JAX's own export's (which embeds the table)
        theirs = jax.export.deserialize(
            jax.export.export(jax.jit(partial(_tanh_energy, t)))(SPEC64).serialize(2)
        )
        np.testing.assert_array_equal(_second(loaded)(x), _second(theirs.call)(x))
    return sizes


def test_the_saved_derivatives_hold_none_of_the_constants_data(tmp_path):
    # `vjp_order` saves the VJP programs beside the primal one: each takes the constants as
    # inputs too, so the file's size does not depend on theirs (64 KiB and 4 MiB tables).
    small, big = _saved_with_derivatives(tmp_path, 256), _saved_with_derivatives(tmp_path, 16384)
    assert all(abs(b - s) < 64 for s, b in zip(small, big, strict=True)) and max(big) < 32768, (small, big)
    assert small[0] < small[1] < small[2], small  # the derivatives are there


def test_derivatives_of_a_constant_evicted_since_export_are_refused_not_embedded(tmp_path):
    table = FrozenConst(_table((64, 64), 18))
    exported = frozenconst.export(lambda v: _tanh_energy(table, v), SPEC64)
    table.evict()  # the buffer the program was traced with is no constant's any more
    with pytest.raises(
        frozenconst.FrozenConstRuntimeError, match=r"was evicted or deleted since\. Export it again"
    ):
        exported.save(tmp_path / "prog", vjp_order=1)
    assert not (tmp_path / "prog").exists()
    path = exported.save(tmp_path / "prog")  # the program alone is lowered already
    np.testing.assert_array_equal(frozenconst.load(path)(jnp.ones(64)), exported(jnp.ones(64)))


def test_a_function_calling_a_loaded_program_exports_with_the_constants_kept_out(saved, tmp_path):
    path, exported = saved
    loaded = frozenconst.load(path)
    outer = frozenconst.export(lambda x, y: jnp.tanh(loaded(x)) + y, SPEC64, SPEC64)
    assert [c.fingerprint for c in outer.constants] == [c.fingerprint for c in exported.constants]
    assert len(outer.program.mlir_module_serialized) < exported.constants[0].nbytes // 2
    again = frozenconst.load(outer.save(tmp_path / "outer"))
    x, y = jnp.linspace(-1.0, 1.0, 64), jnp.ones(64)
    np.testing.assert_array_equal(again(x, y), jax.jit(lambda x, y: jnp.tanh(exported(x)) + y)(x, y))


# -- bad input ------------------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    table = FrozenConst(_table((64, 64), 5))
    exported = frozenconst.export(lambda x: table @ x, jax.ShapeDtypeStruct((64,), jnp.float32))
    return exported.save(tmp_path / "prog"), exported


def _blob(path):
    (blob,) = (path / "constants").glob("*.npy")
    return blob


def _edit_manifest(path, **changes):
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_a_missing_constant_is_named(saved):
    path, _ = saved
    blob = _blob(path)
    blob.unlink()
    with pytest.raises(
        frozenconst.FrozenConstValueError, match=rf"{blob.name} is missing: the constant sha256:"
    ):
        frozenconst.load(path)


@pytest.mark.parametrize("damage", ["a byte changed", "truncated", "another array"])
def test_a_damaged_constant_is_an_error_never_a_wrong_result(saved, damage):
    path, _ = saved
    blob = _blob(path)
    data = bytearray(blob.read_bytes())
    assert blob.stat().st_mode & 0o777 == 0o444  # saved read-only: written once, never in place
    blob.chmod(0o644)  # as someone who means to change it
    if damage == "a byte changed":
        data[-3] ^= 0x40
        blob.write_bytes(bytes(data))
        match = "does not hold the constant it was saved as"
    elif damage == "truncated":
        blob.write_bytes(bytes(data[: len(data) // 2]))
        match = "is damaged"
    else:
        np.save(blob, np.zeros((8, 8), np.float64))
        match = r"holds float64\[8, 8\], where the manifest"
    with pytest.raises(frozenconst.FrozenConstValueError, match=match):
        frozenconst.load(path)


def test_a_newer_format_not_a_program_and_no_program(saved, tmp_path):
    path, _ = saved
    # A manifest of the next format: one above the package's own format number.
    _edit_manifest(path, format=frozenconst._export.FORMAT + 1)
    with pytest.raises(frozenconst.FrozenConstValueError, match="upgrade frozenconst"):
        frozenconst.load(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(frozenconst.FrozenConstValueError, match="cannot be read as a frozenconst manifest"):
        frozenconst.load(path)
    with pytest.raises(frozenconst.FrozenConstValueError, match="holds no saved program"):
        frozenconst.load(tmp_path)


def test_the_manifest_records_the_calling_convention_and_each_constants_record(saved):
    path, exported = saved
    manifest = json.loads((path / "manifest.json").read_text())
    program = exported.program
    assert manifest["format"] == frozenconst._export.FORMAT and manifest["jax"] == jax.__version__
    assert manifest["calling_convention_version"] == program.calling_convention_version
    assert manifest["platforms"] == list(program.platforms) == [jax.default_backend()]
    digest = hashlib.sha256((path / "program.jaxexport").read_bytes()).hexdigest()
    assert manifest["program_fingerprint"] == f"sha256:{digest}"
    ((table, entry),) = zip(exported.constants, manifest["constants"], strict=True)
    assert entry == {
        "fingerprint": table.fingerprint,
        "file": table.fingerprint.removeprefix("sha256:") + ".npy",
        "dtype": "<f4",
        "shape": [64, 64],
        "sharding": None,
    }


def test_a_damaged_program_is_named_damaged_not_another_version(saved):
    path, _ = saved
    data = bytearray((path / "program.jaxexport").read_bytes())
    data[len(data) // 2] ^= 0x40
    (path / "program.jaxexport").write_bytes(bytes(data))
    with pytest.raises(
        frozenconst.FrozenConstValueError,
        match=r"program\.jaxexport does not hold the program its manifest was saved with .* changed or "
        "damaged",
    ):
        frozenconst.load(path)


def test_a_program_of_a_calling_convention_this_jax_does_not_call_names_both_versions(saved):
    path, _ = saved
    _edit_manifest(path, jax="9.9.9", calling_convention_version=99)
    with pytest.raises(
        frozenconst.FrozenConstRuntimeError,
        match=rf"with jax 9\.9\.9 in its calling convention version 99, which jax {jax.__version__} does "
        r"not call .* Load it with a JAX that does \(jax 9\.9\.9\)",
    ):
        frozenconst.load(path)


@pytest.mark.parametrize("saved_with", ["0.0.1", "this"])
def test_a_whole_program_this_jax_cannot_read_says_why(saved, saved_with):
    # The file is whole (its digest recorded), yet not a program this JAX reads.
    path, _ = saved
    garbage = b"\x00" * 64
    (path / "program.jaxexport").write_bytes(garbage)
    version = jax.__version__ if saved_with == "this" else saved_with
    _edit_manifest(path, jax=version, program_fingerprint="sha256:" + hashlib.sha256(garbage).hexdigest())
    advice = (
        "Load it with jax 0\\.0\\.1" if saved_with != "this" else "this JAX version saved it: JAX's error"
    )
    with pytest.raises(
        frozenconst.FrozenConstRuntimeError,
        match=rf"jax {re.escape(jax.__version__)} cannot read .* saved with jax {re.escape(version)} "
        rf".*{advice}",
    ):
        frozenconst.load(path)
    _edit_manifest(path, program_fingerprint=None)  # a manifest that records no digest
    if saved_with == "this":
        with pytest.raises(
            frozenconst.FrozenConstRuntimeError, match="changed or damaged since it was saved"
        ):
            frozenconst.load(path)


def test_the_path_of_the_manifest_loads_its_directory_and_another_file_is_named(saved):
    path, exported = saved
    loaded = frozenconst.load(path / "manifest.json")
    assert loaded.path == path
    np.testing.assert_array_equal(loaded(jnp.ones(64)), exported(jnp.ones(64)))
    with pytest.raises(
        frozenconst.FrozenConstValueError,
        match=rf"program\.jaxexport is a file: give `frozenconst\.load` the directory .* wrote, "
        rf"{re.escape(str(path))}\.",
    ):
        frozenconst.load(path / "program.jaxexport")


@pytest.mark.parametrize(
    "stores",
    [("named", "named"), (None, "named"), ("named", None), ("nested", "nested", None), ("itself", "itself")],
)
def test_a_store_inside_the_program_directory_survives_every_save(tmp_path, stores):
    # The default store named explicitly (`path / "constants"`), or another inside `path`: each
    # save, first or over an earlier one, leaves a program that loads, and nothing beside it.
    data, exported = _matvec()
    path = tmp_path / "prog"
    where = {None: None, "named": path / "constants", "nested": path / "blobs" / "store", "itself": path}
    for store in stores:
        assert exported.save(path, constants=where[store]) == path
        _loads_as_the_argument_form(path, data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prog"]  # nothing aside left
    assert not list(path.rglob(".*"))


def test_a_save_keeps_the_files_it_did_not_write(tmp_path):
    # Saving over a program replaces its manifest and program file, and deletes nothing else.
    data, exported = _matvec()
    path = exported.save(tmp_path / "prog")
    (path / "README.txt").write_text("mine")
    _, other = _matvec(9)
    other.save(path)
    exported.save(path)  # back: the first constant's file is still in the store, and kept
    assert (path / "README.txt").read_text() == "mine"
    assert len(list((path / "constants").glob("*.npy"))) == 2
    _loads_as_the_argument_form(path, data)


@pytest.mark.parametrize("step", [PROGRAM, MANIFEST])
def test_a_failed_save_leaves_nothing_half_written(saved, monkeypatch, step):
    path, exported = saved
    before = {p.relative_to(path.parent): p.read_bytes() for p in path.parent.rglob("*") if p.is_file()}
    _, other = _matvec(10)  # another program, whose save fails at its last steps
    real = os.replace

    def refuse(src, dst):  # the program, or its manifest, refused at its rename into place
        if pathlib.Path(dst) == path / step:
            raise OSError(30, "Read-only file system")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(
        frozenconst.FrozenConstRuntimeError, match=r"Read-only file system\. Nothing was left"
    ):
        other.save(path)
    after = {p.relative_to(path.parent): p.read_bytes() for p in path.parent.rglob("*") if p.is_file()}
    # The program saved before, whole; nothing aside left; the other constant's file, whole, kept.
    assert {k: v for k, v in after.items() if k in before} == before
    (new,) = set(after) - set(before)
    assert new.parent == pathlib.Path("prog/constants") and new.suffix == ".npy"
    monkeypatch.undo()
    np.testing.assert_array_equal(frozenconst.load(path)(jnp.ones(64)), exported(jnp.ones(64)))


def test_a_directory_of_other_files_is_not_saved_into(tmp_path, saved):
    _, exported = saved
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "manifest.json").write_text('{"name": "a web app"}')
    with pytest.raises(
        frozenconst.FrozenConstValueError, match=r"will not save into .* such as 'notes\.txt'"
    ):
        exported.save(tmp_path / "mine")
    with pytest.raises(
        frozenconst.FrozenConstValueError, match=r"not replace .*manifest\.json: frozenconst did"
    ):
        exported.save(tmp_path / "theirs")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    assert [p.name for p in (tmp_path / "theirs").iterdir()] == ["manifest.json"]


def test_a_wrong_call_names_the_users_own_argument(saved):
    # The program takes the constants first; the user's function does not.
    path, exported = saved
    two = frozenconst.export(lambda x, y: exported(x) + y, SPEC64, SPEC64)
    for program in (exported, frozenconst.load(path)):
        with pytest.raises(
            frozenconst.FrozenConstValueError, match=r"^Shape mismatch for args\[0\]\.shape\[0\]"
        ):
            program(jnp.ones(65))
        with pytest.raises(
            frozenconst.FrozenConstValueError, match=r"^Dtype mismatch for args\[0\]: expected float32"
        ):
            program(jnp.ones(64, jnp.int32))
        with pytest.raises(
            frozenconst.FrozenConstValueError,
            match=r"args is a tuple of length 2 in the invocation and a tuple of length 1 when exported",
        ):
            program(jnp.ones(64), jnp.ones(64))
    with pytest.raises(frozenconst.FrozenConstValueError, match=r"^Shape mismatch for args\[1\]\.shape\[0\]"):
        two(jnp.ones(64), jnp.ones(3))


def test_bad_options():
    with pytest.raises(frozenconst.FrozenConstTypeError, match="embed_max_bytes"):
        frozenconst.export(lambda x: x, SPEC, embed_max_bytes=-1)


# -- round trips in fresh processes ---------------------------------------------------------------

_EXPORTER = """
import sys, pathlib, numpy as np, jax, jax.numpy as jnp
import frozenconst
from frozenconst import FrozenConst

out = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(7)
TABLE = FrozenConst(rng.standard_normal((96, 96)).astype(np.float32))
SMALL = FrozenConst(np.float32([1.0, 2.0, 3.0]))  # under embed_max_bytes: in the program
inner = jax.jit(lambda v: v @ TABLE)
inner(jnp.ones((2, 96)))

@jax.custom_jvp
def soft(v):
    return jnp.tanh(v @ TABLE)

@soft.defjvp
def _soft_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    return soft(v), (1 - soft(v) ** 2) * (dv @ TABLE)

def f(x):  # x: (batch, 96)
    y = jax.lax.scan(lambda c, _: (soft(c), None), x, None, length=2)[0]
    return jnp.sum(inner(y) + jax.checkpoint(lambda v: v @ TABLE)(y)) + SMALL.sum()

batch = jax.export.symbolic_shape("b")[0]
spec = jax.ShapeDtypeStruct((batch, 96), jnp.float32)
exported = frozenconst.export(f, spec)
exported.save(out / "prog", vjp_order=1)
# JAX's own floor: the same function through jax.export, round-tripped.
plain = jax.export.deserialize(jax.export.export(jax.jit(f))(spec).serialize(vjp_order=1))
results = {}
for n in (3, 5):
    x = jnp.linspace(-1.0, 1.0, n * 96, dtype=jnp.float32).reshape(n, 96)
    results[f"x{n}"] = np.asarray(x)
    results[f"value{n}"] = np.asarray(plain.call(x))
    results[f"grad{n}"] = np.asarray(jax.grad(plain.call)(x))
    results[f"direct{n}"] = np.asarray(jax.jit(f)(x))
np.savez(out / "expected.npz", **results)
# The saved file, with its derivative's program; JAX's own primal program.
saved = (out / "prog" / "program.jaxexport").stat().st_size
print("SIZES", saved, len(plain.mlir_module_serialized), TABLE.nbytes)
"""

_LOADER = """
import sys, pathlib, numpy as np, jax, jax.numpy as jnp
import frozenconst

out = pathlib.Path(sys.argv[1])
assert "__main__" not in str(frozenconst.load)  # the exporter's code is not here
loaded = frozenconst.load(out / "prog")
expected = np.load(out / "expected.npz")
for n in (3, 5):
    x = jnp.asarray(expected[f"x{n}"])
    value, grad = np.asarray(loaded(x)), np.asarray(jax.grad(loaded)(x))
    assert value.tobytes() == expected[f"value{n}"].tobytes(), (n, value, expected[f"value{n}"])
    assert grad.tobytes() == expected[f"grad{n}"].tobytes(), n
    np.testing.assert_allclose(value, expected[f"direct{n}"], rtol=1e-5)
(table,) = loaded.constants
assert not np.asarray(table).flags.writeable and table.shape == (96, 96)
user = jax.jit(lambda x: loaded(x) * 2)
assert len(user.lower(jax.ShapeDtypeStruct((3, 96), jnp.float32)).as_text()) < table.nbytes // 4
print("LOADED", len(loaded.constants))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("pipeline", ["default", "simplified"])
def test_a_round_trip_in_fresh_processes_is_bitwise_jax_exports_own(tmp_path, pipeline):
    env = dict(subprocess_env())
    env["JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS"] = "1" if pipeline == "simplified" else "0"
    code, out = run_bounded([sys.executable, "-c", textwrap.dedent(_EXPORTER), str(tmp_path)], env=env)
    assert code == 0, out[-4000:]
    ours, theirs, table = (int(v) for v in out.split("SIZES")[1].split()[:3])
    assert ours < 16384 < table < theirs, (ours, theirs, table)
    # Another process, without the exporter's code, from a copy of the directory elsewhere.
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (tmp_path / "prog").rename(moved / "prog")
    (tmp_path / "expected.npz").rename(moved / "expected.npz")
    code, out = run_bounded([sys.executable, "-c", textwrap.dedent(_LOADER), str(moved)], env=env, cwd=moved)
    assert code == 0 and "LOADED 1" in out, out[-4000:]


_SHARDED = """
import sys, pathlib, numpy as np, jax
jax.config.update("jax_num_cpu_devices", 4)
import jax.numpy as jnp
import frozenconst
from frozenconst import FrozenConst
from jax.sharding import NamedSharding, PartitionSpec as P

out = pathlib.Path(sys.argv[1])
mesh = jax.make_mesh((4,), ("x",))
sharding = NamedSharding(mesh, P("x"))
if sys.argv[2] == "export":
    table = FrozenConst(np.arange(128 * 64, dtype=np.float32).reshape(128, 64) / 100, sharding=sharding)
    exported = frozenconst.export(lambda x: jnp.tanh(table) @ x, jax.ShapeDtypeStruct((64,), jnp.float32))
    exported.save(out / "prog")
    np.save(out / "expected.npy", np.asarray(exported(jnp.ones(64))))
else:
    loaded = frozenconst.load(out / "prog")
    (table,) = loaded.constants
    assert table.declared_sharding == sharding, table.declared_sharding
    assert jnp.asarray(table).sharding == sharding
    got = np.asarray(loaded(jnp.ones(64)))
    assert got.tobytes() == np.load(out / "expected.npy").tobytes()
    print("SHARDED OK")
"""


@pytest.mark.subprocess
def test_a_sharded_constant_loads_onto_its_sharding(tmp_path):
    env = subprocess_env("cpu")
    for step in ("export", "load"):
        code, out = run_bounded(
            [sys.executable, "-c", textwrap.dedent(_SHARDED), str(tmp_path), step], env=env
        )
        assert code == 0, out[-4000:]
    assert "SHARDED OK" in out


@pytest.mark.subprocess
def test_on_two_processes_each_loads_only_its_slices(tmp_path):
    worker = str(pathlib.Path(__file__).resolve().parent / "export_worker.py")
    code, out = run_bounded([sys.executable, worker, str(tmp_path), "export"], env=subprocess_env("cpu"))
    assert code == 0 and "EXPORTED" in out, out[-4000:]
    port = free_port()
    codes, outs = run_processes(
        [[sys.executable, worker, str(tmp_path), "load", str(p), str(port)] for p in (0, 1)]
    )
    assert codes == [0, 0], [o[-3000:] for o in outs]
    for pid, text in enumerate(outs):
        (host,) = [line.split() for line in text.splitlines() if line.startswith("HOST")]
        assert host == ["HOST", str(pid), str(128 * 64 * 4 // 2), str(128 * 64 * 4)], host  # half each
        assert f"RESULT {pid} True" in text, text[-3000:]


@pytest.mark.subprocess
def test_processes_saving_one_program_at_once_each_succeed_and_leave_one_whole_program(tmp_path):
    # Every host of a multi-host job running one script saves the same program to one path.
    import export_worker

    count, rounds = 3, 6
    worker = str(pathlib.Path(__file__).resolve().parent / "export_worker.py")
    codes, outs = run_processes(
        [
            [sys.executable, worker, str(tmp_path), "save", str(i), str(count), str(rounds)]
            for i in range(count)
        ]
    )
    assert codes == [0] * count, [o[-3000:] for o in outs]
    x = jnp.linspace(-1.0, 1.0, 128)
    want = jax.jit(lambda t, v: jnp.tanh(t @ v))(jnp.asarray(export_worker.table()), x)
    for r in range(rounds):
        path = tmp_path / f"round-{r}"
        np.testing.assert_array_equal(frozenconst.load(path)(x), want)
        inside = export_worker.store_of(tmp_path, r) != tmp_path / "shared"
        names = (
            ["constants", "manifest.json", "program.jaxexport"]
            if inside
            else ["manifest.json", "program.jaxexport"]
        )
        assert sorted(p.name for p in path.iterdir()) == names, r  # nothing aside, nothing half-written
        assert [p.suffix for p in path.rglob("*") if p.is_file()].count(".npy") == inside
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".ready-")) == [
        *(f"round-{r}" for r in range(rounds)),
        "shared",
    ]
    assert [p.suffix for p in (tmp_path / "shared").iterdir()] == [".npy"]


_WITHOUT_FLATBUFFERS = """
import sys
sys.modules["flatbuffers"] = None  # not installed: `import flatbuffers` raises ImportError
import pathlib, jax, jax.numpy as jnp, numpy as np, frozenconst
table = frozenconst.FrozenConst(np.ones((64, 64), np.float32))
exported = frozenconst.export(lambda x: table @ x, jax.ShapeDtypeStruct((64,), jnp.float32))
try:
    exported.save(pathlib.Path(sys.argv[1]) / "prog")
except frozenconst.FrozenConstRuntimeError as err:
    print("REFUSED", err)
"""


@pytest.mark.subprocess
def test_without_flatbuffers_save_says_what_to_install(tmp_path):
    code, out = run_bounded([sys.executable, "-c", textwrap.dedent(_WITHOUT_FLATBUFFERS), str(tmp_path)])
    assert code == 0, out[-3000:]
    assert "REFUSED frozenconst cannot save the program: JAX's serialization" in out, out[-3000:]
    assert "(`pip install flatbuffers`)" in out and not (tmp_path / "prog").exists()


@pytest.mark.subprocess
def test_loading_and_the_first_call_make_no_second_host_copy(tmp_path):
    # A 256 MiB table loaded in a fresh process (after a first small program, which costs what
    # any process's first compile does), on the CPU backend, where device buffers are host memory.
    requires_peak_rss()
    worker = str(pathlib.Path(__file__).resolve().parent / "export_worker.py")
    code, out = run_bounded(
        [sys.executable, worker, str(tmp_path), "memory", "256"], env=subprocess_env("cpu")
    )
    assert code == 0, out[-3000:]
    (line,) = [line.split() for line in out.splitlines() if line.startswith("MEMORY")]
    anon, peak, anon_after, nbytes = (int(v) for v in line[1:])
    assert nbytes == 256 << 20
    assert anon < nbytes // 50, line  # the file's pages, mapped: no anonymous copy
    assert peak <= 1.1 * nbytes, line  # load and first call: the table once
    assert anon_after < nbytes // 10, line  # the device buffer is the same memory


def _mapping_of(address):
    """The line of /proc/self/maps whose range holds `address` (Linux)."""
    for line in pathlib.Path("/proc/self/maps").read_text().splitlines():
        low, high = (int(v, 16) for v in line.split()[0].split("-"))
        if low <= address < high:
            return line
    raise AssertionError(hex(address))


def _saved_alone(path, data):
    """`data`'s matvec saved to `path`, nothing of it left alive here (a load then maps it)."""

    def save():  # its constant and program die with the call
        table = FrozenConst(data)
        frozenconst.export(lambda x: table @ x, jax.ShapeDtypeStruct((data.shape[1],), jnp.float32)).save(
            path
        )

    save()
    gc.collect()
    return path


def test_a_loaded_constant_is_a_read_only_map_of_its_file(tmp_path):
    if not pathlib.Path("/proc/self/maps").exists():
        pytest.skip("reads the process's mappings from Linux's /proc/self/maps")
    data = _table((64, 64), 19)
    loaded = frozenconst.load(_saved_alone(tmp_path / "prog", data))
    (constant,) = loaded.constants
    host = np.asarray(constant)
    address = host.__array_interface__["data"][0]
    fields = _mapping_of(address).split()
    (blob,) = (tmp_path / "prog" / "constants").glob("*.npy")
    assert fields[1].startswith("r-") and fields[-1] == str(blob.resolve())  # no one writes it
    assert not host.flags.writeable
    with pytest.raises(ValueError, match="WRITEABLE"):
        host.flags.writeable = True
    if on_cpu():  # the device buffer is the same memory (jax #37830)
        assert jnp.asarray(constant).unsafe_buffer_pointer() == address
    _loads_as_the_argument_form(tmp_path / "prog", data)


def test_where_the_lowering_cannot_be_rewired_export_refuses(monkeypatch):
    # `_compat_lowering.rewire_hoisted`'s fallback (a JAX whose lowered module frozenconst cannot rewire):
    # a clear error, never a program that embeds the constants silently. No installed JAX takes
    # that path, so the rewiring is replaced.
    monkeypatch.setattr(frozenconst._hoist, "rewire_hoisted", lambda lowering, inputs: False)
    table = FrozenConst(_table((64, 64), 6))
    with pytest.raises(frozenconst.FrozenConstRuntimeError, match="cannot keep FrozenConsts out"):
        frozenconst.export(lambda x: table @ x, jax.ShapeDtypeStruct((64,), jnp.float32))


def test_saving_into_a_path_under_a_file_is_a_clear_error(tmp_path, saved):
    _, exported = saved
    (tmp_path / "a-file").write_text("")
    with pytest.raises(frozenconst.FrozenConstRuntimeError, match="cannot save the program to"):
        exported.save(tmp_path / "a-file" / "prog")
