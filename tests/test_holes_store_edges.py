"""Issue 22's store-side holes, each on a real redis-server: a begin that landed though every re-send
failed to connect (4), a release under maxmemory (5), a result over the server's proto-max-bulk-len
(6), a Redis user who may SET but not run scripts (7), and a tool name with a lone surrogate (11).

Each test states what a caller and the records must see; each failed on the code before the fix
(noted per test)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from airlock_redis import EffectGuard, EffectRefused, InMemoryEffectStore, RedisEffectStore, tool_call_context
from airlock_redis.core.records import Status
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import redis_store
from airlock_redis.stores.tries import Tries
from tests.conftest import require_redis_server

HOST = "127.0.0.1"
KINDS = ("sync", "async")


@pytest.fixture
def private_server() -> Iterator[EmbeddedRedis]:
    """A server of its own (these tests change its configuration), on TCP for the proxy below."""
    require_redis_server()
    with EmbeddedRedis(unix_socket=False) as server:
        yield server


def call(
    guard: EffectGuard, tool_call_id: str, fn: Callable[..., Any], kind: str, name: str = "charge"
) -> Any:
    """One guarded call of ``fn`` (sync or as a coroutine tool) under ``tool_call_id``."""
    if kind == "sync":
        wrapped = guard.wrap(fn, name=name)
        with tool_call_context(tool_call_id):
            return wrapped()

    async def body() -> Any:
        return fn()

    awrapped = guard.wrap(body, name=name)

    async def run() -> Any:
        with tool_call_context(tool_call_id):
            return await awrapped()

    return asyncio.run(run())


class Runs:
    def __init__(self, value: Any = "done") -> None:
        self.count = 0
        self.value = value

    def __call__(self) -> Any:
        self.count += 1
        return self.value


# -- 4: a begin that landed, its reply lost, its re-sends refused -----------------------------------
class ReplyEater:
    """A TCP relay to the server that forwards the first ``SET ... NX`` and throws its reply away, then
    stops listening (so the store's re-sends get "connection refused") until :meth:`listen` again."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = _free_port()
        self.ate = threading.Event()
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def listen(self) -> None:
        with self._lock:
            if self._listener is not None or self._stop.is_set():
                return
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((HOST, self.port))
            listener.listen(16)
            self._listener = listener
        self._spawn(self._accept, listener)

    def refuse(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it, stops listening
            listener.close()

    def close(self) -> None:
        self._stop.set()
        self.refuse()
        for sock in self._sockets:
            sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: refuse() or close()
            upstream = socket.create_connection((HOST, self.upstream_port))
            self._sockets += [client, upstream]
            self._spawn(self._relay, client, upstream)

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Requests one way; replies the other way on a pump thread, which drops the SET NX's reply."""
        client.settimeout(0.2)
        upstream.settimeout(0.2)
        dropping = threading.Event()  # set: the next reply chunk is the SET NX's, and is thrown away
        dropped = threading.Event()
        self._spawn(self._pump, upstream, client, dropping, dropped)
        while not self._stop.is_set():
            data = _read_some(client, self._stop)
            if data is None:
                return
            eat = not self.ate.is_set() and b"SET" in data and b"NX" in data
            if eat:
                dropping.set()
            upstream.sendall(data)
            if eat:
                dropped.wait(timeout=5)
                self.refuse()  # the re-sends find nobody listening
                self.ate.set()

    def _pump(
        self,
        upstream: socket.socket,
        client: socket.socket,
        dropping: threading.Event,
        dropped: threading.Event,
    ) -> None:
        while not self._stop.is_set():
            reply = _read_some(upstream, self._stop)
            if reply is None:
                return
            if dropping.is_set() and not dropped.is_set():
                dropped.set()  # the reply is lost; the client times out waiting for it
                continue
            try:
                client.sendall(reply)
            except OSError:
                return


def _read_some(sock: socket.socket, stop: threading.Event) -> bytes | None:
    while not stop.is_set():
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return None
        return data or None
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("kind", KINDS)
def test_a_begin_that_landed_while_its_resends_were_refused_is_released(
    private_server: EmbeddedRedis, namespace: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SET NX is applied, its reply lost, and both re-sends fail to connect: the store must take
    the begin as "may have landed" (one try may have), so the guard releases the record; a retry then
    runs the tool once. Before: the last error ("connection refused") alone decided "never sent", no
    release went out, and the retry was refused effect_status_unknown for 7 days."""
    direct = RedisEffectStore(private_server.url, namespace=namespace)
    warm = EffectGuard(direct)
    assert call(warm, f"warm-{kind}", Runs(), kind) == "done"  # the store's first begin (a script)
    eater = ReplyEater(private_server.port)
    eater.listen()

    class ReopenAfterLastTry(Tries):
        """Listen again once the begin's last try failed, so the guard's release gets through."""

        def failed(self, exc: BaseException) -> float | None:
            pause = super().failed(exc)
            if pause is None and eater.ate.is_set():
                eater.listen()
            return pause

    monkeypatch.setattr(redis_store, "Tries", ReopenAfterLastTry)
    try:
        store = RedisEffectStore(eater.url, namespace=namespace, socket_timeout=0.5)
        store._scripts_run = True  # as after this store's first begin: begin is the plain SET NX
        store._facts_checked = True
        tool = Runs()
        with pytest.raises(EffectRefused) as refused:
            call(EffectGuard(store), "landed-1", tool, kind)
        assert refused.value.reason == "store_unavailable"
        assert eater.ate.is_set() and tool.count == 0
        assert direct.get("landed-1") is None  # released: a tombstone of the attempt, no record
    finally:
        eater.close()
    assert call(EffectGuard(direct), "landed-1", tool, kind) == "done"
    assert tool.count == 1
    assert call(EffectGuard(direct), "landed-1", tool, kind) == "done"  # and the next one replays
    assert tool.count == 1


# -- 5: out of memory between begin and the end of the call ---------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ending", ["release", "commit", "unknown"])
def test_a_call_ends_its_record_when_memory_fills_while_the_tool_runs(
    private_server: EmbeddedRedis, namespace: str, kind: str, ending: str
) -> None:
    """noeviction, memory over maxmemory once the tool runs: the transition that ends the call still
    lands (release: no record, the retry runs; commit: the value replays; unknown: refused). A new
    call is refused before its tool runs. Before: the release was refused with OOM and the record of
    a tool that never took effect stayed pending for 7 days."""
    admin = private_server.client()
    admin.config_set("maxmemory-policy", "noeviction")
    store = RedisEffectStore(private_server.url, namespace=namespace)
    guard = EffectGuard(store)
    assert call(guard, f"warm-{ending}-{kind}", Runs(), kind) == "done"
    ran: list[str] = []

    def tool() -> str:
        ran.append("x")
        admin.config_set("maxmemory", 1)  # every byte is over the limit from here on
        if ending == "release":
            raise ValueError("the backend said no")  # not ambiguous: the record is released
        if ending == "unknown":
            raise TimeoutError("the backend did not answer")
        return "charged"

    try:
        if ending == "commit":
            assert call(guard, "oom-1", tool, kind) == "charged"
        else:
            with pytest.raises((ValueError, TimeoutError)):
                call(guard, "oom-1", tool, kind)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set(f"{namespace}:probe", "x")  # memory really is full
        new = Runs()
        with pytest.raises(EffectRefused) as refused:
            call(guard, "oom-new", new, kind)
        assert refused.value.reason == "store_unavailable" and new.count == 0
    finally:
        admin.config_set("maxmemory", 0)
    record = store.get("oom-1")
    if ending == "release":
        assert record is None
        assert call(guard, "oom-1", Runs("again"), kind) == "again"
    elif ending == "commit":
        assert record is not None and record.status is Status.COMMITTED
        assert call(guard, "oom-1", tool, kind) == "charged"
    else:
        assert record is not None and record.status is Status.UNKNOWN
        with pytest.raises(EffectRefused) as refused:
            call(guard, "oom-1", tool, kind)
        assert refused.value.reason == "effect_status_unknown"
    assert ran == ["x"]
    admin.close()


# -- 6: a result over the server's proto-max-bulk-len ----------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_result_over_the_servers_bulk_limit_is_committed_without_its_value(
    private_server: EmbeddedRedis, namespace: str, kind: str
) -> None:
    """max_result_bytes raised above the server's proto-max-bulk-len: the caller gets the value, the
    call is committed without it, and a retry is refused result_not_stored (the tool ran once).
    Before: the server dropped the commit's connection, the record stayed pending, and the retry was
    refused effect_status_unknown."""
    admin = private_server.client()
    admin.config_set("proto-max-bulk-len", 1024 * 1024)  # the smallest the server takes: 1 MB
    store = RedisEffectStore(private_server.url, namespace=namespace)
    guard = EffectGuard(store, max_result_bytes=8 * 1024 * 1024)
    big = Runs("x" * (2 * 1024 * 1024))
    assert call(guard, "big-1", big, kind) == big.value
    record = store.get("big-1")
    assert record is not None and record.status is Status.COMMITTED and record.value is None
    with pytest.raises(EffectRefused) as refused:
        call(guard, "big-1", big, kind)
    assert refused.value.reason == "result_not_stored" and big.count == 1
    small = Runs("y" * 1000)  # a result under the limit is still stored and replayed
    assert call(guard, "small-1", small, kind) == small.value
    assert call(guard, "small-1", small, kind) == small.value and small.count == 1
    admin.close()


# -- 7: a user who may SET but not run scripts -----------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_user_who_may_not_run_scripts_is_refused_before_any_tool_runs(
    private_server: EmbeddedRedis, namespace: str, kind: str
) -> None:
    """The store's first begin runs the begin script, so an ACL without EVAL/EVALSHA refuses the
    call before the tool runs, every time, and leaves no record. Before: the plain SET NX begin
    landed, the tool ran, the commit failed with NOPERM: 3 of 3 ran and left pending records."""
    admin = private_server.client()
    user = f"u{secrets.token_hex(4)}"
    allowed = ["-@all", "+get", "+set", "+pttl", "+ping", "+info", "+config|get"]
    admin.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=[f"{namespace}:*"], commands=allowed, reset=True
    )
    try:
        store = RedisEffectStore(f"redis://{user}:pw@{HOST}:{private_server.port}/0", namespace=namespace)
        guard = EffectGuard(store)
        tool = Runs()
        for n in range(3):
            with pytest.raises(EffectRefused) as refused:
                call(guard, f"noscript-{n}", tool, kind)
            assert refused.value.reason == "store_unavailable"
            assert "eval" in str(refused.value).lower()
        assert tool.count == 0
        assert admin.keys(f"{namespace}:*") == []
    finally:
        admin.acl_deluser(user)
        admin.close()


# -- 11: a tool name with a lone surrogate ---------------------------------------------------------
SURROGATE_NAME = "ch\ud800rge"  # what json.loads makes of a model's "ch\\ud800rge"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["memory", "redis"])
def test_a_tool_name_with_a_lone_surrogate_gets_the_same_answers_on_every_store(
    redis_server: EmbeddedRedis, namespace: str, kind: str, where: str
) -> None:
    """Runs once, replays, and a tool that raised is released and may run again, on the in-memory
    store and on Redis alike. Before: the Redis store raised a raw UnicodeEncodeError from begin and
    again from the release."""
    store = (
        InMemoryEffectStore()
        if where == "memory"
        else RedisEffectStore(redis_server.url, namespace=namespace)
    )
    guard = EffectGuard(store)
    tool = Runs()
    assert call(guard, "s-1", tool, kind, name=SURROGATE_NAME) == "done"
    assert call(guard, "s-1", tool, kind, name=SURROGATE_NAME) == "done"
    assert tool.count == 1
    with pytest.raises(EffectRefused) as refused:  # the same id for a tool of another name
        call(guard, "s-1", tool, kind, name="charge")
    assert refused.value.reason == "policy_violation"

    failures: list[str] = []

    def failing() -> str:
        failures.append("x")
        if len(failures) == 1:
            raise ValueError("declined")
        return "second"

    with pytest.raises(ValueError):
        call(guard, "s-2", failing, kind, name=SURROGATE_NAME)
    assert call(guard, "s-2", failing, kind, name=SURROGATE_NAME) == "second"
    assert failures == ["x", "x"]


# -- an error the client library does not wrap --------------------------------------------------------
class _BrokenOnce(redis.Redis):
    """A real client whose next ``SET`` fails inside the library with an error redis-py does not wrap
    (seen: an AttributeError from its Cluster client on an ASK to a node it does not know)."""

    broken = True

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.broken and args and args[0] == "SET":
            type(self).broken = False
            raise AttributeError("'NoneType' object has no attribute 'redis_connection'")
        send: Any = super().execute_command
        return send(*args, **options)


def test_an_error_the_client_does_not_wrap_refuses_the_call_and_releases_it(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    """The guard gets a store_unavailable refusal (the tool does not run), the store sends the release
    of a begin that may have landed, and the retry runs the tool once. Before: the raw AttributeError
    reached the caller, and the release's own failure would have too."""
    client = _BrokenOnce.from_url(redis_server.url)
    store = RedisEffectStore(client=client, namespace=namespace)
    guard = EffectGuard(store)
    assert call(guard, "warm", Runs(), "sync") == "done"  # the first begin is the script, not SET
    tool = Runs()
    with pytest.raises(EffectRefused) as refused:
        call(guard, "odd-1", tool, "sync")
    assert refused.value.reason == "store_unavailable" and "AttributeError" in str(refused.value)
    assert tool.count == 0 and store.get("odd-1") is None
    assert call(guard, "odd-1", tool, "sync") == "done" and tool.count == 1
    client.close()
