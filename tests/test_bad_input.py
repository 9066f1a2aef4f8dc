"""Bad input that the codec, id and outcome tests leave out: records damaged in Redis (not a string,
a header that does not parse, an unknown status, fields cut short, a malformed attempt or list of
released tokens, a value cut off) and a result over the
default size limit. Each is refused with a clear error; the tool never runs and the record is left for
an operator.

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
from airlock_redis.stores import layout

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


def _damage(store: RedisEffectStore, tool_call_id: str, how: str) -> None:
    client, key = store.client, store.key(tool_call_id)
    data = client.get(key)
    assert isinstance(data, bytes)
    record = layout.parse(data)
    header = data[: data.index(b";") + 1]
    if how == "header does not parse":
        damaged = data[1:]  # no version byte
    elif how == "unknown status":
        damaged = data[:1] + b"x" + data[2:]
    elif how == "fields cut short":
        damaged = data[: len(header) + 20]  # inside the key
    elif how == "malformed attempt":
        damaged = data[:3] + b"1234567890" + data[3 + len(str(record.attempt)) :]
    elif how == "malformed released list":
        body = data[len(header) :]
        fields = header.rstrip(b";").split(b",")
        fields[-1] = b"3"
        end = record.value_at - len(header)
        damaged = b",".join(fields) + b";" + body[:end] + b"3x:" + body[end:]
    elif how == "not a string":
        client.delete(key)
        client.rpush(key, b"\x00garbage")
        return
    elif how == "value cut off":
        assert record.stored and record.value
        damaged = data[: record.value_at]
    else:  # pragma: no cover
        raise AssertionError(how)
    client.set(key, damaged, keepttl=True)
    if how != "value cut off":
        with pytest.raises(layout.LayoutError):
            layout.parse(damaged)


DAMAGE = [
    "header does not parse",
    "unknown status",
    "fields cut short",
    "malformed attempt",
    "malformed released list",
    "not a string",
    "value cut off",
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
    _damage(redis_store, "call-1", how)
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
    if kind == b"list":
        return kind, store.client.lrange(key, 0, -1)
    return kind, store.client.get(key)


@pytest.mark.parametrize("status", ["pending", "unknown"])
def test_a_damaged_in_doubt_record_is_not_taken_over_by_a_reversible_tool(
    redis_store: RedisEffectStore, status: str
) -> None:
    runs: list[str] = []
    lookup = _tools(redis_store, runs)["lookup (reversible)"]
    _call(lookup, "call-1")
    client, key = redis_store.client, redis_store.key("call-1")
    data = layout.edit(client.get(key), status=status)  # type: ignore[arg-type]
    record = layout.parse(data)
    damaged = data[: record.value_at - 1]  # the tool's last byte gone: the fields run past the end
    client.set(key, damaged, keepttl=True)
    with pytest.raises(EffectRefused) as refused:
        _call(lookup, "call-1")
    assert refused.value.reason == "record_corrupt"
    assert runs == ["lookup"]
    assert client.get(key) == damaged  # not taken over: still the damaged record, in doubt
    assert damaged[1:2] == status[:1].encode()


@pytest.mark.parametrize("how", ["unknown status", "not a string"])
def test_reading_a_damaged_record_is_a_clear_error(redis_store: RedisEffectStore, how: str) -> None:
    runs: list[str] = []
    _call(_tools(redis_store, runs)["charge"], "call-1")
    _damage(redis_store, "call-1", how)
    with pytest.raises(CorruptRecordError) as info:
        redis_store.get("call-1")
    assert isinstance(info.value, StoreError)
    assert "status" in str(info.value) or "not a string" in str(info.value)
    with pytest.raises(CorruptRecordError):
        asyncio.run(redis_store.aget("call-1"))


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
    data = redis_store.client.get(redis_store.key("big-1"))
    assert isinstance(data, bytes) and layout.parse(data).value == b"" and len(data) < 200  # nothing huge
