"""A guarded tool called from a ThreadPoolExecutor inside ``tool_call_context`` is refused (a worker
thread does not see the context variable), and the refusal says what works there:
``guard.call(tool_call_id, fn, ...)``, not the ``with`` block the caller already wrote."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from airlock_redis import EffectGuard, InMemoryEffectStore, ToolCallIdRequired, tool_call_context


def _guard_and_tool() -> tuple[EffectGuard, list[int], Callable[[int], int]]:
    guard = EffectGuard(store=InMemoryEffectStore())
    ran: list[int] = []

    def charge(cents: int) -> int:
        ran.append(cents)
        return cents

    return guard, ran, charge


def test_a_worker_thread_inside_the_with_block_is_told_to_pass_the_id_by_hand() -> None:
    guard, ran, charge = _guard_and_tool()
    guarded = guard.wrap(charge)
    with tool_call_context("call_1"), ThreadPoolExecutor(1, thread_name_prefix="tools") as pool:
        with pytest.raises(ToolCallIdRequired) as refused:
            pool.submit(guarded, 5).result()
        message = str(refused.value)
        # the advice that works in the worker comes first, and names the thread
        assert refused.value.fix_hint.startswith("This call runs in the thread 'tools_0', not the main one.")
        assert "guard.call(tool_call.id, fn, *args, **kwargs)" in message
        assert "ThreadPoolExecutor" in message and "await guard.acall(...)" in message
        assert message.index("guard.call(") < message.index("with tool_call_context(")
        assert ran == []
        # following it: the call runs once, and a retry under the same id replays
        assert pool.submit(lambda: guard.call("call_1", charge, 5)).result() == 5
        assert pool.submit(lambda: guard.call("call_1", charge, 5)).result() == 5
    assert ran == [5]


def test_run_in_executor_gets_the_same_advice() -> None:
    guard, ran, charge = _guard_and_tool()
    guarded = guard.wrap(charge)

    async def main() -> ToolCallIdRequired:
        with tool_call_context("call_2"):
            try:
                await asyncio.get_running_loop().run_in_executor(None, guarded, 7)
            except ToolCallIdRequired as exc:
                return exc
        raise AssertionError("the worker's call was not refused")

    refused = asyncio.run(main())
    assert refused.fix_hint.startswith("This call runs in the thread ")
    assert "guard.call(tool_call.id, fn, *args, **kwargs)" in refused.fix_hint
    assert ran == []


def test_on_the_main_thread_the_hint_leads_with_the_with_block_and_still_names_guard_call() -> None:
    guard, ran, charge = _guard_and_tool()
    with pytest.raises(ToolCallIdRequired) as refused:
        guard.wrap(charge)(5)
    hint = refused.value.fix_hint
    assert hint.startswith("The host must carry the model's tool call id on the call")
    assert "metadata={'tool_call_id': tool_call.id}" in hint
    assert "guard.call(tool_call.id, fn, *args, **kwargs)" in hint
    assert ran == []
