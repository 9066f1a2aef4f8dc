"""Leases through a Sentinel failover (issue 25): a renewal lost in a failover, and when it matters.

A reversible tool runs under a short lease while the primary is SIGKILLed and the replica promoted.
The promoted replica holds the record as of the last renewal it received (the lease is the record's
own TTL), so whether a live call can be taken for abandoned depends on how long that copy went
without a renewal: longer than the lease, and it looks abandoned.

- **A failover shorter than ``lease - renew_every``**: renewals are lost while there is no primary
  (asserted: some fail), but the promoted copy is still within its lease. A duplicate is refused
  ``effect_in_progress`` or waits, a reversible retry never takes it over, the keeper renews on the
  new primary once the store's client follows it, and the call commits there: one run.
- **A replica that received no renewal for longer than ``lease``** (paused with SIGSTOP, its
  replication stream held up behind a large write, then the primary killed and the replica
  promoted): the promoted copy looks abandoned, and a reversible retry
  runs the call again while the first attempt is still inside its tool (two runs); the first
  attempt's lease is then lost and its commit fenced off. This is the case docs/in-doubt.md ("What a
  lease cannot tell") describes.

  The keeper picks a lapsed lease up again as soon as one of its renewals reaches the new primary
  (a renewal of a lapsed lease nobody took over succeeds), so the window is from the promotion to the
  owner's first renewal there. The test holds the owner's renewals back from the kill until its
  retry has run (the owner's client has not followed the new primary yet) so that the retry lands in
  that window on a busy machine too; ``test_without_holding_renewals_back_the_owner_picks_its_lease_up``
  shows the same failover without that hold.

Every wait is bounded (``wait_until``); no assertion is on a time measured by the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectInProgress,
    EffectStatusUnknown,
    RedisEffectStore,
    Status,
    reversibility,
)
from airlock_redis.core.errors import StoreError
from airlock_redis.core.records import BeginRequest, TransitionResult

from .topo_helpers import namespace
from .topologies import RedisProcess, SentinelTopology, private, redis_binary, wait_until

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

TIMEOUTS: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}


class Renewals:
    """The owner store's renewals as answered (the store's ``renew_leases``, wrapped), and a hold:
    while ``held`` is set, renewals are answered as failed round trips without being sent (the owner
    has not reached the new primary yet)."""

    def __init__(self, store: RedisEffectStore) -> None:
        self.answers: list[tuple[float, Any]] = []
        self.held = threading.Event()
        self._lock = threading.Lock()
        original = store.renew_leases

        def renew(requests: Sequence[BeginRequest]) -> Any:
            if self.held.is_set():
                results: list[Any] = [StoreError("held back by the test") for _ in requests]
            else:
                results = original(requests)
            with self._lock:
                self.answers.extend((time.monotonic(), result) for result in results)
            return results

        store.renew_leases = renew  # type: ignore[method-assign]

    def since(self, moment: float) -> list[Any]:
        with self._lock:
            return [result for at, result in self.answers if at >= moment]

    def ok_since(self, moment: float) -> int:
        return sum(1 for result in self.since(moment) if result is TransitionResult.OK)

    def failed_since(self, moment: float) -> int:
        return sum(1 for result in self.since(moment) if isinstance(result, StoreError))


class Owner:
    """A reversible ``charge`` running in a thread under the owner's guard until the test lets it go."""

    def __init__(self, guard: EffectGuard, tool_call_id: str) -> None:
        self.runs: list[str] = []
        self.started = threading.Event()
        self.go = threading.Event()
        self.result: list[Any] = []
        runs, started, go = self.runs, self.started, self.go

        @reversibility("reversible")
        def charge(cents: int) -> str:
            runs.append("first")
            started.set()
            if not go.wait(120):
                raise AssertionError("the test never let the first attempt end")
            return "first"

        def run() -> None:
            try:
                self.result.append(guard.call(tool_call_id, charge, 5))
            except Exception as exc:  # the test looks at what the caller got
                self.result.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(30), "the first attempt's tool never started"

    def finish(self) -> Any:
        self.go.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the first attempt did not end (bounded test)"
        return self.result[0]


def retry_tool(runs: list[str], *, reversible: bool) -> Any:
    """The same tool (name and arguments) as the owner's, as a retry under the same id runs it."""

    def charge(cents: int) -> str:
        runs.append("retry")
        return "retry"

    charge.__name__ = charge.__qualname__ = "charge"
    return reversibility("reversible")(charge) if reversible else charge


def read_on(node: RedisProcess, ns: str, tool_call_id: str) -> Any:
    """The record as ``node`` itself holds it (not through the sentinels)."""
    store = RedisEffectStore(f"redis://{node.address[0]}:{node.port}/0", namespace=ns, **TIMEOUTS)
    try:
        record = store.get(tool_call_id)
        assert record is not None, f"{tool_call_id!r} is not on {node.name}"
        return record
    finally:
        store.close()


