"""The store's short command path (airlock_redis.stores.lane) on a real redis-server: it keeps and
reuses connections, never leaves half a reply on one, re-sends after a dropped connection as the
client would, hands back connections its pool would not keep, and a forked child never writes on a
connection of its parent."""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.exceptions import MaxConnectionsError, NoScriptError
from redis.retry import Retry

from airlock_redis import BeginRequest, RedisEffectStore, idempotency_key
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.lane import AsyncLane, Lane
from airlock_redis.stores.url import sync_client


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    made = sync_client(redis_server.url, socket_timeout=5.0)  # as the store makes it: with retries
    assert isinstance(made, redis.Redis)
    yield made
    made.close()


def _lane(client: redis.Redis) -> Lane:
    lane = Lane.of(client)
    assert lane is not None
    return lane


def test_connections_are_kept_and_reused(client: redis.Redis) -> None:
    lane = _lane(client)
    ids = {lane.execute("CLIENT", "ID") for _ in range(20)}
    assert len(ids) == 1
    assert client.connection_pool._created_connections == 1
    lane.close()
    assert client.connection_pool._created_connections == 1
    assert len(client.connection_pool._available_connections) == 1


def test_raw_replies(client: redis.Redis) -> None:
    lane = _lane(client)
    key = f"lane:{secrets.token_hex(4)}"
    assert lane.execute("SET", key, b"v", "NX", "PX", 60_000) == b"OK"
    assert lane.execute("SET", key, b"w", "NX", "PX", 60_000) is None
    assert client.get(key) == b"v"


def test_an_error_reply_keeps_the_connection(client: redis.Redis) -> None:
    lane = _lane(client)
    before = lane.execute("CLIENT", "ID")
    with pytest.raises(NoScriptError):
        lane.execute("EVALSHA", "0" * 40, 0)
    assert lane.execute("CLIENT", "ID") == before
    assert lane.execute("ECHO", b"next") == b"next"


def test_a_connection_dropped_by_the_server_is_sent_again_once(client: redis.Redis) -> None:
    lane = _lane(client)
    key = f"lane:{secrets.token_hex(4)}"
    first = lane.execute("CLIENT", "ID")
    client.client_kill_filter(_id=first)
    assert lane.execute("INCR", key) == 1  # the dead connection's send never reached the server
    assert client.get(key) == b"1"
    assert lane.execute("CLIENT", "ID") != first


def test_a_timed_out_read_leaves_no_late_reply_behind(redis_server: EmbeddedRedis) -> None:
    impatient = redis.Redis.from_url(redis_server.url, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    try:
        lane = _lane(impatient)
        key = f"lane:{secrets.token_hex(4)}"
        with pytest.raises(redis.TimeoutError):
            lane.execute("BLPOP", key, "0.5")  # the server answers (nil) at 0.5 s, the read gave up at 0.2
        time.sleep(0.6)  # by now a kept connection would hold that late reply, unread
        assert lane.execute("ECHO", b"after") == b"after"
    finally:
        impatient.close()


class _StalePool(redis.ConnectionPool):
    """A pool that takes no connection back, as a Sentinel pool after its primary changed."""

    def owns_connection(self, connection: Any) -> int:
        return False


def test_a_connection_the_pool_would_not_keep_is_handed_back(redis_server: EmbeddedRedis) -> None:
    pool = _StalePool.from_url(redis_server.url)
    stale = redis.Redis(connection_pool=pool)
    try:
        lane = _lane(stale)
        first = lane.execute("CLIENT", "ID")
        assert lane.execute("CLIENT", "ID") != first  # not kept: a new connection each time
        assert not lane._idle
    finally:
        stale.close()


def test_clients_that_keep_their_own_path(redis_server: EmbeddedRedis) -> None:
    blocking = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(redis_server.url))
    single = redis.Redis.from_url(redis_server.url, single_connection_client=True)
    try:
        assert Lane.of(blocking) is None
        assert Lane.of(single) is None
        assert Lane.of(object()) is None
        # the store still works through the client itself
        store = RedisEffectStore(client=blocking, namespace=f"lane:{secrets.token_hex(4)}")
        request = _request()
        assert store.begin(request).kind.value == "started"
    finally:
        blocking.close()
        single.close()


def _request() -> BeginRequest:
    return BeginRequest(
        secrets.token_hex(8), idempotency_key("charge", {"cents": 1}), "charge", secrets.token_hex(16), False
    )


def _child_client_id(store: RedisEffectStore, out: Any) -> None:
    lane = store._lane
    assert lane is not None
    out.put((lane.execute("CLIENT", "ID"), store.begin(_request()).kind.value))


def test_a_forked_child_uses_connections_of_its_own(redis_server: EmbeddedRedis) -> None:
    store = RedisEffectStore(redis_server.url, namespace=f"lane:{secrets.token_hex(4)}")
    try:
        assert store.begin(_request()).kind.value == "started"
        lane = store._lane
        assert lane is not None
        parent_id = lane.execute("CLIENT", "ID")
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_child_client_id, args=(store, out))
        child.start()
        child_id, started = out.get(timeout=30)
        child.join(30)
        assert child.exitcode == 0
        assert started == "started"
        assert child_id != parent_id
        # the parent's kept connection is intact: its next reply is its own
        assert lane.execute("CLIENT", "ID") == parent_id
        assert lane.execute("ECHO", b"parent") == b"parent"
    finally:
        store.close()


# -- the asyncio lane ------------------------------------------------------------------------------
def _alane(client: aredis.Redis) -> AsyncLane:
    lane = AsyncLane.of(client)
    assert lane is not None
    return lane


