"""Issue 22, scenario 8: a Cluster slot resharded under ``wait_replicas=1`` begins.

Begin and WAIT go in one pipeline to the key's primary (stores/durability.py). While the key's slot is
``MIGRATING`` there (``IMPORTING`` on another primary), the primary answers ``-ASK`` for a key it does
not hold: the begin must follow it (ASKING + the script + WAIT on one connection to the importing node)
instead of refusing every new call in the slot as ``store_unavailable``.

On a private cluster (3 primaries with a replica each, append-only files: Valkey, which speaks Redis
7.2, adds WAITAOF), each test reshards a slot of its own, the way ``redis-cli --cluster reshard`` does:
IMPORTING on the target, MIGRATING on the source, MIGRATE key by key, then ``SETSLOT NODE`` on every
primary. Whatever happens, the test leaves the slot with one owner. The pure rules (what a pipeline's
replies mean, the order of the commands, the bounded tries) are checked without a server at the end.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, NoScriptError

from airlock_redis import EffectStatusUnknown, RedisEffectStore, Status, StoreUnavailable
from airlock_redis.core.errors import StoreError
from airlock_redis.stores.asking import (
    TRIES,
    Again,
    AskNotFollowed,
    OffTheMapError,
    Send,
    follow,
    key_of,
    read_followed,
)
from airlock_redis.stores.durability import Acks, Done, ReplicaWait, read_replies
from airlock_redis.stores.keys import record_key
from airlock_redis.stores.url import slot_primaries

from .topo_helpers import Counted, namespace, recorded
from .topologies import (
    HOST,
    ClusterTopology,
    RedisProcess,
    free_ports,
    private,
    redis_binary,
    wait_until,
)

WAIT_TIMEOUT = 5.0  # seconds a begin's WAIT may take when the replicas are healthy
SHORT_WAIT = 0.3  # when a replica is paused on purpose: WAIT gives up after this


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    redis_binary()
    with private(ClusterTopology(appendonly=True)) as topology:
        yield topology


# -- helpers --------------------------------------------------------------------------------------
def ids_in_slot(slot: int, count: int) -> list[str]:
    """``count`` fresh tool_call_ids whose records hash to ``slot`` (the slot tag is the id's digest,
    whatever the namespace)."""
    found: list[str] = []
    for _ in range(count * 400_000):  # about 16384 candidates per hit
        candidate = f"reshard-{secrets.token_hex(6)}"
        if key_slot(record_key("any", candidate)) == slot:
            found.append(candidate)
            if len(found) == count:
                return found
    raise AssertionError(f"found only {len(found)} of {count} ids in slot {slot}")


def a_fresh_slot() -> int:
    return key_slot(record_key("any", f"slot-{secrets.token_hex(8)}"))


def node_id(process: RedisProcess) -> str:
    with process.client() as c:
        return str(c.execute_command("CLUSTER", "MYID").decode())


def owner_seen_by(process: RedisProcess, slot: int) -> int | None:
    """The port of the primary that ``process`` says serves ``slot``."""
    with process.client(socket_timeout=2) as c:
        for entry in c.execute_command("CLUSTER", "SLOTS"):
            if int(entry[0]) <= slot <= int(entry[1]):
                return int(entry[2][1])
    return None


def asking_calls(process: RedisProcess) -> int:
    """How many ASKING commands ``process`` has run (INFO commandstats)."""
    with process.client() as c:
        stats = c.info("commandstats").get("cmdstat_asking")
    return int(stats["calls"]) if isinstance(stats, dict) else 0


class Resharding:
    """One slot moving from its primary (``source``) to another primary (``target``)."""

    def __init__(self, cluster: ClusterTopology, slot: int, target: RedisProcess | None = None) -> None:
        self.cluster = cluster
        self.slot = slot
        self.source = cluster.node_for_slot(slot)
        self.target = target or next(p for p in cluster.primaries() if p is not self.source)
        self.finished = False

    def setslot(self, node: RedisProcess, *state: str) -> None:
        with node.client() as c:
            c.execute_command("CLUSTER", "SETSLOT", self.slot, *state)

    def start(self, *, importing: bool = True) -> None:
        """IMPORTING on the target (unless told not to: a half-set-up or half-aborted migration),
        then MIGRATING on the source."""
        if importing:
            self.setslot(self.target, "IMPORTING", node_id(self.source))
        self.setslot(self.source, "MIGRATING", node_id(self.target))

    def keys_on(self, node: RedisProcess) -> set[bytes]:
        with node.client() as c:
            return set(c.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 1000))

    def migrate_keys(self) -> None:
        with self.source.client() as c:
            for key in self.keys_on(self.source):
                c.execute_command("MIGRATE", HOST, self.target.port, key, 0, 5000)
        assert not self.keys_on(self.source)

    def finish(self) -> None:
        """Move what is left, give the slot to the target on every primary, and wait until every
        node says so."""
        self.setslot(self.target, "IMPORTING", node_id(self.source))  # a no-op when already importing
        self.migrate_keys()
        target_id = node_id(self.target)
        for node in [self.target, self.source, *self.cluster.primaries()]:
            self.setslot(node, "NODE", target_id)
        self.finished = True
        alive = [p for p in self.cluster.nodes if p.alive]
        wait_until(
            f"every node to say that {self.target.name} serves slot {self.slot}",
            lambda: all(owner_seen_by(p, self.slot) == self.target.port for p in alive),
            30,
            on_fail=self.cluster.logs(),
        )


@contextmanager
def resharding(
    cluster: ClusterTopology, *, started: bool = True, importing: bool = True
) -> Iterator[Resharding]:
    """A slot of the test's own, MIGRATING (unless not ``started`` yet); finished (one owner again)
    whatever the test did."""
    moving = Resharding(cluster, a_fresh_slot())
    if started:
        moving.start(importing=importing)
    try:
        yield moving
    finally:
        if not moving.finished:
            moving.finish()


def waited_store(cluster: ClusterTopology, ns: str, timeout: float = WAIT_TIMEOUT) -> RedisEffectStore:
    return RedisEffectStore(cluster.url, namespace=ns, wait_replicas=1, wait_timeout=timeout)


@contextmanager
def paused(process: RedisProcess, cluster: ClusterTopology) -> Iterator[None]:
    """``process`` (a replica) answers nothing, so WAIT counts it out; resumed and back in sync after."""
    process.pause()
    try:
        yield
    finally:
        process.resume()
        cluster.wait_healthy()


# -- (a) the key is still on the migrating primary: the normal path -------------------------------
def test_a_record_still_on_the_migrating_primary_replays_there_without_ask(cluster: ClusterTopology) -> None:
    ns = namespace()
    tool = Counted(waited_store(cluster, ns))
    with resharding(cluster, started=False) as moving:  # records made before the resharding
        sync_id, async_id = ids_in_slot(moving.slot, 2)
        made_sync = tool.call(sync_id, "sync")
        made_async = asyncio.run(tool.acall(async_id, "async"))
        moving.start()
        asked_before = asking_calls(moving.target)

        assert tool.call(sync_id, "sync") == made_sync
        assert asyncio.run(tool.acall(async_id, "async")) == made_async
        assert tool.call(async_id, "async") == made_async

        assert tool.runs == {"sync": 1, "async": 1}
        assert moving.keys_on(moving.source) == {record_key(ns, sync_id), record_key(ns, async_id)}
        assert moving.keys_on(moving.target) == set()
        assert asking_calls(moving.target) == asked_before  # nothing was redirected


# -- (b) the key is not on the migrating primary: ASK to the importing node -----------------------
def test_new_calls_in_a_migrating_slot_run_once_on_the_importing_node_sync(cluster: ClusterTopology) -> None:
    ns = namespace()
    store = waited_store(cluster, ns)
    tool = Counted(store)
    with resharding(cluster) as moving:
        ids = ids_in_slot(moving.slot, 4)
        made = {tool_call_id: tool.call(tool_call_id, tool_call_id) for tool_call_id in ids}

        assert tool.runs == dict.fromkeys(ids, 1)
        assert moving.keys_on(moving.target) == {record_key(ns, i) for i in ids}
        assert moving.keys_on(moving.source) == set()
        for tool_call_id in ids:  # a retry replays, from the importing node
            assert tool.call(tool_call_id, tool_call_id) == made[tool_call_id]
        assert tool.runs == dict.fromkeys(ids, 1)
        # ASK was followed without rewriting the slot map: the slot is still the source's
        assert slot_primaries(store.client)[moving.slot] == f"{HOST}:{moving.source.port}"

        # the migration finishes: the map is stale (MOVED), re-read, and calls go on
        moving.finish()
        for tool_call_id in ids:
            assert tool.call(tool_call_id, tool_call_id) == made[tool_call_id]
        (later,) = ids_in_slot(moving.slot, 1)
        tool.call(later, later)
        assert tool.runs == {**dict.fromkeys(ids, 1), later: 1}
        assert record_key(ns, later) in moving.keys_on(moving.target)
        assert slot_primaries(store.client)[moving.slot] == f"{HOST}:{moving.target.port}"


def test_a_record_migrated_before_its_retry_replays_from_the_importing_node(cluster: ClusterTopology) -> None:
    ns = namespace()
    tool = Counted(waited_store(cluster, ns))
    with resharding(cluster, started=False) as moving:
        sync_id, async_id = ids_in_slot(moving.slot, 2)
        made_sync = tool.call(sync_id, "sync")
        made_async = asyncio.run(tool.acall(async_id, "async"))
        moving.start()
        moving.migrate_keys()  # the records now live on the importing node only
        assert moving.keys_on(moving.target) == {record_key(ns, sync_id), record_key(ns, async_id)}

        assert tool.call(sync_id, "sync") == made_sync
        assert tool.call(async_id, "async") == made_async
        assert asyncio.run(tool.acall(sync_id, "sync")) == made_sync
        assert asyncio.run(tool.acall(async_id, "async")) == made_async
        assert tool.runs == {"sync": 1, "async": 1}


def test_new_calls_in_a_migrating_slot_run_once_on_the_importing_node_async(cluster: ClusterTopology) -> None:
    ns = namespace()
    store = waited_store(cluster, ns)
    tool = Counted(store)
    wait = store._replica_wait
    assert wait is not None
    with resharding(cluster) as moving:
        ids = ids_in_slot(moving.slot, 4)
        target_name = f"{HOST}:{moving.target.port}"
        kept: list[Any] = []

        async def first_loop() -> dict[str, dict[str, Any]]:
            made = {ids[0]: await tool.acall(ids[0], ids[0])}
            held = wait.nodes.current()
            asked = held[target_name]  # a client to the ASK target, for this loop
            for tool_call_id in ids[1:]:
                made[tool_call_id] = await tool.acall(tool_call_id, tool_call_id)
            for tool_call_id in ids:
                assert await tool.acall(tool_call_id, tool_call_id) == made[tool_call_id]
            assert held[target_name] is asked  # made once, then kept
            kept.extend(held.values())
            return made

        made = asyncio.run(first_loop())
        assert tool.runs == dict.fromkeys(ids, 1)
        assert moving.keys_on(moving.target) == {record_key(ns, i) for i in ids}
        assert moving.keys_on(moving.source) == set()
        # the loop's end closed the node clients it made (the ASK target's included)
        assert not wait.nodes.loops
        for client in kept:
            pool = client.connection_pool
            assert not pool._in_use_connections
            assert not [c for c in pool._available_connections if c.is_connected]

        async def second_loop() -> None:  # a new loop: new node clients, the same records
            for tool_call_id in ids:
                assert await tool.acall(tool_call_id, tool_call_id) == made[tool_call_id]
            for tool_call_id in ids:  # and the blocking path agrees
                assert tool.call(tool_call_id, tool_call_id) == made[tool_call_id]

        asyncio.run(second_loop())
        moving.finish()

        async def after_the_migration() -> str:
            for tool_call_id in ids:
                assert await tool.acall(tool_call_id, tool_call_id) == made[tool_call_id]
            (later,) = ids_in_slot(moving.slot, 1)
            await tool.acall(later, later)
            await tool.acall(later, later)
            return later

        later = asyncio.run(after_the_migration())
        assert tool.runs == {**dict.fromkeys(ids, 1), later: 1}
        assert record_key(ns, later) in moving.keys_on(moving.target)


def test_wait_counts_the_importing_nodes_replicas(cluster: ClusterTopology) -> None:
    ns = namespace()
    store = waited_store(cluster, ns, timeout=SHORT_WAIT)
    tool = Counted(store)
    with resharding(cluster) as moving:
        (target_replica,) = cluster.replicas_of(moving.target)
        (source_replica,) = cluster.replicas_of(moving.source)
        refused, allowed = ids_in_slot(moving.slot, 2)

        with paused(target_replica, cluster):  # the record's node has no replica to acknowledge it
            with pytest.raises(StoreUnavailable, match="only 0 of the 1"):
                tool.call(refused, "refused")
            with pytest.raises(StoreUnavailable, match="only 0 of the 1"):
                asyncio.run(tool.acall(refused, "refused"))
        assert tool.runs["refused"] == 0
        assert store.get(refused) is None  # released: nothing ran, nothing is left pending

        with paused(source_replica, cluster):  # the source's replica does not matter
            made = tool.call(allowed, "allowed")
            assert asyncio.run(tool.acall(allowed, "allowed")) == made
        assert tool.runs["allowed"] == 1
        assert record_key(ns, allowed) in moving.keys_on(moving.target)

        tool.call(refused, "refused")  # once the replica is back, the refused id runs, once
        tool.call(refused, "refused")
        assert tool.runs["refused"] == 1


def test_waitaof_travels_with_the_asked_begin_when_the_servers_have_it(cluster: ClusterTopology) -> None:
    ns = namespace()
    store = waited_store(cluster, ns)
    tool = Counted(store)
    facts = store.check_server()
    assert facts is not None and facts.all_aof  # the module's cluster writes append-only files
    with resharding(cluster) as moving, moving.target.client() as target:
        before = target.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0)
        (tool_call_id,) = ids_in_slot(moving.slot, 1)
        tool.call(tool_call_id, "acct")
        after = target.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0)
        assert tool.runs["acct"] == 1
        assert after - before == (1 if facts.has_waitaof else 0)  # Valkey 8 (7.2): yes; Redis 7.0: no


def test_a_half_set_up_migration_is_refused_within_the_tries(cluster: ClusterTopology) -> None:
    """MIGRATING on the source but the target not IMPORTING (set up halfway, or aborted halfway): the
    source says ASK, the target says MOVED back; the begin gives up after its tries, without running."""
    ns = namespace()
    store = waited_store(cluster, ns)
    tool = Counted(store)
    with resharding(cluster, importing=False) as moving:
        tool_call_id, other = ids_in_slot(moving.slot, 2)
        with pytest.raises(StoreUnavailable, match="after 3 tries"):
            tool.call(tool_call_id, "acct")
        assert tool.runs["acct"] == 0

        # the begin alone (the store's release after a failed begin goes through redis-py, which
        # follows ASK by itself): one ASK followed per try, then it gives up, blocking or not
        wait, key = ReplicaWait(1, WAIT_TIMEOUT), record_key(ns, other)
        script = {"sha": hashlib.sha1(SET_SCRIPT.encode()).hexdigest(), "source": SET_SCRIPT}
        asked_before = asking_calls(moving.target)
        with pytest.raises(StoreError, match="after 3 tries"):
            wait.begin(store.client, key=key, args=[b"x"], facts=None, **script)
        assert asking_calls(moving.target) - asked_before == 3

        async def asked() -> None:
            with pytest.raises(StoreError, match="after 3 tries"):
                await wait.abegin(store.async_client(), key=key, args=[b"x"], facts=None, **script)

        asyncio.run(asked())
        assert asking_calls(moving.target) - asked_before == 6
        assert moving.keys_on(moving.target) == set() and moving.keys_on(moving.source) == set()

        moving.setslot(moving.target, "IMPORTING", node_id(moving.source))  # now set up properly
        made = tool.call(tool_call_id, "acct")
        assert asyncio.run(tool.acall(tool_call_id, "acct")) == made
        assert tool.runs["acct"] == 1
        reply, acks = wait.begin(store.client, key=key, args=[b"x"], facts=None, **script)
        assert (reply, acks) == (b"OK", Acks(1))
        assert key in moving.keys_on(moving.target)


SET_SCRIPT = "return redis.call('SET', KEYS[1], ARGV[1])"


def test_an_ask_to_a_node_outside_the_slot_map_is_not_followed(cluster: ClusterTopology) -> None:
    """The first slot moving onto a node new to the cluster: the node is in no slot map, and the
    store's other commands (redis-py's cluster client) cannot follow an ASK there, so the begin does
    not start an attempt there: it refuses after its tries, blocking or not, and writes nothing."""
    port = free_ports(1, cluster_bus=True)[0]
    args = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--appendonly",
        "no",
        "--save",
        "",
    ]
    newcomer = RedisProcess(f"newcomer:{port}", cluster.root / "newcomer", port, args)
    everyone = [p for p in cluster.nodes if p.alive]
    newcomer.start()
    moving: Resharding | None = None
    try:
        with newcomer.client() as c:
            c.execute_command("CLUSTER", "MEET", HOST, everyone[0].port)
        wait_until("every node to know the newcomer", lambda: knows_all(everyone, len(everyone) + 1), 30)
        moving = Resharding(cluster, a_fresh_slot(), target=newcomer)
        moving.start()
        store = waited_store(cluster, namespace())
        wait, key = ReplicaWait(1, WAIT_TIMEOUT), store.key(ids_in_slot(moving.slot, 1)[0])
        script = {"sha": hashlib.sha1(SET_SCRIPT.encode()).hexdigest(), "source": SET_SCRIPT}
        with pytest.raises(StoreError, match="outside the cluster's slot map"):
            wait.begin(store.client, key=key, args=[b"x"], facts=None, **script)

        async def asked() -> None:
            with pytest.raises(StoreError, match="outside the cluster's slot map"):
                await wait.abegin(store.async_client(), key=key, args=[b"x"], facts=None, **script)

        asyncio.run(asked())
        assert asking_calls(newcomer) == 0
        assert moving.keys_on(newcomer) == set() and moving.keys_on(moving.source) == set()
    finally:
        if moving is not None:  # abort the migration: the slot stays the source's
            moving.setslot(moving.source, "STABLE")
            moving.setslot(newcomer, "STABLE")
        newcomer_id = node_id(newcomer)
        newcomer.stop()
        for p in everyone:
            with p.client() as c:
                c.execute_command("CLUSTER", "FORGET", newcomer_id)
        wait_until("every node to forget the newcomer", lambda: knows_all(everyone, len(everyone)), 30)
        cluster.wait_healthy()


def knows_all(nodes: list[RedisProcess], count: int) -> bool:
    for p in nodes:
        with p.client(socket_timeout=2) as c:
            if len(c.execute_command("CLUSTER", "NODES").decode().strip().splitlines()) != count:
                return False
    return True


# -- the rules, without a server ------------------------------------------------------------------
ASK = "3999 127.0.0.1:7002"


def test_what_a_pipelines_replies_mean() -> None:
    assert read_replies([b"r", 1], cluster=True, asked=False) == Done(b"r", Acks(1))
    assert read_replies([b"r", 1, [1, 0]], cluster=True, asked=False) == Done(b"r", Acks(1, 1))
    assert read_replies([b"OK", b"r", 1], cluster=True, asked=True) == Done(b"r", Acks(1))  # ASKING's OK
    ask, moved = AskError(ASK), MovedError(ASK)
    assert read_replies([ask, 1], cluster=True, asked=False) is ask  # follow it
    assert read_replies([moved, 1], cluster=True, asked=False) == Again(moved, refresh=True)
    assert read_replies([b"OK", ask, 1], cluster=True, asked=True) == Again(ask, refresh=True)
    noscript = NoScriptError("No matching script")
    assert read_replies([noscript, 1], cluster=True, asked=False) == Again(noscript, load_script=True)
    lost = redis.ConnectionError("Connection closed by server.")
    assert read_replies(lost, cluster=True, asked=False) == Again(lost, refresh=True)
    off = OffTheMapError(ask)
    assert read_replies(off, cluster=True, asked=True) == Again(off, refresh=True)
    # a plain client neither follows nor re-reads a map: the error is raised
    with pytest.raises(AskError):
        read_replies([ask, 1], cluster=False, asked=False)
    with pytest.raises(redis.ConnectionError):
        read_replies(lost, cluster=False, asked=False)
    # ASKING refused (an ACL), a WAIT refused: raised, not retried
    with pytest.raises(redis.ResponseError, match="NOPERM"):
        read_replies([redis.ResponseError("NOPERM asking"), b"r", 1], cluster=True, asked=True)
    with pytest.raises(redis.ResponseError, match="WAITAOF"):
        read_replies([b"r", 1, redis.ResponseError("ERR WAITAOF off")], cluster=True, asked=False)


def test_an_ask_is_followed_with_asking_right_before_the_script() -> None:
    wait = ReplicaWait(1, 0.5)
    plan = wait._plan(key=b"k", sha="abc", source="return 1", args=[b"a"], facts=None, cluster=True)
    assert next(plan) == Send([("EVALSHA", "abc", 1, b"k", b"a"), ("WAIT", 1, 500)])
    ask = AskError(ASK)
    followed = plan.send([ask, 1])  # straight to the node the ASK names: no map refresh between
    assert followed == Send([("ASKING",), ("EVAL", "return 1", 1, b"k", b"a"), ("WAIT", 1, 500)], ask=ask)
    with pytest.raises(StopIteration) as done:
        plan.send([b"OK", b"started", 1])
    assert done.value.value == (b"started", Acks(1))


def test_the_tries_stay_bounded_when_every_ask_ends_in_moved() -> None:
    wait = ReplicaWait(1, 0.5)
    plan = wait._plan(key=b"k", sha="abc", source="return 1", args=[], facts=None, cluster=True)
    requests: list[Send | Again] = []
    answer: Any = None
    with pytest.raises(StoreError, match="after 3 tries"):
        while True:
            request = plan.send(answer)
            requests.append(request)
            if isinstance(request, Again):
                answer = None
            elif request.ask is None:
                answer = [AskError(ASK), 1]
            else:
                answer = [b"OK", MovedError("3999 127.0.0.1:7001"), 1]
    kinds = ["ask" if isinstance(r, Send) and r.ask else type(r).__name__ for r in requests]
    assert kinds == ["Send", "ask", "Again"] * 3
    assert all(r.refresh for r in requests if isinstance(r, Again))


# -- auto-pipelined asyncio calls meeting MOVED and ASK (issue 27) ---------------------------------------
class RecordingCluster(aredis.RedisCluster):
    """An asyncio Cluster client that notes the commands of each pipeline it makes."""

    batches: list[list[tuple[Any, ...]]]

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        return recorded(super().pipeline(transaction, shard_hint), self.batches)


def redirections(process: RedisProcess, kind: str) -> int:
    """How many ``-MOVED`` or ``-ASK`` error replies ``process`` has sent (INFO errorstats)."""
    with process.client() as c:
        stats = c.info("errorstats").get(f"errorstat_{kind}")
    return int(stats["count"]) if isinstance(stats, dict) else 0


def pipelined_store(cluster: ClusterTopology) -> tuple[RedisEffectStore, RecordingCluster]:
    first = cluster.primaries()[0]
    client = RecordingCluster(host=HOST, port=first.port, socket_timeout=5)
    client.batches = []
    return RedisEffectStore(cluster.url, async_client=client, namespace=namespace()), client


def batched_with_others(client: RecordingCluster, key: bytes) -> bool:
    return any(len(batch) > 1 and any(key in args for args in batch) for batch in client.batches)


def test_auto_pipelined_calls_follow_moved_after_a_finished_resharding(cluster: ClusterTopology) -> None:
    """The client's slot map is stale (it learned the slot's owner before the slot moved): the batch's
    commands for that slot meet MOVED at the old owner and are sent on to the new one; each call runs
    once, its record on the new owner, and the calls in other slots of the same batches are unharmed."""
    store, client = pipelined_store(cluster)
    tool = Counted(store)
    moving = Resharding(cluster, a_fresh_slot())
    moved_ids = ids_in_slot(moving.slot, 6)
    elsewhere = [f"elsewhere-{secrets.token_hex(5)}" for _ in range(26)]
    moved_before = redirections(moving.source, "MOVED")

    async def scenario() -> dict[str, dict[str, Any]]:
        await asyncio.gather(
            *(tool.acall(i, i) for i in (f"warm-{n}-{secrets.token_hex(3)}" for n in range(8)))
        )
        moving.start()
        moving.finish()  # the client is not told: its map still names the source
        ids = [*moved_ids, *elsewhere]
        made = dict(zip(ids, await asyncio.gather(*(tool.acall(i, i) for i in ids)), strict=True))
        again = await asyncio.gather(*(tool.acall(i, i) for i in ids))
        assert again == [made[i] for i in ids]
        await client.aclose()
        return made

    made = asyncio.run(scenario())
    assert {i: tool.runs[i] for i in made} == dict.fromkeys(made, 1)
    assert redirections(moving.source, "MOVED") > moved_before, "no MOVED met: the test proved nothing"
    assert moving.keys_on(moving.target) >= {record_key(store.namespace, i) for i in moved_ids}
    assert any(batched_with_others(client, record_key(store.namespace, i)) for i in moved_ids)


def test_auto_pipelined_calls_in_a_migrating_slot_run_at_most_once(cluster: ClusterTopology) -> None:
    """New calls in a MIGRATING slot, batched with calls elsewhere: the source answers ASK for keys it
    does not hold, and the command is followed to the importing node (by redis-py, or by the store
    where redis-py gives up: see the next tests). Each call runs at most once, and a replay gets the
    first call's value or, had a commit not landed, the in-doubt refusal."""
    store, client = pipelined_store(cluster)
    tool = Counted(store)
    with resharding(cluster) as moving:
        asked_ids = ids_in_slot(moving.slot, 6)
        elsewhere = [f"elsewhere-{secrets.token_hex(5)}" for _ in range(26)]
        asks_before = redirections(moving.source, "ASK")
        ids = [*asked_ids, *elsewhere]

        async def scenario() -> tuple[list[Any], list[Any]]:
            first = await asyncio.gather(*(tool.acall(i, i) for i in ids), return_exceptions=True)
            again = await asyncio.gather(*(tool.acall(i, i) for i in ids), return_exceptions=True)
            await client.aclose()
            return first, again

        first, again = asyncio.run(scenario())
        assert all(tool.runs[i] <= 1 for i in ids), tool.runs  # never twice, whatever failed
        for call_id, made, replayed in zip(asked_ids, first, again, strict=False):  # the asked ones
            if isinstance(made, dict):  # it ran: the replay gets its value, or the in-doubt refusal
                assert tool.runs[call_id] == 1 and made["account"] == call_id
                assert replayed == made or isinstance(replayed, (EffectStatusUnknown, StoreUnavailable))
            else:  # the begin did not land (see the next test): the tool did not run then
                assert isinstance(made, StoreUnavailable), (call_id, made)
                assert isinstance(replayed, (dict, StoreUnavailable)), (call_id, replayed)
                assert tool.runs[call_id] == (1 if isinstance(replayed, dict) else 0)
        assert first[len(asked_ids) :] == again[len(asked_ids) :]  # the other slots' calls: unharmed
        assert all(isinstance(made, dict) for made in first[len(asked_ids) :])
        assert redirections(moving.source, "ASK") > asks_before, "no ASK met: the test proved nothing"
        assert any(batched_with_others(client, record_key(store.namespace, i)) for i in asked_ids)


