"""Placement targets: a device, a sharding, or a PartitionSpec under the active mesh."""

from __future__ import annotations

from typing import Any, TypeAlias

import jax
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from ._compat import Device, active_mesh, single_device_sharding
from ._errors import FrozenConstTypeError, FrozenConstValueError

Target: TypeAlias = Device | Sharding | PartitionSpec
"""What `FrozenConst.on` accepts: a `jax.Device`, any `jax.sharding.Sharding`, or a
`PartitionSpec` under a mesh set with `jax.set_mesh`."""


def as_sharding(target: Any, shape: tuple[int, ...]) -> Sharding:
    """Turn a placement target into a sharding valid for an array of `shape`, or raise."""
    if isinstance(target, jax.Device):
        return single_device_sharding(target)
    if isinstance(target, PartitionSpec):
        mesh = active_mesh()
        if mesh is None:
            raise FrozenConstValueError(
                f"A bare PartitionSpec ({target}) needs an active mesh. Use it inside "
                "`with jax.set_mesh(mesh):`, or pass `NamedSharding(mesh, spec)`."
            )
        target = NamedSharding(mesh, target)
    if not isinstance(target, Sharding):
        raise FrozenConstTypeError(
            f"A placement target must be a `jax.Device`, a `jax.sharding.Sharding` or a "
            f"`PartitionSpec`, but received a `{type(target).__name__}`."
        )
    if isinstance(target, NamedSharding) and len(target.spec) > len(shape):
        # Checked here, as JAX checks it before placing an array (NamedSharding's
        # `check_compatible_aval`): `shard_shape` alone fails with a bare AssertionError from
        # jax 0.12.1 (an IndexError before), which says nothing about the mismatch.
        raise FrozenConstValueError(
            f"The sharding {target} does not fit a constant of shape {shape}: its PartitionSpec "
            f"names {len(target.spec)} dimensions, but the constant has {len(shape)}."
        )
    try:
        target.shard_shape(shape)
    except (ValueError, TypeError, IndexError) as err:
        raise FrozenConstValueError(
            f"The sharding {target} does not fit a constant of shape {shape}: {err}"
        ) from err
    return target
