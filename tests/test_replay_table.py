"""The spec's replay table, row by row, for every store kind and for sync and async tools.

| earlier attempt                         | the replay                                  |
|-----------------------------------------|---------------------------------------------|
| committed                               | stored value, tool not run, effect replayed |
| pending or unknown, not reversible      | refused effect_status_unknown               |
| pending or unknown, reversible          | runs again                                  |
| any, other arguments or another tool    | refused policy_violation                    |
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectOutcomeUnknown,
    EffectStore,
    Execution,
    GuardedCall,
    Reversibility,
    idempotency_key,
    tool_call_context,
)
from airlock_redis.stores import BeginRequest
from tests.tools import Counted, call_with_id, make_tool

KINDS = ("sync", "async")


def strand_pending(store: EffectStore, tool_call_id: str, tool: str, arguments: dict[str, Any]) -> None:
    """Leave a pending record as an attempt that died mid-call would."""
    request = BeginRequest(tool_call_id, idempotency_key(tool, arguments), tool, secrets.token_hex(8), False)
    assert store.begin(request).kind.value == "started"


def timeout_behaviour(args: dict[str, Any]) -> Any:
    raise TimeoutError("the response was lost")


@pytest.mark.parametrize("kind", KINDS)
def test_committed_call_replays_stored_value_without_running(store: EffectStore, kind: str) -> None:
    guard = EffectGuard(store=store)
    counted = Counted("charge")
    charge = make_tool(guard, counted, kind)
    first = call_with_id(charge, "call-1", "acct_1", 500)
    again = call_with_id(charge, "call-1", account="acct_1", cents=500)
    assert again == first
    assert len(counted.runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_replay_reports_effect_replayed(store: EffectStore, kind: str) -> None:
    guard = EffectGuard(store=store)
    call = GuardedCall("charge", "call-e", {"account": "a"}, Reversibility.IRREVERSIBLE)
    runs: list[str] = []

    def body() -> str:
        runs.append("sync")
        return "paid"

    async def abody() -> str:
        await asyncio.sleep(0)
        runs.append("async")
        return "paid"

    def run() -> Execution[str]:
        if kind == "sync":
            return guard.execute(call, body)
        return asyncio.run(guard.aexecute(call, abody))

    first = run()
    assert (first.effect, first.value, first.attempt) == ("executed", "paid", 1)
    replay = run()
    assert (replay.effect, replay.value, runs) == ("replayed", "paid", [kind])
    assert replay.tool_call_id == "call-e"
    assert replay.idempotency_key == idempotency_key("charge", {"account": "a"})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tag", ["irreversible", "costly", None])
def test_pending_call_of_a_tool_not_reversible_is_refused(store: EffectStore, kind: str, tag: Any) -> None:
    guard = EffectGuard(store=store)
    counted = Counted("charge")
    charge = make_tool(guard, counted, kind, tag)
    strand_pending(store, "call-p", "charge", {"account": "acct_1", "cents": 500})
    with pytest.raises(Exception) as refused:
        call_with_id(charge, "call-p", "acct_1", 500)
    assert getattr(refused.value, "reason", None) == "effect_status_unknown"
    assert "Do not retry" in str(refused.value)
    assert idempotency_key("charge", {"account": "acct_1", "cents": 500}) in str(refused.value)
    assert counted.runs == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "error",
    [TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError, EffectOutcomeUnknown],
)
def test_unknown_call_of_a_tool_not_reversible_is_refused(
    store: EffectStore, kind: str, error: type[Exception]
) -> None:
    guard = EffectGuard(store=store)

    def fail(args: dict[str, Any]) -> Any:
        raise error("lost")

    counted = Counted("charge", behaviour=fail)
    charge = make_tool(guard, counted, kind)
    with pytest.raises(error):
        call_with_id(charge, "call-u", "acct_1", 500)
    record = store.get("call-u")
    assert record is not None and record.status.value == "unknown"
    with pytest.raises(Exception) as refused:
        call_with_id(charge, "call-u", "acct_1", 500)
    assert getattr(refused.value, "reason", None) == "effect_status_unknown"
    assert len(counted.runs) == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("earlier", ["pending", "unknown"])
def test_reversible_tool_runs_again_after_pending_or_unknown(
    store: EffectStore, kind: str, earlier: str
) -> None:
    guard = EffectGuard(store=store)
    counted = Counted("read_balance")
    read_balance = make_tool(guard, counted, kind, "reversible")
    if earlier == "pending":
        strand_pending(store, "call-r", "read_balance", {"account": "acct_1", "cents": 0})
    else:
        counted.behaviour = timeout_behaviour
        with pytest.raises(TimeoutError):
            call_with_id(read_balance, "call-r", "acct_1")
        counted.behaviour = None
    result = call_with_id(read_balance, "call-r", "acct_1")
    assert result["account"] == "acct_1"
    record = store.get("call-r")
    assert record is not None and record.status.value == "committed"
    assert record.attempt == 2
    # committed now: a further replay returns the value without running
    runs = len(counted.runs)
    assert call_with_id(read_balance, "call-r", "acct_1") == result
    assert len(counted.runs) == runs


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("earlier", ["committed", "pending", "unknown"])
def test_other_arguments_under_the_same_id_are_a_policy_violation(
    store: EffectStore, kind: str, earlier: str
) -> None:
    guard = EffectGuard(store=store)
    counted = Counted("charge")
    charge = make_tool(guard, counted, kind)
    if earlier == "committed":
        call_with_id(charge, "call-m", "acct_1", 500)
    elif earlier == "pending":
        strand_pending(store, "call-m", "charge", {"account": "acct_1", "cents": 500})
    else:
        counted.behaviour = timeout_behaviour
        with pytest.raises(TimeoutError):
            call_with_id(charge, "call-m", "acct_1", 500)
        counted.behaviour = None
    runs = len(counted.runs)
    with pytest.raises(Exception) as refused:
        call_with_id(charge, "call-m", "acct_1", 501)
    assert getattr(refused.value, "reason", None) == "policy_violation"
    assert len(counted.runs) == runs


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tag", ["reversible", None])
def test_another_tool_under_the_same_id_is_a_policy_violation(
    store: EffectStore, kind: str, tag: Any
) -> None:
    guard = EffectGuard(store=store)
    charge_runs, refund_runs = Counted("charge"), Counted("refund")
    charge = make_tool(guard, charge_runs, kind)
    refund = make_tool(guard, refund_runs, kind, tag)
    call_with_id(charge, "call-t", "acct_1", 500)
    with pytest.raises(Exception) as refused:
        call_with_id(refund, "call-t", "acct_1", 500)
    assert getattr(refused.value, "reason", None) == "policy_violation"
    assert "'charge'" in str(refused.value)
    assert refund_runs.runs == []


def test_table_holds_for_a_guard_built_on_every_store(store: EffectStore) -> None:
    """All rows in one sequence, on one store, through the low-level execute()."""
    guard = EffectGuard(store=store)
    calls: list[str] = []

    def body() -> str:
        calls.append("ran")
        return "ok"

    with tool_call_context("seq"):
        call = GuardedCall("t", "seq", {"x": 1}, Reversibility.IRREVERSIBLE)
        assert guard.execute(call, body).value == "ok"
        assert guard.execute(call, body).effect == "replayed"
        other = GuardedCall("t", "seq", {"x": 2}, Reversibility.IRREVERSIBLE)
        with pytest.raises(Exception, match="policy_violation"):
            guard.execute(other, body)
    assert calls == ["ran"]
