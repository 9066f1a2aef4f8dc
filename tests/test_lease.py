"""Leases (issue 25, part 1): a running attempt holds its record under a lease the guard renews, so
that every reader tells a running call from an abandoned one, by the Redis server's clock.

Store level (the in-memory store on a fake clock, and a real redis-server): the record's layout,
what begin answers for a live and a lapsed lease, the renew script's fencing, and the views. Guard
level, on a real server: a quick call sends no renewal, a call running three times its lease stays
live and is never run beside itself, a worker SIGKILLed mid-tool is abandoned within its lease, and a
paused owner is fenced off once a retry took its record over.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectInProgress,
    EffectStatusUnknown,
    InMemoryEffectStore,
    RedisEffectStore,
    Status,
    reversibility,
)
from airlock_redis.core.records import BeginKind, BeginRequest, Settlement, TransitionResult
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.lease import KEEPER, LeaseKeeper, lease_settings
from airlock_redis.stores import layout

from .topo_helpers import fresh_id
from .topologies import ClusterTopology, SentinelTopology, shared_cluster, shared_sentinel, wait_until

LEASE_MS = 2_000


def request(
    tool_call_id: str, token: str, *, reversible: bool = False, lease_ms: int | None = LEASE_MS
) -> BeginRequest:
    return BeginRequest(tool_call_id, "k" * 64, "charge", token * 32, reversible, lease_ms)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Kind:
    """A store under test, and how to make a lease lapse on it."""

    def __init__(self, store: Any, lapse: Callable[[str, int], None]) -> None:
        self.store = store
        self.lapse = lapse  # (id, ms): as if the record had not been renewed for ms more


@pytest.fixture(params=["memory", "redis"])
def kind(request: pytest.FixtureRequest, namespace: str) -> Kind:
    if request.param == "memory":
        clock = Clock()
        store = InMemoryEffectStore(clock=clock)

        def lapse(tool_call_id: str, ms: int) -> None:
            clock.now += ms / 1000

        return Kind(store, lapse)
    server: EmbeddedRedis = request.getfixturevalue("redis_server")
    rstore = RedisEffectStore(server.url, namespace=namespace)
    return Kind(rstore, lapse_on(rstore))


def lapse_on(rstore: RedisEffectStore) -> Callable[[str, int], None]:
    def lapse(tool_call_id: str, ms: int) -> None:
        key = rstore.key(tool_call_id)
        rstore.client.pexpire(key, rstore.client.pttl(key) - ms)

    return lapse


# -- the record ------------------------------------------------------------------------------------
@pytest.mark.redis_server
def test_a_leased_pending_record_is_layout_b_and_ends_as_layout_a(redis_server: EmbeddedRedis) -> None:
    """Both ways a begin writes (the script on a store's first begin, SET NX after) write the same
    layout-b record, which layout.py reads back; the commit rewrites it as a layout-a record, so a
    release that reads only "a" replays it."""
    store = RedisEffectStore(redis_server.url, namespace=f"lease:{fresh_id()}")
    for tool_call_id in ("by-script", "by-set-nx"):
        assert store.begin(request(tool_call_id, "a")).kind is BeginKind.STARTED
        raw = raw_record(store, tool_call_id)
        record = layout.parse(raw)
        pending_ms = int(store.ttls.seconds(Status.PENDING) * 1000)
        assert raw.startswith(b"bp,1,") and (record.lease_ms, record.ttl_ms) == (LEASE_MS, pending_ms)
        assert raw == layout.pack_pending(
            record.owner, record.key, record.tool, record.begun_ms or 0, LEASE_MS, pending_ms
        )
        assert layout.pack(record) == raw
        assert store.commit(request(tool_call_id, "a"), 1, b"\x01", None) is TransitionResult.OK
        committed = raw_record(store, tool_call_id)
        assert committed.startswith(b"ac,1,") and layout.parse(committed).lease_ms is None
    # without a lease: layout a, as before
    store.begin(request("no-lease", "a", lease_ms=None))
    assert raw_record(store, "no-lease").startswith(b"ap,1,")


def raw_record(store: RedisEffectStore, tool_call_id: str) -> bytes:
    raw = store.client.get(store.key(tool_call_id))
    assert isinstance(raw, bytes)
    return raw


def test_layout_b_round_trips_and_refuses_a_lease_on_another_status() -> None:
    record = layout.StoredRecord(
        status="pending", attempt=3, begun_ms=5, owner=b"o", key=b"k", tool=b"t", lease_ms=60_000, ttl_ms=9
    )
    data = layout.pack(record)
    assert data.startswith(b"bp,3,5,,0,60000,9,0,1,1,1,0,0;") and layout.parse(data) == record
    assert layout.fields_end(data) == len(data)
    with pytest.raises(layout.LayoutError, match="malformed lease"):
        layout.parse(b"bc,3,5,,0,60000,9,0,1,1,1,0,0;okt")
    # a lease kept only by a pending record: packing another status writes layout a
    assert layout.pack(layout.StoredRecord(status="unknown", lease_ms=5, ttl_ms=5)).startswith(b"au,")


# -- what begin answers ---------------------------------------------------------------------------
@pytest.mark.parametrize("reversible", [False, True], ids=["irreversible", "reversible"])
def test_a_live_lease_is_running_for_every_tool(kind: Kind, reversible: bool) -> None:
    """A duplicate of a live call is answered RUNNING, reversible or not: it never runs beside it."""
    store, tool_call_id = kind.store, fresh_id()
    assert store.begin(request(tool_call_id, "a")).kind is BeginKind.STARTED
    kind.lapse(tool_call_id, LEASE_MS // 2)
    outcome = store.begin(request(tool_call_id, "b", reversible=reversible))
    assert outcome.kind is BeginKind.RUNNING and outcome.lease_ms == LEASE_MS
    assert outcome.since_renewal_ms is not None and LEASE_MS // 2 <= outcome.since_renewal_ms <= LEASE_MS
    record = store.get(tool_call_id)
    assert record.liveness == "running" and record.owner == "a" * 32 and record.attempt == 1


def test_a_lapsed_lease_is_abandoned_or_taken_over(kind: Kind) -> None:
    store, tool_call_id = kind.store, fresh_id()
    store.begin(request(tool_call_id, "a"))
    kind.lapse(tool_call_id, LEASE_MS + 500)
    assert store.get(tool_call_id).liveness == "abandoned"
    outcome = store.begin(request(tool_call_id, "b"))
    assert outcome.kind is BeginKind.ABANDONED and (outcome.since_renewal_ms or 0) > LEASE_MS
    # a reversible tool may run again: it takes the record over under a lease of its own
    taken = store.begin(request(tool_call_id, "c", reversible=True))
    assert (taken.kind, taken.attempt) == (BeginKind.STARTED, 2)
    record = store.get(tool_call_id)
    assert record.owner == "c" * 32 and record.liveness == "running"
    # the abandoned owner's commit is fenced off
    assert store.commit(request(tool_call_id, "a"), 1, b"\x01", None) is TransitionResult.SUPERSEDED


def test_a_record_without_a_lease_keeps_the_specs_rule(kind: Kind) -> None:
    store, tool_call_id = kind.store, fresh_id()
    store.begin(request(tool_call_id, "a", lease_ms=None))
    assert store.get(tool_call_id).liveness is None
    assert store.begin(request(tool_call_id, "b")).kind is BeginKind.PENDING
    assert store.begin(request(tool_call_id, "c", reversible=True)).kind is BeginKind.STARTED


@pytest.mark.redis_server
def test_a_ttl_changed_by_hand_hides_the_lease(rstore: RedisEffectStore) -> None:
    """PERSIST (or a longer EXPIRE) on a leased record: its liveness cannot be told, so it is treated
    as a record without a lease (refused, never waited on)."""
    for change in ("persist", "longer"):
        tool_call_id = fresh_id(change)
        rstore.begin(request(tool_call_id, "a"))
        key = rstore.key(tool_call_id)
        if change == "persist":
            rstore.client.persist(key)
        else:
            rstore.client.pexpire(key, rstore.client.pttl(key) + 60_000)
        assert rstore.get(tool_call_id).liveness is None  # type: ignore[union-attr]
        assert rstore.begin(request(tool_call_id, "b")).kind is BeginKind.PENDING


def test_renew_is_fenced_on_the_owner_and_the_status(kind: Kind) -> None:
    store, tool_call_id = kind.store, fresh_id()
    store.begin(request(tool_call_id, "a"))
    kind.lapse(tool_call_id, LEASE_MS + 500)
    # a lapsed lease is renewed as long as the record is still the attempt's
    assert store.renew_leases([request(tool_call_id, "a")]) == [TransitionResult.OK]
    assert store.get(tool_call_id).liveness == "running"
    other = request(tool_call_id, "b")
    missing = request(fresh_id(), "a")
    assert store.renew_leases([other, missing]) == [TransitionResult.SUPERSEDED, TransitionResult.MISSING]
    store.commit(request(tool_call_id, "a"), 1, b"\x01", None)
    ttl = store.get(tool_call_id).ttl_ms
    kind.lapse(tool_call_id, 5_000)
    # a late renewal after the commit changes nothing: the committed TTL runs on as the commit set it
    assert store.renew_leases([request(tool_call_id, "a")]) == [TransitionResult.SUPERSEDED]
    after = store.get(tool_call_id)
    assert after.status is Status.COMMITTED and (after.ttl_ms or 0) <= ttl - 5_000


def test_an_unknown_settle_drops_the_lease(kind: Kind) -> None:
    store, tool_call_id = kind.store, fresh_id()
    store.begin(request(tool_call_id, "a"))
    assert store.settle(request(tool_call_id, "a"), 1, Settlement.UNKNOWN) is TransitionResult.OK
    record = store.get(tool_call_id)
    assert record.status is Status.UNKNOWN and record.liveness is None and record.lease_ms is None
    assert store.begin(request(tool_call_id, "b")).kind is BeginKind.UNKNOWN


# -- the guard's options --------------------------------------------------------------------------
def test_lease_settings_are_checked() -> None:
    store = InMemoryEffectStore()
    assert lease_settings(store, None, None) == (None, 0.0)
    assert lease_settings(store, 60, None) == (60.0, 20.0)
    assert lease_settings(store, 6, 1) == (6.0, 1.0)
    for lease, every in [(0, None), (-1, None), (True, None), ("60", None), (6, 6), (6, 0), (None, 3)]:
        with pytest.raises(ValueError):
            lease_settings(store, lease, every)  # type: ignore[arg-type]
    only_async = RedisEffectStore(async_client=lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="keeps leases"):
        EffectGuard(store=only_async, lease=60)


# -- the keeper --------------------------------------------------------------------------------
class CountingStore(InMemoryEffectStore):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.renewed: list[str] = []

    def renew_leases(self, requests: Any) -> Any:
        self.renewed.extend(r.tool_call_id for r in requests)
        return super().renew_leases(requests)


def test_a_quick_call_sends_no_renewal_and_leaves_no_ticket() -> None:
    store = CountingStore()
    guard = EffectGuard(store=store, lease=3, renew_every=1)
    for i in range(50):
        assert guard.call(f"quick-{i}", lambda cents: cents, i) == i
    time.sleep(1.3)  # past renew_every: nothing is left to renew
    assert store.renewed == [] and KEEPER.held == 0


def test_the_keeper_renews_in_one_batch_per_store_and_stops_on_a_lost_lease() -> None:
    clock = Clock()
    keeper = LeaseKeeper(clock=clock)
    store = CountingStore(clock=clock)
    requests = [request(f"k-{i}", str(i)) for i in range(5)]
    for r in requests:
        store.begin(r)
    tickets = [keeper.hold(store, r, 1.0) for r in requests]
    try:
        clock.now += 1.5
        with keeper._lock:
            keeper._changed.notify()
        # the store saw them before the keeper took its answers: wait for the answers
        wait_until("5 renewals answered", lambda: all(t.renewals == 1 for t in tickets) or None, 5)
        assert len(store.renewed) == 5 and keeper.held == 5
        # one record taken over by an operator: its ticket is lost and never renewed again
        store.resolve("k-0", Status.UNKNOWN)
        clock.now += 1.5
        with keeper._lock:
            keeper._changed.notify()
        wait_until("the lost lease", lambda: tickets[0].lost or None, 5)
        assert keeper.held == 4 and store.renewed.count("k-0") == 2
        for t in tickets:
            keeper.drop(t)
        assert keeper.held == 0
    finally:
        keeper.stop()
    assert keeper.thread is not None and not keeper.thread.is_alive()


# -- guarded calls on a real server -------------------------------------------------------------
@pytest.fixture
def rstore(redis_server: EmbeddedRedis) -> Iterator[RedisEffectStore]:
    store = RedisEffectStore(redis_server.url, namespace=f"lease:{fresh_id()}")
    yield store
    store.close()


@pytest.mark.redis_server
def test_a_call_running_three_times_its_lease_stays_live_and_runs_once(rstore: RedisEffectStore) -> None:
    runs: list[str] = []
    started = threading.Event()
    guard = EffectGuard(store=rstore, lease=1.5, renew_every=0.5, wait_for_running=0)

    def charge(cents: int) -> str:
        runs.append("charge")
        started.set()
        time.sleep(4.5)
        return "charged"

    @reversibility("reversible")
    def charge_again(cents: int) -> str:
        runs.append("again")
        return "charged again"

    charge_again.__name__ = charge_again.__qualname__ = "charge"
    counted = CountedRenewals(rstore)
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(guard.call("long-1", charge, 5)))
    worker.start()
    assert started.wait(10)
    seen: list[str] = []
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline and worker.is_alive():
        for tool in (charge, charge_again):
            try:
                guard.call("long-1", tool, 5)
            except EffectInProgress as refusal:
                seen.append(refusal.reason)
        record = rstore.get("long-1")
        if record is not None and record.status is Status.PENDING:
            assert record.liveness == "running", record
        time.sleep(0.4)
    worker.join(15)
    assert result == ["charged"] and runs == ["charge"]
    assert seen and set(seen) == {"effect_in_progress"}
    assert counted.renewals() >= 3  # lua/renew.lua ran on the server, every renew_every
    assert guard.call("long-1", charge, 5) == "charged" and runs == ["charge"]


class CountedRenewals:
    """How many renewals the server answered OK (the store's renew_leases, wrapped: commandstats
    count EVALSHA calls of every script together)."""

    def __init__(self, store: RedisEffectStore) -> None:
        self.answers: list[Any] = []
        original = store.renew_leases

        def counted(requests: Any) -> Any:
            results = original(requests)
            self.answers.extend(results)
            return results

        store.renew_leases = counted  # type: ignore[method-assign]

    def renewals(self) -> int:
        return sum(1 for answer in self.answers if answer is TransitionResult.OK)


WORKER = textwrap.dedent(
    """
    import sys, time
    from airlock_redis import EffectGuard, RedisEffectStore, reversibility
    url, namespace, tool_call_id, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    guard = EffectGuard(store=RedisEffectStore(url, namespace=namespace), lease=1.5, renew_every=0.5)

    @reversibility("reversible")
    def charge(cents):
        print("started", flush=True)
        time.sleep(seconds)
        return "first"

    try:
        print("result", guard.call(tool_call_id, charge, 5), flush=True)
    except Exception as exc:
        print("raised", type(exc).__name__, exc, flush=True)
    """
)


def start_worker(rstore: RedisEffectStore, tool_call_id: str, seconds: float) -> subprocess.Popen[str]:
    assert rstore.url is not None
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, rstore.url, rstore.namespace, tool_call_id, str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started", process.stderr.read() if process.stderr else ""
    return process


@pytest.mark.redis_server
def test_a_worker_killed_mid_tool_is_abandoned_within_its_lease(rstore: RedisEffectStore) -> None:
    tool_call_id = fresh_id("killed")
    worker = start_worker(rstore, tool_call_id, 60)
    guard = EffectGuard(store=rstore, lease=1.5, renew_every=0.5, wait_for_running=0)
    runs: list[str] = []

    def charge(cents: int) -> str:
        runs.append("irreversible")
        return "second"

    with pytest.raises(EffectInProgress):
        guard.call(tool_call_id, charge, 5)
    worker.kill()
    worker.wait(10)
    killed_at = time.monotonic()
    wait_until(
        "the record abandoned",
        lambda: rstore.get(tool_call_id).liveness == "abandoned" or None,  # type: ignore[union-attr]
        1.5 + 1.0,
    )
    assert time.monotonic() - killed_at <= 1.5 + 1.0
    with pytest.raises(EffectStatusUnknown, match=r"abandoned: its lease of 1\.5 s lapsed"):
        guard.call(tool_call_id, charge, 5)
    assert runs == []

    @reversibility("reversible")
    def charge_again(cents: int) -> str:
        runs.append("reversible")
        return "again"

    charge_again.__name__ = charge_again.__qualname__ = "charge"
    # the reversible retry runs again, as attempt 2
    assert guard.call(tool_call_id, charge_again, 5) == "again" and runs == ["reversible"]
    assert rstore.get(tool_call_id).attempt == 2  # type: ignore[union-attr]


@pytest.mark.redis_server
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs SIGSTOP")
def test_a_paused_owner_is_taken_over_then_fenced_off(rstore: RedisEffectStore) -> None:
    """A lapsed lease does not prove the worker is dead: a reversible retry runs again, and when the
    paused owner resumes, its commit is refused as superseded and it logs the lost lease."""
    import signal

    tool_call_id = fresh_id("paused")
    worker = start_worker(rstore, tool_call_id, 2.5)
    worker.send_signal(signal.SIGSTOP)
    try:
        wait_until(
            "the record abandoned",
            lambda: rstore.get(tool_call_id).liveness == "abandoned" or None,  # type: ignore[union-attr]
            10,
        )

        @reversibility("reversible")
        def charge(cents: int) -> str:
            return "second"

        guard = EffectGuard(store=rstore, lease=1.5, renew_every=0.5)
        assert guard.call(tool_call_id, charge, 5) == "second"
    finally:
        worker.send_signal(signal.SIGCONT)
    out, err = worker.communicate(timeout=30)
    assert "result first" in out, (out, err)  # the owner's tool finished; its value is its own
    assert "superseded" in err, err  # its commit was fenced off (and said so)
    assert guard.call(tool_call_id, charge, 5) == "second"  # the record holds the retry's value


@pytest.mark.redis_server
def test_a_child_forked_mid_call_renews_none_of_its_parents_leases(rstore: RedisEffectStore) -> None:
    import warnings

    guard = EffectGuard(store=rstore, lease=1.5, renew_every=0.5)
    started, release = threading.Barrier(4), threading.Event()

    def slow(cents: int) -> int:
        started.wait(10)
        release.wait(10)
        return cents

    threads = [threading.Thread(target=guard.call, args=(fresh_id("parent"), slow, i)) for i in range(3)]
    for thread in threads:
        thread.start()
    started.wait(10)
    assert KEEPER.held == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child runs no thread
        pid = os.fork()
    if pid == 0:  # the child: no tickets, no thread; its own call works and leaves none
        code = 1
        try:
            fresh = KEEPER.held == 0 and KEEPER.thread is None
            child_store = RedisEffectStore(rstore.url, namespace=rstore.namespace)
            child_guard = EffectGuard(store=child_store, lease=1.5)
            ok = child_guard.call("child-call", lambda cents: cents * 2, 21) == 42
            code = 0 if fresh and ok and KEEPER.held == 0 else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    release.set()
    for thread in threads:
        thread.join(10)
    assert os.waitstatus_to_exitcode(status) == 0
    assert KEEPER.held == 0 and rstore.get("child-call").status is Status.COMMITTED  # type: ignore[union-attr]


EXITING = textwrap.dedent(
    """
    import sys, threading, time
    from airlock_redis import EffectGuard, RedisEffectStore
    url, namespace = sys.argv[1], sys.argv[2]
    guard = EffectGuard(store=RedisEffectStore(url, namespace=namespace), lease=1.5, renew_every=0.3)
    started = threading.Event()

    def stuck(cents):
        started.set()
        time.sleep(3600)

    threading.Thread(target=guard.call, args=("stuck-at-exit", stuck, 1), daemon=True).start()
    started.wait(10)
    time.sleep(0.7)  # renewed at least once
    print("exiting", flush=True)
    """
)


@pytest.mark.redis_server
def test_exit_with_a_call_running_stops_renewing_and_lets_the_lease_lapse(rstore: RedisEffectStore) -> None:
    assert rstore.url is not None
    done = subprocess.run(
        [sys.executable, "-c", EXITING, rstore.url, rstore.namespace],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr
    record = rstore.get("stuck-at-exit")
    assert record is not None and record.status is Status.PENDING
    wait_until("the lease lapsed", lambda: _liveness(rstore, "stuck-at-exit") == "abandoned" or None, 10)


def _liveness(store: RedisEffectStore, tool_call_id: str) -> str | None:
    record = store.get(tool_call_id)
    return record.liveness if record is not None else None


# -- topologies ----------------------------------------------------------------------------------
def _lease_rows_on(rstore: RedisEffectStore) -> None:
    lapse = lapse_on(rstore)
    ids = [fresh_id(f"topo-{i}") for i in range(6)]  # spread over the cluster's slots
    for tool_call_id in ids:
        assert rstore.begin(request(tool_call_id, "a")).kind is BeginKind.STARTED
        assert rstore.begin(request(tool_call_id, "b")).kind is BeginKind.RUNNING
    assert rstore.renew_leases([request(i, "a") for i in ids]) == [TransitionResult.OK] * len(ids)
    lapse(ids[0], LEASE_MS + 500)
    assert rstore.begin(request(ids[0], "b")).kind is BeginKind.ABANDONED
    assert rstore.renew_leases([request(ids[0], "a")]) == [TransitionResult.OK]
    assert rstore.begin(request(ids[0], "b")).kind is BeginKind.RUNNING


@pytest.mark.redis_server
def test_leases_on_a_cluster(pytestconfig: pytest.Config) -> None:
    cluster: ClusterTopology = shared_cluster(pytestconfig)
    _lease_rows_on(RedisEffectStore(cluster.url, namespace=f"lease:{fresh_id()}"))


@pytest.mark.redis_server
def test_leases_through_sentinel(pytestconfig: pytest.Config) -> None:
    sentinel: SentinelTopology = shared_sentinel(pytestconfig)
    _lease_rows_on(RedisEffectStore(sentinel.url, namespace=f"lease:{fresh_id()}"))


# -- what operators see --------------------------------------------------------------------------
@pytest.mark.redis_server
def test_list_and_inspect_tell_running_from_abandoned(
    rstore: RedisEffectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from airlock_redis.cli import main

    target = ["--url", rstore.url or "", "--namespace", rstore.namespace]
    rstore.begin(request("live-1", "a"))
    rstore.begin(request("gone-1", "b"))
    lapse_on(rstore)("gone-1", LEASE_MS + 3_000)
    rstore.begin(request("plain-1", "c", lease_ms=None))
    capsys.readouterr()

    assert main(["inspect", "live-1", *target]) == 0
    assert "lease            running: renewed 0." in capsys.readouterr().out
    assert main(["inspect", "gone-1", *target]) == 0
    assert "lease            abandoned: not renewed for 5." in capsys.readouterr().out
    assert main(["inspect", "plain-1", *target]) == 0
    assert "lease " not in capsys.readouterr().out

    assert main(["list", *target]) == 0
    rows = {line.split()[-1].strip("'"): line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows == {"live-1": "running", "gone-1": "abandoned", "plain-1": "pending"}
    assert main(["list", "--abandoned", "--json", *target]) == 0
    listed = json.loads(capsys.readouterr().out)["records"]
    found = [(r["tool_call_id"], r["liveness"], r["lease_ms"]) for r in listed]
    assert found == [("gone-1", "abandoned", LEASE_MS)]
    assert main(["list", "--running", *target]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["running"]


@pytest.mark.redis_server
def test_doctor_counts_the_calls_in_doubt(rstore: RedisEffectStore) -> None:
    from airlock_redis.cli.doctor_cmd import diagnose

    def calls_check() -> Any:
        (check,) = [c for c in diagnose(rstore.url or "", namespace=rstore.namespace) if c.name == "calls"]
        return check

    rstore.begin(request("live-2", "a"))
    check = calls_check()
    assert check.status == "ok" and check.summary.startswith("1 running, 0 abandoned, 0 unknown"), check
    rstore.begin(request("gone-2", "b"))
    lapse_on(rstore)("gone-2", LEASE_MS + 1_000)
    rstore.begin(request("doubt-2", "c"))
    rstore.settle(request("doubt-2", "c"), 1, Settlement.UNKNOWN)
    check = calls_check()
    assert check.status == "warn" and check.summary.startswith("1 running, 1 abandoned, 1 unknown"), check
    assert "airlock-redis list --abandoned" in check.detail
