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

A check whose own command is refused (INFO, CONFIG GET, TIME) is a warning that says so, never a
crash. How the permissions check probes the user's ACL is in ``doctor_permissions``; the other checks
of the server are in ``doctor_server``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable
from dataclasses import asdict

import redis

from ..redaction import redact
from ..stores.keys import DEFAULT_NAMESPACE, check_namespace
from ..stores.url import CONNECT_ERRORS, RedisURL, SyncClient, parse_url, sync_client
from .common import (
    classify_redis_error,
    namespace_argument,
    non_negative_int,
    operator_url,
    seconds_argument,
    shown_url,
)
from .doctor_calls import check_calls
from .doctor_check import EXIT, Check, Status, nodes_of
from .doctor_permissions import check_permissions
from .doctor_server import (
    check_clock,
    check_cluster,
    check_eviction,
    check_persistence,
    check_reachability,
    check_replicas,
    check_role,
    check_scripts,
    check_tls,
)

__all__ = ["HELP", "Check", "add_arguments", "diagnose", "exit_status", "permission_problem", "run"]

HELP = "check that a Redis deployment is fit to hold effect records (exit 0 ok, 1 warnings, 2 unsafe)"

MAX_TIMEOUT_S = 3600.0


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
        nodes = nodes_of(client)
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
            ("reachability", lambda: check_reachability(primaries)),
            ("role", lambda: check_role(client, parsed)),
            ("permissions", lambda: check_permissions(client, primaries, parsed, namespace, wait_replicas)),
            ("eviction", lambda: check_eviction(primaries)),
            ("persistence", lambda: check_persistence(primaries)),
            ("replicas", lambda: check_replicas(primaries)),
            ("cluster", lambda: check_cluster(client, nodes)),
            ("scripts", lambda: check_scripts(primaries)),
            ("tls", lambda: check_tls(parsed)),
            ("clock", lambda: check_clock(primaries[0].client)),
            ("calls", lambda: check_calls(client, namespace)),
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


def permission_problem(client: SyncClient, parsed: RedisURL, namespace: str) -> str | None:
    """None if the Redis user may run what the store needs on the keys of ``namespace`` (the permissions
    check's probes, which write nothing), else one line that says what is refused (for demo and bench,
    before they start)."""
    primaries = [n for n in nodes_of(client) if n.primary]
    check = check_permissions(client, primaries, parsed, namespace, 0)
    if check.status != "unsafe":
        return None
    return f"not allowed at {shown_url(parsed)}: {check.summary}"
