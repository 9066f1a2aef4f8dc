"""How a RedisEffectStore is made and closed, as a newcomer writes it: the URL comes from
``$AIRLOCK_REDIS_URL`` like the CLI's, ``url`` and ``client=`` are never both taken, the URL a store
shows (repr, the resolve command of a refusal) is one an operator can paste, ``from_url`` and
``with``/``async with`` work as they do on redis-py's clients."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from redis.sentinel import Sentinel

from airlock_redis import EffectGuard, EffectRefused, RedisEffectStore, Status, tool_call_context
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.redis_clients import url_of_client
from airlock_redis.stores.redis_store import CLIENT_URL_UNKNOWN, DEFAULT_URL, URL_ENV


def _connected(client: Any) -> list[bool]:
    pool = client.connection_pool
    return [conn.is_connected for conn in (*pool._available_connections, *pool._in_use_connections)]


def _refusal(store: RedisEffectStore, tool_call_id: str) -> EffectRefused:
    @EffectGuard(store).wrap
    def charge(cents: int) -> int:
        raise TimeoutError("the gateway did not answer")

    with tool_call_context(tool_call_id), pytest.raises(TimeoutError):
        charge(5)
    with tool_call_context(tool_call_id), pytest.raises(EffectRefused) as refused:
        charge(5)
    return refused.value


def _url_in_hint(refusal: EffectRefused) -> str:
    argv = shlex.split(refusal.fix_hint[refusal.fix_hint.index("airlock-redis resolve") :].rstrip("."))
    return argv[argv.index("--url") + 1]


# -- 1. $AIRLOCK_REDIS_URL ----------------------------------------------------------------------------
@pytest.mark.redis_server
def test_a_store_without_url_or_client_uses_airlock_redis_url(
    redis_server: EmbeddedRedis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(URL_ENV, redis_server.url)
    store = RedisEffectStore(namespace=namespace)
    assert store.url == redis_server.url
    guard = EffectGuard(store)
    assert guard.call("env-1", lambda cents: cents * 2, cents=21) == 42
    with redis_server.client() as direct:  # the record is on the server the variable names
        assert direct.exists(store.key("env-1")) == 1
    record = store.get("env-1")
    assert record is not None and record.status is Status.COMMITTED
    store.close()


@pytest.mark.parametrize("value", [None, ""])
def test_without_the_variable_the_store_uses_localhost(
    value: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv(URL_ENV, raising=False)
    else:
        monkeypatch.setenv(URL_ENV, value)
    assert RedisEffectStore().url == DEFAULT_URL == "redis://localhost:6379/0"


def test_an_explicit_url_or_client_wins_over_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(URL_ENV, "redis://elsewhere:6379/4")
    assert RedisEffectStore("redis://here:6379/1").url == "redis://here:6379/1"
    client = redis.Redis(host="mine", port=6390, db=2)
    store = RedisEffectStore(client=client)
    assert store.url is None and "redis://mine:6390/2" in store.operator_target


# -- 2. url and client ------------------------------------------------------------------------------
def test_url_and_client_together_are_refused_saying_which_one_is_used() -> None:
    with pytest.raises(ValueError, match=r"url or client=, not both") as refused:
        RedisEffectStore("redis://localhost:6379/0", client=redis.Redis(host="other"))
    assert "uses that client" in str(refused.value)


@pytest.mark.parametrize(
    ("client", "url"),
    [
        (redis.Redis(host="db.internal", port=6380, db=3), "redis://db.internal:6380/3"),
        (redis.Redis.from_url("rediss://app:s3cret@tls.internal:6390/1"), "rediss://app@tls.internal:6390/1"),
        (redis.Redis(unix_socket_path="/run/redis.sock"), "unix:///run/redis.sock"),
        (redis.Redis.from_url("unix://app:s3cret@/run/redis.sock?db=2"), "unix://app@/run/redis.sock?db=2"),
        (redis.Redis(host="::1", port=7000), "redis://[::1]:7000/0"),
        (
            Sentinel([("s1", 26379), ("s2", 26380)]).master_for("mymaster", db=2, password="s3cret"),
            "redis+sentinel://s1:26379,s2:26380/mymaster/2",
        ),
    ],
)
def test_a_client_alone_shows_the_url_of_its_connection_without_the_password(
    client: redis.Redis, url: str
) -> None:
    assert url_of_client(client) == url
    store = RedisEffectStore(client=client, namespace="tenant a")
    assert shlex.split(store.operator_target) == ["--url", url, "--namespace", "tenant a"]
    assert url in repr(store) and "s3cret" not in repr(store) and "s3cret" not in store.operator_target


def test_a_client_whose_connection_gives_no_url_says_the_url_is_the_applications() -> None:
    store = RedisEffectStore(client=fakeredis.FakeRedis(), namespace="ns")
    refusal = _refusal(store, "fake-1")
    assert refusal.reason == "effect_status_unknown"
    assert _url_in_hint(refusal) == CLIENT_URL_UNKNOWN
    assert "application's client=" in CLIENT_URL_UNKNOWN
    assert "this store's Redis URL" not in str(refusal)
    assert repr(store) == "RedisEffectStore(client=FakeRedis, namespace='ns')"


@pytest.mark.redis_server
def test_the_resolve_command_of_a_client_store_acts_on_its_records(
    redis_server: EmbeddedRedis, namespace: str, tmp_path: Path
) -> None:
    store = RedisEffectStore(client=redis_server.client(), namespace=namespace)
    refusal = _refusal(store, "client 1")
    assert _url_in_hint(refusal) == redis_server.url  # unix:///...: pasteable
    command = refusal.fix_hint[refusal.fix_hint.index("airlock-redis resolve") :].rstrip(".")
    argv = shlex.split(command.replace("--committed | --release", "--release"))
    done = subprocess.run(
        [sys.executable, "-m", "airlock_redis", *argv[1:], "--yes", "--audit-log", str(tmp_path / "a.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert store.get("client 1") is None  # released: the command reached this store's record


# -- 3. from_url, with, async with ---------------------------------------------------------------------
@pytest.mark.redis_server
def test_from_url_takes_the_stores_options(redis_server: EmbeddedRedis, namespace: str) -> None:
    store = RedisEffectStore.from_url(redis_server.url, namespace=namespace, committed_ttl=60)
    assert isinstance(store, RedisEffectStore)
    assert (store.url, store.namespace, store.ttls.committed) == (redis_server.url, namespace, 60)
    assert store.ping()
    store.close()


@pytest.mark.redis_server
def test_with_closes_the_blocking_client(redis_server: EmbeddedRedis, namespace: str) -> None:
    with RedisEffectStore(redis_server.url, namespace=namespace) as store:
        assert isinstance(store, RedisEffectStore)
        assert store.ping()
        assert any(_connected(store.client))
    assert _connected(store.client) and not any(_connected(store.client))


@pytest.mark.redis_server
def test_with_closes_the_store_even_when_the_block_raises(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    with pytest.raises(KeyError), store:
        assert store.ping()
        raise KeyError("the body failed")
    assert _connected(store.client) and not any(_connected(store.client))


@pytest.mark.redis_server
def test_async_with_closes_the_running_loops_client(redis_server: EmbeddedRedis, namespace: str) -> None:
    async def main() -> tuple[Any, list[bool], list[bool], bool]:
        async with RedisEffectStore(redis_server.url, namespace=namespace) as store:
            assert isinstance(store, RedisEffectStore)
            client = store.async_client()
            assert await client.ping()
            during = _connected(client)
        loop = asyncio.get_running_loop()
        return client, during, _connected(client), loop in store.async_client_loops

    _, during, after, still_held = asyncio.run(main())
    assert any(during)
    assert not any(after) and not still_held


# -- 4. redis+unix:// on a real server -------------------------------------------------------------------
@pytest.mark.redis_server
def test_a_redis_plus_unix_url_reaches_the_socket(redis_server: EmbeddedRedis, namespace: str) -> None:
    assert redis_server.url.startswith("unix://")
    limits_style = "redis+unix://" + redis_server.url.removeprefix("unix://") + "?db=1"
    with RedisEffectStore(limits_style, namespace=namespace) as store:
        assert store.url == redis_server.url + "?db=1"
        assert EffectGuard(store).call("unix-1", lambda: "done") == "done"
        with redis.Redis.from_url(redis_server.url + "?db=1") as db1:
            assert db1.exists(store.key("unix-1")) == 1
        assert shlex.split(store.operator_target)[1] == redis_server.url + "?db=1"

    async def via_asyncio() -> str | None:
        async with RedisEffectStore(limits_style, namespace=namespace) as astore:
            record = await astore.aget("unix-1")
            return None if record is None else record.status.value

    assert asyncio.run(via_asyncio()) == "committed"


@pytest.mark.redis_server
def test_a_cluster_client_shows_a_cluster_url_that_reaches_its_records(
    pytestconfig: pytest.Config, namespace: str
) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    from airlock_redis.stores.url import parse_url
    from tests.topologies import shared_cluster

    cluster = shared_cluster(pytestconfig)
    seeds = [ClusterNode(host, port) for host, port in parse_url(cluster.url).hosts]
    client = RedisCluster(startup_nodes=seeds, decode_responses=False)
    store = RedisEffectStore(client=client, namespace=namespace)
    shown = shlex.split(store.operator_target)[1]
    assert shown.startswith("redis+cluster://") and parse_url(shown).kind == "cluster"
    assert EffectGuard(store).call("cluster-1", lambda: "ran") == "ran"
    with RedisEffectStore(shown, namespace=namespace) as pasted:  # what an operator would paste
        record = pasted.get("cluster-1")
        assert record is not None and record.status is Status.COMMITTED
    client.close()
