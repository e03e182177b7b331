"""Command line: `python -m frozenconst audit MODULE:FUNCTION --shapes float32[1024,64] ...`.

Every error a user can make is one line on stderr and its own exit code
(`EXIT_CODES`, printed by `--help`); a Python traceback comes only with
`--traceback`, for an error raised by the user's own code.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import json
import pathlib
import re
import sys
import textwrap
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_LOAD = 3
EXIT_TRACE = 4

EXIT_CODES = {
    EXIT_OK: "audited (problems or not, without --fail-on-problems)",
    EXIT_PROBLEMS: "--fail-on-problems, and the report names a problem",
    EXIT_USAGE: "usage error: an unknown option, an unreadable DTYPE[DIMS], no MODULE:FUNCTION form, "
    "a factory that returns neither a tuple nor a dict, or arguments that do not fit the function's "
    "signature (a missing --shapes)",
    EXIT_LOAD: "cannot load: no such module, file or name, the module raised on import, the name is "
    "not callable, or the --args-from factory raised",
    EXIT_TRACE: "tracing failed: the function (or JAX) raised while traced with the given arguments",
}

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


class _Failure(Exception):
    """A user error: one line for stderr and an exit code."""

    def __init__(self, code: int, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.cause = cause


def _fail(code: int, message: str, cause: BaseException | None = None) -> NoReturn:
    raise _Failure(code, message, cause)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


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
        raise argparse.ArgumentTypeError(
            f"unknown dtype {name!r} in {spec!r}; write a JAX dtype such as float32, bf16 or int32"
        ) from err
    shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
    return jax.ShapeDtypeStruct(shape, dtype)  # type: ignore[no-untyped-call,unused-ignore]


def _import(where: str) -> ModuleType:
    if where.endswith(".py"):
        path = pathlib.Path(where).resolve()
        if not path.is_file():
            _fail(EXIT_LOAD, f"no file {where} (looked in {pathlib.Path.cwd()})")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a loader
            _fail(EXIT_LOAD, f"cannot load {where} as a Python module")
        module = importlib.util.module_from_spec(spec)
        # As `python path/to/file.py` would: its own directory first, for its sibling imports.
        sys.path.insert(0, str(path.parent))
        sys.modules[path.stem] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            _fail(EXIT_LOAD, f"importing {where} raised {_one_line(err)}", err)
        return module
    sys.path.insert(0, str(pathlib.Path.cwd()))
    try:
        return importlib.import_module(where)
    except Exception as err:
        missing = err.name if isinstance(err, ModuleNotFoundError) else None
        if missing is not None and (where == missing or where.startswith(missing + ".")):
            _fail(EXIT_LOAD, f"no module named {missing!r} (on sys.path, with {pathlib.Path.cwd()} first)")
        _fail(EXIT_LOAD, f"importing {where} raised {_one_line(err)}", err)


def _resolve(qualified: str, module: ModuleType | None) -> tuple[Callable[..., Any], ModuleType]:
    """`package.module:function` or `path/to/file.py:function` (dotted attributes too), and its
    module; `:function` alone names one of `module` (the audited function's, for `--args-from`)."""
    where, sep, name = qualified.rpartition(":")
    if not sep or not name or (not where and module is None):
        _fail(EXIT_USAGE, f"expected MODULE:FUNCTION or path/to/file.py:FUNCTION, got {qualified!r}")
    owner = _import(where) if where else module
    assert owner is not None
    obj: Any = owner
    for part in name.split("."):
        if not hasattr(obj, part):
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            _fail(EXIT_LOAD, f"{where or owner.__name__} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        _fail(EXIT_LOAD, f"{qualified} is not a function but of type {type(obj).__name__}")
    return obj, owner


def _example_arguments(factory: Callable[..., Any], qualified: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    try:
        made = factory()
    except Exception as err:
        _fail(EXIT_LOAD, f"calling {qualified}() raised {_one_line(err)}", err)
    if isinstance(made, tuple):
        return made, {}
    if isinstance(made, dict) and all(isinstance(k, str) for k in made):
        return (), made
    _fail(
        EXIT_USAGE,
        f"{qualified}() returned a {type(made).__name__}; return a tuple of positional arguments "
        "(a 1-tuple for one) or a dict of keyword arguments",
    )


def _check_signature(
    fun: Callable[..., Any], qualified: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):  # no signature to check (a builtin): tracing will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        _fail(
            EXIT_USAGE,
            f"{qualified}{signature} cannot take the {len(args)} positional argument(s)"
            f"{' and the keywords ' + ', '.join(kwargs) if kwargs else ''} given: {err}; give one "
            "--shapes DTYPE[DIMS] per positional argument, or --args-from MODULE:FACTORY for pytrees",
        )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, and argparse's exit code (2), instead of the usage block.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_EPILOG = "exit codes:\n" + "\n".join(
    textwrap.fill(what, width=78, initial_indent=f"  {code}  ", subsequent_indent="     ")
    for code, what in EXIT_CODES.items()
)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m frozenconst",
        description="frozenconst tools",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    audit = commands.add_parser(
        "audit",
        help="trace a function and report the constants it captures",
        description="Trace MODULE:FUNCTION (without running or compiling it) and print every constant "
        "it captures, with each problem and its fix. Give its arguments as --shapes (arrays) or "
        "--args-from (any pytrees).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument("function", help="package.module:function or path/to/file.py:function")
    given = audit.add_mutually_exclusive_group()
    given.add_argument(
        "--shapes",
        nargs="*",
        default=[],
        type=parse_shape,
        metavar="DTYPE[DIMS]",
        help="the positional arguments, each an array of this dtype and shape, e.g. float32[1024,64] int32[]",
    )
    given.add_argument(
        "--args-from",
        metavar="MODULE:FACTORY",
        help="a function of no arguments that returns the example arguments: a tuple of positional "
        "arguments (a 1-tuple for one) or a dict of keyword arguments, each any pytree of arrays or "
        "jax.ShapeDtypeStruct (jax.eval_shape gives those without allocating); :FACTORY alone names "
        "one in FUNCTION's module",
    )
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.add_argument(
        "--fail-on-problems", action="store_true", help=f"exit {EXIT_PROBLEMS} if any problem is found"
    )
    audit.add_argument(
        "--traceback", action="store_true", help="print the whole traceback of an error raised by your code"
    )
    return parser


def _audit(args: argparse.Namespace) -> int:
    from . import audit as run_audit

    fun, module = _resolve(args.function, None)
    if args.args_from is not None:
        factory, _ = _resolve(args.args_from, module)
        named = args.args_from if not args.args_from.startswith(":") else f"{module.__name__}{args.args_from}"
        positional, keywords = _example_arguments(factory, named)
    else:
        positional, keywords = tuple(args.shapes), {}
    _check_signature(fun, args.function, positional, keywords)
    try:
        report = run_audit(fun, *positional, **keywords)
    except Exception as err:
        _fail(EXIT_TRACE, f"tracing {args.function} raised {_one_line(err)}", err)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return EXIT_PROBLEMS if args.fail_on_problems and report.lines() else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _audit(args)
    except _Failure as failure:
        if failure.cause is not None and args.traceback:
            traceback.print_exception(failure.cause, file=sys.stderr)
        hint = " (--traceback shows where)" if failure.cause is not None and not args.traceback else ""
        print(f"python -m frozenconst audit: error: {failure}{hint}", file=sys.stderr)
        return failure.code


if __name__ == "__main__":
    sys.exit(main())
