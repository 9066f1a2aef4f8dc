"""Redis key names for call records.

``<namespace>:{<tag>}:<tool_call_id>``: the tag is a digest of the id, so every key of one call
shares one Cluster slot whatever characters the id holds (braces included), and calls spread
evenly over the slots.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

DEFAULT_NAMESPACE = "airlock:effect"
_TAG_HEX = 16


def check_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or not namespace:
        raise ValueError("the namespace must be a non-empty string")
    if "{" in namespace or "}" in namespace:
        raise ValueError(
            f"the namespace {namespace!r} may not hold '{{' or '}}': they would break Cluster slotting"
        )
    if any(c in namespace for c in "*?[]\\"):
        raise ValueError(f"the namespace {namespace!r} may not hold glob characters (* ? [ ] \\)")
    return namespace


def slot_tag(tool_call_id: str) -> str:
    return hashlib.sha256(tool_call_id.encode("utf-8")).hexdigest()[:_TAG_HEX]


@lru_cache(maxsize=4096)  # begin and commit of one call name the same key
def record_key(namespace: str, tool_call_id: str) -> bytes:
    return f"{namespace}:{{{slot_tag(tool_call_id)}}}:{tool_call_id}".encode()


def record_pattern(namespace: str) -> str:
    """A SCAN pattern that matches every record of the namespace."""
    return f"{namespace}:{{*}}:*"


def tool_call_id_of(namespace: str, key: bytes | str) -> str:
    text = key.decode("utf-8") if isinstance(key, bytes) else key
    prefix_len = len(namespace) + 2 + _TAG_HEX + 2  # "<ns>:{" + tag + "}:"
    return text[prefix_len:]
