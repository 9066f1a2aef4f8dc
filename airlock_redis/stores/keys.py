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


@lru_cache(maxsize=4096)  # claim and unclaim of one call name the same key
def index_key(namespace: str, idempotency_key: str) -> bytes:
    """The key of ``idempotency_key``'s index entry (``EffectGuard(dedupe=...)``): which
    tool_call_id holds that business call now. ``<namespace>:{<tag>}k:<key>``: ``}k:`` where a record
    has ``}:``, so it is never taken for a record (:func:`tool_call_id_of`) and the ACL key pattern
    covers it; its tag is the key's digest, so it lives in a slot of its own, not its holder's."""
    return f"{namespace}:{{{slot_tag(idempotency_key)}}}k:{idempotency_key}".encode()


def record_prefix(namespace: str) -> str:
    """What every record key of the namespace begins with, and no key of another namespace: a
    namespace holds no ``{``, so ``acme:{`` never begins a key of ``acme:eu`` (``acme:eu:{...``)."""
    return f"{namespace}:{{"


def record_pattern(namespace: str) -> str:
    """A SCAN pattern that matches every record of the namespace (and of no other namespace)."""
    return f"{record_prefix(namespace)}{'?' * _TAG_HEX}}}:*"


def acl_key_pattern(namespace: str) -> str:
    """The Redis ACL key pattern (``~`` and this) that covers exactly the namespace's records:
    ``acme:{*`` matches no key of ``acme:eu``, where ``acme:*`` would (docs/security.md)."""
    return f"{record_prefix(namespace)}*"


def tool_call_id_of(namespace: str, key: bytes | str) -> str | None:
    """The tool_call_id whose record key in ``namespace`` is ``key``; None when ``key`` is no record
    key of that namespace (a key of another namespace, even one that begins the same way, or one
    whose tag is not its id's digest).

    Read from the left: the namespace is known and holds no ``{``, and the tag has a fixed length, so
    whatever follows ``<namespace>:{<tag>}:`` is the id, ``:{<16 hex digits>}:`` and braces included.
    """
    if isinstance(key, bytes):
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            return None  # record_key encodes the id as UTF-8: this key is not one
    else:
        text = key
    prefix = record_prefix(namespace)
    if not text.startswith(prefix):
        return None
    tag_end = len(prefix) + _TAG_HEX
    if text[tag_end : tag_end + 2] != "}:":
        return None
    tool_call_id = text[tag_end + 2 :]
    if slot_tag(tool_call_id) != text[len(prefix) : tag_end]:
        return None
    return tool_call_id
