"""Which tool_call_ids the guard accepts."""

from __future__ import annotations

from typing import Any

from .errors import InvalidToolCallId

MAX_TOOL_CALL_ID_BYTES = 4096


def usable_tool_call_id(value: Any) -> str | None:
    """Return the id when ``value`` is a usable one, None when there is none.

    None, a non-string and a string that is empty or blank (only whitespace) count as "no id": the
    spec asks for a non-empty string, and a blank one names no call. A string that cannot be stored
    as a key raises :class:`InvalidToolCallId`.
    """
    if not isinstance(value, str) or value == "" or value.isspace():
        return None
    if value.isascii() and len(value) <= MAX_TOOL_CALL_ID_BYTES:
        return value  # the common case: one byte a character, so no lone surrogate and short enough
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidToolCallId("the tool_call_id is not valid Unicode (it holds a lone surrogate)") from None
    if len(encoded) > MAX_TOOL_CALL_ID_BYTES:
        raise InvalidToolCallId(
            f"the tool_call_id is {len(encoded)} bytes long; the limit is {MAX_TOOL_CALL_ID_BYTES}"
        )
    return value


def describe_missing_id(value: Any) -> str:
    if value is None:
        return "the call's context carries no tool_call_id"
    if isinstance(value, str):
        return (
            "the call's tool_call_id is an empty string"
            if value == ""
            else "the call's tool_call_id is blank"
        )
    return f"the call's tool_call_id is a {type(value).__qualname__}, not a string"
