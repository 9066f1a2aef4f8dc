"""One guarded call as an explicit state machine. Pure: no I/O, no logging, no context reads.

The machine takes events (what the approver, the store and the tool answered) and returns the next
operation as data. An executor (``airlock_redis.executors``: one blocking, one asyncio) carries the
operation out and feeds the answer back; a reporter turns the operations into logs, metrics and
events, in one place. The states and the events each one takes::

    READY --start--> ASKING --approved--> ...           (approval needed)
    READY --start--> BEGINNING | RUNNING_BARE | DONE     (begin, run without a record, refuse)
    BEGINNING --begun--> RUNNING | SECURING | WAITING | DONE  (run, wait for replicas, wait for a
                                                         running attempt, replay or refuse)
    WAITING --woken--> WAITING | RUNNING | SECURING | DONE (begun again once it ended, or the wait ran out)
    WAITING --begin_failed | begin_interrupted-->        (as from BEGINNING)
    BEGINNING | WAITING --begun | woken--> PROBING       (in doubt, and the tool has a probe: ask it)
    RUNNING --raised--> PROBING                          (an error that leaves it in doubt: ask first)
    PROBING --probed--> BEGINNING | ENDING               (it never took effect: begin again, fenced on this
                                                         attempt's token, then run; else write what it said)
    BEGINNING --begin_failed--> GIVING_BACK | DONE       (give back what may have landed, refuse)
    BEGINNING --begin_interrupted--> GIVING_BACK         (then re-raise the interruption)
    SECURING --secured--> RUNNING
    SECURING --secure_failed--> ENDING                   (give the record back, then refuse)
    RUNNING --returned | raised--> ENDING                (commit or settle)
    RUNNING_BARE --returned | raised--> DONE
    ENDING --written--> DONE                             (return, re-raise or refuse)
    GIVING_BACK --given_back--> DONE                     (refuse or re-raise)

  With ``dedupe`` (the same idempotency key under another tool_call_id is the same call; see
  docs/in-doubt.md, "Dedupe across ids"): record first, then claim the key's index, then run::

    BEGINNING | WAITING | SECURING --begun | woken | secured--> CLAIMING  (a started attempt claims)
    CLAIMING --claimed--> RUNNING                        (the key is this attempt's)
    CLAIMING --held--> CHECKING                          (another id holds it: read its record)
    CLAIMING --claim_failed | interrupted--> ENDING      (give the record back, refuse or re-raise)
    CHECKING --holder_seen--> CLAIMING | WAITING | ENDING (stale: claim it from that id; running: wait
                                                         for it; else give the record back and refuse,
                                                         or commit it with that id's value: replay)
    CHECKING --check_failed | interrupted--> ENDING
    WAITING --holder_ended--> CHECKING                   (read the holder's record again)
    WAITING --check_failed | interrupted--> ENDING
    ENDING --written--> UNCLAIMING                       (this attempt claimed the key: end its entry)
    UNCLAIMING --unclaimed--> DONE

Every transition is in :data:`TRANSITIONS`; an event a state does not take raises
:class:`MachineError` (a bug in an executor, never a user error).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from typing import Any

from . import refusals
from .codec import decode_result, encode_result, revalidate
from .decision import AskProbe, Replay, Run, decide
from .errors import CorruptRecordError, EffectRefused, ResultDecodingError, ResultEncodingError, StoreError
from .gates import GuardedCall, Plan, plan
from .operations import (
    Ask,
    Begin,
    CallRules,
    Claim,
    Commit,
    Effect,
    Execution,
    Finish,
    GiveBack,
    Operation,
    Outcome,
    Probe,
    ReadHolder,
    Refuse,
    Reraise,
    Running,
    RunTool,
    Secure,
    Unclaim,
    Wait,
    WaitHolder,
    Write,
)
from .outcome import give_back, gives_back_after_failed_begin, settlement_for_error, settlement_for_return
from .probes import Found, NeverTookEffect, ProbeCall, TookEffect, Verdict
from .records import (
    BeginKind,
    BeginOutcome,
    BeginRequest,
    Holder,
    Record,
    RecordVersionError,
    Settlement,
    Status,
)

# a wait with less time left than this is not started: the call is refused as still in progress
_LEAST_WAIT = 0.01
# compare-and-set rounds on a key's index entry that keeps changing before the call gives up
DEDUPE_ROUNDS = 3


__all__ = [
    "DEDUPE_ROUNDS",
    "TRANSITIONS",
    "Ask",
    "Begin",
    "CallMachine",
    "CallRules",
    "Claim",
    "Commit",
    "Effect",
    "Event",
    "Execution",
    "Finish",
    "GiveBack",
    "MachineError",
    "Operation",
    "Outcome",
    "Probe",
    "ReadHolder",
    "Refuse",
    "Reraise",
    "RunTool",
    "Running",
    "Secure",
    "State",
    "Unclaim",
    "Wait",
    "WaitHolder",
    "Write",
]


class State(enum.Enum):
    __hash__ = object.__hash__  # members are singletons: hashed by identity (Enum's hash is Python code)

    READY = "ready"  # the gates passed (made with the machine); nothing asked or recorded yet
    ASKING = "asking"  # waiting for the approver
    BEGINNING = "beginning"  # the begin is sent
    WAITING = "waiting"  # waiting for the running attempt that holds the record to end (then begin again)
    SECURING = "securing"  # waiting until enough replicas hold the pending record (wait_replicas)
    RUNNING = "running"  # the tool body runs; this attempt owns the record
    RUNNING_BARE = "running_bare"  # the tool body runs without a record of its own
    PROBING = "probing"  # the call is in doubt and this attempt holds the record: the tool's probe is asked
    ENDING = "ending"  # the attempt's last write (commit or settle) is sent
    GIVING_BACK = "giving_back"  # the release of a begin that may have landed is sent
    CLAIMING = "claiming"  # dedupe: the claim of the idempotency key's index entry is sent
    CHECKING = "checking"  # dedupe: the record of the id that holds the key is read
    UNCLAIMING = "unclaiming"  # dedupe: after the record's last write, the key's entry is ended
    DONE = "done"


class Event(enum.Enum):
    __hash__ = object.__hash__

    START = "start"
    APPROVED = "approved"
    DENIED = "denied"
    BEGUN = "begun"
    WOKEN = "woken"
    BEGIN_FAILED = "begin_failed"
    BEGIN_INTERRUPTED = "begin_interrupted"
    SECURED = "secured"
    SECURE_FAILED = "secure_failed"
    RETURNED = "returned"
    RAISED = "raised"
    WRITTEN = "written"
    GIVEN_BACK = "given_back"
    PROBED = "probed"
    CLAIMED = "claimed"
    HELD = "held"
    CLAIM_FAILED = "claim_failed"
    HOLDER_SEEN = "holder_seen"
    HOLDER_ENDED = "holder_ended"
    CHECK_FAILED = "check_failed"
    INTERRUPTED = "interrupted"
    UNCLAIMED = "unclaimed"


S, E = State, Event
# (state, event) -> the states the machine may go to. The decision between them is the machine's.
TRANSITIONS: dict[tuple[State, Event], frozenset[State]] = {
    (S.READY, E.START): frozenset({S.ASKING, S.BEGINNING, S.RUNNING_BARE, S.DONE}),
    (S.ASKING, E.APPROVED): frozenset({S.BEGINNING, S.RUNNING_BARE, S.DONE}),
    (S.ASKING, E.DENIED): frozenset({S.DONE}),
    (S.BEGINNING, E.BEGUN): frozenset({S.RUNNING, S.SECURING, S.WAITING, S.PROBING, S.CLAIMING, S.DONE}),
    (S.BEGINNING, E.BEGIN_FAILED): frozenset({S.GIVING_BACK, S.DONE}),
    (S.BEGINNING, E.BEGIN_INTERRUPTED): frozenset({S.GIVING_BACK}),
    (S.WAITING, E.WOKEN): frozenset({S.WAITING, S.RUNNING, S.SECURING, S.PROBING, S.CLAIMING, S.DONE}),
    (S.PROBING, E.PROBED): frozenset({S.BEGINNING, S.ENDING}),
    (S.WAITING, E.BEGIN_FAILED): frozenset({S.GIVING_BACK, S.DONE}),
    (S.WAITING, E.BEGIN_INTERRUPTED): frozenset({S.GIVING_BACK}),
    (S.SECURING, E.SECURED): frozenset({S.RUNNING, S.CLAIMING}),
    (S.SECURING, E.SECURE_FAILED): frozenset({S.ENDING}),
    (S.RUNNING, E.RETURNED): frozenset({S.ENDING}),
    (S.RUNNING, E.RAISED): frozenset({S.ENDING, S.PROBING}),
    (S.RUNNING_BARE, E.RETURNED): frozenset({S.DONE}),
    (S.RUNNING_BARE, E.RAISED): frozenset({S.DONE}),
    (S.ENDING, E.WRITTEN): frozenset({S.DONE, S.UNCLAIMING}),
    (S.GIVING_BACK, E.GIVEN_BACK): frozenset({S.DONE}),
    (S.CLAIMING, E.CLAIMED): frozenset({S.RUNNING}),
    (S.CLAIMING, E.HELD): frozenset({S.CHECKING}),
    (S.CLAIMING, E.CLAIM_FAILED): frozenset({S.ENDING}),
    (S.CLAIMING, E.INTERRUPTED): frozenset({S.ENDING}),
    (S.CHECKING, E.HOLDER_SEEN): frozenset({S.CLAIMING, S.WAITING, S.ENDING}),
    (S.CHECKING, E.CHECK_FAILED): frozenset({S.ENDING}),
    (S.CHECKING, E.INTERRUPTED): frozenset({S.ENDING}),
    (S.WAITING, E.HOLDER_ENDED): frozenset({S.CHECKING}),
    (S.WAITING, E.CHECK_FAILED): frozenset({S.ENDING}),
    (S.WAITING, E.INTERRUPTED): frozenset({S.ENDING}),
    (S.UNCLAIMING, E.UNCLAIMED): frozenset({S.DONE}),
}
del S, E
_ALLOWED = frozenset((state, event, to) for (state, event), targets in TRANSITIONS.items() for to in targets)


class MachineError(RuntimeError):
    """An executor fed an event the machine's state does not take."""


