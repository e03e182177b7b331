"""`frozenconst.nnx`: a `Frozen` variable holding a FrozenConst, and `freeze`.

What NNX's own modules, `jnp`, `nnx.Optimizer`, `nnx.grad`, `nnx.jit` (each of its modes),
the performance guide's functional loop and orbax checkpointing do with a module whose
pretrained part `freeze` made constants; and what a FrozenConst put straight into an
`nnx.Param` does, for the docs. Observed through JAX: `jax.live_arrays()`, buffer
addresses, the lowered program's results.
"""

from __future__ import annotations

import copy
import gc
import inspect
import pickle
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TIMEOUT_S, run_bounded, subprocess_env

import frozenconst

flax = pytest.importorskip("flax")
nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

import frozenconst.nnx as fnnx  # noqa: E402 - after the skips
from frozenconst.nnx import Frozen, freeze  # noqa: E402

# nnx.jit's modes: the default (graph mode, every variable written back), and the two that
# write back only the variables a step changed (flax 0.12 and later).
JIT_MODES = {"graph": {}}
if "graph_updates" in inspect.signature(nnx.jit).parameters:
    JIT_MODES |= {"graph_updates=False": {"graph_updates": False}, "graph=False": {"graph": False}}


def _mode(mode):
    """`nnx.jit`'s keyword arguments for `mode`, or a skip where this flax fails it for plain
    parameters too."""
    version = tuple(int(p) for p in flax.__version__.split(".")[:3])
    if mode == "graph=False" and version < (0, 12, 8):
        pytest.skip(
            f"flax {flax.__version__}'s tree-mode nnx.jit (graph=False) fails on a module with "
            "None attributes (nnx.MultiHeadAttention's cache fields), plain nnx.Params too: "
            "ValueError 'Expected None, got Mask()'"
        )
    return JIT_MODES[mode]


class Net(nnx.Module):
    """A pretrained encoder (convolution, embedding, norm, attention, linear) and a head trained on top."""

    def __init__(self, rngs):
        self.encoder = Encoder(rngs)
        self.head = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, image, tokens):
        return self.head(self.encoder(image, tokens).mean(axis=1))


class Encoder(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 8, kernel_size=(2, 2), strides=(2, 2), rngs=rngs)
        self.embed = nnx.Embed(16, 8, rngs=rngs)
        self.cls_token = nnx.Param(jax.random.normal(rngs.params(), (1, 1, 8)))
        self.norm = nnx.LayerNorm(8, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=8, decode=False, rngs=rngs)
        self.linear = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, image, tokens):
        patches = self.conv(image).reshape(image.shape[0], -1, 8)
        x = jnp.concatenate(
            [jnp.tile(self.cls_token, [image.shape[0], 1, 1]), patches + self.embed(tokens)], 1
        )
        return self.linear(self.attn(self.norm(x)))


IMAGE = jnp.ones((2, 4, 4, 3))
TOKENS = jnp.arange(8).reshape(2, 4)


def _net():
    return Net(nnx.Rngs(0))


def _frozen_values(net):
    return {
        path: np.array(v.get_raw_value() if hasattr(v, "get_raw_value") else v.raw_value)
        for path, v in _vars(net)
    }


def _vars(node):
    return [(path, v) for path, v in nnx.iter_graph(node) if isinstance(v, Frozen)]


def _consts(node):
    """Each `Frozen` variable's constant, as the device buffer it is cached as: a handle on the
    same constant shares it (`jnp.asarray(c)` is the one cached `jax.Array`)."""
    return {path: jnp.asarray(v.const) for path, v in _vars(node)}


def _same(a, b):
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def _buffers_of(values):
    """Distinct live device buffers holding one of `values` (by address)."""
    gc.collect()
    found = set()
    for a in jax.live_arrays():
        if a.is_deleted() or a.dtype != np.float32:
            continue
        host = np.asarray(a)
        if any(host.shape == v.shape and np.array_equal(host, v) for v in values):
            found.add(a.unsafe_buffer_pointer())
    return found


