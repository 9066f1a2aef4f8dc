"""The permissions check of ``airlock-redis doctor``: may the Redis user run what the store needs
on the keys of its namespace?

It sends each command the store needs (``stores.acl.required_commands()``; with
``--wait-replicas``, WAIT and WAITAOF too) once, harmlessly, on a probe key of ``--namespace`` that
never exists (``SET ... XX`` writes nothing there), on every primary, and reads the reply: NOPERM is a
refusal, any other reply or error means the user may run it. That works for any user, on every Redis
and Valkey version (``ACL GETUSER`` needs admin rights, ``ACL DRYRUN`` is 7.0+).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster

from ..stores.acl import CLUSTER_COMMANDS, DURABILITY_COMMANDS, OPTIONAL_COMMANDS, required_commands
from ..stores.keys import acl_key_pattern, record_key
from ..stores.url import RedisURL, SyncClient
from .doctor_check import Check, Node, Status, server_info

_NO_SUCH_SCRIPT = "0" * 40  # EVALSHA of it answers NOSCRIPT to a user who may run EVALSHA
_PROBE_TRIES = 100_000  # probe ids tried to find a key in each Cluster primary's slots

# One harmless call of each command on the probe key, a key of the namespace that never exists: only
# what the reply says about the user's ACL is read (the command, or the key, refused with NOPERM).
_PROBES: dict[str, Callable[[bytes], tuple[Any, ...]]] = {
    "get": lambda key: ("GET", key),
    "set": lambda key: ("SET", key, b"", "XX", "PX", 1),  # XX: writes nothing where no key is
    "pttl": lambda key: ("PTTL", key),
    "evalsha": lambda key: ("EVALSHA", _NO_SUCH_SCRIPT, 1, key),
    "eval": lambda key: ("EVAL", "return 0", 1, key),
    "ping": lambda key: ("PING",),
    "del": lambda key: ("DEL", key),
    "pexpire": lambda key: ("PEXPIRE", key, 60_000),
    "wait": lambda key: ("WAIT", 0, 1),  # no replica asked for: answers at once
    "waitaof": lambda key: ("WAITAOF", 0, 0, 1),
    "info": lambda key: ("INFO", "server"),
    "config|get": lambda key: ("CONFIG", "GET", "maxmemory-policy"),
    "asking": lambda key: ("ASKING",),  # sent last: the flag it sets lasts one command, on a key
}
# On a Redis Cluster: ASKING precedes a command on a slot being moved to another node (redis-py, and
# the store with wait_replicas). CLUSTER SLOTS and COMMAND are not probed: without them the cluster
# client does not connect, and the reachability check says so.
_CLUSTER_COMMANDS = tuple(command for command in CLUSTER_COMMANDS if command in _PROBES)


def _probe_keys(client: SyncClient, primaries: list[Node], namespace: str) -> dict[str, bytes]:
    """A record key of the namespace that no call uses, per primary (on a Cluster: in its slots)."""
    base = f"airlock-doctor-probe-{secrets.token_hex(8)}"
    if not isinstance(client, RedisCluster):
        return {node.name: record_key(namespace, base) for node in primaries}
    wanted = {node.name for node in primaries}
    keys: dict[str, bytes] = {}
    for i in range(_PROBE_TRIES):
        key = record_key(namespace, f"{base}-{i}")
        owner = client.get_node_from_key(key).name
        if owner in wanted and owner not in keys:
            keys[owner] = key
            if len(keys) == len(wanted):
                break
    return keys


def _refused(reply: Any) -> str | None:
    """ "command" or "key" when the reply is a NOPERM refusal, else None (the user may run it)."""
    if isinstance(reply, redis.exceptions.NoPermissionError):
        return "command" if "to run the" in str(reply) else "key"
    return None


def _unknown_command(reply: Any) -> bool:
    return isinstance(reply, redis.ResponseError) and str(reply).lower().startswith("unknown command")


def _probe(node: Node, key: bytes, commands: tuple[str, ...]) -> dict[str, Any]:
    """Each command's reply (an exception for an error reply), in one round trip."""
    pipe = node.client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*_PROBES[command](key))
    return dict(zip(commands, pipe.execute(raise_on_error=False), strict=True))


def _user_of(parsed: RedisURL) -> str:
    from urllib.parse import urlsplit

    single = urlsplit(parsed.url).username if parsed.kind == "single" else None
    return parsed.username or single or "default"


@dataclass
class _Replies:
    """What the probes found, each command with the primaries it was found on."""

    primaries: int
    refused: dict[str, list[str]] = field(default_factory=dict)  # NOPERM for the command
    on_keys: dict[str, list[str]] = field(default_factory=dict)  # NOPERM for the namespace's keys
    absent: set[str] = field(default_factory=set)  # not on the server (WAITAOF before 7.2)

    def shown(self, found: dict[str, list[str]], among: tuple[str, ...]) -> list[str]:
        """The commands of ``among`` in ``found``, each with its primaries when not on all."""
        names = [c for c in among if c in found]
        if self.primaries == 1:
            return names
        return [c if len(found[c]) == self.primaries else f"{c} (on {', '.join(found[c])})" for c in names]


