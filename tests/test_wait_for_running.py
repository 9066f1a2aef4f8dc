"""Waiting for a live call (issue 25, part 2): a call whose id is held by a running attempt waits
for it (``EffectGuard(wait_for_running=...)``), woken by a push from the attempt's end, then gets
what the replay table gives for what it finds: the value, the in-doubt refusal, or a run.

On the in-memory store and a real redis-server (one pub/sub connection per store, whatever the
number of waiters), then on a 3-primary Cluster (published on one node, listened to on another) and
through Sentinel.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectInProgress,
    EffectStatusUnknown,
    InMemoryEffectStore,
    RedisEffectStore,
    Status,
    reversibility,
)
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import layout

from .topo_helpers import fresh_id
from .topologies import shared_cluster, shared_sentinel, wait_until

LEASE = 2.0


class Tools:
    """A charge tool (sync, and async under the same name) whose runs are counted and whose body
    waits for the test to let it go."""

    def __init__(self) -> None:
        self.runs: list[int] = []
        self.started = threading.Event()
        self.go = threading.Event()
        self.raise_: BaseException | None = None

        def charge(cents: int) -> dict[str, int]:
            self.runs.append(cents)
            self.started.set()
            assert self.go.wait(30)
            if self.raise_ is not None:
                raise self.raise_
            return {"charged": cents}

        async def acharge(cents: int) -> dict[str, int]:
            return await asyncio.to_thread(charge, cents)

        self.charge = _named(charge)
        self.acharge = _named(acharge)


def _named(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = "charge"
    return fn


class CountingBegins:
    """Counts the begins a store is sent (a wait must not poll): the Redis store's begin plans (its
    begin, and the begin after a wait), the in-memory store's begins."""

    def __init__(self, store: Any) -> None:
        self.count = 0
        name = "_beginning" if isinstance(store, RedisEffectStore) else "begin"
        original = getattr(store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(*args, **kwargs)

        setattr(store, name, counted)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemoryEffectStore()
        return
    server: EmbeddedRedis = request.getfixturevalue("redis_server")
    rstore = RedisEffectStore(server.url, namespace=f"wait:{fresh_id()}")
    yield rstore
    rstore.close()


def _guard(store: Any, wait: float = 5.0) -> EffectGuard:
    return EffectGuard(store=store, lease=LEASE, renew_every=LEASE / 4, wait_for_running=wait)


def _first_running(guard: EffectGuard, tools: Tools, tool_call_id: str) -> tuple[threading.Thread, list[Any]]:
    """Start the first attempt in a thread; return once its tool body runs."""
    out: list[Any] = []

    def first() -> None:
        try:
            out.append(guard.call(tool_call_id, tools.charge, 5))
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert tools.started.wait(10)
    return thread, out


def _let_go_after(tools: Tools, seconds: float) -> None:
    threading.Timer(seconds, tools.go.set).start()


def test_a_duplicate_during_the_call_gets_its_value(store: Any) -> None:
    """The issue's case: a second call 0.1 s into a 0.5 s tool gets the value, not a refusal, and the
    tool ran once. The waiter is woken by the end, not by polling: it begins twice in all."""
    guard, tools = _guard(store), Tools()
    thread, out = _first_running(guard, tools, "dup-1")
    begins = CountingBegins(store)
    _let_go_after(tools, 0.4)
    assert guard.call("dup-1", tools.charge, 5) == {"charged": 5}
    thread.join(10)
    assert out == [{"charged": 5}] and tools.runs == [5]
    assert begins.count == 2  # the first look, and the one after the push


def test_an_async_duplicate_waits_too(store: Any) -> None:
    guard, tools = _guard(store), Tools()
    thread, _ = _first_running(guard, tools, "dup-async")

    async def duplicate() -> Any:
        async def charge(cents: int) -> dict[str, int]:
            raise AssertionError("a live call is never run beside itself")

        _let_go_after(tools, 0.3)
        return await guard.acall("dup-async", _named(charge), 5)

    assert asyncio.run(duplicate()) == {"charged": 5}
    thread.join(10)
    assert tools.runs == [5]


@pytest.mark.parametrize("reversible", [False, True], ids=["irreversible", "reversible"])
def test_a_released_attempt_lets_the_waiter_run(store: Any, reversible: bool) -> None:
    guard, tools = _guard(store), Tools()
    tools.raise_ = ValueError("declined: nothing happened")
    thread, out = _first_running(guard, tools, "rel-1")

    def again(cents: int) -> str:
        return "ran after the release"

    again = reversibility("reversible")(again) if reversible else again
    _let_go_after(tools, 0.3)
    assert guard.call("rel-1", _named(again), 5) == "ran after the release"
    thread.join(10)
    assert isinstance(out[0], ValueError)
    assert store.get("rel-1").status is Status.COMMITTED


def test_an_attempt_that_ends_in_doubt_refuses_the_waiter(store: Any) -> None:
    guard, tools = _guard(store), Tools()
    tools.raise_ = TimeoutError("the bank did not answer")
    thread, _ = _first_running(guard, tools, "doubt-1")
    _let_go_after(tools, 0.3)
    with pytest.raises(EffectStatusUnknown):
        guard.call("doubt-1", tools.charge, 5)
    thread.join(10)
    assert tools.runs == [5]


def test_an_operators_verdict_wakes_the_waiter(store: Any) -> None:
    guard, tools = _guard(store), Tools()
    thread, _ = _first_running(guard, tools, "op-1")
    record = store.get("op-1")

    def resolve() -> None:
        time.sleep(0.3)
        guard.resolve("op-1", "unknown", seen=record)

    threading.Thread(target=resolve).start()
    with pytest.raises(EffectStatusUnknown):
        guard.call("op-1", tools.charge, 5)
    tools.go.set()
    thread.join(10)


def test_still_running_at_the_end_of_the_wait_is_in_progress(store: Any) -> None:
    guard, tools = _guard(store, wait=0.3), Tools()
    thread, _ = _first_running(guard, tools, "slow-1")
    try:
        with pytest.raises(EffectInProgress) as refused:
            guard.call("slow-1", tools.charge, 5)
    finally:
        tools.go.set()
        thread.join(10)
    assert (
        "still running" in refused.value.model_message and "same tool call id" in refused.value.model_message
    )
    assert "resolve" not in refused.value.fix_hint and tools.runs == [5]
    # with no wait at all: refused at once, the same way
    tools2 = Tools()
    no_wait = _guard(store, wait=0)
    thread2, _ = _first_running(no_wait, tools2, "slow-2")
    try:
        with pytest.raises(EffectInProgress):
            no_wait.call("slow-2", tools2.charge, 5)
    finally:
        tools2.go.set()
        thread2.join(10)


def test_a_cancelled_async_waiter_leaves_nothing_behind(redis_server: EmbeddedRedis) -> None:
    rstore = RedisEffectStore(redis_server.url, namespace=f"wait:{fresh_id()}")
    guard, tools = _guard(rstore), Tools()
    thread, _ = _first_running(guard, tools, "cancel-1")
    channel = rstore.key("cancel-1")

    async def cancel_a_waiter() -> None:
        task = asyncio.ensure_future(guard.acall("cancel-1", tools.acharge, 5))
        for _ in range(100):
            if _waited_for(rstore, "cancel-1"):
                break
            await asyncio.sleep(0.05)
        assert _waited_for(rstore, "cancel-1") and _numsub(rstore, channel) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_a_waiter())
    wait_until("unsubscribed", lambda: _numsub(rstore, channel) == 0 or None, 5)
    record = rstore.get("cancel-1")
    assert record is not None and record.attempt == 1 and record.liveness == "running"
    tools.go.set()
    thread.join(10)
    assert tools.runs == [5] and rstore.get("cancel-1").status is Status.COMMITTED  # type: ignore[union-attr]


