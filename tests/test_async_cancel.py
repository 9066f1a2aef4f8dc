"""Cancellation of an async tool: task.cancel(), asyncio.timeout and asyncio.wait_for record the call
unknown (never released) and then propagate; the store write after it survives further cancels; a
cancel that lands while ``begin`` is in flight hands the record back (the tool never ran)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from airlock_redis import (
    EffectGuard,
    EffectStatusUnknown,
    EffectStore,
    RedisEffectStore,
    Settlement,
    Status,
    TransitionResult,
    tool_call_context,
)
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import BeginOutcome, BeginRequest

T = TypeVar("T")

# Bounds on waits, so a broken feature fails the test instead of hanging it. Generous: every step
# here normally takes milliseconds; these are not timing assertions.
STEP_LIMIT = 30.0
RUN_LIMIT = 4 * STEP_LIMIT


async def within(step: Awaitable[T], what: str) -> T:
    """Await ``step`` (a coroutine, an event's wait() or a task) for at most STEP_LIMIT seconds.

    Its own outcome (value, exception or cancellation) is passed on unchanged; only a step that
    does not finish fails the test. The step is not cancelled by the bound's own timeout path
    (unlike asyncio.wait_for), so a task that swallows cancellation cannot hang the bound.
    """
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=STEP_LIMIT)
    if not done:
        task.cancel()
        pytest.fail(f"{what} did not finish within {STEP_LIMIT:.0f}s", pytrace=False)
    return task.result()


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run(main()) in a daemon thread, failing if it has not ended within RUN_LIMIT seconds
    (a task that ignores cancellation would otherwise hang asyncio.run's shutdown forever)."""
    outcome: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(asyncio.run(main()))
        except BaseException as exc:  # re-raised in the test's thread below
            errors.append(exc)

    thread = threading.Thread(target=target, name="async-cancel-test", daemon=True)
    thread.start()
    thread.join(RUN_LIMIT)
    if thread.is_alive():
        pytest.fail(f"the event loop did not finish within {RUN_LIMIT:.0f}s", pytrace=False)
    if errors:
        raise errors[0]
    return outcome[0]


class Hanging:
    """An async tool that starts its effect and then waits until it is cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.runs = 0
        self.cancelled = 0

    async def __call__(self, account: str) -> str:
        self.runs += 1
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "never"


def guarded(store: EffectStore, body: Callable[[str], Awaitable[str]]) -> Callable[[str], Awaitable[str]]:
    async def charge(account: str) -> str:
        return await body(account)

    return EffectGuard(store).wrap(charge)


async def call(tool: Callable[[str], Awaitable[str]], tool_call_id: str, account: str = "acct_1") -> str:
    with tool_call_context(tool_call_id):
        return await tool(account)


def status_of(store: EffectStore, tool_call_id: str) -> Status | None:
    record = store.get(tool_call_id)
    return None if record is None else record.status


def test_task_cancel_records_unknown_and_propagates(store: EffectStore) -> None:
    async def main() -> None:
        hanging = Hanging()
        tool = guarded(store, hanging)
        task = asyncio.create_task(call(tool, "cx-1"))
        await within(hanging.started.wait(), "the tool starting")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(task, "the cancelled call")
        assert task.cancelled() and hanging.cancelled == 1
        record = await store.aget("cx-1")
        assert record is not None and record.status is Status.UNKNOWN
        with pytest.raises(EffectStatusUnknown):
            await within(call(tool, "cx-1"), "the retry")
        assert hanging.runs == 1

    run(main)
    assert status_of(store, "cx-1") is Status.UNKNOWN


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is new in 3.11")
def test_asyncio_timeout_records_unknown_and_raises_timeout(store: EffectStore) -> None:
    async def main() -> None:
        hanging = Hanging()
        tool = guarded(store, hanging)
        scopes: list[asyncio.Timeout] = []

        async def supervised() -> str:
            async with asyncio.timeout(None) as scope:
                scopes.append(scope)
                return await call(tool, "cx-timeout")

        task = asyncio.create_task(supervised())
        await within(hanging.started.wait(), "the tool starting")
        scopes[0].reschedule(asyncio.get_running_loop().time())  # expire now that the tool runs
        with pytest.raises(TimeoutError):
            await within(task, "the cancelled call")
        assert scopes[0].expired() and hanging.cancelled == 1

    run(main)
    assert status_of(store, "cx-timeout") is Status.UNKNOWN


def test_asyncio_wait_for_records_unknown_and_raises_timeout(store: EffectStore) -> None:
    async def main() -> None:
        # The timeout may (on a very slow machine) fire while begin is still in flight; then the
        # tool never ran and the record must be gone. Try fresh ids until one fires mid-tool.
        for attempt in range(20):
            hanging = Hanging()
            tool = guarded(store, hanging)
            tool_call_id = f"cx-wait-{attempt}"
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(call(tool, tool_call_id), timeout=0.2)
            record = await store.aget(tool_call_id)
            if hanging.runs:
                assert hanging.cancelled == 1
                assert record is not None and record.status is Status.UNKNOWN
                with pytest.raises(EffectStatusUnknown):
                    await within(call(tool, tool_call_id), "the retry")
                assert hanging.runs == 1
                return
            assert record is None
        pytest.fail("the tool never started within 20 attempts")

    run(main)


# -- gates inside the store, to cancel at chosen points --------------------------------------------------
class GatedStore(RedisEffectStore):
    """A real Redis store that can hold a step (after begin, before commit or settle) until released."""

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(url, namespace=namespace)
        self.entered: dict[str, asyncio.Event] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.finished: list[str] = []
        self.all_done = asyncio.Event()

    def arm(self, step: str) -> None:
        self.entered[step] = asyncio.Event()
        self.gates[step] = asyncio.Event()

    async def _hold(self, step: str) -> None:
        if step in self.gates:
            self.entered[step].set()
            await self.gates[step].wait()

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        outcome = await super().abegin(request)
        await self._hold("begin")
        self.finished.append(f"begin:{outcome.kind.value}")
        return outcome

    async def acommit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        await self._hold("commit")
        result = await super().acommit(request, attempt, value, mac)
        self.finished.append(f"commit:{result.value}")
        self.all_done.set()
        return result

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        await self._hold("settle")
        result = await super().asettle(request, attempt, settlement)
        self.finished.append(f"settle:{settlement.value}:{result.value}")
        self.all_done.set()
        return result


async def spin(times: int = 20) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


@pytest.mark.redis_server
@pytest.mark.parametrize("extra_cancels", [1, 3])
def test_cancels_during_the_settle_still_leave_the_record_unknown(
    redis_server: EmbeddedRedis, namespace: str, extra_cancels: int
) -> None:
    async def main() -> GatedStore:
        store = GatedStore(redis_server.url, namespace)
        store.arm("settle")
        hanging = Hanging()
        tool = guarded(store, hanging)
        task = asyncio.create_task(call(tool, "cx-settle"))
        await within(hanging.started.wait(), "the tool starting")
        task.cancel()
        await within(store.entered["settle"].wait(), "the settle being reached")
        for _ in range(extra_cancels):  # cancel again while the settle is held
            task.cancel()
            await spin()
        if extra_cancels == 1:
            assert not task.done()  # the driver waits for its shielded settle
        store.gates["settle"].set()
        with pytest.raises(asyncio.CancelledError):
            await within(task, "the cancelled call")
        await within(store.all_done.wait(), "the final store write")
        assert (await store.aget("cx-settle")) is not None
        return store

    store = run(main)
    assert store.finished == ["begin:started", "settle:unknown:ok"]
    assert status_of(store, "cx-settle") is Status.UNKNOWN


@pytest.mark.redis_server
def test_cancel_during_the_commit_still_commits(redis_server: EmbeddedRedis, namespace: str) -> None:
    runs: list[str] = []

    async def quick(account: str) -> str:
        runs.append(account)
        return f"paid {account}"

    async def main() -> GatedStore:
        store = GatedStore(redis_server.url, namespace)
        store.arm("commit")
        tool = guarded(store, quick)
        task = asyncio.create_task(call(tool, "cx-commit"))
        await within(store.entered["commit"].wait(), "the commit being reached")
        task.cancel()
        await spin()
        assert not task.done()
        store.gates["commit"].set()
        with pytest.raises(asyncio.CancelledError):
            await within(task, "the cancelled call")
        # the effect happened and was recorded: a retry replays it without running
        assert await within(call(tool, "cx-commit"), "the retry") == "paid acct_1"
        return store

    store = run(main)
    assert runs == ["acct_1"]
    assert store.finished[:2] == ["begin:started", "commit:ok"]
    assert status_of(store, "cx-commit") is Status.COMMITTED


@pytest.mark.redis_server
@pytest.mark.parametrize("extra_cancels", [0, 2])
def test_cancel_while_begin_is_in_flight_releases_the_record(
    redis_server: EmbeddedRedis, namespace: str, extra_cancels: int
) -> None:
    runs: list[str] = []

    async def quick(account: str) -> str:
        runs.append(account)
        return "ok"

    async def main() -> GatedStore:
        store = GatedStore(redis_server.url, namespace)
        store.arm("begin")
        tool = guarded(store, quick)
        task = asyncio.create_task(call(tool, "cx-begin"))
        await within(store.entered["begin"].wait(), "the begin being reached")
        # begin has run in Redis: the record is this attempt's and pending
        pending = await store.aget("cx-begin")
        assert pending is not None and pending.status is Status.PENDING
        task.cancel()
        for _ in range(extra_cancels):
            await spin()
            task.cancel()
        await spin()
        store.gates["begin"].set()
        with pytest.raises(asyncio.CancelledError):
            await within(task, "the cancelled call")
        await within(store.all_done.wait(), "the final store write")
        assert runs == []
        assert (await store.aget("cx-begin")) is None  # handed back: the tool never ran
        del store.gates["begin"]
        assert await within(call(tool, "cx-begin"), "the retry") == "ok"  # so the retry runs it
        return store

    store = run(main)
    assert runs == ["acct_1"]
    # the cancelled begin never finished in Python (it was interrupted while held); its attempt gave
    # the record back, then the retry began and committed
    assert store.finished == ["settle:release:ok", "begin:started", "commit:ok"]
    assert status_of(store, "cx-begin") is Status.COMMITTED


def test_a_cancelled_tool_is_not_released_even_when_cancellation_is_listed_as_not_ambiguous(
    store: EffectStore,
) -> None:
    """ambiguous_errors only widens what counts as in doubt: cancellation is always unknown."""

    async def main() -> None:
        hanging = Hanging()

        async def charge(account: str) -> str:
            return await hanging(account)

        tool = EffectGuard(store, ambiguous_errors=()).wrap(charge)
        task = asyncio.create_task(call(tool, "cx-narrow"))
        await within(hanging.started.wait(), "the tool starting")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(task, "the cancelled call")

    run(main)
    assert status_of(store, "cx-narrow") is Status.UNKNOWN
