"""InMemoryEffectStore: each status gets its own TTL, and an expired record lets the call run again.

The store's clock is injected (``clock=``) and advanced by hand, so the expected TTLs are exact and
nothing here waits. Before each transition the clock moves on, so a TTL equal to the new status's
full TTL afterwards shows that the transition itself set it (a left-over TTL would be shorter).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectStatusUnknown,
    InMemoryEffectStore,
    Settlement,
    Status,
    TransitionResult,
    idempotency_key,
    tool_call_context,
)
from airlock_redis.stores import BeginKind, BeginRequest

# Far apart, so a TTL tells which status set it.
COMMITTED_S, PENDING_S, UNKNOWN_S = 100.0, 250.0, 400.0
STEP_S = 30.0  # how far the clock moves before a transition
KEY = idempotency_key("book", {"seat": "12A"})


class FakeClock:
    """A monotonic clock in seconds that only moves when told to."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mem(clock: FakeClock) -> InMemoryEffectStore:
    return InMemoryEffectStore(
        committed_ttl=COMMITTED_S, pending_ttl=PENDING_S, unknown_ttl=UNKNOWN_S, clock=clock
    )


def request(tool_call_id: str, token: str, *, reversible: bool = False) -> BeginRequest:
    return BeginRequest(tool_call_id, KEY, "book", token, reversible)


def ttl_ms(mem: InMemoryEffectStore, tool_call_id: str, status: Status) -> int:
    record = mem.get(tool_call_id)
    assert record is not None, f"{tool_call_id} is gone"
    assert record.status is status
    assert record.ttl_ms is not None
    return record.ttl_ms


def full(seconds: float) -> int:
    return round(seconds * 1000)