def _numsub(rstore: RedisEffectStore, channel: bytes) -> int:
    return int(dict(rstore.client.pubsub_numsub(channel)).get(channel, 0))


def _waited_for(rstore: RedisEffectStore, tool_call_id: str) -> bool:
    """The record's flag that a call waits for its attempt (layout b)."""
    raw = rstore.client.get(rstore.key(tool_call_id))
    return isinstance(raw, bytes) and layout.parse(raw).waited


def test_many_waiters_share_one_connection(redis_server: EmbeddedRedis) -> None:
    """200 waiters in one process: one pub/sub connection and one subscription; after the end the
    subscription is gone."""
    rstore = RedisEffectStore(redis_server.url, namespace=f"wait:{fresh_id()}")
    guard, tools = _guard(rstore), Tools()
    thread, _ = _first_running(guard, tools, "many-1")
    channel = rstore.key("many-1")
    listener = rstore._listener()

    async def many() -> list[Any]:
        calls = [guard.acall("many-1", tools.acharge, 5) for _ in range(200)]
        gathered = asyncio.gather(*calls, return_exceptions=True)
        for _ in range(200):
            if listener.waiting == 200:
                break
            await asyncio.sleep(0.05)
        waiting = listener.waiting
        await asyncio.sleep(0.2)  # every waiter has flagged the record by now
        pubsub = rstore.client.client_list(_type="pubsub")
        subscribed = _numsub(rstore, channel)
        tools.go.set()
        return [waiting, len(pubsub), subscribed, await gathered]

    waiting, connections, subscribed, results = asyncio.run(many())
    thread.join(10)
    assert waiting == 200 and connections == 1 and subscribed == 1
    assert results == [{"charged": 5}] * 200 and tools.runs == [5]
    wait_until("unsubscribed", lambda: _numsub(rstore, channel) == 0 or None, 5)


