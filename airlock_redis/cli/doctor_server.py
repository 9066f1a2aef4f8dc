"""The checks of ``airlock-redis doctor`` that read the server's configuration and state: reachability,
role, eviction, persistence, replicas, cluster, scripts, TLS and clock (the permissions check is in
``doctor_permissions``).

No persistence is a warning, not unsafe: replicas (with ``wait_replicas``) can carry the records across
a failover. A server that restarts with neither loses every record, and retries of calls in doubt run again;
so does every replica of a primary that restarts empty and answers as a primary, or is promoted,
before its first sync (its replicas resynchronise from it), which no check here can see ahead of time.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from redis.cluster import RedisCluster

from ..stores.scripts import SCRIPT_NAMES, script_source
from ..stores.server_facts import evicts_records, parse_version
from ..stores.url import RedisURL, SyncClient
from .doctor_check import EXIT, Check, Node, Status, server_info

LAG_BYTES = 1 << 20
LAG_SECONDS = 5
CLOCK_SKEW_S = 1.0
MEMORY_HIGH = 0.9
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _label(node: Node, many: bool) -> str:
    return f"{node.name}: " if many else ""


def check_reachability(primaries: list[Node]) -> Check:
    versions = {n.name: str(server_info(n, "server")["redis_version"]) for n in primaries}
    shown = ", ".join(sorted(set(versions.values())))
    old = [v for v in versions.values() if parse_version(v) < (6, 2)]
    if old:
        return Check("reachability", "warn", f"Redis {shown} answers; versions before 6.2 are not tested")
    where = f" on {len(primaries)} primaries" if len(primaries) > 1 else ""
    return Check("reachability", "ok", f"Redis {shown} answers{where}")


def check_role(client: SyncClient, parsed: RedisURL) -> Check:
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


def check_eviction(primaries: list[Node]) -> Check:
    bad: list[str] = []
    full: list[str] = []
    policies: set[str] = set()
    many = len(primaries) > 1
    for node in primaries:
        memory = server_info(node, "memory")
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


def check_persistence(primaries: list[Node]) -> Check:
    worst: Status = "ok"
    notes: list[str] = []
    many = len(primaries) > 1
    for node in primaries:
        info = server_info(node, "persistence")
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


def check_replicas(primaries: list[Node]) -> Check:
    worst: Status = "ok"
    notes: list[str] = []
    total = 0
    many = len(primaries) > 1
    for node in primaries:
        info = server_info(node, "replication")
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


def check_cluster(client: SyncClient, nodes: list[Node]) -> Check:
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


def _replica_count(node: Node) -> int:
    return int(server_info(node, "replication").get("connected_slaves", 0))


# A script's source behind this line is compiled by EVAL, never run: how a user without SCRIPT LOAD
# (which the store does not need) has the scripts checked.
_COMPILE_ONLY = "do return 'compiled' end\n"


def check_scripts(primaries: list[Node]) -> Check:
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


def check_tls(parsed: RedisURL) -> Check:
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


def check_clock(client: redis.Redis) -> Check:
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


def _config(node: Node, name: str) -> str | None:
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
