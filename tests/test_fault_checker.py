"""The fault run's checker (tests/history_checker.py) catches broken stores, and passes the real one.

One scripted workload runs against a real redis-server through three stores: the real
RedisEffectStore, one whose begin skips the owner check (it always says "started"), and one that
forgets to release (``settle(RELEASE)`` answers OK and sends nothing). The checker must name
violations for each broken store, and none for the real one. No faults, no sleeps: the calls follow
each other, sync and async, and each one's outcome is read before the next is made.

Then the excuses, on small written histories: a second execution after a primary was lost is a
documented loss only for an id whose calls did not wait for every replica; a write-behind commit
(queued, answered at once) binds later calls only once it is known to have landed.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from airlock_redis import RedisEffectStore
from airlock_redis.core.records import BeginKind, BeginOutcome, BeginRequest, Settlement, TransitionResult
from airlock_redis.embedded import EmbeddedRedis

from . import history_checker
from .fault_run import MENUS, RecordingStore, Workload, fault_schedule, read_records

pytestmark = pytest.mark.redis_server


class _AlwaysStarted(RedisEffectStore):
    """Broken: begin takes the call over whatever the record says (no owner or status check)."""

    def begin(self, request: BeginRequest) -> BeginOutcome:
        found = super().begin(request)
        return (
            found if found.kind is BeginKind.STARTED else BeginOutcome(BeginKind.STARTED, found.attempt + 1)
        )

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        found = await super().abegin(request)
        return (
            found if found.kind is BeginKind.STARTED else BeginOutcome(BeginKind.STARTED, found.attempt + 1)
        )


class _NeverReleases(RedisEffectStore):
    """Broken: a release answers OK and sends nothing."""

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        if settlement is Settlement.RELEASE:
            return TransitionResult.OK
        return super().settle(request, attempt, settlement)

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        if settlement is Settlement.RELEASE:
            return TransitionResult.OK
        return await super().asettle(request, attempt, settlement)


class AlwaysStartedStore(RecordingStore, _AlwaysStarted):
    """The recorder notes what the broken begin answered (MRO: recorder, broken, real)."""


class NeverReleasesStore(RecordingStore, _NeverReleases):
    pass


# (tool_call_id, sync/async, how the execution ends if the tool runs); every id is called in order
SCRIPT: list[tuple[str, str, str]] = [
    ("transfer:a", "sync", "ok"),
    ("transfer:a", "sync", "ok"),  # a retry of a committed call: replays
    ("send_sms:b", "async", "ok"),
    ("send_sms:b", "async", "ok"),
    ("refresh:c", "sync", "ok"),
    ("refresh:c", "async", "ok"),
    ("transfer:d", "async", "plain"),  # released: the retry runs it (for the first time, in effect)
    ("transfer:d", "sync", "ok"),
    ("transfer:d", "sync", "ok"),
    ("send_sms:e", "sync", "ambiguous"),  # unknown: the retry is refused, rightly
    ("send_sms:e", "async", "ok"),
    ("transfer:f", "sync", "ok"),  # wait_replicas=1 on a server without replicas: refused, released
    ("transfer:f", "async", "ok"),
    ("send_sms:g", "sync", "plain"),
    ("send_sms:g", "async", "plain"),
]
NO_REPLICA = {"transfer:f"}  # ids called with wait_replicas=1 (the server has no replica)


def run_script(
    server: EmbeddedRedis, cls: type[RecordingStore], write_behind: bool = False
) -> history_checker.Verdict:
    namespace = f"checker:{secrets.token_hex(4)}"
    events: list[dict[str, Any]] = []
    endings = iter([ending for _, _, ending in SCRIPT])
    current: dict[str, str] = {}

    def ending(_tool_call_id: str) -> str:
        return current["ending"]

    stores = {
        (wait, write_behind): cls(
            server.url, namespace=namespace, wait_replicas=wait, wait_timeout=0.05, write_behind=write_behind
        )
        for wait in (0, 1)
    }

    def wait_for(tool_call_id: str) -> tuple[int, bool]:
        return (1 if tool_call_id in NO_REPLICA else 0), write_behind

    workload = Workload(0, stores, 1, events.append, ending, wait_for=wait_for)
    try:
        for tool_call_id, kind, _ in SCRIPT:
            current["ending"] = next(endings)
            workload.call(tool_call_id, kind)
    finally:
        workload.close()
    records = read_records(server.url, namespace, {tool_call_id for tool_call_id, _, _ in SCRIPT})
    return history_checker.check(events, records)


@pytest.mark.parametrize("write_behind", [False, True], ids=["direct", "write-behind"])
def test_the_real_store_passes(redis_server: EmbeddedRedis, write_behind: bool) -> None:
    verdict = run_script(redis_server, RecordingStore, write_behind)
    assert verdict.ok, verdict.report()
    assert verdict.documented == [], verdict.report()
    if write_behind:  # every commit was queued, and the store's sender landed each one
        behind = verdict.counts["write_behind"]
        assert behind["queued"] == behind["landed_ok"] == behind["known_landed"] >= 4, behind
    # the script reached every path it means to: replays, a release, an unknown, a refused begin
    results = verdict.counts["results"]
    assert results["replayed"] >= 3 and results["refused:effect_status_unknown"] >= 1, results
    assert results["refused:store_unavailable"] >= 2 and results["error:ValueError"] >= 3, results


@pytest.mark.parametrize("write_behind", [False, True], ids=["direct", "write-behind"])
def test_a_begin_without_the_owner_check_is_caught(redis_server: EmbeddedRedis, write_behind: bool) -> None:
    verdict = run_script(redis_server, AlwaysStartedStore, write_behind)
    rules = verdict.by_rule()
    assert rules.get("executed_twice", 0) >= 2, verdict.report()  # transfer:a, send_sms:b
    assert rules.get("commit_not_replayed", 0) >= 3, verdict.report()  # and refresh:c
    ids = {v.tool_call_id for v in verdict.violations}
    assert {"transfer:a", "send_sms:b", "refresh:c"} <= ids, verdict.report()


def test_a_store_that_forgets_to_release_is_caught(redis_server: EmbeddedRedis) -> None:
    verdict = run_script(redis_server, NeverReleasesStore)
    doubt = {v.tool_call_id for v in verdict.violations if v.rule == "left_in_doubt"}
    refused = {v.tool_call_id for v in verdict.violations if v.rule == "unjustified_refusal"}
    # d and g: a tool that raised a plain error; f: refused before running (no replica acknowledged)
    assert {"transfer:d", "transfer:f", "send_sms:g"} <= doubt, verdict.report()
    assert {"transfer:d", "transfer:f", "send_sms:g"} <= refused, verdict.report()
    assert all(v.tool_call_id not in {"send_sms:e"} for v in verdict.violations), verdict.report()


# -- the excuses, on written histories ------------------------------------------------------------
def _call(n: int, t: float, result: str, nonce: str, *, covers: bool, value_call: str = "") -> dict[str, Any]:
    return {
        "type": "call",
        "w": 0,
        "n": n,
        "id": "transfer:x",
        "tool": "transfer",
        "kind": "sync",
        "wait": 1 if covers else 0,
        "covers": covers,
        "nonce": nonce,
        "value_call": value_call or nonce,
        "started": t,
        "ended": t + 0.01,
        "result": result,
    }


def _twice_after_a_failover(covers: bool) -> list[dict[str, Any]]:
    steps = [
        {
            "type": "store",
            "w": 0,
            "n": n,
            "id": "transfer:x",
            "op": op,
            "result": res,
            "sent": t,
            "done": t + 0.001,
        }
        for n, op, res, t in [
            (0, "begin", "started", 1.0),
            (0, "commit", "ok", 1.005),
            (1, "begin", "started", 5.0),
            (1, "commit", "ok", 5.005),
        ]
    ]
    executions = [
        {
            "type": "exec",
            "w": 0,
            "n": n,
            "id": "transfer:x",
            "tool": "transfer",
            "at": t,
            "nonce": nonce,
            "ending": "ok",
        }
        for n, t, nonce in [(0, 1.002, "n0"), (1, 5.002, "n1")]
    ]
    fault = {"type": "fault", "name": "kill9_primary", "target": "p", "start": 2.0, "end": 4.0, "loses": True}
    calls = [_call(0, 1.0, "executed", "n0", covers=covers), _call(1, 5.0, "executed", "n1", covers=covers)]
    return [*calls, *steps, *executions, fault]


def test_a_second_run_after_a_lost_primary_is_documented_without_wait_replicas() -> None:
    record = {"status": "committed", "value_call": "n1"}
    verdict = history_checker.check(_twice_after_a_failover(False), {"transfer:x": record})
    assert verdict.ok, verdict.report()
    assert {v.rule for v in verdict.documented} == {"executed_twice", "commit_not_replayed"}, verdict.report()


def test_a_second_run_after_a_lost_primary_is_a_violation_with_wait_replicas() -> None:
    record = {"status": "committed", "value_call": "n1"}
    verdict = history_checker.check(_twice_after_a_failover(True), {"transfer:x": record})
    assert verdict.by_rule().get("executed_twice") == 1, verdict.report()


def test_a_second_run_without_a_fault_is_a_violation_either_way() -> None:
    events = [e for e in _twice_after_a_failover(False) if e["type"] != "fault"]
    verdict = history_checker.check(events, {"transfer:x": {"status": "committed", "value_call": "n1"}})
    assert set(verdict.by_rule()) == {"executed_twice", "commit_not_replayed"}, verdict.report()


@pytest.mark.parametrize("topology", sorted(MENUS))
def test_a_seed_draws_the_same_fault_schedule(topology: str) -> None:
    first = fault_schedule(topology, 12345, 40)
    assert first == fault_schedule(topology, 12345, 40)
    assert first != fault_schedule(topology, 12346, 40)
    assert set(first) <= set(MENUS[topology]) and len(set(first)) > 3


def _lost_begin(release_error: str) -> list[dict[str, Any]]:
    """A begin that may have landed (its reply lost), then a release that failed with ``release_error``."""
    call = _call(0, 1.0, "refused:store_unavailable", "n0", covers=False)
    begin = {"op": "begin", "result": "error:StoreError", "maybe_applied": True, "sent": 1.0, "done": 2.0}
    release = {"op": "settle:release", "result": "error:StoreError", "maybe_applied": False, "sent": 2.0}
    steps = [begin, {**release, "done": 2.1, "detail": f"StoreError: {release_error}"}]
    return [call, *({"type": "store", "w": 0, "n": 0, "id": "transfer:x", **s} for s in steps)]


def test_a_release_that_cannot_reach_the_server_is_documented() -> None:
    events = _lost_begin("ConnectionError: Error 111 connecting to 127.0.0.1:1. Connection refused.")
    verdict = history_checker.check(events, {"transfer:x": {"status": "pending", "attempt": 1}})
    assert verdict.ok and verdict.by_rule(documented=True) == {"left_in_doubt": 1}, verdict.report()


def test_a_release_the_server_refused_is_a_violation() -> None:
    events = _lost_begin("OutOfMemoryError: command not allowed when used memory > 'maxmemory'.")
    verdict = history_checker.check(events, {"transfer:x": {"status": "pending", "attempt": 1}})
    assert verdict.by_rule() == {"left_in_doubt": 1}, verdict.report()


def test_a_begin_said_never_sent_that_left_a_record_is_a_violation() -> None:
    events = _lost_begin("ConnectionError: refused")
    events[1] = {**events[1], "maybe_applied": False}
    events = events[:2]  # no release: the guard believed the begin never landed
    verdict = history_checker.check(events, {"transfer:x": {"status": "pending", "attempt": 1}})
    assert verdict.by_rule() == {"left_in_doubt": 1}, verdict.report()


def _two_begins_then_durability_fails(first_release: str | None) -> list[dict[str, Any]]:
    """Attempt 1 began; attempt 2 (reversible) took it over; both found too few replicas before their
    tools ran: attempt 1 sent its release (answered ``first_release``; None: sent none), attempt 2 gave
    the record back unknown (a take-over's give-back)."""
    calls = [
        {
            **_call(0, 1.0, "refused:store_unavailable", "n0", covers=True),
            "id": "refresh:x",
            "tool": "refresh",
        },
        {
            **_call(1, 1.0, "refused:store_unavailable", "n1", covers=True),
            "id": "refresh:x",
            "tool": "refresh",
        },
    ]
    first = [{"op": "begin", "result": "started", "attempt": 1, "sent": 1.0, "done": 1.001}]
    if first_release is not None:
        first.append({"op": "settle:release", "result": first_release, "sent": 1.6, "done": 1.601})
    second = [
        {"op": "begin", "result": "started", "attempt": 2, "sent": 1.0, "done": 1.002},
        {"op": "settle:unknown", "result": "ok", "sent": 1.6, "done": 1.602},
    ]
    steps = [
        *({"type": "store", "w": 0, "n": 0, "id": "refresh:x", **s} for s in first),
        *({"type": "store", "w": 0, "n": 1, "id": "refresh:x", **s} for s in second),
    ]
    return [*calls, *steps]


def test_a_take_over_left_unknown_over_an_attempt_that_did_not_run_is_conservative() -> None:
    """Seen in a fault run's burst: the take-over cannot know that the attempt it took over did not
    run, so it keeps the doubt; a reversible retry takes the record over again."""
    events = _two_begins_then_durability_fails("superseded")
    verdict = history_checker.check(events, {"refresh:x": {"status": "unknown", "attempt": 2}})
    assert verdict.ok and verdict.by_rule(documented=True) == {"left_in_doubt": 1}, verdict.report()


def test_a_take_over_left_unknown_while_the_first_attempt_sent_no_release_is_a_violation() -> None:
    events = _two_begins_then_durability_fails(None)
    verdict = history_checker.check(events, {"refresh:x": {"status": "unknown", "attempt": 2}})
    assert verdict.by_rule() == {"left_in_doubt": 1}, verdict.report()


# -- write-behind commits, on written histories ----------------------------------------------------
def _queued_commit(tool: str, landing: str | None, later: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Call 0 ran ``tool`` (value n0) through a write-behind store: its commit answered at once
    (``queued``); ``landing``: what its ``commit:landed`` step says (None: no landing noted). Then
    ``later`` calls, one a second from 2.0 on: (result, value_call); an ``executed`` one ran the tool."""
    tool_call_id = f"{tool}:x"

    def step(n: int, op: str, result: str, sent: float, done: float) -> dict[str, Any]:
        return {
            "type": "store",
            "w": 0,
            "n": n,
            "id": tool_call_id,
            "op": op,
            "result": result,
            "sent": sent,
            "done": done,
        }

    def execution(n: int, at: float, nonce: str) -> dict[str, Any]:
        return {
            "type": "exec",
            "w": 0,
            "n": n,
            "id": tool_call_id,
            "tool": tool,
            "at": at,
            "nonce": nonce,
            "ending": "ok",
        }

    def call(n: int, t: float, result: str, nonce: str, value_call: str) -> dict[str, Any]:
        made = _call(n, t, result, nonce, covers=False, value_call=value_call)
        return {**made, "id": tool_call_id, "tool": tool, "behind": True}

    events = [
        call(0, 1.0, "executed", "n0", "n0"),
        step(0, "begin", "started", 1.0, 1.001),
        execution(0, 1.002, "n0"),
        step(0, "commit", "queued", 1.005, 1.0051),
    ]
    if landing is not None:
        events.append(step(0, "commit:landed", landing, 1.005, 1.5))
    for n, (result, value_call) in enumerate(later, start=1):
        t = 1.0 + n
        found = {"executed": "started", "replayed": "committed"}.get(result, "pending")
        events += [call(n, t, result, f"n{n}", value_call), step(n, "begin", found, t, t + 0.001)]
        if result == "executed":
            events += [execution(n, t + 0.002, f"n{n}"), step(n, "commit", "queued", t + 0.005, t + 0.0051)]
    return events


@pytest.mark.parametrize("landing", [None, "error:ConnectionError", "superseded"])
def test_a_queued_commit_that_did_not_land_binds_no_retry(landing: str | None) -> None:
    """The caller had its value, the commit never landed: the record stays pending and the retry is
    refused (what the README promises for write-behind), with no finding; before the rule, the
    queued commit counted as confirmed and both of these were reported."""
    events = _queued_commit("transfer", landing, [("refused:effect_status_unknown", "")])
    verdict = history_checker.check(events, {"transfer:x": {"status": "pending", "attempt": 1}})
    assert verdict.ok and verdict.documented == [], verdict.report()
    assert verdict.counts["write_behind"]["queued"] == 1, verdict.counts


def test_a_queued_commit_that_landed_must_be_replayed() -> None:
    events = _queued_commit("transfer", "ok", [("refused:effect_status_unknown", "")])
    verdict = history_checker.check(events, {"transfer:x": {"status": "pending", "attempt": 1}})
    # the refusal came after the landing, and the final record lost the commit
    assert verdict.by_rule() == {"commit_not_replayed": 1, "unjustified_refusal": 1}, verdict.report()


@pytest.mark.parametrize("landing", [None, "ok"])
def test_a_reversible_take_over_after_a_queued_commit(landing: str | None) -> None:
    """A reversible tool runs again over a record whose queued commit never landed (an abandoned
    record is taken over): allowed. Over one whose commit landed: a violation."""
    events = _queued_commit("refresh", landing, [("executed", "n1")])
    verdict = history_checker.check(events, {"refresh:x": {"status": "committed", "value_call": "n1"}})
    expected = {} if landing is None else {"commit_not_replayed": 1}
    assert verdict.by_rule() == expected, verdict.report()


def test_a_replay_of_a_queued_commit_shows_it_landed() -> None:
    """No landing noted, but a retry replayed the value: the commit had landed by then, so a later
    refusal and a final record without it are violations."""
    later = [("replayed", "n0"), ("refused:effect_status_unknown", "")]
    verdict = history_checker.check(
        _queued_commit("transfer", None, later), {"transfer:x": {"status": "pending", "attempt": 1}}
    )
    assert verdict.by_rule() == {"commit_not_replayed": 1, "unjustified_refusal": 1}, verdict.report()
    assert verdict.counts["write_behind"]["known_landed"] == 1, verdict.counts
