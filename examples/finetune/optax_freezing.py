"""optax's `freezing_parameters` notebook ("Freezing Parameters in Optax").

Source: google-deepmind/optax, examples/freezing_parameters.ipynb. Two parameters,
`param0` trained and `param1` frozen, the loss `|param0[0]| + |param1[0]|`, and a
`jax.jit` step (`jax.value_and_grad`, `optimizer.update(grads, s, p)`,
`optax.apply_updates`), with the notebook's four ways to freeze `param1`:

- `freeze`: `optax.chain(optax.adam(0.1), optax.transforms.freeze(mask))`;
- `selective_transform`: `optax.transforms.selective_transform(optax.adam(0.1), freeze_mask=mask)`;
- `masked`: `optax.chain(optax.adam(0.1), optax.masked(optax.set_to_zero(), mask))`;
- `partition`: `optax.partition({"train": optax.adam(0.1), "freeze": optax.set_to_zero()}, label_map)`.

The notebook's parameters hold one element each (`size=1`); `size` makes them
longer, for the tests and the benchmark (the loss still reads element 0). Its dynamic
freeze-then-unfreeze sections are left out: a FrozenConst is never unfrozen.

The one line (`freeze=True`), after the parameters are made:

    params["param1"] = frozenconst.FrozenConst(params["param1"])
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax import transforms

import frozenconst

from . import Run

METHODS = ("freeze", "selective_transform", "masked", "partition")


def loss_fn(p: Any) -> jax.Array:
    return jnp.abs(p["param0"][0]) + jnp.abs(p["param1"][0])


def make_optimizer(method: str) -> optax.GradientTransformation:
    """The notebook's optimizer for each method, built as it builds it."""
    mask = {"param0": False, "param1": True}
    if method == "freeze":
        return optax.chain(optax.adam(0.1), transforms.freeze(mask))
    if method == "selective_transform":
        return transforms.selective_transform(optax.adam(0.1), freeze_mask=mask)
    if method == "masked":
        return optax.chain(optax.adam(0.1), optax.masked(optax.set_to_zero(), mask))
    if method == "partition":
        label_map = {"param0": "train", "param1": "freeze"}
        return optax.partition({"train": optax.adam(0.1), "freeze": optax.set_to_zero()}, label_map)
    raise ValueError(f"method: one of {METHODS}, not {method!r}")


def build(freeze: bool = False, method: str = "freeze", size: int = 1) -> Run:
    """One of the notebook's methods, up to its loop; `freeze=True` adds the one line."""
    # The notebook's `jnp.array([10.0])` where size is 1; longer, 10.0 at element 0 (the one the
    # loss reads) and distinct values after it.
    params = {
        "param0": 10.0 + jnp.arange(size, dtype=jnp.float32),  # will be trained
        "param1": 10.0 + jnp.arange(size, dtype=jnp.float32),  # will be frozen
    }
    if freeze:
        # the one line:
        params["param1"] = frozenconst.FrozenConst(params["param1"])

    optimizer = make_optimizer(method)
    opt_state = optimizer.init(params)

    # Define a single training step
    @jax.jit
    def train_step(p: Any, s: Any) -> tuple[Any, Any, jax.Array]:
        # Compute loss and gradients
        loss, grads = jax.value_and_grad(loss_fn)(p)
        # Update parameters using optimizer
        updates, s = optimizer.update(grads, s, p)
        new_p = optax.apply_updates(p, updates)
        return new_p, s, loss

    held: dict[str, Any] = {"params": params, "opt_state": opt_state}

    def step() -> jax.Array:
        held["params"], held["opt_state"], loss = train_step(held["params"], held["opt_state"])
        return loss

    def checkpoint(directory: pathlib.Path) -> tuple[Any, Any]:
        # The notebook saves nothing; orbax's StandardCheckpointer, the JAX stack's
        # checkpointer, on the parameters and the optimizer state.
        import orbax.checkpoint as ocp

        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(directory / "state", held)
            checkpointer.wait_until_finished()
            restored = checkpointer.restore(directory / "state", held)
        return restored["params"]["param1"], restored["params"]["param0"]

    return Run(
        step=step,
        frozen=lambda: held["params"]["param1"],
        trainable=lambda: held["params"]["param0"],
        lowered=lambda: train_step.lower(held["params"], held["opt_state"]),
        checkpoint=checkpoint,
        state=held,
    )
