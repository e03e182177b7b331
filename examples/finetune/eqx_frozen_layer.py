"""equinox's `frozen_layer` example ("Freezing parameters"), at a small size.

Source: patrick-kidger/equinox, docs/examples/frozen_layer.ipynb. An `eqx.nn.MLP`;
a `filter_spec` with `False` on every leaf but the last layer's weight and bias;
a step under `eqx.filter_jit` that differentiates the `eqx.partition`ed model,
applies `optax.sgd` and returns the whole model. The notebook's functions and
step, as written; `main`'s sizes made small, and its loop split into `build` and
`Run.step`. The first layer plays the pretrained part (the notebook shows it
unchanged by training).

The one line (`freeze=True`), where the notebook sets up its model (Step 1):

    model = eqx.tree_at(lambda m: m.layers[0], model, jax.tree.map(frozenconst.FrozenConst, model.layers[0]))

`build(..., jit=frozenconst.filter_jit)` runs the same step under
`frozenconst.filter_jit` instead, and `build(..., constant=T)` puts `T` where the
line puts `FrozenConst` (`python -m benchmarks finetune` passes the least pytree
array type, its floor): comparisons, not the example as written.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jrandom
import jax.tree_util as jtu
import optax

import frozenconst

from . import Run


# Toy data
def get_data(dataset_size: int, *, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    x = jrandom.normal(key, (dataset_size, 1))
    y = 5 * x - 2
    return x, y


# Toy dataloader
def dataloader(
    arrays: tuple[jax.Array, ...], batch_size: int, *, key: jax.Array
) -> Iterator[tuple[jax.Array, ...]]:
    dataset_size = arrays[0].shape[0]
    assert all(array.shape[0] == dataset_size for array in arrays)
    indices = jnp.arange(dataset_size)
    while True:
        perm = jrandom.permutation(key, indices)
        (key,) = jrandom.split(key, 1)
        start = 0
        end = batch_size
        while end < dataset_size:
            batch_perm = perm[start:end]
            yield tuple(array[batch_perm] for array in arrays)
            start = end
            end = start + batch_size


def build(
    freeze: bool = False,
    dataset_size: int = 512,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    width_size: int = 8,
    depth: int = 1,
    seed: int = 5678,
    jit: Callable[..., Any] = eqx.filter_jit,
    constant: Callable[[Any], Any] | None = None,
) -> Run:
    """The notebook's `main` up to its loop; `freeze=True` adds the one line."""
    data_key, loader_key, model_key = jrandom.split(jrandom.PRNGKey(seed), 3)
    data = get_data(dataset_size, key=data_key)
    data_iter = dataloader(data, batch_size, key=loader_key)
    # The batches the loop will take, drawn before any step: the same for both runs.
    batches = [next(data_iter) for _ in range(8)]

    # Step 1
    model = eqx.nn.MLP(in_size=1, out_size=1, width_size=width_size, depth=depth, key=model_key)
    if freeze and constant is not None:
        # A comparison: another type where the one line below puts FrozenConst.
        model = eqx.tree_at(lambda m: m.layers[0], model, jax.tree.map(constant, model.layers[0]))
    elif freeze:
        # the one line:
        model = eqx.tree_at(
            lambda m: m.layers[0], model, jax.tree.map(frozenconst.FrozenConst, model.layers[0])
        )

    # Step 2
    filter_spec = jtu.tree_map(lambda _: False, model)
    filter_spec = eqx.tree_at(
        lambda tree: (tree.layers[-1].weight, tree.layers[-1].bias),
        filter_spec,
        replace=(True, True),
    )

    # Step 3
    @jit
    def make_step(model: Any, x: jax.Array, y: jax.Array, opt_state: Any) -> tuple[Any, Any]:
        @eqx.filter_grad
        def loss(diff_model: Any, static_model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
            model = eqx.combine(diff_model, static_model)
            pred_y = jax.vmap(model)(x)
            return jnp.mean((y - pred_y) ** 2)

        diff_model, static_model = eqx.partition(model, filter_spec)
        grads = loss(diff_model, static_model, x, y)
        updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return model, opt_state

    optim = optax.sgd(learning_rate)
    opt_state = optim.init(model)
    held: dict[str, Any] = {"model": model, "opt_state": opt_state, "step": 0}

    @eqx.filter_jit
    def mse(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((y - jax.vmap(model)(x)) ** 2)

    def step() -> None:
        x, y = batches[held["step"] % len(batches)]
        held["step"] += 1
        held["model"], held["opt_state"] = make_step(held["model"], x, y, held["opt_state"])

    def checkpoint(directory: pathlib.Path) -> tuple[Any, Any]:
        # equinox's own format, as equinox's docs serialise a model.
        path = directory / "model.eqx"
        eqx.tree_serialise_leaves(path, held["model"])
        restored = eqx.tree_deserialise_leaves(path, held["model"])
        return restored.layers[:-1], restored.layers[-1]

    def lowered() -> Any:
        x, y = batches[0]
        return make_step.lower(held["model"], x, y, held["opt_state"])

    return Run(
        step=step,
        frozen=lambda: held["model"].layers[:-1],
        trainable=lambda: held["model"].layers[-1],
        lowered=lowered if hasattr(make_step, "lower") else None,
        checkpoint=checkpoint,
        state=held,
        # The notebook prints no loss: the loss on the first batch, to compare.
        loss=lambda: mse(held["model"], *batches[0]),
    )
