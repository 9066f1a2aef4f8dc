"""An MCP server over stdio whose tools are guarded on a real Redis (run by tests/test_integration_mcp.py).

Environment: ``AIRLOCK_MCP_TEST_REDIS_URL`` (the redis-server the test started) and
``AIRLOCK_MCP_TEST_NAMESPACE`` (the test's own key prefix). Every tool body counts its runs in Redis
(``<namespace>:runs:<tool>``) before anything else, so the test sees each execution, even one that
was cancelled afterwards. ``slow_charge`` then holds until the test opens its gate (a list it pushes
to), so a retry is sure to arrive while the first attempt still runs.
"""

from __future__ import annotations

import os

import anyio
import redis
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

from airlock_redis import EffectGuard, RedisEffectStore, reversibility
from airlock_redis.integrations.mcp import guard_server

URL = os.environ["AIRLOCK_MCP_TEST_REDIS_URL"]
NAMESPACE = os.environ["AIRLOCK_MCP_TEST_NAMESPACE"]

# generous timeouts: the tests run on busy machines, and a store that times out refuses (fail closed)
counter = redis.Redis.from_url(URL, socket_timeout=120)
# a retry that finds the first attempt still running waits for it less long than the tests' client
# waits for an answer (0.5 s), so that it answers "still running" before the client gives up
guard = EffectGuard(RedisEffectStore(URL, namespace=NAMESPACE, socket_timeout=30), wait_for_running=0.2)
server = MCPServer("airlock-mcp-test")


def ran(tool: str) -> int:
    """Count one execution of ``tool``; returns its number (1 for the first)."""
    return int(counter.incr(f"{NAMESPACE}:runs:{tool}"))


class Receipt(BaseModel):
    account: str
    cents: int
    run: int


@server.tool()
def charge(account: str, cents: int) -> Receipt:
    """Irreversible (untagged), blocking."""
    return Receipt(account=account, cents=cents, run=ran("charge"))


@server.tool()
async def acharge(account: str, cents: int, ctx: Context) -> str:
    """Irreversible, async, and takes its own Context (which it must still get)."""
    run = ran("acharge")
    assert isinstance(ctx, Context)
    return f"charged {cents} to {account} (run {run}, request {ctx.request_id is not None})"


@server.tool()
def slow_charge(account: str, seconds: float) -> str:
    """Irreversible, blocking; holds until the test opens its gate (or ``seconds`` pass). MCPServer
    runs it on a worker thread, which a client's cancellation does not stop."""
    run = ran("slow_charge")
    counter.blpop([f"{NAMESPACE}:gate:slow_charge"], timeout=seconds)
    return f"slow charge of {account} done (run {run})"


@server.tool()
async def aslow_charge(account: str, seconds: float) -> str:
    """Irreversible, async, slower than the client waits: the client's cancellation cancels it."""
    run = ran("aslow_charge")
    await anyio.sleep(seconds)
    return f"async slow charge of {account} done (run {run})"


@server.tool()
@reversibility("reversible")
async def aslow_lookup(query: str, seconds: float) -> str:
    """Reversible (tagged), async; its first run is slower than the client waits."""
    run = ran("aslow_lookup")
    if run == 1:
        await anyio.sleep(seconds)
    return f"{query}: found (run {run})"


@server.tool()
def refresh(query: str) -> str:
    """Untagged; made reversible by guard_server's mapping."""
    return f"{query}: refreshed (run {ran('refresh')})"


@server.tool()
@guard.wrap
def pre_guarded(account: str) -> str:
    """Already wrapped with guard.wrap by its author."""
    return f"{account}: done (run {ran('pre_guarded')})"


guard_server(server, guard, reversibility={"refresh": "reversible"})

if __name__ == "__main__":
    server.run("stdio")
