"""Tenants: a namespace each, and a Redis ACL user per tenant limited to its namespace's records and
to the commands the store needs. The ACL lines of docs/security.md are applied here as written, on a
real redis-server, and used through the real store, guard and CLI.

The tenants are ``acme`` and ``acme:eu``: one namespace begins with the other, which the key pattern
``~acme:*`` of earlier docs did not tell apart (issue 22, scenario 9).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from airlock_redis import EffectGuard, RedisEffectStore, StoreError, StoreUnavailable, tool_call_context
from airlock_redis.cli import main
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.operator import AUDIT_LOG_ENV, OPERATOR_COMMANDS, audit_stream_key
from airlock_redis.stores.acl import WAITING_COMMANDS, required_commands
from airlock_redis.stores.keys import acl_key_pattern, record_key, record_pattern

from .procs import PROJECT_ROOT

pytestmark = pytest.mark.redis_server

SECURITY_MD = PROJECT_ROOT / "docs" / "security.md"
TENANTS = {"acme": "acme", "acme-eu": "acme:eu"}  # the documented users and their namespaces
OPERATOR = "airlock-operator"


def documented_acl() -> dict[str, list[str]]:
    """The ``ACL SETUSER`` lines of docs/security.md, split into words, by user name."""
    lines = [line.split() for line in SECURITY_MD.read_text(encoding="utf-8").splitlines()]
    return {words[2]: words for words in lines if words[:2] == ["ACL", "SETUSER"]}


class Users:
    """The documented users, made on the server; each one's URL."""

    def __init__(self, server: EmbeddedRedis, admin: redis.Redis) -> None:
        self.server, self.admin = server, admin
        self.passwords: dict[str, str] = {}
        for user, words in documented_acl().items():
            admin.execute_command(*words)  # as written in the docs
            (password,) = (w[1:] for w in words if w.startswith(">"))
            self.passwords[user] = password

    def url(self, user: str) -> str:
        scheme, _, rest = self.server.url.partition("://")
        return f"{scheme}://{user}:{self.passwords[user]}@{rest}"

    def close(self) -> None:
        for user in self.passwords:
            self.admin.acl_deluser(user)


def _empty(admin: redis.Redis, namespace: str) -> None:
    for key in admin.scan_iter(match=record_pattern(namespace), count=1000):
        admin.delete(key)
    admin.delete(audit_stream_key(namespace))


@pytest.fixture
def admin(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=10)
    for namespace in (*TENANTS.values(), "other"):  # the namespaces are fixed: start each test empty
        _empty(client, namespace)
    yield client
    client.close()


@pytest.fixture
def users(redis_server: EmbeddedRedis, admin: redis.Redis) -> Iterator[Users]:
    made = Users(redis_server, admin)
    yield made
    made.close()


class Tenant:
    def __init__(self, url: str, namespace: str) -> None:
        self.store = RedisEffectStore(url, namespace=namespace)
        self.guard = EffectGuard(self.store)
        self.runs = 0

        def charge(account: str, cents: int) -> dict[str, Any]:
            self.runs += 1
            return {"account": account, "cents": cents}

        def lost(account: str) -> None:
            raise TimeoutError("the answer was lost")

        def declined(account: str) -> None:
            self.runs += 1
            raise ValueError("card declined")  # certainly not applied: the record is released

        self.charge = self.guard.wrap(charge)
        self.lost = self.guard.wrap(lost)
        self.declined = self.guard.wrap(declined)

    def call(self, tool_call_id: str, **kwargs: Any) -> Any:
        with tool_call_context(tool_call_id):
            return self.charge(**kwargs)

    def lose(self, tool_call_id: str) -> None:
        with tool_call_context(tool_call_id), pytest.raises(TimeoutError):
            self.lost(account="x")

    def decline(self, tool_call_id: str) -> None:
        with tool_call_context(tool_call_id), pytest.raises(ValueError):
            self.declined(account="x")

    def close(self) -> None:
        self.store.close()


# -- the documented lines ---------------------------------------------------------------------------
def test_the_documented_lines_are_exact_and_list_what_the_store_sends() -> None:
    acl = documented_acl()
    assert set(acl) == {*TENANTS, OPERATOR}
    for user, namespace in TENANTS.items():
        words = acl[user]
        assert words[3:5] == ["reset", "on"], words  # nothing kept from an earlier, wider rule
        assert [w[1:] for w in words if w.startswith("~")] == [acl_key_pattern(namespace)]
        assert acl_key_pattern(namespace) == f"{namespace}:{{*"
        assert [w[1:] for w in words if w.startswith("&")] == [acl_key_pattern(namespace)]  # channels
        assert [w[1:] for w in words if w.startswith("+")] == [*required_commands(), *WAITING_COMMANDS]
        # resetchannels: Redis 6.2's reset grants every channel (acl-pubsub-default allchannels)
        assert [w for w in words[5:] if not w.startswith(("~", "&", "+", ">"))] == ["resetchannels"]
    words = acl[OPERATOR]
    assert words[3:5] == ["reset", "on"], words
    patterns = {w[1:] for w in words if w.startswith("~")}
    assert patterns == {acl_key_pattern(ns) for ns in TENANTS.values()} | {
        audit_stream_key(ns) for ns in TENANTS.values()
    }
    assert [w[1:] for w in words if w.startswith("+")] == [*required_commands(), *OPERATOR_COMMANDS]