def _step(jit_kwargs=None, wrt=nnx.Param):
    def body(net, optimizer, image, tokens):
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(image, tokens) ** 2))(net)
        optimizer.update(net, grads)
        return loss

    return nnx.jit(body, **(jit_kwargs or {}))


def test_freeze_makes_every_parameter_of_the_submodule_a_constant_and_leaves_the_rest():
    net = _net()
    before = {path: np.array(v[...]) for path, v in nnx.iter_graph(net.encoder) if isinstance(v, nnx.Param)}
    assert freeze(net.encoder) is net.encoder
    frozen = dict(_vars(net.encoder))
    assert set(frozen) == set(before)
    for path, variable in frozen.items():
        assert isinstance(variable.const, frozenconst.FrozenConst) and variable.const.is_concrete
        np.testing.assert_array_equal(np.asarray(variable.const), before[path])
        # NNX sees the constant's own cached device buffer.
        assert variable[...] is jnp.asarray(variable.const)
    assert isinstance(net.head.kernel, nnx.Param) and not isinstance(net.head.kernel, Frozen)
    assert not isinstance(net.encoder.norm.scale, nnx.Param)


def test_nnx_modules_and_jnp_run_on_frozen_variables_as_on_parameters():
    """nnx.Conv, nnx.Embed, nnx.LayerNorm, nnx.MultiHeadAttention, nnx.Linear and `jnp.tile` of a
    variable (the captioning tutorial's `cls_token`): the same outputs, bitwise, eager and jitted."""
    net = _net()
    expected = net(IMAGE, TOKENS)
    jitted = nnx.jit(lambda m: m(IMAGE, TOKENS))(net)
    freeze(net.encoder)
    np.testing.assert_array_equal(net(IMAGE, TOKENS), expected)
    np.testing.assert_array_equal(nnx.jit(lambda m: m(IMAGE, TOKENS))(net), jitted)
    token = net.encoder.cls_token
    np.testing.assert_array_equal(jnp.tile(token, [2, 1, 1])[1], token.const[0])
    np.testing.assert_array_equal(token + 1, np.asarray(token.const) + 1)
    assert jnp.asarray(token) is jnp.asarray(token.const)
    assert token.shape == (1, 1, 8)


def test_optimizer_gradients_and_path_filters_leave_frozen_variables_out():
    net = freeze(_net(), nnx.PathContains("encoder"))
    assert jax.tree.leaves(nnx.state(net, nnx.Param)) == jax.tree.leaves(nnx.state(net.head, nnx.Param))
    grads = nnx.grad(lambda m: jnp.sum(m(IMAGE, TOKENS) ** 2))(net)
    assert jax.tree.leaves(nnx.state(grads, Frozen)) == []
    tutorial = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("encoder")))
    for wrt in (nnx.Param, tutorial):
        optimizer = nnx.Optimizer(net, optax.adamw(1e-2, weight_decay=0.1), wrt=wrt)
        n_state = len(jax.tree.leaves(optimizer.opt_state))
        step = _step(wrt=wrt)
        for _ in range(2):  # a FrozenConst in an nnx.Param fails at the second step
            step(net, optimizer, IMAGE, TOKENS)
        assert len(jax.tree.leaves(optimizer.opt_state)) == n_state


