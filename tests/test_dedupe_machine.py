"""The call machine's dedupe steps (issue 25, part 5), without I/O: a started attempt claims its
idempotency key's index entry before the tool runs; held by another id, it reads that id's record
and claims the entry from it (stale), waits for it (running), replays its value (committed, under
"always" or after a wait) or gives its own record back and is refused; after the record's last
write, the entry it claimed ends as the record did. Every new transition is walked here
(:func:`walk_the_dedupe`, which tests/test_call_machine.py's table test takes too)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from airlock_redis.core.call_machine import (
    DEDUPE_ROUNDS,
    Begin,
    CallMachine,
    CallRules,
    Claim,
    Commit,
    Event,
    Finish,
    ReadHolder,
    Refuse,
    Reraise,
    RunTool,
    Secure,
    State,
    Unclaim,
    Wait,
    WaitHolder,
    Write,
)
from airlock_redis.core.codec import encode_result
from airlock_redis.core.errors import (
    EffectInProgress,
    EffectStatusUnknown,
    RecordCorrupt,
    ResultNotStored,
    StoreError,
    StoreUnavailable,
)
from airlock_redis.core.gates import Dedupe
from airlock_redis.core.outcome import give_back
from airlock_redis.core.records import Holder, Record, Settlement, Status
from airlock_redis.core.reversibility import Reversibility
from airlock_redis.core.signing import Signer

from .test_call_machine import NOBODY, RUNNING_ELSEWHERE, STARTED, WAITS, _call, _rules, _state

WAITING = _rules(**WAITS)

X = Holder("call_x", "tx", b"a,6,2;call_xtx")


def _machine(
    dedupe: Dedupe | None = "in_doubt",
    reversibility: Reversibility = Reversibility.IRREVERSIBLE,
    rules: CallRules | None = None,
) -> CallMachine:
    call = _call(reversibility=reversibility)._replace(dedupe=dedupe)
    return CallMachine(rules or _rules(), call, lambda: Any)


def _claiming(dedupe: Dedupe | None = "in_doubt", **kwargs: Any) -> tuple[CallMachine, Claim]:
    machine = _machine(dedupe, **kwargs)
    assert isinstance(machine.start(NOBODY), Begin)
    op = machine.begun(STARTED, durable=False)
    assert isinstance(op, Claim) and op.expected is None and machine.state is State.CLAIMING
    return machine, op


def _checking(dedupe: Dedupe | None = "in_doubt", **kwargs: Any) -> CallMachine:
    machine, _ = _claiming(dedupe, **kwargs)
    op = machine.held(X)
    assert op == ReadHolder(X) and machine.state is State.CHECKING
    return machine


def _record(machine: CallMachine, status: Status, **fields: Any) -> Record:
    assert machine.request is not None
    values: dict[str, Any] = {
        "tool_call_id": X.tool_call_id,
        "status": status,
        "idempotency_key": machine.request.idempotency_key,
        "tool": "charge",
        "owner": X.token,
        "attempt": 1,
        "value": None,
        "stored": False,
        "mac": None,
        "begun_ms": 1,
        "committed_ms": None,
        "ttl_ms": 1000,
    }
    values.update(fields)
    return Record(**values)


def _running(machine: CallMachine) -> Record:
    return _record(machine, Status.PENDING, lease_ms=60_000, since_renewal_ms=10)


def _abandoned(machine: CallMachine) -> Record:
    return _record(machine, Status.PENDING, lease_ms=1_000, since_renewal_ms=5_000)


def _committed(machine: CallMachine, value: Any = None) -> Record:
    data = encode_result({"ok": 1} if value is None else value, 1 << 20)
    return _record(machine, Status.COMMITTED, value=data, stored=True)


def _gives_back(machine: CallMachine, op: Any) -> None:
    """The tool will not run: the attempt's own record is given back (never an index entry)."""
    assert isinstance(op, Write) and op.step == give_back(machine.attempt) and machine.state is State.ENDING


# -- without dedupe: nothing changes -----------------------------------------------------------
def test_without_dedupe_a_started_attempt_runs_at_once() -> None:
    machine = _machine(None)
    machine.start(NOBODY)
    assert isinstance(machine.begun(STARTED, durable=False), RunTool)
    op = machine.returned(1)
    assert isinstance(op, Write)
    assert isinstance(machine.written(), Finish)  # no Unclaim


