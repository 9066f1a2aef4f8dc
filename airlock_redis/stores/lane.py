"""A short path for the store's hot commands: one command, one reply, on a connection of the client's
own pool, without the client's per-command machinery.

redis-py's ``Redis.execute_command`` takes a connection from the pool (a lock, and a ``poll`` of the
socket to see that nothing is left unread), records metrics and events, parses the reply through the
command's callback and gives the connection back, for every command. On a loopback round trip that
bookkeeping costs as much as the round trip itself. A :class:`Lane` keeps the connections it used
(taken from the same pool) and sends on one straight away, with the same connection class, so TLS,
credentials, timeouts, RESP version and a Sentinel-managed connection's failover handling are the
pool's; and with the connection's own ``Retry``, so a command is re-sent after a connection error or
timeout exactly as the client would re-send it (every script of the store is safe to re-send).

A connection is kept only after a complete reply (a command answered with an error reply counts):
anything that interrupts a send or a read closes it and hands it back to the pool, so no kept
connection can hold half a reply. A connection the pool would no longer take back (a Sentinel primary
that changed, a connection of another process) is handed back instead of kept. In a forked child every
lane forgets its connections, which belong to the parent.

What the lane skips: redis-py's client-side cache, and its command metrics and anything else that
wraps ``execute_command`` (tracing). A client with a client-side cache, a single-connection client, a
subclass that overrides ``execute_command``, or (blocking calls) a blocking pool, whose size a kept
connection would count against, gets no lane: the store then sends through the client as before, and
so it does for every client with ``RedisEffectStore(short_path=False)``.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections import deque
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.connection import ConnectionPool as AsyncConnectionPool
from redis.connection import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, ResponseError

# every lane of this process, so that a forked child drops what the parent holds
_LANES: weakref.WeakSet[Lane | AsyncLane] = weakref.WeakSet()


class Lane:
    """Sends one command at a time on a kept connection of ``pool``; thread-safe (a connection is used
    by one thread at a time: it leaves the deque while in use)."""

    __slots__ = ("__weakref__", "_idle", "_pool")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._idle: deque[Any] = deque()
        _LANES.add(self)

    @classmethod
    def of(cls, client: Any) -> Lane | None:
        """A lane for ``client`` (a ``redis.Redis``), or None when it must keep its own path."""
        if not isinstance(client, redis.Redis) or getattr(client, "connection", None) is not None:
            return None
        if type(client).execute_command is not redis.Redis.execute_command:
            return None  # a subclass that wraps every command (tracing, metrics) keeps its wrapper
        pool = client.connection_pool
        if not isinstance(pool, ConnectionPool) or isinstance(pool, BlockingConnectionPool):
            return None
        if getattr(pool, "cache", None) is not None:
            return None
        return cls(pool)

    def execute(self, *args: Any) -> Any:
        """Send ``args`` as one command and return the raw reply (no response callback: ``SET`` gives
        ``b"OK"`` or None). Raises what the connection raises: an error reply as ``ResponseError``,
        a connection failure after the connection's retries."""
        idle = self._idle
        try:
            conn = idle.pop()
        except IndexError:
            conn = self._pool.get_connection()
        try:
            reply = conn.retry.call_with_retry(
                lambda: _exchange(conn, args), lambda _error: conn.disconnect()
            )
        except ResponseError:  # answered in full: the connection is fine
            self._keep(conn)
            raise
        except BaseException:
            conn.disconnect()  # whatever was cut short, nothing half-read stays on it
            self._pool.release(conn)
            raise
        self._keep(conn)
        return reply

    def _keep(self, conn: Any) -> None:
        if _should_reconnect(conn) or not self._pool.owns_connection(conn):
            self._pool.release(conn)  # the pool decides: reconnect, or drop a stale one
        else:
            self._idle.append(conn)

    def close(self) -> None:
        """Give every kept connection back to the pool."""
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return
            self._pool.release(conn)

    def _forget(self) -> None:
        self._idle.clear()


