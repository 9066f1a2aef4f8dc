"""A rule written once as a generator, carried out by blocking code or by a coroutine.

The generator yields what to do (plain data) and is sent what came of it; an error the I/O raised is
thrown into it at the ``yield``, so the rule decides what an error means. The drivers below are the
only place the two I/O styles differ: the rule itself is never written twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

R = TypeVar("R")
Plan = Generator[Any, Any, R]


def drive(plan: Plan[R], perform: Callable[[Any], Any]) -> R:
    """Carry ``plan`` out with blocking I/O: ``perform(op)`` for each operation it yields."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            op = plan.send(reply) if error is None else plan.throw(error)
        except StopIteration as done:
            result: R = done.value
            return result
        try:
            reply, error = perform(op), None
        except Exception as exc:  # the rule decides what it means (or lets it go on)
            reply, error = None, exc


async def adrive(plan: Plan[R], perform: Callable[[Any], Awaitable[Any]]) -> R:
    """:func:`drive` with a coroutine: ``await perform(op)`` for each operation."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            op = plan.send(reply) if error is None else plan.throw(error)
        except StopIteration as done:
            result: R = done.value
            return result
        try:
            reply, error = await perform(op), None
        except Exception as exc:
            reply, error = None, exc
