"""Turning the scripts' raw replies into typed results (pure, shared by sync and async paths)."""

from __future__ import annotations

from typing import Any

from ..core.errors import CorruptRecordError, StoreError
from ..core.records import RELEASED, BeginKind, BeginOutcome, Record, RecordVersionError, TransitionResult
from .layout import KEY_HEX, LayoutError, LayoutVersionError, parse, unpack_id


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _bytes_or_none(value: Any) -> bytes | None:
    if value is None or value == b"":
        return None
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def parse_begin(reply: Any) -> BeginOutcome:
    if not isinstance(reply, list) or len(reply) < 2:
        raise StoreError(f"unexpected reply from the begin script: {reply!r}")
    if _text(reply[0]) == "corrupt":
        if len(reply) > 5:  # a record of a newer layout: {"corrupt", 0, false, false, why, version}
            raise RecordVersionError(_text(reply[5]))
        why = _text(reply[4]) if len(reply) > 4 else "the record is malformed"
        raise CorruptRecordError(why)
    if _text(reply[0]) == RELEASED:
        raise StoreError(
            "this attempt already gave its record back; a begin that arrives late records nothing"
        )
    try:
        kind = BeginKind(_text(reply[0]))
    except ValueError:
        raise CorruptRecordError(f"the record holds an unknown status {_text(reply[0])!r}") from None
    attempt = int(reply[1])
    if kind is BeginKind.COMMITTED:
        value = reply[2] if len(reply) > 2 and reply[2] is not None else None
        if isinstance(value, str):
            value = value.encode("utf-8")
        mac = _bytes_or_none(reply[3]) if len(reply) > 3 else None
        return BeginOutcome(kind, attempt, value=value, mac=mac)
    if kind is BeginKind.MISMATCH:
        tool = _text(reply[4]) if len(reply) > 4 else ""
        key = unpack_id(reply[5], KEY_HEX) if len(reply) > 5 and isinstance(reply[5], bytes) else ""
        return BeginOutcome(kind, attempt, tool=tool or None, idempotency_key=key or None)
    if kind is BeginKind.PROBE:
        return BeginOutcome(kind, attempt, found=_text(reply[2]) if len(reply) > 2 else "unknown")
    if kind is BeginKind.RUNNING or kind is BeginKind.ABANDONED:
        lease, since = (int(reply[2]), int(reply[3])) if len(reply) > 3 else (None, None)
        return BeginOutcome(kind, attempt, lease_ms=lease, since_renewal_ms=since)
    return BeginOutcome(kind, attempt)


# a script's reply as the client hands it over (bytes) -> the result: one dict look-up, where
# TransitionResult(text) costs twenty times as much on every commit
_TRANSITIONS: dict[Any, TransitionResult] = {result.value.encode(): result for result in TransitionResult}


def parse_transition(reply: Any) -> TransitionResult:
    """A transition's result; RecordVersionError for resolve's ``{"newer", version}`` (a record of a
    newer layout, left as it is)."""
    result = _TRANSITIONS.get(reply) if isinstance(reply, bytes) else None
    if result is not None:
        return result
    if isinstance(reply, list) and len(reply) == 2 and _text(reply[0]) == "newer":
        raise RecordVersionError(_text(reply[1]))
    try:
        return TransitionResult(_text(reply))  # a client that decodes replies hands over str
    except ValueError:
        raise StoreError(f"unexpected reply from a transition script: {reply!r}") from None


def parse_record(tool_call_id: str, data: bytes | None, pttl: int) -> Record | None:
    """The record a key's string holds (None: no key, or a tombstone); CorruptRecordError when the
    string is not a record."""
    if data is None:
        return None
    try:
        stored = parse(data)
    except LayoutVersionError as exc:
        raise RecordVersionError(exc.version, tool_call_id) from None
    except LayoutError as exc:
        raise CorruptRecordError(f"the record of {tool_call_id!r} is not well formed: {exc}") from None
    status = stored.record_status()
    if status is None:
        return None  # a tombstone: no record
    return Record(
        tool_call_id=tool_call_id,
        status=status,
        idempotency_key=stored.key_text,
        tool=stored.tool_text,
        owner=stored.owner_text,
        attempt=stored.attempt,
        value=stored.value if stored.stored else None,
        stored=stored.stored,
        mac=stored.mac or None,
        begun_ms=stored.begun_ms,
        committed_ms=stored.committed_ms,
        ttl_ms=pttl if pttl >= 0 else None,
        lease_ms=stored.lease_ms,
        since_renewal_ms=since_renewal(stored.ttl_ms, pttl),
    )


def since_renewal(ttl_ms: int | None, pttl: int) -> int | None:
    """Ms since a leased record was last renewed, from the TTL it was written with and its PTTL now
    (the server's clock, as lua/common.lua's ``liveness``); None when it cannot be told (no lease, or
    a TTL changed by hand)."""
    if ttl_ms is None or pttl < 0 or pttl > ttl_ms:
        return None
    return ttl_ms - pttl
