"""Metrics (OpenTelemetry's in-memory reader) and structured log events from EffectGuard(observer=...)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk import metrics as metrics_sdk  # the test extra installs opentelemetry-sdk
from opentelemetry.sdk.metrics import export

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    EffectStore,
    InMemoryEffectStore,
    StoreError,
    tool_call_context,
)
from airlock_redis.core.records import BeginOutcome, BeginRequest
from airlock_redis.observability import EVENT_LOGGER, Observer


class Metrics:
    def __init__(self) -> None:
        self.reader = export.InMemoryMetricReader()
        self.provider = metrics_sdk.MeterProvider(metric_readers=[self.reader])

    def points(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def count(self, name: str, **attributes: Any) -> int:
        return sum(
            int(p.value)
            for p in self.points().get(name, [])
            if all(p.attributes.get(k) == v for k, v in attributes.items())
        )

    def samples(self, name: str, **attributes: Any) -> int:
        return sum(
            int(p.count)
            for p in self.points().get(name, [])
            if all(p.attributes.get(k) == v for k, v in attributes.items())
        )


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def _guarded(guard: EffectGuard, kind: str) -> Callable[..., Any]:
    def charge(account: str, mode: str = "ok") -> str:
        if mode == "timeout":
            raise TimeoutError("lost")
        if mode == "error":
            raise ValueError("declined")
        return f"charged {account}"

    async def acharge(account: str, mode: str = "ok") -> str:
        return charge(account, mode)

    if kind == "sync":
        return guard.wrap(charge)
    wrapped = guard.wrap(acharge)
    return lambda *a, **k: asyncio.run(wrapped(*a, **k))


def _call(tool: Callable[..., Any], tool_call_id: str | None, **kwargs: Any) -> Any:
    with tool_call_context(tool_call_id):
        return tool("acct", **kwargs)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_every_outcome_is_counted(store: EffectStore, metrics: Metrics, kind: str) -> None:
    guard = EffectGuard(store, observer=Observer(meter_provider=metrics.provider))
    tool = _guarded(guard, kind)
    _call(tool, "c1")  # started + committed
    _call(tool, "c1")  # replayed
    with pytest.raises(TimeoutError):
        _call(tool, "c2", mode="timeout")  # started + unknown
    with pytest.raises(EffectRefused):
        _call(tool, "c2", mode="timeout")  # refused effect_status_unknown
    with pytest.raises(ValueError):
        _call(tool, "c3", mode="error")  # started + released
    with pytest.raises(EffectRefused):
        _call(tool, None)  # refused tool_call_id_required (a gate)
    with pytest.raises(EffectRefused):
        _call(tool, "c1", mode="other")  # refused policy_violation
    assert guard.resolve("c2", "release", force=True).value == "ok"

    name = "charge" if kind == "sync" else "acharge"
    assert metrics.count("airlock.calls.started", tool=name) == 3
    assert metrics.count("airlock.calls.committed", tool=name) == 1
    assert metrics.count("airlock.calls.replayed", tool=name) == 1
    assert metrics.count("airlock.calls.unknown", tool=name) == 1
    assert metrics.count("airlock.calls.released", tool=name) == 1
    assert metrics.count("airlock.calls.refused", reason="effect_status_unknown") == 1
    assert metrics.count("airlock.calls.refused", reason="tool_call_id_required") == 1
    assert metrics.count("airlock.calls.refused", reason="policy_violation") == 1
    assert metrics.count("airlock.records.resolved", verdict="release") == 1
    assert metrics.samples("airlock.call.duration", outcome="committed") == 1
    assert metrics.samples("airlock.call.duration", outcome="unknown") == 1
    assert metrics.samples("airlock.call.duration", outcome="released") == 1
    # every begin that reached the store was timed (c1 x3, c2 x2, c3)
    assert metrics.samples("airlock.store.duration", operation="begin") == 6
    assert metrics.samples("airlock.store.duration", operation="commit") == 1
    assert metrics.samples("airlock.store.duration", operation="settle") == 2
    assert metrics.count("airlock.store.errors") == 0
    for points in metrics.points().values():  # ids never become metric attributes
        for point in points:
            assert "tool_call_id" not in point.attributes
            assert not any(v in ("c1", "c2", "c3") for v in point.attributes.values())


class DownStore(InMemoryEffectStore):
    def begin(self, request: BeginRequest) -> BeginOutcome:
        raise StoreError("connection refused")

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        raise StoreError("connection refused")


def test_store_errors_are_counted(metrics: Metrics) -> None:
    guard = EffectGuard(DownStore(), observer=Observer(meter_provider=metrics.provider))
    tool = _guarded(guard, "sync")
    with pytest.raises(EffectRefused) as refused:
        _call(tool, "c1")
    assert refused.value.reason == "store_unavailable"
    assert metrics.count("airlock.store.errors", operation="begin") == 1
    assert metrics.count("airlock.calls.refused", reason="store_unavailable") == 1
    assert metrics.count("airlock.calls.started") == 0


def test_log_events_carry_structured_fields(caplog: pytest.LogCaptureFixture) -> None:
    guard = EffectGuard(observer=Observer(metrics=False))
    tool = _guarded(guard, "sync")
    with caplog.at_level(logging.INFO, logger=EVENT_LOGGER):
        _call(tool, "c1")
        _call(tool, "c1")
        with pytest.raises(TimeoutError):
            _call(tool, "c2", mode="timeout")
    events = [(r.airlock_event, r.airlock_tool_call_id) for r in caplog.records if r.name == EVENT_LOGGER]  # type: ignore[attr-defined]
    assert events == [
        ("started", "c1"),
        ("committed", "c1"),
        ("replayed", "c1"),
        ("started", "c2"),
        ("unknown", "c2"),
    ]
    unknown = next(r for r in caplog.records if getattr(r, "airlock_event", None) == "unknown")
    assert unknown.levelno == logging.WARNING and unknown.airlock_tool == "charge"  # type: ignore[attr-defined]


def test_no_observer_means_no_events(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = EffectGuard()
    assert guard._observer is None
    calls: list[str] = []
    monkeypatch.setattr(Observer, "call_event", lambda *a, **k: calls.append("event"))
    tool = _guarded(guard, "sync")
    with caplog.at_level(logging.DEBUG, logger=EVENT_LOGGER):
        _call(tool, "c1")
        _call(tool, "c1")
    assert calls == []
    assert not [r for r in caplog.records if r.name == EVENT_LOGGER]


def test_a_failing_observer_backend_never_breaks_a_call() -> None:
    class BrokenMeter:
        def create_counter(self, *a: Any, **k: Any) -> Any:
            return self

        def create_histogram(self, *a: Any, **k: Any) -> Any:
            return self

        def add(self, *a: Any, **k: Any) -> None:
            raise RuntimeError("exporter down")

        def record(self, *a: Any, **k: Any) -> None:
            raise RuntimeError("exporter down")

    guard = EffectGuard(observer=Observer(meter=BrokenMeter()))
    tool = _guarded(guard, "sync")
    assert _call(tool, "c1") == "charged acct"
    assert _call(tool, "c1") == "charged acct"
