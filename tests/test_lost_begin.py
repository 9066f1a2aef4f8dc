"""A begin whose reply is lost: the guard takes back what its attempt may hold, fenced by its token."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    EffectStore,
    GuardedCall,
    Reversibility,
    Settlement,
    StoreError,
    TransitionResult,
    tool_call_context,
)
from airlock_redis.stores import BeginOutcome, BeginRequest
from tests.tools import Counted, make_tool


class LosesBeginReply:
    """Delegates to a real store; ``begin`` is applied and then fails as if its reply were lost
    (``applied=True``), or fails before reaching the store (``applied=False``)."""

    def __init__(self, inner: EffectStore, *, applied: bool) -> None:
        self.inner = inner
        self.applied = applied
        self.settles: list[tuple[str, str, Settlement]] = []

    def _fail(self, request: BeginRequest) -> StoreError:
        return StoreError("Timeout reading from socket", maybe_applied=self.applied)

    def begin(self, request: BeginRequest) -> BeginOutcome:
        if self.applied:
            self.inner.begin(request)
        raise self._fail(request)

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        if self.applied:
            await self.inner.abegin(request)
        raise self._fail(request)

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        self.settles.append((request.tool_call_id, request.token, settlement))
        return self.inner.settle(request, attempt, settlement)

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        self.settles.append((request.tool_call_id, request.token, settlement))
        return await self.inner.asettle(request, attempt, settlement)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_applied_begin_whose_reply_is_lost_is_released_so_the_retry_runs(
    store: EffectStore, kind: str
) -> None:
    lossy = LosesBeginReply(store, applied=True)
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=lossy), counted, kind)
    with tool_call_context("lost-1"), pytest.raises(EffectRefused) as refused:
        charge("acct", 5)
    assert refused.value.reason == "store_unavailable"
    assert counted.runs == []
    assert [s[2] for s in lossy.settles] == [Settlement.RELEASE]
    assert store.get("lost-1") is None  # the attempt's record was taken back
    retry = make_tool(EffectGuard(store=store), counted, kind)
    with tool_call_context("lost-1"):
        retry("acct", 5)
        retry("acct", 5)
    assert len(counted.runs) == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_begin_that_never_reached_the_store_is_not_followed_by_a_release(
    store: EffectStore, kind: str
) -> None:
    lossy = LosesBeginReply(store, applied=False)
    charge = make_tool(EffectGuard(store=lossy), Counted("charge"), kind)
    with tool_call_context("lost-2"), pytest.raises(EffectRefused):
        charge("acct", 5)
    assert lossy.settles == []


def test_the_release_is_fenced_and_never_touches_another_attempts_record(store: EffectStore) -> None:
    """The lost begin found another attempt's pending record (not reversible): its release is a no-op."""
    holder = BeginRequest("lost-3", "k", "charge", "holder-token", False)
    assert store.begin(holder).kind.value == "started"
    lossy = LosesBeginReply(store, applied=True)
    guard = EffectGuard(store=lossy)
    call = GuardedCall("charge", "lost-3", {}, Reversibility.IRREVERSIBLE)
    with pytest.raises(EffectRefused):
        guard.execute(call, lambda: "ran")
    record = store.get("lost-3")
    assert record is not None and record.owner == "holder-token"


def test_an_async_tool_takes_its_lost_begin_back_too(store: EffectStore) -> None:
    lossy = LosesBeginReply(store, applied=True)
    guard = EffectGuard(store=lossy)

    @guard.wrap
    async def charge(account: str) -> str:
        return "ran"

    async def main() -> None:
        with tool_call_context("lost-4"), pytest.raises(EffectRefused):
            await charge("acct")

    asyncio.run(main())
    assert store.get("lost-4") is None
