"""The seed scenario, as a user would write it: one NumPy table used by 40 layers.

python -m frozenconst audit examples/seed_model.py:forward --shapes float32[40,256,8]
python -m frozenconst audit examples/seed_model.py:forward_fixed --shapes float32[40,256,8]
"""

import jax.numpy as jnp
import numpy as np

import frozenconst

TABLE = np.random.default_rng(0).standard_normal((1024, 256)).astype(np.float32)  # 1 MiB
FROZEN = frozenconst.FrozenConst(TABLE)


def forward(weights):
    """Before: the raw NumPy table, captured once per layer."""
    return sum(jnp.sum(TABLE @ weights[i]) for i in range(weights.shape[0]))


@frozenconst.jit
def forward_fixed(weights):
    """After: a FrozenConst, compiled with frozenconst.jit."""
    return sum(jnp.sum(FROZEN @ weights[i]) for i in range(weights.shape[0]))
