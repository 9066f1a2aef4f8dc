"""Turning the scripts' raw replies into typed results (pure, shared by sync and async paths)."""

from __future__ import annotations

from typing import Any

from ..core.errors import CorruptRecordError, StoreError
from ..core.records import RELEASED, BeginKind, BeginOutcome, Record, Status, TransitionResult


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
        key = _text(reply[5]) if len(reply) > 5 else ""
        return BeginOutcome(kind, attempt, tool=tool or None, idempotency_key=key or None)
    return BeginOutcome(kind, attempt)


def parse_transition(reply: Any) -> TransitionResult:
    try:
        return TransitionResult(_text(reply))
    except ValueError:
        raise StoreError(f"unexpected reply from a transition script: {reply!r}") from None


def parse_record(tool_call_id: str, fields: dict[Any, Any], pttl: int) -> Record | None:
    if not fields:
        return None
    data = {_text(k): v for k, v in fields.items()}
    if _text(data.get("status", b"")) == RELEASED:
        return None  # a tombstone: no record
    try:
        status = Status(_text(data.get("status", b"")))
    except ValueError:
        raise CorruptRecordError(
            f"the record of {tool_call_id!r} holds an unknown status {data.get('status')!r}"
        ) from None

    def number(name: str) -> int | None:
        raw = data.get(name)
        text = _text(raw) if raw is not None else ""
        return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None

    stored = _text(data.get("stored", b"0")) == "1"
    return Record(
        tool_call_id=tool_call_id,
        status=status,
        idempotency_key=_text(data.get("key", b"")),
        tool=_text(data.get("tool", b"")),
        owner=_text(data.get("owner", b"")),
        attempt=number("attempt") or 0,
        value=data.get("value") if stored else None,
        stored=stored,
        mac=_bytes_or_none(data.get("mac")),
        begun_ms=number("begun"),
        committed_ms=number("committed"),
        ttl_ms=pttl if pttl >= 0 else None,
    )