def _blocking(url: str, size: int, timeout: float | None = 5.0) -> aredis.Redis:
    pool = aredis.BlockingConnectionPool.from_url(
        url, max_connections=size, timeout=timeout, socket_timeout=5.0
    )
    return aredis.Redis.from_pool(pool)


def test_async_connections_are_kept_and_capped_at_the_pool_size(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> None:
        client = _blocking(redis_server.url, 2)
        try:
            lane = _alane(client)
            key = f"lane:{secrets.token_hex(4)}"
            # ten at once, each holding its connection 50 ms: never more than two connections
            replies = await asyncio.gather(*(lane.execute("BLPOP", key, "0.05") for _ in range(10)))
            assert replies == [None] * 10
            ids = {await lane.execute("CLIENT", "ID") for _ in range(10)}
            assert len(ids) <= 2
            clients = await client.client_list()
            assert sum(1 for c in clients if c.get("cmd") in ("blpop", "client|id")) <= 2
        finally:
            await lane.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_async_wait_for_a_connection_is_bounded_by_the_pool_timeout(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> None:
        client = _blocking(redis_server.url, 1, timeout=0.1)
        try:
            lane = _alane(client)
            key = f"lane:{secrets.token_hex(4)}"
            holder = asyncio.ensure_future(lane.execute("BLPOP", key, "0.5"))
            await asyncio.sleep(0.05)
            with pytest.raises(redis.ConnectionError, match="No connection available"):
                await lane.execute("ECHO", b"waits")
            assert await holder is None
            assert await lane.execute("ECHO", b"then") == b"then"
        finally:
            await lane.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_async_a_pool_that_does_not_block_fails_when_full(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> None:
        client = aredis.Redis.from_url(redis_server.url, max_connections=1)
        try:
            lane = _alane(client)
            key = f"lane:{secrets.token_hex(4)}"
            holder = asyncio.ensure_future(lane.execute("BLPOP", key, "0.2"))
            await asyncio.sleep(0.05)
            with pytest.raises(MaxConnectionsError):
                await lane.execute("ECHO", b"full")
            assert await holder is None
        finally:
            await lane.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_async_a_cancelled_command_leaves_no_reply_behind(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> None:
        client = _blocking(redis_server.url, 1)
        try:
            lane = _alane(client)
            key = f"lane:{secrets.token_hex(4)}"
            cut = asyncio.ensure_future(lane.execute("BLPOP", key, "0.3"))
            await asyncio.sleep(0.1)
            cut.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cut
            await asyncio.sleep(0.35)  # the server has answered the BLPOP by now
            # one connection only: had the cut one been kept open, this would read the BLPOP's reply
            assert await lane.execute("ECHO", b"mine") == b"mine"
        finally:
            await lane.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_async_a_cancelled_waiter_loses_no_connection(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> None:
        client = _blocking(redis_server.url, 1)
        try:
            lane = _alane(client)
            key = f"lane:{secrets.token_hex(4)}"
            holder = asyncio.ensure_future(lane.execute("BLPOP", key, "0.2"))
            await asyncio.sleep(0.05)
            waiter = asyncio.ensure_future(lane.execute("ECHO", b"gives up"))
            await asyncio.sleep(0.05)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert await holder is None
            # the one connection is still the lane's to use
            assert await asyncio.wait_for(lane.execute("ECHO", b"after"), 5) == b"after"
        finally:
            await lane.aclose()
            await client.aclose()

    asyncio.run(scenario())


def test_async_store_uses_the_lane_and_closes_it_with_its_loop(redis_server: EmbeddedRedis) -> None:
    store = RedisEffectStore(redis_server.url, namespace=f"lane:{secrets.token_hex(4)}")

    async def scenario() -> tuple[int, int]:
        held = store._loop_client()
        assert held.lane is not None
        for _ in range(5):
            assert (await store.abegin(_request())).kind.value == "started"
        return held.lane._count, len(held.lane._idle)

    made, idle = asyncio.run(scenario())
    assert (made, idle) == (1, 1)  # sequential begins: one connection, kept
    assert not store._async_clients  # the loop's end closed the client and its lane


class _Traced(redis.Redis):
    """A client whose every command passes through a wrapper, as tracing instrumentation does."""

    seen: list[Any]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.seen.append(args[0])
        send: Any = super().execute_command  # through Any: typed or not in the redis-py installed
        return send(*args, **options)


def test_a_client_that_wraps_execute_command_keeps_its_wrapper(redis_server: EmbeddedRedis) -> None:
    traced = _Traced(connection_pool=redis.ConnectionPool.from_url(redis_server.url))
    traced.seen = []
    try:
        assert Lane.of(traced) is None
        store = RedisEffectStore(client=traced, namespace=f"lane:{secrets.token_hex(4)}")
        request = _request()
        assert store.begin(request).kind.value == "started"
        assert store.commit(request, 1, b"\x01\xc0", None).value == "ok"
        assert "SET" in traced.seen and "EVALSHA" in traced.seen
    finally:
        traced.close()
        traced.connection_pool.disconnect()


def test_short_path_off_sends_every_command_through_the_client(redis_server: EmbeddedRedis) -> None:
    store = RedisEffectStore(redis_server.url, namespace=f"lane:{secrets.token_hex(4)}", short_path=False)
    try:
        request = _request()
        assert store.begin(request).kind.value == "started"
        assert store._lane is None

        async def scenario() -> bool:
            held = store._loop_client()
            started = await store.abegin(_request())
            return held.lane is None and started.kind.value == "started"

        assert asyncio.run(scenario())
    finally:
        store.close()
