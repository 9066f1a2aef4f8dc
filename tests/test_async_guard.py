"""Async tools as first-class citizens: the wrapper, one store for both kinds, deferred results,
approvers, and no blocking Redis I/O on the event loop (all against a real redis-server)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, cast

import pytest
import redis
import redis.connection
from redis.commands.core import Script

from airlock_redis import (
    ApprovalDenied,
    ApprovalRequest,
    EffectGuard,
    EffectStatusUnknown,
    RedisEffectStore,
    Status,
    reversibility,
    tool_call_context,
)
from airlock_redis.embedded import EmbeddedRedis

HANG_LIMIT = 120.0  # seconds: a bound so a broken feature fails instead of hanging (not a timing assert)

pytestmark = pytest.mark.redis_server


@pytest.fixture
def rstore(redis_server: EmbeddedRedis, namespace: str) -> RedisEffectStore:
    return RedisEffectStore(redis_server.url, namespace=namespace)


def run_with_id(tool_call_id: str, make: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        with tool_call_context(tool_call_id):
            return await make()

    return asyncio.run(main())


# -- the wrapper -------------------------------------------------------------------------------------
def test_wrap_of_an_async_def_is_a_coroutine_function_with_the_tools_metadata(
    rstore: RedisEffectStore,
) -> None:
    guard = EffectGuard(rstore)

    async def send_email(to: str, body: str = "") -> str:
        """Send one email."""
        return f"sent to {to}"

    wrapped = guard.wrap(send_email)
    assert inspect.iscoroutinefunction(wrapped)
    assert wrapped.__name__ == "send_email"
    assert wrapped.__qualname__ == send_email.__qualname__
    assert wrapped.__doc__ == "Send one email."
    assert wrapped.__module__ == __name__
    assert wrapped.__wrapped__ is send_email  # type: ignore[attr-defined]
    assert inspect.signature(wrapped) == inspect.signature(send_email)
    assert run_with_id("w-1", lambda: wrapped("a@example.org")) == "sent to a@example.org"
    record = rstore.get("w-1")
    assert record is not None and record.status is Status.COMMITTED and record.tool == "send_email"


def test_wrap_of_a_sync_def_stays_a_plain_function(rstore: RedisEffectStore) -> None:
    def add(a: int, b: int) -> int:
        return a + b

    wrapped = EffectGuard(rstore).wrap(add)
    assert not inspect.iscoroutinefunction(wrapped)
    with tool_call_context("w-sync"):
        assert wrapped(1, 2) == 3


def test_a_partial_of_an_async_def_and_an_async_callable_object_are_async_tools(
    rstore: RedisEffectStore,
) -> None:
    runs: list[str] = []

    async def transfer(source: str, target: str, cents: int) -> int:
        runs.append("transfer")
        await asyncio.sleep(0)
        return cents

    class Refund:
        __name__ = "refund"

        async def __call__(self, order: str) -> str:
            runs.append("refund")
            await asyncio.sleep(0)
            return f"refunded {order}"

    guard = EffectGuard(rstore)
    partial_tool = guard.wrap(functools.partial(transfer, "acct_a"), name="transfer")
    object_tool = guard.wrap(Refund())
    assert inspect.iscoroutinefunction(partial_tool)
    assert inspect.iscoroutinefunction(object_tool)
    for _ in range(2):
        assert run_with_id("p-1", lambda: partial_tool("acct_b", 300)) == 300
        assert run_with_id("o-1", lambda: object_tool("ord_7")) == "refunded ord_7"
    # each ran once, inside the guard: the records are committed, not unknown
    assert runs == ["transfer", "refund"]
    for tool_call_id in ("p-1", "o-1"):
        record = rstore.get(tool_call_id)
        assert record is not None and record.status is Status.COMMITTED


# -- one store, both kinds -----------------------------------------------------------------------------
def make_pair(guard: EffectGuard, runs: list[str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The same tool ("charge") written once blocking and once as a coroutine."""

    def charge_sync(account: str, cents: int) -> dict[str, Any]:
        runs.append("sync")
        return {"account": account, "cents": cents, "by": "sync"}

    async def charge_async(account: str, cents: int) -> dict[str, Any]:
        runs.append("async")
        await asyncio.sleep(0)
        return {"account": account, "cents": cents, "by": "async"}

    return guard.wrap(charge_sync, name="charge"), guard.wrap(charge_async, name="charge")


