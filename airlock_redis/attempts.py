"""One attempt: the object that decides each step of a guarded call, what the call produced, and
how each step is reported.

Reporting means a log line, plus metrics and events when the guard has an observer; with none,
nothing is measured.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from .approval import ApprovalRequest, approval_request
from .context import current_idempotency_key, read_running, running_key, running_may_run_again
from .core import refusals
from .core.ambiguity import AmbiguityRule
from .core.codec import decode_result, encode_result, revalidate
from .core.decision import Replay, Run, decide
from .core.errors import (
    CorruptRecordError,
    EffectRefused,
    ResultDecodingError,
    ResultEncodingError,
    StoreError,
)
from .core.gates import GuardedCall, GuardOptions, plan
from .core.outcome import (
    give_back,
    gives_back_after_failed_begin,
    settlement_for_error,
    settlement_for_return,
)
from .core.records import BeginOutcome, BeginRequest, Settlement, Status, TransitionResult
from .core.signing import Signer
from .observability import GuardObserver

T = TypeVar("T")

log = logging.getLogger("airlock_redis")

Effect = Literal["executed", "replayed", "unguarded", "nested"]


@dataclass(slots=True)  # built on every call: a frozen dataclass costs four times as much to build
class Execution(Generic[T]):
    """What a guarded call produced, and how."""

    value: T
    # executed: the tool ran; replayed: the stored value; unguarded: ran without a record (no id);
    # nested: ran inside the guarded body of the same tool_call_id, covered by that call's record
    effect: Effect
    tool_call_id: str | None
    idempotency_key: str | None
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class AttemptRules:
    """What every attempt of one guard decides by; made once, with the guard."""

    options: GuardOptions
    ambiguity: AmbiguityRule
    max_result_bytes: int
    signer: Signer | None
    report: Reporter


class Commit(NamedTuple):
    """Store the result: its bytes and their MAC (both None when the result cannot be stored)."""

    data: bytes | None
    mac: bytes | None


class Attempt:
    """One guarded call, from its gates to its end. It decides every step and does no I/O: the
    drivers (``EffectGuard.execute`` / ``aexecute``) send what it asks to the store, run the tool,
    and hand back what came of it, one method per event.

    Made by running the gates (raises their refusal). Then: :attr:`approval` (ask before recording,
    when set); :meth:`begin_request` (None: run without a record); :meth:`on_begun` (a replay, or
    None to run the tool) or :meth:`on_begin_failed`; then :meth:`on_returned` or :meth:`on_raised`,
    and :meth:`ended` with what the store answered.
    """

    __slots__ = ("annotation", "attempt", "call", "plan", "request", "rules", "t0", "t_begin")

    def __init__(self, rules: AttemptRules, call: GuardedCall, annotation: Callable[[], Any]) -> None:
        self.rules = rules
        self.call = call
        self.annotation = annotation
        self.plan = plan(call, rules.options)
        self.request: BeginRequest | None = None
        self.attempt = 0  # this attempt's number, once it owns the record
        self.t_begin = 0.0  # perf_counter at begin, and when the tool started (observer only)
        self.t0 = 0.0

    # -- before the record ---------------------------------------------------------------------
    @property
    def approval(self) -> ApprovalRequest | None:
        """What to ask the approver before anything is recorded, or None."""
        planned = self.plan
        if planned.approval_why is None:
            return None
        return approval_request(self.call, planned, planned.approval_why)

    def begin_request(self) -> BeginRequest | None:
        """The record to begin, or None when the call runs without one: it has no id (and needs
        none), or it is made inside the body of this very tool_call_id (the record there covers it)."""
        tool_call_id = self.plan.tool_call_id
        if tool_call_id is None:
            return None
        if tool_call_id == read_running()[1]:  # the running call's tool_call_id
            # covered by the record of the call whose body this is, which runs at most once unless
            # its tool may run again: then a tool that may not would run again with it
            if running_may_run_again() and not self.call.reversibility.may_run_again:
                raise refusals.nested_in_reversible(self.call.tool, tool_call_id)
            return None
        key = self.plan.idempotency_key
        assert key is not None
        # tool_call_id, idempotency_key, tool, owner token (secrets.token_hex(16) without its two
        # calls), reversible: positional, which builds the named tuple faster than keywords
        token = os.urandom(16).hex()
        reversible = self.call.reversibility.may_run_again
        self.request = BeginRequest(tool_call_id, key, self.call.tool, token, reversible)
        if self.rules.report.observer is not None:
            self.t_begin = time.perf_counter()
        return self.request

    def running(self) -> running_key:
        """The context the tool body runs in: its idempotency key and tool_call_id (a nested call
        keeps the key of the call whose body it is part of)."""
        planned = self.plan
        if self.request is None and planned.tool_call_id is not None:  # nested: the outer call's context
            return running_key(current_idempotency_key(), planned.tool_call_id, running_may_run_again())
        return running_key(
            planned.idempotency_key, planned.tool_call_id, self.call.reversibility.may_run_again
        )

    def without_record(self, value: T) -> Execution[T]:
        """What a call that ran without a record of its own produced."""
        planned = self.plan
        if planned.tool_call_id is None:
            return Execution(value, "unguarded", None, planned.idempotency_key)
        return Execution(value, "nested", planned.tool_call_id, current_idempotency_key())

    # -- the begin's answer --------------------------------------------------------------------
    def on_begun(self, outcome: BeginOutcome) -> Execution[Any] | None:
        """None: this attempt owns the record and runs the tool. A replay: the stored value.
        Raises the refusal (reported) otherwise."""
        observer = self.rules.report.observer
        if observer is None:
            return self._decide(outcome)
        request = self.request
        assert request is not None
        observer.store_operation("begin", time.perf_counter() - self.t_begin, None)
        try:
            replay = self._decide(outcome)
        except EffectRefused as refusal:
            observer.call_event(
                "refused", request.tool, request.tool_call_id, reason=refusal.reason, attempt=outcome.attempt
            )
            raise
        if replay is not None:
            observer.call_event("replayed", request.tool, request.tool_call_id, attempt=replay.attempt)
        else:
            observer.call_event("started", request.tool, request.tool_call_id, attempt=self.attempt)
            self.t0 = time.perf_counter()
        return replay

    def _decide(self, outcome: BeginOutcome) -> Execution[Any] | None:
        request = self.request
        assert request is not None
        tool, tool_call_id, key = request.tool, request.tool_call_id, request.idempotency_key
        decision = decide(outcome)
        if isinstance(decision, Run):
            self.attempt = decision.attempt
            return None
        if isinstance(decision, Replay):
            signer = self.rules.signer
            if signer is not None and not signer.verify(tool_call_id, key, decision.value, decision.mac):
                log.error(
                    "airlock_redis: the stored result of %s tool_call_id=%r fails its signature check "
                    "(edited or forged in Redis); refusing it",
                    tool,
                    tool_call_id,
                )
                raise refusals.record_corrupt(
                    tool, tool_call_id, key, "its signature does not verify (edited or forged in the store)"
                )
            try:
                value = revalidate(decode_result(decision.value), self.annotation())
            except ResultDecodingError as exc:
                raise refusals.record_corrupt(tool, tool_call_id, key, str(exc)) from None
            log.info("airlock_redis: replayed %s tool_call_id=%r", tool, tool_call_id)
            return Execution(value, "replayed", tool_call_id, key, outcome.attempt)
        if decision.reason == "policy_violation":
            raise refusals.policy_violation(tool, tool_call_id, key, outcome)
        if decision.reason == "result_not_stored":
            raise refusals.result_not_stored(tool, tool_call_id, key)
        raise refusals.status_unknown(tool, tool_call_id, key, outcome, self.rules.report.target)

    def on_begin_failed(self, error: StoreError) -> tuple[bool, Exception]:
        """After a begin (or the replicas' acknowledgement of it) failed: whether to give back what
        this attempt may hold (a lost reply may hide a begin that landed), and the refusal to raise."""
        request = self.request
        assert request is not None
        refusal = self.rules.report.begin_failed(
            request.tool, request.tool_call_id, request.idempotency_key, error
        )
        return gives_back_after_failed_begin(error), refusal

    def give_back(self) -> Settlement:
        """How this attempt leaves the record it took when its tool will not run."""
        return give_back(self.attempt)

    # -- after the tool ------------------------------------------------------------------------
    def on_returned(self, value: Any) -> Commit | Settlement:
        """What to write for a tool that returned ``value``: its result, or (a deferred result)
        the settlement. Never raises: the tool has run."""
        settlement = settlement_for_return(value)
        if settlement is not None:
            return settlement
        return self._sealed(value)

    def on_raised(self, error: BaseException) -> Settlement:
        """How the record ends for a tool that raised ``error``: unknown when in doubt, else released."""
        return settlement_for_error(error, self.rules.ambiguity)

    def _sealed(self, value: Any) -> Commit:
        """The bytes to store and their MAC, or (None, None) when the result cannot be stored. Never
        raises: whatever goes wrong here (an encoder that meets an attribute that raises, a signer
        error) ends as "committed, not stored", never as a record left pending or an exception for a
        call that took effect."""
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
            log.warning(
                "airlock_redis: %s ran under tool_call_id=%r but its result cannot be stored (%s); "
                "replays will be refused",
                request.tool,
                request.tool_call_id,
                why,
            )
            return Commit(None, None)

    def ended(self, step: Commit | Settlement, result: TransitionResult | StoreError, t_sent: float) -> None:
        """Report what the store answered to the attempt's last write (sent at ``t_sent``)."""
        request = self.request
        assert request is not None
        if isinstance(step, Settlement):
            self.rules.report.settled(request, self.attempt, self.t0, step, result, t_sent)
        else:
            self.rules.report.committed(request, self.attempt, self.t0, result, t_sent)

    def executed(self, value: T) -> Execution[T]:
        planned = self.plan
        return Execution(value, "executed", planned.tool_call_id, planned.idempotency_key, self.attempt)


class Reporter:
    """Logs each step of an attempt, and tells the observer when there is one."""

    __slots__ = ("observer", "target")

    def __init__(self, observer: GuardObserver | None, target: str | None = "") -> None:
        self.observer = observer
        self.target = target  # the store's airlock-redis options, for the commands refusals print

    def begin_failed(self, tool: str, tool_call_id: str, key: str, error: StoreError) -> Exception:
        """The refusal for a begin the store could not do: record_corrupt or store_unavailable."""
        observer = self.observer
        if isinstance(error, CorruptRecordError):
            log.error(
                "airlock_redis: the record of %s tool_call_id=%r is corrupt (%s); refusing the call",
                tool,
                tool_call_id,
                error,
            )
            if observer is not None:
                observer.call_event("refused", tool, tool_call_id, reason="record_corrupt")
            return refusals.record_corrupt(tool, tool_call_id, key, str(error))
        log.warning("airlock_redis: store unavailable at begin for %s: %s", tool, error)
        if observer is not None:
            observer.store_operation("begin", None, error)
            observer.call_event("refused", tool, tool_call_id, reason="store_unavailable")
        return refusals.store_unavailable(tool, tool_call_id, key, str(error), self.target)

    def unreleased(self, request: BeginRequest, error: StoreError) -> None:
        log.warning(
            "airlock_redis: could not release the record of %s tool_call_id=%r after a failed begin "
            "(%s); a retry may be refused until it is resolved",
            request.tool,
            request.tool_call_id,
            error,
        )

    def committed(
        self,
        request: BeginRequest,
        attempt: int,
        t_run: float,
        result: TransitionResult | StoreError,
        t0: float,
    ) -> None:
        """The commit of an attempt whose tool started at ``t_run`` was sent at ``t0`` and answered."""
        if self.observer is not None:
            self._end(request, attempt, t_run, "commit", "committed", result, t0)
        if isinstance(result, StoreError):
            log.error(
                "airlock_redis: %s ran under tool_call_id=%r but the commit failed (%s); the record stays "
                "pending and retries will be refused",
                request.tool,
                request.tool_call_id,
                result,
            )
        elif result is TransitionResult.RECREATED:
            log.warning(
                "airlock_redis: %s tool_call_id=%r ran past its record's pending TTL (the record had "
                "expired when the tool returned); the record was written again as committed, but a "
                "retry in between would have found no record: raise pending_ttl above the tool's "
                "longest run",
                request.tool,
                request.tool_call_id,
            )
        elif result is not TransitionResult.OK:
            log.warning(
                "airlock_redis: commit of %s tool_call_id=%r was %s (the record was resolved or taken over)",
                request.tool,
                request.tool_call_id,
                result.value,
            )

    def settled(  # noqa: PLR0917
        self,
        request: BeginRequest,
        attempt: int,
        t_run: float,
        settlement: Settlement,
        result: TransitionResult | StoreError,
        t0: float,
    ) -> None:
        if self.observer is not None:
            event: Literal["unknown", "released"] = (
                "released" if settlement is Settlement.RELEASE else "unknown"
            )
            self._end(request, attempt, t_run, "settle", event, result, t0)
        if isinstance(result, StoreError):
            log.error(
                "airlock_redis: could not mark %s tool_call_id=%r %s (%s); the record stays pending",
                request.tool,
                request.tool_call_id,
                settlement.value,
                result,
            )
        elif result is TransitionResult.RECREATED:
            log.warning(
                "airlock_redis: %s tool_call_id=%r ran past its record's pending TTL; the record was "
                "written again as %s",
                request.tool,
                request.tool_call_id,
                settlement.value,
            )
        elif result is not TransitionResult.OK and settlement is not Settlement.RELEASE:
            log.warning(
                "airlock_redis: settling %s tool_call_id=%r as %s was %s",
                request.tool,
                request.tool_call_id,
                settlement.value,
                result.value,
            )

    def resolved(self, tool_call_id: str, verdict: Status | Settlement, result: TransitionResult) -> None:
        log.warning(
            "airlock_redis: operator resolved tool_call_id=%r as %s: %s",
            tool_call_id,
            verdict.value,
            result.value,
        )
        if self.observer is not None:
            self.observer.call_event("resolved", "", tool_call_id, reason=verdict.value)

    def _end(  # noqa: PLR0917
        self,
        request: BeginRequest,
        attempt: int,
        t_run: float,
        operation: str,
        event: Literal["committed", "unknown", "released"],
        result: TransitionResult | StoreError,
        t0: float,
    ) -> None:
        observer = self.observer
        assert observer is not None
        if isinstance(result, StoreError):
            observer.store_operation(operation, time.perf_counter() - t0, result)
            return
        observer.store_operation(operation, time.perf_counter() - t0, None)
        if result is TransitionResult.OK or result is TransitionResult.RECREATED:
            observer.call_event(
                event, request.tool, request.tool_call_id, attempt=attempt, duration_s=t0 - t_run
            )
