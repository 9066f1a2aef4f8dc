"""A sentinel whose view lags, and an old primary that comes back empty: the cause of issue 14's double run.

The load test once saw two once-only ids run twice after a Sentinel failover. Every begin there waits
for the replica (``wait_replicas=1``), so the promoted node held every record; a second run needs that
node to lose them. Redis does that by itself in one case: a sentinel that still believes the killed
primary is the primary sees it answer again as a master (restarted empty, persistence off) and tells
the promoted node to replicate from it (``+convert-to-slave``). The promoted node then loads the empty
dataset, and a retry that reaches the empty node runs the tool again with a replica acknowledging it.

The fault harness used to restart the killed primary exactly that way: empty, as a master, and only
then REPLICAOF. Here a sentinel that watches the same primary under another name stands in for one
whose view lags (hellos about ``airlock`` never reach it, and with a quorum only it could not meet, it
never fails over); the three real sentinels are frozen after the failover, so only it acts.

- ``test_an_old_primary_back_empty_as_a_master_wipes_the_promoted_node``: the old restore. The lagging
  sentinel converts the promoted node, the records are gone, and a retry of a once-only id that had run
  runs again. This is the mechanism, reproduced on purpose (the harness held the empty master for
  milliseconds; here it waits for the sentinel, so the result does not depend on luck).
- ``test_the_harness_restore_gives_a_lagging_sentinel_nothing_to_act_on``: the same deployment with the
  harness's restore (``restore_sentinel_replica``: the old primary starts with ``--replicaof``). The
  lagging sentinel reads both nodes again, the promoted node stays a primary, and every retry replays.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from airlock_redis import RedisEffectStore

from .faults import HOST, History, Tools, restore_sentinel_replica, wait_synced_replica
from .topo_helpers import namespace
from .topologies import RedisProcess, SentinelTopology, free_ports, redis_binary, wait_until

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

IDS = [f"lag-{n}" for n in range(4)]
LAGGING = "airlock-lagging"  # the name the lagging sentinel knows the deployment by
TIMEOUTS: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}


class Deployment:
    """A SentinelTopology, once-only calls made through it, its primary killed and the take-over done,
    the three real sentinels frozen, and a lagging sentinel still watching the killed primary."""

    def __init__(self, topology: SentinelTopology, lagging: RedisProcess) -> None:
        self.topology = topology
        self.lagging = lagging
        self.old = topology.current_primary()
        self.new = topology.other(self.old)
        self.ns = namespace()
        self.history = History()

    def store(self, url: str) -> RedisEffectStore:
        return RedisEffectStore(url, namespace=self.ns, wait_replicas=1, wait_timeout=1.0, **TIMEOUTS)

    @property
    def lagging_url(self) -> str:
        return f"redis+sentinel://{HOST}:{self.lagging.port}/{LAGGING}"

    def run_once_only_calls(self) -> None:
        tools = Tools(self.store(self.topology.url), self.history)
        outcomes = [tools.call(i, kind=("sync", "async")[n % 2]) for n, i in enumerate(IDS)]
        assert [o.result for o in outcomes] == ["executed"] * len(IDS), outcomes
        wait_until("the lagging sentinel to know the replica", lambda: self.lagging_replicas() != [], 30)

    def fail_over(self) -> None:
        self.old.kill()
        assert self.topology.wait_for_failover(self.old, timeout=60) is self.new
        for sentinel in self.topology.sentinels:
            sentinel.pause()

    def thaw(self) -> None:
        for sentinel in self.topology.sentinels:
            sentinel.resume()

    def lagging_replicas(self) -> list[dict[str, Any]]:
        with self.lagging.client() as c:
            return list(c.sentinel_slaves(LAGGING))

    def lagging_view(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What the lagging sentinel last read of the old primary and of the promoted node."""
        with self.lagging.client() as c:
            master = dict(c.sentinel_master(LAGGING))
            replicas = {int(r["port"]): r for r in c.sentinel_slaves(LAGGING)}
        return master, replicas[self.new.port]

    def read_times(self) -> tuple[float, float, str]:
        """When (epoch ms) the lagging sentinel last read the old primary and the promoted node, and the
        role the old primary reported in that read."""
        master, promoted = self.lagging_view()
        now = time.time() * 1000
        return now - int(master["info-refresh"]), now - int(promoted["info-refresh"]), master["role-reported"]

    def wait_lagging_read_both_since(self, moment: float) -> None:
        """Wait until the lagging sentinel has read the old primary (as a replica) after ``moment``, and then
        the promoted node: the order in which it decides whether to convert the promoted node.

        The second wait starts from when this process saw the first read, not from that read's own time:
        the sentinel reads both nodes on the same 10 s timer and often answers both in one millisecond, so
        comparing its two read times cannot tell which came first."""

        def master_read_as_replica() -> bool:
            master_at, _, role = self.read_times()
            return master_at > moment * 1000 and role == "slave"

        wait_until(
            "the lagging sentinel to read the old primary as a replica",
            master_read_as_replica,
            60,
            on_fail=self.topology.logs(),
        )
        seen_at = time.time() * 1000 + 2  # a margin for rounding to milliseconds
        wait_until(
            "the lagging sentinel to read the promoted node after that",
            lambda: self.read_times()[1] > seen_at,
            60,
            on_fail=self.topology.logs(),
        )

    def records_on(self, node: RedisProcess) -> int:
        return node.count_keys(self.ns)

    def role_of(self, node: RedisProcess) -> dict[str, Any]:
        with node.client() as c:
            return dict(c.info("replication"))