# -- each transition sets its status's TTL --------------------------------------------------------
def test_each_transition_sets_the_ttl_of_its_status(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    assert mem.begin(request("call-1", "a")).kind is BeginKind.STARTED
    assert ttl_ms(mem, "call-1", Status.PENDING) == full(PENDING_S)
    clock.advance(STEP_S)
    assert ttl_ms(mem, "call-1", Status.PENDING) == full(PENDING_S - STEP_S)  # get() counts down
    assert mem.commit(request("call-1", "a"), 1, b"booked", None) is TransitionResult.OK
    assert ttl_ms(mem, "call-1", Status.COMMITTED) == full(COMMITTED_S)

    mem.begin(request("call-2", "a"))
    clock.advance(STEP_S)
    assert mem.settle(request("call-2", "a"), 1, Settlement.UNKNOWN) is TransitionResult.OK
    assert ttl_ms(mem, "call-2", Status.UNKNOWN) == full(UNKNOWN_S)
    clock.advance(STEP_S)
    assert ttl_ms(mem, "call-2", Status.UNKNOWN) == full(UNKNOWN_S - STEP_S)


def test_reversible_take_over_resets_the_pending_ttl(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    mem.begin(request("call-3", "a", reversible=True))
    clock.advance(STEP_S)
    taken = mem.begin(request("call-3", "b", reversible=True))  # take-over of pending
    assert taken.kind is BeginKind.STARTED and taken.attempt == 2
    assert ttl_ms(mem, "call-3", Status.PENDING) == full(PENDING_S)

    mem.settle(request("call-3", "b"), 1, Settlement.UNKNOWN)
    assert ttl_ms(mem, "call-3", Status.UNKNOWN) == full(UNKNOWN_S)
    clock.advance(STEP_S)
    taken = mem.begin(request("call-3", "c", reversible=True))  # take-over of unknown
    assert taken.kind is BeginKind.STARTED and taken.attempt == 3
    assert ttl_ms(mem, "call-3", Status.PENDING) == full(PENDING_S)


@pytest.mark.parametrize("start", [Status.PENDING, Status.UNKNOWN, Status.COMMITTED])
@pytest.mark.parametrize("verdict", [Status.COMMITTED, Status.UNKNOWN])
def test_resolve_sets_the_ttl_of_the_verdict(
    mem: InMemoryEffectStore, clock: FakeClock, start: Status, verdict: Status
) -> None:
    mem.begin(request("call-r", "a"))
    if start is Status.UNKNOWN:
        mem.settle(request("call-r", "a"), 1, Settlement.UNKNOWN)
    elif start is Status.COMMITTED:
        mem.commit(request("call-r", "a"), 1, b"v", None)
    clock.advance(STEP_S)
    assert mem.resolve("call-r", verdict, expect_key=KEY, value=b"w") is TransitionResult.OK
    expected = COMMITTED_S if verdict is Status.COMMITTED else UNKNOWN_S
    assert ttl_ms(mem, "call-r", verdict) == full(expected)


def test_refusals_replays_and_resends_leave_the_ttl_alone(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    """Only transitions reset a TTL: reading or refusing a record must not keep it alive. A re-sent
    begin is the one exception: it writes again (the write a WAIT after it covers), restarting the
    pending TTL, as the Lua script does."""
    mem.begin(request("call-4", "a"))
    clock.advance(STEP_S)
    assert mem.begin(request("call-4", "b")).kind is BeginKind.PENDING  # refused retry
    assert ttl_ms(mem, "call-4", Status.PENDING) == full(PENDING_S - STEP_S)
    assert mem.begin(request("call-4", "a")).kind is BeginKind.STARTED  # re-send
    assert ttl_ms(mem, "call-4", Status.PENDING) == full(PENDING_S)
    mem.commit(request("call-4", "a"), 1, b"v", None)
    clock.advance(STEP_S)
    assert mem.begin(request("call-4", "c")).kind is BeginKind.COMMITTED  # replay
    assert mem.commit(request("call-4", "a"), 1, b"v", None) is TransitionResult.OK  # re-sent commit
    assert ttl_ms(mem, "call-4", Status.COMMITTED) == full(COMMITTED_S - STEP_S)

    mem.begin(request("call-5", "a"))
    mem.settle(request("call-5", "a"), 1, Settlement.UNKNOWN)
    clock.advance(STEP_S)
    assert mem.begin(request("call-5", "b")).kind is BeginKind.UNKNOWN  # refused retry
    assert mem.settle(request("call-5", "a"), 1, Settlement.UNKNOWN) is TransitionResult.OK  # re-sent settle
    assert ttl_ms(mem, "call-5", Status.UNKNOWN) == full(UNKNOWN_S - STEP_S)


def test_async_transitions_set_the_same_ttls(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    async def main() -> None:
        await mem.abegin(request("call-6", "a"))
        clock.advance(STEP_S)
        await mem.acommit(request("call-6", "a"), 1, b"v", None)
        committed = await mem.aget("call-6")
        assert committed is not None and committed.ttl_ms == full(COMMITTED_S)
        await mem.abegin(request("call-7", "a"))
        clock.advance(STEP_S)
        await mem.asettle(request("call-7", "a"), 1, Settlement.UNKNOWN)
        unknown = await mem.aget("call-7")
        assert unknown is not None and unknown.ttl_ms == full(UNKNOWN_S)

    asyncio.run(main())
    assert ttl_ms(mem, "call-6", Status.COMMITTED) == full(COMMITTED_S - STEP_S)


# -- expiry ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "seconds"),
    [(Status.PENDING, PENDING_S), (Status.COMMITTED, COMMITTED_S), (Status.UNKNOWN, UNKNOWN_S)],
)
def test_a_record_lives_exactly_its_ttl(
    mem: InMemoryEffectStore, clock: FakeClock, status: Status, seconds: float
) -> None:
    mem.begin(request("call-8", "a"))
    if status is Status.COMMITTED:
        mem.commit(request("call-8", "a"), 1, b"v", None)
    elif status is Status.UNKNOWN:
        mem.settle(request("call-8", "a"), 1, Settlement.UNKNOWN)
    clock.advance(seconds - 0.001)
    assert ttl_ms(mem, "call-8", status) == 1
    clock.advance(0.001)
    assert mem.get("call-8") is None
    # Gone for every transition too, not only for get().
    assert mem.resolve("call-8", Status.COMMITTED, expect_key=KEY) is TransitionResult.MISSING
    assert mem.begin(request("call-8", "b")).kind is BeginKind.STARTED
    assert ttl_ms(mem, "call-8", Status.PENDING) == full(PENDING_S)


def test_a_commit_after_the_pending_ttl_writes_the_record_again(
    mem: InMemoryEffectStore, clock: FakeClock
) -> None:
    """The tool outlived its pending TTL: the commit finds nothing and writes the truth, committed."""
    mem.begin(request("call-9", "a"))
    clock.advance(PENDING_S)
    assert mem.get("call-9") is None
    assert mem.commit(request("call-9", "a"), 1, b"v", None) is TransitionResult.RECREATED
    assert ttl_ms(mem, "call-9", Status.COMMITTED) == full(COMMITTED_S)
    assert mem.begin(request("call-9", "b")).kind is BeginKind.COMMITTED


def make_book(mem: InMemoryEffectStore, runs: list[str], *, fail: bool = False) -> Any:
    guard = EffectGuard(store=mem)

    @guard.wrap
    def book(seat: str) -> str:
        runs.append(seat)
        if fail:
            raise TimeoutError("the airline did not answer")
        return f"ticket-{len(runs)}"

    return book


def test_after_the_committed_ttl_the_call_runs_again(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    runs: list[str] = []
    book = make_book(mem, runs)
    with tool_call_context("call-exp-c"):
        assert book("12A") == "ticket-1"
        clock.advance(COMMITTED_S - 1)
        assert book("12A") == "ticket-1"  # replayed while the record lives
        assert runs == ["12A"]
        clock.advance(1)
        assert book("12A") == "ticket-2"
    assert runs == ["12A", "12A"]


def test_after_the_unknown_ttl_the_call_runs_again(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    runs: list[str] = []
    clock.advance(STEP_S)
    with tool_call_context("call-exp-u"), pytest.raises(TimeoutError):
        make_book(mem, runs, fail=True)("12A")
    book = make_book(mem, runs)
    # Still refused after the pending TTL would have run out: unknown keeps its own, longer TTL.
    clock.advance(PENDING_S)
    with tool_call_context("call-exp-u"), pytest.raises(EffectStatusUnknown):
        book("12A")
    clock.advance(UNKNOWN_S - PENDING_S)
    with tool_call_context("call-exp-u"):
        assert book("12A") == "ticket-2"
    assert runs == ["12A", "12A"]


def test_after_the_pending_ttl_the_call_runs_again(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    mem.begin(request("call-exp-p", "dead-worker"))  # an attempt that died mid-call
    runs: list[str] = []
    book = make_book(mem, runs)
    clock.advance(PENDING_S - 1)
    with tool_call_context("call-exp-p"), pytest.raises(EffectStatusUnknown):
        book("12A")
    clock.advance(1)
    with tool_call_context("call-exp-p"):
        assert book("12A") == "ticket-1"
    assert runs == ["12A"]


def test_after_the_ttl_an_async_call_runs_again(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    runs: list[str] = []
    guard = EffectGuard(store=mem)

    @guard.wrap
    async def book(seat: str) -> str:
        await asyncio.sleep(0)
        runs.append(seat)
        return f"ticket-{len(runs)}"

    async def main() -> list[str]:
        with tool_call_context("call-exp-a"):
            first = await book("12A")
            again = await book("12A")
            clock.advance(COMMITTED_S)
            return [first, again, await book("12A")]

    assert asyncio.run(main()) == ["ticket-1", "ticket-1", "ticket-2"]
    assert runs == ["12A", "12A"]


@pytest.mark.parametrize("name", ["committed_ttl", "pending_ttl", "unknown_ttl"])
@pytest.mark.parametrize("bad", [0, -1.0, True])
def test_a_ttl_must_be_a_positive_number(name: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=name):
        InMemoryEffectStore(**{name: bad})


# -- rows nobody reads again ---------------------------------------------------------------------


def _calls(mem: InMemoryEffectStore, prefix: str, n: int, *, commit: bool = True) -> list[str]:
    """``n`` calls on new ids, each begun (and committed); their ids."""
    ids = [f"{prefix}-{i}" for i in range(n)]
    for tool_call_id in ids:
        req = request(tool_call_id, "t-" + tool_call_id)
        assert mem.begin(req).kind is BeginKind.STARTED
        if commit:
            assert mem.commit(req, 1, b"v", None) is TransitionResult.OK
    return ids


def test_expired_rows_nobody_asks_for_again_are_removed(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    """A process that makes calls on new ids for good must not keep every row it ever wrote: each new
    row moves a sweep along, and an expired row is gone within as many new rows as there are rows."""
    from airlock_redis.stores.memory import _SWEEP_BATCH

    old = _calls(mem, "old", 500) + _calls(mem, "old-pending", 100, commit=False)
    assert len(mem._rows) == 600  # the store's own table, read directly: nothing public counts rows
    clock.advance(max(COMMITTED_S, PENDING_S) + 1)
    new = _calls(mem, "new", 600 + 4 * _SWEEP_BATCH)
    assert not any(tool_call_id in mem._rows for tool_call_id in old)
    assert len(mem._rows) == len(new)


def test_a_sweep_never_removes_a_live_row(mem: InMemoryEffectStore, clock: FakeClock) -> None:
    """Rows within their TTL survive many sweeps: committed ones replay, pending ones still refuse."""
    committed = _calls(mem, "kept", 100)
    pending = _calls(mem, "kept-pending", 100, commit=False)
    for round_ in range(5):
        clock.advance(min(COMMITTED_S, PENDING_S) / 10)
        _calls(mem, f"churn-{round_}", 1000)
    for tool_call_id in committed:
        outcome = mem.begin(request(tool_call_id, "another-token"))
        assert (outcome.kind, outcome.value) == (BeginKind.COMMITTED, b"v")
    for tool_call_id in pending:
        assert mem.begin(request(tool_call_id, "another-token")).kind is BeginKind.PENDING
