"""The blocking store's own wire (``airlock_redis.stores.blocking_wire``), on a real redis-server.

It writes each command on a connection of the client's pool and reads its reply, without redis-py's
command path around them. What must hold:

- replies are what redis-py's ``execute_command`` gives for the same command (response callbacks
  applied), and an error reply is raised as redis-py raises it, the connection back in the pool and
  in step;
- a command past the socket timeout fails as "may have landed" (``redis.TimeoutError``), and its
  connection, whose reply may still come, is closed before it goes back: the next command reads its
  own reply;
- anything else that interrupts a command (``KeyboardInterrupt`` included) closes the connection
  before it goes back to the pool;
- behind Sentinel, a READONLY answer (plain, or a script's as Redis 6.2 wraps it) is raised as
  OnReplica (refused, never applied), the connection closed, and the pool asks for the primary;
- a forked child sends on connections of its own;
- the store uses it only for the blocking client it built itself (one try per command): a client
  passed in keeps redis-py's command path, and with it its retry policy.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Any

import pytest
import redis

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.blocking_wire import BlockingWire, blocking_wire_for
from airlock_redis.stores.replica_replies import OnReplica
from airlock_redis.stores.tries import never_sent

pytestmark = pytest.mark.redis_server


def key() -> str:
    return f"bw:{secrets.token_hex(5)}"


def in_use(client: redis.Redis) -> int:
    return len(client.connection_pool._in_use_connections)


def client_ids(admin: redis.Redis) -> set[int]:
    return {int(entry["id"]) for entry in admin.client_list()}


def test_replies_are_redis_pys_and_an_error_reply_leaves_the_connection_in_step(
    redis_server: EmbeddedRedis,
) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    wire = BlockingWire(client)
    target = key()
    script = "return {KEYS[1], ARGV[1], 7}"
    commands: list[tuple[Any, ...]] = [
        ("SET", target, b"v", "NX", "PX", 60_000),  # a callback: True, not b"OK"
        ("SET", target, b"v", "NX", "PX", 60_000),  # NX refused: None
        ("GET", target),
        ("PTTL", target),
        ("EVAL", script, 1, target, "ünï ✓"),
        ("PING",),
        ("ECHO", 1.25),  # not packed by the store: redis-py's packer
    ]
    ours = [wire.command(args) for args in commands]
    client.delete(target)
    theirs = [client.execute_command(*args) for args in commands]
    assert ours[0] is True and ours[1] is None and ours[2] == b"v" and ours[6] == b"1.25"
    assert ours[:3] == theirs[:3] and ours[4:] == theirs[4:]
    assert 0 < ours[3] <= 60_000 and 0 < theirs[3] <= 60_000
    connection = client.connection_pool._available_connections[-1]
    with pytest.raises(redis.exceptions.NoScriptError):
        wire.command(("EVALSHA", "0" * 40, 1, target))
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        wire.command(("GET",))
    assert in_use(client) == 0
    assert client.connection_pool._available_connections == [connection]  # the same one, kept open
    assert connection._sock is not None
    assert wire.command(("GET", target)) == b"v"  # in step: this reply is this command's
    client.close()


def test_a_timed_out_command_closes_its_connection_and_the_next_reads_its_own_reply(
    redis_server: EmbeddedRedis,
) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.3)
    admin = redis_server.client()
    wire = BlockingWire(client)
    queue, target = key(), key()
    wire.command(("SET", target, b"mine"))
    first = int(wire.command(("CLIENT", "ID")))  # the pool's one connection, used again and again
    with pytest.raises(redis.TimeoutError):
        wire.command(("BLPOP", queue, 2))  # the reply comes after the socket timeout, or never
    assert in_use(client) == 0
    admin.rpush(queue, b"late")  # had the old connection stayed open, BLPOP would answer this
    assert wire.command(("GET", target)) == b"mine"
    gone_by = time.monotonic() + 10  # the server notes the closed socket in its next turn
    while first in client_ids(admin) and time.monotonic() < gone_by:
        time.sleep(0.01)
    assert first not in client_ids(admin)  # the connection that timed out is gone
    assert int(wire.command(("CLIENT", "ID"))) != first
    assert admin.lpop(queue) == b"late"  # nobody's BLPOP took it
    client.close()
    admin.close()


def test_an_interruption_mid_command_closes_the_connection_before_it_goes_back(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    wire = BlockingWire(client)
    wire.command(("PING",))
    connection = client.connection_pool._available_connections[-1]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # as a signal handler's exception arrives between write and read

    monkeypatch.setattr(connection, "read_response", interrupted)
    with pytest.raises(KeyboardInterrupt):
        wire.command(("SET", key(), b"v"))
    monkeypatch.undo()
    assert in_use(client) == 0 and connection._sock is None  # closed, then given back
    assert wire.command(("PING",)) is True  # reconnected by the pool's checkout
    client.close()


class PrimaryPool(redis.ConnectionPool):
    """A pool that says it follows a Sentinel primary (as redis-py's SentinelConnectionPool does with
    ``is_master``), and notes each time it is told to ask Sentinel for the primary again."""

    is_master = True
    asked: list[float]

    def get_master_address(self) -> tuple[str, int]:
        self.asked.append(time.monotonic())
        return ("127.0.0.1", 0)


@pytest.mark.parametrize("behind_sentinel", [True, False], ids=["sentinel-primary-pool", "plain-pool"])
def test_a_readonly_answer_from_a_demoted_primary(behind_sentinel: bool) -> None:
    """Behind Sentinel, a plain write's and a script's READONLY (Redis 6.2 wraps the script's in
    ``ERR Error running script``) become OnReplica (refused, never applied, sent again by the store's
    tries), the connection is closed, and the pool asks Sentinel for the primary. On a plain pool
    they stay the error replies, and the connection stays open."""
    target = key()
    with EmbeddedRedis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # a replica (of nothing): refuses writes
        try:
            pool_class = PrimaryPool if behind_sentinel else redis.ConnectionPool
            pool = pool_class.from_url(server.url, socket_timeout=5)
            asked: list[float] = []
            if isinstance(pool, PrimaryPool):
                pool.asked = asked
            client = redis.Redis.from_pool(pool)
            wire = BlockingWire(client)
            script = "return redis.call('SET', KEYS[1], 'x')"
            errors: list[Exception] = []
            open_after: list[bool] = []
            for args in (("SET", target, b"1"), ("EVAL", script, 1, target)):
                with pytest.raises(redis.RedisError) as raised:
                    wire.command(args)
                errors.append(raised.value)
                open_after.append(all(c._sock is not None for c in pool._available_connections))
            assert wire.command(("GET", target)) is None and in_use(client) == 0
            client.close()
        finally:
            admin.execute_command("REPLICAOF", "NO", "ONE")
            admin.close()
    if behind_sentinel:
        assert all(isinstance(error, OnReplica) and never_sent(error) for error in errors)
        assert open_after == [False, False] and len(asked) == 2
    else:
        for refused in errors:  # READONLY, or the script's error that wraps it
            assert isinstance(refused, redis.exceptions.ReadOnlyError) or "READONLY" in str(refused)
            assert not isinstance(refused, OnReplica)
        assert open_after == [True, True]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")
def test_a_forked_child_sends_on_connections_of_its_own(redis_server: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    admin = redis_server.client()
    wire = BlockingWire(client)
    target = key()
    wire.command(("SET", target, b"parent"))
    parents = {int(entry["id"]) for entry in admin.client_list() if entry["cmd"] in ("set", "client|list")}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own connection, never the parent's socket
        code = 1
        try:
            wire.command(("SET", target, b"child"))
            own = int(wire.command(("CLIENT", "ID")))
            os.write(write, str(own).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child_id = int(os.read(read, 64) or b"0")
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_id and child_id not in parents
    assert wire.command(("GET", target)) == b"child"  # the parent's connection still in step
    client.close()
    admin.close()


def test_only_a_plain_client_with_a_pool_gets_a_wire(redis_server: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(redis_server.url)
    single = redis.Redis.from_url(redis_server.url, single_connection_client=True)
    assert isinstance(blocking_wire_for(client), BlockingWire)
    assert blocking_wire_for(single) is None  # held to its one connection: redis-py's path
    assert blocking_wire_for(object()) is None
    client.close()
    single.close()


def test_the_store_uses_the_wire_only_for_the_blocking_client_it_built(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's own client makes one try per command: its begins and commits go on the wire. A
    client passed in keeps redis-py's command path (and its retry policy)."""
    through_redis_py: list[str] = []
    execute: Any = redis.Redis.execute_command

    def counted(self: redis.Redis, *args: Any, **options: Any) -> Any:
        through_redis_py.append(str(args[0]))
        return execute(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", counted)

    ran: list[int] = []

    def charge(cents: int) -> dict[str, int]:
        ran.append(cents)
        return {"cents": cents}

    built = RedisEffectStore(redis_server.url, namespace=f"bw{secrets.token_hex(3)}")
    given = RedisEffectStore(client=redis.Redis.from_url(redis_server.url), namespace=built.namespace)
    for store, name in ((built, "built"), (given, "given")):
        tool = EffectGuard(store).wrap(charge)
        for i in range(3):
            with tool_call_context(f"{name}-{i}"):
                assert tool(i) == {"cents": i}
            with tool_call_context(f"{name}-{i}"):
                assert tool(i) == {"cents": i}  # a replay: the stored value, the tool not run again
        assert ran == [0, 1, 2]
        ran.clear()
        seen, through_redis_py[:] = list(through_redis_py), []
        data_commands = [c for c in seen if c.upper() in ("SET", "EVAL", "EVALSHA")]
        if store is built:
            assert data_commands == [], seen
        else:
            assert len(data_commands) >= 6, seen
        store.close()


# -- batches: the write-behind sender's ---------------------------------------------------------------
def test_a_batch_gets_each_reply_with_an_error_in_place_and_the_connection_stays_in_step(
    redis_server: EmbeddedRedis,
) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    wire = BlockingWire(client)
    target = key()
    commands: list[tuple[Any, ...]] = [
        ("SET", target, b"1", "NX"),
        ("EVALSHA", "0" * 40, 1, target),  # NOSCRIPT, in the middle of the batch
        ("INCR", target),
        ("GET",),  # a wrong number of arguments
        ("GET", target),
    ]
    ours = wire.send(commands)
    client.delete(target)
    pipe = client.pipeline(transaction=False)
    for args in commands:
        pipe.execute_command(*args)
    theirs = pipe.execute(raise_on_error=False)
    assert [type(reply) for reply in ours] == [type(reply) for reply in theirs]
    assert ours[0] is True and ours[2] == 2 and ours[4] == b"2"
    assert isinstance(ours[1], redis.exceptions.NoScriptError)
    assert isinstance(ours[3], redis.ResponseError) and "wrong number" in str(ours[3])
    assert in_use(client) == 0
    assert wire.send([("GET", target), ("PING",)]) == [b"2", True]  # in step
    client.close()


def test_a_batch_whose_connection_drops_fails_whole_and_the_connection_is_closed(
    redis_server: EmbeddedRedis,
) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    admin = redis_server.client()
    wire = BlockingWire(client)
    own = int(wire.command(("CLIENT", "ID")))
    target, queue = key(), key()
    killer = threading.Timer(0.3, lambda: admin.client_kill_filter(_id=str(own)))  # while BLPOP waits
    killer.start()
    try:
        with pytest.raises(redis.ConnectionError):
            wire.send([("SET", target, b"1"), ("BLPOP", queue, 4), ("GET", target)])
    finally:
        killer.join()
    assert in_use(client) == 0
    assert client.connection_pool._available_connections[-1]._sock is None
    assert admin.get(target) == b"1"  # the first command landed: "may have landed" is the truth
    assert wire.send([("GET", target)]) == [b"1"]
    client.close()
    admin.close()


def test_a_readonly_answer_in_a_batch_behind_sentinel_refuses_the_whole_batch() -> None:
    target = key()
    with EmbeddedRedis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("REPLICAOF", "127.0.0.1", "1")
        try:
            pool = PrimaryPool.from_url(server.url, socket_timeout=5)
            pool.asked = []
            client = redis.Redis.from_pool(pool)
            wire = BlockingWire(client)
            script = "return redis.call('SET', KEYS[1], 'x')"
            with pytest.raises(OnReplica) as refused:
                wire.send([("GET", target), ("EVAL", script, 1, target), ("SET", target, b"1")])
            assert never_sent(refused.value) and len(pool.asked) == 1
            assert in_use(client) == 0
            assert all(c._sock is None for c in pool._available_connections)
            client.close()
        finally:
            admin.execute_command("REPLICAOF", "NO", "ONE")
            admin.close()


def test_the_write_behind_sender_batches_on_the_wire_of_the_client_the_store_built(
    redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocking write-behind commits go out on the store's wire; a client passed in keeps its
    pipeline. Either way every commit lands and replays."""
    pipelined: list[int] = []
    execute: Any = redis.client.Pipeline.execute

    def counted(self: redis.client.Pipeline, *args: Any, **options: Any) -> Any:
        pipelined.append(len(self.command_stack))
        return execute(self, *args, **options)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counted)
    ran: list[int] = []

    def charge(cents: int) -> dict[str, int]:
        ran.append(cents)
        return {"cents": cents}

    namespace = f"bwwb{secrets.token_hex(3)}"
    built = RedisEffectStore(redis_server.url, namespace=namespace, write_behind=True)
    given = RedisEffectStore(
        client=redis.Redis.from_url(redis_server.url), namespace=namespace, write_behind=True
    )
    for store, name in ((built, "built"), (given, "given")):
        tool = EffectGuard(store).wrap(charge)
        for i in range(5):
            with tool_call_context(f"{name}-{i}"):
                assert tool(i) == {"cents": i}
        assert store.flush(10)
        seen, pipelined[:] = list(pipelined), []
        if store is built:
            assert seen == [], seen  # reads of the server's facts aside, no pipeline at all
        else:
            assert sum(seen) >= 5, seen
        for i in range(5):
            with tool_call_context(f"{name}-{i}"):
                assert tool(i) == {"cents": i}  # committed: replayed, not run again
        assert ran == [0, 1, 2, 3, 4]
        ran.clear()
        store.close()
