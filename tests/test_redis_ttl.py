"""Each status gets its own TTL on a real redis-server, and an expired record lets the call run again.

Before each transition the record's TTL is pushed far above every configured TTL (PEXPIRE), so a
PTTL at or below the status's TTL afterwards shows that the transition itself set it. The lower
bounds leave seconds of slack for a busy machine.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectStatusUnknown,
    RedisEffectStore,
    Settlement,
    Status,
    TransitionResult,
    idempotency_key,
    tool_call_context,
)
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import BeginKind, BeginRequest

# Far apart, so each status's PTTL range is its own: (ttl - SLACK, ttl].
COMMITTED_S, PENDING_S, UNKNOWN_S = 4.0, 8.5, 13.25
SLACK_MS = 3_000
FAR_MS = 3_600_000
KEY = idempotency_key("book", {"seat": "12A"})


def request(tool_call_id: str, token: str, *, reversible: bool = False) -> BeginRequest:
    return BeginRequest(tool_call_id, KEY, "book", token, reversible)


@pytest.fixture
def ttl_store(redis_server: EmbeddedRedis, namespace: str) -> Iterator[RedisEffectStore]:
    store = RedisEffectStore(
        redis_server.url,
        namespace=namespace,
        committed_ttl=COMMITTED_S,
        pending_ttl=PENDING_S,
        unknown_ttl=UNKNOWN_S,
    )
    yield store
    store.close()


def push_far(store: RedisEffectStore, tool_call_id: str) -> None:
    assert store.client.pexpire(store.key(tool_call_id), FAR_MS)


def assert_ttl(store: RedisEffectStore, tool_call_id: str, seconds: float) -> None:
    limit = round(seconds * 1000)
    pttl = int(store.client.pttl(store.key(tool_call_id)))
    assert limit - SLACK_MS < pttl <= limit, f"PTTL {pttl} ms, expected within {SLACK_MS} ms below {limit}"


def test_each_transition_sets_the_ttl_of_its_status(ttl_store: RedisEffectStore) -> None:
    store = ttl_store
    assert store.begin(request("call-1", "a")).kind is BeginKind.STARTED
    assert_ttl(store, "call-1", PENDING_S)
    push_far(store, "call-1")
    assert store.commit(request("call-1", "a"), 1, b"booked", None) is TransitionResult.OK
    assert_ttl(store, "call-1", COMMITTED_S)
    record = store.get("call-1")
    assert record is not None and record.ttl_ms is not None
    assert record.status is Status.COMMITTED and record.ttl_ms <= COMMITTED_S * 1000

    store.begin(request("call-2", "a"))
    push_far(store, "call-2")
    assert store.settle(request("call-2", "a"), 1, Settlement.UNKNOWN) is TransitionResult.OK
    assert_ttl(store, "call-2", UNKNOWN_S)


def test_reversible_take_over_resets_the_pending_ttl(ttl_store: RedisEffectStore) -> None:
    store = ttl_store
    store.begin(request("call-3", "a", reversible=True))
    push_far(store, "call-3")
    assert store.begin(request("call-3", "b", reversible=True)).attempt == 2  # take-over of pending
    assert_ttl(store, "call-3", PENDING_S)

    store.settle(request("call-3", "b"), 1, Settlement.UNKNOWN)
    assert_ttl(store, "call-3", UNKNOWN_S)
    push_far(store, "call-3")
    assert store.begin(request("call-3", "c", reversible=True)).attempt == 3  # take-over of unknown
    assert_ttl(store, "call-3", PENDING_S)


def test_refusals_replays_and_resends_leave_the_ttl_alone(ttl_store: RedisEffectStore) -> None:
    """Only transitions reset a TTL: reading a record must not keep it alive."""
    store = ttl_store
    store.begin(request("call-4", "a"))
    push_far(store, "call-4")
    assert store.begin(request("call-4", "b")).kind is BeginKind.PENDING  # refused retry
    assert int(store.client.pttl(store.key("call-4"))) > FAR_MS - SLACK_MS
    # a re-sent begin writes again (what a WAIT after it covers): the pending TTL starts over
    assert store.begin(request("call-4", "a")).kind is BeginKind.STARTED
    assert int(store.client.pttl(store.key("call-4"))) <= PENDING_S * 1000
    store.commit(request("call-4", "a"), 1, b"v", None)
    push_far(store, "call-4")
    assert store.begin(request("call-4", "c")).kind is BeginKind.COMMITTED  # replay
    assert store.commit(request("call-4", "a"), 1, b"v", None) is TransitionResult.OK  # re-sent commit
    assert int(store.client.pttl(store.key("call-4"))) > FAR_MS - SLACK_MS


def test_async_transitions_set_the_same_ttls(ttl_store: RedisEffectStore) -> None:
    store = ttl_store

    async def main() -> None:
        await store.abegin(request("call-5", "a"))
        assert_ttl(store, "call-5", PENDING_S)
        push_far(store, "call-5")
        await store.acommit(request("call-5", "a"), 1, b"v", None)
        assert_ttl(store, "call-5", COMMITTED_S)
        await store.abegin(request("call-6", "a"))
        push_far(store, "call-6")
        await store.asettle(request("call-6", "a"), 1, Settlement.UNKNOWN)
        assert_ttl(store, "call-6", UNKNOWN_S)
        await store.aclose()

    asyncio.run(main())


def test_fractional_ttls_reach_the_server_in_milliseconds(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace, pending_ttl=7.25, committed_ttl=1.5)
    store.begin(request("call-7", "a"))
    assert 7_250 - SLACK_MS < int(store.client.pttl(store.key("call-7"))) <= 7_250
    store.close()


# -- expiry --------------------------------------------------------------------------------------
def wait_until_gone(store: RedisEffectStore, tool_call_id: str, within: float = 30.0) -> None:
    """Poll the server until the record has expired (bounded; not a timing assertion)."""
    deadline = time.monotonic() + within
    while store.client.exists(store.key(tool_call_id)):
        assert time.monotonic() < deadline, f"{tool_call_id} did not expire within {within}s"
        time.sleep(0.05)


@pytest.fixture
def short_store(redis_server: EmbeddedRedis, namespace: str) -> Iterator[RedisEffectStore]:
    store = RedisEffectStore(
        redis_server.url, namespace=namespace, committed_ttl=1.5, pending_ttl=2.0, unknown_ttl=2.5
    )
    yield store
    store.close()


def make_book(store: RedisEffectStore, runs: list[str], *, fail: bool = False) -> Any:
    guard = EffectGuard(store=store)

    @guard.wrap
    def book(seat: str) -> str:
        runs.append(seat)
        if fail:
            raise TimeoutError("the airline did not answer")
        return f"ticket-{len(runs)}"

    return book


def test_after_the_committed_ttl_the_call_runs_again(short_store: RedisEffectStore) -> None:
    runs: list[str] = []
    book = make_book(short_store, runs)
    with tool_call_context("call-exp-c"):
        assert book("12A") == "ticket-1"
        assert book("12A") == "ticket-1"  # replayed while the record lives
    assert runs == ["12A"]
    wait_until_gone(short_store, "call-exp-c")
    with tool_call_context("call-exp-c"):
        assert book("12A") == "ticket-2"
    assert runs == ["12A", "12A"]


def test_after_the_unknown_ttl_the_call_runs_again(short_store: RedisEffectStore) -> None:
    runs: list[str] = []
    with tool_call_context("call-exp-u"), pytest.raises(TimeoutError):
        make_book(short_store, runs, fail=True)("12A")
    record = short_store.get("call-exp-u")
    assert record is not None and record.status is Status.UNKNOWN
    book = make_book(short_store, runs)
    with tool_call_context("call-exp-u"), pytest.raises(EffectStatusUnknown):
        book("12A")
    wait_until_gone(short_store, "call-exp-u")
    with tool_call_context("call-exp-u"):
        assert book("12A") == "ticket-2"
    assert runs == ["12A", "12A"]


def test_after_the_pending_ttl_the_call_runs_again(short_store: RedisEffectStore) -> None:
    short_store.begin(request("call-exp-p", secrets.token_hex(8)))  # an attempt that died mid-call
    runs: list[str] = []
    book = make_book(short_store, runs)
    with tool_call_context("call-exp-p"), pytest.raises(EffectStatusUnknown):
        book("12A")
    wait_until_gone(short_store, "call-exp-p")
    with tool_call_context("call-exp-p"):
        assert book("12A") == "ticket-1"
    assert runs == ["12A"]
