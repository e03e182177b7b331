"""The derived-copy warning: said once per user line, and costing a loop nothing."""

import gc
import sys
import tracemalloc
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from frozenconst import FrozenConst, FrozenConstWarning


def _growth_per_step(step, state, n=1000):
    """Heap bytes per step that `n` steps of `state = step(state)` leave behind, warmed up first."""
    for _ in range(50):
        state = step(state)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(n):
            state = step(state)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename")) / n


def _tree_map_from_two_helpers():
    def helper_a(tree):
        return jax.tree.map(lambda v: v * 1, tree)

    def helper_b(tree):
        return jax.tree.map(lambda v: v * 1, tree)

    return lambda tree: helper_b(helper_a(tree))


def _two_filter_jit_steps():
    @eqx.filter_jit
    def step_a(model):
        return {"w": model["w"] + 1, "t": model["t"]}

    @eqx.filter_jit
    def step_b(model):
        return {"w": model["w"] * 1, "t": model["t"]}

    return lambda model: step_b(step_a(model))


@pytest.mark.parametrize("loop", [_tree_map_from_two_helpers, _two_filter_jit_steps], ids=["tree.map", "eqx"])
def test_a_loop_rebuilding_a_copy_from_two_lines_keeps_the_heap_flat_as_a_jax_array(loop):
    # A tree holding a copy of a constant (here `jax.tree.map`'s output over it), rebuilt from
    # two lines in turn: a rebuild that walks the stack must keep no references, so the loop's
    # heap grows as with a jax.Array in the copy's place.
    data = np.linspace(0.0, 1.0, 64, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FrozenConstWarning)
        copy = jax.tree.map(lambda v: v + 1, {"t": FrozenConst(data)})["t"]
        assert isinstance(copy, FrozenConst) and not copy.is_concrete
        plain = _growth_per_step(loop(), {"w": jnp.ones(4), "t": jnp.asarray(data) + 1})
        ours = _growth_per_step(loop(), {"w": jnp.ones(4), "t": copy})
    assert ours <= plain + 8, (plain, ours)


def test_each_of_two_lines_rebuilding_a_copy_is_told_once():
    copy = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copy = jax.tree.map(lambda v: v + 1, {"t": FrozenConst(np.ones(8, np.float32))})
        step = _tree_map_from_two_helpers()
        for _ in range(5):
            copy = step(copy)
    told = [w for w in caught if issubclass(w.category, FrozenConstWarning)]
    lines = sorted({w.lineno for w in told})
    # The first map's line, then each helper's line once (they are the lines that called JAX's tree function).
    assert len(told) == len(lines) == 3, [(w.lineno, str(w.message)[:60]) for w in told]


def _nnx_model():
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones(4))
            self.t = nnx.data(FrozenConst(np.arange(4.0, dtype=np.float32)))

    @nnx.jit
    def step(model, x):
        model.w[...] = model.w[...] + x * model.t
        return model.w[...].sum()

    return Model(), step


def test_a_copy_refused_under_the_error_filter_leaves_an_nnx_model_whole():
    # The warning is raised from inside flax's graph rebuild, which empties the module first:
    # raised there, it must leave the module whole, so that later calls still run.
    model, step = _nnx_model()
    reference, reference_step = _nnx_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FrozenConstWarning)
        for _ in range(3):
            reference_step(reference, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)
        for _ in range(3):
            with pytest.raises(FrozenConstWarning, match="put a copy of FrozenConst"):
                step(model, 1.0)  # raised every time it would be said, at this line
            assert {"w", "t"} <= set(vars(model))
    np.testing.assert_array_equal(np.asarray(model.w[...]), np.asarray(reference.w[...]))
    np.testing.assert_array_equal(np.asarray(model.t), np.arange(4.0))
    assert sys.gettrace() is None  # the deferral's tracing is gone


