"""The auto-pipeline's own wire (``airlock_redis.stores.exchange``), on a real redis-server.

It writes a send's commands on one connection of the client's pool, reads their replies under one
deadline, and keeps up to ``keep`` connections between sends. What must hold:

- a kept connection the server closed meanwhile is reconnected before anything is written on it;
- a send past its deadline fails as "may have landed" (``redis.TimeoutError``), and its connection,
  whose reply may still come, is never used again: the next send reads its own replies;
- an error reply fails only its command and the connection stays in step (and is kept);
- a cancelled send gives its connection back disconnected (the server sees the client go);
- the connection's own socket timeout is back in place before it goes anywhere else;
- a small pool (a user's own) is never held from, and ``aclose`` gives the kept ones back;
- the store uses it only for the asyncio client it built itself (one try per command): a client
  passed in keeps redis-py's command path, and with it its retry policy.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.exchange import KEEP_ONLY_WITH, Exchange, exchange_for
from airlock_redis.stores.tries import never_sent
from tests.resp import names_in, requests_in

pytestmark = pytest.mark.redis_server

STEP_LIMIT = 30.0


def key() -> str:
    return f"ex:{secrets.token_hex(5)}"


def client_of(server: EmbeddedRedis, **options: Any) -> aredis.Redis:
    return aredis.Redis.from_url(server.url, **{"socket_timeout": 5, **options})


async def until_true(fact: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STEP_LIMIT
    while not await fact():
        if loop.time() > deadline:
            pytest.fail(f"{what} did not happen within {STEP_LIMIT:.0f}s", pytrace=False)
        await asyncio.sleep(0.01)


def blocked_clients(admin: redis.Redis) -> int:
    return int(admin.info("clients")["blocked_clients"])


def test_a_kept_connection_the_server_closed_is_reconnected_before_anything_is_written(
    redis_server: EmbeddedRedis,
) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    first, second = key(), key()

    async def scenario() -> tuple[Any, Any, list[Any]]:
        client = client_of(redis_server)
        wire = Exchange(client, keep=2)
        (before,) = await wire.send([("CLIENT", "ID")])
        assert wire.kept == 1
        admin.client_kill_filter(_id=before)
        await asyncio.sleep(0.1)  # the loop sees the connection end
        replies = await wire.send([("SET", first, b"1"), ("SET", second, b"2"), ("CLIENT", "ID")])
        await wire.aclose()
        await client.aclose()
        return before, replies[2], replies[:2]

    before, after, sets = asyncio.run(scenario())
    assert after != before, "the send went out on the killed connection"
    assert sets == [True, True]
    assert admin.mget(first, second) == [b"1", b"2"]


def test_a_send_past_its_deadline_may_have_landed_and_its_connection_is_never_read_again(
    redis_server: EmbeddedRedis,
) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    blocked, plain = key(), key()
    admin.set(plain, b"mine")

    async def scenario() -> tuple[BaseException, list[Any], int]:
        client = client_of(redis_server, socket_timeout=0.3)
        wire = Exchange(client, keep=2)
        with pytest.raises(redis.TimeoutError) as late:
            await wire.send([("BLPOP", blocked, 0)])  # waits for ever on the server
        kept_after_timeout = wire.kept

        async def gone() -> bool:
            return blocked_clients(admin) == 0

        await until_true(gone, "the server seeing the timed-out send's connection close")
        admin.lpush(blocked, b"late")  # would answer the BLPOP, were its connection still open
        replies = await wire.send([("GET", plain)])
        await wire.aclose()
        await client.aclose()
        return late.value, replies, kept_after_timeout

    error, replies, kept_after_timeout = asyncio.run(scenario())
    assert not never_sent(error), "a timed-out send must count as maybe landed"
    assert kept_after_timeout == 0
    assert replies == [b"mine"]
    assert admin.lrange(blocked, 0, -1) == [b"late"], "the abandoned BLPOP was still served"


def test_an_error_reply_fails_only_its_command_and_the_connection_stays_in_step(
    redis_server: EmbeddedRedis,
) -> None:
    text = key()

    async def scenario() -> tuple[list[Any], list[Any], int]:
        client = client_of(redis_server)
        wire = Exchange(client, keep=2)
        replies = await wire.send([("SET", text, b"v"), ("LPUSH", text, b"x"), ("GET", text)])
        alone = await wire.send([("INCR", text)])
        kept = wire.kept
        after = await wire.send([("GET", text), ("STRLEN", text)])
        await wire.aclose()
        await client.aclose()
        return replies, [*alone, *after], kept

    replies, later, kept = asyncio.run(scenario())
    assert replies[0] is True and replies[2] == b"v"
    assert isinstance(replies[1], redis.ResponseError) and "WRONGTYPE" in str(replies[1])
    assert isinstance(later[0], redis.ResponseError)
    assert later[1:] == [b"v", 1]
    assert kept == 1


def test_a_cancelled_send_gives_its_connection_back_disconnected(redis_server: EmbeddedRedis) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    blocked = key()

    async def scenario() -> int:
        client = client_of(redis_server)
        wire = Exchange(client, keep=2)
        sending = asyncio.ensure_future(wire.send([("BLPOP", blocked, 0)]))

        async def blocked_on_server() -> bool:
            return blocked_clients(admin) >= 1

        await until_true(blocked_on_server, "the BLPOP blocking on the server")
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        kept = wire.kept

        async def gone() -> bool:
            return blocked_clients(admin) == 0

        await until_true(gone, "the server seeing the cancelled send's connection close")
        await wire.aclose()
        await client.aclose()
        return kept

    assert asyncio.run(scenario()) == 0
    admin.lpush(blocked, b"x")
    assert admin.lrange(blocked, 0, -1) == [b"x"], "the cancelled BLPOP was still served"


def test_the_connection_gets_its_own_socket_timeout_back(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> list[Any]:
        client = client_of(redis_server, socket_timeout=0.7)
        wire = Exchange(client, keep=1)
        await asyncio.gather(*(wire.send([("PING",)]) for _ in range(4)))  # one kept, others released
        await wire.aclose()
        pool = client.connection_pool
        connections = [await pool.get_connection() for _ in range(2)]
        timeouts = [connection.socket_timeout for connection in connections]
        for connection in connections:
            await pool.release(connection)
        await client.aclose()
        return timeouts

    assert asyncio.run(scenario()) == [0.7, 0.7]


def test_a_small_pool_is_never_held_and_aclose_gives_the_kept_ones_back(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> tuple[int, int, int]:
        small = aredis.Redis.from_pool(
            aredis.BlockingConnectionPool.from_url(redis_server.url, max_connections=KEEP_ONLY_WITH - 1)
        )
        small_wire = Exchange(small, keep=2)
        await asyncio.gather(*(small_wire.send([("PING",)]) for _ in range(4)))
        big = client_of(redis_server)
        big_wire = Exchange(big, keep=2)
        await asyncio.gather(*(big_wire.send([("PING",)]) for _ in range(4)))
        kept_small, kept_big = small_wire.kept, big_wire.kept
        await big_wire.aclose()
        kept_after_close = big_wire.kept
        await small.aclose()
        await big.aclose()
        return kept_small, kept_big, kept_after_close

    kept_small, kept_big, kept_after_close = asyncio.run(scenario())
    assert kept_small == 0
    assert 1 <= kept_big <= 2
    assert kept_after_close == 0


def test_only_plain_asyncio_clients_get_an_exchange(redis_server: EmbeddedRedis) -> None:
    from redis.asyncio.cluster import RedisCluster

    assert exchange_for(client_of(redis_server), keep=2) is not None
    assert exchange_for(object(), keep=2) is None
    assert exchange_for(RedisCluster.__new__(RedisCluster), keep=2) is None


def test_the_store_writes_directly_only_on_the_client_it_built(redis_server: EmbeddedRedis) -> None:
    """The store's own asyncio client (one try per command) goes through the exchange; a client passed
    as ``async_client=`` keeps redis-py's commands (so its retry policy keeps re-sending)."""
    seen: dict[str, list[str]] = {"built": [], "given": []}

    def watch(client: Any, name: str) -> None:
        pool = client.connection_pool

        class Watching(pool.connection_class):  # type: ignore[misc,name-defined]
            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                seen[name].extend(names_in(requests_in(command)))
                await super().send_packed_command(command, check_health)

            async def send_command(self, *args: Any, **kwargs: Any) -> None:  # redis-py's commands
                seen[name].append(f"alone:{str(args[0]).upper()}")
                await super().send_command(*args, **kwargs)

        pool.connection_class = Watching

    async def charge(cents: int) -> int:
        return cents

    async def scenario() -> None:
        built = RedisEffectStore(redis_server.url, namespace=key())
        watch(built.async_client(), "built")
        given_client = client_of(redis_server)
        watch(given_client, "given")
        given = RedisEffectStore(redis_server.url, namespace=key(), async_client=given_client)
        for store in (built, given):
            with tool_call_context(key()):
                assert await EffectGuard(store).wrap(charge)(5) == 5
        await built.aclose()
        await given_client.aclose()

    asyncio.run(scenario())
    # the store's client: the begins and the commit written by the exchange, nothing by execute_command
    # but the first begin's reads of the server's facts; a given client: every command alone
    assert any(name.startswith("EVAL") for name in seen["built"]), seen
    assert not any(name.startswith("alone:EVAL") or name == "alone:SET" for name in seen["built"]), seen
    assert any(name.startswith("alone:EVAL") for name in seen["given"]), seen


