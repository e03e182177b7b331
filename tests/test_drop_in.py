"""A FrozenConst dropped into code under the jit users already use.

JAX is the oracle throughout: the size of every program JAX lowers (the data of an
embedded constant is in its text), `jax.live_arrays()`, and the warnings recorded.
- Kept out under every jit, and never silently embedded: a `FrozenConstWarning` exactly
  where a program embeds a FrozenConst above `embed_max_bytes` (`jax.export`), once per
  program and line, at most 600 characters, naming the constant, the line that used it
  and the fix.
- Never worse than the NumPy array it replaced: a static index or slice inside a trace
  gives a program no bigger than the same expression on the NumPy array, and no device
  buffer but the constant's own.
- Derived copies: one message per line of user code, whatever the number of constants.
- The linen serialization hook never breaks a step.
"""

import contextlib
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EMBED_LIMIT, SIMPLIFIED, live_copies, raw_numpy_lowers, run_bounded, subprocess_env
from hypothesis import given, settings
from hypothesis import strategies as st

import frozenconst
from frozenconst import FrozenConst, FrozenConstWarning

# Program sizes are read off JAX's lowering function, a JAX-private name that `_compat_lowering`
# alone finds; the refusal table is the package's own list of the JAX releases whose jax.lax refuses.
from frozenconst._compat_lowering import LOWERING_HOOK
from frozenconst._refusals import JAX_LAX_REFUSES

PIPELINE = "simplified" if SIMPLIFIED else "default"
THRESHOLD = EMBED_LIMIT  # `embed_max_bytes`'s default


