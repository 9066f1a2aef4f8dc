"""A replica promoted before its first sync: the second way a failover empties the deployment.

After a failover the killed primary comes back as a replica of the promoted node, empty (no
persistence) until its first full sync lands. Sentinel will promote such a replica: a replica that
never had a link reports ``master_link_down_since_seconds:-1``, which passes Sentinel's check on how
long a candidate's link has been down. So if the promoted node stalls for longer than
``down-after-milliseconds`` while the returning node syncs (a loaded host, a VM pause), the sentinels
fail over to the empty node, turn the stalled one into its replica when it wakes, and it empties
itself: every record, acknowledged by a replica or not, is gone, and retries run once-only tools
again. Redis Cluster does not do this by default: a replica whose data is too old
(``cluster-replica-validity-factor``) does not stand for election.

- ``test_a_replica_promoted_before_its_first_sync_empties_the_deployment``: the killed primary comes
  back with ``--replicaof`` only; the promoted node is paused (SIGSTOP) before the sync can land (its
  diskless sync waits 10 s). The sentinels promote the empty node, the records are gone, and a retry
  runs each once-only tool a second time.
- ``test_a_returning_node_is_not_promotable_until_it_has_synced``: the harness's restore
  (``restore_sentinel_replica``, in its two halves) also starts it with ``replica-priority 0`` and
  gives the priority back only once the sync is done. The same pause finds no replica to promote;
  when the node wakes, every retry replays.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from airlock_redis import RedisEffectStore

from .faults import (
    HOST,
    History,
    Tools,
    finish_returning_replica,
    start_returning_replica,
    wait_synced_replica,
)
from .topo_helpers import namespace
from .topologies import RedisProcess, SentinelTopology, redis_binary, wait_until

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

IDS = [f"unsynced-{n}" for n in range(4)]
TIMEOUTS: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}


class Run:
    def __init__(self, topology: SentinelTopology) -> None:
        self.topology = topology
        self.old = topology.current_primary()
        self.new = topology.other(self.old)
        self.ns = namespace()
        self.history = History()

    def tools(self) -> Tools:
        store = RedisEffectStore(
            self.topology.url, namespace=self.ns, wait_replicas=1, wait_timeout=1.0, **TIMEOUTS
        )
        return Tools(store, self.history)

    def records_on(self, node: RedisProcess) -> int:
        return node.count_keys(self.ns)

    def role(self, node: RedisProcess) -> str:
        with node.client() as c:
            return str(c.info("replication").get("role"))

    def sentinels_see_the_returning_node(self) -> bool:
        """Every sentinel lists the old primary as a replica, reachable, with a fresh INFO: a
        candidate, were it not for its priority."""
        for sentinel in self.topology.sentinels:
            with sentinel.client() as c:
                replicas = {int(r["port"]): r for r in c.sentinel_slaves(self.topology.service)}
            seen = replicas.get(self.old.port)
            if seen is None or "disconnected" in seen["flags"] or "s_down" in seen["flags"]:
                return False
            if seen["role-reported"] != "slave" or int(seen["info-refresh"]) > 2000:
                return False
        return True

    def sentinel_logs(self) -> str:
        return "\n".join(s.log_tail(20000) for s in self.topology.sentinels)


@contextmanager
def failed_over() -> Iterator[Run]:
    """Once-only calls made (wait_replicas=1), the primary killed, the replica promoted, and the
    promoted node's diskless sync held back 10 s, so a returning replica stays empty that long."""
    redis_binary()
    with SentinelTopology() as topology:
        run = Run(topology)
        tools = run.tools()
        outcomes = [tools.call(i, kind=("sync", "async")[n % 2]) for n, i in enumerate(IDS)]
        assert [o.result for o in outcomes] == ["executed"] * len(IDS), outcomes
        run.old.kill()
        # It comes back empty. Where a disk-based sync left an RDB file in its folder (6.2's default,
        # repl-diskless-sync no), it would load it, and with the replication id kept there, resume by
        # a partial sync at once, never empty: remove it, as a node that returns on a new disk would.
        (run.old.dir / "dump.rdb").unlink(missing_ok=True)
        assert topology.wait_for_failover(run.old, timeout=60) is run.new
        with run.new.client() as c:
            c.config_set("repl-diskless-sync", "yes")
            c.config_set("repl-diskless-sync-delay", "10")
        try:
            yield run
        finally:
            run.new.resume()


def test_a_replica_promoted_before_its_first_sync_empties_the_deployment() -> None:
    with failed_over() as run:
        run.old.args += ["--replicaof", HOST, str(run.new.port)]  # a replica from its first instant
        run.old.start()
        wait_until("the sentinels to see the returning node", run.sentinels_see_the_returning_node, 30)
        assert run.records_on(run.old) == 0  # its sync has not landed
        run.new.pause()
        wait_until(
            "the sentinels to promote the empty node",
            lambda: (
                set(run.topology.named_primary_ports()) == {run.old.port} and run.role(run.old) == "master"
            ),
            60,
            on_fail=run.topology.logs(6000),
        )
        run.new.resume()
        wait_synced_replica(run.new, run.old, timeout=60, on_fail=run.topology.logs(6000))
        assert run.records_on(run.new) == 0 and run.records_on(run.old) == 0  # acknowledged, and gone

        run.topology.wait_writable()
        tools = run.tools()
        results = [tools.call(i, phase="retry").result for i in IDS]
        assert results == ["executed"] * len(IDS), results
        assert all(run.history.runs[i] == 2 for i in IDS)  # a once-only tool ran twice per id


def test_a_returning_node_is_not_promotable_until_it_has_synced() -> None:
    with failed_over() as run:
        start_returning_replica(run.old, run.new)  # the first half of restore_sentinel_replica
        wait_until("the sentinels to see the returning node", run.sentinels_see_the_returning_node, 30)
        run.new.pause()
        wait_until(
            "the sentinels to look for a replica to promote, and find none",
            lambda: "no-good-slave" in run.sentinel_logs(),
            60,
            on_fail=run.topology.logs(6000),
        )
        run.new.resume()
        finish_returning_replica(run.topology, run.old, run.new)  # syncs, then gives its priority back
        with run.old.client() as c:
            assert c.config_get("replica-priority") == {"replica-priority": "100"}
        assert run.role(run.new) == "master" and run.records_on(run.new) == len(IDS)

        run.topology.wait_writable()
        tools = run.tools()
        results = [tools.call(i, phase="retry").result for i in IDS]
        assert results == ["replayed"] * len(IDS), results
        assert all(run.history.runs[i] == 1 for i in IDS)
