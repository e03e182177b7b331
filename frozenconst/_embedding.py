"""A warning when JAX is about to embed a FrozenConst in a program frozenconst does not compile.

Under JAX's default constant pipeline a `jax.jit` function (and `eqx.filter_jit`,
`nnx.jit`, `pmap`, `jax.export`, which compile through it) copies the data of every
array it closes over into the compiled program: a FrozenConst closed over there is
embedded like any array, which is the trap frozenconst exists to avoid. Nothing
fails, so nothing else would tell. This module looks at each program JAX lowers
(`_lowering`) and, where one of the constants JAX is about to copy into it is a
FrozenConst's device buffer above `EMBED_MAX_BYTES`, warns once per program and
constant, naming the constant, the line that used it and the drop-in fix for the jit
in use. It says nothing where JAX does not embed: an argument, a buffer the simplified
pipeline passes to the executable, a transformation run eagerly, a constant at or
below the threshold, a program that `frozenconst.jit` or `filter_jit` compiles.
The decision is made on what the lowering is given, so it holds on every JAX version
and pipeline alike; lowering happens once per program, never on a cache hit.
"""

from __future__ import annotations

import threading
import types
import warnings
import weakref
from typing import Any

from . import _lowering
from ._cache import OWNERS, Store
from ._compat import frame_at, user_stacklevel
from ._errors import FrozenConstWarning
from ._host import human_bytes
from ._jaxprs import walk, where

# A FrozenConst of at most this many bytes is embedded where JAX embeds it, by
# `frozenconst.jit` too: each executable parameter adds to the cost of every call
# (`python -m benchmarks compare`, row "frozenconst.jit per call: ratio to jax.jit"),
# so a function holding hundreds of small tables would pay more per call than their
# bytes are worth. `frozenconst.jit`'s `embed_max_bytes` defaults to it, this module
# warns above it, and `frozenconst.audit` gives no advice below it.
EMBED_MAX_BYTES = 1024

# The programs already warned of, per constant: once per program and constant.
_warned: weakref.WeakKeyDictionary[Store, set[str]] = weakref.WeakKeyDictionary()
_warned_lock = threading.Lock()

# Where frozenconst compiles the program itself (`frozenconst.jit`, `filter_jit`, their
# stages): it keeps constants above the threshold out, and says so itself where JAX
# refuses that (`_hoisting._warn_refused`).
_OWN_WRAPPERS = frozenset({"frozenconst._jit", "frozenconst._filter_jit", "frozenconst._stages"})

# The drop-in fix for each way in, by the frames on the stack while JAX lowers.
_FIXES = {
    "jax.jit": "Compile with `frozenconst.jit` in place of `jax.jit`: it passes the constant to "
    "the program as a parameter instead",
    "eqx.filter_jit": "Compile with `frozenconst.filter_jit` in place of `eqx.filter_jit`: it "
    "passes the constant to the program as a parameter instead",
    "nnx.jit": "Pass the module holding it to the `nnx.jit` function as an argument instead of "
    "closing over it, or freeze it with `frozenconst.nnx.freeze`",
    "jax.pmap": "Pass it to the function as an argument (`in_axes=None` replicates it)",
    "jax.export": "An exported program carries its constants: pass it as an argument to keep it out",
}


def _observe(program: Any, embeds_literals: bool) -> None:
    """Warn where `program`, about to be lowered, has a FrozenConst's buffer above the
    threshold among the constants JAX copies into it."""
    if not OWNERS or program is None:
        return
    # Each embedded FrozenConst buffer, with the first line of user code that uses it (a
    # use inside JAX's own functions, `pmap`'s wrapper for one, names none).
    found: dict[int, tuple[Store, Any, str | None]] = {}
    try:
        for value, eqn in walk(program, literals=embeds_literals):
            key = id(value)
            entry = found.get(key)
            if entry is None:
                store = OWNERS.get(key)
                # `sharding_of` confirms the very object (an id can be reused after an array dies).
                if store is None or _nbytes(value) <= EMBED_MAX_BYTES or not store.sharding_of(value):
                    continue
                found[key] = (store, value, where(eqn))
            elif entry[2] is None:
                found[key] = (entry[0], entry[1], where(eqn))
    except Exception:  # a program this walk does not understand: no warning, never a failed compile
        return
    if not found:
        return
    jit = _jit_in_use()
    if jit is None:
        return
    name = _program_name(program)
    with _warned_lock:
        # Once per program and constant: a program is its traced function and the line of
        # the first use (every `eqx.filter_jit` program is traced from one equinox function).
        new = [e for e in found.values() if f"{name}|{e[2]}" not in _warned.setdefault(e[0], set())]
        for store, _, used in new:
            _warned[store].add(f"{name}|{used}")
    if new:
        warnings.warn(_message(jit, new), FrozenConstWarning, stacklevel=user_stacklevel())


def _nbytes(value: Any) -> int:
    nbytes: int = getattr(value, "nbytes", 0)
    return nbytes


def _jit_in_use() -> str | None:
    """Which jit is compiling, from the frames on the stack; None for frozenconst's own."""
    found = "jax.jit"
    frame: types.FrameType | None = frame_at(2)
    while frame is not None:
        module: str = frame.f_globals.get("__name__", "")
        if module in _OWN_WRAPPERS:
            return None
        if module.startswith("equinox"):
            found = "eqx.filter_jit"
        elif module.startswith("flax.nnx"):
            found = "nnx.jit"
        elif module.startswith("jax._src.export"):
            found = "jax.export"
        elif module == "jax._src.pmap" or frame.f_code.co_name == "parallel_callable":
            found = "jax.pmap"  # jax >= 0.7 runs `pmap` through `jax.jit`; 0.6.2 lowers it itself
        frame = frame.f_back
    return found


def _program_name(program: Any) -> str:
    """The traced function, as JAX records it: `name at file:line`, else its name."""
    jaxpr = getattr(program, "jaxpr", program)
    info = getattr(jaxpr, "debug_info", None)
    found = getattr(info, "func_src_info", None) or getattr(info, "func_name", None)
    return str(found or "a traced function")


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[len(text) - limit + 3 :]


def _message(jit: str, found: list[tuple[Store, Any, str | None]]) -> str:
    _, value, used = found[0]
    more = ""
    if len(found) > 1:
        total = sum(_nbytes(v) for _, v, _ in found)
        more = f" and {len(found) - 1} more FrozenConst(s), {human_bytes(total)} in all,"
    return (
        f"{jit} embeds FrozenConst {value.dtype}{list(value.shape)} ({human_bytes(_nbytes(value))})"
        f"{more} in the compiled program, used at {_tail(used or 'a line JAX did not record', 160)}: "
        f"JAX copies the data of an array a traced function closes over into the program. "
        f'{_FIXES[jit]} (docs: "Which jit").'
    )


_lowering.add(_observe)
