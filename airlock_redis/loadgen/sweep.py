"""A load sweep: the same run at several process counts (or several concurrency levels, the other
options fixed), to see how throughput and tail latency grow with the load (the figures a sizing
needs; against concurrency in the asyncio mode, what auto-pipelining gains). Each point is one full
:func:`run_bench` run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .stats import BenchSummary, auto_pipeline_of, lanes_word
from .workers import BenchConfig, run_bench

# what a sweep may vary (a field of BenchConfig and of SweepPoint) -> what its values are called
SWEPT = {"processes": "process counts", "concurrency": "concurrency levels"}


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
    mode: str = "threads"
    auto_pipeline: bool | None = None  # None: not applicable (threads mode)
    write_behind: bool = False
    lease: bool = True
    duplicates: int = 0  # calls that retried an earlier id
    waited: int = 0  # calls that waited for a running attempt of their id
    waited_replayed: int = 0  # ... and then replayed its value

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
            mode=summary.mode,
            auto_pipeline=auto_pipeline_of(summary.config),
            write_behind=summary.write_behind,
            lease=summary.lease,
            duplicates=summary.report.duplicates,
            waited=summary.waited()["total"],
            waited_replayed=summary.waited()["replayed"],
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_counts(text: str, option: str = "--sweep", over: str = "processes") -> list[int]:
    """``"1,2,4,8"`` as [1, 2, 4, 8]; ValueError (naming ``option``) for anything but positive
    integers."""
    what = SWEPT[over]
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} takes {what} separated by commas, like 1,2,4,8, not {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise ValueError(f"{option} takes positive {what}, like 1,2,4,8, not {text!r}")
    return counts


def sweep(
    config: BenchConfig,
    counts: Sequence[int],
    target: str,
    on_point: Callable[[SweepPoint], None] | None = None,
    *,
    over: str = "processes",
) -> list[SweepPoint]:
    """Run ``config`` once per value in ``counts`` of its field ``over`` (``processes`` or
    ``concurrency``), each run with its own run id and its keys removed."""
    if over not in SWEPT:
        raise ValueError(f"a sweep varies one of {', '.join(SWEPT)}, not {over!r}")
    points = []
    for count in counts:
        run_config = BenchConfig(**{**asdict(config), over: count, "run_id": ""})
        point = SweepPoint.of(run_bench(run_config, target))
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def sweep_rows(points: Sequence[SweepPoint]) -> list[list[str]]:
    """The sweep as table rows, a header first."""
    lanes = lanes_word(points[0].mode) if points else "threads"
    rows = [
        [
            f"processes x {lanes}",
            "calls/s",
            "p50 ms",
            "p99 ms",
            "Redis us/call",
            "Redis CPU us/call",
            "B/record",
        ]
    ]
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
