"""Issue 22, case 3: a store whose URL bounds its connection pool (``?max_connections=1``, ``=2``).

The store shares the application's pool: whatever it sends must fit in it, whatever the server's script
cache holds. On a fresh server (no script cached) and after ``SCRIPT FLUSH`` before every round of
calls: every call runs its tool once and commits (a second call of the same id replays the value), no
call meets ``MaxConnectionsError``, the application's own ``store.client.ping()`` (and the asyncio
client's) keeps working between calls, and the server never sees more connections from the store than
the bound (per client: the blocking one, and the asyncio one of the event loop). Blocking calls from
one thread (and two threads with ``max_connections=2``); asyncio calls made concurrently on one loop.

Before the fix, a commit that met NOSCRIPT asked the pool for a second connection to SCRIPT LOAD while
the store kept the only one: ``MaxConnectionsError`` after the tool ran, the record left pending, and
every replay refused; asyncio calls opened connections of their own beside the pool's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import redis

from airlock_redis import RedisEffectStore, Status
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.url import SyncClient
from tests.faults import History, Outcome, Tools
from tests.topo_helpers import fresh_id, namespace
from tests.topologies import redis_binary

pytestmark = pytest.mark.redis_server

ROUNDS = 3  # rounds of calls; with "flushed", SCRIPT FLUSH before each
PER_ROUND = 4  # asyncio: calls in flight at once in a round


class Server:
    """A server of our own (its script cache starts empty), and one admin connection that is not the
    store's."""

    def __init__(self, started: EmbeddedRedis) -> None:
        self.started = started
        self.admin = redis.Redis.from_url(started.url, socket_timeout=5, single_connection_client=True)
        self.admin_id = int(self.admin.client_id())
        self.lock = threading.Lock()  # the admin connection is used by one caller at a time

    def url(self, max_connections: int) -> str:
        return f"{self.started.url}?max_connections={max_connections}"

    def flush_scripts(self, cache: str) -> None:
        """``flushed``: empty the script cache now."""
        if cache == "flushed":
            with self.lock:
                self.admin.script_flush()

    def store_connections(self) -> int:
        """How many client connections the server has, other than the admin's: the store's."""
        with self.lock:
            clients = self.admin.client_list(_type="normal")
        return sum(1 for c in clients if int(c["id"]) != self.admin_id)


@pytest.fixture
def server() -> Iterator[Server]:
    redis_binary()
    with EmbeddedRedis(unix_socket=False) as started:
        held = Server(started)
        try:
            yield held
        finally:
            held.admin.close()


def app_ping(client: SyncClient) -> str:
    """The application's own use of the store's client: "ok", or the error it met."""
    try:
        return "ok" if client.ping() else "no PONG"
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"


async def app_aping(store: RedisEffectStore) -> str:
    try:
        return "ok" if await store.async_client().ping() else "no PONG"
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"


def assert_every_call_ran_once_and_committed(
    store: RedisEffectStore,
    *,
    history: History,
    ids: list[str],
    pings: list[str],
    connections: list[int],
    bound: int,
) -> None:
    results = {i: [o.result for o in history.of(i)] for i in ids}
    wrong = {i: r for i, r in results.items() if r != ["executed", "replayed"]}
    assert not wrong, f"calls that did not run then replay: {wrong}"
    assert all(history.runs[i] == 1 for i in ids), dict(history.runs)
    errors = [o.detail for o in history.outcomes if o.result.startswith(("error", "refused"))]
    assert not errors, errors
    bad_pings = [p for p in pings if p != "ok"]
    assert not bad_pings, f"the application's own client failed between calls: {bad_pings}"
    assert max(connections) <= bound, f"the store held {connections} connections (bound {bound})"
    for tool_call_id in ids:
        record = store.get(tool_call_id)
        assert record is not None and record.status is Status.COMMITTED, (tool_call_id, record)


@pytest.mark.parametrize("cache", ["fresh", "flushed"])
@pytest.mark.parametrize(("max_connections", "threads"), [(1, 1), (2, 2)])
def test_blocking_calls_fit_in_a_bounded_pool(
    server: Server, max_connections: int, threads: int, cache: str
) -> None:
    store = RedisEffectStore(server.url(max_connections), namespace=namespace())
    history = History()
    tools = Tools(store, history)
    ids: list[list[str]] = [[fresh_id(f"t{t}r{r}") for r in range(ROUNDS)] for t in range(threads)]
    pings: list[str] = []
    connections: list[int] = []
    crashed: list[BaseException] = []

    def caller(mine: list[str]) -> None:
        try:
            for tool_call_id in mine:
                server.flush_scripts(cache)
                tools.call(tool_call_id, phase="first")
                pings.append(app_ping(store.client))
                tools.call(tool_call_id, phase="replay")
                pings.append(app_ping(store.client))
                connections.append(server.store_connections())
        except BaseException as exc:
            crashed.append(exc)

    workers = [threading.Thread(target=caller, args=(mine,), daemon=True) for mine in ids]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert not worker.is_alive(), "a caller did not finish (bounded test)"
    assert not crashed, crashed
    everyone = [i for mine in ids for i in mine]
    history.report(f"max_connections={max_connections}, {threads} thread(s), {cache} script cache")
    assert_every_call_ran_once_and_committed(
        store, history=history, ids=everyone, pings=pings, connections=connections, bound=max_connections
    )
    store.close()


@pytest.mark.parametrize("cache", ["fresh", "flushed"])
@pytest.mark.parametrize("max_connections", [1, 2])
def test_concurrent_asyncio_calls_fit_in_a_bounded_pool(
    server: Server, max_connections: int, cache: str
) -> None:
    store = RedisEffectStore(server.url(max_connections), namespace=namespace())
    history = History()
    tools = Tools(store, history)
    ids = [[fresh_id(f"r{r}c{c}") for c in range(PER_ROUND)] for r in range(ROUNDS)]
    pings: list[str] = []
    connections: list[int] = []

    async def main() -> None:
        try:
            for batch in ids:
                server.flush_scripts(cache)
                firsts = await asyncio.gather(*(tools.acall(i, phase="first") for i in batch))
                pings.extend([await app_aping(store), app_ping(store.client)])
                replays = await asyncio.gather(*(tools.acall(i, phase="replay") for i in batch))
                pings.extend([await app_aping(store), app_ping(store.client)])
                assert all(isinstance(o, Outcome) for o in (*firsts, *replays))
                connections.append(server.store_connections())
        finally:
            await store.aclose()

    asyncio.run(asyncio.wait_for(main(), timeout=120))
    history.report(f"asyncio, max_connections={max_connections}, {cache} script cache")
    everyone = [i for batch in ids for i in batch]
    # two clients of the store reach the server here: the blocking one and the loop's asyncio one
    assert_every_call_ran_once_and_committed(
        store, history=history, ids=everyone, pings=pings, connections=connections, bound=2 * max_connections
    )
    store.close()
