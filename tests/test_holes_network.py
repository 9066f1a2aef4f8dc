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
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
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
from tests.procs import is_script_call
from tests.resp import requests_in
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
    lost = Fault(is_script_call("begin"), Action.DROP_REPLY)
    with ChaosProxy((HOST, pair.primary.port), [lost]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=ns, wait_replicas=1, wait_timeout=0.5)
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
        assert lost.applied == 1 and lost.seen >= 2, "the begin was not re-sent"
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
        # the begin and its re-send, then the commit (each as EVALSHA or EVAL: which one is the
        # store's choice, counted by tests/test_script_commands.py)
        assert proxy.applied(Action.DROP_REPLY) == 1
        assert proxy.forwarded["EVALSHA"] + proxy.forwarded["EVAL"] >= 3, dict(proxy.forwarded)
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
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_begin_that_lands_after_its_attempt_gave_up_records_nothing(
    redis_server: EmbeddedRedis, kind: str
) -> None:
    """Every begin (and every re-send of it) is held in the network until the attempt has given up
    and released; then they all land. None may leave a record: the tool never ran."""
    ns, tool_call_id = namespace(), fresh_id()
    direct = RedisEffectStore(redis_server.url, namespace=ns)
    direct.load_scripts()
    runs: list[int] = []

    def charge(cents: int) -> int:
        runs.append(cents)
        return cents

    # held until release_held(): they land after the attempt gave up, however long that took
    held = Fault(is_script_call("begin"), Action.DELAY, times=10**9, delay=math.inf)
    with ChaosProxy(redis_server.socket_path, [held]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=ns, socket_timeout=0.3)
        guard = EffectGuard(store)
        with tool_call_context(tool_call_id), pytest.raises(EffectRefused) as refused:
            call_once(guard, store, charge, kind)
        assert refused.value.reason == "store_unavailable"
        assert proxy.delivered_late == [], "a held begin reached the server before the attempt gave up"
        assert direct.get(tool_call_id) is None  # gave up; its release found nothing
        store.close()  # every connection that carried a begin is closed by its client now
        released = proxy.release_held()
        assert released >= held.applied >= 1
        # the server has run every late begin (it closed their connections after the last request)
        proxy.wait_delivered(30)
        assert len(proxy.delivered_late) == released
    assert direct.get(tool_call_id) is None, "a late begin left a pending record for a tool that never ran"
    with tool_call_context(tool_call_id):
        assert EffectGuard(direct).wrap(charge)(5) == 5  # the retry is not refused
    assert runs == [5]


# -- case 7: asyncio.run shutting down mid-begin -------------------------------------------------------
CALLS = 120


class HandBackCountingStore(RedisEffectStore):
    """A store that counts the settles (the guard's hand-backs of cancelled calls' begins) that were
    started, and those a cancellation interrupted on their way (each is then sent again)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settles = 0
        self.interrupted = 0

    async def asettle(self, *args: Any, **kwargs: Any) -> Any:
        self.settles += 1
        try:
            return await super().asettle(*args, **kwargs)
        except asyncio.CancelledError:
            self.interrupted += 1
            raise


async def until(what: str, fact: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait, in a running event loop, until ``fact()`` holds; fail saying ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not fact():
        assert time.monotonic() < deadline, f"{what}: not so after {timeout}s"
        await asyncio.sleep(0.001)


def _shutdown_run(store: RedisEffectStore, main_body: Any) -> tuple[set[str], dict[str, Status]]:
    """Start CALLS guarded async calls, let ``main_body(tasks, ran)`` decide when main returns (and so
    when ``asyncio.run`` shuts down); returns the ids whose tool ran and the records left by ids whose
    tool never ran."""
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
    held = Fault(is_script_call("begin"), Action.DELAY, times=10**9, delay=1.0)
    with ChaosProxy(redis_server.socket_path, [held]) as proxy:

        async def until_held(tasks: list[asyncio.Task[None]], ran: set[str]) -> None:
            await until("ten begins held in the network", lambda: held.applied >= 10)

        ran, _ = _shutdown_run(RedisEffectStore(proxy.url, namespace=ns), until_held)
        # the server has run every late begin (it closed their connections after the last request)
        proxy.wait_delivered(30)
        delayed = held.applied
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

    store = HandBackCountingStore(redis_server.url, namespace=namespace())

    async def cancel_then_return(tasks: list[asyncio.Task[None]], ran: set[str]) -> None:
        await until(f"{ran_first} calls through begin", lambda: len(ran) >= ran_first)
        for task in tasks:
            task.cancel()
        # One step of the loop, not a wait: the cancelled calls run their cancellation (each starts
        # its hand-back) and main returns. Anything that waited longer would let hand-backs finish
        # before the shutdown; that the shutdown did interrupt some is checked below.
        await asyncio.sleep(0)

    ran, left = _shutdown_run(store, cancel_then_return)
    assert 0 < len(ran) < CALLS, "the shutdown did not come while calls were in flight"
    assert store.interrupted > 0, f"the shutdown interrupted none of {store.settles} hand-backs"
    assert left == {}, f"{len(left)} of {CALLS} records left for tools that never ran"


# -- case 8: a cancellation during a begin whose reply is lost -------------------------------------------
def signal_begin_reads(client: Any, reading: asyncio.Event) -> None:
    """Set ``reading`` when a connection of ``client`` (a redis.asyncio client that has made none yet)
    starts to read the reply to a begin: from then on its call waits for that reply. A cancellation
    that comes earlier, while redis-py still sends the begin (through ``asyncio.wait_for`` when a
    socket timeout is set, as ``auto_pipeline=False`` sends), can be lost on Python 3.11, and the
    call then goes on as if none came."""
    pool = client.connection_pool
    is_begin = is_script_call("begin")

    class BeginReadSignalling(pool.connection_class):  # type: ignore[misc,name-defined]
        begin_sent = False

        async def send_command(self, *args: Any, **kwargs: Any) -> None:  # a command alone
            raw = [a if isinstance(a, bytes) else str(a).encode() for a in args]
            self.begin_sent = is_begin(raw)
            await super().send_command(*args, **kwargs)

        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            # the store's auto-pipeline's sends (and a command alone, after send_command above)
            self.begin_sent = any(is_begin(list(args)) for args in requests_in(command))
            await super().send_packed_command(command, check_health)

        async def read_response(self, *args: Any, **kwargs: Any) -> Any:
            if self.begin_sent:
                reading.set()
            return await super().read_response(*args, **kwargs)

    pool.connection_class = BeginReadSignalling


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

    lost = Fault(is_script_call("begin"), Action.DROP_REPLY)
    with ChaosProxy(redis_server.socket_path, [lost]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=ns, socket_timeout=5)
        tool = EffectGuard(store).wrap(charge)

        async def main() -> None:
            async def call() -> None:
                with tool_call_context(tool_call_id):
                    await tool(5)

            reading = asyncio.Event()
            signal_begin_reads(store.async_client(), reading)
            task = asyncio.create_task(call())
            # the begin reached the server (its reply will never come) and the server ran it, and
            # the call waits for that reply
            await until("the begin's reply lost", lambda: lost.applied == 1, 10)
            await until("the begin's record on the server", lambda: direct.get(tool_call_id) is not None, 10)
            await until("the call reading the begin's reply", reading.is_set, 10)
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
