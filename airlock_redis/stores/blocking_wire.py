"""The blocking store's wire for a plain ``redis.Redis`` client it built itself (one server, or
Sentinel's primary): each command (or the write-behind sender's batch, :meth:`BlockingWire.send`)
written on a connection of the client's own pool and its reply read back, through the pool's and
the connection's public methods (``get_connection``, ``send_packed_command``, ``read_response``,
``release``), the command packed by :mod:`.resp`.

Why not ``client.execute_command`` (or a pipeline): around the same write and read, redis-py's
command path runs its retry wrapper, its metrics and events, and its general packer: about 40-50 us
of client CPU per guarded call on the VMs of docs/performance.md. The store's own clients make one
try per command (the store re-sends, see :mod:`.tries`), so the retry wrapper had nothing to do; a
client passed in keeps redis-py's path and its retry policy.

What stays as redis-py does it: the pool's checkout (its health check, a reconnect after a fork)
and return; the connection's socket timeouts, and its closing of itself when a write or a read
fails in any way other than an error reply (the connection is then out of step). An error reply is
raised as redis-py raises it, with one exception behind Sentinel: a ``READONLY`` reply, plain or a
script's as Redis 6.2 wraps it, closes the connection, lets the pool ask Sentinel for the primary,
and is raised as :class:`.replica_replies.OnReplica` (refused, never applied: sent again).
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis

from .replica_replies import as_refused, from_a_replica
from .resp import packer_for


class BlockingWire:
    """Sends a command, or a batch, at a time on connections of ``client``'s pool. Safe to share
    between threads: it keeps nothing between sends but what it read from the client when made."""

    __slots__ = ("_callbacks", "_follows_primary", "_pack", "_pool")

    def __init__(self, client: redis.Redis) -> None:
        self._pool: Any = client.connection_pool
        self._callbacks: dict[Any, Any] = dict(client.response_callbacks)
        self._follows_primary = getattr(self._pool, "is_master", False) is True
        self._pack = packer_for(client)

    def command(self, args: tuple[Any, ...]) -> Any:
        """The reply to ``args``; an error reply raised (see :meth:`send`)."""
        (reply,) = self.send([args])
        if isinstance(reply, redis.ResponseError):
            raise reply
        return reply

    def send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The replies to ``commands``, written at once and read back in order, each error reply in
        place of its reply (as ``pipeline(transaction=False).execute(raise_on_error=False)`` gives
        them); any other failure is the whole batch's, raised: every command of it may have landed.
        Behind Sentinel, a READONLY reply fails the batch as :class:`.replica_replies.OnReplica`: a
        replica refused every write of it."""
        pool = self._pool
        connection = pool.get_connection()
        try:
            packed = self._pack(commands)  # the blocking connection writes a list of chunks
            connection.send_packed_command(
                [packed] if packed is not None else connection.pack_commands(commands)
            )
            replies = [self._reply(connection, args[0]) for args in commands]
        except BaseException:  # dropped, timed out, interrupted: the connection is out of step
            connection.disconnect()  # (redis-py's own connection has closed itself already)
            pool.release(connection)
            raise
        refused = next(filter(from_a_replica, replies), None) if self._follows_primary else None
        if refused is not None:
            connection.disconnect()
            pool.release(connection)
            self._primary_moved()
            raise as_refused(refused)
        pool.release(connection)
        return replies

    def _reply(self, connection: Any, name: Any) -> Any:
        try:
            reply = connection.read_response()
        except redis.ResponseError as exc:  # this command's own error: the connection is in step
            return exc
        callback = self._callbacks.get(name)
        return reply if callback is None else callback(reply)

    def _primary_moved(self) -> None:
        """Let the pool ask Sentinel for the primary (which closes its idle connections to the old one)."""
        with contextlib.suppress(Exception):  # Sentinel unreachable, no primary yet: asked on connect
            self._pool.get_master_address()


def blocking_wire_for(client: Any) -> BlockingWire | None:
    """A :class:`BlockingWire` for a plain blocking redis-py client whose connections are redis-py's
    (or subclasses of them); None for anything else (a Cluster client, a client held to one
    connection, a stand-in without a pool)."""
    if not isinstance(client, redis.Redis) or isinstance(client, redis.RedisCluster):
        return None
    if getattr(client, "connection", None) is not None:  # single_connection_client: its one connection
        return None
    pool = getattr(client, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    if not (
        isinstance(pool, redis.ConnectionPool)
        and isinstance(connection_class, type)
        and issubclass(connection_class, redis.connection.AbstractConnection)
    ):
        return None
    return BlockingWire(client)
