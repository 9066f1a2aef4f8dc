"""Following a Cluster ``-ASK`` on one connection: ``ASKING`` and the command it allows travel in one
pipeline, on one connection, to the node the ASK names.

While a slot is being resharded (``MIGRATING`` on its primary, ``IMPORTING`` on another), the primary
answers ``-ASK <slot> <host:port>`` for a key it does not hold (any more), and the importing node takes
a command for that slot only right after ``ASKING`` on the same connection (any other connection gets
``-MOVED`` back to the primary). redis-py's blocking Cluster client does so. Its asyncio client sends
``ASKING`` as a command of its own through the node's connection pool, then the command through the
pool again: with other connections free (calls in flight at once), the command leaves on another one,
meets ``-MOVED``, goes back to the primary, meets ``-ASK`` again, until redis-py gives up with
:class:`~redis.exceptions.ClusterError` ("TTL exhausted").

Here, for both the begin with WAIT (:mod:`.durability`) and the store's own commands once redis-py
gave up (:mod:`.redis_io`): plain clients to the cluster's nodes, one per node and event loop
(:class:`NodeClients`, closed with their loop), and how one visit travels:

- :class:`Send`: a pipeline on one connection, to the key's primary as the slot map names it, or (with
  ``ask``) to the node the ASK names, without touching the slot map;
- :class:`Again`: re-read the slot map (``MOVED``: the migration finished; ``TRYAGAIN``, a lost
  connection) or load a script, then visit again.

:func:`follow` is the rule for the store's commands: visit the key's primary, follow its ASK (``ASKING``
before each command, one pipeline), at most :data:`TRIES` visits. Every store command is safe to send
again (see :mod:`.tries`), so a command redis-py gave up on is sent again this way.

An ASK to a node that is in no slot map (new to the cluster: the first slot moving onto it) is not
followed (:class:`OffTheMapError`): redis-py's client has no node for it either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterError, MovedError, TryAgainError

from ..core.errors import StoreError
from ..core.stepping import adrive
from .loop_clients import PerLoop
from .url import AsyncClient, SyncClient, async_node_client

REROUTE = (MovedError, AskError, TryAgainError, redis.ConnectionError, redis.TimeoutError)
"""What sends a visit elsewhere: a redirection, TRYAGAIN, a lost connection or a timeout."""
TRIES = 3  # visits to the key's primary as the slot map names it (each may follow one ASK)


class OffTheMapError(redis.RedisError):
    """An ASK named a node that is not in the cluster client's map (one that serves no slot yet: the
    first slot resharded onto a node new to the cluster). Nothing is sent there: redis-py's cluster
    client, which carries the store's other commands, has no node to send them to, so an attempt
    started there could not be committed. The slot map is read again instead."""

    def __init__(self, ask: AskError) -> None:
        super().__init__(
            f"ASK {ask.slot_id} names {ask.host}:{ask.port}, a node outside the cluster's slot map "
            "(a node new to the cluster, serving no slot yet)"
        )


class AskNotFollowed(ClusterError):
    """redis-py gave up on a command in a migrating slot, and so did the store's own following of the
    ASK (:func:`follow`) after its tries. Whether a try landed is not known."""


def gave_up_on_ask(client: AsyncClient, error: BaseException) -> bool:
    """True when ``error`` is an asyncio Cluster client giving up after a run of redirections ("TTL
    exhausted"): the command is sent again by :func:`afollow`."""
    return isinstance(client, AsyncRedisCluster) and isinstance(error, ClusterError)


# -- one visit, as data -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    """Send ``commands`` in one pipeline, on one connection: to the key's primary as the slot map
    names it, or (``ask`` set) to the node that ASK redirection names."""

    commands: list[tuple[Any, ...]]
    ask: AskError | None = None


@dataclass(frozen=True, slots=True)
class Again:
    """This visit did not get through: re-read the slot map or load the script, then visit again."""

    reason: BaseException
    refresh: bool = False  # re-read the cluster's slot map
    load_script: bool = False  # load the script into the key's primary (NOSCRIPT)


Request: TypeAlias = "Send | Again"


def with_asking(commands: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``ASKING`` before each command: its allowance covers only the command right after it."""
    return [step for command in commands for step in (("ASKING",), command)]


# -- the store's commands, once redis-py gave up --------------------------------------------------
def read_followed(replies: Sequence[Any] | BaseException, *, asked: bool) -> list[Any] | AskError | Again:
    """What one visit's answer means: the commands' replies (their own error replies in place), an ASK
    to follow, or try again after re-reading the slot map. ``asked``: the pipeline was
    :func:`with_asking` (an ``ASKING`` refused is raised; an ASK is not followed again)."""
    if isinstance(replies, BaseException):
        return Again(replies, refresh=True)
    if asked:
        for allowed in replies[0::2]:
            if isinstance(allowed, Exception):  # ASKING itself refused (an ACL without it, say)
                raise allowed
        replies = replies[1::2]
    if not asked:
        for reply in replies:
            if isinstance(reply, AskError) and not isinstance(reply, MovedError):
                return reply  # MovedError is an AskError: only a real ASK is followed
    for reply in replies:
        if isinstance(reply, REROUTE):
            return Again(reply, refresh=True)
    return list(replies)


def follow(commands: Sequence[tuple[Any, ...]]) -> Generator[Request, Any, list[Any]]:
    """The replies to ``commands`` (all on one key), sent to the key's primary, following its ASK on
    one connection; :class:`AskNotFollowed` after :data:`TRIES` visits."""
    last: BaseException | None = None
    for _ in range(TRIES):
        step = read_followed((yield Send(list(commands))), asked=False)
        if isinstance(step, AskError):
            step = read_followed((yield Send(with_asking(commands), ask=step)), asked=True)
            assert not isinstance(step, AskError)  # an asked pipeline's ASK reads as "re-read the map"
        if isinstance(step, list):
            return step
        last = step.reason
        yield step
    raise AskNotFollowed(
        f"the command could not get through its migrating slot after {TRIES} tries: {last}"
    ) from last


async def afollow(
    client: AsyncRedisCluster, nodes: NodeClients, key: bytes, commands: Sequence[tuple[Any, ...]]
) -> list[Any]:
    """:func:`follow` carried out with the running loop's node clients."""
    return await adrive(follow(commands), lambda request: nodes.carry(client, key, request))


def key_of(args: Sequence[Any]) -> bytes | None:
    """The key of one of the store's commands (``SET key ...``, ``EVAL[SHA] script 1 key ...``), or
    None for a command without one."""
    if not args:
        return None
    name = (args[0].decode() if isinstance(args[0], bytes) else str(args[0])).upper()
    if name == "SET" and len(args) > 1:
        return _key(args[1])
    if name in ("EVAL", "EVALSHA") and len(args) > 3 and int(args[2]) >= 1:
        return _key(args[3])
    return None


def _key(value: Any) -> bytes | None:
    if isinstance(value, bytes):
        return value
    return value.encode() if isinstance(value, str) else None


# -- carrying a visit out ---------------------------------------------------------------------------
def carry(client: SyncClient, key: bytes, request: Request, source: str | None = None) -> Any:
    """Carry ``request`` out with the blocking client (redis-py's own client per node): the
    pipeline's replies, or the rerouting error it raised."""
    if isinstance(request, Again):
        if isinstance(client, RedisCluster) and request.refresh:
            client.nodes_manager.initialize()
        if request.load_script and source is not None:
            node = _sync_target(client, key, None)
            assert node is not None  # the key's primary always has a client
            node.script_load(source)
        return None
    target = _sync_target(client, key, request.ask)
    if target is None:
        assert request.ask is not None
        return OffTheMapError(request.ask)
    try:
        pipe = target.pipeline(transaction=False)
        for command in request.commands:
            pipe.execute_command(*command)
        return pipe.execute(raise_on_error=False)
    except REROUTE as exc:
        return exc


def _sync_target(client: SyncClient, key: bytes, ask: AskError | None) -> redis.Redis | None:
    """A plain client to the key's primary, or to the node ``ask`` names (None: not in the map)."""
    if not isinstance(client, RedisCluster):
        return client
    node = client.get_node_from_key(key)
    if ask is not None:
        node = client.get_node(*asked_address(client.nodes_manager, ask, node.host))
        if node is None:
            return None
    return client.get_redis_connection(node)


class NodeClients:
    """Plain asyncio clients to a Cluster's nodes (by ``host:port``) for each event loop, made on
    first need and closed when their loop shuts down (:class:`.loop_clients.PerLoop`)."""

    __slots__ = ("_per_loop",)

    def __init__(self) -> None:
        self._per_loop: PerLoop[dict[str, aredis.Redis]] = PerLoop(dict, _close_all)

    @property
    def loops(self) -> frozenset[Any]:
        """The event loops that hold node clients now."""
        return self._per_loop.loops

    def current(self) -> dict[str, aredis.Redis]:
        """The running loop's node clients, by ``host:port``."""
        return self._per_loop.current()

    async def carry(
        self, client: AsyncClient, key: bytes, request: Request, source: str | None = None
    ) -> Any:
        """:func:`carry` with the asyncio client: the pipeline goes on one connection of this loop's
        plain client to the node."""
        if isinstance(request, Again):
            if isinstance(client, AsyncRedisCluster) and request.refresh:
                await client.nodes_manager.initialize()
            if request.load_script and source is not None:
                node = self._target(client, key, None)
                assert node is not None  # the key's primary always has a client
                await node.script_load(source)
            return None
        if isinstance(client, AsyncRedisCluster):
            await client.initialize()  # no-op once the slot map is known
        target = self._target(client, key, request.ask)
        if target is None:
            assert request.ask is not None
            return OffTheMapError(request.ask)
        try:
            pipe = target.pipeline(transaction=False)
            for command in request.commands:
                pipe.execute_command(*command)
            return await pipe.execute(raise_on_error=False)
        except REROUTE as exc:
            return exc

    def _target(self, client: AsyncClient, key: bytes, ask: AskError | None) -> aredis.Redis | None:
        """A plain client to the key's primary, or to the node ``ask`` names (None: not in the map),
        kept for the running loop."""
        if not isinstance(client, AsyncRedisCluster):
            return client
        node = client.get_node_from_key(key)  # type: ignore[arg-type]
        if node is None:
            raise StoreError("the cluster has no node for the record's slot (cluster down?)")
        if ask is not None:
            node = client.get_node(*asked_address(client.nodes_manager, ask, node.host))
            if node is None:
                return None
        clients = self.current()
        made = clients.get(node.name)
        if made is None:
            made = clients[node.name] = async_node_client(client, node)
        return made


async def _close_all(clients: dict[str, aredis.Redis]) -> None:
    for made in clients.values():
        with contextlib.suppress(redis.RedisError, OSError):  # close the others regardless
            await made.aclose(close_connection_pool=True)


def asked_address(manager: Any, ask: AskError, origin_host: str) -> tuple[str, int]:
    """The ``(host, port)`` an ASK names, as the client reaches it: a hostless ``ASK <slot> :port``
    (``cluster-preferred-endpoint-type unknown-endpoint``) means the host that answered; then the
    cluster client's ``address_remap``."""
    host, port = manager.remap_host_port(ask.host or origin_host, ask.port)
    return host, port
