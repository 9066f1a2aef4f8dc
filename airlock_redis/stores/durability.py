"""``wait_replicas``: the pending record must reach N replicas before the tool runs.

Redis' WAIT counts the writes made *by the connection that sends it*: a WAIT sent on another pooled
connection returns at once and proves nothing. So ``begin`` and WAIT travel together in one
pipeline on one connection to the primary that holds the record (on a Cluster: the key's node,
reached directly). The acknowledgement count is kept under the attempt's owner token until the guard
asks :meth:`ReplicaWait.ensure` (after begin said "started", before the tool runs).

WAITAOF (Redis 7.2+) is added when every primary has an append-only file, asking the primary itself to
fsync the record (``WAITAOF 1 0``); older servers, such as 7.0, are detected and skip it.

While a Cluster slot is being resharded (``MIGRATING`` on its primary, ``IMPORTING`` on another), the
primary answers ``-ASK <slot> <host:port>`` for a key it does not hold (any more). The begin then
follows the ASK as a cluster client does, without touching the slot map: ``ASKING``, the script (as
``EVAL`` with its source: the importing node may not have it cached, and the ASKING allowance covers
only the command right after it) and the waits, in one pipeline on one connection to the node the ASK
names, so WAIT counts that node's replicas. ``MOVED`` (the migration finished) re-reads the slot map.
An ASK to a node that is in no slot map (new to the cluster: the first slot moving onto it) is not
followed (see :class:`.asking.OffTheMapError`): the begin is refused after its tries, and the tool
does not run.

The rules (which commands, when to follow an ASK, re-read the map, load the script, give up) live in
one generator, ``ReplicaWait._plan``, that yields what to send and is sent the replies (read by the pure
:func:`read_replies`); ``begin`` and ``abegin`` only carry its requests to the servers, through
:mod:`.asking` (which the store's other commands share when redis-py gives up on an ASK).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, NoScriptError

from ..core.errors import StoreError
from ..core.stepping import adrive, drive
from .asking import REROUTE, Again, NodeClients, Request, Send, carry
from .server_facts import ServerFacts, facts_from_info, merge_info, per_node
from .url import AsyncClient, SyncClient

_MAX_REMEMBERED = 65536
_TRIES = 3  # visits to the key's primary as the slot map names it (each may follow one ASK)


class DurabilityError(StoreError):
    """The pending record did not reach enough replicas (or the disk) in time: the tool must not run."""


@dataclass(frozen=True, slots=True)
class Acks:
    replicas: int
    aof_local: int | None = None  # WAITAOF's local fsync count, None when WAITAOF was not sent


# -- server facts, read once per store ------------------------------------------------------------
_SECTIONS = ("server", "memory", "persistence")


def on_primaries(client: SyncClient | AsyncClient) -> dict[str, Any]:
    """``target_nodes`` for a server command that must reach every primary of a Cluster."""
    if isinstance(client, (RedisCluster, AsyncRedisCluster)):
        return {"target_nodes": client.PRIMARIES}
    return {}


def read_facts(client: SyncClient) -> ServerFacts:
    cluster = isinstance(client, RedisCluster)
    replies = [per_node(client.info(section, **on_primaries(client)), cluster) for section in _SECTIONS]
    return facts_from_info(merge_info(*replies))


async def aread_facts(client: AsyncClient) -> ServerFacts:
    cluster = isinstance(client, AsyncRedisCluster)
    replies = [per_node(await client.info(section, **on_primaries(client)), cluster) for section in _SECTIONS]
    return facts_from_info(merge_info(*replies))


# -- one begin, as data: what the replies mean (what to send: asking.Send and asking.Again) -------
@dataclass(frozen=True, slots=True)
class Done:
    reply: Any
    acks: Acks


_Plan: TypeAlias = "Generator[Request, Any, tuple[Any, Acks]]"


def read_replies(
    replies: Sequence[Any] | BaseException, *, cluster: bool, asked: bool
) -> Done | AskError | Again:
    """What one begin pipeline's answer means: done, follow this ASK, or try again (after re-reading the
    slot map or loading the script); an error that none of these cures is raised.

    ``replies`` is the pipeline's replies, or the rerouting error (MOVED, ASK, TRYAGAIN, connection lost
    or timed out) that the pipeline raised; ``asked``: the pipeline began with ASKING (its reply is
    dropped here, and an ASK is not followed again)."""
    if isinstance(replies, BaseException):
        if not cluster:
            raise replies
        return Again(replies, refresh=True)
    if asked:
        if isinstance(replies[0], Exception):  # ASKING itself refused (an ACL without it, say)
            raise replies[0]
        replies = replies[1:]
    first = replies[0]
    if isinstance(first, NoScriptError):  # restart, failover or SCRIPT FLUSH emptied the cache
        return Again(first, load_script=True)
    if cluster and isinstance(first, AskError) and not isinstance(first, MovedError) and not asked:
        return first  # MovedError is an AskError: only a real ASK is followed
    if cluster and isinstance(first, REROUTE):
        return Again(first, refresh=True)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    replicas = int(replies[1])
    aof_local = int(replies[2][0]) if len(replies) > 2 else None
    return Done(first, Acks(replicas, aof_local))


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
        self.nodes = NodeClients()  # the asyncio begins' plain clients to the cluster's nodes, per loop

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
        self.check(acks, "the pending record")

    def check(self, acks: Acks, what: str, *, landed: bool = False) -> None:
        """Raise DurabilityError unless ``what`` reached enough replicas (and the disk, with WAITAOF);
        ``landed``: the error says the write may stand on the primary (``maybe_applied``)."""
        if acks.replicas < self.replicas:
            raise DurabilityError(
                f"only {acks.replicas} of the {self.replicas} replicas required by wait_replicas "
                f"acknowledged {what} within {self.timeout:g}s (WAIT)",
                maybe_applied=landed,
            )
        if acks.aof_local is not None and acks.aof_local < 1:
            raise DurabilityError(
                f"the primary did not fsync {what} to its append-only file within "
                f"{self.timeout:g}s (WAITAOF)",
                maybe_applied=landed,
            )

    # -- the rules of one begin, shared by both paths ---------------------------------------------
    def _plan(
        self,
        *,
        key: bytes,
        sha: str,
        source: str,
        args: Sequence[Any],
        facts: ServerFacts | None,
        cluster: bool,
    ) -> _Plan:
        """Yields what to send (each :class:`Send` is sent the pipeline's replies, or the rerouting
        error it raised) and returns the script's reply with the acknowledgements."""
        waits = self.commands(facts)
        direct = [("EVALSHA", sha, 1, key, *args), *waits]
        last: BaseException | None = None
        for _ in range(_TRIES):
            step = read_replies((yield Send(direct)), cluster=cluster, asked=False)
            if isinstance(step, AskError):
                # the slot is migrating and its primary does not hold the key: the importing node
                # takes it, for the one command after ASKING (EVAL: its script cache may lack begin)
                asked = [("ASKING",), ("EVAL", source, 1, key, *args), *waits]
                step = read_replies((yield Send(asked, ask=step)), cluster=cluster, asked=True)
                assert not isinstance(step, AskError)  # an asked pipeline's ASK reads as "re-read the map"
            if isinstance(step, Done):
                return step.reply, step.acks
            last = step.reason
            yield step
        raise StoreError(f"begin could not reach the record's primary after {_TRIES} tries: {last}")

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
        """The begin script's reply and the acknowledgements, from one connection to the key's primary
        (or, while its slot migrates, to the node that ASK redirection names)."""
        cluster = isinstance(client, RedisCluster)
        plan = self._plan(key=key, sha=sha, source=source, args=args, facts=facts, cluster=cluster)
        return drive(plan, lambda request: carry(client, key, request, source))

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
        cluster = isinstance(client, AsyncRedisCluster)
        plan = self._plan(key=key, sha=sha, source=source, args=args, facts=facts, cluster=cluster)
        return await adrive(plan, lambda request: self.nodes.carry(client, key, request, source))
