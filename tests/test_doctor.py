"""``airlock-redis doctor`` on real servers: one test per exit status, and per topology."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest
import redis

from airlock_redis.cli import main
from airlock_redis.cli.doctor_cmd import Check, diagnose, exit_status
from airlock_redis.cli.doctor_permissions import _PROBES
from airlock_redis.embedded import EmbeddedRedis, free_port
from airlock_redis.stores.acl import DURABILITY_COMMANDS, OPTIONAL_COMMANDS, required_commands
from airlock_redis.stores.scripts import SCRIPT_NAMES

from .topologies import (
    ClusterTopology,
    SentinelTopology,
    private,
    redis_binary,
    shared_cluster,
    shared_sentinel,
)

pytestmark = pytest.mark.redis_server


@pytest.fixture(scope="module")
def aof_server() -> Iterator[EmbeddedRedis]:
    redis_binary()
    with EmbeddedRedis(extra_args=["--appendonly", "yes", "--appendfsync", "everysec"]) as server:
        yield server


@pytest.fixture(scope="module")
def evicting_server() -> Iterator[EmbeddedRedis]:
    redis_binary()
    with EmbeddedRedis(extra_args=["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"]) as server:
        yield server


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_a_single_server_with_aof_is_healthy(
    aof_server: EmbeddedRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--url", aof_server.url]) == 0
    out = capsys.readouterr().out
    assert "result: ok (exit 0)" in out
    assert "AOF, appendfsync everysec" in out
    assert "unix socket" in out
    assert "[  ok  ] permissions: the Redis user may run the 8 commands the store needs" in out


def test_no_persistence_is_a_warning(redis_server: EmbeddedRedis, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--url", redis_server.url, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "warn" and report["exit"] == 1
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["persistence"]["status"] == "warn"
    assert "restart forgets every record" in checks["persistence"]["summary"]
    # replicas alone are not enough: a primary back empty as a primary empties them (issue 14)
    assert "come back only as a replica" in checks["persistence"]["detail"]
    assert set(checks) == {
        "reachability",
        "role",
        "permissions",
        "eviction",
        "persistence",
        "replicas",
        "cluster",
        "scripts",
        "tls",
        "clock",
        "calls",
    }


def test_an_evicting_policy_is_unsafe(evicting_server: EmbeddedRedis) -> None:
    checks = diagnose(evicting_server.url)
    assert by_name(checks)["eviction"].status == "unsafe"
    assert "volatile-lru" in by_name(checks)["eviction"].summary
    assert exit_status(checks) == 2


def test_an_unreachable_server_is_unsafe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--url", f"redis://127.0.0.1:{free_port()}/0", "--timeout", "1"]) == 2
    assert "no answer from Redis" in capsys.readouterr().out


def test_a_bad_url_is_unsafe() -> None:
    checks = diagnose("redis+sentinel://127.0.0.1:1")
    assert exit_status(checks) == 2 and "bad URL" in checks[0].summary


def test_cluster_state_slots_and_replicas(pytestconfig: pytest.Config) -> None:
    cluster: ClusterTopology = shared_cluster(pytestconfig)
    checks = by_name(diagnose(cluster.url))
    assert checks["cluster"].status == "ok"
    assert "16384 slots served by 3 primaries with 3 replicas" in checks["cluster"].summary
    assert checks["scripts"].status == "ok" and "3 primaries" in checks["scripts"].summary
    assert checks["permissions"].status == "ok", checks["permissions"]  # probed on each primary
    assert checks["replicas"].summary.startswith("3 replica(s)")
    assert checks["persistence"].status == "warn"  # the test cluster keeps nothing on disk


def test_a_cluster_node_behind_a_plain_url_is_unsafe(pytestconfig: pytest.Config) -> None:
    cluster: ClusterTopology = shared_cluster(pytestconfig)
    node = cluster.primaries()[0]
    checks = by_name(diagnose(f"redis://127.0.0.1:{node.port}/0"))
    assert checks["cluster"].status == "unsafe"


def test_sentinel_primary_and_its_replica(pytestconfig: pytest.Config) -> None:
    sentinel: SentinelTopology = shared_sentinel(pytestconfig)
    checks = by_name(diagnose(sentinel.url))
    assert checks["role"].status == "ok" and "sentinels" in checks["role"].summary
    assert checks["replicas"].status == "ok"
    assert f"replica 127.0.0.1:{sentinel.replica.port} in sync" in checks["replicas"].summary


def test_a_url_that_reaches_a_replica_is_unsafe(pytestconfig: pytest.Config) -> None:
    sentinel: SentinelTopology = shared_sentinel(pytestconfig)
    checks = by_name(diagnose(f"redis://127.0.0.1:{sentinel.replica.port}/0"))
    assert checks["role"].status == "unsafe" and "slave" in checks["role"].summary


# -- the Redis user's permissions (issue 22, scenario 7) -------------------------------------------------
STORE_RULES = ["-@all", *(f"+{c}" for c in required_commands())]


@pytest.fixture
def acl_user(redis_server: EmbeddedRedis) -> Iterator[tuple[redis.Redis, list[str]]]:
    """A maker of ACL users on the session's server, ``make(rules) -> URL``; deleted afterwards."""
    admin = redis.Redis.from_url(redis_server.url, socket_timeout=10)
    made: list[str] = []
    yield admin, made
    for user in made:
        admin.acl_deluser(user)
    admin.close()


