"""What a FrozenConst costs under the training idioms, and why it is a one-leaf pytree.

    python -m benchmarks training            # 64 MiB table for the steps
    python -m benchmarks training --quick    # 4 MiB

Two parts, each in one process per constant pipeline:

- **The pytree choice** (issue #25). Three stand-in types with `__jax_array__`
  and the registrations a FrozenConst could have: one leaf and no auxiliary
  data (frozenconst's), no leaf (the constant in the auxiliary data), and one
  leaf with the constant's identity in the auxiliary data. For each: the
  program `jnp.dot` compiles eagerly for a 1 MiB constant (HLO bytes), the
  compilations for 8 constants of one shape (eager `jnp.dot` and a `jax.jit`
  function taking them as arguments), and the per-call time of that function
  against frozenconst's choice, interleaved rounds.
- **Derived copies**: a jitted optax step returning 26 small constants, each rebuilt as a
  FrozenConst every step, against `jax.Array`s and the one-slot pytree type (issue #35).
- **Training steps** with a large table in the model (`nnx.data`), timed per
  step (medians of interleaved rounds, each batch of steps waited for): the
  flax NNX tutorial step (`nnx.Optimizer(wrt=nnx.Param)`, `nnx.jit`) without
  the table, with a FrozenConst, with a plain `jax.Array` (what NNX costs any
  array held as data: the floor), and the recipe of docs/training.md
  (`nnx.split` once, `jax.jit` returning only the Variables) with a FrozenConst;
  and an equinox step returning the whole model under `eqx.filter_jit` (with a
  FrozenConst and with a plain `jax.Array`, the floor: `jax.jit` hands back an
  unchanged input as a new buffer) and under `frozenconst.filter_jit`.
"""

from __future__ import annotations

import functools
import json
import logging
import pathlib
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ._harness import PIPELINES, pipeline_env, run_worker

CHOICES = {
    "one leaf, no aux (frozenconst)": "leaf",
    "no leaf (constant in aux)": "leafless",
    "one leaf, identity in aux": "keyed",
}


def _stand_ins() -> dict[str, type]:
    import jax
    import jax.numpy as jnp

    class Key:
        __slots__ = ("obj",)

        def __init__(self, obj: Any) -> None:
            self.obj = obj

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Key) and other.obj is self.obj

        def __hash__(self) -> int:
            return id(self.obj)

    def make(name: str) -> type:
        class Const:
            __slots__ = ("array", "key")

            def __init__(self, data: Any) -> None:
                self.array = jnp.asarray(data)
                self.key = Key(self)

            def __jax_array__(self) -> Any:
                return self.array

            @property
            def shape(self) -> Any:
                return self.array.shape

            @property
            def dtype(self) -> Any:
                return self.array.dtype

        Const.__name__ = name
        return Const

    leaf, leafless, keyed = make("Leaf"), make("Leafless"), make("Keyed")
    jax.tree_util.register_pytree_node(leaf, lambda c: ((c.array,), None), lambda _, ch: _rebuild(leaf, ch))
    jax.tree_util.register_pytree_node(leafless, lambda c: ((), c.key), lambda k, _: k.obj)
    jax.tree_util.register_pytree_node(
        keyed, lambda c: ((c.array,), c.key), lambda k, ch: _rebuild(keyed, ch)
    )
    return {"leaf": leaf, "leafless": leafless, "keyed": keyed}


def _rebuild(cls: type, children: Any) -> Any:
    out: Any = object.__new__(cls)
    out.array = children[0]
    out.key = None
    return out


class _Compiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Finished XLA compilation" in record.getMessage():
            self.count += 1


