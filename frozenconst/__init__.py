"""frozenconst: immutable constant arrays for JAX, transferred once, never embedded."""

from importlib.metadata import PackageNotFoundError, version

from ._audit import AuditReport as AuditReport
from ._audit import CapturedConstant as CapturedConstant
from ._audit import audit as audit
from ._cache import Placement as Placement
from ._errors import CapturedNumpyConstantError as CapturedNumpyConstantError
from ._errors import FrozenConstTypeError as FrozenConstTypeError
from ._errors import FrozenConstValueError as FrozenConstValueError
from ._errors import TracedValueError as TracedValueError
from ._frozen import FrozenConst as FrozenConst
from ._guard import no_numpy_constants as no_numpy_constants
from ._intern import intern as intern
from ._jit import jit as jit
from ._stats import ConstStats as ConstStats
from ._stats import Stats as Stats
from ._stats import set_accounting as set_accounting
from ._stats import stats as stats

try:
    __version__ = version("frozenconst")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"