def test_every_asyncio_commit_in_a_migrating_slot_lands(cluster: ClusterTopology) -> None:
    store, client = pipelined_store(cluster)
    tool = Counted(store)
    with resharding(cluster) as moving:
        asked_ids = ids_in_slot(moving.slot, 6)
        elsewhere = [f"elsewhere-{secrets.token_hex(5)}" for _ in range(26)]

        async def scenario() -> None:
            await asyncio.gather(*(tool.acall(i, i) for i in [*asked_ids, *elsewhere]))
            await client.aclose()

        asyncio.run(scenario())
        for call_id in asked_ids:
            record = store.get(call_id)
            assert record is not None and record.status is Status.COMMITTED, (call_id, record)


@pytest.mark.parametrize("auto_pipeline", [True, False], ids=["auto-pipelined", "one-by-one"])
def test_concurrent_asyncio_begins_and_commits_in_a_migrating_slot_land_once(
    cluster: ClusterTopology, auto_pipeline: bool
) -> None:
    """redis-py's asyncio Cluster client sends ``ASKING`` through the node's pool apart from the command
    it allows, so with calls in flight the command may leave on another connection and bounce between
    the two nodes until redis-py gives up ("TTL exhausted"); the store then sends it again itself,
    ``ASKING`` and the command on one connection (stores/asking.py). With a store that already ran its
    scripts, every begin is a ``SET NX`` and every commit an ``EVALSHA`` the importing node may not
    have cached: each call in the migrating slot starts, runs once and commits, its record on the
    importing node, and a second round replays every value without running anything."""
    first = cluster.primaries()[0]
    client = aredis.RedisCluster(host=HOST, port=first.port, socket_timeout=5)
    store = RedisEffectStore(
        cluster.url, async_client=client, namespace=namespace(), auto_pipeline=auto_pipeline
    )
    tool = Counted(store)
    with resharding(cluster) as moving:
        asked_ids = ids_in_slot(moving.slot, 8)
        elsewhere = [f"elsewhere-{secrets.token_hex(5)}" for _ in range(24)]
        ids = [*asked_ids, *elsewhere]
        asks_before = redirections(moving.source, "ASK")

        async def scenario() -> tuple[list[Any], list[Any]]:
            await tool.acall("warm-" + secrets.token_hex(4), "warm")  # begins are SET NX from now on
            made = await asyncio.gather(*(tool.acall(i, i) for i in ids))
            again = await asyncio.gather(*(tool.acall(i, i) for i in ids))
            records = await asyncio.gather(*(store.aget(i) for i in asked_ids))  # reads follow it too
            assert all(r is not None and r.status is Status.COMMITTED for r in records), records
            await client.aclose()
            return made, again

        made, again = asyncio.run(scenario())
        assert made == again
        assert {i: tool.runs[i] for i in ids} == dict.fromkeys(ids, 1)
        assert redirections(moving.source, "ASK") > asks_before, "no ASK met: the test proved nothing"
        assert moving.keys_on(moving.target) == {record_key(store.namespace, i) for i in asked_ids}
        for call_id in asked_ids:
            record = store.get(call_id)
            assert record is not None and record.status is Status.COMMITTED, (call_id, record)


