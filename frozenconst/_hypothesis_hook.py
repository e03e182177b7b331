"""Hypothesis's entry point: registers `FrozenConst` with `st.from_type` when hypothesis loads."""

from __future__ import annotations

import sys


def setup() -> None:
    """Import `frozenconst.strategies`, which registers the strategy as it loads."""
    if "frozenconst.strategies" in sys.modules:
        # It is being imported right now (it imports hypothesis, which calls
        # this hook) and registers itself when it finishes.
        return
    import importlib

    importlib.import_module("frozenconst.strategies")