def liveness_on(node: RedisProcess, ns: str, tool_call_id: str) -> tuple[str | None, int | None]:
    """The record's liveness and time since its last renewal (ms), read on ``node`` itself."""
    record = read_on(node, ns, tool_call_id)
    return record.liveness, record.since_renewal_ms


def wait_copied(replica: RedisProcess, key: bytes, topology: SentinelTopology) -> None:
    def copied() -> bool:
        with replica.client() as c:
            return c.get(key) is not None

    wait_until("the pending record on the replica", copied, 30, on_fail=topology.logs())


@contextmanager
def sentinel_with_owner(
    lease: float, renew_every: float
) -> Iterator[tuple[SentinelTopology, str, RedisEffectStore, Renewals, EffectGuard]]:
    redis_binary()
    with private(SentinelTopology()) as topology:
        ns = namespace()
        store = RedisEffectStore(topology.url, namespace=ns, **TIMEOUTS)
        renewals = Renewals(store)
        guard = EffectGuard(store=store, lease=lease, renew_every=renew_every, wait_for_running=0)
        try:
            yield topology, ns, store, renewals, guard
        finally:
            for opened in [store, *OPENED]:
                opened.close()
            OPENED.clear()


OPENED: list[RedisEffectStore] = []  # the retries' stores, closed when the test's topology stops


def fresh_guard(url: str, ns: str, lease: float, renew_every: float, wait: float) -> EffectGuard:
    """A retry in another process: a store of its own, through the sentinels."""
    store = RedisEffectStore(url, namespace=ns, **TIMEOUTS)
    OPENED.append(store)
    return EffectGuard(store=store, lease=lease, renew_every=renew_every, wait_for_running=wait)


# -- (a) a failover shorter than lease - renew_every: never taken over ---------------------------
def test_a_failover_shorter_than_the_lease_never_lets_a_live_call_run_again() -> None:
    """lease 10 s, renewed every 1 s: a failover of a few seconds (down-after 1 s plus the election)
    loses renewals but stays inside ``lease - renew_every`` (9 s)."""
    lease, every = 10.0, 1.0
    tool_call_id = "live-through-failover"
    with sentinel_with_owner(lease, every) as (topology, ns, store, renewals, guard):
        old = topology.current_primary()
        replica = topology.other(old)
        owner = Owner(guard, tool_call_id)
        wait_until("a renewal before the kill", lambda: renewals.ok_since(0.0) >= 1, 30)
        wait_copied(replica, store.key(tool_call_id), topology)

        killed_at = time.monotonic()
        old.kill()
        new = topology.wait_for_failover(old, timeout=60)
        promoted_at = time.monotonic()
        liveness, since = liveness_on(new, ns, tool_call_id)
        assert liveness == "running", (liveness, since)

        # duplicates through the sentinels, as another process would send them
        runs: list[str] = []
        refusals: list[str] = []
        for reversible in (True, False):
            retry = fresh_guard(topology.url, ns, lease, every, 0)
            with pytest.raises(EffectInProgress) as refused:
                retry.call(tool_call_id, retry_tool(runs, reversible=reversible), 5)
            refusals.append(refused.value.reason)
        # one that waits (woken by the commit on the new primary)
        waiter = fresh_guard(topology.url, ns, lease, every, 60)
        waited: list[Any] = []
        waiting = threading.Thread(
            target=lambda: waited.append(waiter.call(tool_call_id, retry_tool(runs, reversible=True), 5)),
            daemon=True,
        )
        waiting.start()

        # the keeper lost renewals while there was no primary, then renewed on the new one
        wait_until(
            "a renewal on the new primary",
            lambda: renewals.ok_since(promoted_at) >= 1,
            30,
            on_fail=topology.logs(),
        )
        lost = renewals.failed_since(killed_at)
        assert lost >= 1, renewals.since(killed_at)
        assert liveness_on(new, ns, tool_call_id)[0] == "running"
        time.sleep(0.5)  # the waiter registers its wait (it is woken by the commit either way)

        assert owner.finish() == "first"
        waiting.join(60)
        assert not waiting.is_alive()
        assert waited == ["first"], waited  # the waiting duplicate got the value, not a run
        assert refusals == ["effect_in_progress", "effect_in_progress"]
        assert owner.runs == ["first"] and runs == []  # the tool ran once
        committed = read_on(new, ns, tool_call_id)
        assert committed.status is Status.COMMITTED and committed.attempt == 1
        print(
            f"[lease-failover] failover {promoted_at - killed_at:.1f}s after the kill; the promoted copy "
            f"was renewed {since} ms before; {lost} renewals failed meanwhile (lease {lease}s, "
            f"renew_every {every}s)",
            flush=True,
        )


