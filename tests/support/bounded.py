"""Bounded waits for tests: a wait on something the code exposes (a task ending, an event set)
that fails the test with the reason when it does not happen, instead of hanging the run.

The bound is not a timing claim: what is awaited should happen at once (a failure raised, a
cancellation delivered), and the bound only stops a regression from turning into a suite that
never ends (pytest-timeout, pyproject.toml, is the last resort: it ends the whole run)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

import pytest

T = TypeVar("T")

# Generous for a loaded 2-core machine, where what is awaited takes milliseconds.
BOUND_S = 30.0


async def within(awaitable: Awaitable[T], why: str, seconds: float = BOUND_S) -> T:
    """`await awaitable`, or fail with `why` (what the wait shows is broken) after `seconds`."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        pytest.fail(f"{why} (still waiting after {seconds:.0f} s)", pytrace=False)
