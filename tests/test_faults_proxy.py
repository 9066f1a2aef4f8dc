"""A chaos TCP proxy between the store and a real redis-server: lost replies, lost requests, cut links.

Once (redis-py re-sends the command on a new connection): the re-sent begin or commit is harmless, the
tool runs once and the caller gets its value; a retry replays it.

Every time (the client gives up): at begin the caller gets a clear refusal (store_unavailable, the tool
did not run); at commit the caller still gets the value. Either way a later retry is refused or
replayed, or runs the tool for the first time: never a second time.

Each case prints what it measured (calls, executions, refusals, replays) and what the proxy did.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from airlock_redis import RedisEffectStore, Status
from airlock_redis.embedded import EmbeddedRedis

from .faults import Action, ChaosProxy, Fault, History, Tools
from .procs import is_script_call

pytestmark = pytest.mark.redis_server

KINDS = ("sync", "async")
TIMEOUT = 0.4  # the proxy's silence becomes a client timeout this fast
ACTIONS = {
    "reply_lost": Action.DROP_REPLY,
    "request_lost": Action.DROP_REQUEST,
    "cut_before": Action.CUT_BEFORE,
    "cut_after": Action.CUT_AFTER,
}
REACHES_SERVER = {Action.DROP_REPLY, Action.CUT_AFTER}  # the server ran the command before the loss


def proxied_store(proxy: ChaosProxy, namespace: str, *, retries: int | None = None) -> RedisEffectStore:
    """A store whose sync and async clients both go through ``proxy`` (redis-py's default retry policy
    unless ``retries`` is given)."""
    sync_options: dict[str, Any] = {"socket_timeout": TIMEOUT, "socket_connect_timeout": TIMEOUT}
    async_options = dict(sync_options)
    if retries is not None:
        sync_options["retry"] = Retry(NoBackoff(), retries)
        async_options["retry"] = AsyncRetry(NoBackoff(), retries)
    return RedisEffectStore(
        namespace=namespace,
        client=redis.Redis(host="127.0.0.1", port=proxy.port, **sync_options),
        async_client=lambda: aredis.Redis(host="127.0.0.1", port=proxy.port, **async_options),
    )


@pytest.fixture
def upstream(redis_server: EmbeddedRedis) -> Iterator[EmbeddedRedis]:
    RedisEffectStore(redis_server.url).load_scripts()  # EVALSHA from the first call: one request per step
    yield redis_server


def measured(history: History, proxy: ChaosProxy, title: str) -> dict[str, Any]:
    result = history.report(title)
    print(
        f"[fault-measure] {title}: proxy applied {proxy.events}, forwarded {dict(proxy.forwarded)}",
        flush=True,
    )
    return result


# -- a single loss: redis-py re-sends ------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("step", ["begin", "commit"])
@pytest.mark.parametrize("fault", list(ACTIONS))
def test_one_lost_or_cut_step_is_resent_harmlessly(
    upstream: EmbeddedRedis, namespace: str, kind: str, step: str, fault: str
) -> None:
    action = ACTIONS[fault]
    rule = Fault(is_script_call(step), action)
    with ChaosProxy(upstream.socket_path, [rule]) as proxy:
        history = History()
        tools = Tools(proxied_store(proxy, namespace), history)
        tool_call_id = f"call-{step}-{fault}-{kind}"
        first = tools.call(tool_call_id, kind=kind)
        assert first.result == "executed", first  # the caller got the tool's value
        assert rule.applied == 1
        assert rule.seen >= 2, "redis-py did not re-send the command"
        if action in REACHES_SERVER:
            # begin (a script, or a SET NX where the key held nothing), commit (EVAL), and the re-sent one
            assert proxy.forwarded["EVALSHA"] + proxy.forwarded["EVAL"] + proxy.forwarded["SET"] >= 3
        retry_same = tools.call(tool_call_id, kind=kind, phase="retry")
        direct = Tools(RedisEffectStore(upstream.url, namespace=namespace), history)
        retry_direct = direct.call(tool_call_id, kind="async" if kind == "sync" else "sync", phase="retry")
        measured(history, proxy, f"{step} {fault} once ({kind})")
    assert (retry_same.result, retry_direct.result) == ("replayed", "replayed")
    assert history.runs[tool_call_id] == 1
    record = direct.store.get(tool_call_id)
    assert record is not None and (record.status, record.attempt) == (Status.COMMITTED, 1)


# -- the loss lasts: the client gives up -----------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", list(ACTIONS))
def test_begin_that_never_gets_through_refuses_and_never_runs_twice(
    upstream: EmbeddedRedis, namespace: str, kind: str, fault: str
) -> None:
    action = ACTIONS[fault]
    rule = Fault(is_script_call("begin"), action, times=1000)
    tool_call_id = f"call-begin-always-{fault}-{kind}"
    history = History()
    with ChaosProxy(upstream.socket_path, [rule]) as proxy:
        tools = Tools(proxied_store(proxy, namespace, retries=1), history)
        first = tools.call(tool_call_id, kind=kind)
        assert first.result == "refused:store_unavailable", first
        assert "did not run" in first.detail
        assert history.runs[tool_call_id] == 0
        # the first send and redis-py's one re-send (on a loaded machine the re-send's connect may
        # time out before it reaches the proxy); never more: the store adds no re-sends of its own
        # to those of a client it was given
        assert 1 <= rule.applied <= 2
    # the link is back (another process, or the same one later): the retry never runs the tool twice
    direct = Tools(RedisEffectStore(upstream.url, namespace=namespace), history)
    retry = direct.call(tool_call_id, kind=kind, phase="retry")
    again = direct.call(tool_call_id, kind=kind, phase="retry")
    measured(history, proxy, f"begin {fault} every time ({kind})")
    # Whether or not the begin reached the server, the guard took back what its attempt might hold
    # (a release fenced by the attempt's token): the retry is the first execution, the next replays.
    assert (retry.result, again.result) == ("executed", "replayed")
    assert history.runs[tool_call_id] == 1
    if action in REACHES_SERVER:
        # begin (sent twice: a script, or the SET NX it tries first) and the guard's release (EVAL)
        assert proxy.forwarded["EVALSHA"] + proxy.forwarded["EVAL"] + proxy.forwarded["SET"] >= 3
    assert history.runs[tool_call_id] <= 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", list(ACTIONS))
def test_commit_that_never_gets_through_returns_the_value_and_never_runs_twice(
    upstream: EmbeddedRedis, namespace: str, kind: str, fault: str
) -> None:
    action = ACTIONS[fault]
    rule = Fault(is_script_call("commit"), action, times=1000)
    tool_call_id = f"call-commit-always-{fault}-{kind}"
    history = History()
    with ChaosProxy(upstream.socket_path, [rule]) as proxy:
        tools = Tools(proxied_store(proxy, namespace, retries=1), history)
        first = tools.call(tool_call_id, kind=kind)
        assert first.result == "executed", first  # the value reached the caller though the commit failed
        assert rule.applied == 2
        retry_proxied = tools.call(tool_call_id, kind=kind, phase="retry")  # begin still gets through
    direct = Tools(RedisEffectStore(upstream.url, namespace=namespace), history)
    retry_direct = direct.call(tool_call_id, kind=kind, phase="retry")
    measured(history, proxy, f"commit {fault} every time ({kind})")
    record = direct.store.get(tool_call_id)
    assert record is not None
    if action in REACHES_SERVER:
        # the commit ran on the server: the retries replay the stored value
        assert record.status is Status.COMMITTED
        assert (retry_proxied.result, retry_direct.result) == ("replayed", "replayed")
    else:
        # no commit reached the server: the record stays pending and the retries are refused; its
        # lease, which nobody renews any more, still runs (60 s), so they are told it is in progress
        assert record.status is Status.PENDING and record.liveness == "running"
        assert {retry_proxied.result, retry_direct.result} == {"refused:effect_in_progress"}
    assert history.runs[tool_call_id] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_link_cut_while_the_tool_runs_the_commit_reconnects(
    upstream: EmbeddedRedis, namespace: str, kind: str
) -> None:
    history = History()
    with ChaosProxy(upstream.socket_path) as proxy:
        cuts: list[int] = []
        tools = Tools(proxied_store(proxy, namespace), history, during=lambda _: cuts.append(proxy.cut_all()))
        tool_call_id = f"call-cut-mid-{kind}"
        first = tools.call(tool_call_id, kind=kind)
        retry = tools.call(tool_call_id, kind=kind, phase="retry")
        measured(history, proxy, f"link cut while the tool runs ({kind})")
    assert first.result == "executed" and retry.result == "replayed"
    assert cuts and cuts[0] >= 1  # a live connection was cut mid-call
    assert history.runs[tool_call_id] == 1
    record = RedisEffectStore(upstream.url, namespace=namespace).get(tool_call_id)
    assert record is not None and record.status is Status.COMMITTED
