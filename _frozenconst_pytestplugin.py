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

import contextlib
from collections.abc import Generator

import pytest

_KEY = pytest.StashKey[contextlib.ExitStack]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "frozenconst_max_numpy_constant_bytes",
        "largest raw NumPy constant the `no_numpy_constants` fixture allows",
        default="1024",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        yield
    finally:
        stack = item.stash.get(_KEY, None)
        if stack is not None:
            del item.stash[_KEY]
            stack.close()  # raises CapturedNumpyConstantError into the test's own outcome


@pytest.fixture
def no_numpy_constants(request: pytest.FixtureRequest) -> Generator[None]:
    """Fail the test if traced code captures a raw NumPy constant above the threshold."""
    from frozenconst import no_numpy_constants as guard

    limit = int(request.config.getini("frozenconst_max_numpy_constant_bytes"))
    stack = contextlib.ExitStack()
    stack.enter_context(guard(limit))
    request.node.stash[_KEY] = stack
    yield
    leftover = request.node.stash.get(_KEY, None)
    if leftover is not None:  # the test body never ran
        del request.node.stash[_KEY]
        leftover.close()