def test_one_store_object_serves_sync_and_async_tools_both_ways(rstore: RedisEffectStore) -> None:
    guard = EffectGuard(rstore)
    runs: list[str] = []
    charge_sync, charge_async = make_pair(guard, runs)

    with tool_call_context("mix-1"):
        first = charge_sync("acct_1", 500)
    replayed = run_with_id("mix-1", lambda: charge_async("acct_1", 500))
    assert replayed == first == {"account": "acct_1", "cents": 500, "by": "sync"}

    second = run_with_id("mix-2", lambda: charge_async("acct_2", 700))
    with tool_call_context("mix-2"):
        assert charge_sync("acct_2", 700) == second == {"account": "acct_2", "cents": 700, "by": "async"}

    assert runs == ["sync", "async"]
    # the blocking client and the loop's asyncio client are both the same store's
    assert rstore._client is not None


def test_a_sync_approver_and_an_async_approver_both_gate_async_tools(rstore: RedisEffectStore) -> None:
    seen: list[tuple[str, str | None]] = []

    def sync_approver(request: ApprovalRequest) -> bool:
        seen.append(("sync", request.tool_call_id))
        return bool(request.arguments["cents"] < 1000)

    async def async_approver(request: ApprovalRequest) -> bool:
        await asyncio.sleep(0)
        seen.append(("async", request.tool_call_id))
        return bool(request.arguments["cents"] < 1000)

    runs: list[int] = []

    async def pay(cents: int) -> int:
        runs.append(cents)
        return cents

    for label, approver in (("sync", sync_approver), ("async", async_approver)):
        guard = EffectGuard(rstore, require_approval_for_irreversible=True, approver=approver)
        tool = guard.wrap(reversibility("irreversible")(pay))
        assert run_with_id(f"ap-{label}-ok", lambda tool=tool: tool(100)) == 100  # type: ignore[misc]
        with pytest.raises(ApprovalDenied):
            run_with_id(f"ap-{label}-no", lambda tool=tool: tool(5000))  # type: ignore[misc]
        assert rstore.get(f"ap-{label}-no") is None  # a denied call never reaches the store
    assert runs == [100, 100]
    assert seen == [
        ("sync", "ap-sync-ok"),
        ("sync", "ap-sync-no"),
        ("async", "ap-async-ok"),
        ("async", "ap-async-no"),
    ]


# -- deferred results ----------------------------------------------------------------------------------
def assert_unknown(store: RedisEffectStore, tool_call_id: str) -> None:
    record = store.get(tool_call_id)
    assert record is not None and record.status is Status.UNKNOWN


def test_an_async_generator_returned_by_an_async_tool_is_recorded_unknown(rstore: RedisEffectStore) -> None:
    sent: list[int] = []

    async def send_batch(count: int) -> AsyncIterator[int]:
        async def sending() -> AsyncIterator[int]:
            for i in range(count):
                sent.append(i)
                yield i

        return sending()

    tool = EffectGuard(rstore).wrap(send_batch)

    async def consume() -> list[int]:
        with tool_call_context("gen-1"):
            stream: AsyncIterator[int] = await tool(3)
        assert inspect.isasyncgen(stream) is True
        return [i async for i in stream]

    assert asyncio.run(consume()) == [0, 1, 2]
    assert_unknown(rstore, "gen-1")
    with pytest.raises(EffectStatusUnknown):
        run_with_id("gen-1", lambda: tool(3))
    assert sent == [0, 1, 2]


def test_an_async_generator_function_stays_one_and_is_recorded_unknown(rstore: RedisEffectStore) -> None:
    produced: list[int] = []

    async def stream(count: int) -> AsyncIterator[int]:
        for i in range(count):
            produced.append(i)
            yield i

    tool = EffectGuard(rstore).wrap(stream)
    assert inspect.isasyncgenfunction(tool) and tool.__name__ == "stream"

    async def consume(tool_call_id: str) -> list[int]:
        with tool_call_context(tool_call_id):
            return [i async for i in tool(2)]

    assert asyncio.run(consume("gen-2")) == [0, 1]
    assert_unknown(rstore, "gen-2")
    with pytest.raises(EffectStatusUnknown):
        asyncio.run(consume("gen-2"))
    assert produced == [0, 1]

    async def stop_early() -> int:
        with tool_call_context("gen-3"):
            async for i in tool(5):
                return int(i)
        return -1

    assert asyncio.run(stop_early()) == 0
    assert_unknown(rstore, "gen-3")
    assert produced == [0, 1, 0]


def test_a_coroutine_returned_by_an_async_tool_is_recorded_unknown(rstore: RedisEffectStore) -> None:
    async def later() -> str:
        return "done"

    async def schedule() -> Coroutine[Any, Any, str]:
        return later()

    tool = EffectGuard(rstore).wrap(schedule)
    pending = run_with_id("co-1", tool)
    assert inspect.iscoroutine(pending)
    pending.close()
    assert_unknown(rstore, "co-1")


class Ticket:
    """An awaitable that is not a coroutine."""

    def __await__(self) -> Generator[Any, None, str]:
        yield from asyncio.sleep(0).__await__()
        return "ticket"


