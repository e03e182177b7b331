"""Command line: `python -m frozenconst audit MODULE:FUNCTION --shapes float32[1024,64] ...`."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import pathlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

_SHORT = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "c64": "complex64",
    "c128": "complex128",
    "pred": "bool",
}


def parse_shape(spec: str) -> Any:
    """`float32[1024,64]` (or JAX's short `f32[1024,64]`) as a `jax.ShapeDtypeStruct`."""
    import jax
    import jax.numpy as jnp

    match = re.fullmatch(r"\s*([A-Za-z0-9_]+)\[([0-9, ]*)\]\s*", spec)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"cannot read the shape {spec!r}; write DTYPE[DIMS], for example float32[1024,64] or int32[]"
        )
    name, dims = match.groups()
    try:
        dtype = jnp.dtype(_SHORT.get(name, name))
    except TypeError as err:
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r} in {spec!r}") from err
    shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
    struct: Any = jax.ShapeDtypeStruct(shape, dtype)  # type: ignore[no-untyped-call,unused-ignore]
    return struct


def load(qualified: str) -> Callable[..., Any]:
    """`package.module:function` or `path/to/file.py:function` (attributes may be dotted)."""
    if ":" not in qualified:
        raise SystemExit(f"error: expected MODULE:FUNCTION, got {qualified!r}")
    where, name = qualified.rsplit(":", 1)
    if where.endswith(".py"):
        path = pathlib.Path(where).resolve()
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"error: cannot load {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(pathlib.Path.cwd()))
        module = importlib.import_module(where)
    obj: Any = module
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise SystemExit(f"error: {qualified} is not callable")
    fun: Callable[..., Any] = obj
    return fun


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m frozenconst", description="frozenconst tools")
    commands = parser.add_subparsers(dest="command", required=True)
    audit = commands.add_parser(
        "audit",
        help="trace a function and report the constants it captures",
        description="Trace MODULE:FUNCTION (without running or compiling it) and print every constant "
        "it captures, with each problem and its fix.",
    )
    audit.add_argument("function", help="package.module:function or path/to/file.py:function")
    audit.add_argument(
        "--shapes",
        nargs="*",
        default=[],
        type=parse_shape,
        metavar="DTYPE[DIMS]",
        help="the positional arguments' shapes, e.g. float32[1024,64] int32[]",
    )
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.add_argument("--fail-on-problems", action="store_true", help="exit 1 if any problem is found")
    args = parser.parse_args(argv)

    from . import audit as run_audit

    report = run_audit(load(args.function), *args.shapes)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 1 if args.fail_on_problems and report.lines() else 0


if __name__ == "__main__":
    sys.exit(main())
