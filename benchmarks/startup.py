"""What installing frozenconst adds to other tools' start-up (issue #27, section 1).

    python -m benchmarks startup [--quick]

Two commands, each timed in fresh processes with frozenconst's entry points on
and with them off, alternating on/off and off/on from round to round; the
figures are medians:

- `python -c "import hypothesis"` against the same with `HYPOTHESIS_NO_PLUGINS=1`
  (target: at most 0.15 s more);
- a one-test pytest run of code that never uses frozenconst (it imports
  hypothesis, so both entry points run) against the same with `-p no:frozenconst`
  and `HYPOTHESIS_NO_PLUGINS=1` (target: at most 0.25 s more).

It measures the environment it runs in, so it refuses one whose installed entry
points are not this checkout's (an editable install made before they moved):
`pip install -e .` first.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGETS_S = {"import hypothesis": 0.15, "pytest, one unrelated test": 0.25}

_UNRELATED_TEST = "import hypothesis\n\n\ndef test_unrelated():\n    assert 1 + 1 == 2\n"


def _check_entry_points() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]
    for group, points in declared.items():
        installed = {e.name: e.value for e in importlib.metadata.entry_points(group=group)}
        if installed.get("frozenconst") != points["frozenconst"]:
            raise SystemExit(
                f"error: this environment's `{group}` entry point is {installed.get('frozenconst')!r}, "
                f"pyproject.toml declares {points['frozenconst']!r}: reinstall (pip install -e .) first"
            )


def _seconds(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - start


def measure(rounds: int) -> list[dict[str, Any]]:
    """One row per command: median seconds with the plugins on and off, and the difference."""
    _check_entry_points()
    base = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_NO_PLUGINS"}
    off = dict(base, HYPOTHESIS_NO_PLUGINS="1")
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_unrelated.py"]
    commands = {
        "import hypothesis": ([sys.executable, "-c", "import hypothesis"], []),
        "pytest, one unrelated test": (pytest, ["-p", "no:frozenconst"]),
    }
    rows = []
    with tempfile.TemporaryDirectory() as suite:
        # Outside the checkout: no conftest, no pyproject.toml, no frozenconst on the path.
        pathlib.Path(suite, "pytest.ini").write_text("[pytest]\n")
        pathlib.Path(suite, "test_unrelated.py").write_text(_UNRELATED_TEST)
        for name, (cmd, flags_off) in commands.items():
            on_runs: list[float] = []
            off_runs: list[float] = []
            _seconds(cmd, base, suite)  # warm the file cache
            for r in range(rounds):
                pair = [(on_runs, cmd, base), (off_runs, cmd + flags_off, off)]
                for runs, command, env in pair if r % 2 == 0 else pair[::-1]:
                    runs.append(_seconds(command, env, suite))
            on_s, off_s = statistics.median(on_runs), statistics.median(off_runs)
            rows.append(
                {
                    "command": name,
                    "on_s": on_s,
                    "off_s": off_s,
                    "extra_s": on_s - off_s,
                    "ratio": on_s / off_s,
                    "target_extra_s": TARGETS_S[name],
                    "rounds": rounds,
                }
            )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| command | plugins on, s | plugins off, s | extra, s (target) | on / off |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        met = "met" if r["extra_s"] <= r["target_extra_s"] else "missed"
        lines.append(
            f"| {r['command']} | {r['on_s']:.3f} | {r['off_s']:.3f} | "
            f"{r['extra_s']:+.3f} (at most {r['target_extra_s']}: {met}) | {r['ratio']:.2f}x |"
        )
    return "\n".join(lines)


def main(quick: bool, docs: pathlib.Path) -> None:
    from ._harness import environment

    rounds = 5 if quick else 15
    rows = measure(rounds)
    env = environment()
    header = "\n".join(f"- {k}: {v}" for k, v in env.items())
    command = "python -m benchmarks startup" + (" --quick" if quick else "")
    text = (
        "# Start-up cost of the installed entry points\n\n"
        f"Produced by `{command}` ({rounds} alternating rounds per command, medians) on:\n\n{header}\n\n"
        + table(rows)
        + "\n"
    )
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "benchmark-startup.md").write_text(text)
    print(table(rows))
