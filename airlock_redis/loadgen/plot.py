"""The PNG of a run: latency distribution and throughput over time (needs matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .stats import BenchSummary, lanes_word, mode_text

if TYPE_CHECKING:
    from .sweep import SweepPoint


# what a sweep varies -> the label of the plots' x axis
SWEEP_AXES = {"processes": "worker processes", "concurrency": "concurrent calls per process"}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'airlock-redis[plot]'") from None
    return plt


def write_plot(summary: BenchSummary, path: str | Path) -> None:
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    buckets = list(summary.report.histogram.buckets())
    if buckets:
        bounds = [bound / 1000 for bound, _ in buckets]
        counts = [count for _, count in buckets]
        left.step(bounds, counts, where="post", color="tab:blue")
        left.set_xscale("log")
        for name, style in (("p50_us", ":"), ("p95_us", "--"), ("p99_us", "-.")):
            value = summary.latency()[name] / 1000
            left.axvline(value, color="tab:red", linestyle=style, label=f"{name[:3]} {value:.2f} ms")
        left.legend()
    left.set_title("latency of a guarded call")
    left.set_xlabel("ms (log scale)")
    left.set_ylabel("calls per 1% bucket")

    points = summary.throughput()
    if points:
        right.plot([t for t, _ in points], [rate for _, rate in points], color="tab:green")
        right.axhline(summary.calls_per_s, color="grey", linestyle="--", label="mean")
        right.legend()
    right.set_title("throughput")
    right.set_xlabel("seconds")
    right.set_ylabel("guarded calls/s")
    right.set_ylim(bottom=0)
    config = summary.config
    figure.suptitle(
        f"airlock-redis bench ({mode_text(config)}): {config['processes']} processes x "
        f"{config['concurrency']} {lanes_word(summary.mode)}, duplicate rate {config['duplicate_rate']}, "
        f"{config['value_bytes']} B values"
    )
    figure.tight_layout()
    figure.savefig(str(path), dpi=100)
    plt.close(figure)


def write_sweep_plot(
    points: Sequence[SweepPoint], title: str, path: str | Path, *, over: str = "processes"
) -> None:
    """Throughput and p50/p99 latency against what the sweep varied: ``over`` is ``processes`` (the
    number of worker processes) or ``concurrency`` (concurrent calls per process)."""
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    counts = [getattr(p, over) for p in points]
    label = SWEEP_AXES[over]
    left.plot(counts, [p.calls_per_s for p in points], marker="o", color="tab:green")
    left.set_title("throughput")
    left.set_xlabel(label)
    left.set_ylabel("guarded calls/s")
    left.set_ylim(bottom=0)
    right.plot(counts, [p.p50_ms for p in points], marker="o", label="p50", color="tab:blue")
    right.plot(counts, [p.p99_ms for p in points], marker="o", label="p99", color="tab:red")
    right.set_title("latency of a guarded call")
    right.set_xlabel(label)
    right.set_ylabel("ms")
    right.set_ylim(bottom=0)
    right.legend()
    for axis in (left, right):
        if counts and max(counts) >= 16 * min(counts):  # 1, 8, 64, 256: evenly spread, not crowded at 0
            axis.set_xscale("log", base=2)
        axis.set_xticks(counts, [str(count) for count in counts])
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(str(path), dpi=100)
    plt.close(figure)