class CallMachine:
    """One guarded call, from its gates to its end. Made by running the gates: a refusal there is
    the first operation :meth:`start` returns."""

    __slots__ = (
        "_after",
        "_claimed",
        "_durable",
        "_holder",
        "_last_step",
        "_nested_key",
        "_raised",
        "_rounds",
        "_wait_left",
        "_waited_for",
        "annotation",
        "attempt",
        "call",
        "plan",
        "request",
        "rules",
        "state",
        "t_run",
        "ticket",
    )

    def __init__(self, rules: CallRules, call: GuardedCall, annotation: Callable[[], Any]) -> None:
        self.rules = rules
        self.call = call
        self.annotation = annotation  # the tool's return annotation, read on first replay
        self.state = State.READY
        self.request: BeginRequest | None = None
        self.attempt = 0  # this attempt's number, once it owns the record
        self._after: Outcome | None = None  # how the call ends once the write in flight is answered
        self._nested_key: str | None = None  # nested: the key of the call whose body this is
        self._durable = False  # the begin's durable, kept for the begin after a wait
        self._wait_left = rules.wait_for_running  # seconds the call may still wait for a running attempt
        # dedupe: the index entry may name this attempt (a claim was answered claimed, or may have
        # landed); the id that holds it, as last read; compare-and-set rounds; the id waited for
        self._claimed = False
        self._holder: Holder | None = None
        self._rounds = 0
        self._waited_for: str | None = None
        self._last_step: Commit | Settlement | None = None  # the last write sent (what it ends as)
        # probing after the tool raised: the error, and whether an integration wants a refusal for it
        self._raised: tuple[BaseException, bool] | None = None
        self.t_run = 0.0  # set by the executor when the tool starts (for the observer's durations)
        self.ticket: object | None = None  # the executor's hold on the lease while the tool runs
        self.plan: Plan | None
        try:
            self.plan = plan(call, rules.options)
        except EffectRefused as refusal:
            self.plan = None
            self._after = Refuse(refusal)

    def _go(self, event: Event, to: State) -> None:
        if (self.state, event, to) not in _ALLOWED:
            raise MachineError(f"{event.value} in state {self.state.value} cannot lead to {to.value}")
        self.state = to

    # -- before the record ---------------------------------------------------------------------
    def start(self, running: Running) -> Operation:
        """The first operation. ``running``: the guarded call whose body runs now, if any."""
        if self.plan is None:
            self._go(Event.START, State.DONE)
            assert self._after is not None
            return self._after
        if self.plan.approval_why is not None:
            self._go(Event.START, State.ASKING)
            return Ask(self.plan.approval_why)
        return self._record_or_not(Event.START, running)

    def approved(self, running: Running) -> Operation:
        return self._record_or_not(Event.APPROVED, running)

    def denied(self, refusal: EffectRefused) -> Refuse:
        self._go(Event.DENIED, State.DONE)
        return Refuse(refusal)

    def _record_or_not(self, event: Event, running: Running) -> Operation:
        """Begin a record, or run without one: the call has no id (and needs none), or it is made
        inside the body of this very tool_call_id (the record there covers it)."""
        planned = self.plan
        assert planned is not None
        tool_call_id = planned.tool_call_id
        if tool_call_id is None:
            self._go(event, State.RUNNING_BARE)
            return RunTool(
                Running(planned.idempotency_key, None, self.call.reversibility.may_run_again), True
            )
        if tool_call_id == running.tool_call_id:
            # covered by the record of the call whose body this is, which runs at most once unless its
            # tool may run again: then a tool that may not would run again with it
            if running.may_run_again and not self.call.reversibility.may_run_again:
                self._go(event, State.DONE)
                return Refuse(refusals.nested_in_reversible(self.call.tool, tool_call_id))
            self._go(event, State.RUNNING_BARE)
            self._nested_key = running.idempotency_key
            return RunTool(running, True)
        key = planned.idempotency_key
        assert key is not None
        # tool_call_id, idempotency_key, tool, owner token (secrets.token_hex(16) without its two
        # calls), reversible: positional, which builds the named tuple faster than keywords
        self.request = BeginRequest(
            tool_call_id,
            key,
            self.call.tool,
            os.urandom(16).hex(),
            self.call.reversibility.may_run_again,
            self.rules.lease_ms,
            self.call.probe is not None and not self.call.reversibility.may_run_again,
        )
        self._go(event, State.BEGINNING)
        return Begin(self.request)

    # -- the begin's answer --------------------------------------------------------------------
    def begun(self, outcome: BeginOutcome, durable: bool) -> Operation:
        """What begin found. ``durable``: the store must first get the record to its replicas."""
        if outcome.kind is BeginKind.RUNNING and self.rules.wait_for_running > 0:
            self._durable, self._wait_left = durable, self.rules.wait_for_running
            self._go(Event.BEGUN, State.WAITING)
            assert self.request is not None
            # a call that waited does not ask the probe after: the attempt it waited for asked it (a
            # prober, or an attempt whose own error it probed), so concurrent finders ask it once
            self.request = self.request._replace(probes=False)
            return Wait(self.request, self._wait_left)
        return self._decided(Event.BEGUN, outcome, durable)

    def woken(self, outcome: BeginOutcome, waited: float) -> Operation:
        """What begin found after a wait of ``waited`` seconds: wait on while the attempt still runs
        and time is left, else decide as for a first begin."""
        self._wait_left -= waited
        if outcome.kind is BeginKind.RUNNING and self._wait_left > _LEAST_WAIT:
            self._go(Event.WOKEN, State.WAITING)
            assert self.request is not None
            return Wait(self.request, self._wait_left)
        return self._decided(Event.WOKEN, outcome, self._durable)

    def _decided(self, event: Event, outcome: BeginOutcome, durable: bool) -> Operation:
        request = self.request
        assert request is not None
        decision = decide(outcome)
        if isinstance(decision, Run):
            self.attempt = decision.attempt
            if durable:
                self._go(event, State.SECURING)
                return Secure(request)
            return self._run_or_claim(event)
        if isinstance(decision, AskProbe):
            self.attempt, self._durable = decision.attempt, durable
            self._go(event, State.PROBING)
            return self._probe("abandoned" if outcome.found == "abandoned" else "unknown")
        self._go(event, State.DONE)
        tool, tool_call_id, key = request.tool, request.tool_call_id, request.idempotency_key
        if isinstance(decision, Replay):
            signer = self.rules.signer
            if signer is not None and not signer.verify(tool_call_id, key, decision.value, decision.mac):
                return Refuse(
                    refusals.record_corrupt(
                        tool,
                        tool_call_id,
                        key,
                        "its signature does not verify (edited or forged in the store)",
                    )
                )
            try:
                value = revalidate(decode_result(decision.value), self.annotation())
            except ResultDecodingError as exc:
                return Refuse(refusals.record_corrupt(tool, tool_call_id, key, str(exc)))
            return Finish(Execution(value, "replayed", tool_call_id, key, outcome.attempt))
        return Refuse(refusals.for_begin(decision.reason, request, outcome, self.rules.target))

    def begin_failed(self, error: StoreError) -> Operation:
        """The begin failed. A lost reply may hide a begin that landed: give back what this attempt
        may hold, then refuse."""
        refusal = self._begin_refusal(error)
        if gives_back_after_failed_begin(error):
            self._go(Event.BEGIN_FAILED, State.GIVING_BACK)
            self._after = refusal
            assert self.request is not None
            return GiveBack(self.request)
        self._go(Event.BEGIN_FAILED, State.DONE)
        return refusal

    def begin_interrupted(self, error: BaseException) -> GiveBack:
        """Interrupted (cancelled) while begin ran: it may have landed; the tool never runs."""
        self._go(Event.BEGIN_INTERRUPTED, State.GIVING_BACK)
        self._after = Reraise(error)
        assert self.request is not None
        return GiveBack(self.request)

    def given_back(self) -> Outcome:
        self._go(Event.GIVEN_BACK, State.DONE)
        assert self._after is not None
        return self._after

    def secured(self) -> RunTool | Claim:
        return self._run_or_claim(Event.SECURED)

    def secure_failed(self, error: StoreError) -> Write:
        """Not enough replicas hold the record: the tool will not run; give the record back."""
        self._go(Event.SECURE_FAILED, State.ENDING)
        self._after = self._begin_refusal(error)
        return self._write(give_back(self.attempt))

    def _run_or_claim(self, event: Event) -> RunTool | Claim:
        """This attempt owns its record: run, or with dedupe first claim the key's index entry."""
        if self.call.dedupe is not None:
            self._go(event, State.CLAIMING)
            assert self.request is not None
            return Claim(self.request)
        self._go(event, State.RUNNING)
        return self._run()

    # -- dedupe: the same call under another tool_call_id ---------------------------------------
    def claimed(self) -> RunTool:
        """The key's index entry names this attempt: run."""
        self._claimed = True
        self._go(Event.CLAIMED, State.RUNNING)
        return self._run()

    def held(self, holder: Holder) -> ReadHolder:
        """Another id holds the key: read its record (the only authority on whether it is busy)."""
        self._go(Event.HELD, State.CHECKING)
        self._holder = holder
        return ReadHolder(holder)

    def claim_failed(self, error: StoreError) -> Write:
        """The claim failed (it may have landed): give the record back (then the entry, if it may
        name this attempt), and refuse; the tool did not run."""
        self._claimed = self._claimed or gives_back_after_failed_begin(error)
        return self._not_run(Event.CLAIM_FAILED, self._begin_refusal(error))

    def check_failed(self, error: StoreError) -> Write:
        """Reading (or waiting for) the holder's record failed: give the record back and refuse (a
        holder's record that cannot be read is named as the one that cannot be trusted)."""
        request, holder = self.request, self._holder
        if isinstance(error, CorruptRecordError) and request is not None and holder is not None:
            why = f"{error} (the record of the same call under tool_call_id {holder.tool_call_id!r})"
            refusal = refusals.record_corrupt(
                request.tool, request.tool_call_id, request.idempotency_key, why
            )
            return self._not_run(Event.CHECK_FAILED, Refuse(refusal, error))
        return self._not_run(Event.CHECK_FAILED, self._begin_refusal(error))

    def interrupted(self, error: BaseException) -> Write:
        """Interrupted (cancelled) while claiming, reading or waiting for the holder: the tool never
        runs; give the record back (and the entry, which a claim in flight may have written)."""
        if self.state is State.CLAIMING:
            self._claimed = True
        return self._not_run(Event.INTERRUPTED, Reraise(error))

    def holder_ended(self, waited: float) -> ReadHolder:
        """The wait for the holder's attempt is over (it ended, or the time ran out): read it again."""
        self._wait_left -= waited
        self._go(Event.HOLDER_ENDED, State.CHECKING)
        assert self._holder is not None
        return ReadHolder(self._holder)

    def holder_seen(self, record: Record | None) -> Operation:
        """What the holder's record is decides (docs/design-in-doubt.md, section 5): gone, released,
        or another key: stale, claim it from that id; running: wait for it; in doubt: refused unless
        the tool may run again; committed: a new call (``in_doubt``) or its value replayed
        (``always``, or to a call that waited for it)."""
        request, holder = self.request, self._holder
        assert request is not None and holder is not None
        if record is None or record.idempotency_key != request.idempotency_key:
            return self._take_over(holder)
        if record.status is Status.COMMITTED:
            if self.call.dedupe == "always" or self._waited_for == holder.tool_call_id:
                return self._replay_holder(record)
            return self._take_over(holder)
        if record.liveness == "running":
            if self._wait_left > _LEAST_WAIT:
                self._waited_for = holder.tool_call_id
                self._go(Event.HOLDER_SEEN, State.WAITING)
                return WaitHolder(holder, self._wait_left)
            target = self.rules.target
            return self._not_run(
                Event.HOLDER_SEEN, Refuse(refusals.held_in_progress(request, record, target))
            )
        # unknown, abandoned, or pending without a lease: in doubt
        if self.call.reversibility.may_run_again:
            return self._take_over(holder)
        return self._not_run(
            Event.HOLDER_SEEN, Refuse(refusals.held_in_doubt(request, record, self.rules.target))
        )

    def _take_over(self, holder: Holder) -> Operation:
        """The holder cannot run again (or may): claim the entry from it, a compare-and-set on the
        value read; a key whose entry keeps changing is given up after DEDUPE_ROUNDS rounds."""
        self._rounds += 1
        if self._rounds > DEDUPE_ROUNDS:
            error = StoreError(
                f"the index entry of its idempotency key changed {DEDUPE_ROUNDS} times while it was claimed"
            )
            return self._not_run(Event.HOLDER_SEEN, self._begin_refusal(error))
        self._go(Event.HOLDER_SEEN, State.CLAIMING)
        assert self.request is not None
        return Claim(self.request, holder)

    def _replay_holder(self, record: Record) -> Operation:
        """The holder committed: this attempt's own record is committed with its value (so that its
        retries replay it too), and the caller gets the value (``replayed``)."""
        request = self.request
        assert request is not None
        tool, tool_call_id, key = request.tool, request.tool_call_id, request.idempotency_key
        signer = self.rules.signer
        if record.value is None or not record.stored:
            self._go(Event.HOLDER_SEEN, State.ENDING)
            self._after = Refuse(refusals.result_not_stored(tool, tool_call_id, key))
            return self._write(Commit(None, None, f"not stored under {record.tool_call_id!r}"))
        if signer is not None and not signer.verify(record.tool_call_id, key, record.value, record.mac):
            reason = f"the record of {record.tool_call_id!r}, whose value it would replay, does not verify"
            return self._not_run(
                Event.HOLDER_SEEN, Refuse(refusals.record_corrupt(tool, tool_call_id, key, reason))
            )
        try:
            value = revalidate(decode_result(record.value), self.annotation())
        except ResultDecodingError as exc:
            return self._not_run(
                Event.HOLDER_SEEN, Refuse(refusals.record_corrupt(tool, tool_call_id, key, str(exc)))
            )
        mac = signer.sign(tool_call_id, key, record.value) if signer is not None else None
        self._go(Event.HOLDER_SEEN, State.ENDING)
        self._after = Finish(Execution(value, "replayed", tool_call_id, key, self.attempt))
        return self._write(Commit(record.value, mac))

    def _not_run(self, event: Event, after: Outcome) -> Write:
        """The tool will not run: give this attempt's pending record back (owner-fenced), then end."""
        self._go(event, State.ENDING)
        self._after = after
        return self._write(give_back(self.attempt))

    def unclaimed(self) -> Outcome:
        """The index entry's end was sent (whatever the store answered)."""
        self._go(Event.UNCLAIMED, State.DONE)
        assert self._after is not None
        return self._after

    def _write(self, step: Commit | Settlement) -> Write:
        """The attempt's last write (noted: with dedupe, the index entry ends as the record does)."""
        self._last_step = step
        assert self.request is not None
        return Write(self.request, self.attempt, step)

    def _begin_refusal(self, error: StoreError) -> Refuse:
        request = self.request
        assert request is not None
        tool, tool_call_id, key = request.tool, request.tool_call_id, request.idempotency_key
        if isinstance(error, RecordVersionError):
            return Refuse(refusals.record_from_a_newer_release(tool, tool_call_id, key, error.version), error)
        if isinstance(error, CorruptRecordError):
            return Refuse(refusals.record_corrupt(tool, tool_call_id, key, str(error)), error)
        return Refuse(
            refusals.store_unavailable(tool, tool_call_id, key, str(error), self.rules.target), error
        )

    def _run(self) -> RunTool:
        planned, reversibility, request = self.plan, self.call.reversibility, self.request
        assert planned is not None and request is not None
        return RunTool(
            Running(planned.idempotency_key, planned.tool_call_id, reversibility.may_run_again),
            False,
            request if request.lease_ms is not None else None,
        )

    # -- after the tool ------------------------------------------------------------------------
    def returned(self, value: Any) -> Operation:
        """The tool returned ``value``: write its result (or, for a deferred result, the settlement).
        Never raises: the tool has run."""
        planned = self.plan
        assert planned is not None
        if self.state is State.RUNNING_BARE:
            self._go(Event.RETURNED, State.DONE)
            if planned.tool_call_id is None:
                return Finish(Execution(value, "unguarded", None, planned.idempotency_key))
            return Finish(Execution(value, "nested", planned.tool_call_id, self._nested_key))
        self._go(Event.RETURNED, State.ENDING)
        self._after = Finish(
            Execution(value, "executed", planned.tool_call_id, planned.idempotency_key, self.attempt)
        )
        settlement = settlement_for_return(value)
        return self._write(settlement if settlement is not None else self._sealed(value))

    def raised(self, error: BaseException, *, refuse_in_doubt: bool = False) -> Operation:
        """The tool raised ``error``: the record ends unknown when in doubt, else released.
        ``refuse_in_doubt`` (an integration runs the call): an error that leaves a tool that may not
        run again in doubt ends the call with an :class:`EffectStatusUnknown` refusal raised from
        it, so the model is told not to call it again; a cancellation or interrupt (not an
        Exception) is always re-raised."""
        if self.state is State.RUNNING_BARE:
            self._go(Event.RAISED, State.DONE)
            return Reraise(error)
        request = self.request
        assert request is not None
        settlement = settlement_for_error(error, self.rules.ambiguity)
        in_doubt = (
            settlement is Settlement.UNKNOWN
            and isinstance(error, Exception)
            and not self.call.reversibility.may_run_again
        )
        if in_doubt and request.probes:  # ask the backend before leaving it in doubt
            self._go(Event.RAISED, State.PROBING)
            self._raised = (error, refuse_in_doubt)
            return self._probe("error")
        self._go(Event.RAISED, State.ENDING)
        self._after = self._in_doubt(error) if in_doubt and refuse_in_doubt else Reraise(error)
        return self._write(settlement)

    def _in_doubt(self, error: BaseException) -> Refuse:
        request = self.request
        assert request is not None
        refusal = refusals.in_doubt_after_error(
            request.tool, request.tool_call_id, request.idempotency_key, error, self.rules.target
        )
        return Refuse(refusal, error)

    # -- reconciling with the backend (the tool's probe) ----------------------------------------
    def _probe(self, found: Found) -> Probe:
        request, probe = self.request, self.call.probe
        assert request is not None and probe is not None
        call = ProbeCall(
            request.tool,
            request.tool_call_id,
            request.idempotency_key,
            self.call.arguments,
            self.attempt,
            found,
        )
        return Probe(probe, call, self.rules.probe_timeout)

    def probed(self, answer: Verdict) -> Operation:
        """The probe answered (None: it could not tell, raised, or ran out of time). Took effect: the
        record is committed with its value, which the caller gets; never took effect: the tool runs
        now (asked by a later call), or the record is released (asked after the tool's own error);
        can't tell: in doubt, as without a probe."""
        request = self.request
        assert request is not None
        raised, self._raised = self._raised, None
        if isinstance(answer, TookEffect):
            self._go(Event.PROBED, State.ENDING)
            self._after = Finish(
                Execution(
                    answer.value, "reconciled", request.tool_call_id, request.idempotency_key, self.attempt
                )
            )
            return self._write(self._sealed(answer.value))
        if isinstance(answer, NeverTookEffect):
            if raised is not None:  # the tool's own error left nothing: release, and give it back
                self._go(Event.PROBED, State.ENDING)
                self._after = Reraise(raised[0])
                return self._write(Settlement.RELEASE)
            # begin again with this attempt's token before the tool runs: it answers started while
            # the record is still this attempt's, and what the record holds now if an operator's
            # verdict came meanwhile (which must not be run over)
            self._go(Event.PROBED, State.BEGINNING)
            return Begin(request)
        self._go(Event.PROBED, State.ENDING)
        if raised is not None:
            error, refuse = raised
            self._after = self._in_doubt(error) if refuse else Reraise(error)
        else:
            self._after = Refuse(refusals.backend_cannot_tell(request, self.attempt, self.rules.target))
        return self._write(Settlement.UNKNOWN)

    def written(self) -> Outcome | Unclaim:
        """The store answered the last write (whatever it answered: the tool has run, or will not).
        With dedupe, an index entry that may name this attempt ends next, as its record did:
        committed, kept as long as the record under ``always`` (deleted under ``in_doubt``: a new id
        is a new call then); unknown, kept as long as the record; released, deleted."""
        if self._claimed:
            self._go(Event.WRITTEN, State.UNCLAIMING)
            assert self.request is not None
            step = self._last_step
            keep: Status | None = None
            if isinstance(step, Commit):
                keep = Status.COMMITTED if self.call.dedupe == "always" else None
            elif step is Settlement.UNKNOWN:
                keep = Status.UNKNOWN
            return Unclaim(self.request, keep)
        self._go(Event.WRITTEN, State.DONE)
        assert self._after is not None
        return self._after

    def _sealed(self, value: Any) -> Commit:
        """The bytes to store and their MAC, or none (and why) when the result cannot be stored.
        Never raises: whatever goes wrong here (an encoder that meets an attribute that raises, a
        signer error) ends as "committed, not stored", never as a record left pending or an
        exception for a call that took effect."""
        request = self.request
        assert request is not None
        rules = self.rules
        try:
            data = encode_result(value, rules.max_result_bytes)
            if rules.signer is None:
                return Commit(data, None)
            return Commit(data, rules.signer.sign(request.tool_call_id, request.idempotency_key, data))
        except Exception as exc:
            why = str(exc) if isinstance(exc, ResultEncodingError) else f"{type(exc).__name__}: {exc}"
            return Commit(None, None, why)
