"""Helpers shared by the topology tests: a guarded tool that counts real executions."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from typing import Any

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context


class Counted:
    """A sync and an async tool whose executions are counted per tool_call_id, guarded by ``store``."""

    def __init__(self, store: RedisEffectStore) -> None:
        self.runs: Counter[str] = Counter()
        self.guard = EffectGuard(store=store)
        runs = self.runs

        def charge(account: str, cents: int) -> dict[str, Any]:
            runs[account] += 1
            return {"account": account, "cents": cents, "receipt": secrets.token_hex(4)}

        async def acharge(account: str, cents: int) -> dict[str, Any]:
            runs[account] += 1
            return {"account": account, "cents": cents, "receipt": secrets.token_hex(4)}

        self.charge = self.guard.wrap(charge, name="charge")
        self.acharge = self.guard.wrap(acharge, name="charge")

    def call(self, tool_call_id: str, account: str) -> dict[str, Any]:
        with tool_call_context(tool_call_id):
            return self.charge(account=account, cents=500)

    async def acall(self, tool_call_id: str, account: str) -> dict[str, Any]:
        with tool_call_context(tool_call_id):
            return await self.acharge(account=account, cents=500)


def fresh_id(prefix: str = "call") -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def namespace() -> str:
    return f"topo:{secrets.token_hex(4)}"


def assert_replays_across_two_stores(url: str) -> None:
    """A call made through one store object replays through another (sync, async, and across kinds);
    each tool body ran once."""
    ns = namespace()
    first = Counted(RedisEffectStore(url, namespace=ns))
    second = Counted(RedisEffectStore(url, namespace=ns))
    sync_id, async_id = fresh_id(), fresh_id()
    original = first.call(sync_id, "acct-sync")
    assert second.call(sync_id, "acct-sync") == original

    async def scenario() -> None:
        made = await first.acall(async_id, "acct-async")
        assert await second.acall(async_id, "acct-async") == made
        assert await second.acall(sync_id, "acct-sync") == original

    asyncio.run(scenario())
    assert first.runs == {"acct-sync": 1, "acct-async": 1}
    assert sum(second.runs.values()) == 0


def recorded(pipe: Any, batches: list[list[tuple[Any, ...]]]) -> Any:
    """``pipe`` (a redis-py pipeline) noting the commands it is given as a new entry of ``batches``:
    what a recording client's ``pipeline()`` returns, to see what each batch carried."""
    batch: list[tuple[Any, ...]] = []
    batches.append(batch)
    send = pipe.execute_command

    def recording(*args: Any, **options: Any) -> Any:
        batch.append(args)
        return send(*args, **options)

    pipe.execute_command = recording
    return pipe