@contextlib.contextmanager
def lowered_sizes():
    """The text size of every program JAX lowers inside the block (JAX's own lowering result)."""
    assert LOWERING_HOOK is not None
    module, name = LOWERING_HOOK
    original = getattr(module, name)
    sizes: list[int] = []

    def lower(*args, **kwargs):
        result = original(*args, **kwargs)
        sizes.append(len(str(result.module)))
        return result

    setattr(module, name, lower)
    try:
        yield sizes
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def recorded():
    """The FrozenConstWarnings raised inside, each shown (no filter hides one)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    caught[:] = [w for w in caught if issubclass(w.category, FrozenConstWarning)]


def table(shape=(64, 64), dtype=np.float32, seed=0):
    return FrozenConst(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def _pmap(t, v):
    return jax.pmap(lambda x: t @ x)(v[None])


def _export(t, v):
    import jax.export

    return jax.export.export(jax.jit(lambda v: t @ v))(v)


def _eqx(closed):
    import equinox as eqx

    class Model(eqx.Module):
        t: FrozenConst

        def __call__(self, v):
            return self.t @ v

    def run(t, v):
        model = Model(t)
        if closed:
            return eqx.filter_jit(lambda v: model(v))(v)
        return eqx.filter_jit(lambda m, v: m(v))(model, v)

    return run


def _nnx(closed):
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, t):
            self.t = nnx.data(t)

        def __call__(self, v):
            return self.t @ v

    def run(t, v):
        model = Model(t)
        if closed:
            return nnx.jit(lambda v: model(v))(v)
        return nnx.jit(lambda m, v: m(v), donate_argnums=())(model, v)

    return run


def _linen(t, v):
    import flax.linen as nn

    class Model(nn.Module):
        @nn.compact
        def __call__(self, v):
            return nn.Dense(3)(t @ v)

    model = Model()
    params = model.init(jax.random.key(0), v)
    return jax.jit(model.apply)(params, v)


# Each form: the function that runs it, and under which pipelines the program embeds the
# constant. Every jit keeps a FrozenConst out (`_hoist`); only `jax.export` embeds it, as an
# exported program carries its constants (`frozenconst.export` keeps it out). The program's size
# is the oracle.
FORMS = {
    "jax.jit closure": (lambda t, v: jax.jit(lambda v: t @ v)(v), set()),
    "jax.jit argument": (lambda t, v: jax.jit(lambda t, v: t @ v)(t, v), set()),
    "jax.jit, a nested scan": (
        lambda t, v: jax.jit(lambda v: jax.lax.scan(lambda c, i: (c + t @ v * i, None), v, jnp.arange(3.0)))(
            v
        ),
        set(),
    ),
    "frozenconst.jit inside jax.jit": (
        lambda t, v: jax.jit(lambda v: frozenconst.jit(lambda w: t @ w)(v))(v),
        set(),
    ),
    "frozenconst.jit closure": (lambda t, v: frozenconst.jit(lambda v: t @ v)(v), set()),
    "jax.jit inside frozenconst.jit": (
        lambda t, v: frozenconst.jit(lambda v: jax.jit(lambda w: t @ w)(v))(v),
        set(),
    ),
    "eager vmap": (lambda t, v: jax.vmap(lambda x: t @ x)(v[None]), set()),
    "eager grad": (lambda t, v: jax.grad(lambda x: jnp.sum(t @ x))(v), set()),
    "eager scan": (
        lambda t, v: jax.lax.scan(lambda c, i: (c + jnp.sum(t @ v) * i, None), 0.0, jnp.arange(3.0)),
        set(),
    ),
    "eager cond": (lambda t, v: jax.lax.cond(True, lambda: jnp.sum(t @ v), lambda: 0.0), set()),
    "pmap": (_pmap, set()),
    "jax.export": (_export, {"default", "simplified"}),
    "frozenconst.export": (lambda t, v: frozenconst.export(lambda v: t @ v, v)(v), set()),
    "eqx.filter_jit closure": (_eqx(closed=True), set()),
    "eqx.filter_jit argument": (_eqx(closed=False), set()),
    "nnx.jit closure": (_nnx(closed=True), set()),
    "nnx.jit argument": (_nnx(closed=False), set()),
    "linen, jax.jit(model.apply)": (_linen, set()),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_warning_exactly_where_jax_embeds_the_constant(form):
    run, embeds = FORMS[form]
    t, v = table(seed=hash(form) % 1000), jnp.ones(64, jnp.float32)
    with recorded() as caught, lowered_sizes() as sizes:
        jax.block_until_ready(run(t, v))
    caught = [w for w in caught if " is embedded in the compiled program" in str(w.message)]  # not a copy's
    # An embedded table is printed in hex, two characters a byte; a program without it stays far
    # below (flax's, on a TPU, near 16 KB).
    embedded = max(sizes, default=0) > 2 * t.nbytes
    assert embedded == (PIPELINE in embeds), (form, sizes)
    assert len(caught) == int(embedded), [str(w.message) for w in caught]
    if embedded:
        text = str(caught[0].message)
        assert len(text) <= 600, len(text)
        made = f"made in `{__name__}`"
        assert text.startswith(
            f"FrozenConst float32[64, 64] (16.0 KiB, {made}) is embedded in the compiled"
        ), text
        assert "`frozenconst.export` keeps them out" in text  # the fix
        assert caught[0].filename == __file__  # the user's line that called the function


def _export_of(fun, v):
    import jax.export

    return jax.export.export(jax.jit(fun))(v)


def test_the_warning_names_the_line_that_uses_the_constant():
    t, v = table(), jnp.ones(64, jnp.float32)

    def model(v):
        return jnp.tanh(t @ v)  # the line the warning names

    line = model.__code__.co_firstlineno + 1
    with recorded() as caught:
        jax.jit(model)(v)  # kept out: nothing to say
        _export_of(model, v)
    (warning,) = caught
    assert f"{__file__}:{line}" in str(warning.message)


def test_once_per_program_and_constant():
    t, u, v = table(seed=1), table(seed=2), jnp.ones(64, jnp.float32)

    def f(v):
        return t @ v + u @ v

    with recorded() as caught:
        _export_of(f, v)
        _export_of(f, jnp.ones((64, 3), jnp.float32))  # a second program of f: the same lines
        _export_of(lambda v: t @ v * 2, v)
    first, second = (str(w.message) for w in caught)
    assert "and 1 more FrozenConst(s), 32.0 KiB in all" in first
    assert "more FrozenConst" not in second  # the lambda: a line of its own, one constant


@pytest.mark.parametrize("nbytes", [THRESHOLD - 4, THRESHOLD, THRESHOLD + 4])
def test_nothing_at_or_below_the_threshold(nbytes):
    t = FrozenConst(np.arange(nbytes // 4, dtype=np.float32))
    with recorded() as caught:
        jax.jit(lambda v: jnp.sum(t) + v)(1.0)
        _export_of(lambda v: jnp.sum(t) + v, jnp.float32(1.0))
    assert len(caught) == int(nbytes > THRESHOLD)


_DTYPES = [np.float32, np.int32, np.uint8, np.bool_, np.float16, jnp.bfloat16, np.int8, np.complex64]
_CALL_FORMS = [
    "jax.jit closure",
    "jax.jit argument",
    "eager vmap",
    "frozenconst.jit closure",
    "pmap",
    "jax.export",
]


@settings(max_examples=30)
@given(
    dtype=st.sampled_from(_DTYPES),
    length=st.integers(1, 3000),
    form=st.sampled_from(_CALL_FORMS),
)
def test_warned_if_and_only_if_embedded_above_the_threshold(dtype, length, form):
    # Over dtypes, sizes about the threshold and call forms: warned exactly where JAX
    # embeds the constant (the program's size) and it is above the threshold.
    data = (np.arange(length) % 7).astype(dtype)
    t = FrozenConst(data)
    run = {
        "jax.jit closure": lambda: jax.jit(lambda v: jnp.sum(t) + v)(1),
        "jax.jit argument": lambda: jax.jit(lambda t, v: jnp.sum(t) + v)(t, 1),
        "eager vmap": lambda: jax.vmap(lambda v: jnp.sum(t) + v)(jnp.ones(2, jnp.int32)),
        "frozenconst.jit closure": lambda: frozenconst.jit(lambda v: jnp.sum(t) + v)(1),
        "pmap": lambda: jax.pmap(lambda v: jnp.sum(t) + v)(jnp.ones(1, jnp.int32)),
        "jax.export": lambda: _export_of(lambda v: jnp.sum(t) + v, jnp.int32(1)),
    }[form]
    with recorded() as caught, lowered_sizes() as sizes:
        jax.block_until_ready(run())
    embedded = form == "jax.export"
    assert len(caught) == int(embedded and t.nbytes > THRESHOLD), (form, sizes, t.nbytes)
    if t.nbytes > 4 * THRESHOLD:  # large enough for the program's size to tell
        assert (max(sizes, default=0) > t.nbytes) == embedded, (form, sizes)


def test_no_warning_inside_frozenconsts_own_wrappers():
    t, v = table(), jnp.ones(64, jnp.float32)
    with recorded() as caught, lowered_sizes() as sizes:
        frozenconst.jit(lambda v: t @ v)(v)
        frozenconst.filter_jit(lambda m, v: m["t"] @ v)({"t": t}, v)
        frozenconst.jit(lambda v: t @ v).lower(v).compile()
    assert caught == []
    assert max(sizes) < t.nbytes


def test_warnings_as_errors_stop_the_embedding_call_each_time():
    # Raised as an error, a warning is not recorded as said: the next call raises again.
    t, v = table(), jnp.ones(64, jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)
        jax.jit(lambda v: t @ v)(v)  # kept out: nothing to say
        for _ in range(3):
            with pytest.raises(FrozenConstWarning, match=r"is embedded in the compiled program"):
                _export_of(lambda v: t @ v, v)


# -- a static index or slice: never worse than the NumPy array it replaced -------------


def _static_index(draw, shape):
    entries = []
    for size in shape:
        kind = draw(st.sampled_from(["int", "slice", "all"]))
        if kind == "int":
            entries.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            start = draw(st.none() | st.integers(-size, size))
            stop = draw(st.none() | st.integers(-size, size))
            step = draw(st.none() | st.sampled_from([1, 2, 3, -1, -2]))
            entries.append(slice(start, stop, step))
        else:
            entries.append(slice(None))
    if draw(st.booleans()):
        entries.insert(draw(st.integers(0, len(entries))), None)
    if draw(st.booleans()) and entries:
        entries[-1] = Ellipsis
    return entries[0] if len(entries) == 1 and draw(st.booleans()) else tuple(entries)


@st.composite
def static_reads(draw):
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=3)))
    return shape, _static_index(draw, shape)


def _buffers_of(shape):
    return sum(a.shape == shape for a in jax.live_arrays())


@settings(max_examples=40)
@given(read=static_reads(), seed=st.integers(0, 10))
def test_a_static_read_is_no_bigger_than_numpys(read, seed):
    # The constant is a parameter, sliced in the program: no data in the program, where NumPy
    # embeds its slice, and no device buffer but the constant's own, as for a jax.Array.
    shape, index = read
    data = np.random.default_rng(seed).standard_normal((*shape, 33)).astype(np.float32)  # 33: a unique shape
    t = FrozenConst(data)
    v = jnp.float32(2.0)
    mine = jax.jit(lambda v: t[index] * v)
    if not raw_numpy_lowers():  # jax 0.7 to 0.9 under the simplified pipeline: the NumPy form fails
        np.testing.assert_array_equal(np.asarray(mine(v)), data[index] * np.float32(2))
        assert len(mine.lower(v).as_text()) < 2048
        return
    numpys = jax.jit(lambda v: data[index] * v)
    numpy_text = len(numpys.lower(v).as_text())
    expected = np.asarray(numpys(v))
    ours = len(mine.lower(v).as_text())
    if t.nbytes > THRESHOLD:
        # No data: the program with the table passed as an argument (JAX marks each constant
        # it passes `{jax.const = true}`, 19 characters), at most the indexing operations' text
        # more than NumPy's, which slices on the host and embeds the slice.
        as_argument = len(jax.jit(lambda d, v: d[index] * v).lower(jnp.asarray(data), v).as_text())
        assert ours <= as_argument + 19 and ours <= numpy_text + 1024
    else:
        # Up to `embed_max_bytes` embedded whole, as JAX embeds a small array: at most that much
        # data (as text, at most a few characters a byte) beyond NumPy's slice.
        assert ours <= numpy_text + 4 * THRESHOLD
    before = live_copies(data)  # the simplified pipeline's copies of the NumPy form, if any
    np.testing.assert_array_equal(np.asarray(mine(v)), expected)
    np.testing.assert_array_equal(np.asarray(mine(v)), expected)
    assert live_copies(data) - before <= 1  # the constant's own buffer, made once at most


def test_static_reads_from_a_large_table_hold_no_data_and_no_more_device_memory_than_a_jax_arrays():
    # A 16 MiB table read at 8 positions; `T[3] * v`; `T[::2, 1]`; `T[:192]` 8 times.
    data = np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32)
    t = FrozenConst(data)
    array = jnp.asarray(data)
    v = jnp.ones(1024, jnp.float32)
    reads = [
        (lambda v: t[:8] @ v, lambda v: data[:8] @ v),
        (lambda v: t[3] * v, lambda v: data[3] * v),
        (lambda v: t[::2, 1] * v[0], lambda v: data[::2, 1] * v[0]),
        (
            lambda v: sum(t[:192] @ v * i for i in range(8)),
            lambda v: sum(data[:192] @ v * i for i in range(8)),
        ),
        (lambda v: t[:] @ v + t[...] @ v, lambda v: data[:] @ v + data[...] @ v),
    ]
    live = sum(a.nbytes for a in jax.live_arrays())
    for mine, numpys in reads:
        with recorded() as caught:
            size = len(jax.jit(mine).lower(v).as_text())
            jax.block_until_ready(jax.jit(mine)(v))
        assert size <= (len(jax.jit(numpys).lower(v).as_text()) if raw_numpy_lowers() else 16384) + 512
        assert size < 16384 and caught == []
    # The constant's one buffer, as the jax.Array's reads would hold theirs: nothing more.
    grown = sum(a.nbytes for a in jax.live_arrays()) - live
    assert data.nbytes <= grown < data.nbytes + (1 << 20)
    del array


def test_a_static_read_elsewhere_is_jaxs():
    t = table((8, 5))
    eager = t[3]
    assert isinstance(eager, jax.Array) and t.placements  # eager: the cached buffer, indexed
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jnp.asarray(t)[3]))
    # Out of bounds: JAX clamps (NumPy would raise); inside a trace too.
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda: t[7])()), np.asarray(jnp.asarray(t)[7]))
    # Inside frozenconst.jit the constant is a parameter, sliced in the program.
    big = table((64, 33))
    f = frozenconst.jit(lambda v: big[:2] * v)
    assert len(f.lower(jnp.float32(1)).as_text()) < big.nbytes
    np.testing.assert_array_equal(np.asarray(f(jnp.float32(2))), np.asarray(jnp.asarray(big)[:2] * 2))


# -- derived copies: one message per line of user code ----------------------------------


def _frozen_params(n):
    rng = np.random.default_rng(0)
    consts = {f"c{i}": FrozenConst(rng.standard_normal((2 + i, 3)).astype(np.float32)) for i in range(n)}
    return {"w": jnp.ones((4, 3)), "consts": consts}


@pytest.mark.subprocess
def test_a_copy_made_from_a_shallower_stack_than_before_is_told_not_a_crash():
    # The dedup reads the frame where a library's call site was reached from last, that many
    # frames up: module-level code (the shallowest stack there is) calling JAX's tree function
    # itself, after a function reached the same call site through `jax.tree.map`, must not make
    # that read raise "call stack is not deep enough" out of JAX's tree function. Module level
    # needs a script of its own.
    import textwrap

    code = """
        import warnings
        import jax, numpy as np
        from frozenconst import FrozenConst, FrozenConstWarning
        c = FrozenConst(np.ones(3, np.float32))
        def deep():
            return jax.tree.map(lambda x: x + 1, [c])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            deep()
            out = jax.tree_util.tree_map(lambda x: x + 1, [c])
        lines = sorted(w.lineno for w in seen if issubclass(w.category, FrozenConstWarning))
        print("rebuilt", type(out[0]).__name__, float(out[0][0]), "lines", lines)
    """
    rc, out = run_bounded([sys.executable, "-c", textwrap.dedent(code)], env=subprocess_env("cpu"))
    # Both user lines told, once each: `deep`'s (line 7) and the module-level call (line 11).
    assert rc == 0 and "rebuilt FrozenConst 2.0 lines [7, 11]" in out, out


def test_a_library_site_reached_from_two_lines_in_turn_tells_each_line_once():
    # One call site in JAX's `tree_map` (library code between it and the user, as equinox's
    # `combine` or its `filter_jit` are), reached in turn from two lines of user code: a copy
    # made there is decided without a stack walk where the line is the one told last there,
    # and each line is told once, however the two alternate.
    c = table((3, 3))
    lines = []
    with recorded() as caught:
        for _ in range(3):
            lines.append(sys._getframe().f_lineno + 1)
            first = jax.tree.map(lambda x: x + 1, [c, c])
            lines.append(sys._getframe().f_lineno + 1)
            second = jax.tree.map(lambda x: x * 2, [c])
    assert len(lines) == 6 and sorted(w.lineno for w in caught) == sorted(set(lines))
    assert all(w.filename == __file__ and "the tree rebuilt there holds" in str(w.message) for w in caught)
    assert isinstance(first[1], FrozenConst) and float(second[0][0, 0]) == float(c[0, 0]) * 2


def test_two_library_sites_reached_in_turn_tell_each_line_once():
    # Two call sites in JAX's tree functions (`tree_map`'s and `tree_unflatten`'s), each
    # reached from its own line of user code, in turn, each tree holding several copies:
    # the site met last is kept in one slot, and whichever site and line come next, each
    # line is told once.
    c = table((3, 3))
    leaves, treedef = jax.tree.flatten([c, c, c])
    arrays = [x + 1 for x in leaves]
    lines = []
    with recorded() as caught:
        for _ in range(3):
            lines.append(sys._getframe().f_lineno + 1)
            mapped = jax.tree.map(lambda x: x + 1, [c, c, c])
            lines.append(sys._getframe().f_lineno + 1)
            rebuilt = jax.tree_util.tree_unflatten(treedef, arrays)
    assert sorted(w.lineno for w in caught) == sorted(set(lines)) and len(set(lines)) == 2
    assert all(isinstance(x, FrozenConst) for x in [*mapped, *rebuilt])


def test_one_message_for_a_line_that_copies_many_constants():
    optax = pytest.importorskip("optax")
    params = _frozen_params(8)  # eight shapes
    opt = optax.adam(1e-3)
    with recorded() as caught:
        state = opt.init(params)
    (warning,) = caught
    text = str(warning.message)
    assert warning.filename == __file__
    assert len(text) <= 600
    assert text.startswith("optax put a copy of FrozenConst")
    assert "the tree rebuilt there holds 8 FrozenConsts" in text  # how many it concerns
    assert "frozenconst.partition(params)[0]" in text
    assert state is not None


def test_a_training_loop_is_told_once():
    params = _frozen_params(4)

    @jax.jit
    def step(params):
        return jax.tree.map(lambda x: x, params, is_leaf=frozenconst.is_frozen)

    lines = []
    with recorded() as caught:
        for _ in range(5):
            lines.append(sys._getframe().f_lineno + 1)
            params = step(params)  # the line told
    (warning,) = caught
    assert (warning.filename, warning.lineno) == (__file__, lines[0])
    assert "frozenconst.filter_jit" in str(warning.message)
    assert "the tree rebuilt there holds 4 FrozenConsts" in str(warning.message)
    with recorded() as again:
        params = step(params)  # another line: told too
    assert len(again) == 1


def _answer(obj, name):
    """What `obj.name` answers: called with no arguments where it is a method; the exception's
    type where it raises (a method that needs arguments raises TypeError)."""
    try:
        value = getattr(obj, name)
        if callable(value) and not isinstance(value, (jax.Array, FrozenConst)):
            value = value()
    except Exception as err:
        return ("raises", type(err))
    return _plain(value)


def _plain(value):
    """`value` as data to compare: arrays as their values and dtype, a shard as its
    device, index and data, a helper object (`x.at`) as its type."""
    if isinstance(value, (jax.Array, np.ndarray, FrozenConst)):
        return ("array", str(np.asarray(value).dtype), np.asarray(value).tolist())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_plain(v) for v in value])
    if type(value).__name__ == "Shard":
        return ("shard", value.device, value.index, _plain(value.data))
    if value is not None and type(value).__eq__ is object.__eq__:
        return ("object", type(value).__name__)
    return value


# A copy's own answers to what a `jax.Array` has not: a value derived from a constant, not
# a constant (docs/training.md, "What each idiom does").
_COPY_ANSWERS = {
    "is_concrete": False,
    "declared_sharding": None,
    "sharding_target": None,
    "placements": ("tuple", []),
    "evict": None,
    "host_memory": ("raises", frozenconst.FrozenConstTypeError),
    "residency": ("raises", frozenconst.FrozenConstTypeError),
    "stats": ("raises", frozenconst.FrozenConstTypeError),
    "on": ("raises", TypeError),
    "placed": ("raises", TypeError),
}


def test_a_copy_answers_every_public_attribute_as_its_array_does():
    # A copy a jitted step hands back holds the step's output array itself, and makes its
    # record (its frozen host copy, its number for frozenconst.jit) only where asked: every
    # public attribute of FrozenConst, on such a copy, answers as the same
    # attribute of that `jax.Array` does; where the array has none, as a value derived from
    # a constant answers, and the fingerprint as that of a constant of the same data.
    c = table((3, 4))
    with recorded():
        copy = jax.jit(lambda t: jax.tree.map(lambda a: a * 2, t))(c)
    (leaf,) = jax.tree.leaves(copy)
    assert isinstance(copy, FrozenConst) and jnp.asarray(copy) is leaf  # the array itself, no copy
    names = sorted(n for n in dir(FrozenConst) if not n.startswith("_") and n != "delete")
    assert len(names) > 80  # `jax.Array`'s methods and properties, and FrozenConst's own
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`x.sharding_target` is deprecated", FrozenConstWarning)
        answers = {name: _answer(copy, name) for name in names}
    twin = FrozenConst(np.asarray(leaf))
    checked = set()
    for name, answer in answers.items():
        try:
            has = hasattr(leaf, name)
        except NotImplementedError:  # `jax.Array.flat`: JAX refuses it as a property
            has = True
        if has:
            assert answer == _answer(leaf, name), name
        elif name in _COPY_ANSWERS:
            assert answer == _COPY_ANSWERS[name], name
        elif name == "fingerprint":
            assert answer == twin.fingerprint
        elif name.startswith("tree_"):
            continue  # the pytree protocol, read by JAX itself above
        else:
            assert answer == _answer(c, name), name  # as the constant's (JAX's refusals)
        checked.add(name)
    assert set(_COPY_ANSWERS) | {"fingerprint"} <= checked
    # `delete` is refused, as on the constant, and leaves the array alone.
    refused = _answer(c, "delete")
    assert refused[0] == "raises" and not jnp.asarray(c).is_deleted()
    with pytest.raises(refused[1]):
        copy.delete()
    assert not leaf.is_deleted()


def test_threads_asking_a_copy_for_its_host_data_at_once_share_one_frozen_copy():
    # A copy's record and its frozen host copy are made on first need; threads asking at
    # once get one of each (the arrays share memory), never one each.
    import threading

    c = table((64, 64))
    for _ in range(5):
        with recorded():
            copy = jax.jit(lambda t: jax.tree.map(lambda a: a + 1, t))(c)
        barrier = threading.Barrier(8)
        seen = []

        def read(copy=copy, barrier=barrier, seen=seen):
            barrier.wait()
            seen.append((np.asarray(copy), copy.fingerprint))

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(seen) == 8
        assert all(np.shares_memory(seen[0][0], host) for host, _ in seen)
        assert len({fingerprint for _, fingerprint in seen}) == 1
        np.testing.assert_array_equal(seen[0][0], np.asarray(c) + 1)
        assert not seen[0][0].flags.writeable


def test_a_copy_is_kept_out_of_a_compiled_program_as_the_constant_is():
    # A copy (a jitted step's output in a constant's place) holds a new `jax.Array`, not the
    # constant; a program closing over it takes that array as a parameter, as it takes the
    # constant (the program of the array passed as an argument), and frozenconst.jit names
    # nothing embedded.
    c = table((64, 64))
    step = jax.jit(lambda t: jax.tree.map(lambda a: a * 2, t))
    v = jnp.ones(64)
    own = len(jax.jit(lambda v: c @ v).lower(v).as_text())
    with recorded():
        copy = step(c)
    as_argument = len(jax.jit(lambda t, v: t @ v).lower(jnp.asarray(copy), v).as_text())
    for reads in (lambda v: copy @ v, lambda v: jnp.asarray(copy) @ v):
        assert len(jax.jit(reads).lower(v).as_text()) <= as_argument + 32 and own < 1024
    with recorded() as caught:
        f = frozenconst.jit(lambda v: copy @ v)
        np.testing.assert_allclose(f(v), (np.asarray(c) * 2) @ np.ones(64), rtol=1e-4, atol=1e-4)
    assert [str(w.message) for w in caught if "closes over a jax.Array" in str(w.message)] == []


def test_derived_copy_warnings_as_errors():
    optax = pytest.importorskip("optax")
    params = _frozen_params(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)
        with pytest.raises(FrozenConstWarning, match="optax put a copy"):
            optax.adam(0.1).init(params)


def test_equinox_gets_equinox_advice():
    eqx = pytest.importorskip("equinox")
    model = {"t": table((4, 4)), "w": jnp.ones(4)}
    with recorded() as caught:
        eqx.filter_jit(lambda m: m)(model)
    (warning,) = caught
    assert str(warning.message).startswith("equinox put a copy")
    assert "frozenconst.filter_jit" in str(warning.message)


# -- the linen serialization hook --------------------------------------------------------


LINEN_SETUP = """
import {first}, {second}
import warnings
import jax, jax.numpy as jnp, numpy as np
import flax.linen as nn
from flax import serialization
import frozenconst
frozenconst.register_flax()  # registered already where flax came first; again, it does nothing
warnings.simplefilter("error", frozenconst.FrozenConstWarning)

