"""The five fine-tuning examples of `examples/finetune/`, as written and with the one freezing line.

Each example runs twice in this process, as its project wrote it and with the one
line that makes its pretrained part FrozenConsts, a few steps each,
and the two runs are compared: the frozen values bitwise, the trained weights and
the losses, the device buffers holding the frozen part's data (`jax.live_arrays()`),
the program's size where the step is a `jax.jit` (`.lower(...).as_text()`), the
warnings each run records, and a checkpoint round trip through the framework's
own checkpointing. Nothing here reads a clock: `python -m benchmarks finetune`
times the steps.

Tests of properties that a fix still to land would give are marked
`xfail(strict=True)` with the fix named (`XFAIL`): they flip when it lands.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pathlib
import tempfile
import warnings
from typing import Any

import jax
import numpy as np
import pytest

import frozenconst
from examples.finetune import host_values, live_copies

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")
pytest.importorskip("orbax.checkpoint")

from flax import nnx

import frozenconst.nnx

STEPS = 3

# (example module, build's arguments): each case runs as written and with the one line.
CASES = {
    "linen": ("linen_transfer", {}),
    "nnx-lora": ("nnx_lora", {"loop": "nnx.jit"}),
    "nnx-lora-functional": ("nnx_lora", {"loop": "functional"}),
    "eqx": ("eqx_frozen_layer", {}),
    "optax-freeze": ("optax_freezing", {"method": "freeze", "size": 8}),
    "optax-selective": ("optax_freezing", {"method": "selective_transform", "size": 8}),
    "optax-masked": ("optax_freezing", {"method": "masked", "size": 8}),
    "optax-partition": ("optax_freezing", {"method": "partition", "size": 8}),
    "captioning": ("nnx_captioning", {}),
}
NNX = {"nnx-lora", "nnx-lora-functional", "captioning"}
OPTAX = ("optax-freeze", "optax-selective", "optax-masked", "optax-partition")

# The fixes these tests wait for, each named once.
# The examples whose step computes and returns every parameter: linen's `TrainState`
# (`apply_gradients` adds the optimizer's zero update to the frozen part too),
# `eqx.filter_jit` returning the model, optax's examples over a params dict. JAX returns
# each output in a new buffer, as it does for a plain array, so after a step the state
# holds derived copies of the constants: with the frozen part's device bytes the
# original's (`test_memory_...`), the framework's own floor (docs: Training).
RETURNS_EVERY_PARAMETER = ("linen", "eqx", *OPTAX)
# Which test of which case waits for which fix. A case and test not listed must pass.
XFAIL: dict[tuple[str, str], str] = {}


def _flax_at_least_012() -> bool:
    return hasattr(nnx, "recursive_map")


# Where a case cannot run in this environment: why, naming the version.
def _skip_reason(case: str) -> str | None:
    if case.startswith("nnx-lora") and not _flax_at_least_012():
        import flax

        return f"the cookbook's LoRA recipe uses nnx.recursive_map, which flax {flax.__version__} lacks"
    return None


@dataclasses.dataclass
class Observed:
    """One run of one example: what it showed, or the error that stopped it."""

    error: BaseException | None = None
    losses: list[float] = dataclasses.field(default_factory=list)
    frozen_before: list[np.ndarray] = dataclasses.field(default_factory=list)
    frozen_after: list[np.ndarray] = dataclasses.field(default_factory=list)
    trainable: list[np.ndarray] = dataclasses.field(default_factory=list)
    live: tuple[int, int] = (0, 0)
    program: str | None = None
    constants_held: int = 0
    frozen_leaves: int = 0
    warnings: list[warnings.WarningMessage] = dataclasses.field(default_factory=list)
    restored: tuple[list[np.ndarray], list[np.ndarray]] | None = None
    checkpoint_error: BaseException | None = None


def _constants_held(tree: Any) -> tuple[int, int]:
    """How many leaves of the frozen part are constants (a FrozenConst holding its own data, or a
    `Frozen` variable holding one), out of how many."""
    held = total = 0
    for leaf in jax.tree.leaves(
        tree, is_leaf=lambda x: isinstance(x, (frozenconst.FrozenConst, nnx.Variable))
    ):
        total += 1
        if isinstance(leaf, frozenconst.nnx.Frozen):
            held += leaf.const is not None
        elif isinstance(leaf, frozenconst.FrozenConst):
            held += leaf.is_concrete
    return held, total


def _frozen_tree(case: str, run: Any) -> Any:
    if case in NNX:
        # The model's variables themselves (not their values): `Frozen` or `nnx.Param`.
        model = run.state["model"]
        if case == "captioning":
            return list(nnx.state(model.encoder, nnx.Any(nnx.Param, frozenconst.nnx.Frozen)).values())
        return [(layer.base_module.kernel, layer.base_module.bias) for layer in model.layers]
    return run.frozen()


def _observe(case: str, freeze: bool) -> Observed:
    name, kwargs = CASES[case]
    module = importlib.import_module(f"examples.finetune.{name}")
    seen = Observed()
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        if name == "linen_transfer":
            # As `import flax` before `import frozenconst` leaves it (the usual order):
            # flax.serialization knows constants, whatever this process imported first.
            frozenconst.register_flax()
        try:
            run = module.build(freeze=freeze, **kwargs)
            seen.frozen_before = host_values(run.frozen())
            for _ in range(STEPS):
                loss = run.step()
                seen.losses.append(float(run.loss() if loss is None else loss))
            # The frozen part's device buffers as the loop leaves them (before the functional
            # loop's `nnx.update`, which `frozen()` and `trainable()` call).
            seen.live = live_copies(seen.frozen_before)
            seen.frozen_after = host_values(run.frozen())
            seen.trainable = host_values(run.trainable())
            seen.constants_held, seen.frozen_leaves = _constants_held(_frozen_tree(case, run))
            if run.lowered is not None:
                seen.program = run.lowered().as_text()
        except Exception as error:  # recorded; the tests that need the run raise it
            seen.error = error
        else:
            try:
                with tempfile.TemporaryDirectory() as directory:
                    frozen, trained = run.checkpoint(pathlib.Path(directory))
                    seen.restored = (host_values(frozen), host_values(trained))
            except Exception as error:
                seen.checkpoint_error = error
            del run
    seen.warnings = list(recorded)
    return seen


_RUNS: dict[tuple[str, bool], Observed] = {}


def _run(case: str, freeze: bool) -> Observed:
    reason = _skip_reason(case)
    if reason:
        pytest.skip(reason)
    if (case, freeze) not in _RUNS:
        _RUNS[case, freeze] = _observe(case, freeze)
    seen = _RUNS[case, freeze]
    if seen.error is not None:
        raise seen.error
    return seen


# The two heaviest (most of a pass's compile time): left out of `make test-fast`.
SLOW = {"linen", "captioning"}


@pytest.fixture(
    params=[pytest.param(case, marks=pytest.mark.slow) if case in SLOW else case for case in CASES]
)
def case(request: pytest.FixtureRequest) -> str:
    test = request.node.originalname.removeprefix("test_").split("_")[0]
    reason = XFAIL.get((request.param, test))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    return str(request.param)


def _close(a: Any, b: Any, exact: bool) -> None:
    for x, y in zip(a, b, strict=True):
        if exact:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def _frozenconst_warnings(seen: Observed) -> list[warnings.WarningMessage]:
    return [w for w in seen.warnings if issubclass(w.category, frozenconst.FrozenConstWarning)]


def test_original_runs_as_written(case):
    """The example as its project wrote it: it trains, leaves its pretrained part bitwise as it
    was, and warns of nothing."""
    seen = _run(case, freeze=False)
    assert np.all(np.isfinite(seen.losses))
    _close(seen.frozen_after, seen.frozen_before, exact=True)
    assert [str(w.message)[:200] for w in seen.warnings] == []


def test_trains_as_the_original_with_the_one_line(case):
    """With the one line: the frozen values bitwise those of the original, the trained weights and
    the losses the original's. Exactly: each step's program computes the trained part as the
    original's does, bitwise on every case and JAX release the suite runs."""
    original, frozen = _run(case, freeze=False), _run(case, freeze=True)
    _close(frozen.frozen_after, original.frozen_before, exact=True)
    _close(frozen.trainable, original.trainable, exact=True)
    assert frozen.losses == original.losses