@pytest.mark.parametrize("returned", ["coroutine", "custom awaitable", "future"])
def test_an_awaitable_returned_by_a_sync_tool_is_recorded_unknown(
    rstore: RedisEffectStore, returned: str
) -> None:
    async def later() -> str:
        return "done"

    def start() -> Awaitable[str]:
        if returned == "coroutine":
            return later()
        if returned == "custom awaitable":
            return Ticket()
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        future.set_result("done")
        return future

    tool = cast(Callable[[], Any], EffectGuard(rstore).wrap(start))
    assert not inspect.iscoroutinefunction(tool)

    async def main() -> None:
        with tool_call_context(f"aw-{returned}"):
            result = tool()
        assert inspect.isawaitable(result)
        assert await result in ("done", "ticket")

    asyncio.run(main())
    assert_unknown(rstore, f"aw-{returned}")


def test_a_coroutine_returned_by_a_sync_tool_outside_any_loop_is_recorded_unknown(
    rstore: RedisEffectStore,
) -> None:
    async def later() -> None:
        return None

    def start() -> Coroutine[Any, Any, None]:
        return later()

    tool = cast(Callable[[], Any], EffectGuard(rstore).wrap(start))
    with tool_call_context("aw-plain"):
        result = tool()
    assert inspect.iscoroutine(result)
    result.close()
    assert_unknown(rstore, "aw-plain")
    with tool_call_context("aw-plain"), pytest.raises(EffectStatusUnknown):
        tool()


# -- no blocking I/O on the loop -------------------------------------------------------------------------
@pytest.fixture
def blocking_redis_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every blocking redis-py entry point, patched to note (and fail) a call made from a running loop."""
    noted: list[str] = []

    def patch(owner: type[Any], name: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if asyncio._get_running_loop() is not None:
                noted.append(f"{owner.__name__}.{name}")
                raise AssertionError(f"blocking {owner.__name__}.{name} called on the event loop")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, checked)

    patch(redis.Redis, "execute_command")
    patch(redis.client.Pipeline, "execute")
    patch(Script, "__call__")
    for name in ("connect", "send_packed_command", "read_response"):
        patch(redis.connection.AbstractConnection, name)
    return noted


def test_no_blocking_redis_call_runs_on_the_event_loop(
    redis_server: EmbeddedRedis, namespace: str, blocking_redis_calls: list[str]
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace)

    def sync_approver(request: ApprovalRequest) -> bool:
        return True

    guard = EffectGuard(store, require_approval_for_irreversible=True, approver=sync_approver)
    runs: list[str] = []

    async def pay(cents: int) -> int:
        runs.append("pay")
        await asyncio.sleep(0.001)
        return cents

    async def flaky(cents: int) -> int:
        raise TimeoutError("lost")

    async def failing(cents: int) -> int:
        raise ValueError("bad input")

    async def stream(cents: int) -> AsyncIterator[int]:
        yield cents

    pay_tool = guard.wrap(reversibility("irreversible")(pay))
    flaky_tool, failing_tool = guard.wrap(flaky), guard.wrap(failing)
    stream_tool = guard.wrap(stream)
    ticks = 0

    async def watchdog(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.002)

    async def one(i: int) -> None:
        with tool_call_context(f"nb-{i}"):
            assert await pay_tool(i) == i  # begin, approve in a thread, commit
            assert await pay_tool(i) == i  # replay
        with tool_call_context(f"nb-flaky-{i}"), pytest.raises(TimeoutError):
            await flaky_tool(i)  # settle unknown
        with tool_call_context(f"nb-fail-{i}"), pytest.raises(ValueError):
            await failing_tool(i)  # settle release
        with tool_call_context(f"nb-stream-{i}"):
            assert [x async for x in stream_tool(i)] == [i]
        assert (await store.aget(f"nb-{i}")) is not None

    async def main() -> None:
        stop = asyncio.Event()
        dog = asyncio.create_task(watchdog(stop))
        # bounded, so a call that never finishes fails the test instead of hanging it
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(20))), HANG_LIMIT)
        stop.set()
        await asyncio.wait_for(dog, HANG_LIMIT)

    asyncio.run(main())
    assert blocking_redis_calls == []
    assert store._client is None  # the async path never even created the blocking client
    assert len(runs) == 20 and ticks > 0
    # the same patches do catch a blocking call made from the loop: the proof is not vacuous
    sync_view = RedisEffectStore(redis_server.url, namespace=namespace)

    async def misuse() -> None:
        sync_view.get("nb-0")

    with pytest.raises(Exception, match="blocking"):
        asyncio.run(misuse())
    assert blocking_redis_calls
    assert sync_view.get("nb-0") is not None  # outside a loop the blocking path is allowed