@pytest.mark.parametrize("mode", list(JIT_MODES))
def test_nnx_jit_steps_keep_one_device_buffer_per_constant(mode):
    """Across nnx.jit steps the model keeps each constant and its one device buffer. Under the
    default mode NNX returns every variable and JAX returns it in a new buffer (a plain
    `nnx.Param` gets a new buffer each step: the floor); a `Frozen` variable drops that copy.
    Under `graph_updates=False` and `graph=False` the program returns no frozen variable."""
    net = freeze(_net(), nnx.PathContains("encoder"))
    optimizer = nnx.Optimizer(net, optax.adam(1e-2), wrt=nnx.Param)
    variables = dict(_vars(net))
    consts = {path: v.const for path, v in variables.items()}
    values = [np.array(c) for c in consts.values()]
    addresses = {path: v[...].unsafe_buffer_pointer() for path, v in variables.items()}
    step = _step(_mode(mode))
    losses = [float(step(net, optimizer, IMAGE, TOKENS)) for _ in range(3)]
    assert losses[2] < losses[0]
    for path, variable in _vars(net):
        assert variable is variables[path] and variable.const is consts[path]
        assert variable[...].unsafe_buffer_pointer() == addresses[path]
    assert _buffers_of(values) == set(addresses.values())
    program = step.lower(net, optimizer, IMAGE, TOKENS).as_text()
    results = program.split("->", 1)[1].split("{\n", 1)[0]
    frozen_results = results.count("tensor<16x8xf32>")  # the embedding table, the only such shape
    assert frozen_results == (1 if mode == "graph" else 0)


@pytest.mark.parametrize("mode", list(JIT_MODES))
def test_the_floor_a_plain_parameter_left_out_by_the_filter(mode):
    """The same step with the encoder's parameters left `nnx.Param`s and out of `wrt=`: under the
    default mode each step hands back a new buffer of each (the copy `Frozen` drops)."""
    wrt = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("encoder")))
    net = _net()
    optimizer = nnx.Optimizer(net, optax.adam(1e-2), wrt=wrt)

    def body(net, optimizer, image, tokens):
        grads = nnx.grad(lambda m: jnp.sum(m(image, tokens) ** 2), argnums=nnx.DiffState(0, wrt))(net)
        optimizer.update(net, grads)

    step = nnx.jit(body, **_mode(mode))
    held = []  # each step's buffer kept alive: a freed one's address may be reused by the next
    for _ in range(3):
        step(net, optimizer, IMAGE, TOKENS)
        held.append(net.encoder.embed.embedding[...])
    addresses = {array.unsafe_buffer_pointer() for array in held}
    assert len(addresses) == (3 if mode == "graph" else 1)


def test_the_performance_guides_functional_loop_closes_with_the_constants():
    """nnx.split once, a jax.jit step returning `nnx.state(...)`, `nnx.update` after the loop: the
    closing update keeps each constant (no "immutable node" error, no copy taken)."""
    net = freeze(_net(), nnx.PathContains("encoder"))
    optimizer = nnx.Optimizer(net, optax.adam(1e-2), wrt=nnx.Param)
    consts = _consts(net)
    graphdef, state = nnx.split((net, optimizer))

    @jax.jit
    def jax_train_step(graphdef, state, image, tokens):
        net, optimizer = nnx.merge(graphdef, state)
        grads = nnx.grad(lambda m: jnp.sum(m(image, tokens) ** 2))(net)
        optimizer.update(net, grads)
        return nnx.state((net, optimizer))

    head = np.array(net.head.kernel[...])
    for _ in range(2):
        state = jax_train_step(graphdef, state, IMAGE, TOKENS)
    nnx.update((net, optimizer), state)
    assert _same(_consts(net), consts)
    assert not np.array_equal(np.array(net.head.kernel[...]), head)


@pytest.mark.skipif(not hasattr(nnx.Variable, "_new"), reason="flax 0.11 makes variables without `_new`")
def test_a_rebuilt_frozen_variable_holds_its_value_without_an_error_raised_and_caught():
    """A pytree rebuild (each step of the functional loop, a jitted step's outputs) makes a
    `Frozen` variable with `object.__new__` and writes its value at once: that write reads no
    unset slot (an AttributeError raised and caught, a cost on every rebuild), and the
    variable holds what it was given."""
    variable = Frozen(frozenconst.FrozenConst(np.ones((4, 2), np.float32)))
    treedef = jax.tree.structure(variable)
    copy_of_it = jnp.full((4, 2), 2.0)
    raised = []

    def tracer(frame, event, arg):
        if event == "exception" and frame.f_code.co_filename == fnnx.__file__:
            raised.append((frame.f_code.co_name, arg[0].__name__))
        return tracer

    sys.settrace(tracer)
    try:
        rebuilt = treedef.unflatten([copy_of_it])
        own = treedef.unflatten([jnp.asarray(variable.const)])
    finally:
        sys.settrace(None)
    assert raised == []
    assert rebuilt.const is None and rebuilt[...] is copy_of_it
    assert own.const is not None and own.const.fingerprint == variable.const.fingerprint