def test_memory_of_the_frozen_part_is_the_originals(case):
    """After the steps, the device buffers holding the frozen part's data (whoever holds them:
    the model, the loop's state, a derived copy, a constant's cache) are no more than the
    original's, by `jax.live_arrays()`."""
    original, frozen = _run(case, freeze=False), _run(case, freeze=True)
    assert original.live[0] > 0
    assert frozen.live[1] <= original.live[1], (frozen.live, original.live)


def test_program_of_the_step_is_no_bigger(case):
    """The step's program with the frozen part as FrozenConsts is no bigger than the original's:
    the constants are its arguments, never embedded (either constant pipeline). Where the
    program should be the same (the NNX examples: the frozen part was never differentiated),
    it is the same, character for character."""
    original, frozen = _run(case, freeze=False), _run(case, freeze=True)
    if original.program is None:
        pytest.skip("the example's jit has no `.lower` here")
    assert frozen.program is not None
    frozen_bytes = sum(v.nbytes for v in original.frozen_before)
    assert len(frozen.program) < len(original.program) + min(2000, frozen_bytes), (
        len(frozen.program),
        len(original.program),
    )
    if case in NNX:
        assert frozen.program == original.program


def test_warnings_once_per_line_at_most_600_characters(case):
    """What the one line makes the example warn: a `Frozen` variable (NNX) nothing at all; a
    FrozenConst rebuilt around a copy, once per line of user code, each message at most 600
    characters."""
    frozen = _run(case, freeze=True)
    found = _frozenconst_warnings(frozen)
    assert [str(w.message)[:200] for w in frozen.warnings if w not in found] == []
    if case in NNX:
        assert found == []
    per_line: dict[tuple[str, int], int] = {}
    for w in found:
        per_line[w.filename, w.lineno] = per_line.get((w.filename, w.lineno), 0) + 1
    assert all(n == 1 for n in per_line.values()), per_line
    assert max((len(str(w.message)) for w in found), default=0) <= 600


