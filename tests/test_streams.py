"""Generator tools: recorded unknown while they run; a stored value (an operator's verdict) replays."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from airlock_redis import EffectGuard, EffectRefused, EffectStore, reversibility, tool_call_context


def test_an_async_generator_replays_an_operators_stored_value_item_by_item(store: EffectStore) -> None:
    guard = EffectGuard(store=store)
    produced: list[int] = []

    @guard.wrap
    async def stream(n: int) -> AsyncIterator[int]:
        for i in range(n):
            produced.append(i)
            yield i

    async def collect() -> list[int]:
        with tool_call_context("s-1"):
            return [item async for item in stream(3)]

    assert asyncio.run(collect()) == [0, 1, 2]
    record = store.get("s-1")
    assert record is not None and record.status.value == "unknown"
    with pytest.raises(EffectRefused, match="effect_status_unknown"):
        asyncio.run(collect())
    guard.resolve("s-1", "committed", force=True, value=[7, 8])
    assert asyncio.run(collect()) == [7, 8]
    assert produced == [0, 1, 2]


def test_a_generator_tool_is_unknown_and_a_reversible_one_runs_again(store: EffectStore) -> None:
    guard = EffectGuard(store=store)
    runs: list[str] = []

    @reversibility("reversible")
    @guard.wrap
    def rows(n: int) -> Iterator[int]:
        runs.append("ran")
        yield from range(n)

    with tool_call_context("g-1"):
        assert list(rows(2)) == [0, 1]
        assert list(rows(2)) == [0, 1]
    assert runs == ["ran", "ran"]
    record = store.get("g-1")
    assert record is not None and record.status.value == "unknown"
