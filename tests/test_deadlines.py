"""The deadlines of one loop's sends, kept by one timer (``airlock_redis.stores.deadlines``).

What must hold, as ``asyncio.timeout`` would have it for each send on its own:

- a send past its deadline has its task cancelled, and the one who started it is told so
  (``expired`` is True): it raises a timeout instead;
- a send that ends in time is never cancelled afterwards, not even by the timer armed for it;
- a cancellation from anywhere else is never taken for the deadline's, even when both happen;
- several sends keep their own deadlines: the timer fires for the earliest, and is armed again
  for the next one left;
- many quick sends arm the timer once, not once each.

The exchange's own deadline test (tests/test_exchange.py) covers it on a real server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airlock_redis.stores.deadlines import SUPPORTED, Deadlines

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="Python 3.10: the exchange keeps async_timeout")


async def bounded(deadlines: Deadlines, seconds: float, work: float) -> str:
    """What the exchange does around its I/O: ``work`` seconds of waiting, within ``seconds``."""
    running = deadlines.start(seconds)
    try:
        await asyncio.sleep(work)
    except asyncio.CancelledError:
        if deadlines.expired(running):
            return "timed out"
        raise
    finally:
        deadlines.stop(running)
    return "done"


def run(main: Any) -> Any:
    return asyncio.run(main())


def test_a_send_past_its_deadline_is_told_it_timed_out() -> None:
    async def main() -> tuple[str, int]:
        deadlines = Deadlines(asyncio.get_running_loop())
        return await bounded(deadlines, 0.05, 5.0), deadlines.under_way

    assert run(main) == ("timed out", 0)


def test_a_send_that_ended_in_time_is_never_cancelled_afterwards() -> None:
    async def main() -> tuple[str, bool]:
        deadlines = Deadlines(asyncio.get_running_loop())
        outcome = await bounded(deadlines, 0.05, 0.0)
        await asyncio.sleep(0.15)  # the timer armed for it fires meanwhile and finds nothing
        task = asyncio.current_task()
        return outcome, task is not None and task.cancelling() == 0

    assert run(main) == ("done", True)


def test_a_cancellation_from_elsewhere_is_not_the_deadlines() -> None:
    async def main() -> bool:
        deadlines = Deadlines(asyncio.get_running_loop())
        task = asyncio.ensure_future(bounded(deadlines, 5.0, 5.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return deadlines.under_way == 0

    assert run(main)


def test_a_cancellation_from_elsewhere_at_the_deadline_still_goes_on() -> None:
    async def main() -> None:
        deadlines = Deadlines(asyncio.get_running_loop())
        task = asyncio.ensure_future(bounded(deadlines, 0.05, 5.0))
        await asyncio.sleep(0)
        # the caller cancels in the same turn as the deadline fires: its cancellation wins
        loop = asyncio.get_running_loop()
        loop.call_at(task_deadline(deadlines), task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main)


def task_deadline(deadlines: Deadlines) -> float:
    (running,) = deadlines._running  # the one send under way
    return running.when


def test_each_send_keeps_its_own_deadline_and_the_timer_moves_on_to_the_next() -> None:
    async def main() -> list[str]:
        deadlines = Deadlines(asyncio.get_running_loop())
        early = asyncio.ensure_future(bounded(deadlines, 0.05, 5.0))
        late = asyncio.ensure_future(bounded(deadlines, 0.3, 5.0))
        quick = asyncio.ensure_future(bounded(deadlines, 0.2, 0.1))
        first = await early
        assert not late.done() and not quick.done()  # only the early one's deadline has passed
        return [first, await quick, await late]

    assert run(main) == ["timed out", "done", "timed out"]


def test_many_quick_sends_arm_the_timer_once() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        armed = 0
        real_call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            nonlocal armed
            armed += 1
            return real_call_at(when, callback, *args)

        loop.call_at = counting_call_at  # type: ignore[method-assign, assignment]
        try:
            for _ in range(200):
                assert await bounded(deadlines, 5.0, 0) == "done"
        finally:
            loop.call_at = real_call_at  # type: ignore[method-assign]
        return armed

    assert run(main) == 1


def test_a_send_outside_a_task_is_refused() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(RuntimeError, match="in a task"):
            Deadlines(loop).start(1.0)
    finally:
        loop.close()
