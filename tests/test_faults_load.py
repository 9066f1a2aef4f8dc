"""8 processes call mixed tools (irreversible, costly, reversible) with 20% duplicate retries while the
primary is killed (-9) and a replica takes over; every store uses ``wait_replicas=1``.

Each worker writes every real execution, every outcome and every store step to a file; the test joins
them (tests/load_history.py) and asserts that no irreversible or costly call ran twice; if one did, it
prints that id's whole history (and saves it under $AIRLOCK_LOAD_HISTORY_DIR when set). Refusals during
the failover window (store_unavailable: no replica could acknowledge, or no primary answered) are
expected and counted. Bounded: the load stops when the test says so (after the failover and some load
on the new primary) or after MAX_SECONDS.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import redis

from airlock_redis import RedisEffectStore

from . import load_history
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
    logs: Callable[[], str] = lambda: "",
) -> dict[str, Any]:
    """``recover()`` waits for the take-over and restores a replica; it returns when the take-over was.
    ``logs()`` gives the servers' logs: counted (LOG_EVENTS) in the saved summary, and printed with the
    history of any id that ran twice."""
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

    run = load_history.load(outs)
    runs, tool_of = run.runs(), run.tool_of()
    results: Counter[str] = Counter(o["result"] for o in run.outcomes)
    phases: Counter[str] = Counter(o["phase"] for o in run.outcomes)
    causes: Counter[str] = Counter(
        _cause(o["detail"]) for o in run.outcomes if o["result"].startswith("refused")
    )
    executions_after_recovery = sum(1 for e in run.executions if float(e["at"]) > recovered_at)
    twice = run.twice()
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
    once_only_twice = run.twice(ONCE_ONLY)
    measured["once_only_twice"] = once_only_twice
    server_logs = logs()
    saved = {  # near misses too: a commit that found no record, or a once-only id begun twice
        "log_events": _log_events(server_logs),
        "store_results": dict(Counter(f"{step['op']}:{step['result']}" for step in run.store)),
        "recreated": sorted({step["id"] for step in run.store if step["result"] == "recreated"}),
        "superseded": sorted({st["id"] for st in run.store if st["result"] == "superseded"}),
    }
    text = ""
    if once_only_twice:
        marks = {"kill": killed_at, "promotion": promoted_at, "replica back": recovered_at}
        records = _records(url, ns, once_only_twice)
        text = load_history.explain(run, sorted(once_only_twice), marks, records)
        text += "\n\n=== server logs ===\n" + server_logs
        print(f"\n[fault-history] load {title}:\n{text}", flush=True)
    load_history.save(title, {"title": title, **measured, **saved}, text, run if once_only_twice else None)
    assert once_only_twice == {}, f"irreversible or costly calls ran twice: {once_only_twice}\n{text}"
    assert measured["calls"] >= 2 * LOAD_RECORDS and measured["duplicate_retries"] > 0
    assert executions_after_recovery > 0, "no load reached the new primary"
    return measured


def _records(url: str, ns: str, ids: Iterable[str]) -> dict[str, Any]:
    """The records of ``ids`` as the primary holds them after the run (or why they could not be read)."""
    found: dict[str, Any] = {}
    store = RedisEffectStore(url, namespace=ns, socket_timeout=5.0)
    try:
        for tool_call_id in ids:
            try:
                found[tool_call_id] = store.get(tool_call_id)
            except Exception as exc:
                found[tool_call_id] = f"unreadable: {type(exc).__name__}: {exc}"
    finally:
        store.close()
    return found


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

        run_load(
            topology.url,
            topology.data_nodes,
            old.kill,
            recover,
            "sentinel failover",
            tmp_path,
            lambda: _log_tails(topology.processes),
        )


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

        run_load(
            cluster.url,
            cluster.nodes,
            target.kill,
            recover,
            "cluster failover",
            tmp_path,
            lambda: _log_tails(cluster.processes),
        )


def _log_tails(processes: Iterable[RedisProcess]) -> str:
    return "\n".join(p.log_tail(20000) for p in processes)


# what the servers and sentinels said about roles during a run (counted in the saved summary): a second
# failover, a spurious down, or a node told to follow another would show here
LOG_EVENTS = (
    "+sdown master",
    "+odown",
    "+switch-master",
    "+failover-end",
    "-failover-abort",
    "+convert-to-slave",
    "Failover election won",
    "Cluster state changed: fail",
    "MASTER MODE enabled",
    "Connecting to MASTER",
    "Full resync requested",
    "Partial resynchronization request from",
)


def _log_events(text: str) -> dict[str, Any]:
    counts = {event: text.count(event) for event in LOG_EVENTS if event in text}
    lines = [
        line[:160]
        for line in text.splitlines()
        if line.startswith("---") or any(e in line for e in LOG_EVENTS)
    ]
    return {"counts": counts, "lines": lines[:120]}
