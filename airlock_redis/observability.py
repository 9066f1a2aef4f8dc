"""Metrics and structured log events for the guard: opt in with ``EffectGuard(observer=Observer())``.

With no observer the guard holds ``None`` and does no work for any of this. With one, each event
becomes a counter increment (and, for timed events, a histogram sample) through OpenTelemetry's
metrics API when it is installed (``pip install airlock-redis[otel]``), plus one log record on the
``airlock_redis.events`` logger whose ``extra`` fields carry the event.

Instruments (every one has the attribute ``tool``, except the store ones, which have ``operation``):

| name | kind | attributes |
|---|---|---|
| airlock.calls.started | counter | tool, attempt_kind (first, rerun) |
| airlock.calls.committed | counter | tool, stored (true/false) |
| airlock.calls.replayed | counter | tool |
| airlock.calls.refused | counter | tool, reason |
| airlock.calls.unknown | counter | tool |
| airlock.calls.released | counter | tool |
| airlock.records.resolved | counter | tool, verdict, result |
| airlock.store.errors | counter | operation |
| airlock.call.duration | histogram (s) | tool, outcome (committed, unknown, released) |
| airlock.store.duration | histogram (s) | operation |

tool_call_ids and idempotency keys appear in log events only, never as metric attributes (their
cardinality is unbounded).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Protocol

from ._version import __version__

EventName = Literal[
    "started", "committed", "replayed", "refused", "unknown", "released", "resolved", "waited", "probed"
]
EVENT_LOGGER = "airlock_redis.events"


class GuardObserver(Protocol):
    """What the guard reports. Implementations must not raise."""

    def call_event(
        self,
        event: EventName,
        tool: str,
        tool_call_id: str | None,
        *,
        reason: str | None = None,
        attempt: int | None = None,
        duration_s: float | None = None,
        stored: bool | None = None,
    ) -> None: ...

    def store_operation(
        self, operation: str, duration_s: float | None, error: BaseException | None
    ) -> None: ...


class _Instruments:
    """The OpenTelemetry instruments, made once per observer."""

    def __init__(self, meter: Any) -> None:
        self.counters = {
            name: meter.create_counter(f"airlock.calls.{name}", unit="{call}", description=text)
            for name, text in (
                ("started", "tool calls that began running"),
                ("committed", "tool calls recorded committed"),
                ("replayed", "calls answered with a stored result, the tool not run"),
                ("refused", "calls refused, by reason"),
                ("unknown", "calls recorded unknown (effect in doubt)"),
                ("released", "calls released after an error (may run again)"),
                ("waited", "calls that waited for a running attempt of their id, then went on"),
                ("probed", "calls in doubt whose tool's probe was asked, by verdict"),
            )
        }
        self.counters["resolved"] = meter.create_counter(
            "airlock.records.resolved", unit="{record}", description="operator verdicts on records"
        )
        self.store_errors = meter.create_counter(
            "airlock.store.errors", unit="{error}", description="store operations that failed"
        )
        self.call_duration = meter.create_histogram(
            "airlock.call.duration", unit="s", description="time the tool body ran, by outcome"
        )
        self.store_duration = meter.create_histogram(
            "airlock.store.duration", unit="s", description="latency of store operations"
        )


def _default_meter(meter_provider: Any | None) -> Any | None:
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    if meter_provider is not None:
        return meter_provider.get_meter("airlock_redis", __version__)
    return metrics.get_meter("airlock_redis", __version__)


class Observer:
    """Counts and times guard events through OpenTelemetry (when installed) and logs each one.

    ``meter`` or ``meter_provider`` choose where metrics go (default: the global provider);
    ``metrics=False`` turns them off, ``logger=None`` turns log events off.
    """

    def __init__(
        self,
        *,
        meter: Any | None = None,
        meter_provider: Any | None = None,
        metrics: bool = True,
        logger: logging.Logger | None = logging.getLogger(EVENT_LOGGER),  # noqa: B008
        log_level: int = logging.INFO,
    ) -> None:
        if metrics and meter is None:
            meter = _default_meter(meter_provider)
        self._instruments = _Instruments(meter) if metrics and meter is not None else None
        self._logger = logger
        self._log_level = log_level

    @property
    def metrics_enabled(self) -> bool:
        return self._instruments is not None

    def call_event(
        self,
        event: EventName,
        tool: str,
        tool_call_id: str | None,
        *,
        reason: str | None = None,
        attempt: int | None = None,
        duration_s: float | None = None,
        stored: bool | None = None,
    ) -> None:
        try:
            self._count(event, tool, reason=reason, attempt=attempt, duration_s=duration_s, stored=stored)
            if self._logger is not None:
                level = logging.WARNING if event in ("refused", "unknown") else self._log_level
                if self._logger.isEnabledFor(level):
                    fields = {
                        "airlock_event": event,
                        "airlock_tool": tool,
                        "airlock_tool_call_id": tool_call_id,
                        "airlock_reason": reason,
                        "airlock_attempt": attempt,
                        "airlock_duration_s": duration_s,
                    }
                    detail = f" reason={reason}" if reason else ""
                    self._logger.log(
                        level,
                        "airlock %s tool=%s tool_call_id=%r%s",
                        event,
                        tool,
                        tool_call_id,
                        detail,
                        extra=fields,
                    )
        except Exception:  # an observer never breaks a tool call
            logging.getLogger(__name__).debug("observer failed", exc_info=True)

    def _count(
        self,
        event: EventName,
        tool: str,
        *,
        reason: str | None,
        attempt: int | None,
        duration_s: float | None,
        stored: bool | None,
    ) -> None:
        instruments = self._instruments
        if instruments is None:
            return
        attributes: dict[str, Any] = {"tool": tool}
        if event in ("refused", "resolved", "probed"):
            if reason is not None:
                key = "reason" if event == "refused" else "verdict"
                attributes[key] = reason
        elif event == "started":
            attributes["attempt_kind"] = "first" if (attempt or 1) <= 1 else "rerun"
        elif event == "committed" and stored is not None:
            attributes["stored"] = "true" if stored else "false"
        instruments.counters[event].add(1, attributes)
        if duration_s is not None and event in ("committed", "unknown", "released"):
            instruments.call_duration.record(duration_s, {"tool": tool, "outcome": event})

    def store_operation(self, operation: str, duration_s: float | None, error: BaseException | None) -> None:
        try:
            instruments = self._instruments
            if instruments is not None:
                if error is not None:
                    instruments.store_errors.add(1, {"operation": operation})
                if duration_s is not None:
                    instruments.store_duration.record(duration_s, {"operation": operation})
            if error is not None and self._logger is not None:
                self._logger.warning(
                    "airlock store_error operation=%s error=%s",
                    operation,
                    type(error).__name__,
                    extra={"airlock_event": "store_error", "airlock_operation": operation},
                )
        except Exception:
            logging.getLogger(__name__).debug("observer failed", exc_info=True)