def test_the_pattern_of_a_namespace_matches_no_key_of_one_that_begins_with_it(admin: redis.Redis) -> None:
    """The server's own glob matching (SCAN MATCH uses the same code as ACL key patterns)."""
    keys = [record_key(ns, "call:{0123456789abcdef}:x") for ns in TENANTS.values()]
    for key in keys:
        admin.set(key, b"x", px=60_000)
    try:
        for ns, key in zip(TENANTS.values(), keys, strict=True):
            assert list(admin.scan_iter(match=acl_key_pattern(ns), count=1000)) == [key]
    finally:
        admin.delete(*keys)


# -- each tenant in its own namespace ---------------------------------------------------------------
@pytest.mark.parametrize("user", sorted(TENANTS))
def test_each_tenant_does_its_whole_call_in_its_own_namespace(users: Users, user: str) -> None:
    t = Tenant(users.url(user), TENANTS[user])
    first = t.call("call-1", account="x", cents=1)
    assert t.call("call-1", account="x", cents=1) == first  # replayed
    assert t.runs == 1
    record = t.store.get("call-1")
    assert record is not None and record.status.value == "committed"

    t.decline("call-2")  # released (settle): the retry runs again, through the begin script
    assert t.store.get("call-2") is None
    assert t.call("call-2", account="x", cents=2) == {"account": "x", "cents": 2}
    assert t.runs == 3

    t.lose("call-3")  # in doubt, then resolved by the tenant's own guard
    record = t.store.get("call-3")
    assert record is not None and record.status.value == "unknown"
    assert t.guard.resolve("call-3", "release", force=True).value == "ok"
    assert t.call("call-3", account="x", cents=3) == {"account": "x", "cents": 3}
    t.lose("call-4")
    assert t.guard.resolve("call-4", "committed", force=True, value={"receipt": "r-4"}).value == "ok"
    with tool_call_context("call-4"):
        assert t.lost(account="x") == {"receipt": "r-4"}  # the retry replays the resolved result
    assert t.runs == 4
    assert t.store.ping()

    async def async_path() -> Any:
        @t.guard.wrap
        async def refund(account: str) -> str:
            return f"refunded {account}"

        with tool_call_context("call-5"):
            return await refund(account="x"), await refund(account="x")

    assert asyncio.run(async_path()) == ("refunded x", "refunded x")
    t.close()


def test_a_cold_script_cache_needs_no_script_load(users: Users, admin: redis.Redis) -> None:
    """SCRIPT LOAD is not in the recipe: a begin whose script is not cached falls back to EVAL."""
    t = Tenant(users.url("acme"), "acme")
    t.decline("call-cold")  # leaves a tombstone: the next begin is the begin script, not SET NX
    admin.script_flush()
    assert t.call("call-cold", account="x", cents=1) == {"account": "x", "cents": 1}
    assert t.call("call-cold", account="x", cents=1) == {"account": "x", "cents": 1}
    assert t.runs == 2
    t.close()


# -- and never in the other's -----------------------------------------------------------------------
@pytest.mark.parametrize(("intruder", "victim"), [("acme", "acme-eu"), ("acme-eu", "acme")])
def test_a_tenant_cannot_read_replay_write_or_resolve_the_others_records(
    users: Users, admin: redis.Redis, intruder: str, victim: str
) -> None:
    owner = Tenant(users.url(victim), TENANTS[victim])
    owner.call("call-b", account="acct_b", cents=900)
    owner.lose("call-b-lost")

    # the intruder's credentials pointed at the victim's namespace: Redis refuses every operation
    other = Tenant(users.url(intruder), TENANTS[victim])
    with pytest.raises(StoreError, match=r"NoPermissionError.*(no permissions|No permissions)"):
        other.store.get("call-b")
    with pytest.raises(StoreUnavailable) as refused:  # a replay: refused, the stored result not returned
        other.call("call-b", account="acct_b", cents=900)
    assert "NoPermissionError" in str(refused.value)
    with pytest.raises(StoreUnavailable):  # a new call: refused before the tool runs, nothing written
        other.call("call-new", account="acct_b", cents=1)
    assert other.runs == 0
    assert admin.exists(record_key(TENANTS[victim], "call-new")) == 0
    with pytest.raises(StoreError, match="NoPermissionError"):
        other.guard.resolve("call-b-lost", "release", force=True)
    with pytest.raises(StoreError, match="NoPermissionError"):
        other.guard.resolve("call-b", "committed", force=True, value={"forged": True})

    # the victim's records are untouched
    record = owner.store.get("call-b-lost")
    assert record is not None and record.status.value == "unknown"
    assert owner.call("call-b", account="acct_b", cents=900) == {"account": "acct_b", "cents": 900}
    assert owner.runs == 1
    owner.close()
    other.close()


