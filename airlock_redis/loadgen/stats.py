"""What each worker counts, and the figures of a whole run (merged, with the verdict)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .histogram import Histogram

TIMELINE_STEP = 0.1  # seconds per throughput bucket
# how a worker process makes its concurrent calls: threads making blocking calls, or coroutines on
# one event loop awaiting async calls (the only mode where the store's auto-pipelining applies)
MODES = ("threads", "asyncio")
NOT_APPLICABLE = "not applicable (threads make blocking calls, always sent one by one)"


def lanes_word(mode: str) -> str:
    """What one of a process's concurrent lanes of calls is in ``mode``: ``threads`` or ``coroutines``."""
    return "coroutines" if mode == "asyncio" else "threads"


def auto_pipeline_of(config: dict[str, Any]) -> bool | None:
    """Whether the run's store auto-pipelined: True or False in the asyncio mode, None (not
    applicable) in the threads mode."""
    if config.get("mode", "threads") != "asyncio":
        return None
    return bool(config.get("auto_pipeline", True))


def write_behind_of(config: dict[str, Any]) -> bool:
    """Whether the run's store sent its commits write-behind (off for a configuration that does not
    say: an older caller's)."""
    return bool(config.get("write_behind", False))


def lease_of(config: dict[str, Any]) -> bool:
    """Whether the run's guard gave each attempt a lease (the default; on for a configuration that does
    not say)."""
    return bool(config.get("lease", True))


def on_off(value: bool) -> str:
    return "on" if value else "off"


def mode_text(config: dict[str, Any]) -> str:
    """The modes of a run in a few words, for titles: ``threads, write-behind off, lease on``, or
    ``asyncio, auto-pipelining on, write-behind off, lease on``."""
    pipelined = auto_pipeline_of(config)
    words = [str(config.get("mode", "threads"))]
    if pipelined is not None:
        words.append(f"auto-pipelining {on_off(pipelined)}")
    words.append(f"write-behind {on_off(write_behind_of(config))}")
    words.append(f"lease {on_off(lease_of(config))}")
    return ", ".join(words)


def auto_pipeline_text(value: bool | None) -> str:
    """:func:`auto_pipeline_of` as the report prints it."""
    return NOT_APPLICABLE if value is None else str(value).lower()


@dataclass
class WorkerReport:
    """The tallies of one thread, one process, or (merged) the whole run."""

    calls: int = 0  # guarded calls made
    executed: int = 0  # the tool body ran
    replayed: int = 0  # the stored value came back; the body did not run
    refusals: Counter[str] = field(default_factory=Counter)  # by reason
    errors: Counter[str] = field(default_factory=Counter)  # by exception type (not refusals)
    histogram: Histogram = field(default_factory=Histogram)
    timeline: Counter[int] = field(default_factory=Counter)  # completions per TIMELINE_STEP (absolute)
    ids: set[str] = field(default_factory=set)  # distinct tool_call_ids used
    runs: Counter[str] = field(default_factory=Counter)  # real executions by tool_call_id
    slots: Counter[int] = field(default_factory=Counter)  # calls by the Cluster slot of their record
    duplicates: int = 0  # calls that retried an earlier tool_call_id (the duplicate rate's share)
    # calls that waited for a running attempt of their id (the guard's "waited" event), by what they
    # got: replayed, executed, refused:<reason>, error:<type>
    waits: Counter[str] = field(default_factory=Counter)
    failure: str | None = None  # a worker that could not run says why

    def merge(self, other: WorkerReport) -> None:
        self.calls += other.calls
        self.executed += other.executed
        self.replayed += other.replayed
        self.refusals.update(other.refusals)
        self.errors.update(other.errors)
        self.histogram.merge(other.histogram)
        self.timeline.update(other.timeline)
        self.ids |= other.ids
        self.runs.update(other.runs)
        self.slots.update(other.slots)
        self.duplicates += other.duplicates
        self.waits.update(other.waits)
        if other.failure and not self.failure:
            self.failure = other.failure


