"""Dedupe across tool_call_ids (issue 25, part 5): ``EffectGuard(dedupe=...)`` treats the same
business call (same idempotency key) under a new tool_call_id as that call, through an index from
idempotency key to the id that holds it (docs/in-doubt.md, "Dedupe across ids").

On the in-memory store, a real redis-server and a 3-primary Cluster (where the index entry and the
record live in different slots): a timed-out call retried under a new id runs no more; a duplicate
that arrives while the first runs waits and gets its outcome; ``"always"`` replays a committed value
to a new id (and that id's own retry replays it); two ids started together never both run, from
threads and from two processes; a stale index entry does not block its key; ``dedupe=None`` leaves
the index alone.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from airlock_redis import (
    EffectGuard,
    EffectInProgress,
    EffectStatusUnknown,
    InMemoryEffectStore,
    RedisEffectStore,
    Status,
    StoreUnavailable,
    reversibility,
)
from airlock_redis.core.records import BeginRequest
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.keys import index_key, record_key

from .topo_helpers import fresh_id
from .topologies import shared_cluster

LEASE = 2.0


@pytest.fixture(params=["memory", "redis", "cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemoryEffectStore()
        return
    if request.param == "redis":
        server: EmbeddedRedis = request.getfixturevalue("redis_server")
        url = server.url
    else:
        url = shared_cluster(request.config).url
    rstore = RedisEffectStore(url, namespace=f"dedupe:{fresh_id()}")
    yield rstore
    rstore.close()


def _guard(store: Any, dedupe: Any = "in_doubt", wait: float = 5.0) -> EffectGuard:
    return EffectGuard(store=store, lease=LEASE, renew_every=LEASE / 4, wait_for_running=wait, dedupe=dedupe)


def _entry(store: Any, key: str) -> tuple[str, int | None] | None:
    """The id the key's index entry names, and its TTL in ms (None: no entry)."""
    if isinstance(store, InMemoryEffectStore):
        holder = store.index_entry(key)
        return None if holder is None else (holder.tool_call_id, None)
    raw = store.client.get(store.index_key(key))
    if raw is None:
        return None
    from airlock_redis.stores.layout import parse_holder

    return parse_holder(raw).tool_call_id, int(store.client.pttl(store.index_key(key)))


def _key_of(store: Any, tool_call_id: str) -> str:
    record = store.get(tool_call_id)
    assert record is not None
    return str(record.idempotency_key)


class Bank:
    """A charge tool whose runs are counted (and whose overlap is measured)."""

    def __init__(self, seconds: float = 0.0, error: BaseException | None = None) -> None:
        self.runs: list[int] = []
        self.seconds = seconds
        self.error = error
        self.started = threading.Event()
        self.inside = 0
        self.most_inside = 0
        self._lock = threading.Lock()

    def charge(self, cents: int) -> dict[str, int]:
        with self._lock:
            self.runs.append(cents)
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        self.started.set()
        try:
            time.sleep(self.seconds)
            if self.error is not None:
                raise self.error
            return {"charged": cents, "run": len(self.runs)}
        finally:
            with self._lock:
                self.inside -= 1


def _tool(guard: EffectGuard, bank: Bank, **wrap: Any) -> Any:
    def charge(cents: int) -> dict[str, int]:
        return bank.charge(cents)

    return guard.wrap(charge, **wrap)


# -- in doubt ----------------------------------------------------------------------------------
def test_a_timed_out_call_retried_under_a_new_id_is_refused_and_runs_no_more(store: Any) -> None:
    """The issue's case: the first call times out (unknown); the model retries with the same
    arguments under a new id: refused, the tool ran once. The new id leaves no record of its own,
    and its own retry is refused the same way."""
    guard, bank = _guard(store), Bank(error=TimeoutError("read timed out"))
    charge = _tool(guard, bank)
    with pytest.raises(TimeoutError):
        guard.call("first", charge, 5)
    key = _key_of(store, "first")
    for retry in ("second", "second", "third"):
        with pytest.raises(EffectStatusUnknown) as refused:
            guard.call(retry, charge, 5)
        assert "'first'" in str(refused.value) and refused.value.tool_call_id == retry
        assert store.get(retry) is None
    assert bank.runs == [5]
    entry = _entry(store, key)
    assert entry is not None and entry[0] == "first"
    if entry[1] is not None:  # kept as long as the unknown record, never longer
        assert entry[1] <= store.ttls.millis(Status.UNKNOWN)
    # other arguments are another call
    bank.error = None
    assert guard.call("other", charge, 6)["charged"] == 6


