"""Tools whose executions are counted, in a sync and an async flavour, for the table-driven tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from airlock_redis import EffectGuard, reversibility, tool_call_context
from airlock_redis.core.reversibility import ReversibilityName


@dataclass
class Counted:
    """A tool body that records each execution and does what ``behaviour`` says."""

    name: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    behaviour: Callable[[dict[str, Any]], Any] | None = None

    def body(self, **kwargs: Any) -> Any:
        self.runs.append(kwargs)
        if self.behaviour is not None:
            return self.behaviour(kwargs)
        return {"tool": self.name, "run": len(self.runs), **kwargs}


def make_tool(
    guard: EffectGuard, counted: Counted, kind: str, tag: ReversibilityName | None = None
) -> Callable[..., Any]:
    """A guarded tool ``(account: str, cents: int)``; kind "sync" or "async". Returns a blocking caller."""
    if kind == "sync":

        def sync_tool(account: str, cents: int = 0) -> Any:
            return counted.body(account=account, cents=cents)

        sync_tool.__name__ = counted.name
        return guard.wrap(sync_tool if tag is None else reversibility(tag)(sync_tool))

    async def async_tool(account: str, cents: int = 0) -> Any:
        await asyncio.sleep(0)
        return counted.body(account=account, cents=cents)

    async_tool.__name__ = counted.name
    target: Callable[..., Coroutine[Any, Any, Any]] = (
        async_tool if tag is None else reversibility(tag)(async_tool)
    )
    wrapped: Callable[..., Coroutine[Any, Any, Any]] = guard.wrap(target)

    def call(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(wrapped(*args, **kwargs))

    call.__wrapped__ = wrapped  # type: ignore[attr-defined]
    return call


def call_with_id(tool: Callable[..., Any], tool_call_id: str | None, *args: Any, **kwargs: Any) -> Any:
    with tool_call_context(tool_call_id):
        return tool(*args, **kwargs)
