"""What a guarded call reports, in one place: a log line for each step that needs one, plus metrics
and events when the guard has an observer (with none, nothing is measured).

The executors call it with what the call machine returned (and what the store answered); it
decides nothing about the call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

from .core.call_machine import CallMachine, Commit, Finish, Operation, Probe, Refuse, Wait, Write
from .core.errors import CorruptRecordError, StoreError
from .core.probes import Verdict
from .core.records import BeginRequest, Settlement, Status, TransitionResult
from .observability import GuardObserver
from .probing import audit, said

log = logging.getLogger("airlock_redis")


class Reporter:
    """Logs each step of a call, and tells the observer when there is one."""

    __slots__ = ("clock", "observer")

    def __init__(self, observer: GuardObserver | None) -> None:
        self.observer = observer
        # perf_counter when there is an observer to tell durations to; else 0.0 (float() costs nothing)
        self.clock: Callable[[], float] = time.perf_counter if observer is not None else float

    # -- the begin -----------------------------------------------------------------------------
    def begun(self, machine: CallMachine, op: Operation, t_sent: float) -> Operation:
        """The store answered the begin sent at ``t_sent``; ``op`` is what the machine does next."""
        if type(op) is Finish:
            log.info(
                "airlock_redis: replayed %s tool_call_id=%r", machine.call.tool, op.execution.tool_call_id
            )
        observer = self.observer
        if observer is None:
            return op
        request = machine.request
        assert request is not None
        observer.store_operation("begin", time.perf_counter() - t_sent, None)
        if type(op) is Finish:
            observer.call_event("replayed", request.tool, request.tool_call_id, attempt=op.execution.attempt)
        elif type(op) is not Refuse and type(op) is not Wait:
            observer.call_event("started", request.tool, request.tool_call_id, attempt=machine.attempt)
        return op

    def woken(self, machine: CallMachine, op: Operation) -> Operation:
        """A call that waited for a running attempt began again; ``op`` is what it does next."""
        observer = self.observer
        if observer is not None and type(op) is not Wait:
            request = machine.request
            assert request is not None
            observer.call_event("waited", request.tool, request.tool_call_id, attempt=machine.attempt)
            if type(op) is Finish:
                observer.call_event(
                    "replayed", request.tool, request.tool_call_id, attempt=op.execution.attempt
                )
            elif type(op) is not Refuse:
                observer.call_event("started", request.tool, request.tool_call_id, attempt=machine.attempt)
        return op

    def probed(self, store: object, op: Probe, verdict: Verdict, seconds: float) -> None:
        """The tool's probe answered (or was given up on): logged, and written to the audit trail."""
        call = op.call
        log.info(
            "airlock_redis: the probe of %s under tool_call_id=%r (%s) answered %s in %.3f s",
            call.tool,
            call.tool_call_id,
            call.found,
            said(verdict),
            seconds,
        )
        audit(store, call, verdict, seconds)
        if self.observer is not None:
            reason = said(verdict)
            self.observer.call_event(
                "probed", call.tool, call.tool_call_id, reason=reason, attempt=call.attempt
            )

    def begin_failed(self, op: Operation, error: StoreError) -> Operation:
        if self.observer is not None and not isinstance(error, CorruptRecordError):
            self.observer.store_operation("begin", None, error)
        return op

    def unreleased(self, request: BeginRequest, error: StoreError) -> None:
        log.warning(
            "airlock_redis: could not release the record of %s tool_call_id=%r after a failed begin "
            "(%s); a retry may be refused until it is resolved",
            request.tool,
            request.tool_call_id,
            error,
        )

    def unclaimed_failed(self, request: BeginRequest, error: StoreError) -> None:
        log.warning(
            "airlock_redis: could not end the dedupe index entry of %s tool_call_id=%r (%s); it lapses "
            "with its TTL, and its record decides meanwhile",
            request.tool,
            request.tool_call_id,
            error,
        )

    # -- refusals ------------------------------------------------------------------------------
    def refused(self, machine: CallMachine, op: Refuse) -> None:
        """Every refusal passes here once, whichever step refused."""
        refusal = op.refusal
        tool, tool_call_id = machine.call.tool, refusal.tool_call_id
        if refusal.reason == "record_corrupt":
            log.error(
                "airlock_redis: the record of %s tool_call_id=%r cannot be trusted (%s); refusing the call",
                tool,
                tool_call_id,
                refusal.message,
            )
        elif refusal.reason == "store_unavailable":
            log.warning("airlock_redis: store unavailable at begin for %s: %s", tool, op.cause)
        if self.observer is not None:
            self.observer.call_event("refused", tool, tool_call_id, reason=refusal.reason)

    # -- the last write ------------------------------------------------------------------------
    def ended(
        self,
        machine: CallMachine,
        op: Write,
        result: TransitionResult | StoreError,
        t_run: float,
        t_sent: float,
    ) -> None:
        """The store answered the attempt's last write (sent at ``t_sent``; the tool started at
        ``t_run``)."""
        step, request = op.step, op.request
        if result is TransitionResult.OK and self.observer is None and type(step) is not Commit:
            return  # the common end of a settled call: nothing to say
        if isinstance(step, Commit):
            if step.not_stored is not None:
                log.warning(
                    "airlock_redis: %s ran under tool_call_id=%r but its result cannot be stored (%s); "
                    "replays will be refused",
                    request.tool,
                    request.tool_call_id,
                    step.not_stored,
                )
            if result is not TransitionResult.OK:
                self._committed(request, result)
            if self.observer is not None:
                self._observe(op, "commit", "committed", result, t_run, t_sent)
            return
        self._settled(request, step, result)
        if self.observer is not None:
            event: Literal["unknown", "released"] = "released" if step is Settlement.RELEASE else "unknown"
            self._observe(op, "settle", event, result, t_run, t_sent)

    def _committed(self, request: BeginRequest, result: TransitionResult | StoreError) -> None:
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

    def _settled(
        self, request: BeginRequest, settlement: Settlement, result: TransitionResult | StoreError
    ) -> None:
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

    def _observe(  # noqa: PLR0917
        self,
        op: Write,
        operation: str,
        event: Literal["committed", "unknown", "released"],
        result: TransitionResult | StoreError,
        t_run: float,
        t_sent: float,
    ) -> None:
        observer = self.observer
        assert observer is not None
        if isinstance(result, StoreError):
            observer.store_operation(operation, time.perf_counter() - t_sent, result)
            return
        observer.store_operation(operation, time.perf_counter() - t_sent, None)
        if result is TransitionResult.OK or result is TransitionResult.RECREATED:
            observer.call_event(
                event, op.request.tool, op.request.tool_call_id, attempt=op.attempt, duration_s=t_sent - t_run
            )

    # -- the operator's verdict ----------------------------------------------------------------
    def resolved(self, tool_call_id: str, verdict: Status | Settlement, result: TransitionResult) -> None:
        log.warning(
            "airlock_redis: operator resolved tool_call_id=%r as %s: %s",
            tool_call_id,
            verdict.value,
            result.value,
        )
        if self.observer is not None:
            self.observer.call_event("resolved", "", tool_call_id, reason=verdict.value)
