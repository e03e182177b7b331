"""The pytest entry point environments installed from an earlier checkout still name.

The plugin is `_frozenconst_pytestplugin`, a module outside the package, so
that pytest loading it imports nothing of frozenconst; `pip install -e .`
rewrites an older environment's entry point to it. Until then this module
serves that plugin's hooks and fixture (loading it imports the whole package,
the cost the new entry point avoids).
"""

from _frozenconst_pytestplugin import no_numpy_constants as no_numpy_constants
from _frozenconst_pytestplugin import pytest_addoption as pytest_addoption
from _frozenconst_pytestplugin import pytest_runtest_call as pytest_runtest_call
