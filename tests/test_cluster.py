"""The store on a real Redis Cluster (3 primaries, a replica each): replay across stores, sync and
async, client= a RedisCluster, scripts after SCRIPT FLUSH, wait_replicas routed to the key's node."""

from __future__ import annotations

import asyncio

import pytest

from airlock_redis import RedisEffectStore, StoreUnavailable
from airlock_redis.stores.url import is_cluster

from .topo_helpers import Counted, fresh_id, namespace
from .topologies import ClusterTopology, shared_cluster

pytestmark = pytest.mark.redis_server


@pytest.fixture(scope="module")
def cluster(pytestconfig: pytest.Config) -> ClusterTopology:
    return shared_cluster(pytestconfig)


def test_a_cluster_url_gives_a_cluster_client(cluster: ClusterTopology) -> None:
    store = RedisEffectStore(cluster.url)
    assert is_cluster(store.client)


def test_a_call_replays_across_two_store_objects_sync(cluster: ClusterTopology) -> None:
    ns = namespace()
    first, second = (
        Counted(RedisEffectStore(cluster.url, namespace=ns)),
        Counted(RedisEffectStore(cluster.url, namespace=ns)),
    )
    ids = [fresh_id() for _ in range(12)]
    for i, tool_call_id in enumerate(ids):
        original = first.call(tool_call_id, f"acct-{i}")
        assert second.call(tool_call_id, f"acct-{i}") == original
    assert sum(first.runs.values()) == len(ids)
    assert sum(second.runs.values()) == 0


def test_a_call_replays_across_two_store_objects_async(cluster: ClusterTopology) -> None:
    ns = namespace()

    async def scenario() -> None:
        first = Counted(RedisEffectStore(cluster.url, namespace=ns))
        second = Counted(RedisEffectStore(cluster.url, namespace=ns))
        ids = [fresh_id() for _ in range(12)]
        for i, tool_call_id in enumerate(ids):
            original = await first.acall(tool_call_id, f"acct-{i}")
            assert await second.acall(tool_call_id, f"acct-{i}") == original
        assert sum(first.runs.values()) == len(ids)
        assert sum(second.runs.values()) == 0

    asyncio.run(scenario())


def test_client_given_as_a_redis_cluster_serves_sync_and_async(cluster: ClusterTopology) -> None:
    ns = namespace()
    store = RedisEffectStore(client=cluster.client(), namespace=ns)
    tool = Counted(store)
    tool_call_id = fresh_id()
    original = tool.call(tool_call_id, "acct")
    replayed = asyncio.run(tool.acall(tool_call_id, "acct"))
    assert replayed == original
    assert tool.runs["acct"] == 1


def test_a_flushed_script_cache_is_reloaded_sync_and_async(cluster: ClusterTopology) -> None:
    ns = namespace()
    store = RedisEffectStore(cluster.url, namespace=ns)
    tool = Counted(store)
    tool.call(fresh_id(), "warm")  # scripts loaded and cached by sha
    flush_scripts(cluster)
    tool_call_id = fresh_id()
    original = tool.call(tool_call_id, "after-flush")
    flush_scripts(cluster)

    async def scenario() -> dict[str, object]:
        replay = await tool.acall(tool_call_id, "after-flush")
        await store.aclose()
        return replay

    assert asyncio.run(scenario()) == original
    assert tool.runs["after-flush"] == 1


def flush_scripts(cluster: ClusterTopology) -> None:
    for node in cluster.nodes:
        with node.client() as c:
            c.script_flush()
            assert c.script_exists("0" * 40) == [False]


def test_wait_replicas_on_the_keys_node_lets_the_tool_run(cluster: ClusterTopology) -> None:
    ns = namespace()
    tool = Counted(RedisEffectStore(cluster.url, namespace=ns, wait_replicas=1, wait_timeout=5))
    ids = [fresh_id() for _ in range(9)]  # spread over the three primaries
    for tool_call_id in ids:
        assert tool.call(tool_call_id, tool_call_id)["account"] == tool_call_id
        assert asyncio.run(tool.acall(tool_call_id + "-a", tool_call_id + "-a"))["cents"] == 500
    assert sum(tool.runs.values()) == 2 * len(ids)


def test_wait_replicas_beyond_the_replicas_refuses_and_releases(cluster: ClusterTopology) -> None:
    ns = namespace()
    store = RedisEffectStore(cluster.url, namespace=ns, wait_replicas=2, wait_timeout=0.2)
    tool = Counted(store)
    tool_call_id = fresh_id()
    with pytest.raises(StoreUnavailable, match="only 1 of the 2 replicas"):
        tool.call(tool_call_id, "acct")
    with pytest.raises(StoreUnavailable, match="only 1 of the 2 replicas"):
        asyncio.run(tool.acall(tool_call_id, "acct"))
    assert tool.runs["acct"] == 0
    assert store.get(tool_call_id) is None  # released: nothing ran, nothing is left pending
