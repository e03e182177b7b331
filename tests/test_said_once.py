"""The one "said once" rule (`_frames.Said`) every warning follows: what was said is said again
once Python's warning filters change, in place too, so a filter made an error after a line was
told raises every warning kind again; and each warning names the user's line."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import pinned_host_offered, unique_data

import frozenconst
from frozenconst import FrozenConst, FrozenConstWarning, _frames, _host_memory


def _copy(tree):
    return jax.tree.map(lambda v: v + 1, tree)  # a copy of the constant: the copy warning


def _embedding(table):
    # `jax.export`'s own lowering carries its constants: the embedding warning, at this use.
    return jax.export.export(jax.jit(lambda x: table @ x))(jax.ShapeDtypeStruct((64,), jnp.float32))


@pytest.mark.parametrize("kind", ["copy", "embedding"])
def test_an_error_filter_set_after_a_line_was_told_raises_it_again(kind):
    tree = {"t": FrozenConst(np.ones(8, np.float32))}
    table = FrozenConst(unique_data((64, 64)))  # 16 KiB: above the threshold
    say = (lambda: _copy(tree)) if kind == "copy" else (lambda: _embedding(table))
    match = "put a copy of FrozenConst" if kind == "copy" else "is embedded in the compiled program"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default", FrozenConstWarning)
        say()
        say()  # told once
        assert len([w for w in caught if issubclass(w.category, FrozenConstWarning)]) == 1
        warnings.simplefilter("error", FrozenConstWarning)  # the same list, changed in place
        with pytest.raises(FrozenConstWarning, match=match):
            say()
        with pytest.raises(FrozenConstWarning, match=match):
            say()  # not told (raised): raised again


def test_a_fallback_is_said_once_at_the_users_line(monkeypatch):
    if pinned_host_offered():  # what a JAX whose devices offer no `pinned_host` runs
        monkeypatch.setattr(_host_memory, "offers_pinned_host", lambda device: False)
    _frames.DEGRADED.forget()
    x = FrozenConst(unique_data((16, 16)), host_memory="pinned")
    y = FrozenConst(unique_data((16, 16)), host_memory="pinned")
    with pytest.warns(FrozenConstWarning, match="offer no page-locked") as record:
        jnp.asarray(x)
        jnp.asarray(y)
    (told,) = [r for r in record if issubclass(r.category, FrozenConstWarning)]
    assert told.filename == __file__, told.filename
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenConstWarning)
        z = FrozenConst(unique_data((16, 16)), host_memory="pinned")
        with pytest.raises(FrozenConstWarning, match="offer no page-locked"):
            jnp.asarray(z)
    assert frozenconst.FrozenConst(np.ones(3)).host_memory == "pageable"