# -- the store's own following of an ASK, without a server ----------------------------------------
def test_a_command_redis_py_gave_up_on_follows_its_ask_on_one_connection() -> None:
    commit = ("EVALSHA", "abc", 1, b"k", b"a")
    plan = follow([commit])
    assert next(plan) == Send([commit])  # to the key's primary, as the slot map names it
    ask = AskError(ASK)
    assert plan.send([ask]) == Send([("ASKING",), commit], ask=ask)  # one pipeline, one connection
    with pytest.raises(StopIteration) as done:
        plan.send([b"OK", b"committed"])
    assert done.value.value == [b"committed"]

    read = [("GET", b"k"), ("PTTL", b"k")]  # ASKING allows one command: one before each
    plan = follow(read)
    assert next(plan) == Send(read)
    assert plan.send([ask, ask]) == Send([("ASKING",), read[0], ("ASKING",), read[1]], ask=ask)
    with pytest.raises(StopIteration) as done:
        plan.send([b"OK", b"v", b"OK", 1000])
    assert done.value.value == [b"v", 1000]


def test_the_followed_commands_own_errors_come_back_and_its_tries_are_bounded() -> None:
    ask, moved = AskError(ASK), MovedError(ASK)
    noscript = NoScriptError("No matching script")
    assert read_followed([b"OK", noscript], asked=True) == [noscript]  # the store sends the source
    assert read_followed([moved], asked=False) == Again(moved, refresh=True)  # the migration finished
    assert read_followed([b"OK", ask], asked=True) == Again(ask, refresh=True)  # not followed twice
    lost = redis.ConnectionError("Connection closed by server.")
    assert read_followed(lost, asked=False) == Again(lost, refresh=True)
    with pytest.raises(redis.ResponseError, match="NOPERM"):
        read_followed([redis.ResponseError("NOPERM asking"), b"r"], asked=True)

    plan = follow([("SET", b"k", b"v", "NX", "PX", 1000)])
    kinds: list[str] = []
    answer: Any = None
    with pytest.raises(AskNotFollowed, match=f"after {TRIES} tries"):  # a ClusterError, as redis-py's
        while True:
            request = plan.send(answer)
            kinds.append("ask" if isinstance(request, Send) and request.ask else type(request).__name__)
            answer = (
                None if isinstance(request, Again) else [AskError(ASK)] if not request.ask else [b"OK", moved]
            )
    assert kinds == ["Send", "ask", "Again"] * TRIES


def test_the_key_of_a_store_command() -> None:
    assert key_of(("SET", b"k", b"v", "NX", "PX", 1)) == b"k"
    assert key_of(("EVALSHA", "abc", 1, b"k", b"a")) == b"k"
    assert key_of(("EVAL", "return 1", 1, b"k")) == b"k"
    assert key_of(("EVAL", "return 1", 0)) is None
    assert key_of(("PING",)) is None
    assert key_of(("SCRIPT", "LOAD", "return 1")) is None