class Model(nn.Module):
    def setup(self):
        self.dense = nn.Dense(4)
        self.w = self.param("w", nn.initializers.ones, (4, 4))

    def __call__(self, x):
        return self.dense(x) @ self.w

model = Model()
x = jnp.arange(8.0).reshape(2, 4)
params = model.init(jax.random.key(0), x)
frozen = jax.tree.map(frozenconst.FrozenConst, params)
out = jax.jit(model.apply)(frozen, x)
assert np.array_equal(np.asarray(out), np.asarray(jax.jit(model.apply)(params, x)))
data = serialization.to_bytes(frozen)
back = serialization.from_bytes(frozen, data)
assert all(a is b for a, b in zip(jax.tree.leaves(back, is_leaf=frozenconst.is_frozen),
                                  jax.tree.leaves(frozen, is_leaf=frozenconst.is_frozen)))
print("ok")
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("order", [("flax", "frozenconst"), ("frozenconst", "flax")])
def test_linen_setup_params_under_jax_jit_whatever_the_import_order(order):
    pytest.importorskip("flax")
    from helpers import run_bounded

    source = LINEN_SETUP.format(first=order[0], second=order[1])
    code, out = run_bounded([sys.executable, "-c", source])
    assert code == 0, out[-3000:]
    assert out.strip().endswith("ok")


