"""Compiled programs exported without their constants, the constants stored once, by content.

`export(fun, *specs)` exports `g(constants, *args) = fun(*args)` with `jax.export`, each FrozenConst
buffer taken from `g`'s first input at every level of nesting (`_hoist.export_inputs`). `save`
writes the program, a manifest and each constant as `<fingerprint>.npy` into a store; `load` maps
each file read-only as a constant (digest checked, interned) and passes them as the parameters.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ._cache import Store, Use
from ._compat import X64
from ._compat_lowering import exported_call_message, numpy_of
from ._errors import FrozenConstRuntimeError, FrozenConstTypeError, FrozenConstValueError, FrozenConstWarning
from ._fingerprint import fingerprint
from ._frozen import FrozenConst, _sharding_state  # pyright: ignore[reportPrivateUsage]
from ._hoist import EMBED_MAX_BYTES, buffer_found, export_inputs, lowering_here, store_of
from ._host import ALIGNMENT, human_bytes
from ._host_memory import host_memory_choice
from ._intern import intern
from ._jaxprs import walk, where
from ._partial import spans_processes
from ._plan import Decision, plan

# The manifest's format: a loader reads formats up to its own, and refuses newer ones.
FORMAT = 1
MANIFEST = "manifest.json"
PROGRAM = "program.jaxexport"
_KIND = "frozenconst.export"

PathLike = str | os.PathLike[str]
_Inputs = tuple[tuple[FrozenConst, np.dtype[Any]], ...]
# Untyped in JAX's stubs: bound once, typed.
_STRUCT: Callable[..., Any] = jax.ShapeDtypeStruct
_SPEC: Callable[..., Any] = jax.sharding.PartitionSpec


class Exported:
    """A program exported by [`frozenconst.export`][frozenconst.export]: JAX's exported
    program, which takes the constants as its first argument, and the constants.

    Call it as the original function (the constants are passed for you), or
    [`save`][frozenconst.Exported.save] it beside its constants.

    Attributes:
        program: the `jax.export.Exported` of `g(constants, *args)`.
        constants: the FrozenConsts kept out of it, in the order `g` takes them.
        embedded: the other arrays above `embed_max_bytes` the function closes over
            (NumPy arrays, `jax.Array`s), which the program embeds as `jax.export`
            does: `(kind, dtype and shape, bytes, line)`, to wrap in `FrozenConst`.
    """

    def __init__(
        self,
        program: Any,
        constants: tuple[FrozenConst, ...],
        embedded: tuple[tuple[str, str, int, str | None], ...],
        buffers: tuple[jax.Array, ...] = (),
    ) -> None:
        self.program = program
        self.constants = constants
        self.embedded = embedded
        self._inputs = _inputs(program, constants)
        # The constants' buffers the program was traced with, which its derivatives' programs
        # (`vjp_order`) read too: each wired to its constant input when those are exported.
        self._buffers = buffers

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self.program, self._inputs, args, kwargs)

    def __repr__(self) -> str:
        return (
            f"frozenconst.Exported({self.program.fun_name}, {len(self.constants)} constant(s), "
            f"{human_bytes(sum(c.nbytes for c in self.constants))} kept out)"
        )

    def save(self, path: PathLike, *, constants: PathLike | None = None, vjp_order: int = 0) -> pathlib.Path:
        """Write the program into the directory `path`, each constant once into a store.

        The directory holds `manifest.json` (the format, the JAX and frozenconst
        versions, the program's calling convention version, platforms and digest, and
        each constant's fingerprint, dtype, shape and sharding) and JAX's serialized
        program; the store holds each constant as `<sha256>.npy`, which
        NumPy reads alone (`np.load`). Each file is written aside and renamed into
        place, the manifest last, so a reader finds the new program whole or the one
        saved there before; a constant already in the store is not written again. A
        save deletes nothing: the store (inside `path` or not) and other files there
        are kept.

        Arguments:
            path: the program's directory; a program saved there before is replaced.
            constants: the store's directory (default: `path/constants`); programs
                saved into one store share each constant's file.
            vjp_order: as `jax.export.Exported.serialize`: how many orders of
                derivatives the saved program carries.

        Returns:
            `path`, as a `pathlib.Path`.

        Raises:
            FrozenConstRuntimeError: the directory or store cannot be written (a
                read-only file system, no permission); nothing is left half-written.
            NotAddressableError: a constant spans several processes, and this one
                does not hold all of it.
        """
        directory = pathlib.Path(path)
        store = directory / "constants" if constants is None else pathlib.Path(constants)
        program = self._serialized(vjp_order)
        entries = [_entry(c) for c in self.constants]
        try:
            manifest = {
                "kind": _KIND,
                "format": FORMAT,
                "jax": jax.__version__,
                "frozenconst": _version(),
                "function": self.program.fun_name,
                "program": PROGRAM,
                "program_fingerprint": _digest(program),
                # The exported program's calling convention (`jax.export`'s version of it, and the
                # platforms it was lowered for): which JAX versions can call it.
                "calling_convention_version": self.program.calling_convention_version,
                "platforms": list(self.program.platforms),
                "vjp_order": vjp_order,
                **_store_record(directory, store),
                "constants": entries,
                "embedded": [
                    {"kind": k, "array": a, "bytes": n, "line": line} for k, a, n, line in self.embedded
                ],
            }
            made = [d for d in (directory, *directory.parents) if not d.exists()]
            directory.mkdir(parents=True, exist_ok=True)
            try:
                _check_replaceable(directory, store)
                store.mkdir(parents=True, exist_ok=True)
                for constant, entry in zip(self.constants, entries, strict=True):
                    _write_blob(store / entry["file"], constant)
                _commit(directory, program, (json.dumps(manifest, indent=1) + "\n").encode())
            except BaseException:
                for created in made:  # what this save made and left empty, innermost first
                    with contextlib.suppress(OSError):
                        created.rmdir()
                raise
        except OSError as err:
            raise FrozenConstRuntimeError(
                f"frozenconst cannot save the program to {directory} (constants to {store}): "
                f"{err.strerror or err}. Nothing was left half-written there; save to a directory you "
                "can write."
            ) from err
        return directory

    def _serialized(self, vjp_order: int) -> bytes:
        """JAX's serialized program, with its derivatives' programs to `vjp_order`, the constants kept out."""
        if vjp_order and any(_owner(v) is None for v in self._buffers):
            raise FrozenConstRuntimeError(
                "frozenconst cannot save this program's derivatives (`vjp_order`): a constant's device "
                "buffer it was exported with was evicted or deleted since. Export it again, then save."
            )
        try:
            with export_inputs({id(v): i for i, v in enumerate(self._buffers)}):
                return bytes(self.program.serialize(vjp_order=vjp_order))
        except ImportError as err:
            raise _serialization_missing("save", err) from err


class Loaded:
    """A program loaded by [`frozenconst.load`][frozenconst.load]: call it with the original
    function's arguments.

    Attributes:
        program: the deserialized `jax.export.Exported`.
        constants: the constants, read-only FrozenConsts mapped from the store.
        path: the program's directory.
    """

    def __init__(self, program: Any, constants: tuple[FrozenConst, ...], path: pathlib.Path) -> None:
        self.program = program
        self.constants = constants
        self.path = path
        self._inputs = _inputs(program, constants)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self.program, self._inputs, args, kwargs)

    def __repr__(self) -> str:
        count = len(self.constants)
        return f"frozenconst.Loaded({self.program.fun_name}, {count} constant(s), from {self.path})"


def _inputs(program: Any, constants: tuple[FrozenConst, ...]) -> _Inputs:
    """Each constant with the dtype the program takes it in (its first inputs), per its x64 setting."""
    return tuple((c, np.dtype(a.dtype)) for c, a in zip(constants, program.in_avals, strict=False))


def _call(program: Any, inputs: _Inputs, args: Any, kwargs: Any) -> Any:
    # The constants' buffers, as arrays (the program's constant inputs are leaves): passed as
    # arguments, or, inside a trace, closed over and so parameters of that program too.
    fed = tuple(_fed(c, d) for c, d in inputs)
    try:
        return program.call(fed, *args, **kwargs)
    except ValueError as err:  # JAX's checks of the call, which number the constants args[0]
        told = exported_call_message(str(err))
        if told is None:
            raise
        raise FrozenConstValueError(told) from None


def _fed(constant: FrozenConst, dtype: np.dtype[Any]) -> jax.Array:
    """The constant's device buffer in `dtype`, the one the program takes it in, whatever the
    caller's x64 setting (a float64 host constant is a float32 input where x64 was off)."""
    array = constant.__jax_array__()
    if array.dtype == dtype:
        return array
    with jax.enable_x64(not X64.value):  # the other setting: the one the program was exported under
        other = constant.__jax_array__()
    if other.dtype != dtype:
        raise FrozenConstValueError(
            f"The program takes a constant as {dtype}, which JAX makes of its {constant.host_dtype} host "
            f"data under neither x64 setting: the constant is not the one the program was exported with. "
            "Export and save the program again."
        )
    return other


def export(
    fun: Callable[..., Any],
    *args_specs: Any,
    platforms: Sequence[str] | None = None,
    disabled_checks: Sequence[Any] = (),
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    embed_max_bytes: int = EMBED_MAX_BYTES,
    **kwargs_specs: Any,
) -> Exported:
    """Export `fun` as `jax.export` does, its FrozenConsts kept out of the program.

    The exported program takes the constants as parameters: its size does not
    depend on theirs, so a program whose constants exceed `jax.export`'s 2 GiB
    limit exports too. Arrays that are not FrozenConsts are embedded, as
    `jax.export` embeds them, and listed in `Exported.embedded` (with a warning):
    wrap each once in `FrozenConst` to keep it out.

    Arguments:
        fun: the function (a `jax.jit` function too).
        *args_specs: as for `jax.export.export(...)(*args_specs)`:
            `jax.ShapeDtypeStruct`s (with `jax.export.symbolic_shape` dimensions
            and shardings) or arrays, and the values of static arguments.
        platforms: as for `jax.export.export`.
        disabled_checks: as for `jax.export.export`.
        static_argnums: as for `jax.jit`.
        static_argnames: as for `jax.jit`.
        embed_max_bytes: FrozenConsts of at most this many bytes stay in the program
            (as under `frozenconst.jit`); every larger one is kept out.
        **kwargs_specs: the keyword arguments' specs, as `args_specs`.

    Returns:
        An [`Exported`][frozenconst.Exported]: call it, or `save` it.

    Raises:
        FrozenConstTypeError: `embed_max_bytes` is not a non-negative int.
        FrozenConstRuntimeError: this JAX's lowering cannot keep the constants out.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np, frozenconst
        >>> data = np.linspace(0.0, 1.0, 512 * 512, dtype=np.float32).reshape(512, 512)
        >>> table = frozenconst.FrozenConst(data)
        >>> exported = frozenconst.export(lambda x: table @ x, jax.ShapeDtypeStruct((512,), jnp.float32))
        >>> len(exported.program.mlir_module_serialized) < 10_000 < table.nbytes
        True
        >>> bool(jnp.allclose(exported(jnp.ones(512)), table @ jnp.ones(512)))
        True
    """
    limit: Any = embed_max_bytes  # whatever the caller passed
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise FrozenConstTypeError(
            "frozenconst.export's `embed_max_bytes` takes a non-negative int (bytes), but received "
            f"{embed_max_bytes!r}. Pass 0 to keep every FrozenConst out."
        )
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    traced = jax.jit(fun, static_argnums=nums, static_argnames=names).trace(*args_specs, **kwargs_specs)
    constants, embedded = _found(traced.jaxpr, embed_max_bytes)
    values = [c.__jax_array__() for c in constants]
    # A committed buffer's sharding is the program's for that input; an uncommitted one (the
    # default device, following `jax.default_device`) leaves it to the call, as a plain argument.
    specs = tuple(_STRUCT(v.shape, v.dtype, sharding=v.sharding if v.committed else None) for v in values)

    def g(consts: Any, *args: Any, **kwargs: Any) -> Any:
        del consts  # read at lowering: each constant's buffer is taken from its input
        return fun(*args, **kwargs)

    g.__name__ = getattr(fun, "__name__", "fun")
    g.__qualname__ = getattr(fun, "__qualname__", g.__name__)
    jitted = jax.jit(g, static_argnums=tuple(n + 1 for n in nums), static_argnames=names, keep_unused=True)
    with export_inputs({id(v): i for i, v in enumerate(values)}):
        program = jax.export.export(jitted, platforms=platforms, disabled_checks=disabled_checks)(
            specs, *args_specs, **kwargs_specs
        )
    if embedded:
        listed = "; ".join(
            f"{k} {a} ({human_bytes(n)}) used at {line or 'a line JAX did not record'}"
            for k, a, n, line in embedded[:3]
        )
        more = f" and {len(embedded) - 3} more" if len(embedded) > 3 else ""
        warnings.warn(
            f"frozenconst.export embeds {len(embedded)} array(s) that are not FrozenConsts, as jax.export "
            f"does: {listed}{more}. Wrap each once in `frozenconst.FrozenConst` to store it beside the "
            'program (docs: "Export").',
            FrozenConstWarning,
            stacklevel=2,
        )
    return Exported(program, tuple(constants), tuple(embedded), tuple(values))


def _found(
    closed: Any, embed_max_bytes: int
) -> tuple[list[FrozenConst], list[tuple[str, str, int, str | None]]]:
    """The FrozenConsts above `embed_max_bytes` a traced program uses (each once, in order), and
    the other arrays above it."""
    constants: dict[int, FrozenConst] = {}
    embedded: dict[int, tuple[str, str, int, str | None]] = {}
    exporting = lowering_here(embed_max_bytes, exporting=True)
    for value, eqn in walk(closed):
        key = id(value)
        if key in constants or key in embedded:
            continue
        use = _owner(value)
        nbytes = int(np.prod(np.shape(value))) * np.dtype(value.dtype).itemsize
        # What `frozenconst.export`'s lowering decides (`_plan`), of any array above the threshold.
        if plan(buffer_found(value, None if use is None else use[0], nbytes), exporting) is Decision.EMBED:
            continue
        if use is not None and not getattr(use[0], "weak", False):
            constants[key] = FrozenConst._of(*use)  # pyright: ignore[reportPrivateUsage] - the constant whose buffer this is
        elif use is None:
            kind = "jax.Array" if isinstance(value, jax.Array) else "NumPy array"
            array = numpy_of(value)
            shown = f"{np.dtype(value.dtype)}{list(np.shape(array if array is not None else value))}"
            embedded[key] = (kind, shown, nbytes, where(eqn))
    return list(constants.values()), list(embedded.values())


def _owner(value: Any) -> Use | None:
    """The constant whose cached buffer `value` is (its store and declared sharding), or None."""
    store = store_of(value)
    return store.sharding_of(value) if isinstance(store, Store) else None


def _entry(constant: FrozenConst) -> dict[str, Any]:
    """The manifest's record of a constant: what its file must hold, and where it goes."""
    digest = constant.fingerprint
    return {
        "fingerprint": digest,
        "file": digest.removeprefix("sha256:") + ".npy",
        "dtype": np.dtype(constant.host_dtype).str,
        "shape": list(constant.shape),
        "sharding": _sharding_record(constant.declared_sharding),
    }


def _sharding_record(sharding: jax.sharding.Sharding | None) -> dict[str, Any] | None:
    """The manifest's record of a declared sharding: the mesh's shape, axis names and types and the
    spec, made over the loading process's devices (`jax.make_mesh`); None for one device."""
    state = None if sharding is None else _sharding_state(sharding)
    if state is None or state[0] == "single":
        return None  # a program on one device runs on whichever the call gives it
    if state[0] != "named":
        raise FrozenConstValueError(
            f"frozenconst.export saves constants placed on one device or by a NamedSharding over a "
            f"Mesh; this one is placed by {state[1]}. Place it with a NamedSharding (`x.placed(...)`)."
        )
    _, _, shape, _, names, types, spec, memory_kind = state
    # Tuples, which the manifest's JSON writes as lists.
    return {"mesh": shape, "axes": names, "types": types, "spec": spec, "memory_kind": memory_kind}


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def _sharding_from(record: dict[str, Any]) -> jax.sharding.Sharding:
    """The sharding a manifest describes, over this process's devices."""
    types = tuple(jax.sharding.AxisType[name] for name in record["types"])
    mesh = jax.make_mesh(tuple(record["mesh"]), tuple(record["axes"]), axis_types=types)
    spec = _SPEC(*_tupled(record["spec"]))
    return jax.sharding.NamedSharding(mesh, spec, memory_kind=record.get("memory_kind"))


def _write_blob(path: pathlib.Path, constant: FrozenConst) -> None:
    """Write the constant's host data whole to `path` (aside, then renamed), unless it is there."""
    if path.exists():
        return  # stored by content: the same name is the same data (checked at load)
    aside = _aside(path)
    try:
        with open(aside, "wb") as f:
            np.lib.format.write_array(f, np.asarray(constant), allow_pickle=False)
        os.chmod(aside, 0o444)  # read-only: written once, never in place (a loaded constant maps it)
        os.replace(aside, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)


def _aside(path: pathlib.Path) -> pathlib.Path:
    """A name beside `path` that only this write uses (several processes may save at once)."""
    return path.with_name(f".{path.name}.writing-{uuid.uuid4().hex[:12]}")


def _lexical(path: PathLike) -> str:
    """`path` absolute, its `..` taken away by name: a store reached through a symbolic link is
    found through it again, wherever it points then."""
    return os.path.normpath(os.path.abspath(path))


def _store_record(directory: pathlib.Path, store: pathlib.Path) -> dict[str, str]:
    """Where the manifest says the store is: relative to the program's directory (the two moved
    together), and for a store outside it, also absolute (the program moved alone)."""
    try:
        relative = os.path.relpath(_lexical(store), _lexical(directory))
    except ValueError:  # another drive (Windows): no relative path
        return {"constants_dir": _lexical(store)}
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return {"constants_dir": relative, "constants_path": _lexical(store)}
    return {"constants_dir": relative}


def _check_replaceable(directory: pathlib.Path, store: pathlib.Path) -> None:
    """Refuse a directory that holds someone else's files: a save replaces only its own."""
    names = set(os.listdir(directory))
    if MANIFEST in names:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if json.loads((directory / MANIFEST).read_text()).get("kind") == _KIND:
                return
        raise FrozenConstValueError(
            f"frozenconst will not replace {directory / MANIFEST}: frozenconst did not write it (or it "
            "is damaged). Save to a new or empty directory, or remove that file."
        )
    # What a save writes there (an interrupted or concurrent one too): its program, the store
    # (the default one, or where `constants=` puts it inside), and its files being written.
    inside = {"constants", PROGRAM}
    blobs = False  # the store is the directory itself: its constants' files are there too
    with contextlib.suppress(ValueError):
        parts = pathlib.Path(_lexical(store)).relative_to(_lexical(directory)).parts
        inside.update(parts[:1])
        blobs = not parts
    others = sorted(
        n
        for n in names
        if n not in inside
        and not (n.startswith(".") and ".writing-" in n)
        and not (blobs and n.endswith(".npy"))
    )
    if others:
        raise FrozenConstValueError(
            f"frozenconst will not save into {directory}: it holds files but no saved program "
            f"({MANIFEST}), such as {others[0]!r}. Save to a new or empty directory."
        )


def _commit(directory: pathlib.Path, program: bytes, manifest: bytes) -> None:
    """Put the program, then its manifest, in place (each written aside and renamed); where the
    manifest cannot be, the program saved there before is put back."""
    target = directory / PROGRAM
    files = {PROGRAM: _aside(target), MANIFEST: _aside(directory / MANIFEST)}
    kept = _aside(target)
    previous: pathlib.Path | None = kept
    try:
        files[PROGRAM].write_bytes(program)
        files[MANIFEST].write_bytes(manifest)
        try:
            os.link(target, kept)  # the program saved before, kept until the manifest is in place
        except OSError:
            previous = None
        os.replace(files[PROGRAM], target)
        try:
            os.replace(files[MANIFEST], directory / MANIFEST)
        except BaseException:
            if previous is not None:
                os.replace(previous, target)
            elif not (directory / MANIFEST).exists():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
            raise
    finally:
        for aside in (*files.values(), kept):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(aside)


def _serialization_missing(step: str, err: ImportError) -> FrozenConstRuntimeError:
    """JAX's serialization could not be imported: `flatbuffers` (declared by frozenconst) is missing."""
    return FrozenConstRuntimeError(
        f"frozenconst cannot {step} the program: JAX's serialization of exported programs needs the "
        f"`flatbuffers` package, which cannot be imported here ({err}). Install it (`pip install "
        "flatbuffers`); frozenconst declares it, so installing frozenconst with pip brings it too."
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("frozenconst")
    except PackageNotFoundError:  # pragma: no cover - a source tree
        return "0.0.0"


# -- loading ----------------------------------------------------------------------------------


def load(path: PathLike) -> Loaded:
    """Load a program [`Exported.save`][frozenconst.Exported.save] wrote: a callable of the
    original function's arguments, with its constants.

    Each constant's host buffer is its file in the store, mapped read-only (no
    copy; on the CPU backend its device buffer is the same memory), its digest
    checked against the manifest's first, so a changed or damaged file is an
    error, never a wrong result. Constants are interned: programs loaded in one
    process that share a table share its host buffer and device buffer, and an
    equal constant already live is that one. A constant saved with a sharding is placed so; one
    spanning several processes is read by each only in the slices it addresses. The
    code that exported the program is not needed.

    Arguments:
        path: the directory `save` wrote (or its `manifest.json`).

    Returns:
        A [`Loaded`][frozenconst.Loaded] program.

    Raises:
        FrozenConstValueError: no saved program there, a manifest of a newer format, the
            program's or a constant's file missing, damaged, or not holding what the
            manifest says.
        FrozenConstRuntimeError: this JAX cannot call or read the program (saved with
            another JAX), or cannot place a constant as it was saved (other devices).

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np, frozenconst, tempfile
        >>> table = frozenconst.FrozenConst(np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
        >>> exported = frozenconst.export(lambda x: table @ x, jax.ShapeDtypeStruct((64,), jnp.float32))
        >>> directory = exported.save(tempfile.mkdtemp() + "/table_matvec")
        >>> loaded = frozenconst.load(directory)
        >>> bool((loaded(jnp.ones(64)) == exported(jnp.ones(64))).all())
        True
    """
    where = pathlib.Path(path)
    if where.is_file():
        if where.name != MANIFEST:
            raise FrozenConstValueError(
                f"{where} is a file: give `frozenconst.load` the directory `Exported.save` wrote"
                + (f", {where.parent}." if (where.parent / MANIFEST).is_file() else ".")
            )
        where = where.parent  # the program's manifest: its directory meant
    manifest = _manifest(where)
    stores = [pathlib.Path(_lexical(os.path.join(where, str(manifest["constants_dir"]))))]
    if isinstance(manifest.get("constants_path"), str):
        stores.append(pathlib.Path(manifest["constants_path"]))  # where it was, for a program moved alone
    program = _program(where, manifest)
    constants = tuple(_constant(stores, entry, where) for entry in manifest["constants"])
    return Loaded(program, constants, where)


def _manifest(where: pathlib.Path) -> dict[str, Any]:
    file = where / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise FrozenConstValueError(
            f"{where} holds no saved program ({MANIFEST} is missing): give `frozenconst.load` a "
            "directory that `Exported.save` wrote."
        ) from None
    except (OSError, ValueError) as err:
        raise FrozenConstValueError(
            f"{file} cannot be read as a frozenconst manifest ({err}); save the program again."
        ) from err
    if not isinstance(manifest, dict) or manifest.get("kind") != _KIND:
        raise FrozenConstValueError(
            f"{file} is not a frozenconst manifest; give `frozenconst.load` a directory that "
            "`Exported.save` wrote."
        )
    found = manifest.get("format")
    if not isinstance(found, int) or found > FORMAT:
        raise FrozenConstValueError(
            f"{file} is in format {found!r}, written by frozenconst {manifest.get('frozenconst')}; this "
            f"frozenconst ({_version()}) reads formats up to {FORMAT}: upgrade frozenconst to load it."
        )
    return manifest


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _program(where: pathlib.Path, manifest: dict[str, Any]) -> Any:
    file = where / str(manifest["program"])
    try:
        data = file.read_bytes()
    except OSError as err:
        raise FrozenConstValueError(
            f"{file} cannot be read ({err.strerror or err}): the program of {where} is missing; "
            "save it again."
        ) from err
    saved_with = manifest.get("jax")
    recorded = manifest.get("program_fingerprint")  # None: a manifest that records none
    if recorded is not None and _digest(data) != recorded:
        raise FrozenConstValueError(
            f"{file} does not hold the program its manifest was saved with ({recorded}): it was changed "
            "or damaged since, or a save of another program to this directory did not finish. Save "
            "the program again."
        )
    version = manifest.get("calling_convention_version")
    low = jax.export.minimum_supported_calling_convention_version
    high = jax.export.maximum_supported_calling_convention_version
    if isinstance(version, int) and not low <= version <= high:
        raise FrozenConstRuntimeError(
            f"The program in {where} was exported with jax {saved_with} in its calling convention "
            f"version {version}, which jax {jax.__version__} does not call (it calls versions {low} to "
            f"{high}). Load it with a JAX that does (jax {saved_with}), or export and save it again "
            "with this one."
        )
    try:
        return jax.export.deserialize(bytearray(data))
    except ImportError as err:
        raise _serialization_missing("load", err) from err
    except Exception as err:  # whatever JAX raises for a program it cannot read
        why = f"{type(err).__name__}: {str(err)[:200]}"
        if recorded is None and saved_with == jax.__version__:
            advice = "The file was changed or damaged since it was saved: save the program again."
        elif saved_with == jax.__version__:
            advice = (
                "The file is whole (its digest is the manifest's) and this JAX version saved it: JAX's "
                "error is the cause."
            )
        else:
            advice = f"Load it with jax {saved_with}, or export and save it again with this one."
        raise FrozenConstRuntimeError(
            f"jax {jax.__version__} cannot read the program in {file}, saved with jax {saved_with} "
            f"({why}). {advice}"
        ) from err


def _constant(stores: list[pathlib.Path], entry: dict[str, Any], where: pathlib.Path) -> FrozenConst:
    files = [store / str(entry["file"]) for store in stores]
    digest = str(entry["fingerprint"])
    file = next((f for f in files if f.exists()), None)
    if file is None:
        also = f" (nor at {files[1]}, where it was saved)" if len(files) > 1 and files[1] != files[0] else ""
        raise FrozenConstValueError(
            f"{files[0]} is missing{also}: the constant {digest} of the program in {where}. Copy the store "
            f"it was saved with ({stores[0]}) beside it, or save the program again."
        )
    try:
        data = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise FrozenConstValueError(
            f"{file} is damaged ({err}): it cannot hold the constant {digest}; save the program again."
        ) from err
    want = (np.dtype(entry["dtype"]), tuple(entry["shape"]))
    if (data.dtype, data.shape) != want:
        raise FrozenConstValueError(
            f"{file} holds {data.dtype}{list(data.shape)}, where the manifest of {where} says "
            f"{want[0]}{list(want[1])}: the file was replaced or damaged; save the program again."
        )
    sharding = None
    if entry.get("sharding") is not None:
        try:
            sharding = _sharding_from(entry["sharding"])
        except Exception as err:  # any failure to rebuild: JAX raises several kinds
            raise FrozenConstRuntimeError(
                f"the constant {digest} of {where} was saved placed on a mesh of {entry['sharding']['mesh']} "
                f"devices, which this process cannot make ({err}): load it where there are that many."
            ) from err
    if sharding is not None and spans_processes(sharding):
        # Each process reads only its slices; the digest is of the whole file, read in place.
        if fingerprint(data) != digest:
            raise _tampered(file, digest)
        return FrozenConst(data, data.dtype, sharding=sharding)
    host = _in_place(data)
    if host is None:  # a file the map cannot serve in place: frozen once, as a copy
        constant = intern(data, data.dtype)  # the digest hashed from the frozen copy
        if constant.fingerprint != digest:
            raise _tampered(file, digest)
    else:
        if fingerprint(host) != digest:  # the very bytes the constant holds
            raise _tampered(file, digest)
        store = Store(host, host_memory_choice(None), digest=digest)
        constant = intern(FrozenConst._of(store))  # pyright: ignore[reportPrivateUsage] - a constant over the map
    return constant if sharding is None else constant.placed(sharding)


def _in_place(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    """`data`, the read-only map of a constant's file (no one can write through it), as its host
    buffer without a copy, where it is C-ordered, native and 64-byte aligned as `save` writes it
    (JAX's CPU backend then aliases it, jax #37830); else None, and the caller copies it."""
    if not isinstance(data, np.memmap) or data.mode != "r" or not data.size:
        return None
    host = np.asarray(data)  # a plain array; its owner, the read-only map
    address = host.__array_interface__["data"][0]
    if host.flags.writeable or not host.flags.c_contiguous or not host.dtype.isnative or address % ALIGNMENT:
        return None
    return host


def _tampered(file: pathlib.Path, digest: str) -> FrozenConstValueError:
    return FrozenConstValueError(
        f"{file} does not hold the constant it was saved as ({digest}): it was changed or damaged since. "
        "Save the program again; frozenconst never runs a program with other constants than its own."
    )
