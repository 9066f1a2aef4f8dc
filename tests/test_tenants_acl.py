"""Tenants: a namespace each, and a Redis ACL user per tenant limited to its key pattern and to the
commands the store needs. Real ACL users on a real redis-server."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from airlock_redis import EffectGuard, RedisEffectStore, StoreError, StoreUnavailable, tool_call_context
from airlock_redis.embedded import EmbeddedRedis

pytestmark = pytest.mark.redis_server

# What a tenant's guard needs, and nothing else: the scripts (EVALSHA, and SCRIPT LOAD when the
# server's script cache is cold), the commands the scripts call (GET, SET, PEXPIRE; TYPE and HMGET
# only for a key that holds no string, such as a record of an earlier release), and the reads of
# RedisEffectStore.get (GET, PTTL; TYPE and HMGET for a key that holds no string) and ping. No
# SCAN/KEYS: SCAN ignores key patterns and would show a tenant the other tenants' key names.
TENANT_COMMANDS = [
    "-@all",
    "+evalsha",
    "+script|load",
    "+get",
    "+set",
    "+pexpire",
    "+type",
    "+hmget",
    "+pttl",
    "+ping",
]


def _tenant_url(server: EmbeddedRedis, user: str, password: str) -> str:
    scheme, _, rest = server.url.partition("://")
    return f"{scheme}://{user}:{password}@{rest}"


@pytest.fixture
def tenants(redis_server: EmbeddedRedis) -> Iterator[dict[str, str]]:
    """Two ACL users, each limited to its namespace ``<name>:*``; yields name -> URL."""
    admin = redis.Redis.from_url(redis_server.url)
    suffix = secrets.token_hex(4)
    urls: dict[str, str] = {}
    users = []
    for name in ("tenantA", "tenantB"):
        user, password = f"{name}-{suffix}", secrets.token_hex(16)
        admin.acl_setuser(
            user,
            enabled=True,
            passwords=[f"+{password}"],
            keys=[f"{name}-{suffix}:*"],
            commands=TENANT_COMMANDS,
            reset=True,
        )
        users.append(user)
        urls[name] = _tenant_url(redis_server, user, password)
    yield urls
    for user in users:
        admin.acl_deluser(user)
    admin.close()


def _namespace(url: str) -> str:
    user = url.partition("://")[2].partition(":")[0]
    return user  # each tenant's namespace is its user name (the ACL pattern is "<user>:*")


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

        self.charge = self.guard.wrap(charge)
        self.lost = self.guard.wrap(lost)

    def call(self, tool_call_id: str, **kwargs: Any) -> Any:
        with tool_call_context(tool_call_id):
            return self.charge(**kwargs)


def test_each_tenant_works_in_its_own_namespace(tenants: dict[str, str]) -> None:
    a = Tenant(tenants["tenantA"], _namespace(tenants["tenantA"]))
    first = a.call("call-1", account="x", cents=1)
    assert a.call("call-1", account="x", cents=1) == first
    assert a.runs == 1
    with tool_call_context("call-2"), pytest.raises(TimeoutError):
        a.lost(account="x")
    record = a.store.get("call-2")
    assert record is not None and record.status.value == "unknown"
    assert a.guard.resolve("call-2", "release", force=True).value == "ok"
    assert a.store.ping()

    async def async_path() -> Any:
        @a.guard.wrap
        async def refund(account: str) -> str:
            return f"refunded {account}"

        with tool_call_context("call-3"):
            return await refund(account="x"), await refund(account="x")

    assert asyncio.run(async_path()) == ("refunded x", "refunded x")


def test_cold_script_cache_is_loaded_by_the_tenant(
    redis_server: EmbeddedRedis, tenants: dict[str, str]
) -> None:
    redis.Redis.from_url(redis_server.url).script_flush()
    a = Tenant(tenants["tenantA"], _namespace(tenants["tenantA"]))
    assert a.call("call-cold", account="x", cents=1) == {"account": "x", "cents": 1}


def test_tenant_a_cannot_read_replay_or_resolve_tenant_b(tenants: dict[str, str]) -> None:
    b = Tenant(tenants["tenantB"], _namespace(tenants["tenantB"]))
    b.call("call-b", account="acct_b", cents=900)
    with tool_call_context("call-b-lost"), pytest.raises(TimeoutError):
        b.lost(account="acct_b")

    # tenant A's credentials pointed at tenant B's namespace: every operation is refused by Redis
    intruder = Tenant(tenants["tenantA"], _namespace(tenants["tenantB"]))
    with pytest.raises(StoreError, match=r"NoPermissionError.*ACL does not allow"):
        intruder.store.get("call-b")
    with pytest.raises(StoreUnavailable) as refused:  # a replay: refused before the tool runs
        intruder.call("call-b", account="acct_b", cents=900)
    assert "NoPermissionError" in str(refused.value)
    assert intruder.runs == 0
    with pytest.raises(StoreError, match="NoPermissionError"):
        intruder.guard.resolve("call-b-lost", "release", force=True)
    with pytest.raises(StoreError, match="NoPermissionError"):
        intruder.guard.resolve("call-b", "committed", force=True, value={"forged": True})

    # tenant B's records are untouched
    record = b.store.get("call-b-lost")
    assert record is not None and record.status.value == "unknown"
    assert b.call("call-b", account="acct_b", cents=900) == {"account": "acct_b", "cents": 900}
    assert b.runs == 1


def test_tenant_user_cannot_use_raw_commands_outside_its_pattern(tenants: dict[str, str]) -> None:
    b = Tenant(tenants["tenantB"], _namespace(tenants["tenantB"]))
    b.call("call-b", account="acct_b", cents=900)
    raw = redis.Redis.from_url(tenants["tenantA"])
    key_b = b.store.key("call-b")
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw.get(key_b)
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw.delete(key_b)
    with pytest.raises(redis.exceptions.NoPermissionError):  # no SCAN: key names stay private
        raw.scan(0)
    with pytest.raises(redis.exceptions.NoPermissionError):  # EVAL of arbitrary scripts is not granted
        raw.eval("return redis.call('DEL', KEYS[1])", 1, key_b)
    raw.close()


def test_repr_and_errors_hold_no_password(tenants: dict[str, str]) -> None:
    url = tenants["tenantA"]
    password = url.partition("://")[2].partition("@")[0].partition(":")[2]
    store = RedisEffectStore(url, namespace="elsewhere")
    assert password not in repr(store)
    assert "***" in repr(store)
    with pytest.raises(StoreError) as info:
        store.get("x")
    assert password not in str(info.value)
    guard = EffectGuard(store)
    assert password not in repr(guard)