def test_raw_commands_and_scripts_stay_inside_the_pattern(users: Users, admin: redis.Redis) -> None:
    owner = Tenant(users.url("acme-eu"), "acme:eu")
    owner.call("call-b", account="acct_b", cents=900)
    theirs = owner.store.key("call-b")
    mine = record_key("acme", "call-a")
    raw = redis.Redis.from_url(users.url("acme"), socket_timeout=10)
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw.get(theirs)
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw.delete(theirs)
    with pytest.raises(redis.exceptions.NoPermissionError):  # no SCAN: key names stay private
        raw.scan(0)
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw.keys("*")
    with pytest.raises(redis.exceptions.NoPermissionError):  # the server's password stays private
        raw.config_get("requirepass")
    with pytest.raises(redis.exceptions.NoPermissionError):  # EVAL on their key: refused up front
        raw.eval("return redis.call('DEL', KEYS[1])", 1, theirs)
    # a script of the user's own runs with the user's ACL: their key is out of reach inside it too
    with pytest.raises(redis.ResponseError):
        raw.eval("return redis.call('GET', ARGV[1])", 1, mine, theirs)
    with pytest.raises(redis.ResponseError):
        raw.eval("return redis.call('DEL', ARGV[1])", 1, mine, theirs)
    assert admin.exists(theirs) == 1
    assert owner.call("call-b", account="acct_b", cents=900) == {"account": "acct_b", "cents": 900}
    assert owner.runs == 1
    raw.close()
    owner.close()


def test_repr_and_errors_hold_no_password(users: Users) -> None:
    url = users.url("acme")
    password = users.passwords["acme"]
    store = RedisEffectStore(url, namespace="elsewhere")
    assert password not in repr(store)
    assert "***" in repr(store)
    with pytest.raises(StoreError) as info:
        store.get("x")
    assert password not in str(info.value)
    guard = EffectGuard(store)
    assert password not in repr(guard)
    store.close()


# -- the operator's user ----------------------------------------------------------------------------
def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_operator_user_lists_inspects_resolves_and_audits(
    users: Users, admin: redis.Redis, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(AUDIT_LOG_ENV, raising=False)  # the audit goes to the stream (XADD) only
    acme, eu = Tenant(users.url("acme"), "acme"), Tenant(users.url("acme-eu"), "acme:eu")
    acme.call("call-1", account="x", cents=1)
    acme.lose("call-2")
    eu.call("call-1", account="y", cents=2)
    eu.call("call-eu", account="y", cents=3)
    # a key of another Redis type (a hash): listed and inspected as no record, with the documented commands
    old = record_key("acme", "call-old")
    admin.hset(old, mapping={"status": "committed"})
    admin.pexpire(old, 60_000)
    target = ["--url", users.url(OPERATOR)]

    def listed(namespace: str) -> set[str]:
        code, out, err = _cli(["list", *target, "--namespace", namespace, "--json"], capsys)
        assert code == 0, err
        return {r["tool_call_id"] for r in json.loads(out)["records"]}

    assert listed("acme") == {"call-1", "call-2", "call-old"}
    assert listed("acme:eu") == {"call-1", "call-eu"}
    code, out, err = _cli(["inspect", "call-2", *target, "--namespace", "acme"], capsys)
    assert code == 0 and "unknown" in out, err
    code, out, err = _cli(["inspect", "call-old", *target, "--namespace", "acme"], capsys)
    assert code == 0 and "another Redis type, not a string" in out, err
    code, out, err = _cli(["resolve", "call-2", *target, "--namespace", "acme", "--release", "--yes"], capsys)
    assert code == 0, err
    assert acme.call("call-2", account="x", cents=5) == {"account": "x", "cents": 5}
    code, out, err = _cli(["audit", *target, "--namespace", "acme"], capsys)
    assert code == 0 and "call-2" in out and "release" in out, err

    # a namespace outside its key patterns: SCAN finds the keys, reading them is refused
    stranger = RedisEffectStore(users.server.url, namespace="other")
    with tool_call_context("call-x"):
        EffectGuard(stranger).wrap(lambda: 1, name="charge")()
    stranger.close()
    code, out, err = _cli(["list", *target, "--namespace", "other", "--json"], capsys)
    assert code == 2 and "not allowed at" in err and "NoPermissionError" in err and "call-x" not in out
    acme.close()
    eu.close()
