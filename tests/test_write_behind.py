"""Write-behind commits (issue 27, item 2), on a real redis-server, blocking and asyncio.

The caller gets its value before the commit lands; the commit is sent by the store's background sender,
in order per record, and flushed by ``flush``/``close``, at interpreter exit, and when ``asyncio.run``
ends. A commit whose sends fail is sent again for up to ``RETRY_WINDOW`` seconds, so it lands once
Redis is back; one that fails past that, after the caller got its value, is logged at ERROR (naming
the tool and the call) and leaves the record pending: a retry is refused, the tool never runs again.
``close`` and the end of ``asyncio.run`` still take no longer than ``CLOSE_TIMEOUT``. The store's
listener (``add_write_behind_listener``) hears what became of each write. After ``fork`` the child
starts with nothing queued and never sends the parent's writes; its own writes land.

Writes are held on their way by a :class:`~tests.faults.ChaosProxy` (``DELAY``) so that each test sees
them queued: held until ``release_held()`` (never on a clock), or cut so that they fail.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import redis.asyncio as aredis

from airlock_redis import EffectGuard, EffectRefused, RedisEffectStore, Status, StoreError, tool_call_context
from airlock_redis.core.records import BeginKind, BeginRequest, Settlement, TransitionResult
from airlock_redis.core.stepping import drive
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import redis_store as redis_store_module
from airlock_redis.stores import write_behind
from airlock_redis.stores.redis_io import Pause
from airlock_redis.stores.script_args import SHAS, ScriptCommand
from airlock_redis.stores.scripts import script_bytes
from airlock_redis.stores.tries import Tries
from airlock_redis.stores.write_behind import WriteBehindOutcome
from tests.faults import Action, ChaosProxy, Fault
from tests.topo_helpers import recorded
from tests.topologies import wait_until

pytestmark = pytest.mark.redis_server

STEP_LIMIT = 30.0  # a bound on each wait, so a broken feature fails instead of hanging
ROOT = Path(__file__).resolve().parents[1]


def fresh(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


def is_script(name: str) -> Callable[[list[bytes]], bool]:
    """A proxy rule's match: the transition script ``name``, as EVALSHA or EVAL."""
    sha, source = SHAS[name].encode(), script_bytes(name)

    def match(args: list[bytes]) -> bool:
        if len(args) < 2:
            return False
        verb = args[0].upper()
        return (verb == b"EVALSHA" and args[1] == sha) or (verb == b"EVAL" and args[1] == source)

    return match


def held_commit() -> Fault:
    """The first commit is held on its way until ``release_held()`` (with every later request of its
    connection, which keeps its order); later commits on other connections pass."""
    return Fault(is_script("commit"), Action.DELAY, delay=math.inf)


def status_of(url: str, namespace: str, call_id: str) -> Status | None:
    """The record's status as ANOTHER process sees it (a store of its own, without write-behind)."""
    with RedisEffectStore(url, namespace=namespace) as other:
        record = other.get(call_id)
    return None if record is None else record.status


class Tool:
    """A guarded tool (blocking and async) that counts its runs per call id and returns its input."""

    def __init__(self, store: RedisEffectStore) -> None:
        self.runs: dict[str, int] = {}
        guard = EffectGuard(store=store)

        def charge(call: str, cents: int) -> dict[str, Any]:
            self.runs[call] = self.runs.get(call, 0) + 1
            return {"call": call, "cents": cents}

        async def acharge(call: str, cents: int) -> dict[str, Any]:
            return charge(call, cents)

        self._tool = guard.wrap(charge)
        self._atool = guard.wrap(acharge)

    def __call__(self, call_id: str, cents: int = 1) -> Any:
        with tool_call_context(call_id):
            return self._tool(call_id, cents)

    async def acall(self, call_id: str, cents: int = 1) -> Any:
        with tool_call_context(call_id):
            return await self._atool(call_id, cents)


@pytest.fixture
def namespace() -> str:
    return fresh("wb")


@pytest.fixture
def held(redis_server: EmbeddedRedis) -> Iterator[ChaosProxy]:
    """A proxy that holds the first commit until ``release_held()`` (released at the end in any case)."""
    with ChaosProxy(redis_server.socket_path, [held_commit()]) as proxy:
        try:
            yield proxy
        finally:
            proxy.release_held()


def release_when_held(proxy: ChaosProxy) -> threading.Thread:
    """Release the held request from a thread once it is held."""

    def release() -> None:
        wait_until("the write to be held", lambda: proxy.holding() >= 1, STEP_LIMIT)
        proxy.release_held()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