@dataclass(frozen=True)
class PrimaryLoad:
    """How much of a Cluster run one primary took: the guarded calls whose record lives in its slots,
    the records it holds at the end, and their mean MEMORY USAGE (SAMPLES 0) over a sample."""

    node: str  # host:port
    calls: int
    records: int
    memory_per_record_bytes: float | None
    memory_sampled_records: int


@dataclass
class BenchSummary:
    """Every figure of a run. ``failed`` is True when a non-reversible call ran twice."""

    config: dict[str, Any]
    target: str
    elapsed_s: float
    report: WorkerReport
    reversible_ids: set[str]
    memory_per_record_bytes: float | None
    memory_sampled_records: int
    records: int
    primaries: list[PrimaryLoad] = field(default_factory=list)  # a Cluster's primaries; else empty
    # server CPU per guarded call: inside commands (INFO commandstats) and the whole process (INFO cpu)
    server_us_per_call: float | None = None
    server_cpu_us_per_call: float | None = None

    @property
    def mode(self) -> str:
        """``threads`` or ``asyncio``: how the worker processes made their calls."""
        return str(self.config.get("mode", "threads"))

    @property
    def auto_pipeline(self) -> bool | None:
        """Whether the store auto-pipelined (asyncio mode); None in the threads mode."""
        return auto_pipeline_of(self.config)

    @property
    def write_behind(self) -> bool:
        """Whether the store sent its commits write-behind."""
        return write_behind_of(self.config)

    @property
    def lease(self) -> bool:
        """Whether the guard gave each attempt a lease (a duplicate of a running call then waits)."""
        return lease_of(self.config)

    def waited(self) -> dict[str, int]:
        """The calls that waited for a running attempt, by what they got: ``replayed``,
        ``refused_in_progress`` (``effect_in_progress``: still running when the wait ended) and
        ``other`` (ran, another refusal, an error), with ``total``."""
        waits = self.report.waits
        replayed = waits.get("replayed", 0)
        in_progress = waits.get("refused:effect_in_progress", 0)
        total = sum(waits.values())
        return {
            "total": total,
            "replayed": replayed,
            "refused_in_progress": in_progress,
            "other": total - replayed - in_progress,
        }

    def waited_text(self) -> str:
        w = self.waited()
        others = ", ".join(
            f"{k} {v}"
            for k, v in sorted(self.report.waits.items())
            if k not in ("replayed", "refused:effect_in_progress")
        )
        return (
            f"{w['total']} (replayed {w['replayed']}, refused effect_in_progress "
            f"{w['refused_in_progress']}, other {w['other']}{f': {others}' if others else ''})"
        )

    @property
    def calls_per_s(self) -> float:
        return self.report.calls / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def executions(self) -> int:
        return sum(self.report.runs.values())

    @property
    def unique_calls(self) -> int:
        return len(self.report.ids)

    @property
    def duplicate_executions(self) -> int:
        """Extra executions of one tool_call_id of a tool that may not run again."""
        return sum(n - 1 for i, n in self.report.runs.items() if n > 1 and i not in self.reversible_ids)

    @property
    def reversible_reruns(self) -> int:
        """Extra executions of reversible tools: allowed by the spec (an in-doubt call runs again)."""
        return sum(n - 1 for i, n in self.report.runs.items() if n > 1 and i in self.reversible_ids)

    @property
    def failed(self) -> bool:
        return self.duplicate_executions > 0

    def throughput(self) -> list[tuple[float, float]]:
        """(seconds since the first completion, calls/s) for each timeline bucket."""
        if not self.report.timeline:
            return []
        first, last = min(self.report.timeline), max(self.report.timeline)
        return [
            ((step - first) * TIMELINE_STEP, self.report.timeline.get(step, 0) / TIMELINE_STEP)
            for step in range(first, last + 1)
        ]

    def latency(self) -> dict[str, float]:
        h = self.report.histogram
        return {
            "p50_us": h.percentile_us(50),
            "p95_us": h.percentile_us(95),
            "p99_us": h.percentile_us(99),
            "max_us": h.max_us,
            "mean_us": h.mean_us,
        }

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "config": self.config,
            "mode": self.mode,
            "auto_pipeline": self.auto_pipeline,  # null: not applicable (threads mode)
            "write_behind": self.write_behind,
            "lease": self.lease,
            "target": self.target,
            "elapsed_s": self.elapsed_s,
            "calls": r.calls,
            "calls_per_s": self.calls_per_s,
            "latency": self.latency(),
            "executed": r.executed,
            "replayed": r.replayed,
            "refusals": dict(r.refusals),
            "refused": sum(r.refusals.values()),
            "errors": dict(r.errors),
            "error_count": sum(r.errors.values()),
            "unique_calls": self.unique_calls,
            "executions": self.executions,
            "duplicate_executions": self.duplicate_executions,
            "reversible_reruns": self.reversible_reruns,
            "duplicates": r.duplicates,
            "waited": {**self.waited(), "by_outcome": dict(sorted(r.waits.items()))},
            "records": self.records,
            "memory_per_record_bytes": self.memory_per_record_bytes,
            "memory_sampled_records": self.memory_sampled_records,
            "server_us_per_call": self.server_us_per_call,
            "server_cpu_us_per_call": self.server_cpu_us_per_call,
            "primaries": [asdict(p) for p in self.primaries],
            "histogram": r.histogram.to_json(),
            "throughput": [[round(t, 3), rate] for t, rate in self.throughput()],
            "verdict": "FAILURE: duplicate executions" if self.failed else "ok",
        }

    def rows(self) -> list[tuple[str, str]]:
        """The figures a person reads first, as (name, value) pairs, in the order of the report."""
        r = self.report
        lat = self.latency()
        refusals = ", ".join(f"{k} {v}" for k, v in sorted(r.refusals.items())) or "none"
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "none"
        memory = (
            f"{self.memory_per_record_bytes:.0f} B (MEMORY USAGE, {self.memory_sampled_records} sampled)"
            if self.memory_per_record_bytes is not None
            else "n/a"
        )
        dup = self.duplicate_executions
        rows = [
            ("mode", self.mode),
            ("auto_pipeline", auto_pipeline_text(self.auto_pipeline)),
            ("write_behind", on_off(self.write_behind)),
            ("lease", on_off(self.lease)),
            ("guarded calls", f"{r.calls} in {self.elapsed_s:.2f} s"),
            ("guarded calls/s", f"{self.calls_per_s:,.0f}"),
            (
                "latency p50/p95/p99/max",
                f"{lat['p50_us'] / 1000:.2f} / {lat['p95_us'] / 1000:.2f} / "
                f"{lat['p99_us'] / 1000:.2f} / {lat['max_us'] / 1000:.2f} ms",
            ),
            ("executed", str(r.executed)),
            ("replays", str(r.replayed)),
            ("refusals", f"{sum(r.refusals.values())} ({refusals})"),
            ("executions vs unique calls", f"{self.executions} / {self.unique_calls}"),
            ("duplicate executions", f"{dup}" + ("  FAILURE" if dup else "  (ok)")),
            ("reversible re-runs (allowed)", str(self.reversible_reruns)),
            ("duplicate calls", str(r.duplicates)),
            ("waited for a running attempt", self.waited_text()),
            ("records in Redis", str(self.records)),
            ("Redis memory per record", memory),
            ("Redis CPU per call", self._server_cpu()),
            ("errors", f"{sum(r.errors.values())} ({errors})"),
        ]
        for load in self.primaries:
            share = f"{load.calls / r.calls:.0%}" if r.calls else "-"
            per_record = (
                f"{load.memory_per_record_bytes:.0f} B/record ({load.memory_sampled_records} sampled)"
                if load.memory_per_record_bytes is not None
                else "memory n/a"
            )
            rows.append(
                (
                    f"primary {load.node}",
                    f"{load.calls} calls ({share}), {load.records} records, {per_record}",
                )
            )
        return rows

    def _server_cpu(self) -> str:
        if self.server_us_per_call is None or self.server_cpu_us_per_call is None:
            return "n/a"
        return (
            f"{self.server_us_per_call:.1f} us in commands (INFO commandstats), "
            f"{self.server_cpu_us_per_call:.1f} us process CPU (INFO cpu)"
        )

    def table(self) -> str:
        """:meth:`rows` as plain ``name  value`` lines, the names padded to one width."""
        rows = self.rows()
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
