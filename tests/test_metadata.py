"""The attributes JAX reads off its inputs, and the metadata of what it returns for a FrozenConst.

docs/design/jax.md, "Attributes JAX reads off its inputs", is the decision table; the
tests below check its answers and that it covers every read of the installed JAX.
"""

import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import run_bounded, subprocess_env

import frozenconst
from frozenconst import FrozenConst

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _like_functions(fill):
    return {
        "zeros_like": jnp.zeros_like,
        "ones_like": jnp.ones_like,
        "empty_like": jnp.empty_like,
        "full_like": lambda a: jnp.full_like(a, 2.5),
        "full_like_constant_fill": lambda a: jnp.full_like(a, fill),
    }


def _metadata(a):
    return (a.dtype, a.shape, a.weak_type, a.committed, a.sharding)


def _same(call, x, ref, name):
    """`call(x)` gives what `call(ref)` gives, down to the metadata, or raises the same error."""
    try:
        expected = call(ref)
    except Exception as err:
        # jax.jit(lambda: jnp.full_like(a, c))() with `a` committed and `c` an array
        # fails in JAX itself: for a placed FrozenConst too, and only then.
        with pytest.raises(type(err)):
            call(x)
        return
    got = call(x)
    assert _metadata(got) == _metadata(expected)
    if name != "empty_like":  # uninitialized values
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def _constants():
    x = FrozenConst(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    placed = x.placed(jax.devices()[0])
    # Each with its cached buffer: what jnp.asarray gives, and what every answer must match.
    return {"default": (x, jnp.asarray(x)), "placed": (placed, jnp.asarray(placed))}


@pytest.mark.parametrize("placement", ["default", "placed"])
@pytest.mark.parametrize("name", sorted(_like_functions(None)))
def test_like_functions_match_the_cached_buffer(name, placement):
    fn = _like_functions(FrozenConst(np.float32(2.0)))[name]
    x, ref = _constants()[placement]
    assert ref.committed == (placement == "placed")
    _same(fn, x, ref, name)  # eagerly
    _same(lambda a: jax.jit(lambda: fn(a))(), x, ref, name)  # closed over
    _same(jax.jit(fn), x, ref, name)  # as an argument: a derived value inside
    # frozenconst.jit closing over it is jax.jit closing over `ref`: what JAX makes of a
    # closed-over buffer, the constant's a parameter of the program.
    _same(lambda a: frozenconst.jit(lambda: fn(a), embed_max_bytes=0)(), x, ref, name)


def test_committed_is_the_cached_buffers_and_costs_no_transfer():
    x = FrozenConst(np.ones(8, np.float32))
    assert getattr(x, "_committed", "default") is False
    assert x.stats().transfers == 1  # the buffer it describes, which jnp.asarray(x) gives
    jnp.zeros_like(x)
    jnp.full_like(x, FrozenConst(np.float32(3.0)))
    assert x.stats().transfers == 1
    assert getattr(x.placed(jax.devices()[0]), "_committed", "default") is True
    assert "_committed" in dir(x)

    seen = []

    def f(c):
        # A value derived from the constant, wrapping a tracer: no `_committed`, as the tracer has none.
        tracer = jnp.asarray(c)
        seen.append((type(c), getattr(c, "_committed", "default"), getattr(tracer, "_committed", "default")))
        return jnp.zeros_like(c)

    with jax.transfer_guard("disallow"):
        jax.jit(f)(x)
    assert seen == [(FrozenConst, "default", "default")]

    with pytest.warns(frozenconst.FrozenConstWarning, match="not the constant's own buffer"):
        grad = jax.grad(lambda c: jnp.sum(c * 2))(x)  # derived, wrapping a concrete array
    assert not grad.is_concrete
    assert grad._committed is jnp.asarray(grad).committed


_MIXING = """
import jax
jax.config.update("jax_num_cpu_devices", 2)
import jax.numpy as jnp, numpy as np
from frozenconst import FrozenConst

d0, d1 = jax.devices()
x = FrozenConst(np.arange(4.0, dtype=np.float32))
fill = FrozenConst(np.float32(2.0))
y = jax.device_put(jnp.ones(4, np.float32), d1)  # committed to the second device
for fn in (jnp.zeros_like, jnp.ones_like, jnp.empty_like, lambda a: jnp.full_like(a, fill)):
    for call in (fn, lambda a: jax.jit(lambda: fn(a))()):
        got, expected = call(x), call(jnp.asarray(x))
        assert (got.committed, got.sharding) == (expected.committed, expected.sharding)
        assert (got + y).devices() == {d1}  # "incompatible devices" when committed to d0
    with jax.default_device(d1):
        got, expected = fn(x), fn(jnp.asarray(x))
        assert got.devices() == {d1}
        assert (got.committed, got.sharding) == (expected.committed, expected.sharding)
print("mixing ok")
"""


@pytest.mark.subprocess
def test_like_results_mix_with_arrays_on_another_device():
    code, out = run_bounded([sys.executable, "-c", _MIXING], env=subprocess_env("cpu"))  # two CPU devices
    assert code == 0 and "mixing ok" in out, out[-6000:]


# -- the decision table ------------------------------------------------------------


def _documented():
    """{name: "forwarded" | "own" | "refused"} from the table in docs/design/jax.md."""
    text = (ROOT / "docs" / "design" / "jax.md").read_text(encoding="utf-8")
    section = text.split("## Attributes JAX reads off its inputs", 1)[1].split("\n## ", 1)[0]
    answers = {}
    for row in section.splitlines():
        if not row.startswith("| `"):
            continue
        names, _where, answer, _why = (cell.strip() for cell in row.strip("|").split(" | "))
        kind = re.match(r"\*\*(\w+)\*\*", answer)
        assert kind and kind.group(1) in ("forwarded", "own", "refused"), row
        for name in re.findall(r"`(\w+)`", names):
            answers[name] = kind.group(1)
    assert len(answers) > 15, answers
    return answers


# Names JAX reads with getattr/hasattr off its own objects, never off a value a caller
# hands it, by what it reads them off. Decided too: a FrozenConst never meets these reads.
_READ_OFF_JAX_OBJECTS = {
    "functions, classes and pytree node types being wrapped, traced or registered": """
        __annotations__ __doc__ __fun_debug_info__ __module__ __name__ __qualname__
        _apply_primitive _fields _fun _use_cpp tree_flatten
        __fun_sourceinfo__ _pmap_tag
        fun_name
        bwd_accums""",
    "modules, devices, backends, XLA clients and compiled executables": """
        GpuAllocatorConfig _KW_ONLY_TYPE __file__ __path__ _device_backend _ifrt_version
        _is_gil_enabled _raw_platform _version batch_partitionable_targets clear_metadata
        compiled compute_capability coords core_count cost_analysis device_kind fingerprint
        get_compiled_memory_stats get_hlo_text hlo_modules int1 isatty
        make_transfer_server_interface_factory num_cores pjrt_c_api_major_version
        pjrt_c_api_minor_version pydev_do_not_trace register_at_fork registrations
        runtime_type serialize set_metadata slice_index stablehlo_current_version
        supports_cross_host_transfers supports_executable_serialization uint1 unsafe_call
        xla_version
        Mutex RuntimeTracebackMode StringDType add_exclude_path install_failure_signal_handler
        needs_str_ir platform replace_thread_exc_traceback shutdown
        __version__ _xla_version bcomplex32 complex32 float8_e5m3fnu fma""",
    "tracers, traces, avals, dtypes, shardings, effects, indexers and PRNG key data": """
        _array_module _bool _complex _debug_info _device _float _hash _hex _index _int _iter
        _len _line_info _oct _origin_msg _pretty_print _rules _setitem at convert_from
        convert_to in_avals memory_kind memory_space out_aval params parent_trace str_short
        strip_weak_type tag transform_ndindexer
        _internal_device_list check_compatible_aval to_tangent_qdd vspace_add vspace_zero
        to_cotangent_aval""",
    "Pallas and Mosaic kernels: block specs, refs, meshes, MLIR values and dialects": """
        __len__ axis_names block_shape collective_axes core_type delay_release
        dimension_semantics effects get_ref_aval has_side_effects isinstance jaxpr logistic
        lower_block_spec name num_leaves num_scalar_prefetch oob_fill_mode orders_tensor_core
        out_block_specs pallas_interpret_element_aval physicalize predicate
        private_unzip_debug_locations reduce_precision tiling tobytes transforms type
        TMAReduction async_store_smem_to_tmem for_tensor_core kernel_type
        arrive_dyn_expect_tx_supported resources
        RequestPStateOp commit_a_read_only get_ref_transforms""",
    "JAX's own test harness": """
        _default_global_config _default_thread_local_config thread_hostile thread_unsafe
        time_getter differing_executors""",
}

# `getattr(<obj>, "<name>", <default>)` and `hasattr(<obj>, "<name>")`, where <obj> has no
# top-level comma and at most two levels of parentheses (all of JAX's reads; an AST scan
# finds the same names, far slower).
_OBJECT = r"(?:[^(),]|\((?:[^()]|\([^()]*\))*\))+"
_READ = re.compile(rf"""\b(getattr|hasattr)\({_OBJECT},\s*(['"])([A-Za-z_]\w*)\2\s*([,)])""")


def _names_jax_reads():
    names = set()
    for path in (pathlib.Path(jax.__file__).parent / "_src").rglob("*.py"):
        for read in _READ.finditer(path.read_text(encoding="utf-8")):
            if read.group(1) == "hasattr" or read.group(4) == ",":
                names.add(read.group(3))
    assert len(names) > 80, sorted(names)  # the scan found JAX's reads
    return names


def test_every_attribute_jax_reads_is_decided():
    decided = set(_documented())
    for names in _READ_OFF_JAX_OBJECTS.values():
        decided |= set(names.split())
    undecided = sorted(_names_jax_reads() - decided)
    assert not undecided, (
        f"jax {jax.__version__} reads {undecided} with getattr/hasattr: decide what a FrozenConst "
        "answers (docs/design/jax.md, 'Attributes JAX reads off its inputs') or list them as read off "
        "JAX's own objects"
    )


def _answer(value):
    if isinstance(value, list):  # shards: made per access, compared by what they hold
        return [(s.device, s.index, s.data.unsafe_buffer_pointer()) for s in value]
    return value


@pytest.mark.parametrize("name", sorted(_documented()))
def test_the_documented_answer_holds(name):
    kind = _documented()[name]
    for x, ref in _constants().values():
        if kind == "refused":
            assert not hasattr(x, name)
        elif kind == "forwarded":
            assert hasattr(x, name) == hasattr(ref, name)
            if hasattr(ref, name):
                assert _answer(getattr(x, name)) == _answer(getattr(ref, name))
        else:  # own: FrozenConst defines it, from the host data
            assert name in vars(FrozenConst)
            value = getattr(x, name)
            if not callable(value):
                assert value == getattr(np.asarray(x), name)
