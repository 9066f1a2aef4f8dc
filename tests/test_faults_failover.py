"""kill -9 of the primary between begin and commit, then a failover (Sentinel and Cluster).

Every call's tool body has started (its pending record written) when the primary is killed; the bodies
then return, their commits meet a dead primary (redis-py retries, and may land on the new primary),
and after the failover every call is retried, through the same store objects and through fresh ones.

- With ``wait_replicas=1`` the pending record was on the replica before the tool ran, so a retry after
  the failover is refused (effect_status_unknown) or replayed: never run twice. Asserted.
- Without it, a record that had not reached the replica is lost with the primary and the retry runs
  the tool again. Measured and printed (not asserted to be zero): once with the replica in sync (the
  usual loopback case) and once with a lagging replica (its replication stream held up behind 32 MB
  of unrelated writes while it is paused), where the window opens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from airlock_redis import RedisEffectStore
from airlock_redis.core.records import Status
from airlock_redis.embedded import EmbeddedRedis

from .faults import (
    History,
    Tools,
    ids_on_node,
    restore_sentinel_replica,
    slots_served_by,
    wait_cluster_takeover,
    wait_synced_replica,
)
from .topo_helpers import namespace
from .topologies import ClusterTopology, RedisProcess, SentinelTopology, redis_binary, wait_until

pytestmark = pytest.mark.redis_server

K = 6  # calls per store kind (half sync, half async) in flight when the primary dies
ONCE = ("replayed", "refused:effect_status_unknown", "refused:effect_in_progress")
TIMEOUTS: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}


class InFlight:
    """Tool bodies that report they started, then wait until the test killed the primary."""

    def __init__(self) -> None:
        self.killed = threading.Event()
        self._lock = threading.Lock()
        self.started = 0

    def during(self, tool_call_id: str) -> None:
        with self._lock:
            self.started += 1
        if not self.killed.wait(timeout=90):
            raise AssertionError("the primary was never killed")


def run_calls(jobs: list[tuple[Tools, str, str]], phase: str) -> list[threading.Thread]:
    threads = [
        threading.Thread(
            target=tools.call, args=(tool_call_id,), kwargs={"kind": kind, "phase": phase}, daemon=True
        )
        for tools, tool_call_id, kind in jobs
    ]
    for thread in threads:
        thread.start()
    return threads


def join(threads: list[threading.Thread], timeout: float = 120.0) -> None:
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a call did not finish (bounded test)"


def kill_between_begin_and_commit(  # noqa: PLR0917
    url: str,
    ns: str,
    waited_ids: list[str],
    plain_ids: list[str],
    kill: Callable[[], None],
    recover: Callable[[], None],
    title: str,
    *,
    expect_started: bool = True,
) -> tuple[History, dict[str, Any]]:
    """Start every call, kill the primary inside the tool bodies, recover, retry every id twice."""
    history, flight = History(), InFlight()
    waited = Tools(
        RedisEffectStore(url, namespace=ns, wait_replicas=1, wait_timeout=1.0, **TIMEOUTS),
        history,
        flight.during,
    )
    plain = Tools(RedisEffectStore(url, namespace=ns, **TIMEOUTS), history, flight.during)
    kinds = ("sync", "async")
    jobs = [(waited, i, kinds[n % 2]) for n, i in enumerate(waited_ids)]
    jobs += [(plain, i, kinds[n % 2]) for n, i in enumerate(plain_ids)]
    threads = run_calls(jobs, "first")
    wait_until(
        "every call to start its tool body (or be refused)",
        lambda: flight.started + len(history.outcomes) >= len(jobs),
        60,
    )
    if expect_started:
        assert flight.started == len(jobs), history.outcomes
    killed_at = time.monotonic()
    kill()  # SIGKILL: between every started call's begin and its commit
    flight.killed.set()
    join(threads)
    commits_done = time.monotonic()
    recover()
    recovered = time.monotonic()

    fresh_store = RedisEffectStore(url, namespace=ns, **TIMEOUTS)
    statuses = {}
    for tool_call_id in waited_ids + plain_ids:
        record = fresh_store.get(tool_call_id)
        statuses[tool_call_id] = record.status.value if record is not None else "lost"
    # retries: the same store objects (stale connections) and fresh ones (another process), sync and async
    fresh_waited = Tools(
        RedisEffectStore(url, namespace=ns, wait_replicas=1, wait_timeout=1.0, **TIMEOUTS), history
    )
    fresh_plain = Tools(RedisEffectStore(url, namespace=ns, **TIMEOUTS), history)
    for n, tool_call_id in enumerate(waited_ids):
        waited.call(tool_call_id, kind=kinds[n % 2], phase="retry")
        fresh_waited.call(tool_call_id, kind=kinds[(n + 1) % 2], phase="retry")
    for n, tool_call_id in enumerate(plain_ids):
        plain.call(tool_call_id, kind=kinds[n % 2], phase="retry")
        fresh_plain.call(tool_call_id, kind=kinds[(n + 1) % 2], phase="retry")
    fresh_store.close()

    measured = {
        "with_wait_replicas": history.report(f"{title}, wait_replicas=1", ids=waited_ids),
        "without": history.report(f"{title}, no wait_replicas", ids=plain_ids),
        "records_after_failover": {
            "wait_replicas=1": dict(_count(statuses[i] for i in waited_ids)),
            "none": dict(_count(statuses[i] for i in plain_ids)),
        },
        "seconds": {
            "kill_to_commits_given_up_or_landed": round(commits_done - killed_at, 1),
            "to_failover_and_replica_back": round(recovered - killed_at, 1),
        },
        "retries_that_ran_again": {
            "wait_replicas=1": sum(1 for i in waited_ids if history.runs[i] > 1),
            "none": sum(1 for i in plain_ids if history.runs[i] > 1),
        },
    }
    print(
        f"[fault-measure] {title}: records after failover {measured['records_after_failover']}, "
        f"retries that ran the tool again {measured['retries_that_ran_again']}, "
        f"seconds {measured['seconds']}",
        flush=True,
    )
    return history, measured


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def assert_never_twice_with_wait_replicas(history: History, waited_ids: list[str], logs: str = "") -> None:
    """``logs``: the servers' and sentinels' logs, shown if a retry was refused (who named which node)."""
    for tool_call_id in waited_ids:
        assert history.runs[tool_call_id] == 1, (tool_call_id, history.of(tool_call_id))
        outcomes = history.of(tool_call_id)
        assert [o.result for o in outcomes if o.phase == "first"] == ["executed"]  # the caller got its value
        retries = [o.result for o in outcomes if o.phase == "retry"]
        assert len(retries) == 2 and all(r in ONCE for r in retries), f"{outcomes}\n{logs}"


def assert_the_window_was_measured(history: History, plain_ids: list[str], logs: str = "") -> None:
    retries = [o for i in plain_ids for o in history.of(i) if o.phase == "retry"]
    assert len(retries) == 2 * len(plain_ids)
    assert all(o.result in (*ONCE, "executed") for o in retries), f"{retries}\n{logs}"
    # at most one re-run per id: the first retry that found no record ran it, the second one replays
    assert all(history.runs[i] <= 2 for i in plain_ids)


# -- WAIT must not outlast the socket --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_wait_timeout_as_long_as_the_socket_timeout_still_refuses_cleanly(
    redis_server: EmbeddedRedis, kind: str
) -> None:
    """No replica acknowledges (this server has none) and wait_timeout == socket_timeout: the refusal
    names the missing acknowledgement and the record is released, so a retry is not refused as
    effect_status_unknown for a call that never ran (before the fix, the socket timed out first)."""
    ns = namespace()
    store = RedisEffectStore(
        redis_server.url, namespace=ns, wait_replicas=1, wait_timeout=0.3, socket_timeout=0.3
    )
    store.load_scripts()
    history = History()
    tools = Tools(store, history)
    first = tools.call("wait-vs-socket", kind=kind)
    retry = tools.call("wait-vs-socket", kind=kind, phase="retry")
    history.report(f"wait_timeout == socket_timeout, no replica ({kind})")
    for outcome in (first, retry):
        assert outcome.result == "refused:store_unavailable", outcome
        assert "only 0 of the 1 replicas" in outcome.detail
    assert history.runs["wait-vs-socket"] == 0
    assert store.get("wait-vs-socket") is None


# -- Sentinel ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sentinel_primary_killed_between_begin_and_commit() -> None:
    redis_binary()
    with SentinelTopology() as topology:
        old = topology.current_primary()
        ns = namespace()
        waited_ids = [f"sw-{n}" for n in range(K)]
        plain_ids = [f"sp-{n}" for n in range(K)]
        promoted: list[RedisProcess] = []

        def recover() -> None:
            new = topology.wait_for_failover(old, timeout=60)
            promoted.append(new)
            restore_sentinel_replica(topology, old, new)
            topology.wait_writable()

        history, _ = kill_between_begin_and_commit(
            topology.url,
            ns,
            waited_ids,
            plain_ids,
            old.kill,
            recover,
            "sentinel kill -9 between begin and commit",
        )
        assert_never_twice_with_wait_replicas(history, waited_ids, topology.logs(6000))
        assert_the_window_was_measured(history, plain_ids, topology.logs(6000))

        # -- the window opened: the new primary's replica lags behind --------------------------
        primary, replica = promoted[0], old
        lag_ns = namespace()
        lag_waited = [f"lw-{n}" for n in range(K)]
        lag_plain = [f"lp-{n}" for n in range(K)]
        assert replica.process is not None

        def pause_replica_behind_ballast() -> None:
            replica.pause()
            with primary.client(socket_timeout=10) as c:
                c.set("ballast", b"\0" * (32 * 1024 * 1024))

        def kill_and_resume() -> None:
            primary.kill()
            replica.resume()

        def recover_again() -> None:
            new = topology.wait_for_failover(primary, timeout=60)
            assert new is replica
            restore_sentinel_replica(topology, primary, new)
            topology.wait_writable()

        pause_replica_behind_ballast()
        try:
            lag_history, measured = kill_between_begin_and_commit(
                topology.url,
                lag_ns,
                lag_waited,
                lag_plain,
                kill_and_resume,
                recover_again,
                "sentinel kill -9 with a lagging replica",
                expect_started=False,
            )
        finally:
            replica.resume()
        # wait_replicas=1: the replica could not acknowledge, so no tool ran before the kill
        firsts = [o.result for i in lag_waited for o in lag_history.of(i) if o.phase == "first"]
        assert firsts == ["refused:store_unavailable"] * K, firsts
        assert all(lag_history.runs[i] <= 1 for i in lag_waited)
        assert_the_window_was_measured(lag_history, lag_plain, topology.logs(6000))
        print(
            "[fault-measure] lagging replica, no wait_replicas: "
            f"{measured['retries_that_ran_again']['none']} "
            f"of {K} retries ran the tool again (the record was lost with the primary)",
            flush=True,
        )


# -- Cluster -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cluster_primary_killed_between_begin_and_commit() -> None:
    redis_binary()
    with ClusterTopology() as cluster:
        ns = namespace()
        target = cluster.primaries()[0]
        candidates = cluster.replicas_of(target)
        keys = RedisEffectStore(cluster.url, namespace=ns)
        waited_ids = ids_on_node(cluster, target, keys, K, "cw")
        plain_ids = ids_on_node(cluster, target, keys, K, "cp")
        slot = slots_served_by(cluster, target)[0][0]

        def recover() -> None:
            new = wait_cluster_takeover(cluster, target, candidates, slot)
            target.restart()  # nodes.conf survives: it rejoins as a replica of the new primary
            wait_synced_replica(target, new)
            cluster.wait_healthy(60)

        history, _ = kill_between_begin_and_commit(
            cluster.url,
            ns,
            waited_ids,
            plain_ids,
            target.kill,
            recover,
            "cluster kill -9 between begin and commit",
        )
        assert_never_twice_with_wait_replicas(history, waited_ids, cluster.logs(6000))
        assert_the_window_was_measured(history, plain_ids, cluster.logs(6000))
        check = RedisEffectStore(cluster.url, namespace=ns)
        for tool_call_id in waited_ids:
            record = check.get(tool_call_id)
            assert record is not None and record.status in (Status.PENDING, Status.COMMITTED)
        check.close()
        with redis.Redis(*target.address) as c:
            assert c.info("replication")["role"] == "slave"
