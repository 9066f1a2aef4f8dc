"""``airlock-redis doctor``: is this Redis fit to hold at-most-once records? Each check says why.

Exit status: 0 healthy, 1 warnings, 2 unsafe (or unreachable). The rules:

| check | ok | warn | unsafe |
|---|---|---|---|
| reachability | PING answers, Redis >= 6.2 | Redis older than 6.2 (untested) | no answer |
| role | the URL reaches a primary | | the URL reaches a replica (every begin would fail) |
| eviction | ``noeviction`` | memory above 90% of maxmemory | ``allkeys-*`` / ``volatile-*`` |
| persistence | AOF with appendfsync always/everysec | RDB only, AOF with appendfsync no, or none | |
| replicas | replicas online and in sync, or none | a replica not online, or > 1 MiB / 5 s behind | |
| cluster | state ok, all slots served, or no cluster | a primary without replica | state not ok, slot gaps |
| scripts | every script loads on every primary | | a script fails to load |
| tls | rediss://, a unix socket, or a loopback host | plain TCP to another host | |
| clock | server TIME within 1 s of this machine | further apart (times shown by inspect are off) | |

No persistence is a warning, not unsafe: replicas (with ``wait_replicas``) can carry the records across
a failover. A server that restarts with neither loses every record, and retries of calls in doubt run again;
so does every replica of a primary that restarts empty and answers as a primary, or is promoted,
before its first sync (its replicas resynchronise from it), which no check here can see ahead of time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import redis
from redis.cluster import RedisCluster

from ..redaction import redact
from ..stores.scripts import SCRIPT_NAMES, script_source
from ..stores.server_facts import evicts_records, parse_version
from ..stores.url import CONNECT_ERRORS, RedisURL, SyncClient, parse_url, sync_client
from .common import operator_url

HELP = "check that a Redis deployment is fit to hold effect records (exit 0 ok, 1 warnings, 2 unsafe)"

Status = Literal["ok", "warn", "unsafe"]
EXIT = {"ok": 0, "warn": 1, "unsafe": 2}
LAG_BYTES = 1 << 20
LAG_SECONDS = 5
CLOCK_SKEW_S = 1.0
MEMORY_HIGH = 0.9
LOOPBACK = ("127.0.0.1", "::1", "localhost")


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
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--timeout", type=float, default=5.0, help="socket timeout in seconds (default 5)")
    parser.epilog = (
        "exit codes: 0 healthy, 1 warnings, 2 unsafe (also: Redis unreachable, a URL no store takes, "
        "or a bad command line)"
    )


def run(args: argparse.Namespace) -> int:
    url = operator_url(args)
    checks = diagnose(url, timeout=args.timeout)
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


def diagnose(url: str, *, timeout: float = 5.0) -> list[Check]:
    """Every check, in order; an unreachable server stops after the first."""
    try:
        parsed = parse_url(url)
    except ValueError as exc:
        return [Check("reachability", "unsafe", f"bad URL: {exc}")]
    try:
        client = sync_client(parsed, socket_timeout=timeout, socket_connect_timeout=timeout)
        client.ping()
        nodes = _nodes(client)
    except CONNECT_ERRORS as exc:
        return [
            Check(
                "reachability",
                "unsafe",
                f"no answer from Redis: {type(exc).__name__}: {exc}",
                "The guard refuses every call (store_unavailable) while Redis is unreachable.",
            )
        ]
    try:
        primaries = [n for n in nodes if n.primary]
        checks = [_reachability(primaries)]
        steps: list[tuple[str, Callable[[], Check]]] = [
            ("role", lambda: _role(client, parsed)),
            ("eviction", lambda: _eviction(primaries)),
            ("persistence", lambda: _persistence(primaries)),
            ("replicas", lambda: _replicas(primaries)),
            ("cluster", lambda: _cluster(client, nodes)),
            ("scripts", lambda: _scripts(primaries)),
            ("tls", lambda: _tls(parsed)),
            ("clock", lambda: _clock(primaries[0].client)),
        ]
        for name, step in steps:
            try:
                checks.append(step())
            except CONNECT_ERRORS as exc:
                checks.append(Check(name, "warn", f"could not check: {type(exc).__name__}: {exc}"))
        return checks
    finally:
        client.close()


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


def _scripts(primaries: list[_Node]) -> Check:
    failed: list[str] = []
    for node in primaries:
        for name in SCRIPT_NAMES:
            try:
                node.client.script_load(script_source(name))
            except redis.ResponseError as exc:
                failed.append(f"{node.name}: {name}.lua: {exc}")
    if failed:
        return Check("scripts", "unsafe", "scripts fail to load: " + "; ".join(failed))
    where = f" on {len(primaries)} primaries" if len(primaries) > 1 else ""
    return Check("scripts", "ok", f"{len(SCRIPT_NAMES)} scripts load{where} ({', '.join(SCRIPT_NAMES)})")


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
