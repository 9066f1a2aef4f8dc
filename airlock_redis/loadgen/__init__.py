"""The load generator behind ``airlock-redis bench``: worker processes, their statistics, a
mergeable latency histogram, what a terminal shows (progress and the summary, drawn with rich) and
an optional plot."""

from __future__ import annotations

from .histogram import Histogram
from .stats import BenchSummary, WorkerReport
from .workers import BenchConfig, run_bench

__all__ = ["BenchConfig", "BenchSummary", "Histogram", "WorkerReport", "run_bench"]