# -- claiming -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dedupe", ["in_doubt", "always"])
def test_claimed_runs_and_the_entry_ends_as_the_record(dedupe: Dedupe) -> None:
    machine, _ = _claiming(dedupe)
    assert isinstance(machine.claimed(), RunTool) and machine.state is State.RUNNING
    assert isinstance(machine.returned({"ok": 1}), Write)
    op = machine.written()
    assert isinstance(op, Unclaim) and _state(machine) is State.UNCLAIMING
    # committed: "always" keeps the entry as long as the record; "in_doubt" frees the key at once
    assert op.keep is (Status.COMMITTED if dedupe == "always" else None)
    done = machine.unclaimed()
    assert isinstance(done, Finish) and done.execution.effect == "executed"


def test_an_error_in_doubt_keeps_the_entry_as_long_as_the_unknown_record() -> None:
    machine, _ = _claiming()
    machine.claimed()
    op = machine.raised(TimeoutError())
    assert isinstance(op, Write) and op.step is Settlement.UNKNOWN
    unclaim = machine.written()
    assert isinstance(unclaim, Unclaim) and unclaim.keep is Status.UNKNOWN
    assert isinstance(machine.unclaimed(), Reraise)


def test_a_released_call_deletes_its_entry() -> None:
    machine, _ = _claiming()
    machine.claimed()
    op = machine.raised(ValueError("no effect"))
    assert isinstance(op, Write) and op.step is Settlement.RELEASE
    unclaim = machine.written()
    assert isinstance(unclaim, Unclaim) and unclaim.keep is None


def test_wait_replicas_secures_the_record_then_claims() -> None:
    machine = _machine()
    machine.start(NOBODY)
    assert isinstance(machine.begun(STARTED, durable=True), Secure)
    assert isinstance(machine.secured(), Claim) and machine.state is State.CLAIMING


def test_after_waiting_for_its_own_id_a_started_attempt_claims() -> None:
    machine = _machine(rules=WAITING)
    machine.start(NOBODY)
    assert isinstance(machine.begun(RUNNING_ELSEWHERE, durable=False), Wait)
    assert isinstance(machine.woken(STARTED, 0.5), Claim)


@pytest.mark.parametrize("applied", [True, False])
def test_a_failed_claim_gives_the_record_back_and_refuses(applied: bool) -> None:
    machine, _ = _claiming()
    _gives_back(machine, machine.claim_failed(StoreError("down", maybe_applied=applied)))
    after = machine.written()
    if applied:  # the claim may have landed: its entry (fenced on this attempt) is ended too
        assert isinstance(after, Unclaim) and after.keep is None
        after = machine.unclaimed()
    assert isinstance(after, Refuse) and isinstance(after.refusal, StoreUnavailable)


def test_interrupted_while_claiming_gives_back_both_and_reraises() -> None:
    machine, _ = _claiming()
    _gives_back(machine, machine.interrupted(KeyboardInterrupt()))
    assert isinstance(machine.written(), Unclaim)
    assert isinstance(machine.unclaimed(), Reraise)


# -- the holder's record decides -----------------------------------------------------------------
@pytest.mark.parametrize("why", ["gone", "other key"])
def test_a_stale_entry_is_claimed_from_its_holder(why: str) -> None:
    machine = _checking()
    record = None if why == "gone" else _record(machine, Status.PENDING, idempotency_key="other")
    op = machine.holder_seen(record)
    assert op == Claim(machine.request, X) and machine.state is State.CLAIMING  # type: ignore[arg-type]
    assert isinstance(machine.claimed(), RunTool)


def test_an_entry_that_keeps_changing_is_given_up_after_some_rounds() -> None:
    machine = _checking()
    for _ in range(DEDUPE_ROUNDS):
        assert isinstance(machine.holder_seen(None), Claim)
        machine.held(X)
    _gives_back(machine, machine.holder_seen(None))
    out = machine.written()
    assert isinstance(out, Refuse) and isinstance(out.refusal, StoreUnavailable)


def test_in_doubt_mode_a_committed_holder_is_a_new_call() -> None:
    machine = _checking("in_doubt")
    assert isinstance(machine.holder_seen(_committed(machine)), Claim)


def test_always_mode_a_committed_holder_is_replayed_into_this_record() -> None:
    machine = _checking("always")
    holder = _committed(machine, {"ok": 7})
    op = machine.holder_seen(holder)
    assert isinstance(op, Write) and op.step == Commit(holder.value, None)
    done = machine.written()  # this attempt never claimed: no Unclaim
    assert isinstance(done, Finish) and done.execution.effect == "replayed"
    assert done.execution.value == {"ok": 7} and done.execution.tool_call_id == "call_1"