def test_a_lost_pubsub_connection_still_wakes_the_waiter(redis_server: EmbeddedRedis) -> None:
    rstore = RedisEffectStore(redis_server.url, namespace=f"wait:{fresh_id()}")
    guard, tools = _guard(rstore), Tools()
    thread, _ = _first_running(guard, tools, "killed-sub")
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(guard.call("killed-sub", tools.charge, 5)))
    waiter.start()
    wait_until("the waiter registered", lambda: _waited_for(rstore, "killed-sub") or None, 5)
    admin = redis_server.client()
    assert admin.client_kill_filter(_type="pubsub") >= 1
    time.sleep(0.3)
    tools.go.set()
    waiter.join(15)
    thread.join(10)
    assert result == [{"charged": 5}] and tools.runs == [5]


KILLED_OWNER = textwrap.dedent(
    """
    import sys, time
    from airlock_redis import EffectGuard, RedisEffectStore
    url, namespace, tool_call_id = sys.argv[1], sys.argv[2], sys.argv[3]
    guard = EffectGuard(store=RedisEffectStore(url, namespace=namespace), lease=1.5, renew_every=0.5)

    def charge(cents):
        print("started", flush=True)
        time.sleep(60)

    guard.call(tool_call_id, charge, 5)
    """
)


def test_a_waiter_notices_an_owner_killed_mid_tool(redis_server: EmbeddedRedis) -> None:
    """No push comes from a dead owner: the waiter looks again when the lease would lapse and finds
    the call abandoned (irreversible: in doubt, refused)."""
    rstore = RedisEffectStore(redis_server.url, namespace=f"wait:{fresh_id()}")
    owner = subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER, redis_server.url, rstore.namespace, "dead-owner"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "started"
        guard = EffectGuard(store=rstore, lease=1.5, renew_every=0.5, wait_for_running=10)
        threading.Timer(0.2, owner.kill).start()

        def charge(cents: int) -> str:
            raise AssertionError("an abandoned irreversible call is not run again")

        with pytest.raises(EffectStatusUnknown, match="abandoned"):
            guard.call("dead-owner", _named(charge), 5)
    finally:
        owner.kill()
        owner.wait(10)