def test_a_derived_constant_round_trips_through_flax_serialization():
    pytest.importorskip("flax")
    from flax import serialization

    frozenconst.register_flax()
    tree = {"t": table((3, 3))}
    with recorded():
        copied = jax.jit(lambda tree: tree)(tree)  # a derived copy
    data = serialization.to_bytes(copied)
    back = serialization.from_bytes(tree, data)
    assert back["t"] is tree["t"]  # the same bytes: the template's constant itself


# -- JAX's refusals inside frozenconst's own wrappers ------------------------------------


def _rotary():
    return FrozenConst(np.arange(16 * 64, dtype=np.float32).reshape(16, 64))


@pytest.mark.parametrize("wrapper", ["frozenconst.jit", "frozenconst.filter_jit"])
def test_a_decoders_dynamic_read_of_a_table(wrapper):
    # How a decoder reads a rotary table: `lax.dynamic_slice` at a traced position.
    table = _rotary()
    wrap = frozenconst.jit if wrapper == "frozenconst.jit" else frozenconst.filter_jit
    read = wrap(lambda pos: jax.lax.dynamic_slice(table, (pos, 0), (1, 64)))  # the line named
    line = read.__wrapped__.__code__.co_firstlineno if wrapper == "frozenconst.jit" else None
    expected = np.asarray(table)[5:6]
    if jax.__version__ not in JAX_LAX_REFUSES:  # jax.lax takes a FrozenConst here
        np.testing.assert_array_equal(np.asarray(read(jnp.int32(5))), expected)
        return
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 7):
        # jax 0.6 converts it with a DeprecationWarning (its host data, which the program then
        # embeds, and frozenconst.jit says so): JAX's answer on the floor, docs/jax.md.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with pytest.warns(FrozenConstWarning, match="closes over a NumPy array"):
                np.testing.assert_array_equal(np.asarray(read(jnp.int32(5))), expected)
        return
    refused = _refusal_of(lambda: read(jnp.int32(5)))
    assert isinstance(refused, (frozenconst.FrozenConstValueError, frozenconst.FrozenConstTypeError))
    text = str(refused)
    assert "`jax.lax.dynamic_slice`" in text and "test_drop_in.py:" in text and "jnp.asarray" in text
    if line is not None:
        assert f"test_drop_in.py:{line}" in text


