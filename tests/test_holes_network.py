"""Requests that are re-sent, arrive late, or are cut by a cancellation, on real redis-server processes
(issue 10: the holes an adversarial review found).

- case 1: a begin re-sent after its reply was lost is covered by the WAIT that follows it, on Redis
  7.2+ semantics too (where WAIT counts only the connection's own writes);
- case 6: a begin that lands after its attempt gave up records nothing (the release's tombstone);
- case 7: ``asyncio.run`` shutting down while begins are in flight leaves no record behind;
- case 8: a cancellation during a begin whose reply is lost still gives the record back;
- also: the tenant ACL that the README gives for ``wait_replicas`` lets calls through.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    RedisEffectStore,
    Status,
    tool_call_context,
)
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.acl import required_commands
from airlock_redis.stores.scripts import script_source
from tests.faults import Action, ChaosProxy, Fault
from tests.procs import MutingProxy, close_socket, connect_upstream, is_script_call, parse_request
from tests.topo_helpers import fresh_id, namespace
from tests.topologies import HOST, RedisProcess, free_ports, wait_until

pytestmark = pytest.mark.redis_server


# -- a primary and one replica of our own ----------------------------------------------------------
class Pair:
    def __init__(self, folder: Path, *, aof: bool = False) -> None:
        primary_port, replica_port = free_ports(2)
        persistence = ["--save", "", *(["--appendonly", "yes"] if aof else [])]
        self.primary = RedisProcess("primary", folder / "primary", primary_port, persistence)
        self.replica = RedisProcess(
            "replica",
            folder / "replica",
            replica_port,
            ["--save", "", "--replicaof", HOST, str(primary_port)],
        )

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.primary.port}/0"

    def start(self) -> Pair:
        self.primary.start()
        self.replica.start()

        def linked() -> bool:
            with self.replica.client() as c:
                return bool(c.info("replication").get("master_link_status") == "up")

        wait_until("the replica to sync", linked, 30, on_fail=self.replica.log_tail())
        return self

    def stop(self) -> None:
        self.resume_replica()
        self.replica.stop()
        self.primary.stop()

    def pause_replica(self) -> None:
        """SIGSTOP: the primary still counts it as connected, but it acknowledges nothing more."""
        assert self.replica.pid is not None
        os.kill(self.replica.pid, signal.SIGSTOP)

    def resume_replica(self) -> None:
        if self.replica.pid is not None and self.replica.alive:
            os.kill(self.replica.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    pair = Pair(tmp_path_factory.mktemp("pair")).start()
    try:
        yield pair
    finally:
        pair.stop()


def server_name(pair: Pair) -> str:
    with pair.primary.client() as c:
        info = c.info("server")
    return f"{info.get('server_name', 'redis')} {info.get('valkey_version', info.get('redis_version'))}"


def call_once(guard: EffectGuard, store: RedisEffectStore, charge: Any, kind: str) -> Any:
    """``charge(5)`` through the guard, as a blocking tool or as a coroutine in its own event loop."""
    if kind == "sync":
        return guard.wrap(charge)(5)

    async def acharge(cents: int) -> int:
        return int(charge(cents))

    async def main() -> Any:
        try:
            return await guard.wrap(acharge)(5)
        finally:
            await store.aclose()

    return asyncio.run(main())


# -- case 1: WAIT after a re-sent begin ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_resent_begin_is_covered_by_its_wait(pair: Pair, kind: str) -> None:
    """The replica stops acknowledging; the first begin+WAIT runs on the primary but its reply is
    lost; redis-py re-sends both on a new connection. The re-sent begin finds its own record: unless
    it writes again, WAIT on the new connection has nothing to wait for and answers at once (Redis
    7.2+ and Valkey), and the tool would run while no replica holds the record."""
    ns, tool_call_id = namespace(), fresh_id()
    RedisEffectStore(pair.url).load_scripts()
    runs: list[int] = []
    with MutingProxy((HOST, pair.primary.port), is_script_call("begin")) as proxy:
        store = RedisEffectStore(
            f"redis://{HOST}:{proxy.port}/0", namespace=ns, wait_replicas=1, wait_timeout=0.5
        )
        guard = EffectGuard(store)

        def charge(cents: int) -> int:
            runs.append(cents)
            return cents

        pair.pause_replica()
        try:
            with tool_call_context(tool_call_id), pytest.raises(EffectRefused) as refused:
                call_once(guard, store, charge, kind)
        finally:
            pair.resume_replica()
        assert len(proxy.muted) == 1 and len(proxy.matched) >= 2, "the begin was not re-sent"
        store.close()
    assert refused.value.reason == "store_unavailable", server_name(pair)
    assert runs == [], f"the tool ran with no replica holding its record ({server_name(pair)})"
    # the attempt gave its record back: a retry runs, once the replica acknowledges again
    retry = RedisEffectStore(pair.url, namespace=ns, wait_replicas=1, wait_timeout=2.0)
    with tool_call_context(tool_call_id):
        assert EffectGuard(retry).wrap(charge)(5) == 5
    assert runs == [5]
    retry.close()


def test_a_begin_resent_on_a_new_connection_gives_its_wait_a_write_to_wait_for(pair: Pair) -> None:
    """The rule itself, one connection at a time: begin on connection A; the replica stops; the same
    begin again, then WAIT, on connection B. WAIT must wait for the replica (and time out), not answer
    at once as it does on Redis 7.2+ for a connection that wrote nothing."""
    key = f"{namespace()}:{{rule}}:call".encode()
    args = ("k" * 64, "charge", "token-1", "0", 60_000, 1)
    source = script_source("begin")
    with pair.primary.client() as first:
        assert first.eval(source, 1, key, *args) == [b"started", 1]
    pair.pause_replica()
    try:
        with pair.primary.client() as second:
            pipe = second.pipeline(transaction=False)
            pipe.eval(source, 1, key, *args)
            pipe.execute_command("WAIT", 1, 300)
            started, acked = pipe.execute()
    finally:
        pair.resume_replica()
    assert started == [b"started", 1]
    assert acked == 0, f"WAIT after the re-sent begin did not wait ({server_name(pair)})"


@pytest.fixture(scope="module")
def aof_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    pair = Pair(tmp_path_factory.mktemp("aof-pair"), aof=True).start()
    try:
        yield pair
    finally:
        pair.stop()


def test_a_resent_begin_on_an_aof_primary_is_covered_by_wait_and_waitaof(aof_pair: Pair) -> None:
    """With an append-only file on the primary, a 7.2+ server gets WAITAOF beside WAIT (a 7.0 server
    has none, and the store leaves it out). A begin re-sent after its reply was lost is covered by
    both, and the call goes through once."""
    ns, tool_call_id = namespace(), fresh_id()
    RedisEffectStore(aof_pair.url).load_scripts()
    with aof_pair.primary.client() as c:
        version = c.info("server").get("redis_version", "0")
    has_waitaof = tuple(int(x) for x in str(version).split(".")[:2]) >= (7, 2)
    runs: list[int] = []
    fault = Fault(is_script_call("begin"), Action.DROP_REPLY)
    with ChaosProxy((HOST, aof_pair.primary.port), [fault]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=ns, wait_replicas=1, wait_timeout=2.0)

        def charge(cents: int) -> int:
            runs.append(cents)
            return cents

        with tool_call_context(tool_call_id):
            assert call_once(EffectGuard(store), store, charge, "sync") == 5
        # the begin and its re-send (EVALSHA), then the commit (EVAL with the script's source)
        assert proxy.applied(Action.DROP_REPLY) == 1 and proxy.forwarded["EVALSHA"] >= 2
        assert proxy.forwarded["EVAL"] >= 1
        assert (proxy.forwarded["WAITAOF"] >= 2) is has_waitaof, (version, dict(proxy.forwarded))
        assert proxy.forwarded["WAIT"] >= 2
        store.close()
    assert runs == [5]
    record = RedisEffectStore(aof_pair.url, namespace=ns).get(tool_call_id)
    assert record is not None and record.status is Status.COMMITTED


def test_the_readme_tenant_acl_serves_wait_replicas(pair: Pair) -> None:
    """What a store user needs (airlock_redis.stores.acl, which docs/security.md lists), with what it
    needs for wait_replicas; WAITAOF only where the server has it (7.2+)."""
    ns = f"tenant{os.getpid()}"
    admin = pair.primary.client()
    admin.acl_setuser(ns, enabled=True, passwords=["+pw"], keys=[f"{ns}:*"], commands=["-@all"], reset=True)
    for name in [*required_commands(wait_replicas=True), "info"]:
        try:
            admin.execute_command("ACL", "SETUSER", ns, f"+{name}")
        except redis.ResponseError:  # a command this server lacks (WAITAOF before 7.2)
            assert name == "waitaof", name
    try:
        store = RedisEffectStore(
            f"redis://{ns}:pw@{HOST}:{pair.primary.port}/0", namespace=ns, wait_replicas=1
        )
        with tool_call_context(fresh_id()):
            assert EffectGuard(store).wrap(lambda: "ok", name="charge")() == "ok"
        store.close()
    finally:
        admin.acl_deluser(ns)
        admin.close()


# -- case 6: a begin that arrives late ---------------------------------------------------------------
class DelayingProxy:
    """Relays 127.0.0.1:<port> to a redis-server; requests that ``match`` are held ``delay`` seconds
    before they are forwarded, on their own connection, even after the client has gone."""

    def __init__(self, upstream: str | Path, match: Any, delay: float) -> None:
        self.upstream, self.match, self.delay = upstream, match, delay
        self.delayed = 0
        self.delivered = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket()
        self._listener.bind((HOST, 0))
        self._listener.listen(16)
        self.port: int = self._listener.getsockname()[1]
        self._closing = threading.Event()

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = connect_upstream(self.upstream)
            upstream.settimeout(None)
            self._spawn(self._requests, client, upstream)
            self._spawn(self._replies, upstream, client)

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        buffer, held = b"", 0.0
        while True:
            try:
                chunk = client.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buffer += chunk
            while (parsed := parse_request(buffer)) is not None:
                args, size = parsed
                raw, buffer = buffer[:size], buffer[size:]
                if self.match(args):
                    with self._lock:
                        self.delayed += 1
                    held = time.monotonic() + self.delay
                    self._spawn(self._later, upstream, raw, held)
                else:
                    upstream.sendall(raw)
        # the client gave up; the held requests still go through, then the upstream link closes
        time.sleep(max(0.0, held - time.monotonic()) + 0.5)
        close_socket(upstream)

    def _later(self, upstream: socket.socket, raw: bytes, when: float) -> None:
        time.sleep(max(0.0, when - time.monotonic()))
        try:
            upstream.sendall(raw)
        except OSError:
            return
        with self._lock:
            self.delivered += 1

    @staticmethod
    def _replies(upstream: socket.socket, client: socket.socket) -> None:
        while True:
            try:
                chunk = upstream.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            try:
                client.sendall(chunk)
            except OSError:
                continue  # the client is gone: drain what the server still answers

    def __enter__(self) -> DelayingProxy:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        close_socket(self._listener)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_begin_that_lands_after_its_attempt_gave_up_records_nothing(
    redis_server: EmbeddedRedis, kind: str
) -> None:
    ns, tool_call_id = namespace(), fresh_id()
    direct = RedisEffectStore(redis_server.url, namespace=ns)
    direct.load_scripts()
    runs: list[int] = []

    def charge(cents: int) -> int:
        runs.append(cents)
        return cents

    with DelayingProxy(redis_server.socket_path, is_script_call("begin"), delay=1.5) as proxy:
        store = RedisEffectStore(f"redis://{HOST}:{proxy.port}/0", namespace=ns, socket_timeout=0.3)
        guard = EffectGuard(store)
        with tool_call_context(tool_call_id), pytest.raises(EffectRefused) as refused:
            call_once(guard, store, charge, kind)
        assert refused.value.reason == "store_unavailable"
        assert direct.get(tool_call_id) is None  # gave up; its release found nothing
        wait_until("the held begins to land", lambda: proxy.delivered == proxy.delayed, 30)
        assert proxy.delayed >= 1
        time.sleep(0.2)  # the server runs what landed
        store.close()
    assert direct.get(tool_call_id) is None, "a late begin left a pending record for a tool that never ran"
    with tool_call_context(tool_call_id):
        assert EffectGuard(direct).wrap(charge)(5) == 5  # the retry is not refused
    assert runs == [5]


# -- case 7: asyncio.run shutting down mid-begin -------------------------------------------------------
CALLS = 120


def _shutdown_run(url: str, ns: str, main_body: Any) -> tuple[set[str], dict[str, Status]]:
    """Start CALLS guarded async calls, let ``main_body(tasks, ran)`` decide when main returns (and so
    when ``asyncio.run`` shuts down); returns the ids whose tool ran and the records left by ids whose
    tool never ran."""
    store = RedisEffectStore(url, namespace=ns)
    ran: set[str] = set()
    ids = [f"shut-{i}" for i in range(CALLS)]

    async def charge(tool_call_id: str) -> str:
        ran.add(tool_call_id)
        return tool_call_id

    tool = EffectGuard(store).wrap(charge)

    async def one(tool_call_id: str) -> None:
        with tool_call_context(tool_call_id):
            await tool(tool_call_id)

    async def main() -> None:
        tasks = [asyncio.get_running_loop().create_task(one(i)) for i in ids]
        await main_body(tasks, ran)

    asyncio.run(main())
    return ran, {i: r.status for i in ids if i not in ran and (r := store.get(i)) is not None}


def test_asyncio_run_shutting_down_while_begins_are_in_the_network_leaves_nothing(
    redis_server: EmbeddedRedis,
) -> None:
    """Every begin is held in the network when main returns: the shutdown cancels them all, and the
    begins land afterwards. None may leave a record: the tools never ran."""
    ns = namespace()
    RedisEffectStore(redis_server.url).load_scripts()
    with DelayingProxy(redis_server.socket_path, is_script_call("begin"), delay=1.0) as proxy:

        async def until_held(tasks: list[asyncio.Task[None]], ran: set[str]) -> None:
            deadline = time.monotonic() + 30
            while proxy.delayed < 10:
                assert time.monotonic() < deadline, "no begin reached the network"
                await asyncio.sleep(0.01)

        ran, left = _shutdown_run(f"redis://{HOST}:{proxy.port}/0", ns, until_held)
        wait_until("the held begins to land", lambda: proxy.delivered == proxy.delayed, 30)
        time.sleep(0.2)
        delayed = proxy.delayed
    direct = RedisEffectStore(redis_server.url, namespace=ns)
    records = {i: direct.get(i) for i in (f"shut-{n}" for n in range(CALLS))}
    # Python 3.11's asyncio.Condition can lose a cancellation that races a notify (a task waiting
    # for a pooled connection): such a call goes on, runs its tool and commits during the shutdown.
    # That is a call that ran once and says so; what must never be is a record for a tool that
    # never ran.
    left = {i: r.status for i, r in records.items() if r is not None and i not in ran}
    unfinished = {
        i: r and r.status
        for i, r in records.items()
        if i in ran and (r is None or r.status is not Status.COMMITTED)
    }
    assert delayed >= 10
    assert left == {}, f"{len(left)} of {CALLS} records left for tools that never ran"
    assert unfinished == {}, "a tool that ran during the shutdown was not committed"


@pytest.mark.parametrize("ran_first", [1, 20])
def test_asyncio_run_shutting_down_while_cancelled_calls_give_back_leaves_nothing(
    redis_server: EmbeddedRedis, ran_first: int
) -> None:
    """A timeout cancels every call (some mid-begin), and main returns at once: the shutdown then
    cancels the hand-backs those cancellations started. They must still finish."""

    async def cancel_then_return(tasks: list[asyncio.Task[None]], ran: set[str]) -> None:
        deadline = time.monotonic() + 30
        while len(ran) < ran_first:
            assert time.monotonic() < deadline, "no call got through begin"
            await asyncio.sleep(0.0005)
        for task in tasks:
            task.cancel()
        await asyncio.sleep(0)  # the cancellations start their hand-backs; then the shutdown

    ran, left = _shutdown_run(redis_server.url, namespace(), cancel_then_return)
    assert 0 < len(ran) < CALLS, "the shutdown did not come while calls were in flight"
    assert left == {}, f"{len(left)} of {CALLS} records left for tools that never ran"


# -- case 8: a cancellation during a begin whose reply is lost -------------------------------------------
def test_a_cancel_during_a_begin_whose_reply_is_lost_gives_the_record_back(
    redis_server: EmbeddedRedis,
) -> None:
    ns, tool_call_id = namespace(), fresh_id()
    direct = RedisEffectStore(redis_server.url, namespace=ns)
    direct.load_scripts()
    runs: list[int] = []

    async def charge(cents: int) -> int:
        runs.append(cents)
        return cents

    with MutingProxy(redis_server.socket_path, is_script_call("begin")) as proxy:
        store = RedisEffectStore(f"redis://{HOST}:{proxy.port}/0", namespace=ns, socket_timeout=5)
        tool = EffectGuard(store).wrap(charge)

        async def main() -> None:
            async def call() -> None:
                with tool_call_context(tool_call_id):
                    await tool(5)

            task = asyncio.create_task(call())
            deadline = time.monotonic() + 10
            while not proxy.muted:  # the begin reached the server; its reply will never come
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            while direct.get(tool_call_id) is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await store.aclose()

        asyncio.run(main())
        store.close()
    assert runs == []
    assert direct.get(tool_call_id) is None, "the cancelled attempt's record was left pending"
    with tool_call_context(tool_call_id):
        assert asyncio.run(EffectGuard(direct).wrap(charge)(5)) == 5
    assert runs == [5]
