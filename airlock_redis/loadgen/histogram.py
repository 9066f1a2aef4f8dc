"""A latency histogram with logarithmic buckets (about 1% wide): small, mergeable across
processes, and precise enough for percentiles."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

_GROWTH = 1.01  # each bucket is 1% wider than the one before
_LOG_GROWTH = math.log(_GROWTH)
_FLOOR_US = 1.0  # everything below 1 us falls into bucket 0


@dataclass
class Histogram:
    """Counts of latencies (seconds in, microseconds inside) by bucket."""

    counts: dict[int, int] = field(default_factory=dict)
    total: int = 0
    max_us: float = 0.0
    min_us: float = math.inf
    sum_us: float = 0.0

    @staticmethod
    def bucket_of(us: float) -> int:
        if us <= _FLOOR_US:
            return 0
        return int(math.log(us / _FLOOR_US) / _LOG_GROWTH) + 1

    @staticmethod
    def upper_bound_us(bucket: int) -> float:
        """The largest latency (us) that falls in ``bucket``."""
        return _FLOOR_US * _GROWTH**bucket

    def record(self, seconds: float) -> None:
        us = seconds * 1e6
        bucket = self.bucket_of(us)
        self.counts[bucket] = self.counts.get(bucket, 0) + 1
        self.total += 1
        self.sum_us += us
        self.max_us = max(self.max_us, us)
        self.min_us = min(self.min_us, us)

    def merge(self, other: Histogram) -> None:
        for bucket, count in other.counts.items():
            self.counts[bucket] = self.counts.get(bucket, 0) + count
        self.total += other.total
        self.sum_us += other.sum_us
        self.max_us = max(self.max_us, other.max_us)
        self.min_us = min(self.min_us, other.min_us)

    def percentile_us(self, p: float) -> float:
        """The latency (us) under which ``p`` percent of the calls finished (0 when empty)."""
        if self.total == 0:
            return 0.0
        rank = max(1, math.ceil(self.total * p / 100.0))
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return min(self.upper_bound_us(bucket), self.max_us)
        return self.max_us

    @property
    def mean_us(self) -> float:
        return self.sum_us / self.total if self.total else 0.0

    def buckets(self) -> Iterator[tuple[float, int]]:
        """(upper bound in us, count) for each non-empty bucket, in order."""
        for bucket in sorted(self.counts):
            yield self.upper_bound_us(bucket), self.counts[bucket]

    def to_json(self) -> dict[str, object]:
        return {
            "count": self.total,
            "min_us": self.min_us if self.total else 0.0,
            "mean_us": self.mean_us,
            "max_us": self.max_us,
            "buckets": [[round(bound, 3), count] for bound, count in self.buckets()],
        }