def test_assignments_are_refused_and_a_written_back_copy_of_another_shape_raises():
    net = freeze(_net())
    kernel = net.head.kernel
    const = kernel.const
    with pytest.raises(frozenconst.FrozenConstTypeError, match="is frozen"):
        kernel[...] = jnp.zeros((8, 2))
    with pytest.raises(frozenconst.FrozenConstTypeError, match="is frozen"):
        kernel[0] = jnp.zeros(2)
    assert kernel.const is const
    other = frozenconst.FrozenConst(np.full((8, 2), 3.0, np.float32))
    if hasattr(kernel, "set_value"):
        kernel.set_value(other)
    else:  # flax 0.11
        kernel.value = other
    assert kernel.const is other
    with pytest.raises(frozenconst.FrozenConstValueError, match=r"float32\[8, 2\]"):
        nnx.update(net.head, nnx.State({"kernel": nnx.Param(jnp.zeros((3, 3)))}))


def test_clone_deepcopy_pickle_and_freezing_again_keep_the_constants():
    net = freeze(_net())
    consts = _consts(net)
    fingerprints = {path: v.const.fingerprint for path, v in _vars(net)}
    assert _same(_consts(copy.deepcopy(net)), consts)
    assert _same(_consts(nnx.clone(net)), consts)
    assert _same(_consts(freeze(net)), consts)
    # A variable (flax 0.11 pickles no module: its initialisers are local functions).
    for path, variable in _vars(net):
        assert pickle.loads(pickle.dumps(variable)).const.fingerprint == fingerprints[path]


def test_shared_variables_stay_shared():
    """A variable two modules hold (weight tying) becomes one `Frozen` variable, held by both."""
    rngs = nnx.Rngs(0)
    first = nnx.Linear(4, 4, rngs=rngs)
    second = nnx.Linear(4, 4, rngs=rngs)
    second.kernel = first.kernel
    pair = nnx.Sequential(first, second)
    freeze(pair)
    assert isinstance(first.kernel, Frozen) and first.kernel is second.kernel


def test_frozen_made_directly_from_a_constant_or_an_array():
    table = frozenconst.FrozenConst(np.arange(6.0, dtype=np.float32).reshape(3, 2))
    assert Frozen(table).const is table
    made = Frozen(jnp.ones((2, 2)))
    assert made.const is not None and made.const.is_concrete
    with pytest.raises(frozenconst.FrozenConstTypeError, match="not a `Param`"):
        Frozen(nnx.Param(jnp.ones(2)))


def test_freeze_inside_eval_shape_changes_the_types_only():
    abstract = nnx.eval_shape(lambda: freeze(_net(), nnx.PathContains("encoder")))
    variables = _vars(abstract)
    assert variables and all(v.const is None for _, v in variables)
    assert all(
        isinstance(v.get_raw_value() if hasattr(v, "get_raw_value") else v.raw_value, jax.ShapeDtypeStruct)
        for _, v in variables
    )


