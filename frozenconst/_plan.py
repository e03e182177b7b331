"""Whether a compiled program keeps a FrozenConst buffer out: one decision, with no lowering in it.

`_hoist` asks it of each constant's buffer a program uses, `frozenconst.audit` of each buffer it
reports, and `frozenconst.export` of each array it stores beside the program, so the three
agree by construction; what JAX then does with the decision is `_hoist`'s.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Decision(enum.Enum):
    """What a program makes of a constant's buffer."""

    KEEP_OUT = "keep out"  # a parameter of the program, the buffer passed at each call
    PLACE = "place"  # a parameter, the buffer placed over the program's devices first
    EMBED = "embed"  # its data in the program, as JAX embeds any array


class Buffer(NamedTuple):
    """What a lowering found of one constant's buffer (or of another array it closes over)."""

    nbytes: int
    scalar: bool
    # Deleted once behind frozenconst's back (`Store._lost`): the next donation deletes it again.
    volatile: bool = False
    # Placed by a declared sharding (`jax.device_put` semantics), not following the default device.
    committed: bool = False


class Lowering(NamedTuple):
    """What the lowering is."""

    simplified: bool  # JAX's simplified constant pipeline
    threshold: int  # `embed_max_bytes`: at most this many bytes stay embedded (default pipeline)
    jax_max_bytes: int  # `jax_embedded_constants_max_bytes` (-1 where this JAX has none)
    exporting: bool = False  # `frozenconst.export`'s: each constant kept out is an input of `g`
    foreign: bool = False  # lowering parameters of someone's own (`jax.export`)
    mesh: bool = False  # a program over several devices


def plan(buffer: Buffer, lowering: Lowering) -> Decision:
    """What `lowering` makes of `buffer`.

    Examples:
        >>> from frozenconst._plan import Buffer, Lowering, plan
        >>> default = Lowering(simplified=False, threshold=4096, jax_max_bytes=32)
        >>> plan(Buffer(8192, scalar=False), default).value, plan(Buffer(64, scalar=False), default).value
        ('keep out', 'embed')
        >>> plan(Buffer(64, scalar=False), default._replace(simplified=True)).value
        'keep out'
        >>> plan(Buffer(8192, scalar=False), default._replace(mesh=True)).value
        'place'
    """
    if lowering.foreign or buffer.scalar:
        # A serialized program carries its constants; JAX writes a scalar into the program as a
        # literal, under either pipeline.
        return Decision.EMBED
    if lowering.exporting:
        # The exported program holds no buffer: each one above the threshold is an input.
        return Decision.KEEP_OUT if buffer.nbytes > lowering.threshold else Decision.EMBED
    if buffer.volatile:
        return Decision.EMBED  # no program may hold a buffer the next donation deletes
    # Under the simplified pipeline, JAX passes every closed-over array it does not embed itself:
    # any non-scalar (jax 0.8, 0.9: `core.jaxpr_const_args`), of more than its limit from 0.10
    # (`core.is_hoistable`).
    limit = lowering.jax_max_bytes if lowering.simplified else lowering.threshold
    if buffer.nbytes <= limit:
        return Decision.EMBED
    # One that follows the default device, in a program over several devices, is given as its
    # buffer replicated over them, not the default buffer JAX would copy to them at every call.
    return Decision.PLACE if lowering.mesh and not buffer.committed else Decision.KEEP_OUT
