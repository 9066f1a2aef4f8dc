"""Ambiguous errors end to end: real client errors, a real redis-server, an irreversible tool.

| the tool raises                                                     | record   | a retry          |
|---------------------------------------------------------------------|----------|------------------|
| requests ReadTimeout (a real requests.get to a silent local server) | unknown  | refused, 1 run   |
| requests ConnectionError: the server hung up after the request      | unknown  | refused, 1 run   |
| ExceptionGroup[TimeoutError] from a real asyncio.TaskGroup (3.11+)   | unknown  | refused, 1 run   |
| GatewayError raised from TimeoutError (sync and async tools)        | unknown  | refused, 1 run   |
| requests ConnectionError: connection refused (a closed local port)  | released | runs again       |

requests is not a dependency of airlock_redis: its rows skip when it is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from airlock_redis import EffectGuard, EffectRefused, RedisEffectStore, Status, tool_call_context
from airlock_redis.core.ambiguity import explain
from airlock_redis.embedded import EmbeddedRedis


class LocalServer:
    """A TCP server on 127.0.0.1, in a thread. ``silent``: accepts and never answers (the connection
    stays open); ``hangup``: reads the request, then closes without a reply."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name=f"local-{mode}-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.mode == "silent":
                self._held.append(conn)
                continue
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                conn.recv(65536)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent_server() -> Iterator[LocalServer]:
    server = LocalServer("silent")
    yield server
    server.close()


@pytest.fixture
def hangup_server() -> Iterator[LocalServer]:
    server = LocalServer("hangup")
    yield server
    server.close()