def test_always_mode_a_holder_without_a_stored_value_is_result_not_stored() -> None:
    machine = _checking("always")
    op = machine.holder_seen(_record(machine, Status.COMMITTED, value=None, stored=False))
    assert isinstance(op, Write) and isinstance(op.step, Commit) and op.step.data is None
    out = machine.written()
    assert isinstance(out, Refuse) and isinstance(out.refusal, ResultNotStored)


def test_a_replayed_value_is_verified_and_signed_again_for_this_id() -> None:
    signer = Signer(b"k" * 32)
    machine = _checking("always", rules=_rules(signer=signer))
    assert machine.request is not None
    holder = _committed(machine)
    assert holder.value is not None
    forged = machine.holder_seen(holder)  # no MAC: refused as corrupt, record given back
    _gives_back(machine, forged)
    out = machine.written()
    assert isinstance(out, Refuse) and isinstance(out.refusal, RecordCorrupt)
    machine = _checking("always", rules=_rules(signer=signer))
    assert machine.request is not None
    key = machine.request.idempotency_key
    signed = dataclasses.replace(holder, mac=signer.sign(X.tool_call_id, key, holder.value))
    op = machine.holder_seen(signed)
    assert isinstance(op, Write) and isinstance(op.step, Commit)
    assert op.step.mac == signer.sign("call_1", key, holder.value)


def test_a_running_holder_is_waited_for_then_its_value_replayed_even_in_doubt_mode() -> None:
    machine = _checking("in_doubt", rules=WAITING)
    op = machine.holder_seen(_running(machine))
    assert op == WaitHolder(X, 5.0) and machine.state is State.WAITING
    assert machine.holder_ended(1.0) == ReadHolder(X) and _state(machine) is State.CHECKING
    again = machine.holder_seen(_running(machine))
    assert isinstance(again, WaitHolder) and again.seconds == pytest.approx(4.0)
    machine.holder_ended(1.0)
    replay = machine.holder_seen(_committed(machine))  # it committed while this call waited
    assert isinstance(replay, Write) and isinstance(replay.step, Commit)
    done = machine.written()
    assert isinstance(done, Finish) and done.execution.effect == "replayed"


def test_a_holder_still_running_after_the_wait_is_in_progress() -> None:
    machine = _checking(rules=WAITING)
    machine.holder_seen(_running(machine))
    machine.holder_ended(5.0)
    _gives_back(machine, machine.holder_seen(_running(machine)))
    out = machine.written()
    assert isinstance(out, Refuse) and isinstance(out.refusal, EffectInProgress)
    assert "call_x" in str(out.refusal)


def test_without_wait_a_running_holder_is_in_progress_at_once() -> None:
    machine = _checking()
    _gives_back(machine, machine.holder_seen(_running(machine)))
    out = machine.written()
    assert isinstance(out, Refuse) and isinstance(out.refusal, EffectInProgress)


@pytest.mark.parametrize("found", ["unknown", "abandoned", "pending without a lease"])
def test_a_holder_in_doubt_refuses_a_tool_that_may_not_run_again(found: str) -> None:
    machine = _checking()
    if found == "unknown":
        record = _record(machine, Status.UNKNOWN)
    elif found == "abandoned":
        record = _abandoned(machine)
    else:
        record = _record(machine, Status.PENDING)
    _gives_back(machine, machine.holder_seen(record))
    out = machine.written()
    assert isinstance(out, Refuse) and isinstance(out.refusal, EffectStatusUnknown)
    assert "call_x" in str(out.refusal) and "call_x" in out.refusal.fix_hint


@pytest.mark.parametrize("status", [Status.UNKNOWN, Status.PENDING])
def test_a_holder_in_doubt_lets_a_reversible_tool_claim_and_run(status: Status) -> None:
    machine = _checking(reversibility=Reversibility.REVERSIBLE)
    record = _record(machine, status) if status is Status.UNKNOWN else _abandoned(machine)
    assert isinstance(machine.holder_seen(record), Claim)
    assert isinstance(machine.claimed(), RunTool)