def test_constants_still_held_after_the_steps(case):
    """After the steps the example's state still holds the constants themselves (one buffer each,
    the constant's own), not copies of them: NNX's `Frozen` variables keep them whatever `nnx.jit`
    writes back. A step that computes and returns every parameter (`RETURNS_EVERY_PARAMETER`)
    gets each back in a new buffer from JAX, the constants as copies, at the original's device
    bytes: the framework's floor, which a plain array costs too."""
    frozen = _run(case, freeze=True)
    assert frozen.frozen_leaves > 0
    if case in RETURNS_EVERY_PARAMETER:
        assert frozen.constants_held == 0, (frozen.constants_held, frozen.frozen_leaves)
        return
    assert frozen.constants_held == frozen.frozen_leaves, (frozen.constants_held, frozen.frozen_leaves)


def test_checkpoint_round_trip(case):
    """The framework's own checkpointing, as the example (or its framework's docs) writes it,
    saves and restores the frozen part bitwise and the trained part exactly."""
    frozen = _run(case, freeze=True)
    if frozen.checkpoint_error is not None:
        raise frozen.checkpoint_error
    assert frozen.restored is not None
    restored_frozen, restored_trained = frozen.restored
    _close(restored_frozen, frozen.frozen_after, exact=True)
    _close(restored_trained, frozen.trainable, exact=True)


@pytest.mark.parametrize("name", sorted({name for name, _ in CASES.values()}))
def test_each_example_differs_by_one_line(name):
    """`freeze=True` adds one line to the example: the line after the only `# the one line:` comment,
    in `build` (or in the function `build` calls to make the model)."""
    lines = inspect.getsource(importlib.import_module(f"examples.finetune.{name}")).splitlines()
    marked = [i for i, line in enumerate(lines) if line.strip() == "# the one line:"]
    assert len(marked) == 1, marked
    # The statement after it, however the formatter wrapped it: up to balanced brackets.
    statement, depth = "", 0
    for line in lines[marked[0] + 1 :]:
        statement += line.strip()
        depth += sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
        if depth == 0:
            break
    assert "FrozenConst" in statement or "frozenconst.nnx.freeze(" in statement, statement
