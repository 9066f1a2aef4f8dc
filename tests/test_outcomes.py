"""How an attempt that ran leaves its record: committed, unknown, or released.

| the tool ...                                        | the record            | a retry                    |
|-----------------------------------------------------|-----------------------|----------------------------|
| returns a value                                     | committed, with value | replays the value          |
| raises an ambiguous error (default five or custom)  | unknown               | refused (not reversible)   |
| raises any other error                              | released (absent)     | runs again                 |
| returns a generator or another deferred result      | unknown               | refused                    |
| is interrupted (KeyboardInterrupt, SystemExit,      | unknown, never        | refused                    |
| asyncio cancellation)                               | released              |                            |
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import pytest

from airlock_redis import (
    DEFAULT_AMBIGUOUS_ERRORS,
    EffectGuard,
    EffectOutcomeUnknown,
    EffectRefused,
    EffectStore,
    Status,
    tool_call_context,
)
from airlock_redis.core.codec import decode_result
from tests.tools import Counted, call_with_id, make_tool

KINDS = ("sync", "async")
DEFAULT_FIVE = (
    TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    EffectOutcomeUnknown,
)


class MyError(Exception):
    pass


class SlowLink(TimeoutError):
    """A subclass of a default ambiguous error is ambiguous too."""


def raising(error: BaseException) -> Callable[[dict[str, Any]], Any]:
    def behaviour(args: dict[str, Any]) -> Any:
        raise error

    return behaviour


def status_of(store: EffectStore, tool_call_id: str) -> Status | None:
    record = store.get(tool_call_id)
    return None if record is None else record.status


def assert_refused(reason: str, tool: Callable[..., Any], tool_call_id: str, *args: Any) -> None:
    with pytest.raises(EffectRefused) as refused:
        call_with_id(tool, tool_call_id, *args)
    assert refused.value.reason == reason


# -- returned ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_returned_value_is_committed_with_that_value(store: EffectStore, kind: str) -> None:
    counted = Counted("charge", behaviour=lambda args: {"paid": args["cents"], "ids": [1, 2]})
    charge = make_tool(EffectGuard(store=store), counted, kind)
    assert call_with_id(charge, "c-ok", "acct", 700) == {"paid": 700, "ids": [1, 2]}
    record = store.get("c-ok")
    assert record is not None
    assert record.status is Status.COMMITTED
    assert record.stored is True and record.value is not None
    assert decode_result(record.value) == {"paid": 700, "ids": [1, 2]}
    assert len(counted.runs) == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", [[1, 2], "text", {"a": 1}, b"raw", (1, 2)], ids=repr)
def test_plain_iterables_are_values_not_deferred_results(store: EffectStore, kind: str, value: Any) -> None:
    counted = Counted("charge", behaviour=lambda args: value)
    charge = make_tool(EffectGuard(store=store), counted, kind)
    assert call_with_id(charge, "c-iter", "acct", 1) == value
    assert status_of(store, "c-iter") is Status.COMMITTED
    assert call_with_id(charge, "c-iter", "acct", 1) == value
    assert len(counted.runs) == 1


# -- ambiguous errors --------------------------------------------------------------------------


def test_the_default_ambiguous_errors_are_the_five_of_the_spec() -> None:
    assert set(DEFAULT_AMBIGUOUS_ERRORS) == set(DEFAULT_FIVE)
    assert set(EffectGuard().ambiguous_errors) == set(DEFAULT_FIVE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("error", [*DEFAULT_FIVE, SlowLink], ids=lambda e: e.__name__)
def test_each_default_ambiguous_error_records_unknown_and_propagates(
    store: EffectStore, kind: str, error: type[Exception]
) -> None:
    raised = error("lost in transit")
    counted = Counted("charge", behaviour=raising(raised))
    charge = make_tool(EffectGuard(store=store), counted, kind)
    with pytest.raises(error) as caught:
        call_with_id(charge, "c-amb", "acct", 500)
    assert caught.value is raised
    assert status_of(store, "c-amb") is Status.UNKNOWN
    assert_refused("effect_status_unknown", charge, "c-amb", "acct", 500)
    assert len(counted.runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_custom_ambiguous_errors_record_the_listed_error_unknown(store: EffectStore, kind: str) -> None:
    counted = Counted("charge", behaviour=raising(MyError("backend said maybe")))
    charge = make_tool(EffectGuard(store=store, ambiguous_errors=(MyError,)), counted, kind)
    with pytest.raises(MyError):
        call_with_id(charge, "c-mine", "acct", 500)
    assert status_of(store, "c-mine") is Status.UNKNOWN
    assert_refused("effect_status_unknown", charge, "c-mine", "acct", 500)
    assert len(counted.runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_custom_ambiguous_errors_replace_the_defaults(store: EffectStore, kind: str) -> None:
    """With ambiguous_errors=(MyError,), a TimeoutError is an ordinary error: the record is released."""
    counted = Counted("charge", behaviour=raising(TimeoutError("plain timeout")))
    charge = make_tool(EffectGuard(store=store, ambiguous_errors=(MyError,)), counted, kind)
    with pytest.raises(TimeoutError):
        call_with_id(charge, "c-repl", "acct", 500)
    assert store.get("c-repl") is None
    counted.behaviour = None
    assert call_with_id(charge, "c-repl", "acct", 500)["run"] == 2
    assert len(counted.runs) == 2
    assert status_of(store, "c-repl") is Status.COMMITTED


def test_ambiguous_errors_must_be_exception_classes() -> None:
    with pytest.raises(TypeError):
        EffectGuard(ambiguous_errors=(MyError, "TimeoutError"))  # type: ignore[arg-type]


# -- other errors release ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("error", [ValueError, MyError, RuntimeError, OSError, KeyError])
def test_any_other_error_releases_the_record_and_the_call_may_run_again(
    store: EffectStore, kind: str, error: type[Exception]
) -> None:
    counted = Counted("charge", behaviour=raising(error("card declined")))
    charge = make_tool(EffectGuard(store=store), counted, kind)
    with pytest.raises(error):
        call_with_id(charge, "c-rel", "acct", 500)
    assert store.get("c-rel") is None
    with pytest.raises(error):
        call_with_id(charge, "c-rel", "acct", 500)
    assert len(counted.runs) == 2
    assert store.get("c-rel") is None


# -- deferred results --------------------------------------------------------------------------


def _generator() -> Iterator[int]:
    yield 1


async def _async_generator() -> AsyncIterator[int]:
    yield 1


async def _coroutine() -> int:
    return 1


DEFERRED: dict[str, Callable[[], Any]] = {
    "generator": _generator,
    "async generator": _async_generator,
    "iter(list)": lambda: iter([1]),
    "map": lambda: map(str, [1, 2]),
    "zip": lambda: zip([1], [2], strict=True),
    "dict items iterator": lambda: iter({"a": 1}.items()),
}


def _dispose(value: Any) -> None:
    if hasattr(value, "aclose"):
        asyncio.run(value.aclose())
    elif hasattr(value, "close"):
        value.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(DEFERRED))
def test_a_deferred_result_records_the_call_unknown(store: EffectStore, kind: str, name: str) -> None:
    counted = Counted("stream", behaviour=lambda args: DEFERRED[name]())
    stream = make_tool(EffectGuard(store=store), counted, kind)
    _dispose(call_with_id(stream, "c-def", "acct", 1))
    assert status_of(store, "c-def") is Status.UNKNOWN
    assert_refused("effect_status_unknown", stream, "c-def", "acct", 1)
    assert len(counted.runs) == 1


def test_a_coroutine_returned_by_a_sync_tool_records_the_call_unknown(store: EffectStore) -> None:
    runs: list[int] = []
    guard = EffectGuard(store=store)

    # a sync tool that hands back an awaitable: its effect comes later
    def send(to: str) -> Coroutine[Any, Any, int]:
        runs.append(1)
        return _coroutine()

    guarded: Callable[[str], Any] = guard.wrap(send)
    with tool_call_context("c-coro"):
        returned = guarded("bob")
    assert asyncio.iscoroutine(returned)
    returned.close()
    assert status_of(store, "c-coro") is Status.UNKNOWN
    with tool_call_context("c-coro"), pytest.raises(EffectRefused) as refused:
        guarded("bob")
    assert refused.value.reason == "effect_status_unknown"
    assert runs == [1]


def test_a_generator_function_tool_is_recorded_unknown(store: EffectStore) -> None:
    guard = EffectGuard(store=store)
    consumed: list[int] = []

    def emails(n: int) -> Iterator[int]:
        for i in range(n):
            consumed.append(i)
            yield i

    guarded = guard.wrap(emails)
    with tool_call_context("c-gen"):
        assert list(guarded(3)) == [0, 1, 2]
    assert status_of(store, "c-gen") is Status.UNKNOWN
    with tool_call_context("c-gen"), pytest.raises(EffectRefused):
        guarded(3)
    assert consumed == [0, 1, 2]


def test_an_async_generator_function_tool_is_recorded_unknown(store: EffectStore) -> None:
    guard = EffectGuard(store=store)

    async def ticks(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    guarded = guard.wrap(ticks)

    async def consume() -> list[int]:
        with tool_call_context("c-agen"):
            return [i async for i in guarded(2)]

    assert asyncio.run(consume()) == [0, 1]
    assert status_of(store, "c-agen") is Status.UNKNOWN


# -- interruption ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("tag", [None, "reversible"])
def test_an_interrupt_records_unknown_never_released_and_propagates(
    store: EffectStore, kind: str, interrupt: type[BaseException], tag: Any
) -> None:
    counted = Counted("charge", behaviour=raising(interrupt()))
    charge = make_tool(EffectGuard(store=store), counted, kind, tag)
    with pytest.raises(interrupt):
        call_with_id(charge, "c-int", "acct", 500)
    record = store.get("c-int")
    assert record is not None and record.status is Status.UNKNOWN
    assert len(counted.runs) == 1
    if tag is None:
        assert_refused("effect_status_unknown", charge, "c-int", "acct", 500)
        assert len(counted.runs) == 1


def test_cancelling_an_async_tool_records_unknown_and_the_cancellation_propagates(
    store: EffectStore,
) -> None:
    guard = EffectGuard(store=store)
    runs: list[int] = []
    started: list[asyncio.Event] = []

    async def charge(account: str) -> str:
        runs.append(1)
        started[0].set()
        await asyncio.Event().wait()  # the effect is under way when the caller gives up
        return "never"

    guarded = guard.wrap(charge)

    async def scenario() -> None:
        started.append(asyncio.Event())
        with tool_call_context("c-cancel"):
            task = asyncio.create_task(guarded("acct"))
            await started[0].wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record = await store.aget("c-cancel")
            assert record is not None and record.status is Status.UNKNOWN
            with pytest.raises(EffectRefused) as refused:
                await guarded("acct")
            assert refused.value.reason == "effect_status_unknown"

    asyncio.run(scenario())
    assert runs == [1]


def test_an_async_tool_raising_cancelled_error_itself_is_recorded_unknown(store: EffectStore) -> None:
    guard = EffectGuard(store=store)

    async def charge(account: str) -> str:
        raise asyncio.CancelledError

    guarded = guard.wrap(charge)

    async def scenario() -> None:
        with tool_call_context("c-cancel2"), pytest.raises(asyncio.CancelledError):
            await guarded("acct")

    asyncio.run(scenario())
    assert status_of(store, "c-cancel2") is Status.UNKNOWN
