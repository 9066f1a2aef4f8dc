"""An operator's verdict on a record, and the fence that keeps it to the record the operator saw. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from .records import Record, Settlement, Status


def parse_verdict(verdict: Status | Settlement | str) -> Status | Settlement:
    """committed / unknown / release, as the enum the stores take."""
    text = verdict.value if isinstance(verdict, (Status, Settlement)) else str(verdict)
    if text == "committed":
        return Status.COMMITTED
    if text == "unknown":
        return Status.UNKNOWN
    if text == "release":
        return Settlement.RELEASE
    raise ValueError(f"a verdict is committed, unknown or release, not {verdict!r}")


@dataclass(frozen=True, slots=True)
class Fence:
    """What the record must still be for a verdict to apply (None: not checked)."""

    key: str | None = None
    status: Status | None = None
    owner: str | None = None


def fence_on_current(fence: Fence, current: Record | None) -> Fence | None:
    """A forced verdict's fence: the record as it is now (read just before), so that the verdict,
    sent again by the client after a lost reply, cannot land on a record that began since. None: there
    is no record."""
    if current is None:
        return None
    return Fence(fence.key or current.idempotency_key, current.status, current.owner)


def resolve_fence(seen: Record | Fence | None, *, force: bool, expect_key: str | None = None) -> Fence:
    """The fence for a verdict on ``seen`` (the record the operator was shown, or a fence built from
    it), or, with ``force``, on whatever record is there (its key still checked against
    ``expect_key`` when given).

    A verdict with neither is refused: between reading a record and resolving it, the tool may have
    committed, and releasing a committed call lets the next retry run it again."""
    if seen is not None:
        if force:
            raise ValueError("give either seen= (the record you were shown) or force=True, not both")
        if isinstance(seen, Fence):
            return seen
        if expect_key is not None and expect_key != seen.idempotency_key:
            raise ValueError("expect_key differs from the idempotency key of the record in seen=")
        return Fence(seen.idempotency_key, seen.status, seen.owner)
    if not force:
        raise ValueError(
            "a verdict applies to the record you were shown: pass seen=store.get(tool_call_id) as read "
            "before deciding, or force=True to apply it to whatever record is there"
        )
    return Fence(expect_key)
