"""How long each status is kept, shared by every store."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.records import Status

DAY = 86_400
DEFAULT_COMMITTED_TTL = DAY
DEFAULT_PENDING_TTL = 7 * DAY
DEFAULT_UNKNOWN_TTL = 7 * DAY
# A released record's tombstone (see core.records.RELEASED): long enough for any late request of the
# attempt that gave the record back to have landed or died.
TOMBSTONE_TTL = 3600.0
MIN_TTL = 0.001  # one millisecond: the resolution of Redis' PEXPIRE
MAX_TTL = 10 * 365 * DAY  # ten years: the Lua scripts refuse anything longer, so no record outlives it


def check_seconds(name: str, seconds: object) -> float:
    """``seconds`` as a float, or a ValueError naming the option when it is not a finite number of
    seconds between MIN_TTL and MAX_TTL."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise ValueError(f"{name} must be a number of seconds, not {seconds!r}")
    value = float(seconds)
    if not math.isfinite(value) or not MIN_TTL <= value <= MAX_TTL:
        raise ValueError(
            f"{name} must be a finite number of seconds from {MIN_TTL:g} (1 ms) to {MAX_TTL:g} "
            f"(ten years), not {seconds!r}"
        )
    return value


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
            check_seconds(f"{name}_ttl", getattr(self, name))

    def seconds(self, status: Status) -> float:
        return float(getattr(self, status.value))

    def millis(self, status: Status) -> int:
        return max(1, round(self.seconds(status) * 1000))