# -- (b) a replica that missed renewals for longer than the lease: the documented re-run -------
def _pause_replica_then_fail_over(
    topology: SentinelTopology, renewals: Renewals, lease: float, *, hold: bool
) -> tuple[RedisProcess, float]:
    """Pause the replica and hold its replication stream up behind a large write for ``lease`` plus a
    margin while the owner renews on the primary, then kill the primary, resume the replica, and wait
    until it is promoted. ``hold``: no renewal of the owner is sent from the kill on."""
    old = topology.current_primary()
    replica = topology.other(old)
    replica.pause()
    try:
        # a paused replica alone misses nothing: the renewals wait in the sockets' buffers and it
        # applies them when it resumes. Behind 32 MB of unrelated writes, they wait in the primary's
        # output buffer instead, and die with it (the replica lags, as a slow replica does)
        with old.client(socket_timeout=10) as c:
            c.set("ballast", b"\0" * (32 * 1024 * 1024))
        paused_at = time.monotonic()
        # renewals keep landing on the primary and never reach the replica
        wait_until(
            "the replica to miss renewals for longer than the lease",
            lambda: time.monotonic() - paused_at > lease + 1.0 and renewals.ok_since(paused_at) >= 2,
            lease + 30,
        )
        if hold:
            renewals.held.set()
        killed_at = time.monotonic()
        old.kill()
    finally:
        replica.resume()
    new = topology.wait_for_failover(old, timeout=60)
    assert new is replica
    return new, killed_at


def test_a_replica_that_missed_renewals_for_longer_than_the_lease_lets_a_reversible_retry_run_again() -> None:
    lease, every = 3.0, 1.0
    tool_call_id = "lapsed-on-the-replica"
    with sentinel_with_owner(lease, every) as (topology, ns, store, renewals, guard):
        owner = Owner(guard, tool_call_id)
        wait_copied(topology.other(topology.current_primary()), store.key(tool_call_id), topology)
        new, killed_at = _pause_replica_then_fail_over(topology, renewals, lease, hold=True)
        liveness, since = liveness_on(new, ns, tool_call_id)
        assert liveness == "abandoned", (liveness, since)

        runs: list[str] = []
        irreversible = fresh_guard(topology.url, ns, lease, every, 5)
        with pytest.raises(EffectStatusUnknown, match="abandoned"):
            irreversible.call(tool_call_id, retry_tool(runs, reversible=False), 5)
        reversible = fresh_guard(topology.url, ns, lease, every, 5)
        assert reversible.call(tool_call_id, retry_tool(runs, reversible=True), 5) == "retry"
        assert runs == ["retry"] and owner.runs == ["first"]  # two runs: the first is still inside its tool

        # the owner reaches the new primary: its lease is lost, its commit fenced off
        renewals.held.clear()
        wait_until(
            "the owner's renewal answered superseded",
            lambda: TransitionResult.SUPERSEDED in renewals.since(killed_at),
            30,
            on_fail=topology.logs(),
        )
        assert owner.finish() == "first"  # the caller of the first attempt gets its own value
        record = store.get(tool_call_id)
        assert record is not None and record.status is Status.COMMITTED and record.attempt == 2
        assert reversible.call(tool_call_id, retry_tool(runs, reversible=True), 5) == "retry"  # replayed
        assert runs == ["retry"]
        print(
            f"[lease-failover] promoted copy last renewed {since} ms before the promotion "
            f"(lease {lease}s): abandoned, and a reversible retry ran again",
            flush=True,
        )


def test_without_holding_renewals_back_the_owner_picks_its_lease_up() -> None:
    """The same failover, the owner's renewals not held back: what a retry finds depends on whether
    the owner's renewal reached the new primary first. Either way the call runs at most twice, and
    once the owner has renewed there a reversible retry finds it running."""
    lease, every = 3.0, 1.0
    tool_call_id = "picked-up-again"
    with sentinel_with_owner(lease, every) as (topology, ns, store, renewals, guard):
        owner = Owner(guard, tool_call_id)
        wait_copied(topology.other(topology.current_primary()), store.key(tool_call_id), topology)
        new, killed_at = _pause_replica_then_fail_over(topology, renewals, lease, hold=False)
        first_look = liveness_on(new, ns, tool_call_id)
        runs: list[str] = []
        retry = fresh_guard(topology.url, ns, lease, every, 0)
        try:
            got: Any = retry.call(tool_call_id, retry_tool(runs, reversible=True), 5)
        except EffectInProgress as refused:
            got = refused.reason
        renewed_first = got == "effect_in_progress"
        assert got in ("effect_in_progress", "retry"), got
        if renewed_first:
            assert renewals.ok_since(killed_at) >= 1  # the owner picked its lapsed lease up again
        retried_at = time.monotonic()
        wait_until("the owner's next renewal", lambda: renewals.since(retried_at), 30)
        assert owner.finish() == "first"
        assert len(owner.runs) + len(runs) == (1 if renewed_first else 2)
        answers = [
            (round(at - killed_at, 2), getattr(r, "value", type(r).__name__))
            for at, r in renewals.answers
            if at >= killed_at
        ]
        print(
            f"[lease-failover] not held back: the promoted copy first looked {first_look}; the retry got "
            f"{got!r} ({'the owner renewed first' if renewed_first else 'it ran again'}) "
            f"{retried_at - killed_at:.2f}s after the kill; owner's renewals since the kill: {answers}",
            flush=True,
        )
