"""frozenconst's benchmark suite: `python -m benchmarks` (see README)."""
