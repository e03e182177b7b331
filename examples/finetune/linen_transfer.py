"""flax linen's transfer-learning guide, at a small size, with a random CLIP-like backbone.

Source: google/flax, docs/guides/training_techniques/transfer_learning.md ("Transfer
learning"). The guide loads `FlaxCLIPModel.from_pretrained('openai/clip-vit-base-patch32')`
from HuggingFace Transformers, extracts its `vision_model` with `bind`/`unbind`,
puts it as the `backbone` of a `Classifier`, copies the pretrained parameters into
`params['backbone']`, freezes them with `optax.multi_transform` (`optax.adam` for
the head, `optax.set_to_zero` for the backbone) and trains with a `TrainState`.
Here the CLIP module is a small one written the way Transformers' Flax CLIP is
(modules assigned in `setup()`, the class embedding a `self.param`, the position
ids an attribute set in `setup()`), initialised at random instead of downloaded.
The guide's training step is flax's usual one ("training can proceed normally");
checkpoints go through `flax.serialization`, flax's own format for a `TrainState`.

The one line (`freeze=True`), where the guide transfers the pretrained parameters:

    params['backbone'] = jax.tree.map(frozenconst.FrozenConst, vision_model_vars['params'])
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import serialization, traverse_util
from flax.training.train_state import TrainState

import frozenconst

from . import Run


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
    """The sizes of `openai/clip-vit-base-patch32`'s vision tower, made small."""

    image_size: int = 32
    patch_size: int = 8
    hidden_size: int = 32
    intermediate_size: int = 64
    num_attention_heads: int = 4
    num_hidden_layers: int = 1
    projection_dim: int = 16


@dataclasses.dataclass(frozen=True)
class CLIPTextConfig:
    vocab_size: int = 64
    max_position_embeddings: int = 8
    hidden_size: int = 32
    projection_dim: int = 16


@dataclasses.dataclass
class VisionOutput:
    last_hidden_state: jax.Array
    pooler_output: jax.Array


