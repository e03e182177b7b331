"""`frozenconst.audit`: which constants a function captures, what they cost, and what to change."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from typing import Any, Literal

import jax
import numpy as np

from ._cache import LIVE
from ._compat import SIMPLIFIED_CONSTANTS
from ._errors import FrozenConstValueError
from ._fingerprint import fingerprint
from ._host import human_bytes
from ._jaxprs import walk, where
from ._jit import EMBED_MAX_BYTES

Kind = Literal["numpy", "jax", "frozenconst"]

# Constants up to `EMBED_MAX_BYTES` are not worth a line of advice: cheaper
# embedded than passed (JAX itself embeds anything up to
# `jax_embedded_constants_max_bytes`, 32 bytes, as a literal), and what
# `frozenconst.jit` embeds too.
# Above this, embedding a constant into the program hurts compile time and memory.
_EMBED_WARN_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class CapturedConstant:
    """One constant captured by a traced function.

    Attributes:
        kind: `"numpy"` (a raw NumPy array), `"jax"` (a `jax.Array`), or
            `"frozenconst"` (a FrozenConst's cached buffer).
        shape: the shape.
        dtype: the dtype's name.
        nbytes: bytes of data (of a constant spread over several processes: the
            bytes of the slices this process holds).
        uses: how many times the traced program references it.
        first_use: where it is first used (`file:line:column (function)`), if JAX recorded it.
        fingerprint: a digest of dtype, shape and bytes (`sha256-local:...` for a
            constant spread over several processes: of this process's slices only,
            which differs between processes).
    """

    kind: Kind
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    uses: int
    first_use: str | None
    fingerprint: str

    @property
    def device_copies(self) -> int:
        """Device copies JAX makes of it: one per use for NumPy data under the simplified
        pipeline (the documented future default); none for a buffer that already exists."""
        return self.uses if self.kind == "numpy" else 0

    def problems(self, pipeline: str) -> list[str]:
        """What is wrong with this constant, each with its fix."""
        found: list[str] = []
        if self.nbytes <= EMBED_MAX_BYTES:
            return found
        if self.kind == "numpy":
            found.append(
                f"raw NumPy constant: {self.uses} use(s) become {self.uses} device copies under "
                "JAX's simplified constant pipeline, and it is transferred again per executable; "
                "fix: wrap it once in `frozenconst.FrozenConst`"
            )
        if pipeline == "default" and self.nbytes >= _EMBED_WARN_BYTES:
            found.append(
                "embedded in the compiled program by jax.jit (default pipeline); fix: "
                + (
                    "compile with `frozenconst.jit`"
                    if self.kind == "frozenconst"
                    else "make it a FrozenConst and compile with `frozenconst.jit`"
                )
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
            content: extra device copies of one NumPy constant (one per use),
            and distinct constants with equal contents.
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
        out: list[str] = []
        for c in self.constants:
            for problem in c.problems(self.pipeline):
                out.append(
                    f"{c.kind} {c.dtype}{list(c.shape)} ({human_bytes(c.nbytes)}) at {c.first_use}: {problem}"
                )
        for group in _duplicate_groups(self.constants):
            if len(group) > 1:
                c = group[0]
                out.append(
                    f"same data held by {len(group)} constants ({c.dtype}{list(c.shape)}, "
                    f"{human_bytes(c.nbytes)} each); fix: `frozenconst.intern` them into one"
                )
        return out

    def __str__(self) -> str:
        header = f"{'kind':<12} {'shape':<18} {'dtype':<9} {'size':>10} {'uses':>5} {'copies*':>7}  first use"
        rows = [header, "-" * len(header)]
        for c in self.constants:
            rows.append(
                f"{c.kind:<12} {list(c.shape)!s:<18} {c.dtype:<9} {human_bytes(c.nbytes):>10} {c.uses:>5} "
                f"{c.device_copies:>7}  {c.first_use or '?'}"
            )
        if not self.constants:
            rows.append("(no captured constants)")
        rows.append(
            f"{len(self.constants)} constant(s), {human_bytes(self.total_bytes)} in total, "
            f"{human_bytes(self.duplicate_bytes)} duplicated; JAX constant pipeline: {self.pipeline}"
        )
        rows.append(
            "* copies: device copies JAX makes under its simplified constant pipeline (future default)"
        )
        problems = self.lines()
        rows += ["", "Problems:" if problems else "No problems found."] + [f"- {p}" for p in problems]
        return "\n".join(rows)


def _duplicate_groups(constants: tuple[CapturedConstant, ...]) -> list[list[CapturedConstant]]:
    groups: dict[str, list[CapturedConstant]] = {}
    for c in constants:
        groups.setdefault(c.fingerprint, []).append(c)
    return list(groups.values())


def _pipeline() -> str:
    return "simplified" if SIMPLIFIED_CONSTANTS else "default"


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

    Example:
        >>> import numpy as np, jax, jax.numpy as jnp, frozenconst
        >>> table = np.ones((256, 256), np.float32)
        >>> report = frozenconst.audit(lambda w: sum(table @ w for _ in range(4)), jnp.ones(256))
        >>> tuple((c.kind, c.uses) for c in report.constants)
        (('numpy', 4),)
        >>> report.duplicate_bytes == 3 * table.nbytes
        True
    """
    from ._jit import JitWrapped

    try:
        if isinstance(fun, JitWrapped):
            closed = fun.trace(*args, **kwargs).jaxpr
        else:
            closed = jax.make_jaxpr(fun)(*args, **kwargs)
    except ValueError as err:
        refused = _refused_as_array(err)
        if refused is None:
            raise
        raise refused from err
    frozen_ids = {id(a) for store in list(LIVE) for a in store.arrays()}

    found: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    for value, eqn in walk(closed):
        key = id(value)
        entry = found.get(key)
        if entry is None:
            kind: Kind = "numpy"
            if isinstance(value, jax.Array):
                kind = "frozenconst" if key in frozen_ids else "jax"
            entry = found[key] = {"kind": kind, **_describe(value), "uses": 0, "first_use": where(eqn)}
            order.append(key)
        entry["uses"] += 1

    constants = [CapturedConstant(**found[k]) for k in order]
    constants.sort(key=lambda c: -c.nbytes)
    total = sum(c.nbytes for c in constants)
    duplicate = 0
    for group in _duplicate_groups(tuple(constants)):
        copies = sum(max(c.device_copies, 1) for c in group)
        duplicate += (copies - 1) * group[0].nbytes
    return AuditReport(tuple(constants), _pipeline(), total, duplicate)


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


# JAX's own words when `core.typeof` meets an object with `__jax_array__` that
# is not one of its array types (jax >= 0.7; 0.6 calls it with a
# DeprecationWarning): an index (`a[idx]`, `a.at[idx]`) or a `jax.lax` operand.
_JAX_REFUSAL = "__jax_array__() during abstractification"
_HERE = os.path.dirname(__file__) + os.sep
_JAX = os.path.dirname(jax.__file__) + os.sep


def _refused_as_array(err: ValueError) -> FrozenConstValueError | None:
    """The fix at the place of use, when JAX refused a FrozenConst where it wants a jax.Array."""
    if _JAX_REFUSAL not in str(err):
        return None
    place = "an unknown place"
    tb = err.__traceback__
    while tb is not None:  # JAX has already removed its own frames from it
        code = tb.tb_frame.f_code
        if not code.co_filename.startswith((_HERE, _JAX)):
            place = f"{code.co_filename}:{tb.tb_lineno} ({code.co_name})"
        tb = tb.tb_next
    return FrozenConstValueError(
        f"JAX refused a value with `__jax_array__`, a FrozenConst for instance, where it takes only "
        f"a jax.Array, at {place}: as an index (`a[idx]`, `a.at[idx]`) or a `jax.lax` operand. JAX "
        "asks for the type of such a value before any public hook can answer. Convert it there "
        "with `jnp.asarray(...)`, which returns a FrozenConst's cached device buffer and copies "
        "nothing: `a[jnp.asarray(idx)]`, `lax.dynamic_slice(jnp.asarray(table), ...)`. "
        "See docs/jax.md, Index tables."
    )
