"""A load sweep: the same run at several process counts, to see how throughput and tail latency grow
with the load (the figures a sizing needs). Each point is one full :func:`run_bench` run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .stats import BenchSummary
from .workers import BenchConfig, run_bench


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep, reduced to what the sizing table shows."""

    processes: int
    concurrency: int
    calls: int
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    server_us_per_call: float | None
    server_cpu_us_per_call: float | None
    memory_per_record_bytes: float | None
    duplicate_executions: int

    @classmethod
    def of(cls, summary: BenchSummary) -> SweepPoint:
        latency = summary.latency()
        return cls(
            processes=int(summary.config["processes"]),
            concurrency=int(summary.config["concurrency"]),
            calls=summary.report.calls,
            calls_per_s=summary.calls_per_s,
            p50_ms=latency["p50_us"] / 1000,
            p99_ms=latency["p99_us"] / 1000,
            server_us_per_call=summary.server_us_per_call,
            server_cpu_us_per_call=summary.server_cpu_us_per_call,
            memory_per_record_bytes=summary.memory_per_record_bytes,
            duplicate_executions=summary.duplicate_executions,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_counts(text: str) -> list[int]:
    """``"1,2,4,8"`` as [1, 2, 4, 8]; ValueError for anything but positive integers."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"--sweep takes process counts separated by commas, like 1,2,4,8, not {text!r}"
        ) from None
    if not counts or any(n < 1 for n in counts):
        raise ValueError(f"--sweep takes positive process counts, like 1,2,4,8, not {text!r}")
    return counts


def sweep(
    config: BenchConfig,
    process_counts: Sequence[int],
    target: str,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """Run ``config`` once per process count (each run with its own run id and its keys removed)."""
    points = []
    for processes in process_counts:
        run_config = BenchConfig(**{**asdict(config), "processes": processes, "run_id": ""})
        point = SweepPoint.of(run_bench(run_config, target))
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def sweep_rows(points: Sequence[SweepPoint]) -> list[list[str]]:
    """The sweep as table rows, a header first."""
    rows = [["processes", "calls/s", "p50 ms", "p99 ms", "Redis us/call", "Redis CPU us/call", "B/record"]]
    for p in points:
        rows.append(
            [
                f"{p.processes} x {p.concurrency}",
                f"{p.calls_per_s:,.0f}",
                f"{p.p50_ms:.2f}",
                f"{p.p99_ms:.2f}",
                _fmt(p.server_us_per_call, ".1f"),
                _fmt(p.server_cpu_us_per_call, ".1f"),
                _fmt(p.memory_per_record_bytes, ".0f"),
            ]
        )
    return rows


def sweep_table(points: Sequence[SweepPoint]) -> str:
    """:func:`sweep_rows` as aligned plain text."""
    rows = sweep_rows(points)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
