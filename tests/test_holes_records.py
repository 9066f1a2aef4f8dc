"""Records that must never be lost or left stuck, on a real redis-server (issue 10: the holes an
adversarial review found). Each test fails on the code before the fix and names the case it proves.

- case 3: an operator's verdict applies only to the record the operator was shown;
- case 4: a tool that outlives its pending TTL still leaves "committed" behind;
- case 5: whatever fails after the tool returned (encoding included) ends committed, not stored;
- case 9: absurd TTLs are refused at construction, and no script can write a record without a TTL;
- also: a hash of unrelated fields, or a malformed attempt, is corrupt (the tool does not run); a
  dropped connection at begin or at commit through a URL-built store is re-sent, not refused.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    InMemoryEffectStore,
    RedisEffectStore,
    Settlement,
    Status,
    StoreError,
    TransitionResult,
    idempotency_key,
    tool_call_context,
)
from airlock_redis.core.codec import decode_result
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import BeginRequest, layout
from airlock_redis.stores.script_args import SHAS
from airlock_redis.stores.scripts import script_source
from tests.faults import Action, ChaosProxy, Fault
from tests.procs import is_script_call

pytestmark = pytest.mark.redis_server


@pytest.fixture
def rstore(redis_server: EmbeddedRedis, namespace: str) -> Iterator[RedisEffectStore]:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    yield store
    store.close()


# -- case 3: resolve is fenced on the record the operator was shown ---------------------------------
def _pending(store: RedisEffectStore, tool_call_id: str) -> BeginRequest:
    request = BeginRequest(tool_call_id, idempotency_key("charge", {"cents": 5}), "charge", "tok-a", False)
    assert store.begin(request).kind.value == "started"
    return request


def test_a_release_decided_on_a_pending_record_does_not_delete_it_once_committed(
    rstore: RedisEffectStore,
) -> None:
    request = _pending(rstore, "r-1")
    guard = EffectGuard(rstore)
    seen = rstore.get("r-1")
    assert seen is not None and seen.status is Status.PENDING
    assert rstore.commit(request, 1, b"\x01paid", None) is TransitionResult.OK  # the tool committed meanwhile
    assert guard.resolve("r-1", "release", seen=seen) is TransitionResult.CHANGED
    record = rstore.get("r-1")
    assert record is not None and record.status is Status.COMMITTED  # untouched
    with pytest.raises(ValueError, match="seen="):
        guard.resolve("r-1", "release")  # an unfenced verdict must be asked for
    assert guard.resolve("r-1", "unknown", force=True) is TransitionResult.OK


def test_a_verdict_on_a_record_taken_over_by_another_attempt_is_refused(rstore: RedisEffectStore) -> None:
    _pending(rstore, "r-2")
    seen = rstore.get("r-2")
    assert seen is not None
    later = BeginRequest("r-2", seen.idempotency_key, "charge", "tok-b", True)
    assert rstore.begin(later).attempt == 2  # a reversible retry took it over
    assert EffectGuard(rstore).resolve("r-2", "release", seen=seen) is TransitionResult.CHANGED
    record = rstore.get("r-2")
    assert record is not None and record.owner == "tok-b"


def test_resolve_resent_after_a_lost_reply_answers_ok(redis_server: EmbeddedRedis, namespace: str) -> None:
    """redis-py re-sends the verdict when its reply is lost: the second copy finds its own verdict."""
    direct = RedisEffectStore(redis_server.url, namespace=namespace)
    _pending(direct, "r-3")
    seen = direct.get("r-3")
    with ChaosProxy(redis_server.socket_path, [Fault(is_script_call("resolve"), Action.CUT_AFTER)]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, socket_timeout=2)
        store.load_scripts()
        assert EffectGuard(store).resolve("r-3", "release", seen=seen) is TransitionResult.OK
        assert proxy.applied(Action.CUT_AFTER) == 1
        store.close()
    assert direct.get("r-3") is None


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "airlock_redis", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _read_until(stream: Any, marker: str, limit: float = 30.0) -> str:
    seen = ""
    deadline = time.monotonic() + limit
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} in {seen!r}"
        char = stream.read(1)
        assert char, f"the command ended before {marker!r}: {seen!r}"
        seen += char
    return seen


def test_cli_release_confirmed_after_the_tool_committed_is_refused_with_its_own_exit_code(
    redis_server: EmbeddedRedis, namespace: str, tmp_path: Any
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    request = _pending(store, "r-cli")
    audit = str(tmp_path / "audit.jsonl")
    base = ["--url", redis_server.url, "--namespace", namespace, "--audit-log", audit]
    process = _cli("resolve", "r-cli", "--release", *base)
    assert process.stderr is not None and process.stdin is not None
    _read_until(process.stderr, "[y/N]")  # the operator is looking at a pending record
    assert store.commit(request, 1, b"\x01paid", None) is TransitionResult.OK  # the tool commits
    process.stdin.write("y\n")
    process.stdin.flush()
    out, err = process.communicate(timeout=60)
    assert process.returncode == 7, (out, err)
    assert "changed after it was shown" in err
    record = store.get("r-cli")
    assert record is not None and record.status is Status.COMMITTED

    forced = _cli("resolve", "r-cli", "--unknown", "--yes", "--force", *base)
    out, err = forced.communicate(timeout=60)
    assert forced.returncode == 0, (out, err)
    record = store.get("r-cli")
    assert record is not None and record.status is Status.UNKNOWN
    store.close()


# -- case 4: a tool that outlives its pending TTL ----------------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_that_outlives_its_pending_ttl_still_leaves_committed(
    redis_server: EmbeddedRedis, namespace: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace, pending_ttl=0.2)
    guard = EffectGuard(store)
    runs: list[int] = []

    def charge(cents: int) -> dict[str, int]:
        runs.append(cents)
        deadline = time.monotonic() + 5
        while store.client.exists(store.key("slow-1")):  # the pending record expires while it runs
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return {"charged": cents}

    async def acharge(cents: int) -> dict[str, int]:
        return charge(cents)

    tool: Any = guard.wrap(charge) if kind == "sync" else guard.wrap(acharge)

    def call() -> Any:
        with tool_call_context("slow-1"):
            result = tool(5)
            if kind == "async":
                import asyncio

                return asyncio.run(result)
            return result

    with caplog.at_level(logging.WARNING, logger="airlock_redis"):
        assert call() == {"charged": 5}
    assert any("pending TTL" in r.getMessage() for r in caplog.records)
    record = store.get("slow-1")
    assert record is not None and record.status is Status.COMMITTED
    assert call() == {"charged": 5}  # the retry replays
    assert runs == [5]


# -- case 5: a failure after the tool returned ----------------------------------------------------
@dataclasses.dataclass
class Receipt:
    amount: int
    token: str = dataclasses.field(init=False)  # never set: reading it raises AttributeError


class Moody(dict[str, Any]):
    """A mapping whose attribute reads raise KeyError (as some attribute-dict libraries do)."""

    def __getattr__(self, name: str) -> Any:
        raise KeyError(name)

    def __iter__(self) -> Any:
        raise KeyError("iteration")


@pytest.mark.parametrize("result", [Receipt(5), Moody(a=1)], ids=["dataclass-init-false", "keyerror-mapping"])
def test_a_result_whose_encoding_raises_ends_committed_not_stored(
    rstore: RedisEffectStore, result: Any
) -> None:
    runs: list[int] = []

    @EffectGuard(rstore).wrap
    def charge(cents: int) -> Any:
        runs.append(cents)
        return result

    with tool_call_context("enc-1"):
        assert charge(5) is result  # the caller gets its value
    record = rstore.get("enc-1")
    assert record is not None and record.status is Status.COMMITTED
    with tool_call_context("enc-1"):
        if record.stored:  # the mapping's items encode: its value replays
            assert charge(5) == dict(result)
        else:
            with pytest.raises(EffectRefused) as refused:
                charge(5)
            assert refused.value.reason == "result_not_stored"
    assert runs == [5]


# -- case 9: TTL bounds --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 1e16, 0, -1, 0.0001, True, "60"])
@pytest.mark.parametrize("option", ["committed_ttl", "pending_ttl", "unknown_ttl"])
def test_absurd_ttls_are_refused_at_construction(option: str, bad: Any) -> None:
    for make in (InMemoryEffectStore, lambda **kw: RedisEffectStore("redis://127.0.0.1:1/0", **kw)):
        with pytest.raises(ValueError, match=option):
            make(**{option: bad})


def test_wait_timeout_inf_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="wait_timeout"):
        RedisEffectStore("redis://127.0.0.1:1/0", wait_replicas=1, wait_timeout=float("inf"))


@pytest.mark.parametrize("ttl", ["1e16", "inf", "nan", "0", "-5", "1.5", "x"])
def test_no_script_writes_a_record_it_cannot_expire(rstore: RedisEffectStore, ttl: str) -> None:
    client = rstore.client
    key = rstore.key("ttl-1")
    begin = ("k" * 64, "charge", "tok", "0", ttl, 1)
    with pytest.raises(redis.ResponseError, match="TTL out of range"):
        client.eval(script_source("begin"), 1, key, *begin)
    assert client.exists(key) == 0
    commit = ("tok", "1", b"v", b"", ttl, 1, "k" * 64, "charge", 1)
    with pytest.raises(redis.ResponseError, match="TTL out of range"):
        client.eval(script_source("commit"), 1, key, *commit)
    assert client.exists(key) == 0
    settle = ("tok", "unknown", ttl, "k" * 64, "charge", 1, 60_000)
    with pytest.raises(redis.ResponseError, match="TTL out of range"):
        client.eval(script_source("settle"), 1, key, *settle)
    assert client.exists(key) == 0


def test_every_record_the_guard_writes_has_a_ttl(rstore: RedisEffectStore) -> None:
    guard = EffectGuard(rstore)

    @guard.wrap
    def charge(cents: int) -> int:
        if cents < 0:
            raise TimeoutError("lost")
        return cents

    with tool_call_context("ttl-c"):
        charge(1)
    with tool_call_context("ttl-u"), pytest.raises(TimeoutError):
        charge(-1)
    with tool_call_context("ttl-r"), pytest.raises(ZeroDivisionError):
        guard.wrap(lambda: 1 / 0, name="boom")()
    keys = list(rstore.client.scan_iter(match=f"{rstore.namespace}:*"))
    assert len(keys) == 3  # committed, unknown, and the release's tombstone
    assert all(rstore.client.pttl(k) > 0 for k in keys)


# -- also: strings (and a hash) that are not records -----------------------------------------------
def _header(status: str, attempt: str) -> bytes:
    """A record's string as the layout spells it, with ``attempt`` as given (K: the call's key)."""
    key = layout.pack_key(idempotency_key("charge", {"cents": 5}))
    return b"a%s,%s,1,,0,1,%d,6,0,0;o%scharge" % (status.encode(), attempt.encode(), len(key), key)


@pytest.mark.parametrize(
    "content",
    [
        b"foo",
        _header("p", "nan"),
        _header("u", "1e308"),
        _header("c", "-1"),
        _header("u", "1234567890"),
        {"foo": "bar"},
    ],
    ids=[
        "unrelated-bytes",
        "attempt-nan",
        "attempt-1e308",
        "attempt-negative",
        "attempt-10-digits",
        "a-hash",
    ],
)
def test_a_string_that_is_not_a_record_is_corrupt_and_the_tool_does_not_run(
    rstore: RedisEffectStore, content: bytes | dict[str, str]
) -> None:
    runs: list[int] = []

    @EffectGuard(rstore).wrap
    def charge(cents: int) -> int:
        runs.append(cents)
        return cents

    key = rstore.key("bad-1")
    assert layout.parse(_header("u", "1")).key_text == idempotency_key("charge", {"cents": 5})
    if isinstance(content, dict):
        rstore.client.hset(key, mapping=content)  # type: ignore[arg-type]
    else:
        with pytest.raises(layout.LayoutError):
            layout.parse(content)
        rstore.client.set(key, content)
    with tool_call_context("bad-1"), pytest.raises(EffectRefused) as refused:
        charge(5)
    assert refused.value.reason == "record_corrupt"
    assert runs == []
    if isinstance(content, dict):
        stored: dict[bytes, bytes] = rstore.client.hgetall(key)  # type: ignore[assignment]
        assert {k.decode(): v.decode() for k, v in stored.items()} == content
    else:
        assert rstore.client.get(key) == content


# -- also: the retry policy of URL-built clients ----------------------------------------------------
@pytest.mark.parametrize(
    ("lost", "action"),
    [("begin", Action.CUT_AFTER), ("commit", Action.CUT_BEFORE)],
    ids=["begin-ran-reply-lost", "commit-never-sent"],
)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_dropped_connection_is_resent_by_a_url_built_store(
    redis_server: EmbeddedRedis, namespace: str, lost: str, action: Action, kind: str
) -> None:
    """A connection drops: after the server ran the begin (its reply is lost), or before the commit
    reached the server. The store's client re-sends the script on a new connection, and the call goes
    through once, committed."""
    RedisEffectStore(redis_server.url).load_scripts()
    with ChaosProxy(redis_server.socket_path, [Fault(is_script_call(lost), action)]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=namespace, socket_timeout=2)
        runs: list[int] = []

        def charge(cents: int) -> dict[str, int]:
            runs.append(cents)
            return {"charged": cents}

        async def acharge(cents: int) -> dict[str, int]:
            return charge(cents)

        guard = EffectGuard(store)
        if kind == "sync":
            with tool_call_context("drop-1"):
                assert guard.wrap(charge)(5) == {"charged": 5}
        else:
            import asyncio

            async def main() -> Any:
                with tool_call_context("drop-1"):
                    value = await guard.wrap(acharge)(5)
                await store.aclose()
                return value

            assert asyncio.run(main()) == {"charged": 5}
        assert proxy.applied(action) == 1
        assert runs == [5]
        record = RedisEffectStore(redis_server.url, namespace=namespace).get("drop-1")
        assert record is not None and record.status is Status.COMMITTED
        assert decode_result(record.value or b"") == {"charged": 5}
        store.close()


def test_operators_see_no_record_where_a_tombstone_stands(
    rstore: RedisEffectStore, redis_server: EmbeddedRedis, namespace: str
) -> None:
    """A released record leaves a tombstone: inspect, list and resolve treat it as no record."""
    from airlock_redis.operator import list_records, read_record

    request = _pending(rstore, "tomb-1")
    assert rstore.settle(request, 1, Settlement.RELEASE) is TransitionResult.OK
    assert rstore.client.exists(rstore.key("tomb-1")) == 1
    assert read_record(rstore.client, namespace, "tomb-1") is None
    assert [v.tool_call_id for v in list_records(rstore.client, namespace).records] == []
    inspect = subprocess.run(
        [sys.executable, "-m", "airlock_redis", "inspect", "tomb-1", "--url", redis_server.url,
         "--namespace", namespace],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert inspect.returncode == 1, inspect.stderr


# -- found in review: tombstones of several attempts, re-sent verdicts, odd stores -------------------
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_late_begin_finds_its_release_even_after_another_attempt_released_since(
    kind: str, rstore: RedisEffectStore
) -> None:
    """A's begin is delayed; A gives up (tombstone A); retry B begins and is released too (tombstone
    B); then A's begin lands. It must write nothing: every released token is remembered."""
    store: Any = rstore if kind == "redis" else InMemoryEffectStore()
    key = idempotency_key("charge", {"cents": 5})
    a = BeginRequest("chain-1", key, "charge", "tok-a", False)
    b = BeginRequest("chain-1", key, "charge", "tok-b", False)
    assert store.settle(a, 1, Settlement.RELEASE) is TransitionResult.MISSING  # A gave up first
    assert store.begin(b).kind.value == "started"
    assert store.settle(b, 1, Settlement.RELEASE) is TransitionResult.OK
    with pytest.raises(StoreError, match="late"):
        store.begin(a)  # A's delayed begin
    with pytest.raises(StoreError, match="late"):
        store.begin(b)  # B's, re-sent late
    assert store.get("chain-1") is None
    assert store.settle(a, 1, Settlement.RELEASE) is TransitionResult.OK  # A's release, re-sent
    c = BeginRequest("chain-1", key, "charge", "tok-c", False)
    assert store.begin(c).kind.value == "started"  # a new attempt is free to run
    with pytest.raises(StoreError, match="late"):
        store.begin(a)  # even over a live record


