"""The auto-pipeline's wire for a plain ``redis.asyncio.Redis`` client (one server, or Sentinel's
primary): commands packed and written at once on one connection of the client's own pool, their
replies read back in order, through the connection's and the pool's public methods
(``send_packed_command``, ``read_response``; ``get_connection``, ``ensure_connection``,
``release``). The store's commands, whose arguments are all bytes, str or int, are packed into RESP
here (:func:`.resp.pack`, checked against redis-py's own packer by the tests); any other argument goes
through the connection's ``pack_commands``.

Why not ``client.execute_command`` or ``pipeline()``: for each command those take a connection from
the pool and give it back, write under ``asyncio.wait_for`` (a task per write on Python 3.11) and read
each reply under a timeout of its own; on this 2-core machine that was about half of the client CPU
of an auto-pipelined call (see docs/performance.md). Here:

- **one deadline per exchange**: the client's socket timeout bounds the write and every reply of the
  exchange together (while the exchange holds its connection, the connection's own per-step timeouts
  are off; they are put back before the connection goes anywhere else). An exchange that runs past
  it fails with :class:`redis.TimeoutError`, as one command would: it may have landed. The deadlines
  of a loop's exchanges share one timer (:mod:`.deadlines`): an ``asyncio.timeout`` per exchange was
  about a tenth of a lone call's round trip.
- **kept connections**: up to ``keep`` connections stay with the exchange between sends instead of
  going back to the pool, each checked by the pool's own ``ensure_connection`` before it is used
  again (a connection the server closed meanwhile is reconnected before anything is written on it).
  Only where the pool has room to spare (``max_connections >= KEEP_ONLY_WITH``): a small pool a user
  sized for their own commands is never held. :meth:`Exchange.aclose` gives them back.

Each command's error reply comes back in place of its reply (the others are read on: the
connection is still in step); any other failure (the connection lost, the deadline, a cancellation)
disconnects the connection, which is then given back to the pool, and is the whole exchange's
failure, raised: every command of it may have landed.

Behind Sentinel, a ``READONLY`` answer means the server this connection reaches was demoted by a
failover. redis-py's Sentinel connection turns a plain ``READONLY`` into a dropped connection; a
script's ``READONLY`` comes back as a plain error reply on Redis 6.2 (``ERR Error running script ...
-READONLY ...``), and a connection kept here would go on reaching the demoted server. So such a
reply becomes :class:`.replica_replies.OnReplica` (a connection error that says the command was
refused, never applied: the store's tries send it again), the connection is closed, and the pool
asks Sentinel for the primary (``get_master_address``, which closes the pool's idle connections to
the old one).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster

from .deadlines import SUPPORTED as KEEPS_DEADLINES
from .deadlines import Deadlines
from .replica_replies import as_refused, from_a_replica
from .resp import packer_for

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline
else:  # pragma: no cover - redis-py requires async-timeout on Python 3.10
    from async_timeout import timeout as deadline


# A pool smaller than this is never held from (a BlockingConnectionPool made for a user's own
# commands, say); the store's own pools hold 50.
KEEP_ONLY_WITH = 16


class Exchange:
    """Sends commands on connections of ``client``'s pool, keeping up to ``keep`` between sends."""

    __slots__ = ("_callbacks", "_deadlines", "_follows_primary", "_idle", "_keep", "_pack", "_pool")

    def __init__(self, client: aredis.Redis, *, keep: int) -> None:
        self._pool: Any = client.connection_pool
        self._callbacks: dict[Any, Any] = dict(client.response_callbacks)
        room = getattr(self._pool, "max_connections", 0) or 0
        self._keep = keep if room >= KEEP_ONLY_WITH else 0
        self._idle: list[Any] = []
        self._deadlines: Deadlines | None = None  # made on the first send, on the loop it runs on
        # a Sentinel pool of the primary: a READONLY answer means a failover (see the module docstring)
        self._follows_primary = getattr(self._pool, "is_master", False) is True
        # the store's commands (bytes, str, int arguments) packed here; anything else by redis-py
        self._pack = packer_for(client)

    @property
    def kept(self) -> int:
        """How many connections wait here for the next send."""
        return len(self._idle)

    async def send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The replies to ``commands``, in order, an error reply as its exception."""
        connection = await self._take()
        limit = connection.socket_timeout
        keep = False
        try:
            connection.socket_timeout = None  # one deadline for the exchange, below
            if limit is None or not KEEPS_DEADLINES:
                async with deadline(limit):
                    replies = await self._exchange(connection, commands)
            else:
                deadlines = self._deadlines
                if deadlines is None:
                    deadlines = self._deadlines = Deadlines(asyncio.get_running_loop())
                running = deadlines.start(limit)
                try:
                    replies = await self._exchange(connection, commands)
                except asyncio.CancelledError:
                    if deadlines.expired(running):
                        raise TimeoutError from None  # the deadline's, as asyncio.timeout raises it
                    raise
                finally:
                    deadlines.stop(running)
            if self._follows_primary and any(map(from_a_replica, replies)):
                await self._primary_moved(connection)
                return [as_refused(reply) for reply in replies]
            keep = len(self._idle) < self._keep
            return replies
        except (TimeoutError, asyncio.TimeoutError):  # the deadline (the same class from 3.11 on)
            await connection.disconnect(nowait=True)
            raise redis.TimeoutError(f"no reply within {limit}s: the commands may have landed") from None
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        finally:
            if connection.socket_timeout is None:
                connection.socket_timeout = limit
            if keep:
                self._idle.append(connection)
            else:
                await self._pool.release(connection)

    async def _exchange(self, connection: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
        packed = self._pack(commands) or connection.pack_commands(commands)
        await connection.send_packed_command(packed, check_health=False)
        return [await self._reply(connection, args[0]) for args in commands]

    async def _primary_moved(self, connection: Any) -> None:
        """The connection reaches a demoted primary: close it, and let the pool ask Sentinel again."""
        await connection.disconnect(nowait=True)
        with contextlib.suppress(Exception):  # Sentinel unreachable, no primary yet: asked on connect
            await self._pool.get_master_address()

    async def aclose(self) -> None:
        """Give the kept connections back to the pool."""
        idle, self._idle = self._idle, []
        for connection in idle:
            await self._pool.release(connection)

    async def _take(self) -> Any:
        if not self._idle:
            return await self._pool.get_connection()
        connection = self._idle.pop()
        try:
            await self._pool.ensure_connection(connection)
        except BaseException:
            await self._pool.release(connection)
            raise
        return connection

    async def _reply(self, connection: Any, name: Any) -> Any:
        try:
            reply = await connection.read_response()
        except redis.ResponseError as exc:  # this command's own error: the connection is in step
            return exc
        callback = self._callbacks.get(name)
        return reply if callback is None else callback(reply)


def exchange_for(client: Any, *, keep: int) -> Exchange | None:
    """An :class:`Exchange` for a plain redis-py asyncio client (its connections redis-py's, or
    subclasses of them); None for anything else (a Cluster, whose pipeline groups commands by node;
    a stand-in without a pool)."""
    if not isinstance(client, aredis.Redis) or isinstance(client, RedisCluster):
        return None
    pool = getattr(client, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    if not (
        isinstance(pool, aredis.ConnectionPool)
        and isinstance(connection_class, type)
        and issubclass(connection_class, aredis.connection.AbstractConnection)
    ):
        return None
    return Exchange(client, keep=keep)
