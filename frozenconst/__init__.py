"""frozenconst: immutable constant arrays for JAX, transferred once, never embedded."""

from importlib.metadata import PackageNotFoundError, version

from ._errors import FrozenConstTypeError as FrozenConstTypeError
from ._errors import FrozenConstValueError as FrozenConstValueError
from ._errors import TracedValueError as TracedValueError
from ._frozen import FrozenConst as FrozenConst
from ._jit import jit as jit

try:
    __version__ = version("frozenconst")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"
