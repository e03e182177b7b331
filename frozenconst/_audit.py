"""`frozenconst.audit`: which constants a function captures, what they cost, and what to change."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

import jax
import numpy as np

from ._compat_lowering import SIMPLIFIED_CONSTANTS, SIMPLIFIED_LITERAL_PER_USE, numpy_of
from ._fingerprint import fingerprint
from ._hoist import EMBED_MAX_BYTES, buffer_found, lowering_here, store_of
from ._host import human_bytes
from ._jaxprs import walk, where
from ._plan import Decision, plan
from ._refusals import refused_as_array

Kind = Literal["numpy", "jax", "frozenconst"]


@dataclasses.dataclass(frozen=True)
class CapturedConstant:
    """One constant captured by a traced function.

    Attributes:
        kind: `"numpy"` (a raw NumPy array), `"jax"` (a `jax.Array`), or
            `"frozenconst"` (a FrozenConst's cached buffer, or the buffer of a copy of
            one that a step handed back, kept out as the constant is).
        shape: the shape.
        dtype: the dtype's name.
        nbytes: bytes of data (of a constant spread over several processes: the
            bytes of the slices this process holds).
        uses: how many times the traced program references it.
        first_use: where it is first used (`file:line:column (function)`), if JAX recorded it.
        fingerprint: a digest of dtype, shape and bytes (`sha256-local:...` for a
            constant spread over several processes: of this process's slices only,
            which differs between processes).
        sliced_bytes: where every use is a static slice (`x[:, :q]` with Python
            ints), the bytes of the largest slice the program reads; else None.
            NumPy slices a NumPy constant at trace time, so only the slice is
            captured; JAX slices a `jax.Array` or a FrozenConst in the program.
        parameter: whether every jit that compiles the function takes it as a
            parameter of the program, never embedding it: a FrozenConst above 4 KiB
            (whatever jit is outside the audited function: its own, the caller's,
            a library's), unless its buffer is donated somewhere (then embedded).
        copies: of NumPy data, the device copies JAX's simplified pipeline makes of
            it, as this JAX makes them: one per use up to jax 0.12.0, one per
            program from 0.12.1 (None: one per use).
    """

    kind: Kind
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    uses: int
    first_use: str | None
    fingerprint: str
    sliced_bytes: int | None = None
    parameter: bool = False
    copies: int | None = None

    @property
    def device_copies(self) -> int:
        """Device copies JAX makes of it under the simplified pipeline (JAX's default from jax
        0.12.1): of NumPy data `copies`; none for a buffer that already exists."""
        if self.kind != "numpy":
            return 0
        return self.uses if self.copies is None else self.copies

    def in_program(self, pipeline: str) -> str:
        """What any jit that compiles the function makes of it under `pipeline`: `"parameter"`
        (passed to the executable, no data in the program), `"embedded"` (its data in the
        program), or `"copied"` (a NumPy array hoisted by JAX: a device copy per use)."""
        if self.kind == "frozenconst":
            return "parameter" if self.parameter else "embedded"
        if pipeline == "simplified":
            return "copied" if self.kind == "numpy" else "parameter"
        return "embedded"

    def problems(self, pipeline: str) -> list[str]:
        """What is wrong with this constant, each with its fix."""
        found: list[str] = []
        if self.nbytes <= EMBED_MAX_BYTES:
            # Not worth a line of advice: cheaper embedded than passed, as every jit embeds a
            # FrozenConst that small (`_hoist`).
            return found
        if self.kind == "numpy":
            found.append(
                f"raw NumPy constant: {self.uses} use(s) become {self.device_copies} device "
                f"cop{'y' if self.device_copies == 1 else 'ies'} under JAX's simplified constant "
                "pipeline, and it is transferred again per executable; "
                "fix: wrap it once in `frozenconst.FrozenConst`"
            )
        if self.kind == "frozenconst":
            if not self.parameter:
                found.append(
                    "embedded in every compiled program that uses it: its device buffer was "
                    "donated to a jitted function, so no program may hold it; fix: keep constants "
                    "out of donated arguments (`frozenconst.partition(state)`)"
                )
        elif pipeline == "default" and self.sliced_bytes is not None and self.sliced_bytes < self.nbytes:
            found.append(
                f"embedded whole in the compiled program by jax.jit (default pipeline), though it reads "
                f"only a static slice of {human_bytes(self.sliced_bytes)}: JAX slices it in the program, "
                "where NumPy slices a NumPy array at trace time; fix: make it a FrozenConst (every jit "
                "then takes it as a parameter, nothing embedded)"
            )
        elif pipeline == "default":
            found.append(
                "embedded in the compiled program by jax.jit (default pipeline); fix: make it a "
                "FrozenConst, which every jit takes as a parameter"
            )
        return found

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict."""
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape)
        out["device_copies"] = self.device_copies
        return out


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """What [`audit`][frozenconst.audit] found.

    Attributes:
        constants: every captured constant, largest first.
        pipeline: JAX's constant pipeline while tracing, `"default"` or `"simplified"`.
        total_bytes: bytes of all captured constants, each counted once.
        duplicate_bytes: bytes spent on the same data held more than once, by
            content, under `pipeline`: distinct constants with equal contents, and
            under the simplified pipeline the extra device copies of a NumPy
            constant (one per use; the default pipeline embeds it instead).
    """

    constants: tuple[CapturedConstant, ...]
    pipeline: str
    total_bytes: int
    duplicate_bytes: int

    @property
    def numpy_constants(self) -> tuple[CapturedConstant, ...]:
        """The raw NumPy constants."""
        return tuple(c for c in self.constants if c.kind == "numpy")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict with the same structure."""
        return {
            "pipeline": self.pipeline,
            "total_bytes": self.total_bytes,
            "duplicate_bytes": self.duplicate_bytes,
            "constants": [c.to_dict() for c in self.constants],
        }

    def lines(self) -> list[str]:
        """One line per problem: `kind shape dtype (size) at place: problem; fix`."""
        out = [
            f"{c.kind} {c.dtype}{list(c.shape)} ({human_bytes(c.nbytes)}) at {c.first_use}: {problem}"
            for c in self.constants
            for problem in c.problems(self.pipeline)
        ]
        for group in _duplicate_groups(self.constants):
            if len(group) > 1:
                c = group[0]
                out.append(
                    f"same data held by {len(group)} constants ({c.dtype}{list(c.shape)}, "
                    f"{human_bytes(c.nbytes)} each); fix: `frozenconst.intern` them into one"
                )
        return out

    def __str__(self) -> str:
        header = (
            f"{'kind':<12} {'shape':<18} {'dtype':<9} {'size':>10} {'uses':>5} {'copies*':>7} "
            f"{'program**':<10} first use"
        )
        rows = [header, "-" * len(header)]
        for c in self.constants:
            rows.append(
                f"{c.kind:<12} {list(c.shape)!s:<18} {c.dtype:<9} {human_bytes(c.nbytes):>10} {c.uses:>5} "
                f"{c.device_copies:>7} {c.in_program(self.pipeline):<10} {c.first_use or '?'}"
            )
        if not self.constants:
            rows.append("(no captured constants)")
        duplicated = f"{human_bytes(self.duplicate_bytes)} duplicated"
        simplified = _duplicate_bytes(self.constants, "simplified")
        if simplified != self.duplicate_bytes:  # NumPy constants, embedded here, copied per use there
            duplicated += f" ({human_bytes(simplified)} under JAX's simplified constant pipeline)"
        rows += [
            f"{len(self.constants)} constant(s), {human_bytes(self.total_bytes)} in total, "
            f"{duplicated}; JAX constant pipeline: {self.pipeline}",
            "* copies: device copies JAX makes under its simplified constant pipeline "
            "(JAX's default from 0.12.1)",
            "** program: what any jit compiling this function makes of it (jax.jit, a library's, "
            "frozenconst.jit alike): a parameter, embedded data, or copied per use",
        ]
        problems = self.lines()
        rows += ["", "Problems:" if problems else "No problems found."] + [f"- {p}" for p in problems]
        return "\n".join(rows)


def _duplicate_groups(constants: tuple[CapturedConstant, ...]) -> list[list[CapturedConstant]]:
    groups: dict[str, list[CapturedConstant]] = {}
    for c in constants:
        groups.setdefault(c.fingerprint, []).append(c)
    return list(groups.values())


def _duplicate_bytes(constants: tuple[CapturedConstant, ...], pipeline: str) -> int:
    """Bytes of the same data held more than once under `pipeline`: a NumPy constant is one
    device copy per use under the simplified pipeline, embedded once under the default one."""
    duplicate = 0
    for group in _duplicate_groups(constants):
        copies = sum(max(c.device_copies, 1) if pipeline == "simplified" else 1 for c in group)
        duplicate += (copies - 1) * group[0].nbytes
    return duplicate


def audit(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> AuditReport:
    """Trace `fun` (without running or compiling it) and report every constant it captures.

    Arguments:
        fun: any function JAX can trace: a plain function, a `jax.jit` or a
            `frozenconst.jit` function.
        *args: its arguments: arrays, or `jax.ShapeDtypeStruct`s.
        **kwargs: its keyword arguments.

    Returns:
        An [`AuditReport`][frozenconst.AuditReport]: `str(report)` is a table that
        names each problem and its fix; `report.to_dict()` serialises it.

    Examples:
        >>> import numpy as np, jax, jax.numpy as jnp, frozenconst
        >>> table = np.ones((256, 256), np.float32)
        >>> report = frozenconst.audit(lambda w: sum(table @ w for _ in range(4)), jnp.ones(256))
        >>> (c,) = report.constants
        >>> c.kind, c.uses, c.device_copies in (4, 1)  # 4: a copy per use up to jax 0.12.0
        ('numpy', 4, True)
        >>> simplified = report.pipeline == "simplified"
        >>> report.duplicate_bytes == ((c.device_copies - 1) * table.nbytes if simplified else 0)
        True
    """
    try:
        closed = jax.make_jaxpr(fun)(*args, **kwargs)
    except (ValueError, TypeError, IndexError) as err:
        refused = refused_as_array(err)
        if refused is None:
            raise
        raise refused from err
    found: dict[object, dict[str, Any]] = {}
    order: list[object] = []
    here = lowering_here()
    # References to a constant of a program (not a literal at the use): JAX's simplified
    # pipeline passes such an array once per program, a literal once per use.
    held = Counter(_identity(value) for value, _ in walk(closed, literals=False))
    for value, eqn in walk(closed):
        key = _identity(value)
        entry = found.get(key)
        if entry is None:
            kind: Kind = "numpy"
            owner = store_of(value) if isinstance(value, jax.Array) else None
            if isinstance(value, jax.Array):
                # A constant's buffer, or a known copy's (kept out as a constant is), or a relic:
                # the buffer of a constant the function made, dead since the trace.
                kind = "frozenconst" if owner is not None else "jax"
            entry = found[key] = {
                "kind": kind,
                **_describe(value),
                "uses": 0,
                "first_use": where(eqn),
                "sliced_bytes": 0,
                # What any jit's lowering of it decides (`_plan`), at the default threshold.
                "parameter": owner is not None
                and plan(buffer_found(value, owner), here) is not Decision.EMBED,
            }
            order.append(key)
        entry["uses"] += 1
        if entry["sliced_bytes"] is not None:
            entry["sliced_bytes"] = _static_slice_bytes(eqn, entry["sliced_bytes"])

    for key in order:
        entry = found[key]
        if entry["kind"] == "numpy":
            if not SIMPLIFIED_CONSTANTS:  # traced under the default pipeline: JAX's rule
                entry["copies"] = entry["uses"] if SIMPLIFIED_LITERAL_PER_USE else 1
            else:  # as the trace shows it
                entry["copies"] = entry["uses"] - held[key] + (key in held)
    constants = [CapturedConstant(**found[k]) for k in order]
    constants.sort(key=lambda c: -c.nbytes)
    total = sum(c.nbytes for c in constants)
    pipeline = "simplified" if SIMPLIFIED_CONSTANTS else "default"
    return AuditReport(tuple(constants), pipeline, total, _duplicate_bytes(tuple(constants), pipeline))


def _identity(value: Any) -> object:
    """What tells one captured array from another: the object, or for NumPy data its buffer (jax
    0.8's simplified pipeline wraps the one NumPy array anew for each use, `TypedNdArray`)."""
    array = None if isinstance(value, jax.Array) else numpy_of(value)
    if array is None:
        return id(value)
    return (array.__array_interface__["data"][0], array.shape, array.dtype.str, array.strides)


def _describe(value: Any) -> dict[str, Any]:
    """Shape, dtype name, bytes this process holds, and fingerprint of a captured constant."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        # Spread over several processes (a constant bigger than one host): only
        # this process's slices can be read here, each distinct index once.
        digest = hashlib.sha256(f"{value.dtype}|{value.shape}|".encode())
        seen: dict[str, np.ndarray[Any, Any]] = {}
        for shard in value.addressable_shards:
            seen.setdefault(str(shard.index), np.asarray(shard.data))
        for index in sorted(seen):
            digest.update(index.encode())
            digest.update(np.ascontiguousarray(seen[index]).reshape(-1).view(np.uint8).data)
        return {
            "shape": tuple(value.shape),
            "dtype": np.dtype(value.dtype).name,
            "nbytes": sum(int(a.nbytes) for a in seen.values()),
            "fingerprint": f"sha256-local:{digest.hexdigest()}",
        }
    host = np.asarray(value)
    return {
        "shape": tuple(host.shape),
        "dtype": host.dtype.name,
        "nbytes": int(host.nbytes),
        "fingerprint": fingerprint(host),
    }


def _static_slice_bytes(eqn: Any, so_far: int) -> int | None:
    """The larger of `so_far` and the bytes a static `slice` equation reads; None for any other use."""
    if eqn.primitive.name != "slice":
        return None
    aval = eqn.outvars[0].aval
    read: int = math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
    return max(so_far, read)
