"""How each transition script travels (lua/ through RedisEffectStore), on a real server: a commit and a
settle to unknown go as EVALSHA on their first try (the cheap form), a release and an operator's verdict
as EVAL with the source (they must run when they land late, whatever the script cache holds), and a
first try answered NOSCRIPT is sent again with the source, so an emptied cache costs nothing but a
round trip."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from airlock_redis import EffectGuard, RedisEffectStore, Settlement, TransitionResult
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import BeginRequest


@pytest.fixture
def admin(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    with redis_server.client() as client:
        yield client


def _calls(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha")}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in before}


def _request(tool_call_id: str) -> BeginRequest:
    return BeginRequest(tool_call_id, "k" * 64, "charge", "a" * 32, False)


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_commit_goes_as_evalsha_and_a_release_as_eval(
    redis_server: EmbeddedRedis, admin: redis.Redis, namespace: str, mode: str
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace)

    def run(name: str, *args: Any) -> Any:
        if mode == "sync":
            return getattr(store, name)(*args)

        async def go() -> Any:
            try:
                return await getattr(store, "a" + name)(*args)
            finally:
                await store.aclose()

        return asyncio.run(go())

    run("begin", _request("warm"))  # the store's first begin: the begin script, with its source
    run("commit", _request("warm"), 1, b"\x01", None)  # loads the commit script (NOSCRIPT, then EVAL)
    assert run("begin", _request("one")).kind.value == "started"
    before = _calls(admin)
    assert run("commit", _request("one"), 1, b"\x01", None) is TransitionResult.OK
    assert _delta(before, _calls(admin)) == {"eval": 0, "evalsha": 1}
    assert run("begin", _request("two")).kind.value == "started"
    before = _calls(admin)
    assert run("settle", _request("two"), 1, Settlement.RELEASE) is TransitionResult.OK
    assert _delta(before, _calls(admin)) == {"eval": 1, "evalsha": 0}
    assert run("begin", _request("three")).kind.value == "started"
    before = _calls(admin)
    assert run("settle", _request("three"), 1, Settlement.UNKNOWN) is TransitionResult.OK
    assert _delta(before, _calls(admin)) == {"eval": 0, "evalsha": 1}
    store.close()


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_commit_after_script_flush_is_sent_again_with_its_source_and_replays(
    redis_server: EmbeddedRedis, admin: redis.Redis, namespace: str, mode: str
) -> None:
    guard = EffectGuard(RedisEffectStore(redis_server.url, namespace=namespace))
    runs: list[int] = []

    def charge(cents: int) -> int:
        runs.append(cents)
        if cents == 2:
            admin.script_flush()  # the cache empties while the tool runs: the commit meets NOSCRIPT
        return cents

    async def acharge(cents: int) -> int:
        return charge(cents)

    acharge.__name__ = "charge"

    def call(tool_call_id: str, cents: int) -> int:
        if mode == "sync":
            return guard.call(tool_call_id, charge, cents)
        return asyncio.run(guard.acall(tool_call_id, acharge, cents))

    assert call("c1", 1) == 1
    before = _calls(admin)
    assert call("c2", 2) == 2
    counted = _delta(before, _calls(admin))
    assert counted["evalsha"] >= 1 and counted["eval"] >= 1, counted  # NOSCRIPT, then the source
    assert call("c2", 2) == 2  # replayed: the commit landed
    assert runs == [1, 2]
