"""frozenconst's pytest plugin (entry point `pytest11`): the `no_numpy_constants` fixture.

It lives outside the package, and imports frozenconst (and JAX) only when a
test requests the fixture: pytest loads every installed plugin in every run,
and an unrelated suite must not pay for JAX's import.

A test that requests the fixture fails when code it runs captures a raw NumPy
constant above `frozenconst_max_numpy_constant_bytes` (an ini option, default
1024) in any function JAX compiles. The check closes right after the test body,
so the test itself fails (not its teardown), with the audit line in the message.
"""

from __future__ import annotations

import types
from collections.abc import Generator
from contextlib import AbstractContextManager
from typing import Any

import pytest

_KEY = pytest.StashKey[AbstractContextManager[None]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "frozenconst_max_numpy_constant_bytes",
        "largest raw NumPy constant the `no_numpy_constants` fixture allows",
        default="1024",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    __tracebackhide__ = True  # the report shows the test's line and the message, not this
    guard = None
    try:
        yield
    except BaseException as raised:
        guard = item.stash.get(_KEY, None)
        if guard is not None:
            del item.stash[_KEY]
            guard.__exit__(type(raised), raised, raised.__traceback__)  # what it found: a note
        raise
    guard = item.stash.get(_KEY, None)
    if guard is not None:
        del item.stash[_KEY]
        _close(guard, item)  # raises CapturedNumpyConstantError into the test's own outcome


def _close(guard: AbstractContextManager[None], item: pytest.Item) -> None:
    """Close the test's guard; its error, if any, is raised at the test's own line."""
    __tracebackhide__ = True
    try:
        guard.__exit__(None, None, None)
    except AssertionError as error:  # CapturedNumpyConstantError
        at = _test_line(getattr(error, "user_frames", ()), item)
        if at is None:
            raise
        raise error.with_traceback(at) from None


def _test_line(frames: Any, item: pytest.Item) -> types.TracebackType | None:
    """A traceback entry at the test function's line that compiled the offending program (the
    guard recorded the user's frames then), or None where the test's frame is not among them."""
    import inspect

    function = getattr(item, "function", None)
    codes = (
        {id(getattr(f, "__code__", None)) for f in (function, inspect.unwrap(function))}
        if function
        else set()
    )
    for frame, lasti, lineno in frames:
        if id(frame.f_code) in codes:
            return types.TracebackType(None, frame, lasti, lineno)
    return None


@pytest.fixture
def no_numpy_constants(request: pytest.FixtureRequest) -> Generator[None]:
    """Fail the test if traced code captures a raw NumPy constant above the threshold."""
    from frozenconst import no_numpy_constants as guard

    limit = int(request.config.getini("frozenconst_max_numpy_constant_bytes"))
    block = guard(limit)
    block.__enter__()
    request.node.stash[_KEY] = block
    yield
    leftover = request.node.stash.get(_KEY, None)
    if leftover is not None:  # the test body never ran
        del request.node.stash[_KEY]
        leftover.__exit__(None, None, None)
