"""Auto-pipelining of asyncio calls (issue 27), on a real redis-server.

Concurrent calls' commands that queue up behind a send leave together in one pipeline; each call still
gets its own reply and its own error: an error reply fails only its call, a NOSCRIPT in a batch is
re-sent with the script's source, a failed round trip is every waiting call's failure, a caller
cancelled before its batch left is never sent (and cancels nobody else's), ``auto_pipeline=False``
sends every command alone, and a lone call is sent at once, never through a pipeline.

What the client sent is seen through its connections: every send (a command alone, a batch the
store's auto-pipeline writes itself, see ``airlock_redis.stores.exchange``, or a redis-py pipeline)
is one ``send_packed_command`` call on one connection of the client's pool, so a connection class
that notes what each call carries shows every send, a batch as one entry of several commands.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from airlock_redis import EffectGuard, EffectRefused, RedisEffectStore, Status, tool_call_context
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.autopipe import AutoPipeline, NotSent
from airlock_redis.stores.tries import never_sent
from tests.faults import Action, ChaosProxy, Fault, is_command
from tests.resp import requests_in
from tests.topo_helpers import recorded

pytestmark = pytest.mark.redis_server

T = TypeVar("T")
CALLS = 64  # calls in flight at once: enough that most of them queue behind the first send
STEP_LIMIT = 30.0  # a bound on each wait, so a broken feature fails instead of hanging


SETUP = (b"HELLO", b"CLIENT", b"AUTH", b"SELECT")  # what redis-py sends as it connects


class Sends:
    """What a store's asyncio client sent: the commands of each send packed on one of its connections
    (``batches``; the auto-pipeline's own sends, see ``airlock_redis.stores.exchange``) and of each
    redis-py pipeline it made (``pipelines``)."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[Any, ...]]] = []
        self.pipelines: list[list[tuple[Any, ...]]] = []
        self._watched: set[int] = set()

    def sizes(self) -> list[int]:
        """How many commands each send carried, leaving out what redis-py sends on connecting."""
        return [len(batch) for batch in self.batches if batch[0][0].upper() not in SETUP]

    def watch(self, client: Any) -> None:
        """Note what ``client`` sends from now on (before it makes its first connection)."""
        if id(client) in self._watched:
            return
        self._watched.add(id(client))
        pool, batches = client.connection_pool, self.batches

        class Recording(pool.connection_class):  # type: ignore[misc,name-defined]
            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                batches.append(requests_in(command))
                await super().send_packed_command(command, check_health)

        pool.connection_class = Recording


class RecordingStore(RedisEffectStore):
    """A store (its asyncio client its own, built from the URL) whose asyncio client's sends are noted."""

    sends: Sends

    def async_client(self) -> Any:
        client = super().async_client()
        self.sends.watch(client)
        return client


class RecordingRedis(aredis.Redis):
    """An asyncio client given to a store as ``async_client=``, whose pipelines are noted."""

    sends: Sends

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return recorded(super().pipeline(transaction, shard_hint), self.sends.pipelines)


def recording_store(url: str, *, given: bool = False, **options: Any) -> tuple[RedisEffectStore, Sends]:
    """A store whose asyncio sends are noted: built from ``url`` (its client the store's own, whose
    commands the auto-pipeline writes on the connections itself), or, ``given``, over an asyncio
    client passed as ``async_client=`` (whose commands go through redis-py's commands and pipelines,
    its retry policy kept)."""
    sends = Sends()
    if not given:
        recording = RecordingStore(url, namespace=fresh("ap"), **options)
        recording.sends = sends
        return recording, sends
    client = cast(RecordingRedis, RecordingRedis.from_url(url, socket_timeout=5))
    client.sends = sends
    sends.watch(client)
    store = RedisEffectStore(
        client=redis.Redis.from_url(url), async_client=client, namespace=fresh("ap"), **options
    )
    return store, sends


async def within(step: Awaitable[T], what: str) -> T:
    try:
        return await asyncio.wait_for(step, STEP_LIMIT)
    except TimeoutError:
        pytest.fail(f"{what} did not finish within {STEP_LIMIT:.0f}s", pytrace=False)


async def until(fact: Callable[[], bool], what: str) -> None:
    """Wait (yielding to the loop) until ``fact()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STEP_LIMIT
    while not fact():
        if loop.time() > deadline:
            pytest.fail(f"{what} did not happen within {STEP_LIMIT:.0f}s", pytrace=False)
        await asyncio.sleep(0.001)


def status_of(store: RedisEffectStore, call_id: str) -> Status | None:
    record = store.get(call_id)
    return None if record is None else record.status


def fresh(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


def make_guarded(store: RedisEffectStore) -> tuple[Callable[[str, int], Awaitable[Any]], dict[str, int]]:
    """An async tool under the guard that counts its runs per call id and returns its own input."""
    runs: dict[str, int] = {}

    async def charge(call: str, cents: int) -> dict[str, Any]:
        runs[call] = runs.get(call, 0) + 1
        return {"call": call, "cents": cents}

    tool = EffectGuard(store).wrap(charge)

    async def call(call_id: str, cents: int) -> Any:
        with tool_call_context(call_id):
            return await tool(call_id, cents)

    return call, runs


# -- the guard over a store that auto-pipelines ------------------------------------------------------
@pytest.mark.parametrize("given", [False, True], ids=["store-built-client", "given-client"])
def test_concurrent_calls_share_pipelines_and_each_gets_its_own_value(
    redis_server: EmbeddedRedis, given: bool
) -> None:
    store, sends = recording_store(redis_server.url, given=given)
    ids = [fresh("c") for _ in range(CALLS)]

    async def scenario() -> list[Any]:
        call, runs = make_guarded(store)
        first = await within(asyncio.gather(*(call(i, n) for n, i in enumerate(ids))), "the calls")
        again = await within(asyncio.gather(*(call(i, n) for n, i in enumerate(ids))), "the replays")
        assert runs == dict.fromkeys(ids, 1)
        assert again == first
        await store.aclose()
        return first

    values = asyncio.run(scenario())
    assert values == [{"call": i, "cents": n} for n, i in enumerate(ids)]
    # the store's own client: the auto-pipeline writes each batch itself; a given one: redis-py's pipelines
    sizes = [len(batch) for batch in (sends.pipelines if given else sends.batches)]
    assert sizes and max(sizes) > 1, f"no batch of more than one command: {sizes}"
    if not given:  # no redis-py pipeline: the batches above were written by the auto-pipeline itself
        assert sends.pipelines == []
    for call_id in ids:
        assert status_of(store, call_id) is Status.COMMITTED


@pytest.mark.parametrize("given", [False, True], ids=["store-built-client", "given-client"])
def test_an_error_reply_in_a_batch_fails_only_its_own_call(redis_server: EmbeddedRedis, given: bool) -> None:
    """Every round is checked; the batching that makes the test mean something (the spoiled call's
    command sharing a batch) depends on the scheduler, so up to five rounds are run to see it."""
    shared_once = False
    for _ in range(5):
        store, sends = recording_store(redis_server.url, given=given)
        ids = [fresh("c") for _ in range(CALLS)]
        spoiled = ids[CALLS // 2]
        redis.Redis.from_url(redis_server.url).rpush(store.key(spoiled), b"not a record")

        async def scenario() -> tuple[list[Any], dict[str, int]]:
            call, runs = make_guarded(store)  # noqa: B023 - run at once, in this round
            outcomes = await within(
                asyncio.gather(*(call(i, n) for n, i in enumerate(ids)), return_exceptions=True),  # noqa: B023
                "the calls",
            )
            await store.aclose()  # noqa: B023
            return outcomes, runs

        outcomes, runs = asyncio.run(scenario())
        by_id = dict(zip(ids, outcomes, strict=True))
        assert isinstance(by_id.pop(spoiled), EffectRefused)
        assert spoiled not in runs
        assert all(value == {"call": i, "cents": ids.index(i)} for i, value in by_id.items())
        assert runs == dict.fromkeys(by_id, 1)
        spoiled_key = store.key(spoiled)
        shared_once = any(any(spoiled_key in args for args in b) and len(b) > 1 for b in sends.batches)
        if shared_once:
            break
    assert shared_once, "the spoiled call's command never shared a batch in 5 rounds: the test proved nothing"


@pytest.mark.parametrize("given", [False, True], ids=["store-built-client", "given-client"])
def test_a_flushed_script_cache_in_a_batch_is_sent_again_with_the_source(
    redis_server: EmbeddedRedis, given: bool
) -> None:
    store, sends = recording_store(redis_server.url, given=given)
    admin = redis.Redis.from_url(redis_server.url)
    ids = [fresh("c") for _ in range(CALLS)]

    async def scenario() -> dict[str, int]:
        call, runs = make_guarded(store)
        await call(fresh("warm"), 0)  # the scripts are cached, so commits go as EVALSHA
        admin.script_flush()
        sends.batches.clear()
        values = await within(asyncio.gather(*(call(i, n) for n, i in enumerate(ids))), "the calls")
        assert values == [{"call": i, "cents": n} for n, i in enumerate(ids)]
        await store.aclose()
        return runs

    runs = asyncio.run(scenario())
    assert {i: runs[i] for i in ids} == dict.fromkeys(ids, 1)
    for call_id in ids:
        assert status_of(store, call_id) is Status.COMMITTED
    names = [args[0].upper() for batch in sends.batches if len(batch) > 1 for args in batch]
    assert b"EVALSHA" in names, "no EVALSHA travelled in a batch: the test proved nothing"


def test_auto_pipeline_off_sends_every_command_alone(redis_server: EmbeddedRedis) -> None:
    store, sends = recording_store(redis_server.url, auto_pipeline=False)
    ids = [fresh("c") for _ in range(CALLS)]

    async def scenario() -> dict[str, int]:
        call, runs = make_guarded(store)
        await within(asyncio.gather(*(call(i, n) for n, i in enumerate(ids))), "the calls")
        await store.aclose()
        return runs

    assert asyncio.run(scenario()) == dict.fromkeys(ids, 1)
    assert sends.pipelines == []
    assert sends.batches and all(len(batch) == 1 for batch in sends.batches), sends.batches


@pytest.mark.parametrize("given", [False, True], ids=["store-built-client", "given-client"])
def test_a_lone_call_is_sent_at_once_without_a_pipeline(redis_server: EmbeddedRedis, given: bool) -> None:
    store, sends = recording_store(redis_server.url, given=given)

    async def scenario() -> None:
        call, runs = make_guarded(store)
        for n in range(5):
            call_id = fresh("c")
            assert await call(call_id, n) == {"call": call_id, "cents": n}
            assert runs[call_id] == 1
        await store.aclose()

    asyncio.run(scenario())
    assert sends.pipelines == []
    # each command written alone: by redis-py's execute_command (a given client) or the auto-pipeline
    assert len(sends.batches) >= 10 and all(len(batch) == 1 for batch in sends.batches), sends.batches


# -- the auto-pipeline itself, on a real server --------------------------------------------------------
def blocking_pop(seconds: float) -> tuple[Any, ...]:
    """A command that holds its connection ``seconds`` (BLPOP on a key nobody pushes to)."""
    return ("BLPOP", f"ap:nothing:{secrets.token_hex(4)}", seconds)


def test_a_caller_cancelled_in_the_queue_is_never_sent_and_cancels_nobody_else(
    redis_server: EmbeddedRedis,
) -> None:
    keys = [f"ap:{secrets.token_hex(5)}" for _ in range(3)]

    async def scenario() -> list[Any]:
        client = aredis.Redis.from_url(redis_server.url, socket_timeout=5)
        pipe = AutoPipeline(client, lanes=1)
        holder = asyncio.ensure_future(pipe.execute(blocking_pop(0.5)))  # the one lane, held
        await until(lambda: pipe.queued == 0 and not holder.done(), "the hold")
        waiters = [asyncio.ensure_future(pipe.execute(("SET", key, b"1"))) for key in keys]
        await until(lambda: pipe.queued == len(keys), "the queue")
        waiters[1].cancel()
        await within(holder, "the hold")
        outcomes = await within(asyncio.gather(*waiters, return_exceptions=True), "the batch")
        stored = [await client.get(key) for key in keys]
        await client.aclose()
        return [*outcomes, *stored]

    first, second, third, *stored = asyncio.run(scenario())
    assert first is True and third is True
    assert isinstance(second, asyncio.CancelledError)
    assert stored == [b"1", None, b"1"]


def test_commands_of_one_loop_turn_leave_together_and_so_do_the_next_ones_of_their_callers(
    redis_server: EmbeddedRedis,
) -> None:
    """With a send on its way, ten callers that each send in the same turn of the loop leave in one
    batch (none goes alone on the second lane), and when that batch is answered, their next commands,
    sent at once, leave together again: the sender waits a turn for them."""
    sends = Sends()
    keys = [f"ap:{secrets.token_hex(5)}" for _ in range(10)]

    async def caller(pipe: AutoPipeline, key: str) -> list[Any]:
        return [await pipe.execute(("SET", key, b"1")), await pipe.execute(("GET", key))]

    async def scenario() -> list[Any]:
        client = aredis.Redis.from_url(redis_server.url, socket_timeout=5)
        sends.watch(client)
        pipe = AutoPipeline(client)
        holder = asyncio.ensure_future(pipe.execute(blocking_pop(0.2)))
        await until(lambda: sends.sizes() == [1], "the hold")
        outcomes = await within(asyncio.gather(*(caller(pipe, key) for key in keys)), "the callers")
        await within(holder, "the hold")
        await pipe.aclose()
        await client.aclose()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes == [[True, b"1"]] * len(keys)
    assert sends.sizes() == [1, len(keys), len(keys)], sends.batches


def test_an_error_reply_fails_only_its_command_in_the_batch(redis_server: EmbeddedRedis) -> None:
    key = f"ap:{secrets.token_hex(5)}"

    async def scenario() -> list[Any]:
        client = aredis.Redis.from_url(redis_server.url, socket_timeout=5)
        pipe = AutoPipeline(client, lanes=1)
        holder = asyncio.ensure_future(pipe.execute(blocking_pop(0.2)))
        await until(lambda: not holder.done(), "the hold")
        commands = [("SET", key, b"v"), ("LPUSH", key, b"x"), ("GET", key)]
        waiters = [asyncio.ensure_future(pipe.execute(args)) for args in commands]
        await until(lambda: pipe.queued == len(commands), "the queue")
        outcomes = await within(asyncio.gather(*waiters, return_exceptions=True), "the batch")
        await within(holder, "the hold")
        await client.aclose()
        return outcomes

    set_reply, push_error, value = asyncio.run(scenario())
    assert set_reply is True
    assert isinstance(push_error, redis.ResponseError) and "WRONGTYPE" in str(push_error)
    assert value == b"v"


def test_a_connection_cut_mid_batch_fails_every_command_of_it_as_maybe_sent(
    redis_server: EmbeddedRedis,
) -> None:
    """The proxy holds every SET on its way; the first is let through, the batch queued behind it
    is held in turn, then the connection is cut: each command of the batch fails with a connection
    error that does not say "never sent" (it may have landed), and the first got its reply."""
    marker = f"ap:{secrets.token_hex(5)}"
    hold = Fault(is_command("SET"), Action.DELAY, times=4, delay=float("inf"))  # the first and the batch
    with ChaosProxy(redis_server.socket_path, [hold]) as proxy:

        async def scenario() -> list[Any]:
            # one try: the cut is what the caller sees
            client = aredis.Redis.from_url(proxy.url, socket_timeout=5, retry=Retry(NoBackoff(), 0))
            pipe = AutoPipeline(client, lanes=1)
            first = asyncio.ensure_future(pipe.execute(("SET", marker, b"first")))
            await until(lambda: proxy.holding() == 1, "the first SET held")
            batch = [asyncio.ensure_future(pipe.execute(("SET", f"{marker}:{n}", b"v"))) for n in range(3)]
            await until(lambda: pipe.queued == len(batch), "the batch queued")
            proxy.release_held()
            await until(lambda: proxy.holding() == len(batch), "the batch held on its way")
            proxy.cut_all()
            outcomes = await within(asyncio.gather(first, *batch, return_exceptions=True), "the cut")
            await client.aclose()
            return outcomes

        first, *batch = asyncio.run(scenario())
    assert first is True
    assert all(isinstance(o, redis.ConnectionError) for o in batch), batch
    assert not any(never_sent(o) for o in batch)


def test_not_sent_says_never_sent() -> None:
    assert never_sent(NotSent("the auto-pipeline stopped before the command was sent"))
    assert isinstance(NotSent("x"), redis.ConnectionError)


def test_an_auto_pipeline_refuses_a_zero_bound() -> None:
    with pytest.raises(ValueError, match="limit >= 1"):
        AutoPipeline(object(), limit=0)


class HeldClient:
    """A stand-in client for the unit layer: send number ``n`` (a command, or a pipeline) waits until
    ``let(n)``, then answers b"ok" per command (no server: what is checked here is who is told what
    when a send is cut)."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []
        self.sent: list[tuple[Any, ...]] = []

    def let(self, n: int) -> None:
        self.gates[n].set()

    async def _held(self, commands: list[tuple[Any, ...]]) -> list[bytes]:
        gate = asyncio.Event()
        self.gates.append(gate)
        self.sent.extend(commands)
        await gate.wait()
        return [b"ok"] * len(commands)

    async def execute_command(self, *args: Any) -> bytes:
        return (await self._held([args]))[0]

    def pipeline(self, transaction: bool = True) -> HeldClient.Pipe:
        return HeldClient.Pipe(self)

    class Pipe:
        def __init__(self, client: HeldClient) -> None:
            self.client = client
            self.stack: list[tuple[Any, ...]] = []

        def execute_command(self, *args: Any) -> None:
            self.stack.append(args)

        async def execute(self, raise_on_error: bool = True) -> list[bytes]:
            return await self.client._held(self.stack)


def test_a_cancelled_sender_tells_its_batch_maybe_landed_and_the_queue_never_sent() -> None:
    async def scenario() -> tuple[list[Any], list[tuple[Any, ...]]]:
        client = HeldClient()
        pipe = AutoPipeline(client, lanes=1)
        first = asyncio.ensure_future(pipe.execute(("SET", "a", 1)))
        await until(lambda: len(client.sent) == 1, "the first send")
        batch = [asyncio.ensure_future(pipe.execute(("SET", f"b{n}", 1))) for n in range(2)]
        await until(lambda: pipe.queued == 2, "the batch queued")
        client.let(0)
        await within(first, "the first send")
        await until(lambda: len(client.sent) == 3, "the batch sent")
        late = [asyncio.ensure_future(pipe.execute(("SET", f"c{n}", 1))) for n in range(2)]
        await until(lambda: pipe.queued == 2, "the late ones queued")
        senders = [t for t in asyncio.all_tasks() if "_send_queued" in repr(t.get_coro())]
        assert len(senders) == 1
        senders[0].cancel()
        outcomes = await within(asyncio.gather(*batch, *late, return_exceptions=True), "the outcomes")
        return outcomes, client.sent

    (b0, b1, c0, c1), sent = asyncio.run(scenario())
    for in_flight in (b0, b1):
        assert isinstance(in_flight, redis.ConnectionError) and not never_sent(in_flight)
    for queued in (c0, c1):
        assert isinstance(queued, NotSent) and never_sent(queued)
    assert [args[1] for args in sent] == ["a", "b0", "b1"]  # the late ones never left
