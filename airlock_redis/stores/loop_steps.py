"""Driving an async generator hook from synchronous code (the hooks that close a loop's clients
when the loop shuts down)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any


def step(step: Coroutine[Any, Any, Any]) -> None:
    """Run one step of an async generator that does not suspend, from synchronous code."""
    try:
        step.send(None)
    except StopIteration:
        return
    step.close()
    raise RuntimeError("an async generator step suspended unexpectedly")
