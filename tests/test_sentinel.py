"""The store through Sentinel (a primary, a replica, three sentinels): replay across stores, sync and
async, scripts after SCRIPT FLUSH, and wait_replicas on a real replica."""

from __future__ import annotations

import asyncio

import pytest

from airlock_redis import EffectGuard, RedisEffectStore, StoreUnavailable, tool_call_context
from airlock_redis.stores import layout

from .topo_helpers import Counted, assert_replays_across_two_stores, fresh_id, namespace
from .topologies import SentinelTopology, shared_sentinel

pytestmark = pytest.mark.redis_server


@pytest.fixture(scope="module")
def sentinel(pytestconfig: pytest.Config) -> SentinelTopology:
    return shared_sentinel(pytestconfig)


def test_the_sentinel_url_reaches_the_primary(sentinel: SentinelTopology) -> None:
    store = RedisEffectStore(sentinel.url)
    assert store.client.info("replication")["role"] == "master"
    assert store.client.info("server")["tcp_port"] == sentinel.current_primary().port


def test_a_call_replays_across_two_store_objects_sync_and_async(sentinel: SentinelTopology) -> None:
    assert_replays_across_two_stores(sentinel.url)


def test_with_wait_replicas_the_pending_record_is_on_the_replica_before_the_tool_runs(
    sentinel: SentinelTopology,
) -> None:
    ns = namespace()
    store = RedisEffectStore(sentinel.url, namespace=ns, wait_replicas=1, wait_timeout=5)
    seen_on_replica: list[bytes | None] = []

    def charge(account: str) -> str:
        with sentinel.replica.client() as replica:
            data = replica.get(store.key(tool_call_id))
            seen_on_replica.append(layout.parse(data).status.encode() if data else None)
        return account

    guarded = EffectGuard(store=store).wrap(charge)
    tool_call_id = fresh_id()
    with tool_call_context(tool_call_id):
        assert guarded(account="acct") == "acct"
    assert seen_on_replica == [b"pending"]


def test_a_flushed_script_cache_is_reloaded(sentinel: SentinelTopology) -> None:
    ns = namespace()
    plain = Counted(RedisEffectStore(sentinel.url, namespace=ns))
    waited = Counted(RedisEffectStore(sentinel.url, namespace=ns, wait_replicas=1, wait_timeout=5))
    plain.call(fresh_id(), "warm")
    waited.call(fresh_id(), "warm")
    for tool in (plain, waited):
        ids = [fresh_id(), fresh_id()]
        for node in sentinel.data_nodes:
            with node.client() as c:
                c.script_flush()
        tool.call(ids[0], ids[0])
        for node in sentinel.data_nodes:
            with node.client() as c:
                c.script_flush()
        asyncio.run(tool.acall(ids[1], ids[1]))
        assert tool.runs[ids[0]] == tool.runs[ids[1]] == 1


def test_wait_replicas_beyond_the_replicas_refuses_without_running(sentinel: SentinelTopology) -> None:
    ns = namespace()
    store = RedisEffectStore(sentinel.url, namespace=ns, wait_replicas=2, wait_timeout=0.2)
    tool = Counted(store)
    tool_call_id = fresh_id()
    with pytest.raises(StoreUnavailable, match=r"only 1 of the 2 replicas .* \(WAIT\)"):
        tool.call(tool_call_id, "acct")
    with pytest.raises(StoreUnavailable, match="only 1 of the 2 replicas"):
        asyncio.run(tool.acall(tool_call_id, "acct"))
    assert tool.runs["acct"] == 0
    assert store.get(tool_call_id) is None
