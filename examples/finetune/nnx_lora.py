"""flax NNX's optimization cookbook, "Low Rank Adaptation", with the performance guide's loop and orbax.

Sources: google/flax, docs_nnx/guides/optimization_cookbook.md ("Low Rank
Adaptation": `nnx.recursive_map` puts an `nnx.LoRA` around each `nnx.Linear` of a
base model, `nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.LoRAParam)`, an
`nnx.jit` step); docs_nnx/guides/performance.md ("Functional training loop":
`nnx.split` once, a `jax.jit` step that merges, trains and returns
`nnx.state(...)`, `nnx.update` after the loop); docs_nnx/guides/checkpointing.md
(`ocp.StandardCheckpointer`, restored into `nnx.eval_shape`'s abstract state and
`nnx.merge`d). The cookbook's model and data, as written (the base model is the
"pretrained" part, random here).

The one line (`freeze=True`), on the base model before the adapters go around it:

    frozenconst.nnx.freeze(base_model)

`nnx.recursive_map` is flax 0.12's: with flax 0.11 `build` raises `NotImplementedError`.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from flax import nnx

import frozenconst.nnx

from . import Run

lecun_normal = jax.nn.initializers.lecun_normal()


def make_model(rngs: nnx.Rngs, init: Any = lecun_normal) -> nnx.Sequential:
    return nnx.Sequential(
        nnx.Linear(2, 8, rngs=rngs, kernel_init=init), nnx.Linear(8, 8, rngs=rngs, kernel_init=init)
    )


def loss_fn(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


def lora_model(rngs: nnx.Rngs, freeze: bool) -> Any:
    """The cookbook's LoRA model: its base model, then `nnx.LoRA` around each `nnx.Linear`."""
    if not hasattr(nnx, "recursive_map"):
        raise NotImplementedError("the cookbook's LoRA recipe uses nnx.recursive_map (flax 0.12 and later)")

    def add_rank2_lora(path: Any, node: Any) -> Any:
        if isinstance(node, nnx.Linear):
            return nnx.LoRA(node.in_features, 2, node.out_features, base_module=node, rngs=rngs)
        return node

    base_model = make_model(rngs)
    if freeze:
        # the one line:
        frozenconst.nnx.freeze(base_model)
    return nnx.recursive_map(add_rank2_lora, base_model)


def build(freeze: bool = False, loop: str = "nnx.jit") -> Run:
    """The cookbook's LoRA recipe up to its loop: `loop="nnx.jit"` as the cookbook writes the
    step, `loop="functional"` as the performance guide's functional training loop writes it."""
    rngs = nnx.Rngs(0)
    x = rngs.normal((32, 2))
    y = rngs.normal((32, 8))

    model = lora_model(rngs, freeze)
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.LoRAParam)

    @nnx.jit
    def train_step(model: Any, optimizer: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    held: dict[str, Any] = {"model": model, "optimizer": optimizer}
    lowered: Any = None
    if loop == "nnx.jit":

        def step() -> jax.Array:
            return train_step(model, optimizer, x, y)

        if hasattr(train_step, "lower"):
            lowered = lambda: train_step.lower(model, optimizer, x, y)
    else:
        # split before training loop
        graphdef, state = nnx.split((model, optimizer))

        @jax.jit  # regular JAX
        def jax_train_step(graphdef: Any, state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
            # merge at the beginning of the function
            model, optimizer = nnx.merge(graphdef, state)
            loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
            optimizer.update(model, grads)
            state = nnx.state((model, optimizer))
            return loss, state

        held["loop_state"] = state

        def step() -> jax.Array:
            loss, held["loop_state"] = jax_train_step(graphdef, held["loop_state"], x, y)
            return loss

        def update() -> None:
            # update objects after training
            nnx.update((model, optimizer), held["loop_state"])

        held["update"] = update
        lowered = lambda: jax_train_step.lower(graphdef, held["loop_state"], x, y)

    def checkpoint(directory: pathlib.Path) -> tuple[Any, Any]:
        if "update" in held:
            held["update"]()
        _, state = nnx.split(model)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(directory / "state", state)
        checkpointer.wait_until_finished()
        # Restore the checkpoint back to its `nnx.State` structure - need an abstract reference.
        abstract_model = nnx.eval_shape(lambda: lora_model(nnx.Rngs(0), freeze))
        graphdef, abstract_state = nnx.split(abstract_model)
        state_restored = checkpointer.restore(directory / "state", abstract_state)
        checkpointer.close()
        restored = nnx.merge(graphdef, state_restored)
        if freeze:
            # The restored `Frozen` variables hold arrays: constants again.
            frozenconst.nnx.freeze(restored, frozenconst.nnx.Frozen)
        return _frozen_part(restored), nnx.state(restored, nnx.LoRAParam)

    def current() -> Any:
        if "update" in held:
            held["update"]()
        return model

    return Run(
        step=step,
        frozen=lambda: _frozen_part(current()),
        trainable=lambda: nnx.state(current(), nnx.LoRAParam),
        lowered=lowered,
        checkpoint=checkpoint,
        state=held,
    )


def _frozen_part(model: Any) -> Any:
    """The base model's weights: every `nnx.Linear`'s kernel and bias, as arrays."""
    return [
        (layer.base_module.kernel.get_value(), layer.base_module.bias.get_value())
        for layer in model.layers
        if isinstance(layer, nnx.LoRA)
    ]