def test_async_a_timed_out_call_retried_under_a_new_id_is_refused(store: Any) -> None:
    guard, bank = _guard(store), Bank(error=TimeoutError("read timed out"))

    async def charge(cents: int) -> dict[str, int]:
        return bank.charge(cents)

    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            await guard.acall("a-first", charge, 5)
        with pytest.raises(EffectStatusUnknown):
            await guard.acall("a-second", charge, 5)

    asyncio.run(scenario())
    assert bank.runs == [5]


def test_a_reversible_tool_runs_again_after_a_call_in_doubt(store: Any) -> None:
    guard, bank = _guard(store), Bank(error=TimeoutError("x"))

    @reversibility("reversible")
    def charge(cents: int) -> dict[str, int]:
        return bank.charge(cents)

    tool = guard.wrap(charge)
    with pytest.raises(TimeoutError):
        guard.call("r-first", tool, 5)
    bank.error = None
    assert guard.call("r-second", tool, 5)["charged"] == 5
    assert bank.runs == [5, 5]
    entry = _entry(store, _key_of(store, "r-second"))
    assert entry is None  # in_doubt: a committed call's entry is deleted


# -- a duplicate while the first runs -----------------------------------------------------------
@pytest.mark.parametrize("dedupe", ["in_doubt", "always"])
def test_a_duplicate_under_a_new_id_waits_and_gets_the_value(store: Any, dedupe: str) -> None:
    """A second id 0.1 s into a 0.5 s call waits for it and gets its value (both modes); its own
    record holds the value, so its retry replays it. Once the first committed, a new id is a new
    call under "in_doubt" (it runs) and a replay under "always"."""
    guard, bank = _guard(store, dedupe), Bank(seconds=0.5)
    charge = _tool(guard, bank)
    out: list[Any] = []
    first = threading.Thread(target=lambda: out.append(guard.call("w-first", charge, 5)))
    first.start()
    assert bank.started.wait(10)
    time.sleep(0.1)
    assert guard.call("w-second", charge, 5) == {"charged": 5, "run": 1}
    first.join(10)
    assert out == [{"charged": 5, "run": 1}] and bank.runs == [5]
    second = store.get("w-second")
    assert second is not None and second.status is Status.COMMITTED
    assert guard.call("w-second", charge, 5) == {"charged": 5, "run": 1}  # its own retry replays
    assert bank.runs == [5]
    third = guard.call("w-third", charge, 5)
    if dedupe == "always":
        assert third == {"charged": 5, "run": 1} and bank.runs == [5]
    else:
        assert third == {"charged": 5, "run": 2} and bank.runs == [5, 5]


def test_still_running_after_the_wait_is_in_progress_naming_the_first(store: Any) -> None:
    guard, bank = _guard(store, wait=0.3), Bank(seconds=1.5)
    charge = _tool(guard, bank)
    first = threading.Thread(target=lambda: guard.call("p-first", charge, 5))
    first.start()
    assert bank.started.wait(10)
    with pytest.raises(EffectInProgress) as refused:
        guard.call("p-second", charge, 5)
    assert "'p-first'" in str(refused.value) and "resolve" not in refused.value.fix_hint
    assert store.get("p-second") is None  # it gave its record back: it never ran
    first.join(10)
    assert bank.runs == [5]


