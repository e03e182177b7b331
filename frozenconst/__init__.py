"""frozenconst: immutable constant arrays for JAX, transferred once, never embedded."""

import importlib as _importlib
import importlib.metadata as _metadata
import typing as _typing

from ._audit import AuditReport as AuditReport
from ._audit import CapturedConstant as CapturedConstant
from ._audit import audit as audit
from ._budget import device_budget as device_budget
from ._budget import set_device_budget as set_device_budget
from ._cache import Placement as Placement
from ._cache import set_accounting as set_accounting
from ._checkpoints import restore as restore
from ._errors import CapturedNumpyConstantError as CapturedNumpyConstantError
from ._errors import FrozenConstIndexError as FrozenConstIndexError
from ._errors import FrozenConstRuntimeError as FrozenConstRuntimeError
from ._errors import FrozenConstTypeError as FrozenConstTypeError
from ._errors import FrozenConstValueError as FrozenConstValueError
from ._errors import FrozenConstWarning as FrozenConstWarning
from ._errors import NotAddressableError as NotAddressableError
from ._errors import TracedValueError as TracedValueError
from ._export import Exported as Exported
from ._export import Loaded as Loaded
from ._export import export as export
from ._export import load as load
from ._filter_jit import filter_jit as filter_jit
from ._flax import register_flax as register_flax
from ._frozen import FrozenConst as FrozenConst
from ._guard import no_numpy_constants as no_numpy_constants
from ._install import install as _install_into_jax
from ._intern import intern as intern
from ._jit import jit as jit
from ._stats import ConstStats as ConstStats
from ._stats import Stats as Stats
from ._stats import stats as stats
from ._training import combine as combine
from ._training import is_frozen as is_frozen
from ._training import is_trainable as is_trainable
from ._training import partition as partition

# Everything frozenconst changes in JAX's state (and flax's and hypothesis's, where imported),
# in one place and one call (`_install`): from now on every jit keeps FrozenConsts out of the
# programs it compiles.
_install_into_jax()

if _typing.TYPE_CHECKING:
    from . import nnx as nnx
else:

    def __getattr__(name: str) -> object:
        # `frozenconst.nnx` (flax NNX's place for constants) imports flax: loaded on its first
        # use, so that `import frozenconst` never imports flax (a module attribute, so names
        # the package defines cost nothing more to read).
        if name == "nnx":
            return _importlib.import_module(".nnx", __name__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


try:
    __version__ = _metadata.version("frozenconst")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"
