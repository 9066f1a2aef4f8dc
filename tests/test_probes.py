"""Reconciling with the backend (issue 25, part 3): a tool's probe is asked when its call is in doubt,
by the attempt itself right after an ambiguous error, and by a later call that finds the record
unknown or abandoned; TookEffect / NeverTookEffect / None each lead where they should, with the tool
run 0 / 1 / 0 more times. On the in-memory store and a real redis-server; then on a Cluster.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectInProgress,
    EffectStatusUnknown,
    InMemoryEffectStore,
    NeverTookEffect,
    ProbeCall,
    RedisEffectStore,
    Status,
    TookEffect,
    reconcile_with,
)
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import views_of

from .topo_helpers import fresh_id
from .topologies import shared_cluster, shared_sentinel, wait_until


class Bank:
    """A backend stub: each charge is counted; the probe answers as the test says, and counts its
    calls."""

    def __init__(self, answer: Any = None) -> None:
        self.charges: list[int] = []
        self.asked: list[ProbeCall] = []
        self.answer = answer
        self.lock = threading.Lock()

    def probe(self, call: ProbeCall) -> Any:
        with self.lock:
            self.asked.append(call)
        time.sleep(0.05)  # a backend lookup: concurrent finders arrive meanwhile
        return self.answer


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemoryEffectStore()
        return
    server: EmbeddedRedis = request.getfixturevalue("redis_server")
    rstore = RedisEffectStore(server.url, namespace=f"probe:{fresh_id()}")
    yield rstore
    rstore.close()


def _charge(guard: EffectGuard, bank: Bank, *, fail: BaseException | None = None) -> Any:
    def charge(account: str, cents: int) -> dict[str, Any]:
        bank.charges.append(cents)
        if fail is not None:
            raise fail
        return {"charged": cents}

    return guard.wrap(charge, reconcile=bank.probe)


def _in_doubt(store: Any, tool_call_id: str) -> None:
    """Leave ``tool_call_id`` unknown: a charge that timed out, run by a guard without a probe."""
    guard = EffectGuard(store=store)

    def charge(account: str, cents: int) -> dict[str, Any]:
        raise TimeoutError("the bank did not answer")

    with pytest.raises(TimeoutError):
        guard.call(tool_call_id, charge, "acct", 5)
    assert store.get(tool_call_id).status is Status.UNKNOWN


# -- the attempt itself: right after its ambiguous error ---------------------------------------------
@pytest.mark.parametrize(
    ("answer", "status", "outcome"),
    [
        (TookEffect({"charged": 5, "by": "probe"}), Status.COMMITTED, "value"),
        (NeverTookEffect(), None, "error"),
        (None, Status.UNKNOWN, "error"),
    ],
    ids=["took-effect", "never-took-effect", "cannot-tell"],
)
def test_the_attempt_asks_after_its_own_timeout(store: Any, answer: Any, status: Any, outcome: str) -> None:
    bank = Bank(answer)
    guard = EffectGuard(store=store)
    charge = _charge(guard, bank, fail=TimeoutError("the bank did not answer"))
    with guard_context("call-1"):
        if outcome == "value":
            assert charge("acct", 5) == {"charged": 5, "by": "probe"}
        else:
            with pytest.raises(TimeoutError):
                charge("acct", 5)
    assert [c.found for c in bank.asked] == ["error"] and bank.charges == [5]
    record = store.get("call-1")
    assert (record.status if record is not None else None) is status
    # what a retry gets: the probe's value replayed / a run (released) / in doubt (the probe again)
    retry_bank = Bank(None)
    retry = _charge(guard, retry_bank)
    with guard_context("call-1"):
        if outcome == "value":
            assert retry("acct", 5) == {"charged": 5, "by": "probe"} and retry_bank.asked == []
        elif status is None:
            assert retry("acct", 5) == {"charged": 5} and retry_bank.charges == [5]
        else:
            with pytest.raises(EffectStatusUnknown, match="could not tell"):
                retry("acct", 5)
            assert [c.found for c in retry_bank.asked] == ["unknown"] and retry_bank.charges == []


def guard_context(tool_call_id: str) -> Any:
    from airlock_redis import tool_call_context

    return tool_call_context(tool_call_id)


# -- a later call: finds the record in doubt -------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "runs", "expected"),
    [
        (TookEffect({"charged": 5}), 0, {"charged": 5}),
        (NeverTookEffect(), 1, {"charged": 5}),
        (None, 0, EffectStatusUnknown),
    ],
    ids=["took-effect", "never-took-effect", "cannot-tell"],
)
def test_twenty_finders_ask_the_probe_once(store: Any, answer: Any, runs: int, expected: Any) -> None:
    """20 concurrent retries of an unknown call: one takes the record to ask the probe, the others
    wait for it (its lease is live) and get the same outcome; the tool runs ``runs`` more times."""
    _in_doubt(store, "doubt-20")
    bank = Bank(answer)
    guard = EffectGuard(store=store, wait_for_running=10)
    charge = _charge(guard, bank)
    outcomes: list[Any] = []
    barrier = threading.Barrier(20)

    def finder() -> None:
        barrier.wait(10)
        try:
            outcomes.append(guard.call("doubt-20", charge, "acct", 5))
        except Exception as exc:
            outcomes.append(type(exc))

    threads = [threading.Thread(target=finder) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(bank.asked) == 1 and bank.asked[0].found == "unknown"
    assert bank.asked[0].arguments == {"account": "acct", "cents": 5}
    assert len(bank.charges) == runs
    assert outcomes == [expected] * 20


def test_a_probe_that_raises_or_hangs_counts_as_cannot_tell(store: Any) -> None:
    for tool_call_id, probe in (("raises", _raising), ("hangs", _hanging)):
        _in_doubt(store, tool_call_id)
        guard = EffectGuard(store=store, probe_timeout=0.3)

        def charge(account: str, cents: int) -> str:
            raise AssertionError("in doubt: never run")

        with pytest.raises(EffectStatusUnknown, match="could not tell"):
            guard.call(tool_call_id, reconcile_with(probe)(charge), "acct", 5)
        assert store.get(tool_call_id).status is Status.UNKNOWN
    # every verdict is in the audit trail, by the probe
    trail = wait_until("the audit entries", lambda: _probe_entries(store, 2), 5)
    assert {(e["tool_call_id"], e["verdict"], e["by"]) for e in trail} == {
        ("raises", "cannot_tell", "probe"),
        ("hangs", "cannot_tell", "probe"),
    }


def _raising(call: ProbeCall) -> Any:
    raise ConnectionError("the bank's lookup API is down")


def _hanging(call: ProbeCall) -> Any:
    time.sleep(30)


def _probe_entries(store: Any, count: int) -> list[dict[str, Any]] | None:
    entries = [e for e in views_of(store).read_audit(limit=50) if e.get("action") == "probe"]
    return entries if len(entries) >= count else None


def test_an_async_probe_of_an_async_tool(store: Any) -> None:
    _in_doubt(store, "async-1")
    asked: list[str] = []

    async def lookup(call: ProbeCall) -> Any:
        asked.append(call.found)
        await asyncio.sleep(0.01)
        return TookEffect({"charged": 5})

    async def charge(account: str, cents: int) -> dict[str, int]:
        raise AssertionError("in doubt: never run")

    guard = EffectGuard(store=store)
    tool = guard.wrap(charge, reconcile=lookup)
    charge.__name__ = "charge"
    result = asyncio.run(guard.acall("async-1", tool, "acct", 5))
    assert result == {"charged": 5} and asked == ["unknown"]
    assert store.get("async-1").status is Status.COMMITTED


def test_an_operators_verdict_during_the_probe_is_not_run_over(redis_server: EmbeddedRedis) -> None:
    """The operator resolves the record committed while the probe (which will say "never took
    effect") runs: the prober's begin-again finds the operator's verdict and replays it; the tool does
    not run."""
    store = RedisEffectStore(redis_server.url, namespace=f"probe:{fresh_id()}")
    _in_doubt(store, "fenced-1")
    guard = EffectGuard(store=store)
    ran: list[int] = []

    def probe(call: ProbeCall) -> Any:
        seen = store.get("fenced-1")
        guard.resolve("fenced-1", "committed", value={"charged": 5, "by": "operator"}, seen=seen)
        return NeverTookEffect()

    def charge(account: str, cents: int) -> dict[str, Any]:
        ran.append(cents)
        return {"charged": cents}

    assert guard.call("fenced-1", reconcile_with(probe)(charge), "acct", 5) == {
        "charged": 5,
        "by": "operator",
    }
    assert ran == []


PROBER = textwrap.dedent(
    """
    import sys, time
    from airlock_redis import EffectGuard, RedisEffectStore, reconcile_with
    url, namespace = sys.argv[1], sys.argv[2]
    guard = EffectGuard(store=RedisEffectStore(url, namespace=namespace), lease=1.5, renew_every=0.5)

    def probe(call):
        print("probing", flush=True)
        time.sleep(60)

    def charge(account, cents):
        raise AssertionError("never run")

    guard.call("killed-prober", reconcile_with(probe)(charge), "acct", 5)
    """
)


def test_a_prober_killed_mid_probe_is_abandoned_then_probed_again(redis_server: EmbeddedRedis) -> None:
    store = RedisEffectStore(redis_server.url, namespace=f"probe:{fresh_id()}")
    _in_doubt(store, "killed-prober")
    prober = subprocess.Popen(
        [sys.executable, "-c", PROBER, redis_server.url, store.namespace], stdout=subprocess.PIPE, text=True
    )
    try:
        assert prober.stdout is not None and prober.stdout.readline().strip() == "probing"
        assert store.get("killed-prober").liveness == "running"  # type: ignore[union-attr]
        prober.kill()
        prober.wait(10)
    finally:
        prober.kill()
    bank = Bank(TookEffect({"charged": 5}))
    guard = EffectGuard(store=store, lease=1.5, renew_every=0.5, wait_for_running=0)
    charge = _charge(guard, bank)
    with pytest.raises(EffectInProgress):  # the dead prober's lease still runs
        guard.call("killed-prober", charge, "acct", 5)
    wait_until(
        "the prober's record abandoned",
        lambda: store.get("killed-prober").liveness == "abandoned" or None,  # type: ignore[union-attr]
        10,
    )
    # the next finder probes again, and decides
    assert guard.call("killed-prober", charge, "acct", 5) == {"charged": 5}
    assert [c.found for c in bank.asked] == ["abandoned"] and bank.charges == []


@pytest.mark.redis_server
@pytest.mark.parametrize("topology", ["cluster", "sentinel"])
def test_probes_on_a_cluster_and_through_sentinel(pytestconfig: pytest.Config, topology: str) -> None:
    url = shared_cluster(pytestconfig).url if topology == "cluster" else shared_sentinel(pytestconfig).url
    store = RedisEffectStore(url, namespace=f"probe:{fresh_id()}")
    for i, answer in enumerate((TookEffect({"charged": 5}), NeverTookEffect())):
        tool_call_id = fresh_id(f"c{i}")
        _in_doubt(store, tool_call_id)
        bank = Bank(answer)
        guard = EffectGuard(store=store)
        assert guard.call(tool_call_id, _charge(guard, bank), "acct", 5) == {"charged": 5}
        assert len(bank.asked) == 1 and len(bank.charges) == (1 if isinstance(answer, NeverTookEffect) else 0)
        assert store.get(tool_call_id).status is Status.COMMITTED  # type: ignore[union-attr]
    entries = [e for e in views_of(store).read_audit(limit=20) if e.get("action") == "probe"]
    assert json.dumps(entries)  # the audit trail is readable