def test_under_the_error_filter_a_copy_raises_every_time_at_the_users_line():
    # Said (raised) each time; told is recorded only once the warning was shown.
    tree = {"t": FrozenConst(np.ones(8, np.float32))}
    raised = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)
        for _ in range(3):
            try:
                jax.tree.map(lambda v: v + 1, tree)
            except FrozenConstWarning as err:
                raised.append(err.__traceback__.tb_lineno)
    assert len(raised) == 3 and len(set(raised)) == 1, raised
    with warnings.catch_warnings(record=True) as caught:  # then shown once, and silent after
        warnings.simplefilter("default", FrozenConstWarning)
        for _ in range(3):
            jax.tree.map(lambda v: v + 1, tree)
    assert len([w for w in caught if issubclass(w.category, FrozenConstWarning)]) == 1


def test_where_a_tracer_is_set_the_error_is_raised_at_once():
    # A debugger's or coverage's tracer is left alone: the warning raises where it is said.
    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FrozenConstWarning)
            with pytest.raises(FrozenConstWarning):
                jax.tree.map(lambda v: v + 1, {"t": FrozenConst(np.ones(8, np.float32))})
    finally:
        sys.settrace(previous)


@pytest.mark.parametrize("where", ["eager", "jax.jit", "frozenconst.jit"])
def test_jax_debug_print_shows_a_constants_values_as_a_jax_arrays(where, capsys):
    # The printed arguments are rebuilt from the values the program printed; those are the
    # values to show, not copies of the constant to warn of.
    import frozenconst

    data = np.arange(3.0, dtype=np.float32)
    shown = {}
    for kind, value in (("array", jnp.asarray(data)), ("frozen", FrozenConst(data))):

        def show(value=value):
            jax.debug.print("{c} {n}", c=value, n={"t": value})

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning at all, as for a jax.Array
            {"eager": show, "jax.jit": jax.jit(show), "frozenconst.jit": frozenconst.jit(show)}[where]()
            jax.effects_barrier()
        shown[kind] = capsys.readouterr().out
    assert shown["frozen"] == shown["array"] and "[0. 1. 2.]" in shown["frozen"], shown


def test_jax_debug_callback_receives_arrays_where_the_constants_were():
    got = []
    jax.debug.callback(lambda tree: got.append(type(tree["t"])), {"t": FrozenConst(np.ones(2, np.float32))})
    jax.effects_barrier()
    assert got == [type(jnp.ones(2))]


@pytest.mark.parametrize("callback", ["jax.pure_callback", "io_callback"])
@pytest.mark.parametrize("where", ["eager", "jax.jit", "frozenconst.jit"])
def test_a_callback_receives_a_constants_values_as_it_receives_a_jax_arrays(callback, where):
    # The callback's arguments are rebuilt from the values the program passed it: those are the
    # values the callback asked for, not copies of the constant to warn of.
    from jax.experimental import io_callback

    import frozenconst

    data = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    got = {}
    for kind, value in (("array", jnp.asarray(data)), ("frozen", FrozenConst(data))):
        seen = []

        def receive(tree, scale, seen=seen):
            seen.append((type(tree["t"]), type(scale), np.array(tree["t"])))
            return np.asarray(tree["t"]).sum(dtype=np.float32) * np.asarray(scale)

        def program(scale, value=value, receive=receive):
            out = jax.ShapeDtypeStruct((), jnp.float32)
            if callback == "io_callback":
                return io_callback(receive, out, {"t": value}, scale)
            return jax.pure_callback(receive, out, {"t": value}, scale)

        run = {"eager": program, "jax.jit": jax.jit(program), "frozenconst.jit": frozenconst.jit(program)}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning at all, as for a jax.Array
            result = run[where](jnp.float32(2.0))
        got[kind] = (float(result), seen)
    (array_result, array_seen), (frozen_result, frozen_seen) = got["array"], got["frozen"]
    assert frozen_result == array_result == 30.0
    assert [s[:2] for s in frozen_seen] == [s[:2] for s in array_seen]  # the types a jax.Array gets
    np.testing.assert_array_equal(frozen_seen[0][2], data)
