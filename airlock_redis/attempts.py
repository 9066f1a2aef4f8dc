"""One attempt's state, what a guarded call produced, and how each step is reported.

Reporting means a log line, plus metrics and events when the guard has an observer; with none,
nothing is measured.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from .core import refusals
from .core.errors import CorruptRecordError, StoreError
from .core.gates import Plan
from .core.records import BeginRequest, Settlement, Status, TransitionResult
from .observability import GuardObserver

T = TypeVar("T")

log = logging.getLogger("airlock_redis")

Effect = Literal["executed", "replayed", "unguarded", "nested"]


@dataclass(frozen=True, slots=True)
class Execution(Generic[T]):
    """What a guarded call produced, and how."""

    value: T
    # executed: the tool ran; replayed: the stored value; unguarded: ran without a record (no id);
    # nested: ran inside the guarded body of the same tool_call_id, covered by that call's record
    effect: Effect
    tool_call_id: str | None
    idempotency_key: str | None
    attempt: int = 0


@dataclass(slots=True)
class Started:
    """An attempt that owns its record and runs the tool."""

    plan: Plan
    request: BeginRequest
    attempt: int
    t0: float = 0.0  # perf_counter when the tool started (only measured with an observer)


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

    def committed(self, started: Started, result: TransitionResult | StoreError, t0: float = 0.0) -> None:
        if self.observer is not None:
            self._end(started, "commit", "committed", result, t0)
        request = started.request
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

    def settled(
        self,
        started: Started,
        settlement: Settlement,
        result: TransitionResult | StoreError,
        t0: float = 0.0,
    ) -> None:
        if self.observer is not None:
            event: Literal["unknown", "released"] = (
                "released" if settlement is Settlement.RELEASE else "unknown"
            )
            self._end(started, "settle", event, result, t0)
        request = started.request
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

    def _end(
        self,
        started: Started,
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
            request = started.request
            observer.call_event(
                event, request.tool, request.tool_call_id, attempt=started.attempt, duration_s=t0 - started.t0
            )