def _choice_rows(quick: bool) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    kinds = _stand_ins()
    rng = np.random.default_rng(0)
    shape = (512, 512)  # 1 MiB of float32
    w = jnp.ones((shape[1], 4), jnp.float32)
    handler = _Compiles()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    jax.config.update("jax_log_compiles", True)  # type: ignore[no-untyped-call,unused-ignore]
    logger.setLevel(logging.WARNING)
    rows = []
    calls: dict[str, Callable[[], Any]] = {}
    for label, kind in CHOICES.items():
        cls = kinds[kind]
        consts = [cls(rng.standard_normal(shape).astype(np.float32)) for _ in range(8)]
        hlo = len(jax.jit(jnp.dot).lower(consts[0], w).as_text())
        handler.count = 0
        for c in consts:
            jnp.dot(c, w).block_until_ready()
        eager = handler.count
        f = jax.jit(lambda c, w: jnp.asarray(c)[0, 0] + w[0, 0])
        handler.count = 0
        for c in consts:
            f(c, w).block_until_ready()
        as_argument = handler.count
        calls[label] = functools.partial(f, consts[0], w)
        rows.append(
            {
                "choice": label,
                "eager_hlo_bytes": hlo,
                "eager_compiles_8_constants": eager,
                "jit_argument_compiles_8_constants": as_argument,
            }
        )
    jax.config.update("jax_log_compiles", False)  # type: ignore[no-untyped-call,unused-ignore]
    logger.removeHandler(handler)
    times = _interleaved(calls, n=200, rounds=9 if quick else 21)
    base = "one leaf, no aux (frozenconst)"
    for row in rows:
        label = str(row["choice"])
        row["jit_argument_call_us"] = times[label]["us"]
        row["jit_argument_call_ratio"] = times[label]["ratio_to"][base]
    return rows


