"""Durability options: the eviction-policy check, wait_replicas validation and bookkeeping, WAITAOF
detection, and how a record that missed its replicas is left (released, or unknown for a take-over)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from airlock_redis import (
    EffectGuard,
    RedisEffectStore,
    Settlement,
    Status,
    StoreUnavailable,
    idempotency_key,
    reversibility,
    tool_call_context,
)
from airlock_redis.core.records import BeginRequest
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.durability import Acks, DurabilityError, ReplicaWait
from airlock_redis.stores.server_facts import ServerFacts, evicts_records

from .topo_helpers import Counted, fresh_id, namespace
from .topologies import SentinelTopology, redis_binary, shared_sentinel

pytestmark = pytest.mark.redis_server


@pytest.fixture(scope="module")
def lru_server() -> Iterator[EmbeddedRedis]:
    redis_binary()
    with EmbeddedRedis(extra_args=["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        yield server


@pytest.fixture(scope="module")
def sentinel(pytestconfig: pytest.Config) -> SentinelTopology:
    return shared_sentinel(pytestconfig)


def test_an_evicting_policy_is_reported_loudly_once(
    lru_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisEffectStore(lru_server.url, namespace=namespace())
    tool = Counted(store)
    with caplog.at_level(logging.WARNING, logger="airlock_redis"):
        tool.call(fresh_id(), "a")
        tool.call(fresh_id(), "b")
    warnings = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(warnings) == 1
    assert "allkeys-lru" in warnings[0] and "noeviction" in warnings[0]
    assert store.server_facts is not None
    assert store.server_facts.evicting_nodes == {"server": "allkeys-lru"}


def test_the_async_path_checks_the_policy_too(
    lru_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisEffectStore(lru_server.url, namespace=namespace())
    with caplog.at_level(logging.WARNING, logger="airlock_redis"):
        asyncio.run(Counted(store).acall(fresh_id(), "a"))
    assert any("allkeys-lru" in r.getMessage() for r in caplog.records)


def test_noeviction_is_not_reported(redis_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace())
    with caplog.at_level(logging.WARNING, logger="airlock_redis"):
        Counted(store).call(fresh_id(), "a")
    assert store.server_facts is not None and store.server_facts.evicting_nodes == {}
    assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]


@pytest.mark.parametrize(
    ("policy", "evicts"),
    [
        ("noeviction", False),
        ("allkeys-lru", True),
        ("allkeys-lfu", True),
        ("allkeys-random", True),
        ("volatile-lru", True),
        ("volatile-lfu", True),
        ("volatile-random", True),
        ("volatile-ttl", True),
    ],
)
def test_which_policies_evict_records(policy: str, evicts: bool) -> None:
    assert evicts_records(policy) is evicts


def test_waitaof_is_skipped_before_7_2_and_used_after() -> None:
    wait = ReplicaWait(1, 0.5)
    old = ServerFacts({"server": (7, 0, 15)}, {"server": "noeviction"}, {"server": True})
    new = ServerFacts({"server": (7, 2, 4)}, {"server": "noeviction"}, {"server": True})
    no_aof = ServerFacts({"server": (7, 2, 4)}, {"server": "noeviction"}, {"server": False})
    assert wait.commands(old) == [("WAIT", 1, 500)]
    assert wait.commands(new) == [("WAIT", 1, 500), ("WAITAOF", 1, 0, 500)]
    assert wait.commands(no_aof) == [("WAIT", 1, 500)]


def test_the_real_7_0_server_is_detected_without_waitaof(redis_server: EmbeddedRedis) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace())
    facts = store.check_server()
    assert facts is not None
    version = facts.versions["server"]
    assert facts.has_waitaof is (version >= (7, 2))


def test_wait_options_are_validated() -> None:
    with pytest.raises(ValueError, match="wait_timeout"):
        RedisEffectStore("redis://127.0.0.1:1/0", wait_replicas=1, wait_timeout=0)
    with pytest.raises(ValueError, match="wait_replicas"):
        RedisEffectStore("redis://127.0.0.1:1/0", wait_replicas=-1)


def test_ensure_reports_missing_and_short_acknowledgements() -> None:
    wait = ReplicaWait(2, 1.0)
    with pytest.raises(DurabilityError, match="no replica acknowledgement"):
        wait.ensure("never-begun")
    wait.remember("t1", Acks(1))
    with pytest.raises(DurabilityError, match="only 1 of the 2"):
        wait.ensure("t1")
    wait.remember("t2", Acks(2, aof_local=0))
    with pytest.raises(DurabilityError, match="WAITAOF"):
        wait.ensure("t2")
    wait.remember("t3", Acks(2, aof_local=1))
    wait.ensure("t3")
    with pytest.raises(DurabilityError):
        wait.ensure("t3")  # each acknowledgement is used once


def test_without_wait_replicas_the_guard_skips_durability(redis_server: EmbeddedRedis) -> None:
    guard = EffectGuard(store=RedisEffectStore(redis_server.url, namespace=namespace()))
    assert guard._durable is None
    waited = EffectGuard(store=RedisEffectStore(redis_server.url, namespace=namespace(), wait_replicas=1))
    assert waited._durable is waited.store


def test_no_replica_at_all_refuses_and_leaves_no_record(redis_server: EmbeddedRedis) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace(), wait_replicas=1, wait_timeout=0.1)
    tool = Counted(store)
    tool_call_id = fresh_id()
    with pytest.raises(StoreUnavailable, match="only 0 of the 1") as refused:
        tool.call(tool_call_id, "acct")
    assert "did not run" in str(refused.value)
    assert tool.runs["acct"] == 0
    assert store.get(tool_call_id) is None
    # once durability is possible again (here: not asked for), the same id runs, once
    relaxed = Counted(RedisEffectStore(redis_server.url, namespace=store.namespace))
    relaxed.call(tool_call_id, "acct")
    relaxed.call(tool_call_id, "acct")
    assert relaxed.runs["acct"] == 1


def test_a_reversible_take_over_that_misses_its_replicas_stays_unknown(sentinel: SentinelTopology) -> None:
    ns = namespace()
    store = RedisEffectStore(sentinel.url, namespace=ns)
    tool_call_id = fresh_id()
    key = idempotency_key("refresh", {"account": "a"})
    earlier = BeginRequest(tool_call_id, key, "refresh", "earlier-token", reversible=True)
    store.begin(earlier)
    store.settle(earlier, 1, Settlement.UNKNOWN)
    runs: list[str] = []

    def refresh(account: str) -> str:
        runs.append(account)
        return account

    strict = RedisEffectStore(sentinel.url, namespace=ns, wait_replicas=2, wait_timeout=0.2)
    guarded = reversibility("reversible")(EffectGuard(store=strict).wrap(refresh))
    with tool_call_context(tool_call_id), pytest.raises(StoreUnavailable):
        guarded(account="a")
    assert runs == []
    record = store.get(tool_call_id)
    assert record is not None and record.status is Status.UNKNOWN and record.attempt == 2
