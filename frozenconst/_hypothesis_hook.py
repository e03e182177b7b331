"""`st.from_type(FrozenConst)`, registered whichever of frozenconst and hypothesis is imported second.

Hypothesis's entry point (`_frozenconst_hypothesis.setup`, a module outside this
package, so that loading it imports nothing of frozenconst) calls `register`
when frozenconst is imported already; `import frozenconst` calls
`register_if_imported` for the other order. Either way the registration is a
function: `frozenconst.strategies` (and `hypothesis.extra.numpy`) is imported
only when a test first asks hypothesis for a `FrozenConst`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ._frozen import FrozenConst

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


def _default_strategy(_: type[FrozenConst]) -> SearchStrategy[FrozenConst]:
    from .strategies import frozen_consts

    return frozen_consts()


def register() -> None:
    """Register `FrozenConst` with `st.from_type`; importing hypothesis first if needed. Idempotent."""
    from hypothesis import strategies as st

    st.register_type_strategy(FrozenConst, _default_strategy)


def register_if_imported() -> None:
    """`register()` if hypothesis is imported already; hypothesis is never imported here."""
    if "hypothesis" in sys.modules:
        register()
