"""Waiting on conditions in tests: poll a predicate until it holds or time runs out.

Tests synchronise on observable events through these helpers, never on sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 20.0


async def wait_for_condition(
    predicate: Callable[[], bool],
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "condition",
    interval: float = 0.02,
) -> None:
    """Return as soon as `predicate()` is true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def within(awaitable: Awaitable[T], timeout: float = DEFAULT_TIMEOUT, what: str = "") -> T:
    """Await with a timeout that fails the test with a readable message."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what or awaitable}"
        ) from None