def _probe_all(
    client: SyncClient,
    primaries: list[Node],
    namespace: str,
    wanted: tuple[str, ...],
    needed: tuple[str, ...],
) -> _Replies:
    keys = _probe_keys(client, primaries, namespace)
    found = _Replies(len(primaries))
    for node in primaries:
        if node.name not in keys:
            continue  # a primary that serves no slot holds no record
        for command, reply in _probe(node, keys[node.name], wanted).items():
            kind = _refused(reply)
            if kind is not None:
                (found.refused if kind == "command" else found.on_keys).setdefault(command, []).append(
                    node.name
                )
            elif _unknown_command(reply):
                found.absent.add(command)
                if command in needed:  # renamed away or disabled: the store cannot run without it
                    found.refused.setdefault(command, []).append(node.name)
    return found


def check_permissions(
    client: SyncClient, primaries: list[Node], parsed: RedisURL, namespace: str, wait_replicas: int
) -> Check:
    needed = required_commands()
    durable = DURABILITY_COMMANDS if wait_replicas > 0 else ()
    cluster = _CLUSTER_COMMANDS if isinstance(client, RedisCluster) else ()
    wanted = tuple(dict.fromkeys((*needed, *durable, *OPTIONAL_COMMANDS, *cluster)))
    unprobed = [c for c in wanted if c not in _PROBES]
    found = _probe_all(client, primaries, namespace, tuple(c for c in wanted if c in _PROBES), needed)
    notes: list[str] = []
    if "waitaof" in found.refused and not _every_primary_has_aof(primaries):
        del found.refused["waitaof"]  # the store sends WAITAOF only where every primary keeps an AOF
        found.absent.add("waitaof")
        notes.append(
            "WAITAOF is refused: the store sends it (with wait_replicas) only where every primary keeps "
            "an append-only file, which is not so now (or INFO is refused); grant +waitaof before "
            "turning appendonly on"
        )
    must = tuple(c for c in needed + durable if c in needed or c not in found.absent)
    if any(c in found.refused or c in found.on_keys for c in must):
        return _refusals(found, must, parsed, namespace)
    if "asking" in found.refused:
        notes.append(
            "ASKING is refused: while a slot moves to another node (resharding), calls on its records "
            "are refused (store_unavailable); grant +asking"
        )
    optional = found.shown(found.refused, OPTIONAL_COMMANDS) + found.shown(found.on_keys, OPTIONAL_COMMANDS)
    if optional:
        notes.append(
            f"refused, and optional: {', '.join(optional)} (the store goes on without them: no warning "
            "about an evicting policy, the default proto-max-bulk-len assumed"
            + (", and no WAITAOF" if durable and "info" in optional else "")
            + ")"
        )
    if unprobed:
        notes.append(f"not checked (doctor has no probe for them): {', '.join(unprobed)}")
    wide = _covers_longer_namespaces(client, namespace)
    if wide:
        notes.insert(0, wide)
    summary = (
        f"the Redis user may run the {len(must)} commands the store needs on namespace {namespace!r} "
        f"({', '.join(must)})"
    )
    status: Status = "warn" if unprobed or wide or "asking" in found.refused else "ok"
    return Check("permissions", status, summary, "; ".join(notes))


def _refusals(found: _Replies, must: tuple[str, ...], parsed: RedisURL, namespace: str) -> Check:
    """The unsafe verdict: the commands (or keys) refused, and the ACL SETUSER that grants them."""
    missing, missing_keys = found.shown(found.refused, must), found.shown(found.on_keys, must)
    parts: list[str] = []
    grant: list[str] = []
    if missing:
        gone = sorted(found.absent & set(found.refused) & set(required_commands()))
        parts.append(
            f"the Redis user may not run {', '.join(missing)}"
            + (f" (not on the server: {', '.join(gone)})" if gone else "")
        )
        grant.extend(f"+{c}" for c in must if c in found.refused)
    if missing_keys:
        parts.append(
            f"the Redis user may not use {', '.join(missing_keys)} on the keys of namespace {namespace!r}"
        )
        grant.append(f"~{acl_key_pattern(namespace)}")
    why = "" if {*found.refused, *found.on_keys} & set(required_commands()) else "with wait_replicas, "
    return Check(
        "permissions",
        "unsafe",
        "; ".join(parts),
        f"The store needs them: {why}every call would be refused (store_unavailable). Grant them "
        f"(docs/security.md, the minimum ACL a store user needs): ACL SETUSER {_user_of(parsed)} "
        + " ".join(grant),
    )


def _covers_longer_namespaces(client: SyncClient, namespace: str) -> str:
    """A warning when the user's key patterns reach the records of every namespace that begins with
    ``<namespace>:`` (``~acme:*`` reaches ``acme:eu``) but not keys at large (a user allowed every key
    is an admin, not a tenant); "" otherwise."""
    probe = f"airlock-doctor-probe-{secrets.token_hex(8)}"
    longer = record_key(f"{namespace}:{probe}", probe)  # a record of the namespace "<namespace>:<probe>"
    elsewhere = probe.encode()
    replies: list[Any] = []
    for key in (longer, elsewhere):
        try:
            replies.append(client.get(key))
        except redis.exceptions.NoPermissionError as exc:
            replies.append(exc)
    if _refused(replies[0]) is None and _refused(replies[1]) is not None:
        return (
            f"the user's key patterns also cover the records of every namespace that begins with "
            f"'{namespace}:' ('{namespace}:<more>'): this user can read and write theirs. Use the key "
            f"pattern ~{acl_key_pattern(namespace)} (docs/security.md)"
        )
    return ""


def _every_primary_has_aof(primaries: list[Node]) -> bool:
    try:
        return all(str(server_info(n, "persistence").get("aof_enabled")) == "1" for n in primaries)
    except redis.ResponseError:  # INFO refused: the store, refused too, sends no WAITAOF
        return False