def _interleaved(calls: dict[str, Callable[[], Any]], n: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Per-call medians over rounds in shuffled order, each batch waited for; per-round ratios."""

    names = list(calls)
    for fn in calls.values():
        _wait(fn())
    per: dict[str, list[float]] = {k: [] for k in names}
    order = random.Random(0)
    for _ in range(rounds):
        order.shuffle(names)
        for k in names:
            fn = calls[k]
            start = time.perf_counter()
            out = [fn() for _ in range(n)]
            _wait(out)
            per[k].append((time.perf_counter() - start) / n)
            del out
    result: dict[str, dict[str, Any]] = {}
    for k in calls:
        result[k] = {
            "us": statistics.median(per[k]) * 1e6,
            "ratio_to": {
                b: statistics.median(a / c for a, c in zip(per[k], per[b], strict=True)) for b in calls
            },
        }
    return result


def _wait(out: Any) -> None:
    import jax

    jax.block_until_ready(out)  # type: ignore[no-untyped-call,unused-ignore]  # unannotated in jax 0.10


def _step_rows(mib: float, quick: bool) -> list[dict[str, Any]]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax  # type: ignore[import-untyped,unused-ignore]
    from flax import nnx

    import frozenconst

    rows_n = int(mib * 2**20 / 4 / 64)
    data = np.random.default_rng(1).standard_normal((rows_n, 64)).astype(np.float32)
    x = jnp.ones((8, 64), jnp.float32)

    class Net(nnx.Module):
        def __init__(self, table: Any, rngs: nnx.Rngs) -> None:
            self.pos = nnx.data(table)
            self.lin = nnx.Linear(64, 4, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            h = x if self.pos is None else x + self.pos[:8]
            return self.lin(h)

    def tutorial(table: Any) -> Callable[[], Any]:
        net = Net(table, nnx.Rngs(0))
        opt = nnx.Optimizer(net, optax.adamw(1e-3, weight_decay=0.1), wrt=nnx.Param)

        @nnx.jit
        def step(net: Any, opt: Any, x: Any) -> Any:
            loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(net)
            opt.update(net, grads)
            return loss

        return lambda: step(net, opt, x)

    def recipe(table: Any) -> Callable[[], Any]:
        net = Net(table, nnx.Rngs(0))
        opt = nnx.Optimizer(net, optax.adamw(1e-3, weight_decay=0.1), wrt=nnx.Param)
        graphdef, state = nnx.split((net, opt))

        @jax.jit
        def step(state: Any, x: Any) -> Any:
            net, opt = nnx.merge(graphdef, state)
            grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(net)
            opt.update(net, grads)
            return nnx.state((net, opt), nnx.Variable)

        holder = {"state": state}

        def call() -> Any:
            out = step(holder["state"], x)
            nnx.update((net, opt), out)
            holder["state"] = nnx.state((net, opt))
            return out

        return call

    class Model(eqx.Module):
        emb: Any
        lin: eqx.nn.Linear

        def __call__(self, x: Any) -> Any:
            return jax.vmap(self.lin)(x if self.emb is None else x + self.emb[:8])

    def eqx_step(jit: Callable[..., Any], table: Any) -> Callable[[], Any]:
        model = Model(table, eqx.nn.Linear(64, 4, key=jax.random.key(0)))
        params, _ = eqx.partition(model, frozenconst.is_trainable, is_leaf=frozenconst.is_frozen)
        opt = optax.adamw(1e-3, weight_decay=0.1)
        holder = {"model": model, "opt": opt.init(params)}

        @jit
        def step(model: Any, opt_state: Any, x: Any) -> Any:
            params, static = eqx.partition(model, frozenconst.is_trainable, is_leaf=frozenconst.is_frozen)
            grads = eqx.filter_grad(lambda p: jnp.sum(eqx.combine(p, static)(x) ** 2))(params)
            updates, opt_state = opt.update(grads, opt_state, params)
            return eqx.combine(eqx.apply_updates(params, updates), static), opt_state

        def call() -> Any:
            holder["model"], holder["opt"] = step(holder["model"], holder["opt"], x)
            return holder["opt"]

        return call

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tutorial step's derived copies warn: that is measured here
        table = frozenconst.FrozenConst(data)
        kinds: dict[str, Callable[[Any], Callable[[], Any]]] = {
            "nnx tutorial step (`nnx.jit`)": tutorial,
            "nnx recipe (split once, `jax.jit`, Variables out)": recipe,
            "eqx step returning the model, `eqx.filter_jit`": functools.partial(eqx_step, eqx.filter_jit),
            "eqx step returning the model, `frozenconst.filter_jit`": functools.partial(
                eqx_step, frozenconst.filter_jit
            ),
        }
        calls: dict[str, Callable[[], Any]] = {}
        twins: dict[str, str] = {}
        for kind, make in kinds.items():
            calls[f"{kind}, no table"] = make(None)
            for held, value in (("FrozenConst", table), ("jax.Array", jnp.asarray(data))):
                # A `jax.Array` in the same place: the framework's own cost of an array it
                # hands back every step (`jax.jit` returns an unchanged input as a new
                # buffer), the floor for the steps that return the whole model.
                if held == "jax.Array" and not kind.startswith(
                    ("nnx tutorial", "eqx step returning the model, `eqx")
                ):
                    continue
                calls[f"{kind}, {held}"] = make(value)
                twins[f"{kind}, {held}"] = f"{kind}, no table"
        times = _interleaved(calls, n=5 if quick else 10, rounds=7 if quick else 15)
    # Each step against the same step without the table, per round: what the table costs it.
    return [
        {"step": k, "mib": mib, "ms": times[k]["us"] / 1e3, "ratio_to_no_table": times[k]["ratio_to"][base]}
        for k, base in twins.items()
    ]


class _OneSlot:
    """The floor of any array type that is a pytree node: one slot, a Python flatten and
    unflatten, nothing else (what every FrozenConst rebuilt from a step's output costs at least)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __jax_array__(self) -> Any:
        return self.array


@functools.cache
def one_slot() -> type[_OneSlot]:
    """The one-slot type, a pytree node from the first call on (registered once: JAX refuses a
    type registered twice): this section's floor, and the fine-tuning section's."""
    import jax

    jax.tree_util.register_pytree_node(_OneSlot, lambda c: ((c.array,), None), lambda _, ch: _OneSlot(ch[0]))
    return _OneSlot


def _derived_rows(quick: bool) -> list[dict[str, Any]]:
    """A jitted optax step over a params dict holding 26 small constants, which it returns (so
    each comes back as a derived copy every step, issue #35): FrozenConsts against the same
    step with `jax.Array`s in their place, and with the one-slot type (the floor)."""
    import jax
    import jax.numpy as jnp
    import optax  # type: ignore[import-untyped,unused-ignore]

    import frozenconst

    one_slot()
    rng = np.random.default_rng(0)
    data = {f"c{i}": rng.standard_normal((8 + i % 5, 4 + i % 3)).astype(np.float32) for i in range(26)}

    def is_const(x: Any) -> bool:
        return isinstance(x, (frozenconst.FrozenConst, _OneSlot))

    def make(wrap: Callable[[np.ndarray[Any, Any]], Any]) -> Callable[[], Any]:
        consts = {k: wrap(v) for k, v in data.items()}
        params = {"w": jnp.ones((8, 4), jnp.float32), "consts": consts}
        labels = {"w": "train", "consts": jax.tree.map(lambda _: "frozen", consts, is_leaf=is_const)}
        opt = optax.multi_transform({"train": optax.adam(1e-3), "frozen": optax.set_to_zero()}, labels)
        holder = {"params": params, "state": opt.init(params)}

        def loss(p: Any) -> Any:
            return jnp.sum(p["w"] ** 2) + sum(jnp.sum(jnp.asarray(c)) for c in p["consts"].values())

        @jax.jit
        def step(params: Any, state: Any) -> Any:
            grads = jax.grad(loss)(params)
            updates, state = opt.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        def call() -> Any:
            holder["params"], holder["state"] = step(holder["params"], holder["state"])
            return holder["state"]

        return call

    calls = {
        "jax.Array": make(jnp.asarray),
        "one-slot type (the floor)": make(lambda v: _OneSlot(jnp.asarray(v))),
        "FrozenConst": make(frozenconst.FrozenConst),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the derived copies' one warning: what is measured is the step
        times = _interleaved(calls, n=50 if quick else 200, rounds=9 if quick else 21)
    return [
        {
            "step": f"optax step returning 26 constants, {kind}",
            "us": times[kind]["us"],
            "ratio_to_array": times[kind]["ratio_to"]["jax.Array"],
            "ratio_to_floor": times[kind]["ratio_to"]["one-slot type (the floor)"],
        }
        for kind in calls
    ]


def _worker(quick: bool) -> None:
    import jax

    mib = 4.0 if quick else 64.0
    out = {
        "choices": _choice_rows(quick),
        "steps": _step_rows(mib, quick),
        "derived": _derived_rows(quick),
        "jax": jax.__version__,
    }
    print(json.dumps(out))


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[1] for c in columns) + " |"
    rule = "|" + "|".join("---" if c[2] == "s" else "---:" for c in columns) + "|"
    body = [
        "| " + " | ".join(f"{r[key]:{fmt}}" if fmt != "s" else str(r[key]) for key, _, fmt in columns) + " |"
        for r in rows
    ]
    return "\n".join([head, rule, *body])


def summary(results: dict[str, Any], env: dict[str, str]) -> str:
    """The figures docs/training.md quotes: per step, against the step without the table; `env`
    (`_harness.environment()`) stamps them, as every file under docs/results/ is stamped."""
    out = [
        "| step, per pipeline | " + " | ".join(f"{p} pipeline" for p in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    steps = [r["step"] for r in next(iter(results.values()))["steps"]]
    for step in steps:
        cells = []
        for result in results.values():
            row = next(r for r in result["steps"] if r["step"] == step)
            cells.append(f"{row['ms']:.2f} ms ({row['ratio_to_no_table']:.2f}x)")
        mib = next(iter(results.values()))["steps"][0]["mib"]
        out.append(f"| {step} | " + " | ".join(cells) + " |")
    out.append(
        f"\nPer step with a {mib:.0f} MiB table held as data, medians of interleaved rounds; in "
        "brackets the ratio to the same step without the table (per round, then the median). "
        "A `jax.Array` in the FrozenConst's place (`nnx.data` under `nnx.jit`, a model field under "
        "`eqx.filter_jit`) is what that jit costs any array held as data and returned: the floor."
    )
    out += [
        "",
        "| derived copies, per pipeline | " + " | ".join(f"{p} pipeline" for p in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for i, row in enumerate(next(iter(results.values()))["derived"]):
        cells = [
            f"{r['derived'][i]['us']:.0f} µs ({r['derived'][i]['ratio_to_array']:.2f}x, "
            f"{r['derived'][i]['ratio_to_floor']:.2f}x)"
            for r in results.values()
        ]
        out.append(f"| {row['step']} | " + " | ".join(cells) + " |")
    out.append(
        "\nA jitted optax step (`multi_transform`, `set_to_zero` for the constants) over a params dict "
        "holding 26 small constants, which it returns: each comes back as a new array every step, "
        "rebuilt as a FrozenConst (a derived copy). In brackets the ratio to the same step with "
        "`jax.Array`s in their place, then to the one-slot pytree type (the floor for any array type "
        "that is a pytree node), per round, then the median."
    )
    out.append(
        f"\nMeasured {env['date']} on {env['cpu']} ({env['machine']}, {env['memory']}): frozenconst "
        f"{env['frozenconst']}, python {env['python']}, jax {env['jax']}, jaxlib {env['jaxlib']}, "
        f"numpy {env['numpy']}, backend {env['backend']} (`python -m benchmarks training`, "
        "whose full tables are in `training-results.md`)."
    )
    return "\n".join(out)


def main(quick: bool, docs: pathlib.Path) -> None:
    from ._harness import environment

    results = {}
    for pipeline, flag in PIPELINES.items():
        results[pipeline] = run_worker(
            "benchmarks.training",
            ["--quick"] if quick else [],
            f"training ({pipeline})",
            env=pipeline_env(flag),
        )
    env = environment()
    lines = [
        "# Benchmark results: the training idioms",
        "",
        f"Produced by `python -m benchmarks training{' --quick' if quick else ''}` on:",
        "",
        "\n".join(f"- {k}: {v}" for k, v in env.items()),
        "",
    ]
    for pipeline, result in results.items():
        lines += [
            f"## The pytree choice, {pipeline} pipeline",
            "",
            _table(
                result["choices"],
                [
                    ("choice", "registration", "s"),
                    ("eager_hlo_bytes", "eager `jnp.dot`, HLO bytes (1 MiB constant)", ",d"),
                    ("eager_compiles_8_constants", "eager `jnp.dot`, compiles for 8 constants", "d"),
                    (
                        "jit_argument_compiles_8_constants",
                        "`jax.jit` argument, compiles for 8 constants",
                        "d",
                    ),
                    ("jit_argument_call_us", "`jax.jit` argument, µs per call", ".1f"),
                    ("jit_argument_call_ratio", "ratio to frozenconst's", ".2f"),
                ],
            ),
            "",
            f"## Training steps, {pipeline} pipeline",
            "",
            _table(
                result["steps"],
                [
                    ("step", "step", "s"),
                    ("mib", "table MiB", ".0f"),
                    ("ms", "ms per step", ".2f"),
                    ("ratio_to_no_table", "ratio to the same step without the table", ".2f"),
                ],
            ),
            "",
            f"## Derived copies, {pipeline} pipeline",
            "",
            _table(
                result["derived"],
                [
                    ("step", "step", "s"),
                    ("us", "µs per step", ".1f"),
                    ("ratio_to_array", "ratio to jax.Array", ".2f"),
                    ("ratio_to_floor", "ratio to the one-slot type", ".2f"),
                ],
            ),
            "",
        ]
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "training-results.md").write_text("\n".join(lines) + "\n")
    (docs / "training-summary.md").write_text(summary(results, env) + "\n")
    stamped = {"environment": env, "pipelines": results}
    (docs / "training-results.json").write_text(json.dumps(stamped, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _worker("--quick" in sys.argv)
