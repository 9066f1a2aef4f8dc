"""Races on one tool_call_id through the asyncio path of a real redis-server: 1,000 coroutines in one
process, then the same split across 4 spawned processes, run the tool exactly once."""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aredis

from airlock_redis import EffectGuard, EffectStatusUnknown, RedisEffectStore, Status, tool_call_context
from airlock_redis.embedded import EmbeddedRedis

HANG_LIMIT = 120.0  # seconds: a bound so a broken feature fails instead of hanging (not a timing assert)

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]


@dataclass(frozen=True)
class Tally:
    returned: int  # got the value: the one execution, or a replay of it
    refused: int  # effect_status_unknown: arrived while the execution was in flight (no lease)
    other: tuple[str, ...]  # anything else (must stay empty)
    values: tuple[str, ...]  # the distinct values returned
    waited: int = 0  # calls that waited for the running execution, then went on


class CountsWaits:
    """An observer that counts the calls that waited for a running attempt."""

    def __init__(self) -> None:
        self.waited = 0

    def call_event(self, event: str, tool: str, tool_call_id: str | None, **fields: Any) -> None:
        self.waited += event == "waited"

    def store_operation(self, operation: str, duration_s: float | None, error: BaseException | None) -> None:
        pass


async def race(url: str, namespace: str, tool_call_id: str, coroutines: int, **options: Any) -> Tally:
    """Run ``coroutines`` guarded calls of one tool under one id at once; the tool counts its runs in
    Redis (so runs in every process are counted together)."""
    store = RedisEffectStore(url, namespace=namespace)
    counter = f"{namespace}:executions"
    me = secrets.token_hex(4)

    async def transfer(source: str, target: str, cents: int) -> str:
        await store.async_client().incr(counter)
        await asyncio.sleep(0.02)  # keep the effect in flight while the others arrive
        return f"moved {cents} by {me}"

    observer = CountsWaits()
    tool = EffectGuard(store, observer=observer, **options).wrap(transfer)
    start = asyncio.Event()

    async def one() -> Any:
        await start.wait()  # set just below; the gather's bound covers the rest
        with tool_call_context(tool_call_id):
            return await tool("acct_a", "acct_b", 2500)

    tasks = [asyncio.create_task(one()) for _ in range(coroutines)]
    await asyncio.sleep(0)
    start.set()
    # bounded, so a call that never finishes fails the test instead of hanging it
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), HANG_LIMIT)
    outcomes = Counter(
        "returned" if isinstance(r, str) else "refused" if isinstance(r, EffectStatusUnknown) else "other"
        for r in results
    )
    await store.aclose()
    return Tally(
        returned=outcomes["returned"],
        refused=outcomes["refused"],
        other=tuple(repr(r) for r in results if not isinstance(r, (str, EffectStatusUnknown))),
        values=tuple(sorted({r for r in results if isinstance(r, str)})),
        waited=observer.waited,
    )


async def executions(url: str, namespace: str) -> int:
    client = aredis.Redis.from_url(url)
    try:
        return int(await client.get(f"{namespace}:executions") or 0)
    finally:
        await client.aclose()


@pytest.mark.parametrize("leased", [True, False], ids=["waits", "no-lease"])
def test_a_thousand_coroutines_with_one_id_execute_once(
    redis_server: EmbeddedRedis, namespace: str, leased: bool
) -> None:
    """With the default lease the duplicates that arrive while the execution runs wait for it and
    replay its value; without a lease (the spec's table) they are refused as in doubt."""
    options: dict[str, Any] = {} if leased else {"lease": None, "wait_for_running": 0}

    async def main() -> tuple[Tally, int]:
        tally = await race(redis_server.url, namespace, "race-1", 1000, **options)
        return tally, await executions(redis_server.url, namespace)

    tally, ran = asyncio.run(main())
    assert ran == 1
    assert tally.other == ()
    assert tally.returned + tally.refused == 1000
    assert tally.returned >= 1 and len(tally.values) == 1  # every value seen is the one execution's
    if leased:  # the in-flight window was hit (the race was real), and every call got the value
        assert tally.waited >= 1 and tally.returned == 1000
    else:
        assert tally.refused >= 1
    record = RedisEffectStore(redis_server.url, namespace=namespace).get("race-1")
    assert record is not None and record.status is Status.COMMITTED and record.attempt == 1


def _race_in_process(job: tuple[str, str, str, int], barrier: Any, results: Any) -> None:
    barrier.wait(timeout=60)
    results.put(asyncio.run(race(*job)))


def test_four_processes_of_250_coroutines_with_one_id_execute_once(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(4)
    results = spawn.Queue()
    workers = [
        spawn.Process(
            target=_race_in_process,
            args=((redis_server.url, namespace, "race-4", 250), barrier, results),
            daemon=True,
        )
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    try:
        tallies: list[Tally] = [results.get(timeout=120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
                worker.join()
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert asyncio.run(executions(redis_server.url, namespace)) == 1
    assert all(t.other == () for t in tallies)
    assert sum(t.returned + t.refused for t in tallies) == 1000
    assert sum(t.returned for t in tallies) >= 1
    assert len({v for t in tallies for v in t.values}) == 1  # one execution's value, in every process
    record = RedisEffectStore(redis_server.url, namespace=namespace).get("race-4")
    assert record is not None and record.status is Status.COMMITTED and record.attempt == 1
