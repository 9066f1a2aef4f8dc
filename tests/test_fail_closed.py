"""Fail closed against real redis-server processes that the tests stop, kill and restart.

- Redis unreachable at begin: the tool does not run; refused with store_unavailable, and the
  message says that nothing took effect.
- Redis killed while the tool runs: the caller still gets the value. The pending record survives
  a restart (append-only file, fsync always), so the retry is refused, never run again.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectInProgress,
    EffectRefused,
    RedisEffectStore,
    Status,
    StoreUnavailable,
    tool_call_context,
)
from airlock_redis.embedded import EmbeddedRedis, free_port
from tests.conftest import require_redis_server

KINDS = ("sync", "async")
PERSISTENT = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder path: a unix socket path must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="arl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def charge_tool(
    guard: EffectGuard, kind: str, runs: list[int], during: Callable[[], None] = lambda: None
) -> Any:
    """A guarded ``charge(account, cents)``; returns a blocking caller for both kinds."""
    if kind == "sync":

        @guard.wrap
        def charge(account: str, cents: int) -> dict[str, Any]:
            runs.append(cents)
            during()
            return {"charged": cents, "account": account}

        return charge

    @guard.wrap
    async def acharge(account: str, cents: int) -> dict[str, object]:
        runs.append(cents)
        during()
        await asyncio.sleep(0)
        return {"charged": cents, "account": account}

    def call(account: str, cents: int) -> Any:
        async def main() -> Any:
            try:
                return await acharge(account, cents)
            finally:
                await guard.store.aclose()  # type: ignore[attr-defined]

        return asyncio.run(main())

    return call


def assert_refused_unavailable(refused: EffectRefused) -> None:
    assert isinstance(refused, StoreUnavailable)
    assert refused.reason == "store_unavailable"
    text = str(refused)
    assert "did not run" in text
    assert "Nothing took effect" in text


# -- down at begin -----------------------------------------------------------------------------
def unreachable_urls(short_dir: Path) -> dict[str, str]:
    return {
        "closed-port": f"redis://127.0.0.1:{free_port()}/0",
        "missing-socket": f"unix://{short_dir / 'no-such.sock'}",
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["closed-port", "missing-socket"])
def test_unreachable_redis_at_begin_refuses_and_the_tool_does_not_run(
    short_dir: Path, kind: str, where: str
) -> None:
    url = unreachable_urls(short_dir)[where]
    store = RedisEffectStore(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    runs: list[int] = []
    charge = charge_tool(EffectGuard(store=store), kind, runs)
    with tool_call_context("call-down"), pytest.raises(EffectRefused) as refused:
        charge("acct_1", 500)
    assert runs == []
    assert_refused_unavailable(refused.value)
    assert refused.value.tool_call_id == "call-down"


@pytest.mark.parametrize("kind", KINDS)
def test_a_stopped_server_refuses_at_begin_and_a_restart_lets_the_call_run(
    short_dir: Path, kind: str
) -> None:
    require_redis_server()
    server = EmbeddedRedis(data_dir=short_dir).start()
    try:
        store = RedisEffectStore(server.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        runs: list[int] = []
        charge = charge_tool(EffectGuard(store=store), kind, runs)
        with tool_call_context("call-warm"):
            charge("acct_1", 100)  # the client holds a live connection now
        server.stop()
        with tool_call_context("call-stopped"), pytest.raises(EffectRefused) as refused:
            charge("acct_1", 200)
        assert_refused_unavailable(refused.value)
        assert runs == [100]
        server = EmbeddedRedis(data_dir=short_dir).start()
        with tool_call_context("call-stopped"):  # nothing took effect, so the same id may run now
            assert charge("acct_1", 200) == {"charged": 200, "account": "acct_1"}
        assert runs == [100, 200]
        store.close()
    finally:
        server.stop()


# -- killed while the tool runs ----------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_redis_killed_during_the_tool_the_caller_gets_its_value_and_the_retry_is_refused(
    short_dir: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    require_redis_server()
    servers = [EmbeddedRedis(extra_args=PERSISTENT, data_dir=short_dir).start()]
    try:
        url = servers[0].url
        store = RedisEffectStore(url, namespace="failclosed", socket_timeout=1.0, socket_connect_timeout=1.0)
        runs: list[int] = []
        # no wait: the record's lease still runs after the restart (nothing can end it), so a retry
        # finds it running, and is refused at once rather than after waiting for an end that never comes
        charge = charge_tool(EffectGuard(store=store, wait_for_running=0), kind, runs, during=servers[0].kill)
        with caplog.at_level(logging.ERROR, logger="airlock_redis"), tool_call_context("call-killed"):
            value = charge("acct_1", 500)
        assert value == {"charged": 500, "account": "acct_1"}
        assert runs == [500]
        assert servers[0].process is None or servers[0].process.poll() is not None
        assert any("commit failed" in r.getMessage() for r in caplog.records), caplog.text

        servers.append(EmbeddedRedis(extra_args=PERSISTENT, data_dir=short_dir).start())
        assert servers[1].url == url  # the same socket
        fresh = RedisEffectStore(url, namespace="failclosed")
        record = fresh.get("call-killed")
        assert record is not None, "the pending record did not survive the restart"
        assert (record.status, record.attempt) == (Status.PENDING, 1)

        assert record.liveness == "running"  # until its lease lapses: the attempt cannot be told from one
        retry = charge_tool(EffectGuard(store=fresh, wait_for_running=0), kind, runs)
        with tool_call_context("call-killed"), pytest.raises(EffectInProgress) as refused:
            retry("acct_1", 500)
        assert refused.value.reason == "effect_in_progress"
        with tool_call_context("call-killed"), pytest.raises(EffectInProgress):
            charge("acct_1", 500)  # the first store object reconnects, and refuses as well
        assert runs == [500]
        record = fresh.get("call-killed")
        assert record is not None and record.status is Status.PENDING
        fresh.close()
        store.close()
    finally:
        for server in servers:
            server.stop()
