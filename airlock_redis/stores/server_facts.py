"""What the store needs to know about the server(s) it writes to, read once.

- The eviction policy of every primary: with ``allkeys-*`` or ``volatile-*`` Redis may delete a record
  under memory pressure (every record has a TTL, so volatile-* policies can pick them too), and a
  deleted record lets the next retry run the tool again.
- The version (WAITAOF exists from Redis 7.2) and whether the primary writes an append-only file.

INFO is used rather than CONFIG GET because managed services often disable CONFIG.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("airlock_redis")

WAITAOF_SINCE = (7, 2, 0)
DEFAULT_MAX_BULK = 512 * 1024 * 1024  # Redis' default proto-max-bulk-len: the largest argument taken


def evicts_records(policy: str) -> bool:
    """True for the policies that may delete keys with a TTL (every record has one)."""
    return policy.startswith(("allkeys-", "volatile-"))


def parse_version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass(frozen=True)
class ServerFacts:
    """Per-primary facts; ``nodes`` maps a node name ("host:port", or "server") to its INFO."""

    versions: dict[str, tuple[int, ...]] = field(default_factory=dict)
    eviction_policies: dict[str, str] = field(default_factory=dict)
    aof_enabled: dict[str, bool] = field(default_factory=dict)

    @property
    def evicting_nodes(self) -> dict[str, str]:
        return {node: p for node, p in self.eviction_policies.items() if evicts_records(p)}

    @property
    def has_waitaof(self) -> bool:
        """WAITAOF on every primary (Redis 7.2+)."""
        return bool(self.versions) and all(v >= WAITAOF_SINCE for v in self.versions.values())

    @property
    def all_aof(self) -> bool:
        return bool(self.aof_enabled) and all(self.aof_enabled.values())

    def eviction_warning(self) -> str | None:
        evicting = self.evicting_nodes
        if not evicting:
            return None
        where = ", ".join(f"{node} ({policy})" for node, policy in sorted(evicting.items()))
        return (
            f"maxmemory-policy can evict effect records on {where}: an evicted record lets a retry run "
            "its tool again. Set maxmemory-policy noeviction for the database that holds the records."
        )


def facts_from_info(per_node: dict[str, dict[str, Any]]) -> ServerFacts:
    versions: dict[str, tuple[int, ...]] = {}
    policies: dict[str, str] = {}
    aof: dict[str, bool] = {}
    for node, info in per_node.items():
        if "redis_version" in info:
            versions[node] = parse_version(str(info["redis_version"]))
        if "maxmemory_policy" in info:
            policies[node] = _text(info["maxmemory_policy"])
        if "aof_enabled" in info:
            aof[node] = str(info["aof_enabled"]) == "1"
    return ServerFacts(versions, policies, aof)


def per_node(reply: Any, is_cluster: bool) -> dict[str, dict[str, Any]]:
    """INFO's reply as {node: info}: a cluster client answers per node, a plain client with one dict."""
    if is_cluster and isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()):
        return {_text(k): v for k, v in reply.items()}
    return {"server": reply}


def merge_info(*replies: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for reply in replies:
        for node, info in reply.items():
            merged.setdefault(node, {}).update(info)
    return merged


def max_bulk_of(reply: Any) -> int:
    """The smallest ``proto-max-bulk-len`` in a CONFIG GET reply (one server's, or a Cluster's per
    node), or Redis' default when the reply names none."""
    found: list[int] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                if _text(name) == "proto-max-bulk-len" and _text(item).isdigit():
                    found.append(int(_text(item)))
                else:
                    walk(item)

    walk(reply)
    return min(found) if found else DEFAULT_MAX_BULK


def report(facts: ServerFacts, where: str) -> None:
    warning = facts.eviction_warning()
    if warning is not None:
        log.warning("airlock_redis: %s: %s", where, warning)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
