"""Owner-token fencing of the Lua transitions, on fakeredis and on a real redis-server.

A re-sent begin, commit or settle (a lost reply, redis-py's automatic re-send after a timeout) is
harmless, and an attempt that was superseded cannot overwrite the newer one. The last tests lose
replies on a real TCP link and let redis-py re-send the command by itself.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from airlock_redis import (
    EffectGuard,
    EffectStatusUnknown,
    Record,
    RedisEffectStore,
    Settlement,
    Status,
    StoreError,
    TransitionResult,
    idempotency_key,
    reversibility,
    tool_call_context,
)
from airlock_redis.core.codec import decode_result
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import BeginKind, BeginOutcome, BeginRequest, layout
from airlock_redis.stores.scripts import script_source
from tests.conftest import make_store
from tests.faults import Action, ChaosProxy, Fault
from tests.procs import is_script_call

BACKENDS = ("fakeredis", "redis")
MODES = ("sync", "async")
TOOL = "charge"
ARGS = {"account": "acct_1", "cents": 500}
KEY = idempotency_key(TOOL, ARGS)


class Ops:
    """The store's transitions through its blocking or its coroutine methods (one event loop)."""

    def __init__(self, store: RedisEffectStore, mode: str) -> None:
        self.store = store
        self.mode = mode

    async def begin(self, request: BeginRequest) -> BeginOutcome:
        if self.mode == "sync":
            return self.store.begin(request)
        return await self.store.abegin(request)

    async def commit(self, tool_call_id: str, token: str, value: bytes | None) -> TransitionResult:
        attempt = request(tool_call_id, token)
        if self.mode == "sync":
            return self.store.commit(attempt, 1, value, None)
        return await self.store.acommit(attempt, 1, value, None)

    async def settle(self, tool_call_id: str, token: str, settlement: Settlement) -> TransitionResult:
        attempt = request(tool_call_id, token)
        if self.mode == "sync":
            return self.store.settle(attempt, 1, settlement)
        return await self.store.asettle(attempt, 1, settlement)

    async def get(self, tool_call_id: str) -> Record | None:
        if self.mode == "sync":
            return self.store.get(tool_call_id)
        return await self.store.aget(tool_call_id)

    def keys(self) -> list[bytes]:
        """Every key of this store's namespace (one per record)."""
        return list(self.store.client.scan_iter(match=f"{self.store.namespace}:*"))


def play(store: RedisEffectStore, mode: str, scenario: Callable[[Ops], Awaitable[None]]) -> None:
    async def main() -> None:
        try:
            await scenario(Ops(store, mode))
        finally:
            if mode == "async":
                await store.aclose()

    asyncio.run(main())


def request(tool_call_id: str, token: str | None = None, *, reversible: bool = False) -> BeginRequest:
    return BeginRequest(tool_call_id, KEY, TOOL, token or secrets.token_hex(16), reversible)


@pytest.fixture(params=BACKENDS)
def rstore(request: pytest.FixtureRequest, namespace: str) -> Iterator[RedisEffectStore]:
    store = make_store(request.param, request, namespace)
    assert isinstance(store, RedisEffectStore)
    yield store
    store.close()