class AsyncLane:
    """The asyncio form, for one event loop (as its client is). Its connections are its own, made by
    the client's pool (same class and settings) and never given to it: at most the pool's
    ``max_connections`` of them; past that a command waits for one (up to a blocking pool's
    ``timeout``) or, beside a pool that does not block, fails with ``MaxConnectionsError`` as the
    pool would. A cancelled command leaves its connection closed (redis-py closes a connection whose
    send or read is cut short), never holding a reply that belongs to no one."""

    __slots__ = ("__weakref__", "_count", "_idle", "_limit", "_pool", "_wait_timeout", "_waiters", "_waits")

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool
        self._idle: deque[Any] = deque()
        self._waiters: deque[asyncio.Future[Any]] = deque()
        self._count = 0  # connections made, idle or in use
        self._limit: int = pool.max_connections
        # beside a blocking pool, wait up to its timeout for a connection (None: for ever)
        self._waits = isinstance(pool, aredis.BlockingConnectionPool)
        self._wait_timeout: float | None = getattr(pool, "timeout", None)
        _LANES.add(self)

    @classmethod
    def of(cls, client: Any) -> AsyncLane | None:
        """A lane for ``client`` (a ``redis.asyncio.Redis``), or None when it keeps its own path."""
        if not isinstance(client, aredis.Redis) or client.single_connection_client:
            return None
        if type(client).execute_command is not aredis.Redis.execute_command:
            return None
        pool = client.connection_pool
        if not isinstance(pool, AsyncConnectionPool):
            return None
        return cls(pool)

    async def execute(self, *args: Any) -> Any:
        """Coroutine form of :meth:`Lane.execute`."""
        conn = await self._take()
        try:
            reply = await conn.retry.call_with_retry(
                lambda: _aexchange(conn, args), lambda _error: conn.disconnect()
            )
        except BaseException as error:
            # An error reply leaves the connection as it was; anything else that cut the exchange short
            # (a failure after the retries, a cancellation) has made redis-py close it already. Either
            # way it holds nothing unread.
            if not isinstance(error, ResponseError) and _connected(conn):
                _close_now(conn)
            self._give(conn)
            raise
        try:
            if _should_reconnect(conn) or _stale(self._pool, conn):
                await conn.disconnect()  # it connects again, to the pool's current primary, when next used
        finally:
            self._give(conn)
        return reply

    async def _take(self) -> Any:
        try:
            return self._idle.pop()
        except IndexError:
            pass
        if self._count < self._limit:
            self._count += 1
            return self._pool.make_connection()
        if not self._waits:
            raise MaxConnectionsError("Too many connections")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        self._waiters.append(waiter)
        timer = None
        if self._wait_timeout is not None:
            timer = loop.call_later(self._wait_timeout, _expire, waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give(waiter.result())  # handed over as this waiter gave up: pass it on
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _give(self, conn: Any) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    async def aclose(self) -> None:
        """Close every idle connection (the lane makes new ones if it is used again)."""
        while self._idle:
            conn = self._idle.pop()
            self._count -= 1
            await conn.disconnect()

    def _forget(self) -> None:
        self._idle.clear()
        self._count = 0


def _connected(conn: Any) -> bool:
    """Whether the connection holds an open socket (``is_connected`` where redis-py has it, 6.x reads
    its socket attributes)."""
    if hasattr(type(conn), "is_connected"):
        return bool(conn.is_connected)
    return getattr(conn, "_sock", None) is not None or getattr(conn, "_writer", None) is not None


def _should_reconnect(conn: Any) -> bool:
    """A server maintenance notice asked for a new connection (redis-py 7+; never before)."""
    asked = getattr(conn, "should_reconnect", None)
    return bool(asked()) if asked is not None else False


def _close_now(conn: Any) -> None:
    """Close a connection without awaiting (redis-py's own synchronous close when it has one)."""
    close = getattr(conn, "_close", None)
    if close is not None:
        close()


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(RedisConnectionError("No connection available."))


def _stale(pool: Any, conn: Any) -> bool:
    """A connection to a Sentinel primary that is no longer the one the pool names."""
    if not getattr(pool, "is_master", False):
        return False
    address = getattr(pool, "master_address", None)
    return address is not None and address != (conn.host, conn.port)


async def _aexchange(conn: Any, args: tuple[Any, ...]) -> Any:
    if not _connected(conn):
        await conn.connect()  # not send's own connect: a Sentinel-managed connection finds the primary here
    await conn.send_packed_command(conn.pack_command(*args))
    return await conn.read_response()


def _exchange(conn: Any, args: tuple[Any, ...]) -> Any:
    if not _connected(conn):
        conn.connect()  # not send's own connect: a Sentinel-managed connection finds the primary here
    conn.send_packed_command(conn.pack_command(*args))
    return conn.read_response()


def _forget_in_child() -> None:
    for lane in list(_LANES):
        lane._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