def test_a_release_verdict_resent_after_a_retry_began_leaves_the_retry_alone(
    rstore: RedisEffectStore,
) -> None:
    """redis-py re-sends a verdict whose reply was lost. If the first copy released the record and a
    retry began in between, the copy must answer "ok" and leave the retry's record alone."""
    request = _pending(rstore, "rs-1")
    args = rstore._args.resolve(Settlement.RELEASE, request.idempotency_key, None, None, None, None)
    client, key = rstore.client, rstore.key("rs-1")
    assert client.evalsha(SHAS["resolve"], 1, key, *args) == b"ok"  # applied; its reply is lost
    retry = BeginRequest("rs-1", request.idempotency_key, "charge", "tok-retry", False)
    assert rstore.begin(retry).kind.value == "started"
    assert client.evalsha(SHAS["resolve"], 1, key, *args) == b"ok"  # the client's re-send
    record = rstore.get("rs-1")
    assert record is not None and (record.status, record.owner) == (Status.PENDING, "tok-retry")


def test_a_forced_verdict_is_fenced_on_the_record_as_read_just_before(rstore: RedisEffectStore) -> None:
    request = _pending(rstore, "rs-2")
    guard = EffectGuard(rstore)
    assert guard.resolve("rs-2", "unknown", force=True) is TransitionResult.OK
    record = rstore.get("rs-2")
    assert record is not None and record.status is Status.UNKNOWN
    assert guard.resolve("rs-gone", "release", force=True) is TransitionResult.MISSING
    assert guard.resolve("rs-2", "release", force=True, expect_key="0" * 64) is TransitionResult.MISMATCH
    assert request.tool_call_id == "rs-2"


class _Broken(InMemoryEffectStore):
    """A third-party store whose commit and settle raise something other than StoreError."""

    def commit(self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None) -> Any:
        raise RuntimeError("the backend's driver broke")

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> Any:
        raise RuntimeError("the backend's driver broke")

    async def acommit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> Any:
        raise RuntimeError("the backend's driver broke")

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> Any:
        raise RuntimeError("the backend's driver broke")


def test_a_store_that_raises_anything_after_the_tool_ran_still_gives_the_caller_its_value() -> None:
    import asyncio

    guard = EffectGuard(_Broken())

    @guard.wrap
    def charge(cents: int) -> int:
        return cents

    @guard.wrap
    async def acharge(cents: int) -> int:
        return cents

    @guard.wrap
    def fails(cents: int) -> int:
        raise ValueError("declined")

    with tool_call_context("br-1"):
        assert charge(5) == 5
    with tool_call_context("br-2"):
        assert asyncio.run(acharge(6)) == 6
    with tool_call_context("br-3"), pytest.raises(ValueError, match="declined"):
        fails(7)  # the tool's own error, not the store's