# -- begin -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_begin_resent_with_the_same_token_starts_again_without_a_new_attempt(
    rstore: RedisEffectStore, mode: str
) -> None:
    async def scenario(ops: Ops) -> None:
        first = request("call-b1")
        assert await ops.begin(first) == BeginOutcome(BeginKind.STARTED, 1)
        assert await ops.begin(first) == BeginOutcome(BeginKind.STARTED, 1)
        record = await ops.get("call-b1")
        assert record is not None
        assert (record.status, record.owner, record.attempt) == (Status.PENDING, first.token, 1)
        assert len(ops.keys()) == 1
        # another attempt (another token) of the irreversible tool is not let in
        other = await ops.begin(request("call-b1"))
        assert other == BeginOutcome(BeginKind.PENDING, 1)

    play(rstore, mode, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_begin_resent_after_a_reversible_take_over_keeps_the_attempt(
    rstore: RedisEffectStore, mode: str
) -> None:
    async def scenario(ops: Ops) -> None:
        assert (await ops.begin(request("call-b2", "token-a", reversible=True))).attempt == 1
        taken = request("call-b2", "token-b", reversible=True)
        assert await ops.begin(taken) == BeginOutcome(BeginKind.STARTED, 2)
        assert await ops.begin(taken) == BeginOutcome(BeginKind.STARTED, 2)  # the re-send
        record = await ops.get("call-b2")
        assert record is not None
        assert (record.owner, record.attempt, record.status) == ("token-b", 2, Status.PENDING)

    play(rstore, mode, scenario)


# -- commit ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_commit_resent_is_ok_and_keeps_the_first_value(rstore: RedisEffectStore, mode: str) -> None:
    async def scenario(ops: Ops) -> None:
        begun = request("call-c1")
        await ops.begin(begun)
        assert await ops.commit("call-c1", begun.token, b"first") is TransitionResult.OK
        assert await ops.commit("call-c1", begun.token, b"first") is TransitionResult.OK
        # even a re-send carrying other bytes cannot rewrite a committed value
        assert await ops.commit("call-c1", begun.token, b"second") is TransitionResult.OK
        record = await ops.get("call-c1")
        assert record is not None
        assert (record.status, record.value, record.stored, record.attempt) == (
            Status.COMMITTED,
            b"first",
            True,
            1,
        )
        assert await ops.begin(request("call-c1")) == BeginOutcome(BeginKind.COMMITTED, 1, value=b"first")

    play(rstore, mode, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_commit_on_a_missing_record_writes_it_again_committed(rstore: RedisEffectStore, mode: str) -> None:
    """The pending record expired while the tool ran: the call ran, so the commit writes the truth."""

    async def scenario(ops: Ops) -> None:
        assert await ops.commit("call-none", "token-x", b"v") is TransitionResult.RECREATED
        record = await ops.get("call-none")
        assert record is not None
        got = (record.status, record.idempotency_key, record.tool, record.owner, record.value)
        assert got == (Status.COMMITTED, KEY, TOOL, "token-x", b"v")
        assert await ops.commit("call-none", "token-x", b"v") is TransitionResult.OK  # a re-send
        replay = await ops.begin(request("call-none"))
        assert replay == BeginOutcome(BeginKind.COMMITTED, 1, value=b"v")

    play(rstore, mode, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_settle_on_a_missing_record(rstore: RedisEffectStore, mode: str) -> None:
    """Unknown with no record left writes it again (the call ran and is in doubt); a release that
    finds nothing leaves a tombstone of its token, invisible to readers, that a late begin of the
    same attempt cannot pass."""

    async def scenario(ops: Ops) -> None:
        assert await ops.settle("call-u", "token-x", Settlement.UNKNOWN) is TransitionResult.RECREATED
        record = await ops.get("call-u")
        assert record is not None
        assert (record.status, record.idempotency_key, record.owner) == (Status.UNKNOWN, KEY, "token-x")
        assert await ops.begin(request("call-u")) == BeginOutcome(BeginKind.UNKNOWN, 1)

        assert await ops.settle("call-r", "token-x", Settlement.RELEASE) is TransitionResult.MISSING
        assert await ops.get("call-r") is None
        assert await ops.settle("call-r", "token-x", Settlement.RELEASE) is TransitionResult.OK  # re-send
        with pytest.raises(StoreError, match="late"):
            await ops.begin(request("call-r", "token-x"))  # this attempt's begin, arriving late
        assert await ops.get("call-r") is None
        assert (await ops.begin(request("call-r"))).kind is BeginKind.STARTED  # any other attempt

    play(rstore, mode, scenario)


# -- settle ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_settle_unknown_resent_is_ok_and_stays_unknown(rstore: RedisEffectStore, mode: str) -> None:
    async def scenario(ops: Ops) -> None:
        begun = request("call-s1")
        await ops.begin(begun)
        assert await ops.settle("call-s1", begun.token, Settlement.UNKNOWN) is TransitionResult.OK
        assert await ops.settle("call-s1", begun.token, Settlement.UNKNOWN) is TransitionResult.OK
        # a late release from the same attempt does not wipe an in-doubt record
        assert await ops.settle("call-s1", begun.token, Settlement.RELEASE) is TransitionResult.OK
        record = await ops.get("call-s1")
        assert record is not None
        assert (record.status, record.attempt) == (Status.UNKNOWN, 1)
        assert await ops.begin(request("call-s1")) == BeginOutcome(BeginKind.UNKNOWN, 1)

    play(rstore, mode, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_settle_release_resent_finds_its_tombstone(rstore: RedisEffectStore, mode: str) -> None:
    async def scenario(ops: Ops) -> None:
        begun = request("call-s2")
        await ops.begin(begun)
        assert await ops.settle("call-s2", begun.token, Settlement.RELEASE) is TransitionResult.OK
        assert await ops.get("call-s2") is None
        assert await ops.settle("call-s2", begun.token, Settlement.RELEASE) is TransitionResult.OK
        assert len(ops.keys()) == 1  # the tombstone, which expires by itself
        assert 0 < rstore.client.pttl(rstore.key("call-s2")) <= 3_600_000
        # released: the call may run again
        assert (await ops.begin(request("call-s2"))).kind is BeginKind.STARTED

    play(rstore, mode, scenario)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("settlement", list(Settlement))
def test_a_committed_record_is_never_released_or_marked_unknown_by_settle(
    rstore: RedisEffectStore, mode: str, settlement: Settlement
) -> None:
    async def scenario(ops: Ops) -> None:
        begun = request("call-s3")
        await ops.begin(begun)
        await ops.commit("call-s3", begun.token, b"paid")
        assert await ops.settle("call-s3", begun.token, settlement) is TransitionResult.OK
        assert await ops.settle("call-s3", "someone-else", settlement) is TransitionResult.SUPERSEDED
        record = await ops.get("call-s3")
        assert record is not None
        assert (record.status, record.value) == (Status.COMMITTED, b"paid")

    play(rstore, mode, scenario)


# -- superseded attempts -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_a_superseded_attempt_cannot_commit_or_settle(rstore: RedisEffectStore, mode: str) -> None:
    async def scenario(ops: Ops) -> None:
        a = request("call-t1", "token-a", reversible=True)
        b = request("call-t1", "token-b", reversible=True)
        assert (await ops.begin(a)).attempt == 1
        assert await ops.begin(b) == BeginOutcome(BeginKind.STARTED, 2)  # B takes the record over
        assert await ops.commit("call-t1", a.token, b"from-a") is TransitionResult.SUPERSEDED
        for settlement in Settlement:
            assert await ops.settle("call-t1", a.token, settlement) is TransitionResult.SUPERSEDED
        record = await ops.get("call-t1")
        assert record is not None
        assert (record.status, record.owner, record.attempt) == (Status.PENDING, "token-b", 2)
        assert await ops.commit("call-t1", b.token, b"from-b") is TransitionResult.OK
        # A's late commit, after B committed, is still fenced off
        assert await ops.commit("call-t1", a.token, b"from-a") is TransitionResult.SUPERSEDED
        assert await ops.settle("call-t1", a.token, Settlement.RELEASE) is TransitionResult.SUPERSEDED
        record = await ops.get("call-t1")
        assert record is not None
        assert (record.status, record.value, record.owner, record.attempt) == (
            Status.COMMITTED,
            b"from-b",
            "token-b",
            2,
        )

    play(rstore, mode, scenario)


@pytest.mark.parametrize("mode", MODES)
def test_a_superseded_attempt_cannot_release_the_newer_attempts_record(
    rstore: RedisEffectStore, mode: str
) -> None:
    async def scenario(ops: Ops) -> None:
        a = request("call-t2", "token-a", reversible=True)
        b = request("call-t2", "token-b", reversible=True)
        await ops.begin(a)
        await ops.settle("call-t2", a.token, Settlement.UNKNOWN)
        assert await ops.begin(b) == BeginOutcome(BeginKind.STARTED, 2)  # take-over of an unknown record
        assert await ops.settle("call-t2", a.token, Settlement.RELEASE) is TransitionResult.SUPERSEDED
        record = await ops.get("call-t2")
        assert record is not None
        assert (record.status, record.owner) == (Status.PENDING, "token-b")
        assert await ops.settle("call-t2", b.token, Settlement.UNKNOWN) is TransitionResult.OK

    play(rstore, mode, scenario)


def test_superseded_guard_call_leaves_the_newer_result_standing(rstore: RedisEffectStore) -> None:
    """Through the guard: attempt A runs long, B takes over and commits, A's commit is fenced off.
    Without a lease (the spec's table): with one, B would find A running and wait for it instead."""
    guard = EffectGuard(store=rstore, lease=None)
    values: list[str] = []

    @reversibility("reversible")
    @guard.wrap
    def quote(symbol: str) -> str:
        if not values:
            values.append("from-a")

            def retry() -> None:  # B: a retry from elsewhere (another thread) while A still runs
                with tool_call_context("call-g1"):
                    values.append(quote(symbol))

            other = threading.Thread(target=retry)
            other.start()
            other.join()
            return "from-a"
        return "from-b"

    with tool_call_context("call-g1"):
        assert quote("ACME") == "from-a"  # A's caller still gets its own value
    assert values == ["from-a", "from-b"]
    record = rstore.get("call-g1")
    assert record is not None and record.value is not None
    assert (record.status, record.attempt, decode_result(record.value)) == (Status.COMMITTED, 2, "from-b")
    with tool_call_context("call-g1"):
        assert quote("ACME") == "from-b"  # replayed: B's result stands


# -- the scripts themselves, sent twice --------------------------------------------------------------
def run_script(client: Any, name: str, key: bytes, *args: Any) -> Any:
    return client.eval(script_source(name), 1, key, *args)


def test_raw_scripts_sent_twice_give_the_same_answer(rstore: RedisEffectStore) -> None:
    client = rstore.client
    key = rstore.key("call-raw")
    begin_args = (KEY, TOOL, "token-raw", "0", 60_000, 1_700_000_000_000)
    assert run_script(client, "begin", key, *begin_args) == [b"started", 1]
    snapshot = client.get(key)
    assert run_script(client, "begin", key, *begin_args) == [b"started", 1]
    assert client.get(key) == snapshot  # the re-sent begin changed nothing

    commit_args = ("token-raw", "1", b"\x91\x01", b"", 30_000, 1_700_000_000_500, KEY, TOOL, 1)
    assert run_script(client, "commit", key, *commit_args) == b"ok"
    snapshot = client.get(key)
    assert run_script(client, "commit", key, *commit_args) == b"ok"
    assert client.get(key) == snapshot
    assert isinstance(snapshot, bytes)
    committed = layout.parse(snapshot)
    assert committed.status == "committed" and committed.value == b"\x91\x01"

    intruder = ("intruder", "1", b"x", b"", 30_000, 0, KEY, TOOL, 1)
    assert run_script(client, "commit", key, *intruder) == b"superseded"
    settle_args = ("intruder", "release", 30_000, KEY, TOOL, 1, 60_000)
    assert run_script(client, "settle", key, *settle_args) == b"superseded"
    assert client.get(key) == snapshot
    missing = rstore.key("call-raw-missing")
    assert run_script(client, "commit", missing, "t", "1", b"x", b"", 30_000, 0, KEY, TOOL, 1) == b"recreated"
    assert run_script(client, "commit", missing, "t", "1", b"x", b"", 30_000, 0, KEY, TOOL, 1) == b"ok"


# -- redis-py re-sends a command whose reply was lost (real server, real TCP) ------------------------
def counted_charge(guard: EffectGuard, runs: list[int]) -> Callable[..., dict[str, Any]]:
    @guard.wrap
    def charge(account: str, cents: int) -> dict[str, Any]:
        runs.append(cents)
        return {"charged": cents, "account": account}

    return charge


@pytest.mark.parametrize("lost", ["begin", "commit"])
def test_redis_py_resend_after_a_lost_reply_is_harmless(
    redis_server: EmbeddedRedis, namespace: str, lost: str
) -> None:
    muted = Fault(is_script_call(lost), Action.DROP_REPLY)
    with ChaosProxy(redis_server.socket_path, [muted]) as proxy:
        # redis-py's default retry policy re-sends a command after a read timeout
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=1.0)
        store = RedisEffectStore(client=client, namespace=namespace)
        store.load_scripts()
        runs: list[int] = []
        charge = counted_charge(EffectGuard(store=store), runs)
        with tool_call_context(f"call-lost-{lost}"):
            first = charge("acct_1", 500)
        assert muted.applied == 1
        assert muted.seen >= 2, "the command was not re-sent"
        assert runs == [500]
        record = store.get(f"call-lost-{lost}")
        assert record is not None
        assert (record.status, record.attempt) == (Status.COMMITTED, 1)
        with tool_call_context(f"call-lost-{lost}"):
            assert charge("acct_1", 500) == first
        assert runs == [500]
        store.close()


def test_redis_py_resend_of_a_lost_begin_reply_async(redis_server: EmbeddedRedis, namespace: str) -> None:
    muted = Fault(is_script_call("begin"), Action.DROP_REPLY)
    with ChaosProxy(redis_server.socket_path, [muted]) as proxy:
        RedisEffectStore(redis_server.url).load_scripts()
        store = RedisEffectStore(
            namespace=namespace,
            async_client=lambda: aredis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=1.0),
        )
        runs: list[int] = []
        guard = EffectGuard(store=store)

        @guard.wrap
        async def charge(account: str, cents: int) -> dict[str, int]:
            runs.append(cents)
            return {"charged": cents}

        async def main() -> tuple[Any, Any, Record | None]:
            with tool_call_context("call-lost-async"):
                first = await charge("acct_1", 700)
                again = await charge("acct_1", 700)
            record = await store.aget("call-lost-async")
            await store.aclose()
            return first, again, record

        first, again, record = asyncio.run(main())
        assert muted.applied == 1 and muted.seen >= 2
        assert runs == [700] and first == again == {"charged": 700}
        assert record is not None and (record.status, record.attempt) == (Status.COMMITTED, 1)


def test_lost_begin_reply_of_a_refused_retry_stays_refused(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    """A pending record, and the retry's begin reply is lost: the re-send is still refused, not run."""
    direct = RedisEffectStore(redis_server.url, namespace=namespace)
    assert direct.begin(request("call-lost-pending")).kind is BeginKind.STARTED  # an attempt that died
    muted = Fault(is_script_call("begin"), Action.DROP_REPLY)
    with ChaosProxy(redis_server.socket_path, [muted]) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=1.0)
        store = RedisEffectStore(client=client, namespace=namespace)
        store.load_scripts()
        runs: list[int] = []
        charge = counted_charge(EffectGuard(store=store), runs)
        with tool_call_context("call-lost-pending"), pytest.raises(EffectStatusUnknown):
            charge(**ARGS)
        assert muted.seen >= 2 and runs == []
        store.close()
    record = direct.get("call-lost-pending")
    assert record is not None and (record.status, record.attempt) == (Status.PENDING, 1)
    direct.close()
