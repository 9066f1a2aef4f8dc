"""Stores chosen by URL through one registry: memory:// and every Redis form, a scheme of one's own,
EffectGuard(store=URL), and the operator commands, which read a Redis and say so for anything else."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from airlock_redis import EffectGuard, InMemoryEffectStore, RedisEffectStore, tool_call_context
from airlock_redis.cli.common import open_store
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import registry
from airlock_redis.stores.registry import register_scheme, scheme_of, schemes, store_from_url

from .procs import PROJECT_ROOT, child_env, explain


@pytest.fixture
def scratch_scheme() -> Iterator[str]:
    """A scheme registered by a test, removed after it."""
    yield "scratch"
    registry._factories.pop("scratch", None)


def test_memory_url_opens_an_in_memory_store_with_its_keyword_options() -> None:
    store = store_from_url("memory://", committed_ttl=5.0)
    assert isinstance(store, InMemoryEffectStore)
    assert store.ttls.committed == 5.0
    with pytest.raises(ValueError, match="memory:// takes no host, path or query"):
        store_from_url("memory://somewhere")


@pytest.mark.parametrize("url", ["", "localhost:6379", "http://localhost", "valkey://localhost"])
def test_a_url_no_store_is_registered_for_is_refused_naming_the_registered_schemes(url: str) -> None:
    with pytest.raises(ValueError, match=r"no effect store is registered.*memory://.*redis://"):
        store_from_url(url)


def test_every_redis_url_form_is_registered() -> None:
    for scheme in (
        "redis",
        "rediss",
        "unix",
        "redis+unix",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
    ):
        assert scheme in schemes()
    assert scheme_of("REDIS://h:1/0") == "redis" and scheme_of("no-scheme") == ""


def test_a_guard_given_a_memory_url_runs_each_call_once() -> None:
    guard = EffectGuard(store="memory://")
    assert isinstance(guard.store, InMemoryEffectStore)
    runs: list[int] = []

    @guard.wrap
    def charge(cents: int) -> int:
        runs.append(cents)
        return cents

    with tool_call_context("call_1"):
        assert charge(5) == 5
        assert charge(5) == 5
    assert runs == [5]


def test_a_guard_given_a_redis_url_records_in_that_redis(redis_server: EmbeddedRedis, namespace: str) -> None:
    url = redis_server.url
    first = EffectGuard(store=store_from_url(url, namespace=namespace))
    second = EffectGuard(store=store_from_url(url, namespace=namespace))
    assert isinstance(first.store, RedisEffectStore) and isinstance(second.store, RedisEffectStore)
    runs: list[str] = []

    def send(to: str) -> str:
        runs.append(to)
        return f"sent to {to}"

    try:
        assert first.call("call_r", send, "ann") == "sent to ann"
        assert second.call("call_r", send, "ann") == "sent to ann"  # another guard, the same record
        assert runs == ["ann"]
    finally:
        first.store.close()
        second.store.close()


def test_a_scheme_of_ones_own_opens_its_store_and_cannot_be_registered_twice(scratch_scheme: str) -> None:
    made: list[tuple[str, dict[str, Any]]] = []

    def factory(url: str, **options: Any) -> InMemoryEffectStore:
        made.append((url, options))
        return InMemoryEffectStore()

    register_scheme(scratch_scheme, factory)
    assert isinstance(store_from_url("scratch://x", pending_ttl=3), InMemoryEffectStore)
    assert made == [("scratch://x", {"pending_ttl": 3})]
    with pytest.raises(ValueError, match="already registered"):
        register_scheme(scratch_scheme, factory)
    register_scheme(scratch_scheme, lambda url, **options: InMemoryEffectStore(), replace=True)
    assert len(made) == 1 and isinstance(EffectGuard(store="scratch://y").store, InMemoryEffectStore)
    with pytest.raises(ValueError, match="not a URL scheme"):
        register_scheme("9 lives", factory)


def _operator_args(url: str) -> argparse.Namespace:
    return argparse.Namespace(url=url, namespace="airlock:effect")


def test_the_operator_commands_refuse_a_store_that_is_not_a_redis(scratch_scheme: str) -> None:
    register_scheme(scratch_scheme, lambda url, **options: InMemoryEffectStore())
    with pytest.raises(SystemExit) as ended, open_store(_operator_args("scratch://x")):
        pass
    assert ended.value.code == 2


def test_inspect_on_a_memory_url_says_where_those_records_live() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "airlock_redis", "inspect", "call_1", "--url", "memory://"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=PROJECT_ROOT,
        env=child_env(),
    )
    assert done.returncode == 2, explain(done)
    assert "memory:// records live inside the process that made them" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
