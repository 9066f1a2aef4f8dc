"""Record keys are Cluster-safe for any tool_call_id, proven on a real cluster with CLUSTER KEYSLOT."""

from __future__ import annotations

from collections import Counter

import pytest

from airlock_redis import RedisEffectStore, Status
from airlock_redis.stores.keys import record_key, slot_tag

from .topo_helpers import Counted, namespace
from .topologies import ClusterTopology, shared_cluster

pytestmark = pytest.mark.redis_server

ADVERSARIAL_IDS = [
    "{}",
    "}{",
    "{x}",
    "{",
    "}",
    "{{}}",
    "a{}b",
    "{}{x}",
    "x{y}z{w}",
    "{" * 40 + "}" * 40,
    " x",
    "\t\nx",
    "\u00e9t\u00e9-\u65e5\u672c-\U0001f600",
    "\u200b",  # zero-width space: looks empty
    "call_" + "x" * 1024,  # 1 KB id
    "\u00e9" * 600,  # 1.2 KB of two-byte characters
    "airlock:effect:{0123456789abcdef}:other",  # looks like another record's key
    "topo:{deadbeefdeadbeef}:x",
    "*?[]\\",
    ":",
    "::{}::",
]


@pytest.fixture(scope="module")
def cluster(pytestconfig: pytest.Config) -> ClusterTopology:
    return shared_cluster(pytestconfig)


def test_every_id_keeps_its_keys_in_the_slot_of_its_tag(cluster: ClusterTopology) -> None:
    ns = "airlock:effect"
    with cluster.nodes[0].client() as c:
        for tool_call_id in ADVERSARIAL_IDS:
            key = record_key(ns, tool_call_id)
            tag = slot_tag(tool_call_id)
            slot = c.cluster("KEYSLOT", key)
            # any sibling key of the same call (e.g. a wake-up list) is named with the same tag
            assert slot == c.cluster("KEYSLOT", tag) == c.cluster("KEYSLOT", f"{ns}:{{{tag}}}:wake")
            # the first '{' of the key opens our tag, whatever braces the id holds
            assert key.decode().startswith(f"{ns}:{{{tag}}}:")


def test_adversarial_ids_run_once_and_replay_on_the_cluster(cluster: ClusterTopology) -> None:
    ns = namespace()
    first = Counted(RedisEffectStore(cluster.url, namespace=ns))
    second = Counted(RedisEffectStore(cluster.url, namespace=ns))
    for i, tool_call_id in enumerate(ADVERSARIAL_IDS):
        original = first.call(tool_call_id, f"acct-{i}")
        assert second.call(tool_call_id, f"acct-{i}") == original, tool_call_id
        record = second.guard.store.get(tool_call_id)
        assert record is not None and record.status is Status.COMMITTED, tool_call_id
        assert record.tool_call_id == tool_call_id
    assert sum(first.runs.values()) == len(ADVERSARIAL_IDS)
    assert sum(second.runs.values()) == 0


def test_records_spread_over_every_primary(cluster: ClusterTopology) -> None:
    ns = namespace()
    store = RedisEffectStore(cluster.url, namespace=ns)
    tool = Counted(store)
    ids = [f"spread-{i}" for i in range(300)]
    for tool_call_id in ids:
        tool.call(tool_call_id, tool_call_id)
    per_primary: Counter[int] = Counter()
    primaries = cluster.primaries()
    for node in primaries:
        with node.client() as c:
            per_primary[node.port] = sum(1 for _ in c.scan_iter(match=f"{ns}:*", count=500))
    print(f"300 records per primary: {dict(per_primary)}")
    assert sum(per_primary.values()) == 300
    assert len(primaries) == 3
    assert all(per_primary[node.port] >= 50 for node in primaries), per_primary