@contextmanager
def deployment() -> Iterator[Deployment]:
    redis_binary()
    with SentinelTopology() as topology:
        (port,) = free_ports(1)
        primary = topology.current_primary()
        config = (
            f"sentinel monitor {LAGGING} {HOST} {primary.port} 2\n"  # 2: only it watches this name
            f"sentinel down-after-milliseconds {LAGGING} 1000\n"
        )
        lagging = RedisProcess(
            f"lagging-sentinel:{port}", topology.root / "lagging", port, config_text=config, sentinel=True
        )
        topology.processes.append(lagging)  # stopped with the topology; its log joins topology.logs()
        lagging.start()
        run = Deployment(topology, lagging)
        try:
            yield run
        finally:
            run.thaw()


def retry_everything(run: Deployment, url: str) -> list[str]:
    tools = Tools(run.store(url), run.history)
    return [tools.call(i, kind="sync", phase="retry").result for i in IDS]


def test_an_old_primary_back_empty_as_a_master_wipes_the_promoted_node() -> None:
    with deployment() as run:
        run.run_once_only_calls()
        run.fail_over()
        assert run.records_on(run.new) == len(IDS)  # the replica had every record (wait_replicas=1)

        run.old.start()  # what the harness did: empty (no persistence), and a master for a moment
        wait_until(
            "the lagging sentinel to make the promoted node replicate from the empty old primary",
            lambda: run.role_of(run.new).get("role") == "slave",
            60,
            on_fail=run.topology.logs(),
        )
        wait_synced_replica(run.new, run.old, timeout=30, on_fail=run.topology.logs())
        assert "+convert-to-slave" in run.lagging.log_tail(20000)
        assert run.records_on(run.new) == 0  # acknowledged records, gone: the servers discarded them

        run.thaw()
        results = retry_everything(run, run.lagging_url)  # a client that asks the lagging sentinel
        assert results == ["executed"] * len(IDS), results
        assert all(run.history.runs[i] == 2 for i in IDS)  # a once-only tool ran twice per id


def test_the_harness_restore_gives_a_lagging_sentinel_nothing_to_act_on() -> None:
    with deployment() as run:
        run.run_once_only_calls()
        run.fail_over()
        restored_at = time.time()
        restore_sentinel_replica(run.topology, run.old, run.new)

        run.wait_lagging_read_both_since(restored_at)
        master, promoted = run.lagging_view()
        assert master["role-reported"] == "slave" and promoted["role-reported"] == "master"
        assert run.role_of(run.new).get("role") == "master", run.topology.logs()
        assert "+convert-to-slave" not in run.lagging.log_tail(20000)
        assert run.records_on(run.new) == len(IDS)

        run.thaw()
        run.topology.wait_writable()  # the thawed sentinels answer again
        assert retry_everything(run, run.topology.url) == ["replayed"] * len(IDS)
        refused = retry_everything(run, run.lagging_url)  # its primary answers as a replica: nothing runs
        assert all(r == "refused:store_unavailable" for r in refused), refused
        assert all(run.history.runs[i] == 1 for i in IDS)
