"""``airlock-redis doctor``: is this Redis fit to hold at-most-once records? Each check says why.

Exit status: 0 healthy, 1 warnings, 2 unsafe (or unreachable). The rules:

| check | ok | warn | unsafe |
|---|---|---|---|
| reachability | PING answers, Redis >= 6.2 | Redis older than 6.2 (untested) | no answer |
| role | the URL reaches a primary | | the URL reaches a replica (every begin would fail) |
| permissions | the user may run what the store needs on its keys | a wider key pattern, no ASKING | NOPERM |
| eviction | ``noeviction`` | memory above 90% of maxmemory | ``allkeys-*`` / ``volatile-*`` |
| persistence | AOF with appendfsync always/everysec | RDB only, AOF with appendfsync no, or none | |
| replicas | replicas online and in sync, or none | a replica not online, or > 1 MiB / 5 s behind | |
| cluster | state ok, all slots served, or no cluster | a primary without replica | state not ok, slot gaps |
| scripts | every script loads on every primary | | a script fails to load |
| tls | rediss://, a unix socket, or a loopback host | plain TCP to another host | |
| clock | server TIME within 1 s of this machine | further apart (times shown by inspect are off) | |

The permissions check sends each command the store needs (``stores.acl.required_commands()``; with
``--wait-replicas``, WAIT and WAITAOF too) once, harmlessly, on a probe key of ``--namespace`` that
never exists (``SET ... XX`` writes nothing there), on every primary, and reads the reply: NOPERM is a
refusal, any other reply or error means the user may run it. That works for any user, on every Redis
and Valkey version (``ACL GETUSER`` needs admin rights, ``ACL DRYRUN`` is 7.0+). A check whose own
command is refused (INFO, CONFIG GET, TIME) is a warning that says so, never a crash.

No persistence is a warning, not unsafe: replicas (with ``wait_replicas``) can carry the records across
a failover. A server that restarts with neither loses every record, and retries of calls in doubt run again;
so does every replica of a primary that restarts empty and answers as a primary, or is promoted,
before its first sync (its replicas resynchronise from it), which no check here can see ahead of time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import redis
from redis.cluster import RedisCluster

from ..redaction import redact
from ..stores.acl import CLUSTER_COMMANDS, DURABILITY_COMMANDS, OPTIONAL_COMMANDS, required_commands
from ..stores.keys import DEFAULT_NAMESPACE, acl_key_pattern, check_namespace, record_key
from ..stores.scripts import SCRIPT_NAMES, script_source
from ..stores.server_facts import evicts_records, parse_version
from ..stores.url import CONNECT_ERRORS, RedisURL, SyncClient, parse_url, sync_client
from .common import (
    classify_redis_error,
    namespace_argument,
    non_negative_int,
    operator_url,
    seconds_argument,
    shown_url,
)

HELP = "check that a Redis deployment is fit to hold effect records (exit 0 ok, 1 warnings, 2 unsafe)"

Status = Literal["ok", "warn", "unsafe"]
EXIT = {"ok": 0, "warn": 1, "unsafe": 2}
LAG_BYTES = 1 << 20
LAG_SECONDS = 5
CLOCK_SKEW_S = 1.0
MEMORY_HIGH = 0.9
LOOPBACK = ("127.0.0.1", "::1", "localhost")
MAX_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    summary: str
    detail: str = ""


@dataclass(frozen=True)
class _Node:
    name: str
    client: redis.Redis
    primary: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=None, help="Redis to check (default: $AIRLOCK_REDIS_URL, else localhost)"
    )
    parser.add_argument(
        "--namespace",
        type=namespace_argument,
        default=DEFAULT_NAMESPACE,
        help="the records' key prefix, whose keys the user must be allowed (default: %(default)s)",
    )
    parser.add_argument(
        "--wait-replicas",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="the store's wait_replicas: check that the user may also run WAIT (and WAITAOF)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument(
        "--timeout",
        type=seconds_argument(MAX_TIMEOUT_S),
        default=5.0,
        metavar="SECONDS",
        help=f"socket timeout in seconds, more than 0 and at most {MAX_TIMEOUT_S:g} (default 5)",
    )
    parser.epilog = (
        "exit codes: 0 healthy, 1 warnings, 2 unsafe (also: Redis unreachable, authentication failed, "
        "a URL no store takes, or a bad command line), 130 interrupted, 141 the reader of its output "
        "went away"
    )


def run(args: argparse.Namespace) -> int:
    url = operator_url(args)
    checks = diagnose(url, timeout=args.timeout, namespace=args.namespace, wait_replicas=args.wait_replicas)
    code = exit_status(checks)
    if args.json:
        print(
            json.dumps(
                {
                    "url": redact(url),
                    "status": _worst(checks),
                    "exit": code,
                    "checks": [asdict(c) for c in checks],
                },
                indent=2,
            )
        )
    else:
        print(f"airlock-redis doctor: {redact(url)}")
        for check in checks:
            print(f"  [{check.status:^6}] {check.name}: {check.summary}")
            if check.detail:
                print(f"           {check.detail}")
        print(f"result: {_worst(checks)} (exit {code})")
    return code


def exit_status(checks: list[Check]) -> int:
    return EXIT[_worst(checks)]


def _worst(checks: list[Check]) -> Status:
    statuses = {c.status for c in checks}
    return "unsafe" if "unsafe" in statuses else "warn" if "warn" in statuses else "ok"


def diagnose(
    url: str, *, timeout: float = 5.0, namespace: str = DEFAULT_NAMESPACE, wait_replicas: int = 0
) -> list[Check]:
    """Every check, in order; an unreachable server stops after the first."""
    try:
        parsed = parse_url(url)
    except ValueError as exc:
        return [Check("reachability", "unsafe", f"bad URL: {exc}")]
    try:
        check_namespace(namespace)
    except ValueError as exc:
        return [Check("permissions", "unsafe", f"bad namespace: {exc}")]
    try:
        client = sync_client(parsed, socket_timeout=timeout, socket_connect_timeout=timeout)
        with contextlib.suppress(redis.exceptions.NoPermissionError):
            client.ping()  # NOPERM: it answered; the permissions check names PING among the refused
        nodes = _nodes(client)
    except CONNECT_ERRORS as exc:
        detail = "The guard refuses every call (store_unavailable) while Redis is unreachable."
        if parsed.kind == "cluster":
            detail += (
                " A Redis Cluster's user also needs +cluster|slots and +command (redis-py's cluster "
                "client sends both when it connects) and +asking (docs/security.md)."
            )
        kind, line = classify_redis_error(exc, parsed)
        if kind == "unreachable":
            line = f"no answer from Redis: {line}"
        else:
            detail = "The guard refuses every call (store_unavailable) while Redis refuses its user."
        return [Check("reachability", "unsafe", line, detail)]
    try:
        primaries = [n for n in nodes if n.primary]
        steps: list[tuple[str, Callable[[], Check]]] = [
            ("reachability", lambda: _reachability(primaries)),
            ("role", lambda: _role(client, parsed)),
            ("permissions", lambda: _permissions(client, primaries, parsed, namespace, wait_replicas)),
            ("eviction", lambda: _eviction(primaries)),
            ("persistence", lambda: _persistence(primaries)),
            ("replicas", lambda: _replicas(primaries)),
            ("cluster", lambda: _cluster(client, nodes)),
            ("scripts", lambda: _scripts(primaries)),
            ("tls", lambda: _tls(parsed)),
            ("clock", lambda: _clock(primaries[0].client)),
        ]
        checks: list[Check] = []
        for name, step in steps:
            try:
                checks.append(step())
            except CONNECT_ERRORS as exc:
                checks.append(_could_not_check(name, exc))
        return checks
    finally:
        client.close()


def _could_not_check(name: str, exc: BaseException) -> Check:
    """A check that could not be made: a warning that says why (a refused command, a lost connection)."""
    if isinstance(exc, redis.exceptions.NoPermissionError):
        summary = f"could not check: the Redis user may not run the command this check needs ({exc})"
        if name == "reachability":
            summary = f"Redis answers, version unknown: {summary}"
        return Check(name, "warn", summary)
    return Check(name, "warn", f"could not check: {type(exc).__name__}: {exc}")


def _nodes(client: SyncClient) -> list[_Node]:
    if isinstance(client, RedisCluster):
        return [
            _Node(n.name, client.get_redis_connection(n), n.server_type == "primary")
            for n in client.get_nodes()
        ]
    assert isinstance(client, redis.Redis)
    return [_Node("server", client, True)]


def _info(node: _Node, section: str) -> dict[str, Any]:
    info: dict[str, Any] = node.client.info(section)
    return info


def _label(node: _Node, many: bool) -> str:
    return f"{node.name}: " if many else ""


def _reachability(primaries: list[_Node]) -> Check:
    versions = {n.name: str(_info(n, "server")["redis_version"]) for n in primaries}
    shown = ", ".join(sorted(set(versions.values())))
    old = [v for v in versions.values() if parse_version(v) < (6, 2)]
    if old:
        return Check("reachability", "warn", f"Redis {shown} answers; versions before 6.2 are not tested")
    where = f" on {len(primaries)} primaries" if len(primaries) > 1 else ""
    return Check("reachability", "ok", f"Redis {shown} answers{where}")


def _role(client: SyncClient, parsed: RedisURL) -> Check:
    if isinstance(client, RedisCluster):
        return Check("role", "ok", "the cluster client routes each record to its primary")
    role = client.info("replication").get("role")
    if role != "master":
        return Check(
            "role",
            "unsafe",
            f"the URL reaches a {role}, not a primary",
            "Every begin would fail (a replica is read-only): point the URL at the primary, or use "
            "redis+sentinel://.",
        )
    how = " (named by the sentinels)" if parsed.kind == "sentinel" else ""
    return Check("role", "ok", f"the URL reaches a primary{how}")


# -- permissions -----------------------------------------------------------------------------------
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


def _probe_keys(client: SyncClient, primaries: list[_Node], namespace: str) -> dict[str, bytes]:
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


def _probe(node: _Node, key: bytes, commands: tuple[str, ...]) -> dict[str, Any]:
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
    primaries: list[_Node],
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


def _permissions(
    client: SyncClient, primaries: list[_Node], parsed: RedisURL, namespace: str, wait_replicas: int
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


def permission_problem(client: SyncClient, parsed: RedisURL, namespace: str) -> str | None:
    """None if the Redis user may run what the store needs on the keys of ``namespace`` (the permissions
    check's probes, which write nothing), else one line that says what is refused (for demo and bench,
    before they start)."""
    primaries = [n for n in _nodes(client) if n.primary]
    check = _permissions(client, primaries, parsed, namespace, 0)
    if check.status != "unsafe":
        return None
    return f"not allowed at {shown_url(parsed)}: {check.summary}"


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


def _every_primary_has_aof(primaries: list[_Node]) -> bool:
    try:
        return all(str(_info(n, "persistence").get("aof_enabled")) == "1" for n in primaries)
    except redis.ResponseError:  # INFO refused: the store, refused too, sends no WAITAOF
        return False


def _eviction(primaries: list[_Node]) -> Check:
    bad: list[str] = []
    full: list[str] = []
    policies: set[str] = set()
    many = len(primaries) > 1
    for node in primaries:
        memory = _info(node, "memory")
        policy = str(memory.get("maxmemory_policy", "unknown"))
        policies.add(policy)
        if evicts_records(policy):
            bad.append(f"{_label(node, many)}{policy}")
        limit, used = int(memory.get("maxmemory", 0)), int(memory.get("used_memory", 0))
        if limit and used > MEMORY_HIGH * limit:
            full.append(f"{_label(node, many)}{used} of {limit} bytes")
    if bad:
        return Check(
            "eviction",
            "unsafe",
            f"maxmemory-policy may evict records ({', '.join(bad)})",
            "An evicted record lets a retry run its tool again. Set maxmemory-policy noeviction.",
        )
    if full:
        return Check(
            "eviction",
            "warn",
            f"memory almost full ({', '.join(full)})",
            "With noeviction a full Redis refuses writes: calls are then refused (store_unavailable).",
        )
    return Check(
        "eviction", "ok", f"maxmemory-policy {', '.join(sorted(policies))}: records are never evicted"
    )


def _persistence(primaries: list[_Node]) -> Check:
    worst: Status = "ok"
    notes: list[str] = []
    many = len(primaries) > 1
    for node in primaries:
        info = _info(node, "persistence")
        label = _label(node, many)
        if str(info.get("aof_enabled")) == "1":
            fsync = _config(node, "appendfsync") or "unknown"
            if fsync == "no":
                worst = _max(worst, "warn")
                notes.append(f"{label}AOF with appendfsync no (the OS decides when records reach disk)")
            else:
                notes.append(f"{label}AOF, appendfsync {fsync}")
            continue
        save = _config(node, "save")
        if save:
            worst = _max(worst, "warn")
            notes.append(
                f"{label}RDB snapshots only (save {save}): records since the last one die in a crash"
            )
        else:
            worst = _max(worst, "warn")
            notes.append(f"{label}no persistence: a restart forgets every record")
    detail = (
        ""
        if worst == "ok"
        else "After a restart without the record, a retry of a call in doubt runs again. Enable "
        "appendonly yes (appendfsync everysec or always), or rely on replicas with wait_replicas "
        "and let a restarted primary come back only as a replica (replicaof in its configuration), "
        "not promotable until it has synced (replica-priority 0 until then): one that answers as a "
        "primary, or is promoted, while empty empties its replicas (docs/durability.md)."
    )
    return Check("persistence", worst, "; ".join(notes), detail)


def _replicas(primaries: list[_Node]) -> Check:
    worst: Status = "ok"
    notes: list[str] = []
    total = 0
    many = len(primaries) > 1
    for node in primaries:
        info = _info(node, "replication")
        offset = int(info.get("master_repl_offset", 0))
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        total += len(replicas)
        for r in replicas:
            behind = offset - int(r.get("offset", 0))
            lag = int(r.get("lag", 0))
            where = f"{_label(node, many)}replica {r.get('ip')}:{r.get('port')}"
            if r.get("state") != "online":
                worst = _max(worst, "warn")
                notes.append(f"{where} is {r.get('state')}")
            elif behind > LAG_BYTES or lag > LAG_SECONDS:
                worst = _max(worst, "warn")
                notes.append(f"{where} is {behind} bytes / {lag} s behind")
            else:
                notes.append(f"{where} in sync ({behind} bytes, {lag} s behind)")
    if total == 0:
        return Check(
            "replicas",
            "ok",
            "no replicas",
            "A lost server takes its unpersisted records with it; wait_replicas needs replicas.",
        )
    return Check("replicas", worst, f"{total} replica(s): " + "; ".join(notes))


def _cluster(client: SyncClient, nodes: list[_Node]) -> Check:
    if not isinstance(client, RedisCluster):
        info = nodes[0].client.info("cluster")
        if str(info.get("cluster_enabled")) == "1":
            return Check(
                "cluster",
                "unsafe",
                "the server is a Cluster node but the URL is not redis+cluster://",
                "Records in other slots would fail with MOVED: use redis+cluster://host:port,...",
            )
        return Check("cluster", "ok", "not a cluster")
    text = nodes[0].client.execute_command("CLUSTER", "INFO")
    text = text.decode() if isinstance(text, bytes) else str(text)
    info = dict(line.split(":", 1) for line in text.strip().splitlines() if ":" in line)
    state, slots_ok = info.get("cluster_state"), int(info.get("cluster_slots_ok", 0))
    if state != "ok" or slots_ok < 16384:
        return Check(
            "cluster",
            "unsafe",
            f"cluster_state {state}, {slots_ok} of 16384 slots served",
            "Calls whose records live in unserved slots are refused (store_unavailable).",
        )
    primaries = [n for n in nodes if n.primary]
    counts = {n.name: _replica_count(n) for n in primaries}
    lonely = [name for name, count in counts.items() if not count]
    summary = (
        f"state ok, 16384 slots served by {len(primaries)} primaries with {sum(counts.values())} replicas"
    )
    if lonely:
        return Check(
            "cluster",
            "warn",
            summary,
            f"primaries without a replica ({', '.join(lonely)}): their slots fail with them",
        )
    return Check("cluster", "ok", summary)


def _replica_count(node: _Node) -> int:
    return int(_info(node, "replication").get("connected_slaves", 0))


# A script's source behind this line is compiled by EVAL, never run: how a user without SCRIPT LOAD
# (which the store does not need) has the scripts checked.
_COMPILE_ONLY = "do return 'compiled' end\n"


def _scripts(primaries: list[_Node]) -> Check:
    failed: list[str] = []
    compiled_by_eval = False
    for node in primaries:
        for name in SCRIPT_NAMES:
            try:
                try:
                    node.client.script_load(script_source(name))
                except redis.exceptions.NoPermissionError:
                    node.client.eval(_COMPILE_ONLY + script_source(name), 0)
                    compiled_by_eval = True
            except redis.exceptions.NoPermissionError:
                return Check(
                    "scripts",
                    "warn",
                    "could not check: the Redis user may run neither SCRIPT LOAD nor EVAL",
                )
            except redis.ResponseError as exc:
                failed.append(f"{node.name}: {name}.lua: {exc}")
    if failed:
        return Check("scripts", "unsafe", "scripts fail to load: " + "; ".join(failed))
    where = f" on {len(primaries)} primaries" if len(primaries) > 1 else ""
    how = (
        " (compiled with EVAL: the user may not run SCRIPT LOAD, which the store does not need)"
        if compiled_by_eval
        else ""
    )
    return Check("scripts", "ok", f"{len(SCRIPT_NAMES)} scripts load{where} ({', '.join(SCRIPT_NAMES)}){how}")


def _tls(parsed: RedisURL) -> Check:
    if parsed.tls:
        return Check("tls", "ok", "TLS (rediss://)")
    if parsed.url.startswith("unix://"):
        return Check("tls", "ok", "unix socket: no network")
    hosts = parsed.hosts or ((_single_host(parsed.url), 0),)
    remote = [h for h, _ in hosts if h not in LOOPBACK]
    if remote:
        return Check(
            "tls",
            "warn",
            f"plain TCP to {', '.join(remote)}",
            "Records (arguments' digests, results) cross the network in clear: use rediss://.",
        )
    return Check("tls", "ok", "plain TCP on loopback")


def _clock(client: redis.Redis) -> Check:
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    skew = (seconds + micros / 1e6) - (before + after) / 2
    if abs(skew) > CLOCK_SKEW_S:
        return Check(
            "clock",
            "warn",
            f"server clock {skew:+.1f} s from this machine",
            "TTLs run on the server's clock and are unaffected; begin/commit times shown by inspect are off.",
        )
    return Check("clock", "ok", f"server clock within {abs(skew) * 1000:.0f} ms of this machine")


def _config(node: _Node, name: str) -> str | None:
    try:
        reply: dict[Any, Any] = node.client.config_get(name)
    except redis.ResponseError:  # CONFIG disabled (managed services)
        return None
    value = reply.get(name, reply.get(name.encode()))
    return value.decode() if isinstance(value, bytes) else (None if value is None else str(value))


def _single_host(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).hostname or "localhost"


def _max(a: Status, b: Status) -> Status:
    return a if EXIT[a] >= EXIT[b] else b