@pytest.mark.parametrize(
    "commands",
    [
        [("SET", b"k", b"v", "NX", "PX", 86_400_000)],
        [("EVALSHA", "a" * 40, 1, b"ns:{tag}:id", b"\x00\xff" * 40, -1, 0, "ünïcode ✓", b"")],
        [("SET", b"big", b"x" * 100_000), ("GET", b"big"), ("PING",)],
    ],
    ids=["set-nx", "evalsha-mixed", "large-and-many"],
)
def test_the_exchange_packs_commands_as_redis_py_does(commands: list[tuple[Any, ...]]) -> None:
    from airlock_redis.stores.resp import pack

    connection = aredis.Connection()
    ours = pack(commands)
    assert ours is not None
    assert ours == b"".join(bytes(chunk) for chunk in connection.pack_commands(commands))
    assert requests_in(ours) == [
        tuple(a if isinstance(a, bytes) else str(a).encode() for a in command) for command in commands
    ]


def test_an_argument_the_exchange_does_not_pack_goes_to_redis_py() -> None:
    from airlock_redis.stores.resp import pack

    assert pack([("SET", b"k", 1.5)]) is None
    assert pack([("SET", b"k", True)]) is None
    assert pack([("SET", b"k", memoryview(b"v"))]) is None


def test_a_float_argument_still_reaches_the_server(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> list[Any]:
        client = client_of(redis_server)
        wire = Exchange(client, keep=2)
        replies = await wire.send([("SET", key(), 2.5), ("ECHO", 1.25)])
        await wire.aclose()
        await client.aclose()
        return replies

    assert asyncio.run(scenario()) == [True, b"1.25"]


class PrimaryPool(aredis.ConnectionPool):
    """A pool that says it follows a Sentinel primary (as redis-py's SentinelConnectionPool does with
    ``is_master``), and notes each time it is told to ask Sentinel for the primary again."""

    is_master = True
    asked: list[float]

    async def get_master_address(self) -> tuple[str, int]:
        self.asked.append(asyncio.get_running_loop().time())
        return ("127.0.0.1", 0)


@pytest.mark.parametrize("behind_sentinel", [True, False], ids=["sentinel-primary-pool", "plain-pool"])
def test_a_readonly_answer_from_a_demoted_primary(behind_sentinel: bool) -> None:
    """Behind Sentinel, a server that answers READONLY was demoted by a failover: a plain write's and
    a script's READONLY (Redis 6.2 wraps the script's in ``ERR Error running script``) become
    OnReplica (refused, never applied, sent again by the store's tries), the connection is closed, not
    kept, and the pool asks Sentinel for the primary. On a plain pool they stay the error replies."""
    from airlock_redis.stores.replica_replies import OnReplica

    target = key()
    with EmbeddedRedis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # a replica (of nothing): refuses writes

        async def scenario() -> tuple[list[Any], int, list[float]]:
            pool_class = PrimaryPool if behind_sentinel else aredis.ConnectionPool
            pool = pool_class.from_url(server.url, socket_timeout=5)
            asked: list[float] = []
            if isinstance(pool, PrimaryPool):
                pool.asked = asked
            client = aredis.Redis.from_pool(pool)
            wire = Exchange(client, keep=2)
            script = "return redis.call('SET', KEYS[1], 'x')"
            replies = await wire.send([("SET", target, b"1"), ("EVAL", script, 1, target), ("GET", target)])
            kept = wire.kept
            await wire.aclose()
            await client.aclose()
            return replies, kept, asked

        (plain_write, script_write, read), kept, asked = asyncio.run(scenario())
        admin.execute_command("REPLICAOF", "NO", "ONE")
    assert read is None
    if behind_sentinel:
        assert isinstance(plain_write, OnReplica) and isinstance(script_write, OnReplica)
        assert never_sent(plain_write) and never_sent(script_write)
        assert kept == 0 and len(asked) == 1
    else:
        for refused in (plain_write, script_write):  # READONLY, or the script's error that wraps it
            assert isinstance(refused, redis.exceptions.ReadOnlyError) or "READONLY" in str(refused)
        assert not isinstance(plain_write, OnReplica) and not isinstance(script_write, OnReplica)
        assert kept == 1
