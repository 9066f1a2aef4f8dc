"""Races between processes that share one real redis-server.

Eight spawned processes wait on a barrier, then call the same tool under the same tool_call_id at
the same moment; this repeats for several ids. The tool bodies count their runs with INCR in Redis,
and each racer logs what it got.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

from airlock_redis import RedisEffectStore, Status, idempotency_key
from airlock_redis.core.codec import decode_result
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import BeginRequest
from tests.procs import (
    commits_key,
    outcomes_key,
    race_irreversible,
    race_reversible,
    runs_key,
    spawn,
)

RACERS = 8
IDS = 20
JOIN_TIMEOUT = 300.0


def run_racers(target: Callable[..., None], args: tuple[Any, ...], **kwargs: Any) -> None:
    """Start RACERS spawned processes on ``target(*args, barrier, worker, **kwargs)``; all must exit 0."""
    context = spawn()
    barrier = context.Barrier(RACERS)
    processes = [
        context.Process(target=target, args=(*args, barrier, worker), kwargs=kwargs, daemon=True)
        for worker in range(RACERS)
    ]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join(timeout=JOIN_TIMEOUT)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    assert [p.exitcode for p in processes] == [0] * RACERS


def read_log(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in client.lrange(key, 0, -1)]


@pytest.mark.slow
@pytest.mark.parametrize("hold", [0.0, 0.05])
def test_irreversible_tool_runs_exactly_once_per_id_under_a_race(
    redis_server: EmbeddedRedis, namespace: str, hold: float
) -> None:
    ids = [f"race-{n}" for n in range(IDS)]
    run_racers(race_irreversible, (redis_server.url, namespace, ids), hold=hold)

    client = redis_server.client()
    totals: Counter[str] = Counter()
    for tool_call_id in ids:
        assert int(client.get(runs_key(namespace, tool_call_id)) or 0) == 1, tool_call_id
        outcomes = read_log(client, outcomes_key(namespace, tool_call_id))
        assert len(outcomes) == RACERS
        kinds = Counter(o["outcome"] for o in outcomes)
        totals.update(kinds)
        assert kinds["executed"] == 1, kinds
        assert set(kinds) <= {"executed", "replayed", "refused:effect_status_unknown"}, kinds
        executed = next(o["value"] for o in outcomes if o["outcome"] == "executed")
        assert executed["run"] == 1
        assert all(o["value"] == executed for o in outcomes if o["outcome"] == "replayed")
        store = RedisEffectStore(client=client, namespace=namespace)
        record = store.get(tool_call_id)
        assert record is not None and record.value is not None
        assert (record.status, record.attempt) == (Status.COMMITTED, 1)
        assert decode_result(record.value) == executed
    print(
        f"\n{RACERS} processes x {IDS} ids, body holds {hold}s: "
        f"executed {totals['executed']}, replayed {totals['replayed']}, "
        f"refused {totals['refused:effect_status_unknown']} (tool bodies run: {IDS})"
    )
    client.close()


@pytest.mark.slow
def test_reversible_take_over_race_serialises_attempts_and_one_commit_wins(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    """Records left pending by a dead attempt; eight racers run a reversible tool that takes them over."""
    ids = [f"takeover-{n}" for n in range(5)]
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    key = idempotency_key("refresh_quote", {"symbol": "ACME"})
    for tool_call_id in ids:
        dead = BeginRequest(tool_call_id, key, "refresh_quote", secrets.token_hex(16), False)
        assert store.begin(dead).attempt == 1

    run_racers(race_reversible, (redis_server.url, namespace, ids))

    client = redis_server.client()
    totals: Counter[str] = Counter()
    for tool_call_id in ids:
        outcomes = read_log(client, outcomes_key(namespace, tool_call_id))
        commits = read_log(client, commits_key(namespace, tool_call_id))
        assert len(outcomes) == RACERS
        executed = [o for o in outcomes if o["effect"] == "executed"]
        replayed = [o for o in outcomes if o["effect"] == "replayed"]
        assert len(executed) + len(replayed) == RACERS
        totals.update(executed=len(executed), replayed=len(replayed))
        assert int(client.get(runs_key(namespace, tool_call_id)) or 0) == len(executed)
        # each attempt owned the record alone: a distinct attempt number, after the dead attempt 1
        attempts = [o["attempt"] for o in executed]
        assert len(set(attempts)) == len(attempts) and min(attempts) >= 2, attempts
        # every executed attempt tried to commit; exactly one commit won
        assert len(commits) == len(executed)
        results = Counter(c["result"] for c in commits)
        assert results["ok"] == 1 and results["ok"] + results["superseded"] == len(commits), results
        totals.update(superseded=results["superseded"])
        record = store.get(tool_call_id)
        assert record is not None and record.value is not None and record.status is Status.COMMITTED
        stored = decode_result(record.value)
        winners = [o for o in executed if o["value"] == stored]
        assert len(winners) == 1 and winners[0]["attempt"] == record.attempt
        assert all(o["value"] == stored for o in replayed)
    print(
        f"\n{RACERS} processes x {len(ids)} pending records, reversible take-over: executed "
        f"{totals['executed']}, commits superseded {totals['superseded']}, replayed {totals['replayed']}"
    )
    store.close()
    client.close()
