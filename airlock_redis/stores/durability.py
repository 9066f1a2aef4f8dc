"""``wait_replicas``: the pending record must reach N replicas before the tool runs.

Redis' WAIT counts the writes made *by the connection that sends it*: a WAIT sent on another pooled
connection returns at once and proves nothing. So ``begin`` and WAIT travel together in one
pipeline on one connection to the primary that holds the record (on a Cluster: the key's node,
reached directly). The acknowledgement count is kept under the attempt's owner token until the guard
asks :meth:`ReplicaWait.ensure` (after begin said "started", before the tool runs).

WAITAOF (Redis 7.2+) is added when every primary has an append-only file, asking the primary itself to
fsync the record (``WAITAOF 1 0``); older servers, such as 7.0, are detected and skip it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from ..core.errors import StoreError
from .server_facts import ServerFacts, facts_from_info, merge_info, per_node
from .url import AsyncClient, SyncClient, async_node_client

_REROUTE = (MovedError, AskError, TryAgainError, redis.ConnectionError, redis.TimeoutError)
_MAX_REMEMBERED = 65536
_TRIES = 3


class DurabilityError(StoreError):
    """The pending record did not reach enough replicas (or the disk) in time: the tool must not run."""


@dataclass(frozen=True, slots=True)
class Acks:
    replicas: int
    aof_local: int | None = None  # WAITAOF's local fsync count, None when WAITAOF was not sent


# -- server facts, read once per store ------------------------------------------------------------
_SECTIONS = ("server", "memory", "persistence")


def read_facts(client: SyncClient) -> ServerFacts:
    cluster = isinstance(client, RedisCluster)
    replies = []
    for section in _SECTIONS:
        target = {"target_nodes": RedisCluster.PRIMARIES} if cluster else {}
        reply = client.info(section, **target)
        replies.append(per_node(reply, cluster))
    return facts_from_info(merge_info(*replies))


async def aread_facts(client: AsyncClient) -> ServerFacts:
    cluster = isinstance(client, AsyncRedisCluster)
    replies = []
    for section in _SECTIONS:
        target = {"target_nodes": AsyncRedisCluster.PRIMARIES} if cluster else {}
        reply = await client.info(section, **target)
        replies.append(per_node(reply, cluster))
    return facts_from_info(merge_info(*replies))


class ReplicaWait:
    """Runs begin + WAIT on one connection and remembers each started attempt's acknowledgements."""

    def __init__(self, replicas: int, timeout: float) -> None:
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError("wait_replicas must be a positive integer (0 turns waiting off)")
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
            raise ValueError(
                "wait_timeout must be a finite number of seconds above 0 (WAIT with 0 would block "
                f"forever) and at most 3600, not {timeout!r}"
            )
        self.replicas = replicas
        self.timeout = float(timeout)
        self.timeout_ms = max(1, round(timeout * 1000))
        self._acks: OrderedDict[str, Acks] = OrderedDict()
        self._lock = threading.Lock()
        self._async_nodes: dict[asyncio.AbstractEventLoop, dict[str, aredis.Redis]] = {}

    def commands(self, facts: ServerFacts | None) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = [("WAIT", self.replicas, self.timeout_ms)]
        if facts is not None and facts.has_waitaof and facts.all_aof:
            commands.append(("WAITAOF", 1, 0, self.timeout_ms))
        return commands

    # -- remembering acknowledgements -------------------------------------------------------------
    def remember(self, token: str, acks: Acks) -> None:
        with self._lock:
            self._acks[token] = acks
            while len(self._acks) > _MAX_REMEMBERED:
                self._acks.popitem(last=False)

    def ensure(self, token: str) -> None:
        """Raise DurabilityError unless the attempt's record reached enough replicas."""
        with self._lock:
            acks = self._acks.pop(token, None)
        if acks is None:
            raise DurabilityError(
                "no replica acknowledgement was recorded for this attempt (begin did not go through this "
                "store's wait_replicas path)"
            )
        if acks.replicas < self.replicas:
            raise DurabilityError(
                f"only {acks.replicas} of the {self.replicas} replicas required by wait_replicas "
                f"acknowledged the pending record within {self.timeout:g}s (WAIT)"
            )
        if acks.aof_local is not None and acks.aof_local < 1:
            raise DurabilityError(
                f"the primary did not fsync the pending record to its append-only file within "
                f"{self.timeout:g}s (WAITAOF)"
            )

    @staticmethod
    def _acks_of(replies: Sequence[Any]) -> Acks:
        replicas = int(replies[0])
        aof_local = int(replies[1][0]) if len(replies) > 1 else None
        return Acks(replicas, aof_local)

    # -- blocking ---------------------------------------------------------------------------------
    def begin(
        self,
        client: SyncClient,
        *,
        key: bytes,
        sha: str,
        source: str,
        args: Sequence[Any],
        facts: ServerFacts | None,
    ) -> tuple[Any, Acks]:
        """The begin script's reply and the acknowledgements, from one connection to the key's primary."""
        last: BaseException | None = None
        for _ in range(_TRIES):
            if isinstance(client, RedisCluster):
                node = client.get_node_from_key(key)
                target: redis.Redis = client.get_redis_connection(node)
            else:
                target = client
            try:
                pipe = target.pipeline(transaction=False)
                pipe.evalsha(sha, 1, key, *args)
                for command in self.commands(facts):
                    pipe.execute_command(*command)
                replies = pipe.execute(raise_on_error=False)
            except _REROUTE as exc:
                if not isinstance(client, RedisCluster):
                    raise
                last = exc
                client.nodes_manager.initialize()
                continue
            first = replies[0]
            if isinstance(first, NoScriptError):  # restart, failover or SCRIPT FLUSH emptied the cache
                target.script_load(source)
                last = first
                continue
            if isinstance(client, RedisCluster) and isinstance(first, _REROUTE):
                client.nodes_manager.initialize()
                last = first
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return first, self._acks_of(replies[1:])
        raise StoreError(f"begin could not reach the record's primary after {_TRIES} tries: {last}")

    # -- coroutines -------------------------------------------------------------------------------
    async def abegin(
        self,
        client: AsyncClient,
        *,
        key: bytes,
        sha: str,
        source: str,
        args: Sequence[Any],
        facts: ServerFacts | None,
    ) -> tuple[Any, Acks]:
        last: BaseException | None = None
        for _ in range(_TRIES):
            if isinstance(client, AsyncRedisCluster):
                await client.initialize()
                target: aredis.Redis = self._node_client(client, key)
            else:
                target = client
            try:
                pipe = target.pipeline(transaction=False)
                pipe.evalsha(sha, 1, key, *args)
                for command in self.commands(facts):
                    pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
            except _REROUTE as exc:
                if not isinstance(client, AsyncRedisCluster):
                    raise
                last = exc
                await client.nodes_manager.initialize()
                continue
            first = replies[0]
            if isinstance(first, NoScriptError):
                await target.script_load(source)
                last = first
                continue
            if isinstance(client, AsyncRedisCluster) and isinstance(first, _REROUTE):
                await client.nodes_manager.initialize()
                last = first
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return first, self._acks_of(replies[1:])
        raise StoreError(f"begin could not reach the record's primary after {_TRIES} tries: {last}")

    def _node_client(self, cluster: AsyncRedisCluster, key: bytes) -> aredis.Redis:
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._async_nodes if lp.is_closed()]:
            del self._async_nodes[old]
        nodes = self._async_nodes.setdefault(loop, {})
        node = cluster.get_node_from_key(key)  # type: ignore[arg-type]
        if node is None:
            raise StoreError("the cluster has no node for the record's slot (cluster down?)")
        client = nodes.get(node.name)
        if client is None:
            client = nodes[node.name] = async_node_client(cluster, node)
        return client
