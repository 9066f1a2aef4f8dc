"""A burst of first calls reads the server's facts once, not once per call, on a real redis-server.

The first begin of a store reads the server's settings (``INFO`` sections, ``CONFIG GET
proto-max-bulk-len``) before it writes anything. Found while profiling issue 27: 256 concurrent first
calls of a fresh store each read them, hundreds of ``INFO`` replies parsed in Python, seconds of a
service's start spent on it. While one begin reads them, the others wait for its answer.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import threading
from typing import Any

import pytest
import redis

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context
from airlock_redis.embedded import EmbeddedRedis
from tests.faults import Action, ChaosProxy, Fault, is_command

pytestmark = pytest.mark.redis_server

CALLS = 200


def info_calls(admin: redis.Redis) -> int:
    stats: dict[str, Any] = admin.info("commandstats")
    return int(stats.get("cmdstat_info", {}).get("calls", 0))


def burst_of_first_calls(store: RedisEffectStore, calls: int) -> tuple[list[int], list[int]]:
    """``calls`` concurrent first asyncio calls of ``store`` under new ids, in one ``asyncio.run``: the
    values they returned, in order, and the runs of their tool."""
    runs: list[int] = []

    async def charge(n: int) -> int:
        runs.append(n)
        return n

    tool = EffectGuard(store).wrap(charge)

    async def one(n: int) -> int:
        with tool_call_context(f"first-{n}"):
            return await tool(n)

    async def burst() -> list[int]:
        values = await asyncio.gather(*(one(n) for n in range(calls)))
        await store.aclose()
        return values

    return asyncio.run(burst()), runs


def test_concurrent_first_asyncio_calls_read_the_facts_once(redis_server: EmbeddedRedis) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    store = RedisEffectStore(redis_server.url, namespace=f"facts-{secrets.token_hex(4)}")
    before = info_calls(admin)
    values, runs = burst_of_first_calls(store, CALLS)
    read = info_calls(admin) - before
    assert values == list(range(CALLS))
    assert sorted(runs) == list(range(CALLS))
    assert store.server_facts is not None
    assert 1 <= read <= 6, f"{CALLS} concurrent first calls sent {read} INFO commands"


def test_concurrent_first_blocking_calls_read_the_facts_once(redis_server: EmbeddedRedis) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    store = RedisEffectStore(redis_server.url, namespace=f"facts-{secrets.token_hex(4)}")
    tool = EffectGuard(store).wrap(lambda n: n)
    start = threading.Barrier(16)
    values: list[int] = []

    def one(n: int) -> None:
        start.wait()
        with tool_call_context(f"first-{n}"):
            values.append(tool(n))

    before = info_calls(admin)
    threads = [threading.Thread(target=one, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    read = info_calls(admin) - before
    store.close()
    assert sorted(values) == list(range(16))
    assert 1 <= read <= 6, f"16 concurrent first blocking calls sent {read} INFO commands"


def test_a_first_read_that_fails_lets_a_waiting_call_read_them(redis_server: EmbeddedRedis) -> None:
    """The first reader's INFO is held on its way past the socket timeout: its read fails (its call
    goes on, as before, without the facts), and a waiting call then reads them itself; every call
    runs its tool once."""
    admin = redis.Redis.from_url(redis_server.url)
    held = Fault(is_command("INFO"), Action.DELAY, times=1, delay=math.inf)
    with ChaosProxy(redis_server.socket_path, [held]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=f"facts-{secrets.token_hex(4)}", socket_timeout=0.5)
        before = info_calls(admin)
        values, runs = burst_of_first_calls(store, 20)
        proxy.release_held()
    assert values == list(range(20))
    assert held.applied == 1
    assert sorted(runs) == list(range(20))
    assert store.server_facts is not None, "no waiting call read the facts after the first read failed"
    assert info_calls(admin) - before <= 12
