"""One store, many event loops: each loop gets its own asyncio client, and the client goes away with
its loop, so successive asyncio.run() calls (or threads with their own loops) never pile up
connections on the server.

The connections are the server's own count (CLIENT LIST), of those opened since a test began (by
client id), waited for until the server has seen a close (a bounded wait on that fact). Automatic
garbage collection is off while a test runs: a client the store dropped without closing it keeps its
connection open, instead of having it closed behind the test's back by a collection that happens to
run meanwhile.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio as aredis

from airlock_redis import EffectGuard, RedisEffectStore, Status, StoreError, tool_call_context
from airlock_redis.embedded import EmbeddedRedis
from tests.conftest import require_redis_server

pytestmark = pytest.mark.redis_server

LOOPS = 20
HANG_LIMIT = 60.0  # seconds: a bound so a broken feature fails instead of hanging (not a timing assert)
CLOSE_LIMIT = 10.0  # seconds for the server to see a connection that was closed (a bound, not a wait)


@pytest.fixture(scope="module")
def private_server() -> Iterator[EmbeddedRedis]:
    """A server of its own, so the connection counts below are this module's alone."""
    require_redis_server()
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def admin(private_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = private_server.client()
    yield client
    client.close()


@pytest.fixture(autouse=True)
def no_automatic_gc() -> Iterator[None]:
    """Only what the store closes is closed (see the module's docstring)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Connections:
    """The server's connections opened since this was made (CLIENT LIST, by client id)."""

    def __init__(self, admin: redis.Redis) -> None:
        self.admin = admin
        self.before = {int(c["id"]) for c in admin.client_list()}  # the admin's own included

    def opened(self) -> list[str]:
        """The addresses of the connections opened since, and still open."""
        return [str(c["addr"]) for c in self.admin.client_list() if int(c["id"]) not in self.before]

    def now(self) -> int:
        return len(self.opened())

    def settle(self, expected: int = 0) -> int:
        """Wait until the server holds ``expected`` of them (it sees a close a moment after the client
        made it); fail, saying which are still open, if it does not within CLOSE_LIMIT."""
        deadline = time.monotonic() + CLOSE_LIMIT
        while len(opened := self.opened()) != expected:
            assert time.monotonic() < deadline, f"{len(opened)} connections open, not {expected}: {opened}"
            time.sleep(0.002)
        return expected


def guarded_echo(store: RedisEffectStore) -> Callable[[int], object]:
    async def echo(n: int) -> int:
        await asyncio.sleep(0)
        return n

    return EffectGuard(store).wrap(echo)


async def call(tool: Callable[[int], object], tool_call_id: str, n: int) -> object:
    with tool_call_context(tool_call_id):
        result = tool(n)
        assert asyncio.iscoroutine(result)
        return await result


def make_store(kind: str, server: EmbeddedRedis, namespace: str) -> RedisEffectStore:
    if kind == "url":
        return RedisEffectStore(server.url, namespace=namespace)
    if kind == "twin of a blocking client":
        return RedisEffectStore(client=redis.Redis.from_url(server.url), namespace=namespace)
    return RedisEffectStore(
        async_client=lambda: aredis.Redis.from_url(server.url), namespace=namespace
    )  # "factory"


@pytest.mark.parametrize("kind", ["url", "twin of a blocking client", "factory"])
def test_successive_asyncio_runs_share_a_store_without_piling_up_connections(
    private_server: EmbeddedRedis, admin: redis.Redis, namespace: str, kind: str
) -> None:
    store = make_store(kind, private_server, namespace)
    tool = guarded_echo(store)
    server = Connections(admin)
    for i in range(LOOPS):
        # 8 concurrent calls per loop: several pooled connections per loop, all closed with it
        async def main(i: int = i) -> list[object]:
            calls = asyncio.gather(*(call(tool, f"loop-{i}-{j}", j) for j in range(8)))
            return list(await asyncio.wait_for(calls, HANG_LIMIT))  # fails instead of hanging

        assert asyncio.run(main()) == list(range(8))
        assert store.async_client_loops == frozenset()
        server.settle(0)  # every connection of the loop's client is closed with its loop
    # and every loop's calls were recorded through the one store
    check = RedisEffectStore(private_server.url, namespace=namespace)
    assert all(check.get(f"loop-{i}-7") is not None for i in range(LOOPS))

    async def replay() -> object:
        return await call(tool, "loop-0-3", 3)

    assert asyncio.run(replay()) == 3
    record = check.get("loop-0-3")
    assert record is not None and record.status is Status.COMMITTED
    check.close()


def test_loops_closed_without_shutting_down_async_generators_are_forgotten(
    private_server: EmbeddedRedis, admin: redis.Redis, namespace: str
) -> None:
    store = RedisEffectStore(private_server.url, namespace=namespace)
    tool = guarded_echo(store)
    server = Connections(admin)
    clients: list[weakref.ref[object]] = []

    async def raw_call(i: int) -> object:
        clients.append(weakref.ref(store.async_client()))
        return await call(tool, f"raw-{i}", i)

    for i in range(LOOPS):
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(raw_call(i)) == i
        finally:
            loop.close()  # no shutdown_asyncgens(): the store only learns of it on the next loop
        assert len(store.async_client_loops) == 1  # the earlier closed loops' clients were let go
    assert asyncio.run(call(tool, "raw-final", 1)) == 1
    assert store.async_client_loops == frozenset()
    # a closed loop cannot close its client: the client's connections close when it is collected,
    # which nothing may prevent (no reference to it left anywhere)
    gc.collect()
    assert [i for i, client in enumerate(clients) if client() is not None] == []
    server.settle(0)


def test_aclose_closes_the_running_loops_client_and_the_store_reconnects(
    private_server: EmbeddedRedis, admin: redis.Redis, namespace: str
) -> None:
    store = RedisEffectStore(private_server.url, namespace=namespace)
    tool = guarded_echo(store)
    server = Connections(admin)

    async def main() -> None:
        assert await call(tool, "ac-1", 1) == 1
        first = store.async_client()
        # one: the client pool's (the server facts, begin and commit, one after the other)
        assert server.now() == 1
        await store.aclose()
        server.settle(0)
        assert store.async_client_loops == frozenset()
        assert await call(tool, "ac-1", 1) == 1  # a replay, over a new client
        assert store.async_client() is not first

    asyncio.run(main())
    server.settle(0)


def test_a_client_passed_in_is_the_callers_and_is_not_closed_by_the_store(
    private_server: EmbeddedRedis, admin: redis.Redis, namespace: str
) -> None:
    async def main() -> None:
        mine = aredis.Redis.from_url(private_server.url)
        store = RedisEffectStore(async_client=mine, namespace=namespace)
        assert await call(guarded_echo(store), "own-1", 5) == 5
        assert store.async_client() is mine
        # closed by its owner, not by the store
        await mine.aclose()
        with pytest.raises(StoreError, match="only an async client"):
            store.get("own-1")  # and there is no blocking path to fall back on

    asyncio.run(main())


def test_threads_with_their_own_loops_each_get_a_client(
    private_server: EmbeddedRedis, admin: redis.Redis, namespace: str
) -> None:
    store = RedisEffectStore(private_server.url, namespace=namespace)
    tool = guarded_echo(store)
    server = Connections(admin)
    clients: dict[int, int] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker(n: int) -> None:
        async def main() -> None:
            barrier.wait(timeout=30)  # all four loops alive at once
            assert await call(tool, f"thr-{n}", n) == n
            clients[n] = id(store.async_client())

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a loop did not finish within 60s"
    assert errors == []
    assert len(set(clients.values())) == 4
    assert store.async_client_loops == frozenset()
    server.settle(0)