def test_an_async_duplicate_waits_too(store: Any) -> None:
    guard, bank = _guard(store, "in_doubt"), Bank(seconds=0.5)
    charge = _tool(guard, bank)
    first = threading.Thread(target=lambda: guard.call("aw-first", charge, 5))
    first.start()
    assert bank.started.wait(10)

    async def duplicate() -> Any:
        async def acharge(cents: int) -> dict[str, int]:
            return await asyncio.to_thread(bank.charge, cents)

        acharge.__name__ = acharge.__qualname__ = "charge"
        return await guard.acall("aw-second", acharge, 5)

    assert asyncio.run(duplicate()) == {"charged": 5, "run": 1}
    first.join(10)
    assert bank.runs == [5]


# -- always ---------------------------------------------------------------------------------------
def test_always_replays_a_committed_value_to_a_new_id_and_its_retry(store: Any) -> None:
    guard, bank = _guard(store, "always"), Bank()
    charge = _tool(guard, bank)
    assert guard.call("c-first", charge, 5) == {"charged": 5, "run": 1}
    key = _key_of(store, "c-first")
    entry = _entry(store, key)
    assert entry is not None and entry[0] == "c-first"
    if entry[1] is not None:
        assert entry[1] <= store.ttls.millis(Status.COMMITTED)
    for tool_call_id in ("c-second", "c-second", "c-third"):
        assert guard.call(tool_call_id, charge, 5) == {"charged": 5, "run": 1}
    record = store.get("c-second")
    assert record is not None and record.status is Status.COMMITTED and record.value is not None
    assert bank.runs == [5]


def test_per_tool_dedupe_overrides_the_guard(store: Any) -> None:
    bank = Bank()
    on = _tool(_guard(store, None), bank, dedupe="always")
    off = EffectGuard(store=store, lease=LEASE, dedupe="always").wrap(bank.charge, name="other", dedupe=None)
    guard = _guard(store, None)
    guard.call("o-1", on, 5)
    guard.call("o-2", on, 5)
    assert bank.runs == [5]
    guard.call("o-3", off, 7)
    guard.call("o-4", off, 7)
    assert bank.runs == [5, 7, 7]


