"""The call machine decides every step of a guarded call without I/O (the tests here run no store):
each event it takes, the operation it returns, and every transition of its table. The executors
only carry the operations out. And every coroutine method of the guard, the stores and the replica
wait has a blocking twin with the same parameters."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from airlock_redis import EffectGuard, InMemoryEffectStore, RedisEffectStore, Reversibility
from airlock_redis.core.ambiguity import AmbiguityRule
from airlock_redis.core.call_machine import (
    TRANSITIONS,
    Ask,
    Begin,
    CallMachine,
    CallRules,
    Commit,
    Event,
    Finish,
    GiveBack,
    MachineError,
    Probe,
    Refuse,
    Reraise,
    Running,
    RunTool,
    Secure,
    State,
    Wait,
    Write,
)
from airlock_redis.core.codec import encode_result
from airlock_redis.core.errors import (
    CorruptRecordError,
    EffectInProgress,
    EffectOutcomeUnknown,
    EffectPolicyViolation,
    EffectStatusUnknown,
    RecordCorrupt,
    ResultNotStored,
    StoreError,
    StoreUnavailable,
    ToolCallIdRequired,
)
from airlock_redis.core.gates import GuardedCall, GuardOptions
from airlock_redis.core.outcome import DEFAULT_AMBIGUOUS_ERRORS, give_back, stream_items
from airlock_redis.core.probes import NeverTookEffect, TookEffect
from airlock_redis.core.records import BeginKind, BeginOutcome, Settlement
from airlock_redis.core.signing import Signer
from airlock_redis.stores.durability import ReplicaWait

NOBODY = Running(None, None, False)
STARTED = BeginOutcome(BeginKind.STARTED, 1)


def _rules(**options: Any) -> CallRules:
    signer = options.pop("signer", None)
    lease_ms, wait = options.pop("lease_ms", None), options.pop("wait_for_running", 0.0)
    return CallRules(
        GuardOptions(**options),
        AmbiguityRule.of(DEFAULT_AMBIGUOUS_ERRORS),
        1 << 20,
        signer,
        "",
        lease_ms,
        wait,
    )


RUNNING_ELSEWHERE = BeginOutcome(BeginKind.RUNNING, 1, lease_ms=60_000, since_renewal_ms=10)
WAITS = {"lease_ms": 60_000, "wait_for_running": 5.0}


def _call(
    tool_call_id: Any = "call_1", reversibility: Reversibility = Reversibility.IRREVERSIBLE
) -> GuardedCall:
    return GuardedCall("charge", tool_call_id, {"account": "a", "cents": 5}, reversibility, frozenset())


def _state(machine: CallMachine) -> State:
    return machine.state  # read through a call: mypy keeps no narrowing across the events


def _machine(rules: CallRules | None = None, **call: Any) -> CallMachine:
    return CallMachine(rules or _rules(), _call(**call), lambda: Any)


def _begun(rules: CallRules | None = None, **call: Any) -> tuple[CallMachine, Begin]:
    machine = _machine(rules, **call)
    op = machine.start(NOBODY)
    assert isinstance(op, Begin) and machine.state is State.BEGINNING
    return machine, op


def _running(rules: CallRules | None = None, **call: Any) -> CallMachine:
    machine, _ = _begun(rules, **call)
    assert isinstance(machine.begun(STARTED, durable=False), RunTool)
    assert machine.state is State.RUNNING
    return machine


def test_a_refusal_at_the_gates_is_the_first_operation() -> None:
    machine = _machine(tool_call_id=None)
    op = machine.start(NOBODY)
    assert isinstance(op, Refuse) and isinstance(op.refusal, ToolCallIdRequired)
    assert machine.state is State.DONE


def test_a_call_without_an_id_runs_bare_and_is_unguarded() -> None:
    machine = _machine(_rules(require_tool_call_id=False), tool_call_id=None)
    op = machine.start(NOBODY)
    assert isinstance(op, RunTool) and op.bare and machine.state is State.RUNNING_BARE
    done = machine.returned("v")
    assert isinstance(done, Finish) and done.execution.effect == "unguarded"
    assert _state(machine) is State.DONE


def test_a_call_inside_the_body_of_the_same_id_runs_bare_under_the_outer_key() -> None:
    machine = _machine(tool_call_id="call_1")
    op = machine.start(Running("k" * 64, "call_1", False))
    assert isinstance(op, RunTool) and op.bare and op.running.idempotency_key == "k" * 64
    done = machine.returned("v")
    assert isinstance(done, Finish)
    assert (done.execution.effect, done.execution.idempotency_key) == ("nested", "k" * 64)
    other = _machine(tool_call_id="call_2")
    assert isinstance(other.start(Running("k" * 64, "call_1", False)), Begin)


def test_an_irreversible_call_nested_in_a_reversible_body_of_its_id_is_refused() -> None:
    machine = _machine(tool_call_id="call_1")
    op = machine.start(Running("k" * 64, "call_1", True))
    assert isinstance(op, Refuse) and isinstance(op.refusal, EffectPolicyViolation)


def test_a_running_attempt_is_waited_for_then_decided_on_what_begin_finds_then() -> None:
    machine, begin = _begun(_rules(**WAITS))
    assert begin.request.lease_ms == 60_000
    op = machine.begun(RUNNING_ELSEWHERE, durable=False)
    assert op == Wait(begin.request, 5.0) and machine.state is State.WAITING
    # still running after 2 s: wait on, for what is left
    op = machine.woken(RUNNING_ELSEWHERE, 2.0)
    assert op == Wait(begin.request, 3.0) and _state(machine) is State.WAITING
    # it committed: replayed
    done = machine.woken(BeginOutcome(BeginKind.COMMITTED, 1, value=encode_result({"ok": 1})), 0.5)
    assert (
        isinstance(done, Finish) and done.execution.effect == "replayed" and done.execution.value == {"ok": 1}
    )
    assert _state(machine) is State.DONE


def test_a_wait_that_runs_out_is_refused_in_progress() -> None:
    machine, _ = _begun(_rules(**WAITS))
    machine.begun(RUNNING_ELSEWHERE, durable=False)
    op = machine.woken(RUNNING_ELSEWHERE, 5.0)
    assert isinstance(op, Refuse) and isinstance(op.refusal, EffectInProgress)
    assert "still running" in op.refusal.message and "resolve" not in op.refusal.fix_hint


def test_without_a_wait_a_running_attempt_is_refused_at_once() -> None:
    machine, _ = _begun(_rules(lease_ms=60_000))
    op = machine.begun(RUNNING_ELSEWHERE, durable=False)
    assert isinstance(op, Refuse) and isinstance(op.refusal, EffectInProgress)


def test_a_lease_rides_on_the_run_operation() -> None:
    machine, begin = _begun(_rules(lease_ms=1_500))
    op = machine.begun(STARTED, durable=False)
    assert isinstance(op, RunTool) and op.lease == begin.request
    plain, _ = _begun()
    op = plain.begun(STARTED, durable=False)
    assert isinstance(op, RunTool) and op.lease is None


def test_a_finder_asks_the_probe_and_writes_what_it_said() -> None:
    found = BeginOutcome(BeginKind.PROBE, 2, found="abandoned")
    # took effect: committed with the probe's value, which the caller gets
    machine, begin = _probing()
    op = machine.begun(found, durable=False)
    assert isinstance(op, Probe) and op.call.found == "abandoned" and op.call.attempt == 2
    assert op.call.idempotency_key == begin.request.idempotency_key and op.call.arguments["cents"] == 5
    write = machine.probed(TookEffect({"charged": 5}))
    assert isinstance(write, Write) and isinstance(write.step, Commit) and write.attempt == 2
    done = machine.written()
    assert isinstance(done, Finish) and done.execution.effect == "reconciled"
    assert done.execution.value == {"charged": 5}
    # never took effect: begun again (fenced on this attempt's token), then the tool runs
    machine, begin = _probing()
    machine.begun(found, durable=False)
    assert machine.probed(NeverTookEffect()) == begin and machine.state is State.BEGINNING
    assert isinstance(machine.begun(BeginOutcome(BeginKind.STARTED, 2), durable=False), RunTool)
    # can't tell: back to unknown, refused
    machine, _ = _probing()
    machine.begun(found, durable=False)
    write = machine.probed(None)
    assert isinstance(write, Write) and write.step is Settlement.UNKNOWN
    refused = machine.written()
    assert isinstance(refused, Refuse) and isinstance(refused.refusal, EffectStatusUnknown)
    assert "could not tell" in refused.refusal.message


def test_the_attempt_asks_the_probe_after_an_error_that_leaves_it_in_doubt() -> None:
    error = TimeoutError("the bank did not answer")
    for answer, step, after in (
        (TookEffect("done"), Commit, Finish),
        (NeverTookEffect(), Settlement.RELEASE, Reraise),
        (None, Settlement.UNKNOWN, Reraise),
    ):
        machine, _ = _probing()
        machine.begun(STARTED, durable=False)
        op = machine.raised(error)
        assert isinstance(op, Probe) and op.call.found == "error" and machine.state is State.PROBING
        write = machine.probed(answer)
        assert isinstance(write, Write)
        assert write.step is step if isinstance(step, Settlement) else isinstance(write.step, step)
        assert isinstance(machine.written(), after)
    # a plain error is released without asking; a cancellation is in doubt without asking
    for plain in (ValueError("declined"), asyncio.CancelledError()):
        machine, _ = _probing()
        machine.begun(STARTED, durable=False)
        assert isinstance(machine.raised(plain), Write)


def test_a_bare_call_that_raises_reraises_without_a_write() -> None:
    machine = _machine(_rules(require_tool_call_id=False), tool_call_id=None)
    machine.start(NOBODY)
    error = ValueError("x")
    assert machine.raised(error) == Reraise(error)


def test_each_begin_has_a_fresh_owner_token() -> None:
    (_, first), (_, second) = _begun(), _begun()
    a, b = first.request, second.request
    assert a.token != b.token and len(a.token) == 32
    assert (a.tool_call_id, a.idempotency_key, a.reversible) == (b.tool_call_id, b.idempotency_key, False)


def test_approval_is_asked_before_anything_is_recorded() -> None:
    machine = _machine(_rules(require_approval_for_irreversible=True))
    op = machine.start(NOBODY)
    assert isinstance(op, Ask) and machine.request is None and machine.state is State.ASKING
    assert isinstance(machine.approved(NOBODY), Begin)
    denied = _machine(_rules(require_approval_for_irreversible=True))
    denied.start(NOBODY)
    refusal = EffectPolicyViolation("no", tool="charge", tool_call_id="call_1")
    assert denied.denied(refusal) == Refuse(refusal)


@pytest.mark.parametrize(
    ("outcome", "refusal"),
    [
        (BeginOutcome(BeginKind.PENDING, 1), EffectStatusUnknown),
        (BeginOutcome(BeginKind.UNKNOWN, 2), EffectStatusUnknown),
        (BeginOutcome(BeginKind.MISMATCH, 1, tool="other", idempotency_key="x"), EffectPolicyViolation),
        (BeginOutcome(BeginKind.COMMITTED, 1, None), ResultNotStored),
        (BeginOutcome(BeginKind.COMMITTED, 1, b"\xc1not msgpack"), RecordCorrupt),
    ],
)
def test_what_begin_found_decides_the_refusal(outcome: BeginOutcome, refusal: type[Exception]) -> None:
    machine, _ = _begun()
    op = machine.begun(outcome, durable=False)
    assert isinstance(op, Refuse) and isinstance(op.refusal, refusal)
    assert machine.state is State.DONE


def test_started_runs_and_committed_replays() -> None:
    machine = _running()
    assert machine.attempt == 1
    replaying, _ = _begun()
    op = replaying.begun(BeginOutcome(BeginKind.COMMITTED, 3, encode_result({"ok": 1}, 100)), durable=False)
    assert isinstance(op, Finish)
    assert (op.execution.value, op.execution.effect, op.execution.attempt) == ({"ok": 1}, "replayed", 3)


def test_a_durable_store_secures_the_record_before_the_tool_runs() -> None:
    machine, begin = _begun()
    assert machine.begun(STARTED, durable=True) == Secure(begin.request)
    assert isinstance(machine.secured(), RunTool) and machine.state is State.RUNNING


def test_a_record_that_did_not_reach_the_replicas_is_given_back_then_refused() -> None:
    machine, begin = _begun()
    machine.begun(STARTED, durable=True)
    op = machine.secure_failed(StoreError("WAIT: 0 of 1"))
    assert op == Write(begin.request, 1, Settlement.RELEASE) and machine.state is State.ENDING
    end = machine.written()
    assert isinstance(end, Refuse) and isinstance(end.refusal, StoreUnavailable)


def test_a_replay_whose_signature_does_not_verify_is_refused() -> None:
    signer = Signer(b"k" * 32)
    machine, begin = _begun(_rules(signer=signer))
    data = encode_result("v", 100)
    good = signer.sign(begin.request.tool_call_id, begin.request.idempotency_key, data)
    bad = machine.begun(BeginOutcome(BeginKind.COMMITTED, 1, data, b"\x00" * len(good)), durable=False)
    assert isinstance(bad, Refuse) and isinstance(bad.refusal, RecordCorrupt)
    machine, _ = _begun(_rules(signer=signer))
    replay = machine.begun(BeginOutcome(BeginKind.COMMITTED, 1, data, good), durable=False)
    assert isinstance(replay, Finish) and replay.execution.value == "v"


def test_a_failed_begin_gives_back_only_what_may_have_landed() -> None:
    machine, begin = _begun()
    op = machine.begin_failed(StoreError("lost reply", maybe_applied=True))
    assert op == GiveBack(begin.request) and machine.state is State.GIVING_BACK
    end = machine.given_back()
    assert isinstance(end, Refuse) and isinstance(end.refusal, StoreUnavailable)
    machine, _ = _begun()
    op = machine.begin_failed(StoreError("refused", maybe_applied=False))
    assert isinstance(op, Refuse) and isinstance(op.refusal, StoreUnavailable)
    machine, _ = _begun()
    op = machine.begin_failed(CorruptRecordError("bad bytes"))
    assert isinstance(op, Refuse) and isinstance(op.refusal, RecordCorrupt)


def test_an_interrupted_begin_is_given_back_then_the_interruption_goes_on() -> None:
    machine, begin = _begun()
    interruption = KeyboardInterrupt()
    assert machine.begin_interrupted(interruption) == GiveBack(begin.request)
    assert machine.given_back() == Reraise(interruption)


@pytest.mark.parametrize(
    ("value", "step"),
    [
        ({"charged": 5}, Commit(encode_result({"charged": 5}, 100), None)),
        (iter([1]), Settlement.UNKNOWN),  # deferred: takes effect later
    ],
)
def test_what_the_machine_writes_after_the_tool_returned(value: Any, step: Any) -> None:
    machine = _running()
    op = machine.returned(value)
    assert isinstance(op, Write) and op.step == step and op.attempt == 1
    end = machine.written()
    assert isinstance(end, Finish) and end.execution.effect == "executed" and end.execution.value is value


def test_a_result_that_cannot_be_stored_is_committed_without_it_and_says_why() -> None:
    op = _running().returned(object())
    assert isinstance(op, Write) and isinstance(op.step, Commit)
    assert (op.step.data, op.step.mac) == (None, None) and op.step.not_stored


@pytest.mark.parametrize(
    ("error", "settlement"),
    [
        (ValueError("bad input"), Settlement.RELEASE),
        (EffectOutcomeUnknown(), Settlement.UNKNOWN),
        (TimeoutError(), Settlement.UNKNOWN),
        (KeyboardInterrupt(), Settlement.UNKNOWN),
    ],
)
def test_what_the_machine_writes_after_the_tool_raised(error: BaseException, settlement: Settlement) -> None:
    machine = _running()
    assert machine.raised(error).step is settlement  # type: ignore[union-attr]
    assert machine.written() == Reraise(error)


def test_giving_back_releases_a_first_attempt_and_keeps_the_doubt_of_a_take_over() -> None:
    assert give_back(1) is Settlement.RELEASE
    assert give_back(2) is Settlement.UNKNOWN


def test_a_replayed_stream_yields_the_stored_items() -> None:
    assert stream_items([1, 2]) == [1, 2]
    assert stream_items("one") == ["one"]


# -- the transition table ------------------------------------------------------------------------
def test_an_event_the_state_does_not_take_is_a_machine_error() -> None:
    machine = _running()
    with pytest.raises(MachineError):
        machine.given_back()
    with pytest.raises(MachineError):
        machine.begun(STARTED, durable=False)
    done, _ = _begun()
    done.begun(BeginOutcome(BeginKind.PENDING, 1), durable=False)
    with pytest.raises(MachineError):
        done.returned("v")


def _walk_every_path() -> set[tuple[State, Event, State]]:  # noqa: PLR0915 - one walk, step by step
    """Drive machines through every path the tests above take, recording each transition."""
    seen: set[tuple[State, Event, State]] = set()

    # each transition is read from the state before and after its event
    def step(machine: CallMachine, event: Event, fn: Any, *args: Any) -> Any:
        before = machine.state
        out = fn(*args)
        seen.add((before, event, machine.state))
        return out

    plain = _machine()
    step(plain, Event.START, plain.start, NOBODY)
    bare = _machine(_rules(require_tool_call_id=False), tool_call_id=None)
    step(bare, Event.START, bare.start, NOBODY)
    step(bare, Event.RETURNED, bare.returned, 1)
    bare = _machine(_rules(require_tool_call_id=False), tool_call_id=None)
    step(bare, Event.START, bare.start, NOBODY)
    step(bare, Event.RAISED, bare.raised, ValueError())
    refused = _machine(tool_call_id=None)
    step(refused, Event.START, refused.start, NOBODY)
    for approve in (True, False):
        asked = _machine(_rules(require_approval_for_irreversible=True))
        step(asked, Event.START, asked.start, NOBODY)
        if approve:
            step(asked, Event.APPROVED, asked.approved, NOBODY)
        else:
            step(asked, Event.DENIED, asked.denied, EffectPolicyViolation("no", tool="t", tool_call_id=None))
    asked_bare = _machine(_rules(require_approval_for_irreversible=True))
    step(asked_bare, Event.START, asked_bare.start, NOBODY)
    step(asked_bare, Event.APPROVED, asked_bare.approved, Running("k", "call_1", False))
    asked_no = _machine(_rules(require_approval_for_irreversible=True))
    step(asked_no, Event.START, asked_no.start, NOBODY)
    step(asked_no, Event.APPROVED, asked_no.approved, Running("k", "call_1", True))
    for durable in (False, True):
        m, _ = _begun()
        step(m, Event.BEGUN, m.begun, STARTED, durable)
        if durable:
            step(m, Event.SECURED, m.secured)
        step(m, Event.RETURNED, m.returned, 1)
        step(m, Event.WRITTEN, m.written)
    m, _ = _begun()
    step(m, Event.BEGUN, m.begun, STARTED, False)
    step(m, Event.RAISED, m.raised, ValueError())
    m, _ = _begun()
    step(m, Event.BEGUN, m.begun, BeginOutcome(BeginKind.PENDING, 1), False)
    m, _ = _begun()
    step(m, Event.BEGUN, m.begun, STARTED, True)
    step(m, Event.SECURE_FAILED, m.secure_failed, StoreError("x"))
    for applied in (True, False):
        m, _ = _begun()
        step(m, Event.BEGIN_FAILED, m.begin_failed, StoreError("x", maybe_applied=applied))
        if applied:
            step(m, Event.GIVEN_BACK, m.given_back)
    m, _ = _begun()
    step(m, Event.BEGIN_INTERRUPTED, m.begin_interrupted, KeyboardInterrupt())
    _walk_the_waits(step)
    _walk_the_probes(step)
    from .test_dedupe_machine import walk_the_dedupe  # it imports this module: imported here

    walk_the_dedupe(step)
    return seen


def _probing(rules: CallRules | None = None) -> tuple[CallMachine, Begin]:
    machine = CallMachine(rules or _rules(), _call()._replace(probe=lambda call: None), lambda: Any)
    op = machine.start(NOBODY)
    assert isinstance(op, Begin) and op.request.probes
    return machine, op


def _walk_the_probes(step: Any) -> None:
    found = BeginOutcome(BeginKind.PROBE, 2, found="unknown")
    for answer in (TookEffect({"ok": 1}), NeverTookEffect(), None):
        for durable in (False, True):
            m, _ = _probing()
            step(m, Event.BEGUN, m.begun, found, durable)
            step(m, Event.PROBED, m.probed, answer)
        m, _ = _probing()
        step(m, Event.BEGUN, m.begun, STARTED, False)
        step(m, Event.RAISED, m.raised, TimeoutError())
        step(m, Event.PROBED, m.probed, answer)
    m, _ = _probing(_rules(**WAITS))
    step(m, Event.BEGUN, m.begun, RUNNING_ELSEWHERE, False)
    step(m, Event.WOKEN, m.woken, found, 1.0)


def _walk_the_waits(step: Any) -> None:
    # waiting for a running attempt: woken into each end, or failed while waiting
    for durable, after in ((False, STARTED), (True, STARTED), (False, RUNNING_ELSEWHERE)):
        m, _ = _begun(_rules(**WAITS))
        step(m, Event.BEGUN, m.begun, RUNNING_ELSEWHERE, durable)
        step(m, Event.WOKEN, m.woken, RUNNING_ELSEWHERE, 1.0)
        step(m, Event.WOKEN, m.woken, after, 10.0)
    for applied in (True, False):
        m, _ = _begun(_rules(**WAITS))
        step(m, Event.BEGUN, m.begun, RUNNING_ELSEWHERE, False)
        step(m, Event.BEGIN_FAILED, m.begin_failed, StoreError("x", maybe_applied=applied))
    m, _ = _begun(_rules(**WAITS))
    step(m, Event.BEGUN, m.begun, RUNNING_ELSEWHERE, False)
    step(m, Event.BEGIN_INTERRUPTED, m.begin_interrupted, KeyboardInterrupt())


def test_every_transition_of_the_table_is_taken_and_no_other() -> None:
    seen = _walk_every_path()
    table = {(state, event, to) for (state, event), targets in TRANSITIONS.items() for to in targets}
    assert seen <= table, f"taken but not in the table: {seen - table}"
    assert table <= seen, f"in the table but never taken: {table - seen}"


# -- parity: every coroutine method has a blocking twin with the same parameters -----------------
def _public_coroutines(cls: type) -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(cls)
        if inspect.iscoroutinefunction(member) and name.startswith("a") and not name.startswith("__")
    ]


@pytest.mark.parametrize("cls", [EffectGuard, RedisEffectStore, InMemoryEffectStore, ReplicaWait])
def test_every_coroutine_method_has_a_blocking_twin_with_the_same_parameters(cls: type) -> None:
    names = _public_coroutines(cls)
    assert names, f"{cls.__name__} has no coroutine methods"
    for name in names:
        twin = getattr(cls, name[1:], None)
        assert twin is not None, f"{cls.__name__}.{name} has no blocking twin {name[1:]}"
        ours = inspect.signature(getattr(cls, name)).parameters
        theirs = inspect.signature(twin).parameters
        assert list(ours) == list(theirs), f"{cls.__name__}.{name} and {name[1:]} take different parameters"
        for param in ours:
            assert ours[param].kind == theirs[param].kind
            assert ours[param].default == theirs[param].default


def test_call_and_acall_replay_the_same_record_through_their_executors() -> None:
    """Both executors carry out the same machine: a value recorded through one replays through the
    other, and an in-doubt record is refused by both."""
    guard = EffectGuard(InMemoryEffectStore())

    def charge(cents: int) -> int:
        return cents

    async def acharge(cents: int) -> int:
        return cents + 1000

    acharge.__name__ = "charge"
    assert guard.call("call_p", charge, 5) == 5
    assert asyncio.run(guard.acall("call_p", acharge, 5)) == 5  # replayed: the async body never ran
    assert asyncio.run(guard.acall("call_q", acharge, 6)) == 1006
    assert guard.call("call_q", charge, 6) == 1006  # replayed through the blocking executor

    def boom(cents: int) -> int:
        raise TimeoutError

    async def aboom(cents: int) -> int:
        raise TimeoutError

    boom.__name__ = aboom.__name__ = "charge"
    with pytest.raises(TimeoutError):
        guard.call("call_r", boom, 7)
    with pytest.raises(EffectStatusUnknown):
        asyncio.run(guard.acall("call_r", aboom, 7))
