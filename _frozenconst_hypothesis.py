"""frozenconst's `hypothesis` entry point, outside the package so that loading it imports nothing.

Hypothesis calls `setup` on every `import hypothesis`, in every environment
frozenconst is installed in (hypothesis ships its own pytest plugin as a
top-level module, `_hypothesis_pytestplugin`, for the same reason). The
strategy for `FrozenConst` is registered with `st.from_type` by whichever is
imported second: here when frozenconst is imported already, by
`import frozenconst` otherwise (`frozenconst._hypothesis_hook`).
"""

from __future__ import annotations

import sys


def setup() -> None:
    """Register `FrozenConst` with `st.from_type` if frozenconst is imported; else do nothing."""
    if "frozenconst" in sys.modules:
        from frozenconst._hypothesis_hook import register

        register()