def _wait_on_topology(url: str) -> None:
    rstore = RedisEffectStore(url, namespace=f"wait:{fresh_id()}")
    guard = _guard(rstore)
    for i in range(4):  # ids over several slots: several nodes of a Cluster
        tools = Tools()
        tool_call_id = fresh_id(f"topo-{i}")
        thread, _ = _first_running(guard, tools, tool_call_id)
        _let_go_after(tools, 0.3)
        assert guard.call(tool_call_id, tools.charge, 5) == {"charged": 5}
        thread.join(10)
        assert tools.runs == [5]


@pytest.mark.redis_server
def test_waiting_on_a_cluster(pytestconfig: pytest.Config) -> None:
    _wait_on_topology(shared_cluster(pytestconfig).url)


@pytest.mark.redis_server
def test_waiting_through_sentinel(pytestconfig: pytest.Config) -> None:
    _wait_on_topology(shared_sentinel(pytestconfig).url)


# -- the listener across fork and at exit ----------------------------------------------------------------
def test_a_child_forked_while_calls_wait_starts_with_no_listener_thread(redis_server: EmbeddedRedis) -> None:
    """The child drops the inherited pub/sub connection without closing it (the parent's waiters
    still get woken through it) and starts with no waiter and no thread; its own waits work."""
    import os
    import warnings

    rstore = RedisEffectStore(redis_server.url, namespace=f"wait:{fresh_id()}")
    guard, tools = _guard(rstore), Tools()
    thread, _ = _first_running(guard, tools, "fork-1")
    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(guard.call("fork-1", tools.charge, 5)))
    waiter.start()
    wait_until("the waiter registered", lambda: _waited_for(rstore, "fork-1") or None, 5)
    listener = rstore._listener()
    assert listener.waiting == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fresh = listener.waiting == 0 and listener._thread is None and listener._pubsub is None
            child_tools = Tools()
            child_thread, _ = _first_running(guard, child_tools, "fork-child")
            threading.Timer(0.3, child_tools.go.set).start()
            ok = guard.call("fork-child", child_tools.charge, 5) == {"charged": 5}
            child_thread.join(10)
            code = 0 if fresh and ok and child_tools.runs == [5] else 3
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    tools.go.set()  # the parent's waiter is still woken through its own connection
    waiter.join(15)
    thread.join(10)
    assert result == [{"charged": 5}] and tools.runs == [5]


EXIT_WHILE_WAITING = textwrap.dedent(
    """
    import sys, threading, time
    from airlock_redis import EffectGuard, RedisEffectStore, reconcile_with
    url, namespace = sys.argv[1], sys.argv[2]
    store = RedisEffectStore(url, namespace=namespace)
    guard = EffectGuard(store=store, wait_for_running=60, probe_timeout=60)
    started = threading.Event()

    def stuck(cents):
        started.set()
        time.sleep(3600)

    def waiting():
        guard.call("exit-1", stuck, 1)

    def hung_probe(call):
        time.sleep(3600)

    def probed(cents):
        raise TimeoutError("in doubt: the probe is asked, and hangs")

    threading.Thread(target=lambda: guard.call("exit-1", stuck, 1), daemon=True).start()
    started.wait(10)
    threading.Thread(target=waiting, daemon=True).start()  # waits for the stuck call
    probing = reconcile_with(hung_probe)(probed)
    threading.Thread(target=lambda: guard.call("exit-2", probing, 1), daemon=True).start()
    time.sleep(1.0)
    print("exiting", flush=True)
    """
)


def test_exit_with_a_waiter_and_a_hung_probe_is_not_held_up(redis_server: EmbeddedRedis) -> None:
    """A process that exits while a call waits for a running attempt and a probe hangs exits at once
    (the listener is stopped at exit, the probe runs on a daemon thread): bounded by the test's
    subprocess timeout, not measured."""
    rstore = RedisEffectStore(redis_server.url, namespace=f"wait:{fresh_id()}")
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WHILE_WAITING, redis_server.url, rstore.namespace],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr
    assert rstore.get("exit-1").status is Status.PENDING  # type: ignore[union-attr]  # left to lapse
