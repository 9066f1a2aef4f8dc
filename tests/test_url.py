"""Parsing of every URL kind the store accepts (no server needed)."""

from __future__ import annotations

import pytest
import redis

from airlock_redis import RedisEffectStore
from airlock_redis.stores.url import parse_url


def test_single_server_urls_are_left_to_redis_py() -> None:
    assert parse_url("redis://localhost:6379/0").kind == "single"
    assert parse_url("rediss://h:6380/1").tls
    assert parse_url("unix:///tmp/r.sock?db=2").kind == "single"


def test_cluster_url_with_credentials_ipv6_and_tls_options() -> None:
    parsed = parse_url("rediss+cluster://user:p%40ss@h1:7000,[::1]:7001?ssl_ca_certs=/ca.pem")
    assert parsed.kind == "cluster" and parsed.tls
    assert parsed.hosts == (("h1", 7000), ("::1", 7001))
    assert (parsed.username, parsed.password) == ("user", "p@ss")
    assert parsed.connection_kwargs() == {
        "ssl_ca_certs": "/ca.pem",
        "username": "user",
        "password": "p@ss",
        "ssl": True,
    }


def test_sentinel_url_names_service_and_db() -> None:
    parsed = parse_url("redis+sentinel://:secret@s1:26379,s2:26380/mymaster/3?sentinel_password=x")
    assert parsed.kind == "sentinel"
    assert parsed.hosts == (("s1", 26379), ("s2", 26380))
    assert (parsed.service, parsed.db, parsed.password) == ("mymaster", 3, "secret")
    assert parsed.options == {"sentinel_password": "x"}


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("memcached://h:1", "unsupported Redis URL scheme"),
        ("redis+cluster://h1:7000/2", "only database 0"),
        ("redis+cluster://h1:x", "is not host:port"),
        ("redis+cluster://h1:", "is not host:port"),
        ("redis+cluster://[::1]:", "is not host:port"),
        ("redis+cluster://[::1]x", "is not host:port"),
        ("redis+sentinel://s1/svc", "is not host:port"),
        ("redis+sentinel://s1:26379", "names the monitored service"),
        ("redis+sentinel://s1:26379/svc/x", "must be a number"),
        ("redis+cluster://h1:7000?bogus=1", "unknown option 'bogus'"),
        ("localhost:6379", "not a Redis URL"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_url(url)
    with pytest.raises(ValueError, match=problem):
        RedisEffectStore(url)


def test_a_cluster_node_without_a_port_is_on_6379() -> None:
    assert parse_url("redis+cluster://h1").hosts == (("h1", 6379),)
    assert parse_url("rediss+cluster://u:p@h1,h2:7001,[::1]").hosts == (
        ("h1", 6379),
        ("h2", 7001),
        ("::1", 6379),
    )
    assert RedisEffectStore("redis+cluster://h1").url == "redis+cluster://h1"


@pytest.mark.parametrize(
    ("url", "same_as", "path", "db"),
    [
        ("redis+unix:///tmp/r.sock", "unix:///tmp/r.sock", "/tmp/r.sock", 0),
        ("redis+unix:///tmp/r.sock?db=3", "unix:///tmp/r.sock?db=3", "/tmp/r.sock", 3),
        (
            "REDIS+UNIX:///var/run/redis.sock?db=1",
            "unix:///var/run/redis.sock?db=1",
            "/var/run/redis.sock",
            1,
        ),
    ],
)
def test_redis_plus_unix_is_the_unix_url_it_names(url: str, same_as: str, path: str, db: int) -> None:
    parsed = parse_url(url)
    assert (parsed.kind, parsed.url, parsed.tls) == ("single", same_as, False)
    store = RedisEffectStore(url)
    assert store.url == same_as  # what redis-py and airlock-redis --url take
    client = store.client
    assert isinstance(client, redis.Redis)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["path"], int(kwargs.get("db", 0))) == (path, db)
