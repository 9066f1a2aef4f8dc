"""Shared fixtures: a real redis-server started for the session, and the three store kinds."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Generator, Iterator
from typing import Any

import fakeredis
import pytest

from airlock_redis import EffectStore, InMemoryEffectStore, RedisEffectStore
from airlock_redis.embedded import EmbeddedRedis
from tests.topologies import redis_binary, server_identity

STORE_KINDS = ("memory", "fakeredis", "redis")


# the same rule everywhere: a missing redis-server fails in CI and skips (with the reason) elsewhere
require_redis_server = redis_binary


# -- which server the tests start (Redis or Valkey, and its version): said at the top and in failures --
def server_under_test() -> str:
    identity = server_identity()
    return str(identity) if identity is not None else "none found (set AIRLOCK_REDIS_SERVER)"


def pytest_report_header(config: pytest.Config) -> str:
    return f"server under test: {server_under_test()}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        report.sections.append(("server under test", server_under_test()))
    return report


@pytest.fixture(scope="session", autouse=True)
def _record_server_under_test(record_testsuite_property: Callable[[str, object], None]) -> None:
    """The server's name and version as a property of the JUnit XML test suite (with --junitxml)."""
    record_testsuite_property("server_under_test", server_under_test())


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
