"""Write-behind commits (issue 27, item 2), on a real redis-server, blocking and asyncio.

The caller gets its value before the commit lands; the commit is sent by the store's background sender,
in order per record, and flushed by ``flush``/``close``, at interpreter exit, and when ``asyncio.run``
ends. A commit that fails after the caller got its value is logged at ERROR (naming the tool and the
call) and leaves the record pending: a retry is refused, the tool never runs again. After ``fork`` the
child starts with nothing queued and never sends the parent's writes; its own writes land.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import redis.asyncio as aredis

from airlock_redis import EffectGuard, EffectRefused, RedisEffectStore, Status, tool_call_context
from airlock_redis.core.records import BeginKind, BeginRequest, Settlement, TransitionResult
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import write_behind
from airlock_redis.stores.script_args import SHAS
from airlock_redis.stores.scripts import script_bytes
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
def cut_commits() -> Fault:
    """Every commit's connection is cut before the command reaches the server (every re-send too)."""
    return Fault(is_script("commit"), Action.CUT_BEFORE, times=10_000)


def check_refused_as_in_doubt(tool: Tool, call_id: str, retry: Callable[[], Any]) -> None:
    with pytest.raises(EffectRefused) as refused:
        retry()
    assert refused.value.tool_call_id == call_id
    assert tool.runs == {call_id: 1}


def test_a_commit_that_fails_after_the_value_is_logged_and_the_record_stays_pending(
    redis_server: EmbeddedRedis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with ChaosProxy(redis_server.socket_path, [cut_commits()]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
        tool = Tool(store)
        call_id = fresh("c")
        with caplog.at_level(logging.ERROR, logger="airlock_redis"):
            assert tool(call_id, 9) == {"call": call_id, "cents": 9}  # the caller has its value
            assert store.flush(STEP_LIMIT) is True  # every try failed: given up
        assert proxy.applied(Action.CUT_BEFORE) == 3  # the first try and RETRIES re-sends, as the sync path
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
    redis_server: EmbeddedRedis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with ChaosProxy(redis_server.socket_path, [cut_commits()]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, write_behind=True)
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
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(
            "acharge" in m and repr(call_id) in m and "write-behind commit failed" in m for m in errors
        )
        assert status_of(proxy.url, namespace, call_id) is Status.PENDING
        assert tool.runs == {call_id: 1}
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
                code = 0 if empty and store.flush(STEP_LIMIT) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert status_of(proxy.url, namespace, child_id) is Status.COMMITTED
        assert [status_of(proxy.url, namespace, i) for i in parents] == [Status.PENDING] * 3
        proxy.release_held()
        assert store.flush(STEP_LIMIT) is True
        assert [status_of(proxy.url, namespace, i) for i in parents] == [Status.COMMITTED] * 3
        # each commit went out once: the parent's three and the child's own (none sent twice)
        assert sorted(commits) == sorted(store.key(i) for i in [*parents, child_id])
        store.close()
