"""Bad input that the codec, id and outcome tests leave out: records damaged in Redis (not a hash,
no status, an unknown status, missing fields, a missing value) and a result over the default size
limit. Each is refused with a clear error; the tool never runs and the record is left for an operator.

(Bad tool_call_ids, arguments without a canonical form, unstorable results and damaged value bytes
are covered in test_context_and_ids.py, test_options.py, test_canonical.py and test_codec.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    RedisEffectStore,
    Status,
    StoreError,
    reversibility,
    tool_call_context,
)
from airlock_redis.core.codec import DEFAULT_MAX_RESULT_BYTES
from airlock_redis.core.errors import CorruptRecordError

from .conftest import make_store

REDIS_KINDS = ("fakeredis", "redis")


@pytest.fixture(params=REDIS_KINDS)
def redis_store(request: pytest.FixtureRequest, namespace: str) -> RedisEffectStore:
    store = make_store(request.param, request, namespace)
    assert isinstance(store, RedisEffectStore)
    return store


def _tools(store: RedisEffectStore, runs: list[str]) -> dict[str, Callable[[], Any]]:
    guard = EffectGuard(store)

    def charge(account: str) -> str:
        runs.append("charge")
        return f"charged {account}"

    @reversibility("reversible")
    def lookup(account: str) -> str:
        runs.append("lookup")
        return f"looked up {account}"

    async def acharge(account: str) -> str:
        runs.append("acharge")
        return f"charged {account}"

    sync_charge, sync_lookup, async_charge = guard.wrap(charge), guard.wrap(lookup), guard.wrap(acharge)
    return {
        "charge": lambda: sync_charge("acct"),
        "lookup (reversible)": lambda: sync_lookup("acct"),
        "acharge (async)": lambda: asyncio.run(async_charge("acct")),
    }


def _call(tool: Callable[[], Any], tool_call_id: str) -> Any:
    with tool_call_context(tool_call_id):
        return tool()


def _damage_hash(store: RedisEffectStore, tool_call_id: str, how: str) -> None:
    client, key = store.client, store.key(tool_call_id)
    if how == "no status field":
        client.hdel(key, "status")
    elif how == "unknown status":
        client.hset(key, "status", "exploded")
    elif how == "no key field":
        client.hdel(key, "key")
    elif how == "no tool field":
        client.hdel(key, "tool")
    elif how == "not a hash":
        client.delete(key)
        client.set(key, b"\x00garbage")
    elif how == "value field missing":
        assert client.hget(key, "stored") == b"1"
        client.hdel(key, "value")
    else:  # pragma: no cover
        raise AssertionError(how)


DAMAGE = [
    "no status field",
    "unknown status",
    "no key field",
    "no tool field",
    "not a hash",
    "value field missing",
]


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("which", ["charge", "lookup (reversible)", "acharge (async)"])
def test_a_damaged_record_is_refused_as_corrupt_and_the_tool_does_not_run(
    redis_store: RedisEffectStore, how: str, which: str
) -> None:
    runs: list[str] = []
    tool = _tools(redis_store, runs)[which]
    _call(tool, "call-1")  # committed
    assert len(runs) == 1
    _damage_hash(redis_store, "call-1", how)
    snapshot = _dump(redis_store, "call-1")
    for _ in range(2):
        with pytest.raises(EffectRefused) as refused:
            _call(tool, "call-1")
        assert refused.value.reason == "record_corrupt", str(refused.value)
        message = str(refused.value)
        assert "cannot be trusted" in message and "Do not retry" in message and "call-1" in message
    assert len(runs) == 1  # never run again, a reversible tool included
    assert _dump(redis_store, "call-1") == snapshot  # the guard changed nothing: it is the operator's


def _dump(store: RedisEffectStore, tool_call_id: str) -> Any:
    key = store.key(tool_call_id)
    kind = store.client.type(key)
    if kind == b"hash":
        return kind, store.client.hgetall(key)
    return kind, store.client.get(key)


@pytest.mark.parametrize("status", ["pending", "unknown"])
def test_a_damaged_in_doubt_record_is_not_taken_over_by_a_reversible_tool(
    redis_store: RedisEffectStore, status: str
) -> None:
    runs: list[str] = []
    lookup = _tools(redis_store, runs)["lookup (reversible)"]
    _call(lookup, "call-1")
    client, key = redis_store.client, redis_store.key("call-1")
    client.hset(key, mapping={"status": status})
    client.hdel(key, "tool")
    with pytest.raises(EffectRefused) as refused:
        _call(lookup, "call-1")
    assert refused.value.reason == "record_corrupt"
    assert runs == ["lookup"]
    assert client.hget(key, "status") == status.encode()


@pytest.mark.parametrize("how", ["unknown status", "not a hash"])
def test_reading_a_damaged_record_is_a_clear_error(redis_store: RedisEffectStore, how: str) -> None:
    runs: list[str] = []
    _call(_tools(redis_store, runs)["charge"], "call-1")
    _damage_hash(redis_store, "call-1", how)
    with pytest.raises(CorruptRecordError) as info:
        redis_store.get("call-1")
    assert isinstance(info.value, StoreError)
    assert "status" in str(info.value) or "not a hash" in str(info.value)


def test_a_result_over_the_default_limit_is_not_stored_and_its_replay_refused(
    redis_store: RedisEffectStore,
) -> None:
    runs: list[int] = []
    guard = EffectGuard(redis_store)  # the default limit: 1 MiB

    def export(table: str) -> bytes:
        runs.append(1)
        return b"r" * (DEFAULT_MAX_RESULT_BYTES + 1)

    tool = guard.wrap(export)
    with tool_call_context("big-1"):
        first = tool("orders")
    assert len(first) == DEFAULT_MAX_RESULT_BYTES + 1  # the caller still gets it
    with tool_call_context("big-1"), pytest.raises(EffectRefused) as refused:
        tool("orders")
    assert refused.value.reason == "result_not_stored"
    assert runs == [1]
    record = redis_store.get("big-1")
    assert record is not None and (record.status, record.stored) == (Status.COMMITTED, False)
    assert redis_store.client.hstrlen(redis_store.key("big-1"), "value") == 0  # nothing huge in Redis
