"""Five fine-tuning examples, as their projects wrote them, at small sizes on the CPU.

Each module ports one example from its framework's own repository (the source is
named at its top) and has a `build(freeze=False, ...)` function that runs it up to
its training loop and returns a [`Run`][examples.finetune.Run]. With `freeze=True`
the example differs by one line: the line that makes the pretrained part
FrozenConsts (after the comment `# the one line:` in each module). The pretrained weights are
random (no network): what is measured is what the framework does with them.

- `linen_transfer`: flax linen's transfer-learning guide (a CLIP-like vision
  backbone, `optax.multi_transform` with `optax.set_to_zero`, `TrainState`,
  `flax.serialization`);
- `nnx_lora`: flax NNX's optimization cookbook, low-rank adaptation (`nnx.LoRA`,
  `wrt=nnx.LoRAParam`), with the NNX performance guide's functional loop and the
  NNX checkpointing guide (orbax);
- `eqx_frozen_layer`: equinox's `frozen_layer` example (`eqx.partition` with a
  filter spec, `eqx.filter_jit`);
- `optax_freezing`: optax's `freezing_parameters` notebook (`freeze`,
  `selective_transform`, `masked(set_to_zero)`, `partition`);
- `nnx_captioning`: the jax-ai-stack image-captioning tutorial (a pretrained ViT
  encoder left out with `wrt=nnx.All(nnx.Param, nnx.Not(nnx.PathContains("encoder")))`,
  orbax `CheckpointManager`).

`tests/test_finetune_examples.py` runs each as written and with the one line and
compares the two; `python -m benchmarks finetune` times their steps.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Run:
    """One example, built and ready to train: its step and what to compare.

    Attributes:
        step: one training step as the example writes it (its jitted function
            called on the example's state, the state kept); returns the step's
            loss, or None where the example's step returns none.
        frozen: the pretrained part's values now, a pytree of arrays (a
            FrozenConst stays one: compare with `np.asarray`).
        trainable: the trained part's values now, a pytree of arrays.
        lowered: the step's program, lowered (`jax.jit`'s `.lower(...)`), or None
            where the example's jit offers none.
        checkpoint: saves the example's state into a folder the framework's way
            and restores it; returns the restored `(frozen, trainable)`.
        state: what the example keeps between steps (model, optimizer, ...), to
            inspect.
        loss: where the step returns no loss, the loss now on the first batch
            (a separate call, outside the timed step).
    """

    step: Callable[[], Any]
    frozen: Callable[[], Any]
    trainable: Callable[[], Any]
    lowered: Callable[[], Any] | None
    checkpoint: Callable[[pathlib.Path], tuple[Any, Any]] | None
    state: dict[str, Any]
    loss: Callable[[], Any] | None = None


def host_values(tree: Any) -> list[Any]:
    """Each array leaf of `tree` copied to the host (NumPy), in `jax.tree.leaves` order."""
    import jax
    import numpy as np

    return [np.array(leaf) for leaf in jax.tree.leaves(tree)]


def live_copies(values: list[Any], besides: frozenset[int] = frozenset()) -> tuple[int, int]:
    """The distinct live device buffers holding one of `values`, and their bytes.

    Read from `jax.live_arrays()` (whatever holds them: the model, an optimizer's
    state, a derived copy, a constant's cache), by buffer address, so two arrays
    aliasing one buffer count once; the addresses in `besides` (another run's,
    `live_addresses`) are left out. Only values that are not constant-valued count
    (a zero bias would match any zero array of its shape); pass random weights.
    """
    found = live_addresses(values)
    kept = {address: size for address, size in found.items() if address not in besides}
    return len(kept), sum(kept.values())


def live_addresses(values: list[Any]) -> dict[int, int]:
    """`live_copies`' buffers: each one's address and bytes."""
    import gc

    import jax
    import numpy as np

    wanted = [v for v in values if v.size > 1 and not np.all(v == v.reshape(-1)[0])]
    shapes = {(v.shape, v.dtype.str) for v in wanted}
    gc.collect()
    found: dict[int, int] = {}
    for array in jax.live_arrays():
        if array.is_deleted() or (array.shape, np.dtype(array.dtype).str) not in shapes:
            continue
        host = np.asarray(array)
        if any(host.shape == v.shape and np.array_equal(host, v) for v in wanted):
            found[array.unsafe_buffer_pointer()] = array.nbytes
    return found
