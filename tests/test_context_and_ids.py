"""Where a call's tool_call_id comes from, and which ids the guard accepts.

Only the host sets the id (``tool_call_context``); a tool argument named ``tool_call_id`` is the
model's and is never read. An id must be a non-blank string of at most 4096 UTF-8 bytes without
lone surrogates; any string that meets that is usable, braces and any Unicode included.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    EffectStore,
    Status,
    current_call_context,
    idempotency_key,
    reversibility,
    tool_call_context,
)
from airlock_redis.core.ids import MAX_TOOL_CALL_ID_BYTES
from tests.tools import Counted, call_with_id, make_tool

KINDS = ("sync", "async")


# -- tool_call_context -------------------------------------------------------------------------


def test_the_context_nests_and_resets() -> None:
    assert current_call_context() is None
    with tool_call_context("outer", agent_id="agent-1", channel="chat") as outer:
        assert current_call_context() is outer
        assert (outer.tool_call_id, outer.agent_id, dict(outer.metadata)) == (
            "outer",
            "agent-1",
            {"channel": "chat"},
        )
        with tool_call_context("inner") as inner:
            current = current_call_context()
            assert current is inner and current.tool_call_id == "inner" and current.agent_id is None
        assert current_call_context() is outer
    assert current_call_context() is None


def test_the_context_resets_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), tool_call_context("outer"), tool_call_context("inner"):
        raise RuntimeError("boom")
    assert current_call_context() is None


def test_the_context_does_not_leak_into_another_thread() -> None:
    seen: list[Any] = []
    with tool_call_context("main-thread"):
        worker = threading.Thread(target=lambda: seen.append(current_call_context()))
        worker.start()
        worker.join()
    assert seen == [None]


@pytest.mark.parametrize("kind", KINDS)
def test_a_guarded_call_is_recorded_under_the_innermost_id(store: EffectStore, kind: str) -> None:
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store), counted, kind)
    with tool_call_context("outer"):
        with tool_call_context("inner"):
            charge("acct", 5)
        charge("acct", 6)
    inner, outer = store.get("inner"), store.get("outer")
    assert inner is not None and inner.idempotency_key == idempotency_key(
        "charge", {"account": "acct", "cents": 5}
    )
    assert outer is not None and outer.idempotency_key == idempotency_key(
        "charge", {"account": "acct", "cents": 6}
    )
    assert len(counted.runs) == 2


def test_concurrent_tasks_keep_their_own_ids(store: EffectStore) -> None:
    guard = EffectGuard(store=store)
    runs: list[str] = []

    async def charge(account: str) -> str:
        await asyncio.sleep(0)
        runs.append(account)
        return account

    guarded = guard.wrap(charge)

    async def one(tool_call_id: str, account: str) -> str:
        with tool_call_context(tool_call_id):
            await asyncio.sleep(0)
            return await guarded(account)

    async def main() -> list[str]:
        return list(await asyncio.gather(*(one(f"task-{i}", f"acct-{i}") for i in range(5))))

    assert asyncio.run(main()) == [f"acct-{i}" for i in range(5)]
    for i in range(5):
        record = store.get(f"task-{i}")
        assert record is not None
        assert record.idempotency_key == idempotency_key("charge", {"account": f"acct-{i}"})
    assert sorted(runs) == [f"acct-{i}" for i in range(5)]


# -- an argument named tool_call_id is the model's -----------------------------------------------


def reply_tool(guard: EffectGuard, kind: str, runs: list[str]) -> Any:
    """A tool whose own parameter is called ``tool_call_id``; returns a blocking caller."""
    if kind == "sync":

        def reply(text: str, tool_call_id: str) -> str:
            runs.append(tool_call_id)
            return f"{text}:{tool_call_id}"

        return guard.wrap(reply)

    async def reply_async(text: str, tool_call_id: str) -> str:
        runs.append(tool_call_id)
        return f"{text}:{tool_call_id}"

    guarded = guard.wrap(reply_async)
    return lambda *a, **k: asyncio.run(guarded(*a, **k))


@pytest.mark.parametrize("kind", KINDS)
def test_an_argument_named_tool_call_id_does_not_stand_in_for_the_hosts_id(
    store: EffectStore, kind: str
) -> None:
    runs: list[str] = []
    reply = reply_tool(EffectGuard(store=store), kind, runs)
    with pytest.raises(EffectRefused) as refused:
        reply("hi", tool_call_id="x")
    assert refused.value.reason == "tool_call_id_required"
    assert runs == []
    assert store.get("x") is None


@pytest.mark.parametrize("kind", KINDS)
def test_the_record_is_keyed_on_the_hosts_id_not_the_argument(store: EffectStore, kind: str) -> None:
    runs: list[str] = []
    reply = reply_tool(EffectGuard(store=store), kind, runs)

    def under_ctx(argument: str) -> Any:
        with tool_call_context("ctx"):
            return reply("hi", tool_call_id=argument)

    assert under_ctx("x") == "hi:x"
    assert store.get("x") is None
    record = store.get("ctx")
    assert record is not None and record.status is Status.COMMITTED
    # the argument is ordinary business input: part of the key, so the tool receives it unchanged ...
    name = "reply" if kind == "sync" else "reply_async"
    assert record.idempotency_key == idempotency_key(name, {"text": "hi", "tool_call_id": "x"})
    assert runs == ["x"]
    # ... a replay under the host's id returns the stored value ...
    assert under_ctx("x") == "hi:x"
    # ... and another value of the argument under the same host id is another call
    with pytest.raises(EffectRefused) as refused:
        under_ctx("y")
    assert refused.value.reason == "policy_violation"
    assert runs == ["x"]


# -- which ids are accepted ----------------------------------------------------------------------

TOO_LONG = {
    "ascii 4097": "a" * (MAX_TOOL_CALL_ID_BYTES + 1),
    "2049 two-byte chars": "é" * 2049,  # 2049 characters, 4098 bytes: the limit is in bytes
    "1025 four-byte chars": "🙂" * 1025,
}
LONE_SURROGATES = {"high": "call_\ud800", "low": "\udc00", "in the middle": "a\udfffb"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tag", [None, "costly", "reversible"])
@pytest.mark.parametrize("name", list(TOO_LONG))
def test_an_id_over_4096_utf8_bytes_is_refused(store: EffectStore, kind: str, tag: Any, name: str) -> None:
    tool_call_id = TOO_LONG[name]
    assert len(tool_call_id) <= MAX_TOOL_CALL_ID_BYTES or name.startswith("ascii")
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store), counted, kind, tag)
    with pytest.raises(EffectRefused) as refused:
        call_with_id(charge, tool_call_id, "acct", 5)
    assert refused.value.reason == "tool_call_id_required"
    message = str(refused.value)
    assert str(len(tool_call_id.encode())) in message and "4096" in message
    assert counted.runs == []
    assert store.get(tool_call_id) is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tag", [None, "reversible"])
@pytest.mark.parametrize("name", list(LONE_SURROGATES))
def test_an_id_with_a_lone_surrogate_is_refused(store: EffectStore, kind: str, tag: Any, name: str) -> None:
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store), counted, kind, tag)
    with pytest.raises(EffectRefused) as refused:
        call_with_id(charge, LONE_SURROGATES[name], "acct", 5)
    assert refused.value.reason == "tool_call_id_required"
    assert "surrogate" in str(refused.value)
    assert counted.runs == []


def test_a_bad_id_is_refused_even_when_ids_are_not_required(store: EffectStore) -> None:
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store, require_tool_call_id=False), counted, "sync")
    with pytest.raises(EffectRefused) as refused:
        call_with_id(charge, "x" * 5000, "acct", 5)
    assert refused.value.reason == "tool_call_id_required"
    assert counted.runs == []


ODD_BUT_VALID = [
    "a" * MAX_TOOL_CALL_ID_BYTES,
    "é" * (MAX_TOOL_CALL_ID_BYTES // 2),
    "{call}",
    "}{",
    "{",
    "call_{abc}:x",
    "call with spaces\tand\nnewlines",
    "通话-🙂-ñ",
    "*?[]\\",
    "\x00nul",
    " x ",
    "airlock:effect:{deadbeef}:other",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tool_call_id", ODD_BUT_VALID, ids=lambda s: repr(s[:24]))
def test_unicode_brace_and_boundary_ids_are_guarded(store: EffectStore, kind: str, tool_call_id: str) -> None:
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store), counted, kind)
    first = call_with_id(charge, tool_call_id, "acct", 5)
    assert call_with_id(charge, tool_call_id, "acct", 5) == first
    assert len(counted.runs) == 1
    record = store.get(tool_call_id)
    assert record is not None
    assert record.tool_call_id == tool_call_id and record.status is Status.COMMITTED


def test_ids_that_differ_only_in_braces_or_normalisation_are_distinct(store: EffectStore) -> None:
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store), counted, "sync")
    ids = ["{a}", "a", "{a", "é", "e\u0301"]  # the last two render alike but are different strings
    for tool_call_id in ids:
        call_with_id(charge, tool_call_id, "acct", 5)
    assert len(counted.runs) == len(ids)
    for tool_call_id in ids:
        record = store.get(tool_call_id)
        assert record is not None and record.tool_call_id == tool_call_id


def test_a_reversible_tool_with_an_id_is_still_recorded(store: EffectStore) -> None:
    @reversibility("reversible")
    def look(account: str) -> str:
        return account

    with tool_call_context("rev-id"):
        EffectGuard(store=store).wrap(look)("acct")
    record = store.get("rev-id")
    assert record is not None and record.status is Status.COMMITTED


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("blank", ["   ", "\t", "\n", " \u3000 "])
def test_a_blank_id_is_as_missing_as_an_empty_one(store: EffectStore, kind: str, blank: str) -> None:
    """An id that is only whitespace names no call: an irreversible tool is refused and does not run;
    a reversible one runs unguarded, leaving no record."""
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store), counted, kind)
    with pytest.raises(EffectRefused) as refused:
        call_with_id(charge, blank, "acct", 5)
    assert refused.value.reason == "tool_call_id_required"
    assert "blank" in str(refused.value)
    assert counted.runs == []
    reversible = make_tool(EffectGuard(store=store), counted, kind, "reversible")
    call_with_id(reversible, blank, "acct", 5)
    assert len(counted.runs) == 1
    assert store.get(blank) is None
