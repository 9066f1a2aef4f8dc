"""How long each status is kept, shared by every store."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.records import Status

DAY = 86_400
DEFAULT_COMMITTED_TTL = DAY
DEFAULT_PENDING_TTL = 7 * DAY
DEFAULT_UNKNOWN_TTL = 7 * DAY


@dataclass(frozen=True, slots=True)
class StatusTTLs:
    """Seconds a record lives in each status.

    An in-doubt record (pending, unknown) is kept longer than a committed one: forgetting it early
    lets a retry run a second time.
    """

    committed: float = DEFAULT_COMMITTED_TTL
    pending: float = DEFAULT_PENDING_TTL
    unknown: float = DEFAULT_UNKNOWN_TTL

    def __post_init__(self) -> None:
        for name in ("committed", "pending", "unknown"):
            seconds = getattr(self, name)
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
                raise ValueError(f"{name}_ttl must be a positive number of seconds, not {seconds!r}")

    def seconds(self, status: Status) -> float:
        return float(getattr(self, status.value))

    def millis(self, status: Status) -> int:
        return max(1, round(self.seconds(status) * 1000))
