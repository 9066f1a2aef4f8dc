"""What kind of callable a tool (or an approver) is. Pure."""

from __future__ import annotations

import inspect
from typing import Any


def is_async_callable(fn: Any) -> bool:
    """An ``async def`` function, a partial or method of one, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = None if inspect.isroutine(fn) else getattr(type(fn), "__call__", None)  # noqa: B004
    return call is not None and inspect.iscoroutinefunction(call)
