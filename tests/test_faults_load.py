"""8 processes call mixed tools (irreversible, costly, reversible) with 20% duplicate retries while the
primary is killed (-9) and a replica takes over; every store uses ``wait_replicas=1``.

Each worker writes every real execution and every outcome to a file; the test joins them and asserts
that no irreversible or costly call ran twice. Refusals during the failover window (store_unavailable:
no replica could acknowledge, or no primary answered) are expected and counted. Bounded: the load stops
when the test says so (after the failover and some load on the new primary) or after MAX_SECONDS.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from .faults import (
    ONCE_ONLY,
    load_worker,
    restore_sentinel_replica,
    slots_served_by,
    wait_cluster_takeover,
    wait_synced_replica,
)
from .topo_helpers import namespace
from .topologies import ClusterTopology, RedisProcess, SentinelTopology, redis_binary, wait_until

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

WORKERS = 8
MAX_SECONDS = 60.0  # a worker stops by itself after this long, whatever happens
LOAD_RECORDS = 60  # records written before the kill, and again after the recovery


def record_count(nodes: list[RedisProcess], ns: str) -> int:
    total = 0
    for node in nodes:
        if not node.alive:
            continue
        try:
            with node.client(socket_timeout=2) as c:
                if c.info("replication")["role"] != "master":
                    continue
                total += sum(1 for _ in c.scan_iter(match=f"{ns}*", count=1000))
        except (redis.RedisError, OSError):
            continue
    return total


def run_load(  # noqa: PLR0917
    url: str,
    nodes: list[RedisProcess],
    kill: Callable[[], None],
    recover: Callable[[], float],
    title: str,
    tmp: Path,
) -> dict[str, Any]:
    """``recover()`` waits for the take-over and restores a replica; it returns when the take-over was."""
    ns = namespace()
    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    outs = [tmp / f"worker-{w}.json" for w in range(WORKERS)]
    seed = random.randrange(1 << 30)
    workers = [
        ctx.Process(
            target=load_worker,
            args=(url, ns, w, WORKERS, go, stop, MAX_SECONDS, seed + w, str(outs[w])),
            daemon=True,
        )
        for w in range(WORKERS)
    ]
    for process in workers:
        process.start()
    go.set()
    try:
        wait_until("load before the kill", lambda: record_count(nodes, ns) >= LOAD_RECORDS, 60)
        killed_at = time.time()
        kill()
        promoted_at = recover()
        recovered_at = time.time()
        after = record_count(nodes, ns)
        wait_until("load on the new primary", lambda: record_count(nodes, ns) >= after + LOAD_RECORDS, 60)
    finally:
        stop.set()
        for process in workers:
            process.join(timeout=90)
        for process in workers:
            if process.is_alive():
                process.kill()
    assert all(p.exitcode == 0 for p in workers), [p.exitcode for p in workers]

    runs: Counter[str] = Counter()
    tool_of: dict[str, str] = {}
    results: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    executions_after_recovery = 0
    for out in outs:
        data = json.loads(out.read_text())
        for tool_call_id, tool, at in data["executions"]:
            runs[tool_call_id] += 1
            tool_of[tool_call_id] = tool
            executions_after_recovery += float(at) > recovered_at
        for _id, _tool, phase, result, detail in data["outcomes"]:
            results[result] += 1
            phases[phase] += 1
            if result.startswith("refused"):
                causes[_cause(detail)] += 1
    twice = {i: n for i, n in runs.items() if n > 1}
    measured: dict[str, Any] = {
        "calls": sum(results.values()),
        "duplicate_retries": phases["duplicate"],
        "executions": sum(runs.values()),
        "executed": results["executed"],
        "replayed": results["replayed"],
        "refused": {r: n for r, n in results.items() if r.startswith("refused")},
        "errors": {r: n for r, n in results.items() if r.startswith("error")},
        "refusal_causes": dict(causes.most_common(4)),
        "ids_run_twice_by_tool": dict(Counter(tool_of[i] for i in twice)),
        "executions_after_recovery": executions_after_recovery,
        "seconds_kill_to_promotion": round(promoted_at - killed_at, 1),
        "seconds_promotion_to_replica_back": round(recovered_at - promoted_at, 1),
    }
    print(f"\n[fault-measure] load {title}: {json.dumps(measured, sort_keys=True)}", flush=True)
    once_only_twice = {i: n for i, n in twice.items() if tool_of[i] in ONCE_ONLY}
    assert once_only_twice == {}, f"irreversible or costly calls ran twice: {once_only_twice}"
    assert measured["calls"] >= 2 * LOAD_RECORDS and measured["duplicate_retries"] > 0
    assert executions_after_recovery > 0, "no load reached the new primary"
    return measured


def _cause(detail: str) -> str:
    """The why of a refusal, without addresses: "did not run (Redis ...: ConnectionError: ...)"."""
    why = detail.partition("did not run (")[2] or detail
    for marker in (
        "only 0 of the",
        "MasterNotFoundError",
        "ClusterDownError",
        "Connection refused",
        "Error 111",
    ):
        if marker in why:
            return marker
    return why[:50]


def test_load_through_a_sentinel_failover(tmp_path: Path) -> None:
    redis_binary()
    with SentinelTopology() as topology:
        old = topology.current_primary()

        def recover() -> float:
            new = topology.wait_for_failover(old, timeout=60)
            promoted_at = time.time()
            restore_sentinel_replica(topology, old, new)  # wait_replicas=1 needs a replica again
            return promoted_at

        run_load(topology.url, topology.data_nodes, old.kill, recover, "sentinel failover", tmp_path)


def test_load_through_a_cluster_failover(tmp_path: Path) -> None:
    redis_binary()
    with ClusterTopology() as cluster:
        target = cluster.primaries()[0]
        candidates = cluster.replicas_of(target)
        slot = slots_served_by(cluster, target)[0][0]

        def recover() -> float:
            new = wait_cluster_takeover(cluster, target, candidates, slot)
            promoted_at = time.time()
            target.restart()
            wait_synced_replica(target, new)
            return promoted_at

        run_load(cluster.url, cluster.nodes, target.kill, recover, "cluster failover", tmp_path)