def _refusal_of(call):
    """The frozenconst error `call` raises; jax 0.6 first takes the value with a DeprecationWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(
            (frozenconst.FrozenConstValueError, frozenconst.FrozenConstTypeError, IndexError)
        ) as caught:
            call()
    return caught.value


@pytest.mark.parametrize("wrapper", ["frozenconst.jit", "frozenconst.filter_jit"])
def test_an_index_table_into_an_array(wrapper):
    # `h[E]`, E a FrozenConst of graph edges: JAX's indexer takes only arrays, on every version.
    edges = FrozenConst(np.array([3, 1, 2], np.int32))
    h = jnp.arange(10.0)
    if wrapper == "frozenconst.jit":
        gather = frozenconst.jit(lambda h: h[edges])
    else:
        gather = frozenconst.filter_jit(lambda h, e: h[e])
    args = (h,) if wrapper == "frozenconst.jit" else (h, edges)
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 7):
        # jax 0.6 takes it with a DeprecationWarning naming `__jax_array__`, then its indexer
        # fails in other words (docs/jax.md): JAX's error, which names nothing to convert.
        with pytest.warns(DeprecationWarning, match="__jax_array__"), pytest.raises(ValueError):
            gather(*args)
        return
    refused = _refusal_of(lambda: gather(*args))
    # The builtin JAX raised, frozenconst's own class: jax >= 0.10 an IndexError, before a ValueError.
    jax_error = type(refused.__cause__)
    expected = (
        frozenconst.FrozenConstIndexError
        if issubclass(jax_error, IndexError)
        else frozenconst.FrozenConstValueError
    )
    assert type(refused) is expected, (type(refused), jax_error)
    assert "test_drop_in.py:" in str(refused) and "jnp.asarray" in str(refused)
    if expected is frozenconst.FrozenConstIndexError:
        assert "as an index into a `jax.Array`" in str(refused)
        assert "Got FrozenConst(" in str(refused.__cause__)  # JAX's own words, kept as the cause
    # The fix the message names works, and copies nothing.
    fixed = frozenconst.jit(lambda h: h[jnp.asarray(edges)])
    np.testing.assert_array_equal(np.asarray(fixed(h)), [3.0, 1.0, 2.0])


def test_other_errors_pass_through_the_wrappers_untouched():
    def broken(v):
        raise ValueError("expected 256 features, got 100")

    with pytest.raises(ValueError, match="expected 256 features") as caught:
        frozenconst.jit(broken)(jnp.ones(3))
    assert not isinstance(caught.value, frozenconst.FrozenConstValueError)
