"""What the Redis store sends, as data, and the two ways of sending it (blocking, asyncio).

The store writes each operation once, as a plan (:mod:`airlock_redis.core.stepping`) that yields the
operations below; :func:`blocking_io` and :func:`async_io` carry them out through redis-py's public
client API, one table each, sharing every entry whose call is the same for both clients (an asyncio
client's method returns the awaitable of the same command). Whatever a rule decides (re-send or give
up, what a reply means) is in a plan, never here; the one exception is below the plans: a command
that redis-py's asyncio Cluster client could not get through a migrating slot is sent again on one
connection (:class:`AsyncIO`, :mod:`.asking`), as its blocking client would have sent it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, NamedTuple, TypeVar

import redis
from redis.exceptions import ClusterError

from ..core.errors import StoreError
from ..core.stepping import Plan
from .asking import NodeClients, afollow, gave_up_on_ask, key_of
from .blocking_wire import BlockingWire
from .durability import ReplicaWait, aread_facts, on_primaries, read_facts
from .server_facts import ServerFacts
from .tries import Tries

T = TypeVar("T")

MAX_BULK = "proto-max-bulk-len"
REDIS_FAILURES = (redis.RedisError, OSError)


class Command(NamedTuple):
    """One command: its raw reply."""

    args: tuple[Any, ...]


class Read(NamedTuple):
    """GET and PTTL of one key in one pipeline: the two raw replies (an error reply as the exception)."""

    key: bytes


class Pause(NamedTuple):
    """Wait before the next try."""

    seconds: float


class Facts(NamedTuple):
    """The primaries' server facts (INFO)."""


class MaxBulk(NamedTuple):
    """``CONFIG GET proto-max-bulk-len`` on the primaries."""


class Waited(NamedTuple):
    """A begin with ``wait_replicas``: the script and WAIT in one round trip (see :mod:`.durability`)."""

    wait: ReplicaWait
    key: bytes
    sha: str
    source: str
    args: list[Any]
    facts: ServerFacts | None


Op = Command | Read | Pause | Facts | MaxBulk | Waited
Call = Callable[[Any, Any], Any]

_EITHER: dict[type, Call] = {
    Command: lambda client, op: client.execute_command(*op.args),
    Read: lambda client, op: (
        client.pipeline(transaction=False).get(op.key).pttl(op.key).execute(raise_on_error=False)
    ),
    MaxBulk: lambda client, op: client.config_get(MAX_BULK, **on_primaries(client)),
}
_BLOCKING: dict[type, Call] = {
    **_EITHER,
    Pause: lambda client, op: time.sleep(op.seconds),
    Facts: lambda client, op: read_facts(client),
    Waited: lambda client, op: op.wait.begin(client, **_waited(op)),
}
_ASYNC: dict[type, Call] = {
    **_EITHER,
    Pause: lambda client, op: asyncio.sleep(op.seconds),
    Facts: lambda client, op: aread_facts(client),
    Waited: lambda client, op: op.wait.abegin(client, **_waited(op)),
}


def _waited(op: Waited) -> dict[str, Any]:
    return {"key": op.key, "sha": op.sha, "source": op.source, "args": op.args, "facts": op.facts}


def blocking_io(
    client: Callable[[], Any], wire: Callable[[], BlockingWire | None] = lambda: None
) -> Callable[[Op], Any]:
    """Carry an operation out with the blocking client ``client()`` returns; a :class:`Command`
    on ``wire()`` when there is one (the store's own client, see :mod:`.blocking_wire`)."""

    def perform(op: Op) -> Any:
        if type(op) is Command and (on_wire := wire()) is not None:
            return on_wire.command(op.args)
        return _BLOCKING[type(op)](client(), op)

    return perform


def async_io(
    client: Callable[[], Any], command: Callable[[tuple[Any, ...]], Awaitable[Any]] | None = None
) -> Callable[[Op], Awaitable[Any]]:
    """Carry an operation out with the asyncio client ``client()`` returns (the running loop's); a
    :class:`Command` through ``command(args)`` when given (the loop's auto-pipeline)."""
    return AsyncIO(client, command)


class AsyncIO:
    """What :func:`async_io` makes: ``await io(op)`` carries ``op`` out.

    On a Cluster, a :class:`Command` (or a :class:`Read`) that redis-py's asyncio client gave up on
    after a run of redirections ("TTL exhausted": its ASK is not followed on one connection, see
    :mod:`.asking`) is sent again by :func:`.asking.afollow`, ``ASKING`` and the command in one
    pipeline on one connection to the node the ASK names, through ``nodes``, the running loop's plain
    clients to the cluster's nodes. Every store command is safe to send again; whether a try may have
    landed is still the plan's to judge (an error the re-send gives up with is a ``ClusterError``, as
    redis-py's own)."""

    __slots__ = ("_client", "_command", "nodes")

    def __init__(
        self, client: Callable[[], Any], command: Callable[[tuple[Any, ...]], Awaitable[Any]] | None = None
    ) -> None:
        self._client = client
        self._command = command
        self.nodes = NodeClients()

    async def __call__(self, op: Op) -> Any:
        if type(op) is Command:  # the command sent here, not in a coroutine of its own: every command
            args = op.args
            try:
                if self._command is not None:
                    return await self._command(args)
                return await self._client().execute_command(*args)
            except ClusterError as exc:
                return await self._follow(args, exc)
        if type(op) is Read:
            return await self._read(op.key)
        return await _ASYNC[type(op)](self._client(), op)

    async def _follow(self, args: tuple[Any, ...], exc: ClusterError) -> Any:
        client = self._client()
        key = key_of(args)
        if key is None or not gave_up_on_ask(client, exc):
            raise exc
        (reply,) = await afollow(client, self.nodes, key, [args])
        if isinstance(reply, Exception):  # the command's own error reply (NOSCRIPT, say)
            raise reply
        return reply

    async def _read(self, key: bytes) -> Any:
        client = self._client()
        replies = await _EITHER[Read](client, Read(key))
        if any(gave_up_on_ask(client, reply) for reply in replies if isinstance(reply, Exception)):
            replies = await afollow(client, self.nodes, key, [("GET", key), ("PTTL", key)])
        return replies


# -- the store's re-sends, once for both ------------------------------------------------------------
def one(op: Op) -> Plan[Any]:
    """A plan of one operation: its reply."""
    return (yield op)


def tried(
    attempt: Callable[[], Plan[T]] | Op,
    tries: Tries,
    failure: Callable[[BaseException, bool], StoreError],
    unexpected: Callable[[Exception], StoreError],
) -> Generator[Any, Any, T]:
    """Run ``attempt()`` again after a dropped connection or a timeout, as ``tries`` allows; a failure
    becomes ``failure(error, maybe_sent)``, a StoreError that says whether ANY try may have landed;
    an error redis-py does not wrap becomes ``unexpected(error)``. ``attempt`` may also be one
    operation, yielded as it is (every command but the scripts: one generator less on each)."""
    while True:
        try:
            if callable(attempt):
                return (yield from attempt())
            reply: T = yield attempt
            return reply
        except REDIS_FAILURES as exc:
            pause = tries.failed(exc)
            if pause is None:
                raise failure(exc, tries.maybe_sent) from exc
        except StoreError:
            raise
        except Exception as exc:  # redis-py failed in a way it does not wrap (a bug of its own)
            raise unexpected(exc) from exc
        yield Pause(pause)