class CLIPVisionEmbeddings(nn.Module):
    config: CLIPVisionConfig

    def setup(self) -> None:
        embed_dim = self.config.hidden_size
        patch_size = self.config.patch_size
        self.class_embedding = self.param(
            "class_embedding", jax.nn.initializers.normal(stddev=0.02), (embed_dim,)
        )
        self.patch_embedding = nn.Conv(
            embed_dim,
            kernel_size=(patch_size, patch_size),
            strides=(patch_size, patch_size),
            padding="VALID",
            use_bias=False,
            kernel_init=jax.nn.initializers.normal(),
        )
        self.num_patches = (self.config.image_size // patch_size) ** 2
        num_positions = self.num_patches + 1
        self.position_embedding = nn.Embed(
            num_positions, embed_dim, embedding_init=jax.nn.initializers.normal()
        )
        self.position_ids = jnp.expand_dims(jnp.arange(0, num_positions, dtype="i4"), axis=0)

    def __call__(self, pixel_values: jax.Array) -> jax.Array:
        patch_embeds = self.patch_embedding(pixel_values)
        batch_size, height, width, channels = patch_embeds.shape
        patch_embeds = jnp.reshape(patch_embeds, (batch_size, height * width, channels))
        class_embeds = jnp.expand_dims(self.class_embedding, axis=(0, 1))
        class_embeds = jnp.tile(class_embeds, (batch_size, 1, 1))
        embeddings = jnp.concatenate([class_embeds, patch_embeds], axis=1)
        return embeddings + self.position_embedding(self.position_ids)


class CLIPAttention(nn.Module):
    config: CLIPVisionConfig

    def setup(self) -> None:
        self.embed_dim = self.config.hidden_size
        self.num_heads = self.config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        init = jax.nn.initializers.normal(0.01)
        self.k_proj = nn.Dense(self.embed_dim, kernel_init=init)
        self.v_proj = nn.Dense(self.embed_dim, kernel_init=init)
        self.q_proj = nn.Dense(self.embed_dim, kernel_init=init)
        self.out_proj = nn.Dense(self.embed_dim, kernel_init=init)

    def _split_heads(self, hidden_states: jax.Array) -> jax.Array:
        return hidden_states.reshape((*hidden_states.shape[:2], self.num_heads, self.head_dim))

    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        query = self._split_heads(self.q_proj(hidden_states))
        key = self._split_heads(self.k_proj(hidden_states))
        value = self._split_heads(self.v_proj(hidden_states))
        attn_weights = nn.attention.dot_product_attention_weights(query, key, deterministic=True)
        attn_output = jnp.einsum("...hqk,...khd->...qhd", attn_weights, value)
        attn_output = attn_output.reshape((*attn_output.shape[:2], self.embed_dim))
        return self.out_proj(attn_output)


class CLIPMLP(nn.Module):
    config: CLIPVisionConfig

    def setup(self) -> None:
        init = jax.nn.initializers.normal(0.01)
        self.fc1 = nn.Dense(self.config.intermediate_size, kernel_init=init)
        self.fc2 = nn.Dense(self.config.hidden_size, kernel_init=init)

    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        hidden_states = self.fc1(hidden_states)
        hidden_states = hidden_states * jax.nn.sigmoid(1.702 * hidden_states)  # quick_gelu
        return self.fc2(hidden_states)


class CLIPEncoderLayer(nn.Module):
    config: CLIPVisionConfig

    def setup(self) -> None:
        self.self_attn = CLIPAttention(self.config)
        self.layer_norm1 = nn.LayerNorm(epsilon=1e-5)
        self.mlp = CLIPMLP(self.config)
        self.layer_norm2 = nn.LayerNorm(epsilon=1e-5)

    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        hidden_states = hidden_states + self.self_attn(self.layer_norm1(hidden_states))
        return hidden_states + self.mlp(self.layer_norm2(hidden_states))


class CLIPVisionTransformer(nn.Module):
    config: CLIPVisionConfig

    def setup(self) -> None:
        self.embeddings = CLIPVisionEmbeddings(self.config)
        self.pre_layrnorm = nn.LayerNorm(epsilon=1e-5)
        self.layers = [
            CLIPEncoderLayer(self.config, name=str(i)) for i in range(self.config.num_hidden_layers)
        ]
        self.post_layernorm = nn.LayerNorm(epsilon=1e-5)

    def __call__(self, pixel_values: jax.Array) -> VisionOutput:
        hidden_states = self.pre_layrnorm(self.embeddings(pixel_values))
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        pooled_output = self.post_layernorm(hidden_states[:, 0, :])
        return VisionOutput(last_hidden_state=hidden_states, pooler_output=pooled_output)


class CLIPTextTransformer(nn.Module):
    config: CLIPTextConfig

    def setup(self) -> None:
        self.token_embedding = nn.Embed(self.config.vocab_size, self.config.hidden_size)
        self.final_layer_norm = nn.LayerNorm(epsilon=1e-5)

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        return self.final_layer_norm(self.token_embedding(input_ids))[:, -1]


class CLIPModule(nn.Module):
    """`FlaxCLIPModule`: a text and a vision tower defined in `setup()`, and their projections."""

    text_config: CLIPTextConfig
    vision_config: CLIPVisionConfig

    def setup(self) -> None:
        self.text_model = CLIPTextTransformer(self.text_config)
        self.vision_model = CLIPVisionTransformer(self.vision_config)
        self.visual_projection = nn.Dense(self.vision_config.projection_dim, use_bias=False)
        self.text_projection = nn.Dense(self.text_config.projection_dim, use_bias=False)

    def __call__(self, input_ids: jax.Array, pixel_values: jax.Array) -> jax.Array:
        image_embeds = self.visual_projection(self.vision_model(pixel_values).pooler_output)
        text_embeds = self.text_projection(self.text_model(input_ids))
        return image_embeds @ text_embeds.T


# Note: FlaxCLIPModel is not a Flax Module
def load_model(vision_config: CLIPVisionConfig) -> tuple[CLIPModule, dict[str, Any]]:
    """The guide's `load_model`: the CLIP module and its "pretrained" variables (random here)."""
    module = CLIPModule(CLIPTextConfig(), vision_config)
    size = vision_config.image_size
    variables = module.init(
        jax.random.key(0),
        jnp.zeros((1, CLIPTextConfig.max_position_embeddings), jnp.int32),
        jnp.zeros((1, size, size, 3)),
    )
    return module, {"params": variables["params"]}


class Classifier(nn.Module):
    num_classes: int
    backbone: nn.Module

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.backbone(x).pooler_output
        x = nn.Dense(self.num_classes, name="head", kernel_init=nn.zeros)(x)
        return x


def build(freeze: bool = False, batch: int = 8, vision_config: CLIPVisionConfig | None = None) -> Run:
    """The guide, up to its training loop; `freeze=True` adds the one line."""
    config = vision_config or CLIPVisionConfig()
    clip, clip_variables = load_model(config)
    vision_model, vision_model_vars = clip.bind(clip_variables).vision_model.unbind()

    num_classes = 3
    model = Classifier(num_classes=num_classes, backbone=vision_model)

    x = jnp.empty((1, config.image_size, config.image_size, 3))
    variables = model.init(jax.random.key(1), x)
    params = variables["params"]

    params["backbone"] = vision_model_vars["params"]
    if freeze:
        # the one line:
        params["backbone"] = jax.tree.map(frozenconst.FrozenConst, vision_model_vars["params"])

    partition_optimizers = {"trainable": optax.adam(5e-3), "frozen": optax.set_to_zero()}
    param_partitions = traverse_util.path_aware_map(
        lambda path, v: "frozen" if "backbone" in path else "trainable", params
    )
    tx = optax.multi_transform(partition_optimizers, param_partitions)

    state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    # flax's usual training step: "training can proceed normally".
    @jax.jit
    def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, jax.Array]:
        def loss_fn(params: Any) -> jax.Array:
            logits = state.apply_fn({"params": params}, batch["image"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        state = state.apply_gradients(grads=grads)
        return state, loss

    key_x, key_y = jax.random.split(jax.random.key(2))
    data = {
        "image": jax.random.normal(key_x, (batch, config.image_size, config.image_size, 3)),
        "label": jax.random.randint(key_y, (batch,), 0, num_classes),
    }
    held: dict[str, Any] = {"state": state, "model": model, "data": data}

    def step() -> jax.Array:
        held["state"], loss = train_step(held["state"], data)
        return loss

    def checkpoint(directory: pathlib.Path) -> tuple[Any, Any]:
        path = directory / "state.msgpack"
        path.write_bytes(serialization.to_bytes(held["state"]))
        restored = serialization.from_bytes(held["state"], path.read_bytes())
        return restored.params["backbone"], restored.params["head"]

    return Run(
        step=step,
        frozen=lambda: held["state"].params["backbone"],
        trainable=lambda: held["state"].params["head"],
        lowered=lambda: train_step.lower(held["state"], data),
        checkpoint=checkpoint,
        state=held,
    )