@pytest.fixture
def closed_port() -> int:
    """A local port with nothing listening on it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def redis_store(redis_server: EmbeddedRedis, namespace: str) -> Iterator[RedisEffectStore]:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    yield store
    store.close()


@pytest.fixture
def requests_session() -> Iterator[Any]:
    requests = pytest.importorskip("requests", reason="requests is not installed (not a dependency)")
    session = requests.Session()
    session.trust_env = False  # straight to 127.0.0.1, whatever proxy the environment names
    yield session
    session.close()


def status_of(store: RedisEffectStore, tool_call_id: str) -> Status | None:
    record = store.get(tool_call_id)
    return None if record is None else record.status


def call(guarded: Callable[..., Any], tool_call_id: str, *args: Any) -> Any:
    with tool_call_context(tool_call_id):
        return guarded(*args)


def acall(guarded: Callable[..., Awaitable[Any]], tool_call_id: str, *args: Any) -> Any:
    async def run() -> Any:
        with tool_call_context(tool_call_id):
            return await guarded(*args)

    return asyncio.run(run())


def assert_in_doubt_and_refused(
    store: RedisEffectStore, retry: Callable[[], Any], tool_call_id: str, error: BaseException
) -> None:
    assert explain(error).startswith("in doubt"), explain(error)
    assert status_of(store, tool_call_id) is Status.UNKNOWN
    with pytest.raises(EffectRefused) as refused:
        retry()
    assert refused.value.reason == "effect_status_unknown"
    assert status_of(store, tool_call_id) is Status.UNKNOWN


# -- (a) requests ReadTimeout ---------------------------------------------------------------------


def test_a_real_requests_read_timeout_records_unknown_and_the_retry_is_refused(
    redis_store: RedisEffectStore, silent_server: LocalServer, requests_session: Any
) -> None:
    runs: list[int] = []

    def charge(account: str, cents: int) -> int:
        runs.append(cents)
        url = f"http://127.0.0.1:{silent_server.port}/charge/{account}"
        status: int = requests_session.post(url, json={"cents": cents}, timeout=0.2).status_code
        return status

    guarded = EffectGuard(store=redis_store).wrap(charge)
    with pytest.raises(OSError) as raised:
        call(guarded, "real-read-timeout", "acct", 500)
    error = raised.value
    assert f"{type(error).__module__}.{type(error).__qualname__}" == "requests.exceptions.ReadTimeout"
    assert not isinstance(error, TimeoutError)  # what the old isinstance test let through
    assert silent_server.accepted == 1  # the request reached the server
    assert_in_doubt_and_refused(
        redis_store, lambda: call(guarded, "real-read-timeout", "acct", 500), "real-read-timeout", error
    )
    assert runs == [500]


def test_a_server_hanging_up_after_the_request_records_unknown(
    redis_store: RedisEffectStore, hangup_server: LocalServer, requests_session: Any
) -> None:
    """requests.ConnectionError('Connection aborted.'): nothing in its chain proves the request never left."""
    runs: list[int] = []

    def charge(account: str, cents: int) -> int:
        runs.append(cents)
        url = f"http://127.0.0.1:{hangup_server.port}/charge/{account}"
        status: int = requests_session.post(url, json={"cents": cents}, timeout=2).status_code
        return status

    guarded = EffectGuard(store=redis_store).wrap(charge)
    with pytest.raises(OSError) as raised:
        call(guarded, "real-hangup", "acct", 500)
    assert type(raised.value).__qualname__ == "ConnectionError"
    assert hangup_server.accepted == 1
    assert_in_doubt_and_refused(
        redis_store, lambda: call(guarded, "real-hangup", "acct", 500), "real-hangup", raised.value
    )
    assert runs == [500]


# -- (b) an ExceptionGroup from asyncio.TaskGroup --------------------------------------------------


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup and ExceptionGroup need 3.11")
def test_a_task_group_timing_out_on_a_read_records_unknown_and_the_retry_is_refused(
    redis_store: RedisEffectStore, silent_server: LocalServer
) -> None:
    runs: list[int] = []

    async def read_reply(request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", silent_server.port)
        try:
            writer.write(request)
            await writer.drain()
            async with asyncio.timeout(0.2):
                return await reader.readline()
        finally:
            writer.close()
            await writer.wait_closed()

    async def charge_all(account: str, cents: int) -> list[bytes]:
        runs.append(cents)
        request = f"POST /charge/{account}?cents={cents} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        async with asyncio.TaskGroup() as group:
            sent = group.create_task(read_reply(request))
            audit = group.create_task(asyncio.sleep(0, b"audited"))
        return [sent.result(), audit.result()]

    guarded = EffectGuard(store=redis_store).wrap(charge_all)
    with pytest.raises(Exception) as raised:  # an ExceptionGroup (a builtin only from 3.11)
        acall(guarded, "real-task-group", "acct", 500)
    group_error: Any = raised.value
    assert type(group_error).__name__ == "ExceptionGroup"
    assert [type(e) for e in group_error.exceptions] == [TimeoutError]
    assert not isinstance(group_error, TimeoutError)  # what the old isinstance test let through
    assert silent_server.accepted == 1
    assert_in_doubt_and_refused(
        redis_store, lambda: acall(guarded, "real-task-group", "acct", 500), "real-task-group", group_error
    )
    assert runs == [500]


# -- (c) raise ... from TimeoutError() ---------------------------------------------------------------


class GatewayError(Exception):
    """A tool's own error, raised from the transport error it saw."""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_error_raised_from_a_timeout_records_unknown_and_the_retry_is_refused(
    redis_store: RedisEffectStore, kind: str
) -> None:
    runs: list[int] = []

    def fail(cents: int) -> None:
        runs.append(cents)
        try:
            raise TimeoutError("no reply from the payment gateway")
        except TimeoutError as exc:
            raise GatewayError("payment gateway did not answer") from exc

    def charge(account: str, cents: int) -> None:
        fail(cents)

    async def acharge(account: str, cents: int) -> None:
        await asyncio.sleep(0)
        fail(cents)

    tool_call_id = f"real-from-timeout-{kind}"
    if kind == "sync":
        guarded: Callable[..., Any] = EffectGuard(store=redis_store).wrap(charge)

        def attempt() -> Any:
            return call(guarded, tool_call_id, "acct", 500)

    else:
        aguarded = EffectGuard(store=redis_store).wrap(acharge)

        def attempt() -> Any:
            return acall(aguarded, tool_call_id, "acct", 500)

    with pytest.raises(GatewayError) as raised:
        attempt()
    assert isinstance(raised.value.__cause__, TimeoutError)
    assert_in_doubt_and_refused(redis_store, attempt, tool_call_id, raised.value)
    assert runs == [500]


# -- (d) connection refused: the request never left -------------------------------------------------


def test_a_real_connection_refused_releases_and_the_retry_runs(
    redis_store: RedisEffectStore, closed_port: int, requests_session: Any
) -> None:
    runs: list[int] = []

    def charge(account: str, cents: int) -> int:
        runs.append(cents)
        url = f"http://127.0.0.1:{closed_port}/charge/{account}"
        status: int = requests_session.post(url, json={"cents": cents}, timeout=(0.5, 2)).status_code
        return status

    guarded = EffectGuard(store=redis_store).wrap(charge)
    with pytest.raises(OSError) as raised:
        call(guarded, "real-refused", "acct", 500)
    assert type(raised.value).__qualname__ == "ConnectionError"
    line = explain(raised.value)
    assert line.startswith("released: urllib3.exceptions.NewConnectionError"), line
    assert redis_store.get("real-refused") is None
    with pytest.raises(OSError):  # the retry runs (and is refused again by the closed port)
        call(guarded, "real-refused", "acct", 500)
    assert runs == [500, 500]
    assert redis_store.get("real-refused") is None