def test_a_failed_read_or_wait_gives_the_record_back() -> None:
    machine = _checking()
    _gives_back(machine, machine.check_failed(StoreError("down")))
    assert isinstance(machine.written(), Refuse)
    machine = _checking(rules=WAITING)
    machine.holder_seen(_running(machine))
    _gives_back(machine, machine.check_failed(StoreError("down")))
    machine = _checking(rules=WAITING)
    machine.holder_seen(_running(machine))
    _gives_back(machine, machine.interrupted(KeyboardInterrupt()))
    assert isinstance(machine.written(), Reraise)  # nothing claimed: no Unclaim
    machine = _checking()
    _gives_back(machine, machine.interrupted(KeyboardInterrupt()))


def test_a_holder_record_that_cannot_be_read_is_named_in_the_refusal() -> None:
    from airlock_redis.core.errors import CorruptRecordError

    machine = _checking()
    _gives_back(machine, machine.check_failed(CorruptRecordError("the record's header does not parse")))
    out = machine.written()
    assert isinstance(out, Refuse) and isinstance(out.refusal, RecordCorrupt)
    assert "'call_x'" in str(out.refusal)


# -- every new transition -------------------------------------------------------------------------
Step = Callable[..., Any]


def walk_the_dedupe(step: Step) -> None:
    """Drive machines through every dedupe transition (``step(machine, event, fn, *args)``)."""
    m = _machine()
    m.start(NOBODY)
    step(m, Event.BEGUN, m.begun, STARTED, False)
    step(m, Event.CLAIMED, m.claimed)
    m.returned(1)
    step(m, Event.WRITTEN, m.written)
    step(m, Event.UNCLAIMED, m.unclaimed)
    m = _machine()
    m.start(NOBODY)
    m.begun(STARTED, True)
    step(m, Event.SECURED, m.secured)
    m = _machine(rules=WAITING)
    m.start(NOBODY)
    m.begun(RUNNING_ELSEWHERE, False)
    step(m, Event.WOKEN, m.woken, STARTED, 0.5)
    m, _ = _claiming()
    step(m, Event.CLAIM_FAILED, m.claim_failed, StoreError("x"))
    m, _ = _claiming()
    step(m, Event.INTERRUPTED, m.interrupted, KeyboardInterrupt())
    m, _ = _claiming()
    step(m, Event.HELD, m.held, X)
    step(m, Event.HOLDER_SEEN, m.holder_seen, None)  # stale: claiming again
    m = _checking()
    step(m, Event.HOLDER_SEEN, m.holder_seen, _record(m, Status.UNKNOWN))  # refused: ending
    m = _checking()
    step(m, Event.CHECK_FAILED, m.check_failed, StoreError("x"))
    m = _checking()
    step(m, Event.INTERRUPTED, m.interrupted, KeyboardInterrupt())
    m = _checking(rules=WAITING)
    step(m, Event.HOLDER_SEEN, m.holder_seen, _running(m))  # waiting
    step(m, Event.HOLDER_ENDED, m.holder_ended, 1.0)
    m = _checking(rules=WAITING)
    m.holder_seen(_running(m))
    step(m, Event.CHECK_FAILED, m.check_failed, StoreError("x"))
    m = _checking(rules=WAITING)
    m.holder_seen(_running(m))
    step(m, Event.INTERRUPTED, m.interrupted, KeyboardInterrupt())


def test_every_dedupe_transition_is_in_the_table() -> None:
    from airlock_redis.core.call_machine import TRANSITIONS

    table = {(state, event, to) for (state, event), targets in TRANSITIONS.items() for to in targets}
    seen: set[tuple[State, Event, State]] = set()

    def step(machine: CallMachine, event: Event, fn: Any, *args: Any) -> Any:
        before = machine.state
        out = fn(*args)
        seen.add((before, event, machine.state))
        return out

    walk_the_dedupe(step)
    assert seen <= table
    new_states = {State.CLAIMING, State.CHECKING, State.UNCLAIMING}
    new_rows = {row for row in table if row[0] in new_states or row[2] in new_states}
    new_rows |= {
        row for row in table if row[1] in {Event.HOLDER_ENDED, Event.CHECK_FAILED, Event.INTERRUPTED}
    }
    assert new_rows <= seen, f"never walked: {new_rows - seen}"


def test_an_event_out_of_turn_is_a_machine_error() -> None:
    from airlock_redis.core.call_machine import MachineError

    machine, _ = _claiming()
    with pytest.raises(MachineError):
        machine.holder_ended(1.0)
    with pytest.raises(MachineError):
        machine.unclaimed()
