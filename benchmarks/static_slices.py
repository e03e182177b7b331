"""The `static-slices` section: a Whisper decoder's causal mask, read through a static slice.

    python -m benchmarks static-slices               # writes docs/results/static-slices-results.md
    python -m benchmarks.static_slices --worker PIPELINE   # one pipeline, rows as JSON (internal)

A stand-in for the Whisper decoder of issue #21, with Whisper tiny's shapes
(vocabulary 51,865, 448 text positions, width 384, 6 heads, 4 layers, 1,500
audio frames) and random weights: no model weights can be downloaded where the
suite runs, and the figures measured here (bytes of HLO text) depend on the
shapes and the operations, not on the weights' values. Each block is
self-attention with the causal mask, cross-attention over the audio features
and a 4x MLP, each after a layer norm, as in Whisper; the mask is a
448x448 boolean lower triangle held by the model (Hugging Face's
`make_causal_mask`) and read as
`mask[:, :, :q, :k]` (Hugging Face's Flax Whisper decoder without a cache:
`self.causal_mask[:, :, :query_length, :key_length]`).

The weights are the program's arguments (as a Flax `apply` takes them), given
as shapes: nothing is compiled or run, each variant is lowered
(`jax.jit(f).lower(...).as_text()`) under each constant pipeline, in a fresh
interpreter per pipeline. The variants hold the mask as

- a NumPy array (the original): NumPy slices it at trace time, and `jax.jit`
  embeds the slice;
- a `jax.Array` under `jax.jit`: sliced in the program, so the default
  pipeline embeds the whole mask;
- a `FrozenConst` under `jax.jit`: the whole mask a parameter of the program
  (hoisted at lowering, issue #46), sliced in it, embedded nowhere;
- a `FrozenConst` under `frozenconst.jit`: the same program;
- a `FrozenConst` sliced on the host at trace time (`np.asarray(x)[...]`, a
  read-only view), under `jax.jit`: what the NumPy original embeds.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from ._harness import DOCS, PIPELINES, environment, pipeline_env, run_worker

N_VOCAB, N_CTX, WIDTH, HEADS, LAYERS, AUDIO_CTX = 51865, 448, 384, 6, 4, 1500
TOKENS = 7  # query and key length: a prompt of 7 tokens, decoded without a cache
VARIANTS = {
    "numpy": "NumPy mask (the original), `jax.jit`",
    "jax.Array": "`jax.Array` mask, `jax.jit`",
    "FrozenConst": "`FrozenConst` mask, `jax.jit`",
    "frozenconst.jit": "`FrozenConst` mask, `frozenconst.jit`",
    "host slice": "`FrozenConst` mask sliced on the host (`np.asarray(x)[...]`), `jax.jit`",
}


def _param_shapes() -> dict[str, Any]:
    """The decoder's weights as shapes (`jax.ShapeDtypeStruct`): the program's arguments."""
    import jax
    import numpy as np

    struct: Any = jax.ShapeDtypeStruct  # unannotated in jax 0.10

    def s(*shape: int) -> Any:
        return struct(shape, np.float32)

    def norm() -> dict[str, Any]:
        return {"scale": s(WIDTH), "bias": s(WIDTH)}

    def attention() -> dict[str, Any]:
        return {
            "q": s(WIDTH, WIDTH),
            "q_bias": s(WIDTH),
            "k": s(WIDTH, WIDTH),
            "v": s(WIDTH, WIDTH),
            "v_bias": s(WIDTH),
            "out": s(WIDTH, WIDTH),
            "out_bias": s(WIDTH),
        }

    block = {
        "self_norm": norm(),
        "self": attention(),
        "cross_norm": norm(),
        "cross": attention(),
        "mlp_norm": norm(),
        "fc1": s(WIDTH, 4 * WIDTH),
        "fc1_bias": s(4 * WIDTH),
        "fc2": s(4 * WIDTH, WIDTH),
        "fc2_bias": s(WIDTH),
    }
    return {
        "token_embedding": s(N_VOCAB, WIDTH),
        "positions": s(N_CTX, WIDTH),
        "blocks": [block] * LAYERS,
        "final_norm": norm(),
    }


def decoder(mask: Any, host_slice: bool = False) -> Any:
    """The decoder's forward pass over `TOKENS` tokens, closing over `mask` (1, 1, 448, 448).

    With `host_slice`, the mask is sliced on the host at trace time
    (`np.asarray(mask)[...]`), as NumPy slices a NumPy mask.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    def layer_norm(x: Any, p: dict[str, Any]) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * p["scale"] + p["bias"]

    def heads(x: Any) -> Any:
        return x.reshape(x.shape[0], x.shape[1], HEADS, WIDTH // HEADS).transpose(0, 2, 1, 3)

    def attend(x: Any, source: Any, p: dict[str, Any], causal: Any | None) -> Any:
        q = heads(x @ p["q"] + p["q_bias"])
        k = heads(source @ p["k"])
        v = heads(source @ p["v"] + p["v_bias"])
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(WIDTH // HEADS)
        if causal is not None:  # as the Flax port's `lax.select(mask > 0, 0, finfo.min)` bias
            scores = scores + jnp.where(causal, 0.0, np.finfo(np.float32).min)
        out = jax.nn.softmax(scores, axis=-1) @ v
        return out.transpose(0, 2, 1, 3).reshape(x.shape) @ p["out"] + p["out_bias"]

    def forward(params: dict[str, Any], tokens: Any, audio: Any) -> Any:
        q = k = tokens.shape[1]
        causal = np.asarray(mask)[:, :, :q, :k] if host_slice else mask[:, :, :q, :k]
        x = params["token_embedding"][tokens] + params["positions"][:q]
        for p in params["blocks"]:
            x = x + attend(layer_norm(x, p["self_norm"]), layer_norm(x, p["self_norm"]), p["self"], causal)
            x = x + attend(layer_norm(x, p["cross_norm"]), audio, p["cross"], None)
            h = layer_norm(x, p["mlp_norm"])
            x = x + jax.nn.gelu(h @ p["fc1"] + p["fc1_bias"]) @ p["fc2"] + p["fc2_bias"]
        x = layer_norm(x, params["final_norm"])
        return x @ params["token_embedding"].T

    return forward


def measure() -> list[dict[str, Any]]:
    """Every variant's HLO bytes under this process's constant pipeline."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import frozenconst

    # Whisper's mask as Hugging Face's Flax port makes it (`make_causal_mask`): booleans.
    mask = np.tril(np.ones((N_CTX, N_CTX), bool))[None, None]
    held = frozenconst.FrozenConst(mask)
    struct: Any = jax.ShapeDtypeStruct  # unannotated in jax 0.10
    args = (_param_shapes(), struct((1, TOKENS), np.int32), struct((1, AUDIO_CTX, WIDTH), np.float32))
    made = {
        "numpy": jax.jit(decoder(mask)),
        "jax.Array": jax.jit(decoder(jnp.asarray(mask))),
        "FrozenConst": jax.jit(decoder(held)),
        "frozenconst.jit": frozenconst.jit(decoder(held)),
        "host slice": jax.jit(decoder(held, host_slice=True)),
    }
    return [
        {"variant": name, "hlo_bytes": len(fn.lower(*args).as_text().encode())} for name, fn in made.items()
    ]


def run() -> tuple[list[dict[str, Any]], dict[str, str]]:
    rows: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    for pipeline, flag in PIPELINES.items():
        result = run_worker(
            "benchmarks.static_slices", [pipeline], f"static-slices worker ({pipeline})", pipeline_env(flag)
        )
        env = result["environment"]
        rows += [{**row, "pipeline": pipeline} for row in result["rows"]]
    return rows, env


def table(rows: list[dict[str, Any]]) -> str:
    base = {r["pipeline"]: r["hlo_bytes"] for r in rows if r["variant"] == "numpy"}
    lines = ["| pipeline | mask held as | HLO bytes | x the NumPy original |", "|---|---|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['pipeline']} | {VARIANTS[r['variant']]} | {r['hlo_bytes']:,} "
            f"| {r['hlo_bytes'] / base[r['pipeline']]:.2f}x |"
        )
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]], env: dict[str, str]) -> str:
    intro = (__doc__ or "").split("\n\n", 2)[2].strip()
    return (
        "# Static slices of a large table: a Whisper decoder's causal mask\n\n"
        "Produced by `python -m benchmarks static-slices` on:\n\n"
        + "\n".join(f"- {k}: {v}" for k, v in env.items())
        + f"\n\n{intro}\n\n{table(rows)}\n"
    )


def main(docs: pathlib.Path) -> list[dict[str, Any]]:
    rows, env = run()
    text = markdown(rows, env)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "static-slices-results.md").write_text(text)
    (docs / "static-slices-results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print(text)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        print(json.dumps({"rows": measure(), "environment": environment()}))
    else:
        main(DOCS)