def make_user(server: EmbeddedRedis, made: tuple[redis.Redis, list[str]], *rules: str) -> str:
    admin, users = made
    user, password = f"doctor-{secrets.token_hex(4)}", secrets.token_hex(8)
    admin.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", *rules)
    users.append(user)
    scheme, _, rest = server.url.partition("://")
    return f"{scheme}://{user}:{password}@{rest}"


def run_doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["doctor", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out


def test_every_command_the_store_needs_has_a_probe() -> None:
    assert set(required_commands()) | set(DURABILITY_COMMANDS) | set(OPTIONAL_COMMANDS) <= set(_PROBES)


def test_a_user_allowed_set_but_not_evalsha_or_eval_is_unsafe(
    redis_server: EmbeddedRedis, acl_user: tuple[redis.Redis, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    rules = [r for r in STORE_RULES if r not in ("+evalsha", "+eval")]
    url = make_user(redis_server, acl_user, "~acme:{*", *rules)
    code, out = run_doctor(capsys, "--url", url, "--namespace", "acme")
    assert code == 2, out
    assert "[unsafe] permissions: the Redis user may not run evalsha, eval\n" in out, out
    assert "+evalsha +eval" in out  # the fix, as an ACL SETUSER line
    # INFO refused (NOPERM): warnings that say so, not a traceback
    assert "[ warn ] reachability: Redis answers, version unknown" in out, out
    assert "[ warn ] eviction: could not check" in out and "'info' command" in out, out
    assert "result: unsafe (exit 2)" in out


def test_a_user_with_no_command_is_told_every_one(
    redis_server: EmbeddedRedis, acl_user: tuple[redis.Redis, list[str]]
) -> None:
    """Each probe reaches the server's ACL check (a probe of the wrong arity would be refused first
    for that, and its command would not be named here)."""
    url = make_user(redis_server, acl_user, "~acme:{*", "-@all")
    checks = by_name(diagnose(url, namespace="acme", wait_replicas=1))
    permissions = checks["permissions"]
    assert permissions.status == "unsafe" and exit_status(list(checks.values())) == 2
    wanted = [*required_commands(), "wait"]
    assert permissions.summary.startswith("the Redis user may not run " + ", ".join(wanted)), permissions


def test_a_user_whose_keys_do_not_cover_the_namespace_is_unsafe(
    redis_server: EmbeddedRedis, acl_user: tuple[redis.Redis, list[str]]
) -> None:
    url = make_user(redis_server, acl_user, "~acme:{*", *STORE_RULES)
    permissions = by_name(diagnose(url, namespace="acme:eu"))["permissions"]
    assert permissions.status == "unsafe"
    assert "on the keys of namespace 'acme:eu'" in permissions.summary and "get, set" in permissions.summary
    assert "~acme:eu:{*" in permissions.detail


def test_the_documented_tenant_user_passes_the_permissions_check(
    redis_server: EmbeddedRedis, acl_user: tuple[redis.Redis, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url = make_user(redis_server, acl_user, "~acme:{*", *STORE_RULES)
    code, out = run_doctor(capsys, "--url", url, "--namespace", "acme")
    assert code == 1 and "[unsafe]" not in out, out  # warnings only: INFO, CONFIG GET and TIME refused
    assert "[  ok  ] permissions: the Redis user may run the 8 commands the store needs" in out, out
    assert "refused, and optional: info, config|get" in out
    # SCRIPT LOAD refused too: the scripts are compiled with EVAL instead
    assert f"[  ok  ] scripts: {len(SCRIPT_NAMES)} scripts load" in out and "compiled with EVAL" in out, out
    # with wait_replicas, WAIT is missing from this user
    code, out = run_doctor(capsys, "--url", url, "--namespace", "acme", "--wait-replicas", "1")
    assert code == 2 and "[unsafe] permissions: the Redis user may not run wait\n" in out, out


def test_a_key_pattern_that_covers_longer_namespaces_is_a_warning(
    redis_server: EmbeddedRedis, acl_user: tuple[redis.Redis, list[str]]
) -> None:
    """``~acme:*`` also covers ``acme:eu``'s records (docs/security.md)."""
    url = make_user(redis_server, acl_user, "~acme:*", *STORE_RULES)
    permissions = by_name(diagnose(url, namespace="acme"))["permissions"]
    assert permissions.status == "warn" and "~acme:{*" in permissions.detail, permissions
    assert "namespace that begins with 'acme:'" in permissions.detail
    exact = make_user(redis_server, acl_user, "~acme:{*", *STORE_RULES)
    assert by_name(diagnose(exact, namespace="acme"))["permissions"].status == "ok"


def test_a_user_allowed_everything_passes_with_wait_replicas(redis_server: EmbeddedRedis) -> None:
    permissions = by_name(diagnose(redis_server.url, wait_replicas=1))["permissions"]
    assert permissions.status == "ok" and "wait" in permissions.summary, permissions
    assert permissions.detail == ""


def test_each_cluster_primary_is_probed_on_a_key_of_its_own_slots() -> None:
    """ACLs are per node in a Cluster: a node that refuses a command is named."""
    redis_binary()
    with private(ClusterTopology(primaries=3, replicas=0)) as cluster:
        nodes = cluster.primaries()
        rules = ["reset", "on", ">pw", "~acme:{*", *STORE_RULES, "+cluster|slots", "+command"]
        for i, node in enumerate(nodes):
            refused = ["-evalsha"] if i == 0 else []
            node.client().execute_command("ACL", "SETUSER", "acme", *rules, *refused)
        url = cluster.url.replace("redis+cluster://", "redis+cluster://acme:pw@", 1)
        permissions = by_name(diagnose(url, namespace="acme"))["permissions"]
        assert permissions.status == "unsafe", permissions
        assert permissions.summary == f"the Redis user may not run evalsha (on 127.0.0.1:{nodes[0].port})"
        for node in nodes:
            node.client().execute_command("ACL", "SETUSER", "acme", "+evalsha")
        permissions = by_name(diagnose(url, namespace="acme"))["permissions"]
        assert permissions.status == "warn" and "ASKING is refused" in permissions.detail, permissions
        for node in nodes:
            node.client().execute_command("ACL", "SETUSER", "acme", "+asking")
        assert by_name(diagnose(url, namespace="acme"))["permissions"].status == "ok"
