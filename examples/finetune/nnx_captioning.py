"""The jax-ai-stack image-captioning tutorial ("Image Captioning with Vision Transformer (ViT) model").

Source: jax-ml/jax-ai-stack, docs/source/JAX_image_captioning.md. A ViT encoder
("pretrained on the ImageNet", loaded from HuggingFace Transformers) and a
transformer decoder; the encoder is left out of training by a filter,
`nnx.All(nnx.Param, nnx.Not(nnx.PathContains("encoder")))`, used both for the
gradient (`nnx.DiffState`) and for `nnx.ModelAndOptimizer(..., wrt=...)`; an
`nnx.jit` step; checkpoints with orbax's `CheckpointManager` of
`nnx.state(model)` (PRNG keys turned into key data first, as the tutorial does).
The tutorial's modules, filter, step and `save_model`, as written, at small sizes;
the encoder's weights are random (`use_pretained_weights=False`: no network), the
dataset a random batch of images and token ids.

The one line (`freeze=True`), after the model is built:

    frozenconst.nnx.freeze(model.encoder)
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

import frozenconst.nnx

from . import Run


class VisionTransformer(nnx.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        in_channels: int = 3,
        img_size: int = 224,
        patch_size: int = 16,
        num_layers: int = 12,
        num_heads: int = 12,
        mlp_dim: int = 3072,
        hidden_size: int = 768,
        dropout_rate: float = 0.1,
        *,
        rngs: nnx.Rngs = nnx.Rngs(0),  # noqa: B008 - as the tutorial writes it
        include_top: bool = True,
    ):
        # Patch and position embedding
        n_patches = (img_size // patch_size) ** 2
        self.patch_embeddings = nnx.Conv(
            in_channels,
            hidden_size,
            kernel_size=(patch_size, patch_size),
            strides=(patch_size, patch_size),
            padding="VALID",
            use_bias=True,
            rngs=rngs,
        )

        initializer = jax.nn.initializers.truncated_normal(stddev=0.02)
        self.position_embeddings = nnx.Param(
            initializer(rngs.params(), (1, n_patches + 1, hidden_size), jnp.float32)
        )
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)

        self.cls_token = nnx.Param(jnp.zeros((1, 1, hidden_size)))

        # Transformer Encoder blocks
        self.encoder = nnx.Sequential(
            *[
                TransformerEncoder(hidden_size, mlp_dim, num_heads, dropout_rate, rngs=rngs)
                for i in range(num_layers)
            ]
        )
        self.final_norm = nnx.LayerNorm(hidden_size, rngs=rngs)

        self.include_top = include_top
        # Classification head
        self.classifier = nnx.Linear(hidden_size, num_classes, rngs=rngs)

        # store config info:
        self.hidden_size = hidden_size
        self.mlp_dim = mlp_dim
        self.img_size = img_size
        self.patch_size = patch_size

    def __call__(self, x: jax.Array) -> jax.Array:
        # Patch and position embedding
        patches = self.patch_embeddings(x)
        batch_size = patches.shape[0]
        patches = patches.reshape(batch_size, -1, patches.shape[-1])

        cls_token = jnp.tile(self.cls_token, [batch_size, 1, 1])
        x = jnp.concat([cls_token, patches], axis=1)
        embeddings = x + self.position_embeddings
        embeddings = self.dropout(embeddings)

        # Encoder blocks
        x = self.encoder(embeddings)
        x = self.final_norm(x)

        if self.include_top:
            # fetch the first token
            x = x[:, 0]

            # Classification
            return self.classifier(x)
        else:
            return x


class TransformerEncoder(nnx.Module):
    def __init__(
        self,
        hidden_size: int,
        mlp_dim: int,
        num_heads: int,
        dropout_rate: float = 0.0,
        *,
        rngs: nnx.Rngs = nnx.Rngs(0),  # noqa: B008 - as the tutorial writes it
    ) -> None:
        self.norm1 = nnx.LayerNorm(hidden_size, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=num_heads,
            in_features=hidden_size,
            dropout_rate=dropout_rate,
            broadcast_dropout=False,
            decode=False,
            deterministic=False,
            rngs=rngs,
        )
        self.norm2 = nnx.LayerNorm(hidden_size, rngs=rngs)

        self.mlp = nnx.Sequential(
            nnx.Linear(hidden_size, mlp_dim, rngs=rngs),
            nnx.gelu,
            nnx.Dropout(dropout_rate, rngs=rngs),
            nnx.Linear(mlp_dim, hidden_size, rngs=rngs),
            nnx.Dropout(dropout_rate, rngs=rngs),
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


def get_vit_encoder(
    img_size: int = 224,
    patch_size: int = 16,
    num_layers: int = 12,
    num_heads: int = 12,
    mlp_dim: int = 3072,
    hidden_size: int = 768,
    dropout_rate: float = 0.1,
    *,
    rngs: nnx.Rngs = nnx.Rngs(0),  # noqa: B008 - as the tutorial writes it
    use_pretained_weights: bool = True,
) -> VisionTransformer:
    encoder = VisionTransformer(
        num_classes=1000,
        img_size=img_size,
        patch_size=patch_size,
        num_layers=num_layers,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        hidden_size=hidden_size,
        dropout_rate=dropout_rate,
        rngs=rngs,
    )
    if use_pretained_weights:
        raise NotImplementedError("no network here: the encoder's weights stay random")
    encoder.include_top = False
    return encoder


def causal_attention_mask(sequence_length: int) -> jax.Array:
    return jnp.tril(jnp.ones((sequence_length, sequence_length)))


class PositionalEmbedding(nnx.Module):
    def __init__(
        self,
        sequence_length: int,
        vocab_size: int,
        hidden_size: int = 768,
        *,
        rngs: nnx.Rngs = nnx.Rngs(0),  # noqa: B008 - as the tutorial writes it
    ):
        self.token_embeddings = nnx.Embed(num_embeddings=vocab_size, features=hidden_size, rngs=rngs)
        self.position_embeddings = nnx.Embed(num_embeddings=sequence_length, features=hidden_size, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        sequence_length = x.shape[1]
        positions = jnp.arange(0, sequence_length)[None, :]
        embedded_tokens = self.token_embeddings(x)
        embedded_positions = self.position_embeddings(positions)
        return embedded_tokens + embedded_positions


class TransformerDecoderLayer(nnx.Module):
    def __init__(
        self,
        num_heads: int = 12,
        mlp_dim: int = 3072,
        hidden_size: int = 768,
        dropout_rate: float = 0.1,
        *,
        rngs: nnx.Rngs = nnx.Rngs(0),  # noqa: B008 - as the tutorial writes it
    ):
        self.masked_self_mha = nnx.MultiHeadAttention(
            num_heads=num_heads,
            in_features=hidden_size,
            broadcast_dropout=False,
            decode=False,
            deterministic=False,
            rngs=rngs,
        )
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        self.norm1 = nnx.LayerNorm(num_features=hidden_size, rngs=rngs)
        self.encoder_mha = nnx.MultiHeadAttention(
            num_heads=num_heads,
            in_features=hidden_size,
            broadcast_dropout=False,
            decode=False,
            deterministic=False,
            rngs=rngs,
        )
        self.norm2 = nnx.LayerNorm(num_features=hidden_size, rngs=rngs)
        self.mlp = nnx.Sequential(
            nnx.Linear(hidden_size, mlp_dim, rngs=rngs),
            nnx.gelu,
            nnx.Dropout(dropout_rate, rngs=rngs),
            nnx.Linear(mlp_dim, hidden_size, rngs=rngs),
            nnx.Dropout(dropout_rate, rngs=rngs),
        )
        self.norm3 = nnx.LayerNorm(num_features=hidden_size, rngs=rngs)

    def __call__(
        self, decoder_input: jax.Array, encoder_output: jax.Array, mask: jax.Array | None = None
    ) -> jax.Array:
        # Self-attention part on decoder input
        causal_mask = causal_attention_mask(decoder_input.shape[1])  # (sequence_length, sequence_length)

        if mask is not None:
            # mask shape: (N, sequence_length)
            padding_mask = mask[:, None, :, None].astype("int32")  # (N, 1, sequence_length, 1)
            combined_mask = mask[:, None, None, :].astype("int32")  # (N, 1, sequence_length)
            combined_mask = jnp.minimum(
                combined_mask, causal_mask
            )  # (N, 1, sequence_length, sequence_length)
        else:
            combined_mask = causal_mask
            padding_mask = None

        attention_output = self.masked_self_mha(inputs_q=decoder_input, mask=combined_mask)
        attention_output = self.dropout(attention_output)
        attention_output = self.norm1(decoder_input + attention_output)

        # Attention part on encoder input
        decoder_output = self.encoder_mha(
            inputs_q=attention_output,
            inputs_v=encoder_output,
            inputs_k=encoder_output,
            mask=padding_mask,
        )
        decoder_output = self.dropout(decoder_output)
        decoder_output = self.norm2(decoder_output + attention_output)

        # Final MLP part
        decoder_output = decoder_output + self.mlp(decoder_output)
        decoder_output = self.norm3(decoder_output)

        return decoder_output


class TransformerDecoder(nnx.Module):
    def __init__(
        self,
        sequence_length: int,
        vocab_size: int,
        num_layers: int = 12,
        num_heads: int = 12,
        mlp_dim: int = 3072,
        hidden_size: int = 768,
        dropout_rate: float = 0.1,
        *,
        rngs: nnx.Rngs = nnx.Rngs(0),  # noqa: B008 - as the tutorial writes it
    ):
        self.positional_embedding = PositionalEmbedding(sequence_length, vocab_size, hidden_size, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        # flax 0.12 asks a list of modules to be marked as data (`nnx.List`); flax 0.11 has
        # no `nnx.List` and takes the tutorial's plain list.
        blocks = getattr(nnx, "List", list)
        # The tutorial passes no `rngs` here, so its decoder layers draw from the one
        # `nnx.Rngs(0)` of `TransformerDecoderLayer`'s default argument, shared by every model
        # built in the process: a second model would start from other weights. `rngs=rngs`
        # makes two builds the same model.
        self.decoder_blocks = blocks(
            [
                TransformerDecoderLayer(num_heads, mlp_dim, hidden_size, dropout_rate=dropout_rate, rngs=rngs)
                for _ in range(num_layers)
            ]
        )

    def __call__(
        self, decoder_input: jax.Array, encoder_output: jax.Array, mask: jax.Array | None = None
    ) -> jax.Array:
        x = self.positional_embedding(decoder_input)
        x = self.dropout(x)
        for layer in self.decoder_blocks:
            x = layer(x, encoder_output, mask=mask)
        return x


class ImageCaptioningModel(nnx.Module):
    def __init__(
        self,
        # encoder config:
        img_size: int = 224,
        patch_size: int = 16,
        encoder_num_layers: int = 12,
        encoder_num_heads: int = 12,
        encoder_mlp_dim: int = 3072,
        use_pretained_encoder: bool = True,
        # decoder config:
        vocab_size: int = 50257,
        decoder_sequence_length: int = 50,
        decoder_num_layers: int = 4,
        decoder_num_heads: int = 6,
        decoder_mlp_dim: int = 3072,
        # other common config:
        dropout_rate: float = 0.1,
        hidden_size: int = 768,
        *,
        rngs: nnx.Rngs = nnx.Rngs(0),  # noqa: B008 - as the tutorial writes it
    ):
        self.encoder = get_vit_encoder(
            img_size,
            patch_size,
            encoder_num_layers,
            encoder_num_heads,
            encoder_mlp_dim,
            hidden_size,
            dropout_rate=dropout_rate,
            use_pretained_weights=use_pretained_encoder,
            rngs=rngs,
        )
        self.decoder = TransformerDecoder(
            decoder_sequence_length,
            vocab_size,
            decoder_num_layers,
            decoder_num_heads,
            decoder_mlp_dim,
            hidden_size,
            dropout_rate=dropout_rate,
            rngs=rngs,
        )
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        self.lm_head = nnx.Linear(hidden_size, vocab_size, rngs=rngs)

    def __call__(self, img: jax.Array, decoder_input: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        encoder_output = self.encoder(img)
        decoder_output = self.decoder(
            decoder_input, encoder_output, mask
        )  # (N, sequence_length, hidden_size)
        decoder_output = self.dropout(decoder_output)
        return self.lm_head(decoder_output)


# The encoder's weights, trained or frozen: its `nnx.Param`s, or the `Frozen` variables they became.
WEIGHTS = nnx.Any(nnx.Param, frozenconst.nnx.Frozen)


def compute_losses_and_logits(
    model: nnx.Module, images: jax.Array, target_tokens: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    input_tokens = target_tokens[:, :-1]
    padding_mask = input_tokens != 0
    target_tokens = target_tokens[:, 1:]
    predicted_tokens = model(images, decoder_input=input_tokens, mask=padding_mask)

    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits=predicted_tokens, labels=target_tokens
    ).mean()
    return loss, (predicted_tokens, target_tokens)


# The tutorial's sizes are img_size=224, a ViT-B/16 encoder (12 layers, hidden 768), GPT-2's
# vocabulary and max_length=150; these keep its shapes' roles at a CPU test's size.
SMALL = {
    "img_size": 16,
    "patch_size": 8,
    "encoder_num_layers": 1,
    "encoder_num_heads": 2,
    "encoder_mlp_dim": 32,
    "vocab_size": 64,
    "decoder_sequence_length": 8,
    "decoder_num_layers": 1,
    "decoder_num_heads": 2,
    "decoder_mlp_dim": 32,
    "hidden_size": 16,
}


def build(
    freeze: bool = False,
    batch: int = 4,
    sizes: dict[str, int] | None = None,
    jit_options: dict[str, Any] | None = None,
) -> Run:
    """The tutorial's model, filter, optimizer and step; `freeze=True` adds the one line.
    `jit_options` go to `nnx.jit` (the tutorial passes none; `{"graph_updates": False}`: NNX
    returns only the variables a step changed, flax 0.12 and later)."""
    config = dict(SMALL, **(sizes or {}))
    max_length = config["decoder_sequence_length"]
    model = ImageCaptioningModel(use_pretained_encoder=False, rngs=nnx.Rngs(0), **config)
    if freeze:
        # the one line:
        frozenconst.nnx.freeze(model.encoder)

    # Select all params and not those with the key containing "encoder"
    trainable_params_filter = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("encoder")))
    model_diffstate = nnx.DiffState(0, trainable_params_filter)

    for key, _ in _flat(nnx.state(model, trainable_params_filter)):
        assert "encoder" not in key

    learning_rate = 0.015
    momentum = 0.9
    optimizer = nnx.ModelAndOptimizer(
        model, optax.sgd(learning_rate, momentum, nesterov=True), wrt=trainable_params_filter
    )

    @functools.partial(nnx.jit, **(jit_options or {}))
    def train_step(model: nnx.Module, optimizer: nnx.Optimizer, batch: dict[str, np.ndarray]) -> jax.Array:
        # Convert np.ndarray to jax.Array on GPU
        images = jnp.array(batch["image"])
        target_tokens = jnp.array(batch["caption"], dtype=jnp.int32)

        grad_fn = nnx.value_and_grad(compute_losses_and_logits, has_aux=True, argnums=model_diffstate)
        (loss, _), grads = grad_fn(model, images, target_tokens)

        optimizer.update(grads)  # In-place updates.

        return loss

    rng = np.random.default_rng(12)
    img_size = config["img_size"]
    data = {
        "image": rng.standard_normal((batch, img_size, img_size, 3)).astype(np.float32),
        "caption": rng.integers(1, config["vocab_size"], (batch, max_length + 1)),
    }
    model.train()  # Set model to the training mode: e.g. update batch statistics
    held: dict[str, Any] = {"model": model, "optimizer": optimizer}

    def step() -> jax.Array:
        return train_step(model, optimizer, data)

    def checkpoint(directory: pathlib.Path) -> tuple[Any, Any]:
        path = ocp.test_utils.erase_and_create_empty(directory / "output-image-captioning-model")
        options = ocp.CheckpointManagerOptions(max_to_keep=2)
        mngr = ocp.CheckpointManager(path, options=options)

        def save_model(epoch: int) -> None:
            state = nnx.state(model)

            # We should convert PRNGKeyArray to the old format for Dropout layers
            # https://github.com/google/flax/issues/4231
            # (The tutorial tests `isinstance(x, jax._src.prng.PRNGKeyArray)` and
            # `isinstance(x.dtype, jax._src.prng.KeyTy)`: JAX internals that moved to
            # `jax._src.random.prng` in jax 0.10. The same test, through JAX's public API.)
            def get_key_data(x: Any) -> Any:
                if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                    return jax.random.key_data(x)
                return x

            serializable_state = jax.tree.map(get_key_data, state)
            mngr.save(epoch, args=ocp.args.StandardSave(serializable_state))
            mngr.wait_until_finished()

        save_model(0)

        # The tutorial restores nothing: the restore orbax's CheckpointManager offers, into
        # the abstract state of the same model (`nnx.eval_shape`), keys as key data.
        def abstract() -> Any:
            fresh = ImageCaptioningModel(use_pretained_encoder=False, rngs=nnx.Rngs(0), **config)
            if freeze:
                frozenconst.nnx.freeze(fresh.encoder)
            return fresh

        _, abstract_state = nnx.split(nnx.eval_shape(abstract))
        target = jax.tree.map(
            lambda x: (
                jax.eval_shape(jax.random.key_data, x)
                if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                else x
            ),
            abstract_state,
        )
        restored_state = mngr.restore(0, args=ocp.args.StandardRestore(target))
        mngr.close()
        return nnx.filter_state(restored_state["encoder"], WEIGHTS), nnx.filter_state(
            restored_state, trainable_params_filter
        )

    return Run(
        step=step,
        frozen=lambda: nnx.state(model.encoder, WEIGHTS),
        trainable=lambda: nnx.state(model, trainable_params_filter),
        lowered=(lambda: train_step.lower(model, optimizer, data)) if hasattr(train_step, "lower") else None,
        checkpoint=checkpoint,
        state=held,
    )


def _flat(state: Any) -> Any:
    """`state.flat_state()` as the tutorial iterates it: (path, variable) pairs."""
    # `State.flat_state()` (the tutorial's) is deprecated in flax 0.12: its replacement there.
    return nnx.to_flat_state(state) if hasattr(nnx, "to_flat_state") else state.flat_state()