# -- racing ids ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dedupe", ["in_doubt", "always"])
def test_two_ids_started_together_never_both_run(store: Any, dedupe: str) -> None:
    """100 rounds, two threads, the same arguments under two ids, released together: the tool never
    runs twice at once; under "always" it runs once per round and both get its value."""
    guard, bank = _guard(store, dedupe), Bank(seconds=0.002)
    charge = _tool(guard, bank)
    rounds = 100
    for n in range(rounds):
        gate = threading.Barrier(2)
        got: dict[str, Any] = {}

        def call(
            tool_call_id: str, n: int = n, gate: threading.Barrier = gate, got: dict[str, Any] = got
        ) -> None:
            gate.wait(5)
            try:
                got[tool_call_id] = guard.call(tool_call_id, charge, n)
            except Exception as exc:
                got[tool_call_id] = exc

        threads = [threading.Thread(target=call, args=(f"race{n}-{side}",)) for side in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert all(isinstance(value, dict) for value in got.values()), got
        if dedupe == "always":
            assert got[f"race{n}-a"] == got[f"race{n}-b"]
    assert bank.most_inside == 1
    if dedupe == "always":
        assert len(bank.runs) == rounds


_RACER = textwrap.dedent(
    """
    import sys, time
    import redis
    from airlock_redis import EffectGuard, RedisEffectStore

    url, namespace, side = sys.argv[1], sys.argv[2], sys.argv[3]
    rounds, start = int(sys.argv[4]), float(sys.argv[5])
    store = RedisEffectStore(url, namespace=namespace)
    backend = store.client  # a Redis or a RedisCluster: the backend's counters live there too
    guard = EffectGuard(store, lease=2.0, wait_for_running=5, dedupe="always")

    def charge(n: int) -> int:
        inside = backend.incr(namespace + ":inside:" + str(n))
        backend.incr(namespace + ":runs:" + str(n))
        time.sleep(0.002)
        backend.decr(namespace + ":inside:" + str(n))
        if inside > 1:
            backend.incr(namespace + ":overlaps")
        return n

    tool = guard.wrap(charge)
    while time.time() < start:
        time.sleep(0.001)
    for n in range(rounds):
        assert guard.call(f"proc{side}-{n}", tool, n) == n
    print("ok")
    """
)


@pytest.mark.parametrize("where", ["redis", "cluster"])
def test_two_processes_never_both_run_one_key(request: pytest.FixtureRequest, where: str) -> None:
    """Two processes call the same 100 business calls, each under ids of its own, at the same
    moment ("always"): each call ran exactly once (a counter in the backend), never twice at once."""
    if where == "redis":
        url = request.getfixturevalue("redis_server").url
    else:
        url = shared_cluster(request.config).url
    namespace, rounds = f"dedupe:{fresh_id()}", 100
    start = time.time() + 1.5
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, url, namespace, side, str(rounds), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for side in "ab"
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == b"ok", err.decode()[-2000:]
    with RedisEffectStore(url, namespace=namespace) as store:
        client = store.client
        runs = [int(client.get(f"{namespace}:runs:{n}") or 0) for n in range(rounds)]
        assert runs == [1] * rounds
        assert client.get(f"{namespace}:overlaps") is None


# -- stale entries --------------------------------------------------------------------------------
def _ghost_claim(store: Any, guard: EffectGuard, tool_call_id: str, cents: int) -> str:
    """An index entry for the call ``charge(cents)`` naming ``tool_call_id``, which has no record."""
    from airlock_redis.core.canonical import idempotency_key

    key = idempotency_key("charge", {"cents": cents})
    assert store.claim(BeginRequest(tool_call_id, key, "charge", "ghost-token", False)) is None
    return key


def test_an_entry_whose_record_is_gone_does_not_block_the_key(store: Any) -> None:
    guard, bank = _guard(store, "always"), Bank()
    charge = _tool(guard, bank)
    key = _ghost_claim(store, guard, "ghost", 5)
    assert _entry(store, key) is not None
    assert guard.call("after-ghost", charge, 5)["charged"] == 5
    assert bank.runs == [5]
    entry = _entry(store, key)
    assert entry is not None and entry[0] == "after-ghost"


def test_an_entry_whose_record_was_released_or_expired_does_not_block_the_key(store: Any) -> None:
    guard, bank = _guard(store, "always"), Bank()
    charge = _tool(guard, bank)
    guard.call("rel-first", charge, 5)
    assert guard.resolve("rel-first", "release", force=True).value == "ok"
    assert guard.call("rel-second", charge, 5) == {"charged": 5, "run": 2}
    # expired: the holder's record is gone (deleted by hand, as an expiry would)
    if isinstance(store, RedisEffectStore):
        store.client.delete(store.key("rel-second"))
        assert guard.call("rel-third", charge, 5) == {"charged": 5, "run": 3}
        assert bank.runs == [5, 5, 5]


def test_a_call_under_another_key_in_the_holders_record_is_stale(store: Any) -> None:
    guard, bank = _guard(store, "in_doubt"), Bank()
    charge = _tool(guard, bank)
    guard.call("other-args", charge, 9)  # a committed record under another key
    key = _ghost_claim(store, guard, "other-args", 5)  # an entry for charge(5) naming it
    assert guard.call("mine", charge, 5)["charged"] == 5
    assert bank.runs == [9, 5]
    entry = _entry(store, key)
    assert entry is None  # in_doubt: deleted once "mine" committed


# -- dedupe=None ----------------------------------------------------------------------------------
def test_without_dedupe_the_index_is_untouched(store: Any) -> None:
    guard, bank = _guard(store, None), Bank()
    charge = _tool(guard, bank)
    guard.call("n-1", charge, 5)
    guard.call("n-2", charge, 5)
    assert bank.runs == [5, 5]
    assert _entry(store, _key_of(store, "n-1")) is None
    if isinstance(store, RedisEffectStore):  # no index key at all, on any node
        assert list(store.client.scan_iter(match=f"{store.namespace}:{{*}}k:*")) == []
    else:
        assert store._index == {}


@pytest.fixture(params=["redis", "cluster"])
def redis_store(request: pytest.FixtureRequest) -> Iterator[RedisEffectStore]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_server").url
    else:
        url = shared_cluster(request.config).url
    rstore = RedisEffectStore(url, namespace=f"dedupe:{fresh_id()}")
    yield rstore
    rstore.close()


def test_the_index_entry_is_no_record_and_lives_in_a_slot_of_its_own(redis_store: RedisEffectStore) -> None:
    from airlock_redis.stores.keys import tool_call_id_of

    store = redis_store

    key = "a" * 64
    index = index_key(store.namespace, key)
    assert tool_call_id_of(store.namespace, index) is None
    assert index.startswith(f"{store.namespace}:{{".encode())
    guard, bank = _guard(store, "always"), Bank()
    guard.call("slot-1", _tool(guard, bank), 5)
    real = store.index_key(_key_of(store, "slot-1"))
    if isinstance(store.client, redis.RedisCluster):
        assert store.client.keyslot(real) != store.client.keyslot(record_key(store.namespace, "slot-1"))
    assert store.client.exists(real) == 1


def test_dedupe_needs_a_store_that_keeps_the_index() -> None:
    class Plain:
        def __getattr__(self, name: str) -> Any:
            raise AttributeError(name)

    with pytest.raises(ValueError):
        EffectGuard(InMemoryEffectStore(), dedupe="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dedupe index"):
        EffectGuard(Plain(), dedupe="always", lease=None, wait_for_running=0)


# -- wait_replicas: the claim is as durable as the record -----------------------------------------
def _waits_on(client: Any, key: bytes) -> int:
    """WAITs the primary that holds ``key`` has run."""
    node = client.get_node_from_key(key)
    plain = redis.Redis(host=node.host, port=node.port)
    try:
        stats = plain.info("commandstats")
    finally:
        plain.close()
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def test_with_wait_replicas_the_claim_waits_on_its_own_primary(pytestconfig: pytest.Config) -> None:
    """On a Cluster: the claim and its WAIT go to the index entry's primary on one connection (a
    WAIT counted there); a claim that misses its replicas is refused and leaves neither a claim nor
    a record, and the tool does not run."""
    store = RedisEffectStore(
        shared_cluster(pytestconfig).url, namespace=f"dedupe:{fresh_id()}", wait_replicas=1, wait_timeout=2.0
    )
    guard, bank = _guard(store, "always"), Bank()
    charge = _tool(guard, bank)
    from airlock_redis.core.canonical import idempotency_key

    key = idempotency_key("charge", {"cents": 5})
    index = store.index_key(key)
    before = _waits_on(store.client, index)
    assert guard.call("durable-1", charge, 5)["charged"] == 5
    assert _waits_on(store.client, index) > before
    assert bank.runs == [5]

    from airlock_redis.stores.durability import DurabilityError, ReplicaWait

    key = idempotency_key("charge", {"cents": 6})
    original = ReplicaWait.check

    def short(self: ReplicaWait, acks: Any, what: str, *, landed: bool = False) -> None:
        if "claim" in what:
            raise DurabilityError(f"only 0 of the 1 replicas acknowledged {what}", maybe_applied=landed)
        original(self, acks, what, landed=landed)

    ReplicaWait.check = short  # type: ignore[method-assign]
    try:
        with pytest.raises(StoreUnavailable, match="claim"):
            guard.call("durable-2", charge, 6)
    finally:
        ReplicaWait.check = original  # type: ignore[method-assign]
    assert bank.runs == [5]
    assert store.get("durable-2") is None and _entry(store, key) is None
    store.close()


# -- the in-memory store's index is the scripts' --------------------------------------------------
def _index_story(store: Any) -> list[Any]:
    """One sequence of claims and unclaims; what each answered (holders by id and token)."""
    key = "b" * 64
    a1, a2 = (BeginRequest("ix-a", key, "charge", token, False) for token in ("ta1", "ta2"))
    b = BeginRequest("ix-b", key, "charge", "tb", False)

    def claim(request: BeginRequest, expected: Any = None) -> Any:
        holder = store.claim(request, expected)
        return None if holder is None else (holder.tool_call_id, holder.token)

    said: list[Any] = [claim(a1), claim(a1), claim(b)]  # claimed, a re-send, held by a1
    held = store.claim(b)
    said += [claim(a2)]  # another attempt of the same id takes it over
    said += [claim(b, held)]  # a compare-and-set on a value that is no longer there: held by a2
    said += [store.unclaim(a1, None), store.unclaim(a2, Status.COMMITTED)]  # fenced: only a2's
    said += [claim(b), store.unclaim(b, None), claim(b), store.unclaim(b, Status.UNKNOWN)]
    said += [claim(a1)]  # the id's own entry, taken back by its first attempt
    read = store.claim(b)  # held by a1: a compare-and-set on what was read takes it
    said += [claim(b, read), store.unclaim(a1, None), store.unclaim(b, None), store.unclaim(b, None)]
    return said


def test_the_memory_index_answers_as_the_scripts(store: Any) -> None:
    expected = [
        None,
        None,
        ("ix-a", "ta1"),
        None,
        ("ix-a", "ta2"),
        False,
        True,
        ("ix-a", "ta2"),
        False,
        ("ix-a", "ta2"),
        False,
        None,
        None,
        False,
        True,
        False,
    ]
    assert _index_story(store) == expected


# -- what a crash between the steps leaves ------------------------------------------------------------
def _crashed(store: Any, tool_call_id: str, cents: int, *, claimed: bool) -> None:
    """An attempt of ``charge(cents)`` that began its record under a short lease (and claimed the
    key, when ``claimed``), then died."""
    from airlock_redis.core.canonical import idempotency_key

    key = idempotency_key("charge", {"cents": cents})
    request = BeginRequest(tool_call_id, key, "charge", f"dead-{tool_call_id}", False, lease_ms=300)
    assert store.begin(request).kind.value == "started"
    if claimed:
        assert store.claim(request) is None


def test_a_crash_after_the_claim_leaves_the_key_in_doubt_once_the_lease_lapses(store: Any) -> None:
    guard, bank = _guard(store, "in_doubt", wait=0.1), Bank()
    charge = _tool(guard, bank)
    _crashed(store, "dead-claimed", 5, claimed=True)
    with pytest.raises(EffectInProgress):  # its lease still runs: it may be working
        guard.call("next-1", charge, 5)
    time.sleep(0.5)  # the lease lapsed: abandoned, in doubt
    with pytest.raises(EffectStatusUnknown, match="dead-claimed"):
        guard.call("next-2", charge, 5)
    assert bank.runs == []


def test_a_crash_before_the_claim_leaves_the_key_free(store: Any) -> None:
    guard, bank = _guard(store, "in_doubt"), Bank()
    charge = _tool(guard, bank)
    _crashed(store, "dead-unclaimed", 5, claimed=False)
    assert guard.call("next-3", charge, 5)["charged"] == 5
    assert bank.runs == [5]


def test_a_cancelled_async_duplicate_leaves_nothing_behind(store: Any) -> None:
    guard, bank = _guard(store, "in_doubt"), Bank(seconds=1.0)
    charge = _tool(guard, bank)
    first = threading.Thread(target=lambda: guard.call("cx-first", charge, 5))
    first.start()
    assert bank.started.wait(10)

    async def acharge(cents: int) -> dict[str, int]:
        return bank.charge(cents)

    acharge.__name__ = acharge.__qualname__ = "charge"

    async def cancel_a_duplicate() -> None:
        task = asyncio.ensure_future(guard.acall("cx-second", acharge, 5))
        await asyncio.sleep(0.3)  # it waits for cx-first now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_a_duplicate())
    assert store.get("cx-second") is None
    entry = _entry(store, _key_of(store, "cx-first"))
    assert entry is not None and entry[0] == "cx-first"
    first.join(10)
    assert bank.runs == [5]