def test_orbax_checkpointing_as_the_nnx_guide_writes_it(tmp_path):
    """The NNX checkpointing guide: save `nnx.split(model)`'s state, restore it into an abstract
    model from `nnx.eval_shape` (frozen as the real one is), `nnx.merge`. The constants are saved as
    arrays and restored bitwise; one `freeze` makes the restored ones constants again."""
    ocp = pytest.importorskip("orbax.checkpoint")
    net = freeze(_net(), nnx.PathContains("encoder"))
    expected = net(IMAGE, TOKENS)
    _, state = nnx.split(net)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", state)
        checkpointer.wait_until_finished()
        abstract_model = nnx.eval_shape(lambda: freeze(_net(), nnx.PathContains("encoder")))
        graphdef, abstract_state = nnx.split(abstract_model)
        state_restored = checkpointer.restore(tmp_path / "state", abstract_state)
    model = nnx.merge(graphdef, state_restored)
    np.testing.assert_array_equal(model(IMAGE, TOKENS), expected)
    freeze(model, Frozen)
    for (path, ours), (_, theirs) in zip(_vars(net), _vars(model), strict=True):
        assert theirs.const is not None
        assert theirs.const.fingerprint == ours.const.fingerprint, path


def test_orbax_checkpoint_without_the_constants(tmp_path):
    """Skipping the constants: save `nnx.state(model, nnx.Not(Frozen))`, restore it into the same
    filter of an abstract model, `nnx.update` a model built with the real constants. The
    checkpoint is smaller than the constants; the model keeps them, the very objects."""
    ocp = pytest.importorskip("orbax.checkpoint")
    net = freeze(_net(), nnx.PathContains("encoder"))
    consts = {path: v.const for path, v in _vars(net)}
    buffers = _consts(net)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "trained", nnx.state(net, nnx.Not(Frozen)))
        checkpointer.wait_until_finished()
        target = nnx.state(
            nnx.eval_shape(lambda: freeze(_net(), nnx.PathContains("encoder"))), nnx.Not(Frozen)
        )
        restored = checkpointer.restore(tmp_path / "trained", target)
    saved = sum(f.stat().st_size for f in (tmp_path / "trained").rglob("*") if f.is_file())
    const_bytes = sum(c.nbytes for c in consts.values())
    assert jax.tree.leaves(nnx.state(net, Frozen))  # the test holds constants worth skipping
    nnx.update(net, restored)
    assert all(v.const is consts[path] for path, v in _vars(net))
    assert _same(_consts(net), buffers)
    # Saving everything writes the constants too: larger by at least their bytes.
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "all", nnx.state(net))
        checkpointer.wait_until_finished()
    everything = sum(f.stat().st_size for f in (tmp_path / "all").rglob("*") if f.is_file())
    assert everything - saved >= const_bytes * 0.5, (everything, saved, const_bytes)


def test_a_frozenconst_straight_in_an_nnx_param():
    """What the tutorials' weight-loading line with a FrozenConst does (documented, not a place
    frozenconst offers): `jnp` on the variable fails, as JAX unwraps `__jax_array__` once, and the
    optimizer built with `wrt=nnx.Param` trains it as a parameter. `freeze` turns such a
    variable into a `Frozen` one holding that very constant."""
    net = _net()
    const = frozenconst.FrozenConst(np.array(net.encoder.cls_token[...]))
    net.encoder.cls_token = nnx.Param(const)
    with pytest.raises(TypeError):
        jnp.tile(net.encoder.cls_token, [2, 1, 1])
    freeze(net.encoder)
    assert isinstance(net.encoder.cls_token, Frozen) and net.encoder.cls_token.const is const
    net(IMAGE, TOKENS)


@pytest.mark.subprocess
def test_importing_frozenconst_imports_no_flax_and_nnx_loads_on_first_use():
    rc, out = run_bounded(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                import frozenconst
                assert "flax" not in sys.modules, "frozenconst imported flax"
                freeze = frozenconst.nnx.freeze
                assert "flax" in sys.modules and frozenconst.nnx.__name__ == "frozenconst.nnx"
                print("ok")
                """
            ),
        ],
        env=subprocess_env(),
        timeout=TIMEOUT_S,
    )
    assert rc == 0 and "ok" in out, out


def test_public_names():
    assert fnnx.__all__ == ["Frozen", "freeze"]
    assert frozenconst.nnx is fnnx