# -- the caller gets its value first; close and flush wait for the write ------------------------------
def test_the_value_comes_back_before_the_commit_lands_and_close_flushes_it(
    held: ChaosProxy, namespace: str
) -> None:
    store = RedisEffectStore(held.url, namespace=namespace, write_behind=True)
    tool = Tool(store)
    call_id = fresh("c")
    assert tool(call_id, 5) == {"call": call_id, "cents": 5}  # returned while its commit is held
    wait_until("the commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
    assert status_of(held.url, namespace, call_id) is Status.PENDING  # another process: not yet
    releaser = release_when_held(held)
    store.close()
    releaser.join(STEP_LIMIT)
    assert status_of(held.url, namespace, call_id) is Status.COMMITTED
    assert store.flush(0) is True  # nothing left
    assert tool.runs == {call_id: 1}


def test_flush_waits_for_every_queued_write_and_a_timeout_bounds_it(held: ChaosProxy, namespace: str) -> None:
    store = RedisEffectStore(held.url, namespace=namespace, write_behind=True)
    tool = Tool(store)
    ids = [fresh("c") for _ in range(5)]
    for call_id in ids:
        tool(call_id)
    wait_until("the first commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
    assert store.flush(timeout=0.05) is False  # still held: the bound gives up waiting, nothing lost
    held.release_held()
    assert store.flush(timeout=STEP_LIMIT) is True
    assert [status_of(held.url, namespace, i) for i in ids] == [Status.COMMITTED] * 5
    store.close()


def test_asyncio_the_value_comes_back_first_and_aflush_waits(held: ChaosProxy, namespace: str) -> None:
    store = RedisEffectStore(held.url, namespace=namespace, write_behind=True)
    tool = Tool(store)
    ids = [fresh("a") for _ in range(4)]

    async def scenario() -> list[Any]:
        values = [await tool.acall(i, n) for n, i in enumerate(ids)]
        await asyncio.to_thread(wait_until, "a commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
        assert status_of(held.url, namespace, ids[0]) is Status.PENDING
        held.release_held()
        assert await asyncio.wait_for(store.aflush(), STEP_LIMIT) is True
        return values

    values = asyncio.run(scenario())
    assert values == [{"call": i, "cents": n} for n, i in enumerate(ids)]
    assert [status_of(held.url, namespace, i) for i in ids] == [Status.COMMITTED] * 4
    assert tool.runs == dict.fromkeys(ids, 1)
    store.close()


def test_asyncio_run_ending_sends_what_is_queued(held: ChaosProxy, namespace: str) -> None:
    """asyncio.run cancels the loop's sender when the main coroutine returns: it sends its queue first."""
    store = RedisEffectStore(held.url, namespace=namespace, write_behind=True)
    tool = Tool(store)
    ids = [fresh("a") for _ in range(6)]
    returned = threading.Event()

    def release() -> None:  # once the main coroutine has returned with its writes still queued
        returned.wait(STEP_LIMIT)
        held.release_held()

    async def scenario() -> None:
        for call_id in ids:
            await tool.acall(call_id)
        await asyncio.to_thread(wait_until, "the commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
        assert store._behind is not None and store._behind.queued() == 6
        threading.Thread(target=release, daemon=True).start()
        returned.set()

    asyncio.run(scenario())  # no aflush: the end of the run sends them
    assert [status_of(held.url, namespace, i) for i in ids] == [Status.COMMITTED] * 6
    store.close()


def test_a_full_queue_sends_the_commit_synchronously(
    held: ChaosProxy, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past QUEUE_LIMIT queued writes, a commit is sent and waited for (the queue's memory is bounded)."""
    monkeypatch.setattr(write_behind, "QUEUE_LIMIT", 1)
    store = RedisEffectStore(held.url, namespace=namespace, write_behind=True)
    tool = Tool(store)
    first, second = fresh("c"), fresh("c")
    tool(first)
    wait_until("the first commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
    tool(second)  # the queue is full: this commit travels on the caller's own connection, at once
    assert status_of(held.url, namespace, second) is Status.COMMITTED
    assert status_of(held.url, namespace, first) is Status.PENDING
    held.release_held()
    assert store.flush(STEP_LIMIT) is True
    assert status_of(held.url, namespace, first) is Status.COMMITTED
    store.close()


# -- this process reads its own queued writes -------------------------------------------------------
def test_a_replay_in_this_process_waits_for_the_queued_commit(
    held: ChaosProxy, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A begin of a call whose commit is still queued here sees it committed: it gets the stored value,
    never a refusal as in doubt, and the tool does not run again."""
    waiting = threading.Event()
    wait_key = write_behind._Landing.wait_key

    def noted(self: Any, key: bytes, timeout: float | None) -> bool:
        waiting.set()
        return wait_key(self, key, timeout)

    monkeypatch.setattr(write_behind._Landing, "wait_key", noted)
    store = RedisEffectStore(held.url, namespace=namespace, write_behind=True)
    tool = Tool(store)
    call_id = fresh("c")
    first = tool(call_id, 7)

    def release() -> None:
        waiting.wait(STEP_LIMIT)  # the replay's begin waits for the held commit: let it land now
        wait_until("the commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
        held.release_held()

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    assert tool(call_id, 7) == first
    releaser.join(STEP_LIMIT)
    assert waiting.is_set()
    assert tool.runs == {call_id: 1}
    assert store.get(call_id).status is Status.COMMITTED  # type: ignore[union-attr]
    store.close()


def test_asyncio_a_replay_in_this_process_waits_for_the_queued_commit(
    held: ChaosProxy, namespace: str
) -> None:
    store = RedisEffectStore(held.url, namespace=namespace, write_behind=True)
    tool = Tool(store)
    call_id = fresh("a")

    async def scenario() -> tuple[Any, Any]:
        first = await tool.acall(call_id, 3)
        await asyncio.to_thread(wait_until, "the commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
        replay = asyncio.ensure_future(tool.acall(call_id, 3))
        await asyncio.sleep(0)
        assert not replay.done()  # the begin waits for the held commit
        held.release_held()
        return first, await asyncio.wait_for(replay, STEP_LIMIT)

    first, again = asyncio.run(scenario())
    assert first == again == {"call": call_id, "cents": 3}
    assert tool.runs == {call_id: 1}
    store.close()


# -- ordering per record ------------------------------------------------------------------------------
class RecordingRedis(redis.Redis):
    """A blocking client that notes the commands of each pipeline it makes (redis-py's public API)."""

    batches: list[list[tuple[Any, ...]]]

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return recorded(super().pipeline(transaction, shard_hint), self.batches)


class RecordingAsyncRedis(aredis.Redis):
    batches: list[list[tuple[Any, ...]]]

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return recorded(super().pipeline(transaction, shard_hint), self.batches)


def begun(store: RedisEffectStore, call_id: str) -> BeginRequest:
    request = BeginRequest(call_id, f"key-{call_id}", "charge", secrets.token_hex(16), False)
    assert store.begin(request).kind is BeginKind.STARTED
    return request


def script_name(command: tuple[Any, ...]) -> str:
    """Which transition script an EVALSHA or EVAL carries."""
    for name in ("commit", "settle"):
        if command[1] in (SHAS[name], script_bytes(name)):
            return name
    return "other"


def check_order(store: RedisEffectStore, batches: list[list[tuple[Any, ...]]], x: str, y: str) -> None:
    """Each record's writes reached the server in the order they were queued (a re-send, as after a
    NOSCRIPT answer, repeats the same write), and no batch carried one record twice."""
    sent = [[c for c in batch if c[0] in ("EVALSHA", "EVAL")] for batch in batches]
    sent = [batch for batch in sent if batch]
    by_key: dict[bytes, list[str]] = {}
    for batch in sent:
        keys = [command[3] for command in batch]
        assert len(keys) == len(set(keys)), f"a batch carried one record twice: {keys}"
        for command in batch:
            writes = by_key.setdefault(command[3], [])
            name = script_name(command)
            if not writes or writes[-1] != name:
                writes.append(name)
    assert by_key == {store.key(x): ["commit", "settle", "commit"], store.key(y): ["commit"]}


def test_writes_of_one_record_never_overtake_each_other(held: ChaosProxy, namespace: str) -> None:
    client = cast(RecordingRedis, RecordingRedis.from_url(held.url, socket_timeout=STEP_LIMIT))
    client.batches = []
    store = RedisEffectStore(client=client, namespace=namespace, write_behind=True)
    x, y = begun(store, fresh("x")), begun(store, fresh("y"))
    assert store.commit(x, 1, b"\x01\x04", None) is TransitionResult.OK  # sent at once, then held
    wait_until("the first commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
    # queued behind it, in this order: x again (settle to unknown), y, x again (commit)
    assert store.settle(x, 1, Settlement.UNKNOWN) is TransitionResult.OK
    assert store.commit(y, 1, b"\x01\x04", None) is TransitionResult.OK
    assert store.commit(x, 1, b"\x01\x04", None) is TransitionResult.OK
    held.release_held()
    assert store.flush(STEP_LIMIT) is True
    check_order(store, client.batches, x.tool_call_id, y.tool_call_id)
    assert status_of(held.url, namespace, x.tool_call_id) is Status.COMMITTED
    assert status_of(held.url, namespace, y.tool_call_id) is Status.COMMITTED
    store.close()


def test_asyncio_writes_of_one_record_never_overtake_each_other(held: ChaosProxy, namespace: str) -> None:
    async_client = cast(
        RecordingAsyncRedis, RecordingAsyncRedis.from_url(held.url, socket_timeout=STEP_LIMIT)
    )
    async_client.batches = []
    store = RedisEffectStore(held.url, async_client=async_client, namespace=namespace, write_behind=True)
    x, y = begun(store, fresh("x")), begun(store, fresh("y"))

    async def scenario() -> None:
        assert await store.acommit(x, 1, b"\x01\x04", None) is TransitionResult.OK
        await asyncio.to_thread(wait_until, "the commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
        assert await store.asettle(x, 1, Settlement.UNKNOWN) is TransitionResult.OK
        assert await store.acommit(y, 1, b"\x01\x04", None) is TransitionResult.OK
        assert await store.acommit(x, 1, b"\x01\x04", None) is TransitionResult.OK
        held.release_held()
        assert await asyncio.wait_for(store.aflush(), STEP_LIMIT) is True
        await async_client.aclose()

    asyncio.run(scenario())
    check_order(store, async_client.batches, x.tool_call_id, y.tool_call_id)
    assert status_of(held.url, namespace, x.tool_call_id) is Status.COMMITTED
    store.close()


# -- a commit that fails after the caller got its value ---------------------------------------------
class Heard:
    """A write-behind listener that keeps what it hears (from the sender's thread or task)."""

    def __init__(self) -> None:
        self.outcomes: list[WriteBehindOutcome] = []
        self._lock = threading.Lock()

    def __call__(self, outcome: WriteBehindOutcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def of(self, call_id: str) -> list[WriteBehindOutcome]:
        with self._lock:
            return [o for o in self.outcomes if o.tool_call_id == call_id]


def listening(store: RedisEffectStore) -> Heard:
    heard = Heard()
    store.add_write_behind_listener(heard)
    return heard


def check_given_up(heard: Heard, call_id: str, error: type[BaseException]) -> None:
    [outcome] = heard.of(call_id)
    assert (outcome.what, outcome.landed, outcome.result) == ("commit", False, None)
    assert isinstance(outcome.error, error), outcome.error


def cut_commits() -> Fault:
    """Every commit's connection is cut before the command reaches the server (every re-send too)."""
    return Fault(is_script("commit"), Action.CUT_BEFORE, times=10_000)


def check_refused_as_in_doubt(tool: Tool, call_id: str, retry: Callable[[], Any]) -> None:
    with pytest.raises(EffectRefused) as refused:
        retry()
    assert refused.value.tool_call_id == call_id
    assert tool.runs == {call_id: 1}


SHORT_WINDOW = 1.0  # RETRY_WINDOW in the tests where Redis never comes back (30 s otherwise)
SYNC_TRIES = 3  # the synchronous path: the first try and tries.RETRIES re-sends


def test_a_commit_that_fails_after_the_value_is_logged_and_the_record_stays_pending(
    redis_server: EmbeddedRedis,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(write_behind, "RETRY_WINDOW", SHORT_WINDOW)
    with ChaosProxy(redis_server.socket_path, [cut_commits()]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        heard = listening(store)
        tool = Tool(store)
        call_id = fresh("c")
        with caplog.at_level(logging.ERROR, logger="airlock_redis"):
            started = time.monotonic()
            assert tool(call_id, 9) == {"call": call_id, "cents": 9}  # the caller has its value
            assert store.flush(STEP_LIMIT) is True  # every try failed: given up
            took = time.monotonic() - started
        # sent again past the synchronous path's tries, until RETRY_WINDOW had passed since the first send
        assert proxy.applied(Action.CUT_BEFORE) > SYNC_TRIES
        assert SHORT_WINDOW <= took < STEP_LIMIT
        check_given_up(heard, call_id, redis.ConnectionError)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("charge" in m and repr(call_id) in m and "write-behind commit failed" in m for m in errors)
        assert status_of(proxy.url, namespace, call_id) is Status.PENDING
        check_refused_as_in_doubt(tool, call_id, lambda: tool(call_id, 9))  # this process
        other = Tool(RedisEffectStore(proxy.url, namespace=namespace))
        with pytest.raises(EffectRefused):  # another process
            other(call_id, 9)
        assert other.runs == {}
        store.close()


def test_asyncio_a_commit_that_fails_after_the_value_leaves_the_record_pending(
    redis_server: EmbeddedRedis,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(write_behind, "RETRY_WINDOW", SHORT_WINDOW)
    with ChaosProxy(redis_server.socket_path, [cut_commits()]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        heard = listening(store)
        tool = Tool(store)
        call_id = fresh("a")

        async def scenario() -> Any:
            value = await tool.acall(call_id, 4)
            assert await asyncio.wait_for(store.aflush(), STEP_LIMIT) is True
            with pytest.raises(EffectRefused):
                await tool.acall(call_id, 4)
            return value

        with caplog.at_level(logging.ERROR, logger="airlock_redis"):
            assert asyncio.run(scenario()) == {"call": call_id, "cents": 4}
        assert proxy.applied(Action.CUT_BEFORE) > SYNC_TRIES
        check_given_up(heard, call_id, redis.ConnectionError)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(
            "acharge" in m and repr(call_id) in m and "write-behind commit failed" in m for m in errors
        )
        assert status_of(proxy.url, namespace, call_id) is Status.PENDING
        assert tool.runs == {call_id: 1}
        store.close()


def test_without_write_behind_a_commit_still_makes_the_synchronous_tries(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    """The longer re-sending is the background sender's alone: a commit the caller waits for fails
    after the synchronous path's tries, as before."""
    with ChaosProxy(redis_server.socket_path, [cut_commits()]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace)
        request = begun(store, fresh("s"))
        with pytest.raises(StoreError):
            store.commit(request, 1, b"\x01\x04", None)
        assert proxy.applied(Action.CUT_BEFORE) == SYNC_TRIES
        store.close()


# -- Redis away for a while: the sender keeps sending ------------------------------------------------
def down_then_back() -> tuple[threading.Event, Fault]:
    """While the event is set, every commit's connection is cut before the command reaches the server
    (the commits find Redis gone); once it is cleared they pass."""
    commit = is_script("commit")
    down = threading.Event()
    down.set()
    return down, Fault(lambda args: down.is_set() and commit(args), Action.CUT_BEFORE, times=10**6)


def more_sends_than_the_synchronous_tries(proxy: ChaosProxy) -> None:
    """Wait until the commit failed more often than the synchronous path tries (the rule before
    RETRY_WINDOW gave it up here)."""
    wait_until("more failed sends", lambda: proxy.applied(Action.CUT_BEFORE) > SYNC_TRIES, STEP_LIMIT)


def test_a_commit_whose_first_sends_fail_lands_once_redis_is_back(
    redis_server: EmbeddedRedis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    down, fault = down_then_back()
    with ChaosProxy(redis_server.socket_path, [fault]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        heard = listening(store)
        tool = Tool(store)
        call_id = fresh("c")
        with caplog.at_level(logging.WARNING, logger="airlock_redis"):
            assert tool(call_id, 6) == {"call": call_id, "cents": 6}
            more_sends_than_the_synchronous_tries(proxy)
            assert store.flush(0) is False  # still queued, not given up
            assert status_of(redis_server.url, namespace, call_id) is Status.PENDING
            down.clear()
            assert store.flush(STEP_LIMIT) is True
        assert [(o.landed, o.result) for o in heard.of(call_id)] == [(True, TransitionResult.OK)]
        assert status_of(redis_server.url, namespace, call_id) is Status.COMMITTED
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert tool(call_id, 6) == {"call": call_id, "cents": 6}  # a replay
        assert tool.runs == {call_id: 1}
        store.close()


def test_asyncio_a_commit_whose_first_sends_fail_lands_once_redis_is_back(
    redis_server: EmbeddedRedis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    down, fault = down_then_back()
    with ChaosProxy(redis_server.socket_path, [fault]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        heard = listening(store)
        tool = Tool(store)
        call_id = fresh("a")

        async def scenario() -> None:
            assert await tool.acall(call_id, 6) == {"call": call_id, "cents": 6}
            await asyncio.to_thread(more_sends_than_the_synchronous_tries, proxy)
            assert await store.aflush(0) is False
            down.clear()
            assert await asyncio.wait_for(store.aflush(), STEP_LIMIT) is True

        with caplog.at_level(logging.WARNING, logger="airlock_redis"):
            asyncio.run(scenario())
        assert [(o.landed, o.result) for o in heard.of(call_id)] == [(True, TransitionResult.OK)]
        assert status_of(redis_server.url, namespace, call_id) is Status.COMMITTED
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert tool.runs == {call_id: 1}
        store.close()


def test_a_write_sent_again_keeps_its_place_before_the_next_write_of_its_record(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    """While a commit is being sent again, the next write of its record waits behind it (and so does
    every later write: one batch at a time); once Redis is back they land in the order queued."""
    down, fault = down_then_back()
    with ChaosProxy(redis_server.socket_path, [fault]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        heard = listening(store)
        x, y = begun(store, fresh("x")), begun(store, fresh("y"))
        assert store.commit(x, 1, b"\x01\x04", None) is TransitionResult.OK
        more_sends_than_the_synchronous_tries(proxy)
        assert store.settle(x, 1, Settlement.UNKNOWN) is TransitionResult.OK  # queued behind it
        assert store.commit(y, 1, b"\x01\x04", None) is TransitionResult.OK
        assert store.flush(0.3) is False and heard.outcomes == []  # nothing overtook the commit of x
        down.clear()
        assert store.flush(STEP_LIMIT) is True
        order = [(o.tool_call_id, o.what) for o in heard.outcomes]
        # the commit of x first; then the settle of x and the commit of y, one batch (either may land
        # first: a NOSCRIPT answer sends one of them again)
        assert order[0] == (x.tool_call_id, "commit")
        assert sorted(order[1:]) == sorted(
            [(x.tool_call_id, "settle to unknown"), (y.tool_call_id, "commit")]
        )
        assert heard.of(x.tool_call_id)[0].result is TransitionResult.OK
        assert status_of(redis_server.url, namespace, x.tool_call_id) is Status.COMMITTED
        store.close()


def test_close_gives_up_a_write_still_being_sent_again_within_its_timeout(
    redis_server: EmbeddedRedis,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close waits CLOSE_TIMEOUT at most, RETRY_WINDOW or not; a write still being sent again then
    gets no more than the synchronous path's tries: it is given up (logged) soon after, not at the
    end of the window."""
    close_timeout = 1.0
    monkeypatch.setattr(redis_store_module, "CLOSE_TIMEOUT", close_timeout)
    with ChaosProxy(redis_server.socket_path, [cut_commits()]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        heard = listening(store)
        tool = Tool(store)
        call_id = fresh("c")
        with caplog.at_level(logging.ERROR, logger="airlock_redis"):
            tool(call_id)
            more_sends_than_the_synchronous_tries(proxy)  # within RETRY_WINDOW (30 s here)
            started = time.monotonic()
            store.close()
            closed_in = time.monotonic() - started
            assert store.flush(STEP_LIMIT) is True
            given_up_in = time.monotonic() - started
        assert closed_in < close_timeout + 0.5
        assert given_up_in < close_timeout + 5.0 < write_behind.RETRY_WINDOW
        check_given_up(heard, call_id, redis.ConnectionError)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(repr(call_id) in m and "write-behind commit failed" in m for m in errors)
        assert status_of(redis_server.url, namespace, call_id) is Status.PENDING


def test_asyncio_run_ending_gives_up_a_write_still_being_sent_again_after_close_timeout(
    redis_server: EmbeddedRedis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of asyncio.run waits for its sender at most CLOSE_TIMEOUT, RETRY_WINDOW or not."""
    monkeypatch.setattr(write_behind, "CLOSE_TIMEOUT", 1.0)
    with ChaosProxy(redis_server.socket_path, [cut_commits()]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        heard = listening(store)
        tool = Tool(store)
        call_id = fresh("a")
        returned = 0.0

        async def scenario() -> None:
            nonlocal returned
            await tool.acall(call_id)
            await asyncio.to_thread(more_sends_than_the_synchronous_tries, proxy)
            returned = time.monotonic()

        asyncio.run(scenario())
        assert time.monotonic() - returned < write_behind.CLOSE_TIMEOUT + 2.0
        check_given_up(heard, call_id, redis.ConnectionError)
        assert status_of(redis_server.url, namespace, call_id) is Status.PENDING
        store.close()


def test_failover_errors_are_sent_again_and_other_errors_are_final() -> None:
    """The sender's rule on its own (no server): a Cluster client's errors while a failover lasts (a
    slot no node serves yet, CLUSTERDOWN, TRYAGAIN, READONLY) are sent again within RETRY_WINDOW, one
    write's error reply in a pipeline too; any other error reply is final."""
    landing = write_behind._Landing([])
    heard = Heard()
    landing.listeners.append(heard)

    def write(call_id: str) -> write_behind.Write:
        key = call_id.encode()
        request = BeginRequest(call_id, f"key-{call_id}", "charge", secrets.token_hex(16), False)
        command = ScriptCommand("commit", key, [b"arg"], False)
        return write_behind.Write(request, "commit", key, command, Tries.blind(), landing.add(key))

    a, b = write("a"), write("b")
    replies: list[Any] = [
        redis.exceptions.SlotNotCoveredError("no node serves the slot yet"),  # raised: the round trip failed
        [redis.exceptions.ClusterDownError("CLUSTERDOWN"), redis.exceptions.TryAgainError("TRYAGAIN")],
        [redis.exceptions.ReadOnlyError("READONLY"), redis.ResponseError("WRONGTYPE")],  # b: final
        [b"ok"],
    ]
    sent: list[int] = []

    def perform(op: Any) -> Any:
        if type(op) is Pause:
            assert 0 <= op.seconds <= write_behind.RETRY_BACKOFF[1]
            return None
        sent.append(len(op.commands))
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    drive(write_behind._sending([a, b], landing), perform)
    assert sent == [2, 2, 2, 1]
    assert [(o.tool_call_id, o.result) for o in heard.outcomes] == [("b", None), ("a", TransitionResult.OK)]
    assert isinstance(heard.outcomes[0].error, redis.ResponseError)
    assert not landing.unfinished


# -- the store's listener: what became of each write ------------------------------------------------
def broken_listener(outcome: WriteBehindOutcome) -> None:
    raise RuntimeError(f"a listener's own bug ({outcome.tool_call_id})")


def another_type_at(url: str, store: RedisEffectStore, call_id: str) -> None:
    """The record's key becomes a hash: the commit script's GET answers WRONGTYPE, an error reply
    (final: the commit is given up)."""
    with redis.Redis.from_url(url) as client:
        key = store.key(call_id)
        client.delete(key)
        client.hset(key, "not", "a record")


def check_heard(
    heard: Heard, landed: str, refused: str, after: str, caplog: pytest.LogCaptureFixture
) -> None:
    [ok] = heard.of(landed)
    assert (ok.what, ok.landed, ok.result, ok.error) == ("commit", True, TransitionResult.OK, None)
    assert ok.request.tool_call_id == landed
    [failed] = heard.of(refused)
    assert (failed.what, failed.landed, failed.result) == ("commit", False, None)
    assert isinstance(failed.error, redis.ResponseError) and "WRONGTYPE" in str(failed.error)
    assert [o.landed for o in heard.of(after)] == [True]  # the sender outlived the broken listener
    broken = [r for r in caplog.records if "listener raised" in r.getMessage()]
    assert len(broken) == 3 and all(r.exc_info for r in broken)  # logged with its traceback, each time


def test_the_listener_hears_a_landed_commit_and_a_given_up_one(
    redis_server: EmbeddedRedis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace, write_behind=True)
    store.add_write_behind_listener(broken_listener)  # raises every time: logged, nothing else
    heard = listening(store)
    tool = Tool(store)
    landed, after = fresh("c"), fresh("c")
    with caplog.at_level(logging.ERROR, logger="airlock_redis"):
        tool(landed)
        assert store.flush(STEP_LIMIT) is True  # the listeners were called before flush heard of it
        refused = begun(store, fresh("w"))
        another_type_at(redis_server.url, store, refused.tool_call_id)
        assert store.commit(refused, 1, b"\x01\x04", None) is TransitionResult.OK  # queued
        assert store.flush(STEP_LIMIT) is True
        tool(after)
        assert store.flush(STEP_LIMIT) is True
    check_heard(heard, landed, refused.tool_call_id, after, caplog)
    assert heard.of(landed)[0].request.tool == "charge"
    store.close()


def test_asyncio_the_listener_hears_a_landed_commit_and_a_given_up_one(
    redis_server: EmbeddedRedis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace, write_behind=True)
    store.add_write_behind_listener(broken_listener)
    heard = listening(store)
    tool = Tool(store)
    landed, after = fresh("a"), fresh("a")
    refused = begun(store, fresh("w"))
    another_type_at(redis_server.url, store, refused.tool_call_id)

    async def scenario() -> None:
        await tool.acall(landed)
        assert await asyncio.wait_for(store.aflush(), STEP_LIMIT) is True
        assert await store.acommit(refused, 1, b"\x01\x04", None) is TransitionResult.OK
        assert await asyncio.wait_for(store.aflush(), STEP_LIMIT) is True
        await tool.acall(after)
        assert await asyncio.wait_for(store.aflush(), STEP_LIMIT) is True

    with caplog.at_level(logging.ERROR, logger="airlock_redis"):
        asyncio.run(scenario())
    check_heard(heard, landed, refused.tool_call_id, after, caplog)
    assert heard.of(landed)[0].request.tool == "acharge"
    store.close()


def test_a_store_without_write_behind_takes_a_listener_and_never_calls_it(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    heard = listening(store)
    Tool(store)(fresh("c"))
    assert heard.outcomes == []
    store.close()


def test_a_release_is_never_deferred(held: ChaosProxy, namespace: str) -> None:
    """A tool that raised a plain error releases its record before the caller sees the error, so a
    retry (here from another process) can run at once; the held commits play no part."""
    store = RedisEffectStore(held.url, namespace=namespace, write_behind=True)
    guard = EffectGuard(store=store)

    @guard.wrap
    def fails() -> None:
        raise ValueError("no effect")

    call_id = fresh("r")
    with tool_call_context(call_id), pytest.raises(ValueError, match="no effect"):
        fails()
    assert status_of(held.url, namespace, call_id) is None
    assert store.flush(0) is True
    store.close()


# -- interpreter exit and fork ------------------------------------------------------------------------
EXITING = textwrap.dedent(
    """
    import sys
    from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context

    url, namespace, *ids = sys.argv[1:]
    store = RedisEffectStore(url, namespace=namespace, write_behind=True)
    guard = EffectGuard(store=store)

    @guard.wrap
    def charge(call):
        return call

    for call_id in ids:
        with tool_call_context(call_id):
            charge(call_id)
    while store._behind.queued() < len(ids):  # every commit is queued (the first held on its way)
        pass
    print("queued", store._behind.queued(), flush=True)
    # no flush, no close: interpreter exit sends what is queued
    """
)


def test_interpreter_exit_sends_the_queued_commits(held: ChaosProxy, namespace: str) -> None:
    """A process that exits without flush or close: its queued commits land (the first is held until
    the process has finished its calls, so the others are still queued when it exits)."""
    ids = [fresh("x") for _ in range(6)]
    with subprocess.Popen(
        [sys.executable, "-c", EXITING, held.url, namespace, *ids],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.split() == ["queued", "6"], line
        wait_until("the first commit to be held", lambda: held.holding() >= 1, STEP_LIMIT)
        held.release_held()  # the process is exiting now: only its exit hook can send the rest
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
    assert [status_of(held.url, namespace, i) for i in ids] == [Status.COMMITTED] * 6


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_forked_child_starts_empty_and_never_sends_the_parents_writes(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    commit = is_script("commit")
    # the parent's first commit is held (its later ones queue behind it); every commit is counted
    hold = Fault(lambda args: commit(args) and b"parent-" in args[3], Action.DELAY, delay=math.inf)
    commits: list[bytes] = []  # the key of every commit that reached the proxy, once per send

    def counted(args: list[bytes]) -> bool:  # notes every commit, applies to none
        if commit(args):
            commits.append(args[3])
        return False

    seen = Fault(counted, Action.DELAY)
    with ChaosProxy(redis_server.socket_path, [seen, hold]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        heard = listening(store)  # kept by the child: it hears the child's writes, never the parent's
        tool = Tool(store)
        parents = [fresh("parent") for _ in range(3)]
        for call_id in parents:
            tool(call_id)
        wait_until("the parent's first commit to be held", lambda: proxy.holding() >= 1, STEP_LIMIT)
        assert store._behind is not None and store._behind.queued() == 3
        child_id = fresh("child")
        pid = os.fork()
        if pid == 0:  # the child: it reports by its exit status only
            code = 1
            try:
                behind = store._behind
                empty = behind.queued() == 0 and behind._thread is None
                tool(child_id)
                flushed = store.flush(STEP_LIMIT)
                own = [(o.tool_call_id, o.landed) for o in heard.outcomes] == [(child_id, True)]
                code = 0 if empty and flushed and own else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert status_of(proxy.url, namespace, child_id) is Status.COMMITTED
        assert [status_of(proxy.url, namespace, i) for i in parents] == [Status.PENDING] * 3
        proxy.release_held()
        assert store.flush(STEP_LIMIT) is True
        assert [status_of(proxy.url, namespace, i) for i in parents] == [Status.COMMITTED] * 3
        assert sorted(o.tool_call_id for o in heard.outcomes if o.landed) == sorted(parents)
        # each commit went out once: the parent's three and the child's own (none sent twice)
        assert sorted(commits) == sorted(store.key(i) for i in [*parents, child_id])
        store.close()
