"""The MCP integration across a real stdio server process (tests/mcp_server_app.py) on a real redis-server.

The client sends the tool call id in ``_meta``; the server's tools count their runs in Redis, so each
test checks how often a body ran, not only what the client saw. The tests of a tool's first error in
doubt run an in-process server (``Client(server)``) whose records are on the same redis-server.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
import redis
from mcp.client import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, RequestParamsMeta, TextContent
from mcp_types.jsonrpc import REQUEST_TIMEOUT

from airlock_redis import (
    EffectGuard,
    EffectInProgress,
    EffectStatusUnknown,
    RedisEffectStore,
    Status,
    reversibility,
)
from airlock_redis.core.errors import EffectPolicyViolation
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.integrations.mcp import (
    TOOL_CALL_ID_META_KEY,
    call_tool,
    guard_server,
    tool_call_meta,
    tool_meta_resolver,
)
from tests.procs import PROJECT_ROOT, child_env

pytestmark = pytest.mark.redis_server

APP = Path(__file__).with_name("mcp_server_app.py")
SCENARIO_TIMEOUT = 90.0  # the bound of every test's whole conversation with the server
CLIENT_TIMEOUT = 0.5  # how long the client waits before it gives up on a slow call
SLOW = 60.0  # the longest a gated tool holds (the test opens its gate well before)
WAIT = 30.0  # the longest wait for something the server does (a body to start, a record to change)


# -- the harness -----------------------------------------------------------------------------------
class Harness:
    """What a test sees of the server: its Redis (run counts, records) and its log."""

    def __init__(self, server: EmbeddedRedis, namespace: str, log: Path) -> None:
        self.url = server.url
        self.namespace = namespace
        self.log = log
        self.redis = redis.Redis.from_url(server.url, socket_timeout=30)
        self.store = RedisEffectStore(server.url, namespace=namespace, socket_timeout=30)

    def env(self) -> dict[str, str]:
        return child_env(AIRLOCK_MCP_TEST_REDIS_URL=self.url, AIRLOCK_MCP_TEST_NAMESPACE=self.namespace)

    def runs(self, tool: str) -> int:
        value = self.redis.get(f"{self.namespace}:runs:{tool}")
        return int(value) if value is not None else 0

    def open_gate(self, tool: str) -> None:
        """Let the held body of ``tool`` go on."""
        self.redis.rpush(f"{self.namespace}:gate:{tool}", b"go")

    def status(self, tool_call_id: str) -> Status | None:
        record = self.store.get(tool_call_id)
        return record.status if record is not None else None

    async def until(self, what: str, check: Callable[[], bool]) -> None:
        """Wait until ``check()`` holds, at most WAIT seconds."""
        try:
            with anyio.fail_after(WAIT):
                while True:  # polls what another process does: nothing here to wait on
                    if check():
                        return
                    await anyio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"waited {WAIT}s in vain until {what}") from None

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[ClientSession]:
        params = StdioServerParameters(
            command=sys.executable, args=[str(APP)], env=self.env(), cwd=str(PROJECT_ROOT)
        )
        with self.log.open("a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                yield session


@pytest.fixture
def harness(redis_server: EmbeddedRedis, namespace: str, tmp_path: Path) -> Harness:
    return Harness(redis_server, namespace, tmp_path / "server.log")


def run(harness: Harness, scenario: Callable[[ClientSession], Awaitable[None]]) -> None:
    """Run ``scenario`` against a fresh server process, bounded in time; the server's log joins a failure."""

    async def main() -> None:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with harness.session() as session:
                await scenario(session)

    try:
        anyio.run(main)
    except BaseException:
        if harness.log.exists():
            sys.stderr.write(f"--- MCP server log ---\n{harness.log.read_text()}\n")
        raise


def text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def in_doubt_text(tool: str) -> str:
    return EffectStatusUnknown("", tool=tool, tool_call_id=None).model_message


def in_progress_text(tool: str) -> str:
    return EffectInProgress("", tool=tool, tool_call_id=None).model_message


# -- same id twice -----------------------------------------------------------------------------------
def test_same_id_twice_runs_once_and_replays_the_result(harness: Harness) -> None:
    async def scenario(session: ClientSession) -> None:
        first = await call_tool(session, "call-1", "charge", {"account": "acct_1", "cents": 500})
        again = await call_tool(session, "call-1", "charge", {"account": "acct_1", "cents": 500})
        assert not first.is_error
        assert first.structured_content == {"account": "acct_1", "cents": 500, "run": 1}
        assert (again.content, again.structured_content, again.is_error) == (
            first.content,
            first.structured_content,
            first.is_error,
        )
        assert harness.runs("charge") == 1
        # the id is the call: a new id is a new call
        other = await call_tool(session, "call-2", "charge", {"account": "acct_1", "cents": 500})
        assert other.structured_content == {"account": "acct_1", "cents": 500, "run": 2}

    run(harness, scenario)
    assert harness.status("call-1") is Status.COMMITTED


def test_async_tool_with_its_own_context_runs_once(harness: Harness) -> None:
    async def scenario(session: ClientSession) -> None:
        meta = tool_call_meta("call-a")
        first = await session.call_tool("acharge", {"account": "acct_2", "cents": 7}, meta=meta)
        again = await session.call_tool("acharge", {"account": "acct_2", "cents": 7}, meta=meta)
        assert text_of(first) == "charged 7 to acct_2 (run 1, request True)"
        assert text_of(again) == text_of(first)
        assert not again.is_error
        assert harness.runs("acharge") == 1

    run(harness, scenario)


def test_same_id_with_other_arguments_is_refused(harness: Harness) -> None:
    async def scenario(session: ClientSession) -> None:
        await call_tool(session, "call-p", "charge", {"account": "acct_1", "cents": 500})
        other = await call_tool(session, "call-p", "charge", {"account": "acct_1", "cents": 900})
        assert other.is_error
        expected = EffectPolicyViolation("", tool="charge", tool_call_id=None).model_message
        assert expected in text_of(other)
        assert harness.runs("charge") == 1

    run(harness, scenario)


def test_tool_already_wrapped_by_the_guard_gives_one_record_and_one_run(harness: Harness) -> None:
    async def scenario(session: ClientSession) -> None:
        first = await call_tool(session, "call-w", "pre_guarded", {"account": "acct_3"})
        again = await call_tool(session, "call-w", "pre_guarded", {"account": "acct_3"})
        assert text_of(first) == text_of(again) == "acct_3: done (run 1)"
        assert harness.runs("pre_guarded") == 1

    run(harness, scenario)
    record = harness.store.get("call-w")
    assert record is not None and record.tool == "pre_guarded" and record.attempt == 1


# -- a client that times out and retries ---------------------------------------------------------------
def test_blocking_tool_timed_out_and_retried_runs_once(harness: Harness) -> None:
    """The body outlives the client's wait (a worker thread is not stopped by the client's cancel).
    A retry while it runs waits a little (the server's wait_for_running), then is told it still runs;
    once it has committed, a retry gets its result."""

    async def scenario(session: ClientSession) -> None:
        args = {"account": "acct_4", "seconds": SLOW}
        with pytest.raises(MCPError) as timed_out:
            await call_tool(session, "call-t", "slow_charge", args, read_timeout_seconds=CLIENT_TIMEOUT)
        assert timed_out.value.code == REQUEST_TIMEOUT
        await harness.until("the body started", lambda: harness.runs("slow_charge") == 1)

        retry = await call_tool(session, "call-t", "slow_charge", args)
        assert retry.is_error
        assert in_progress_text("slow_charge") in text_of(retry)

        harness.open_gate("slow_charge")
        await harness.until(
            "the first attempt committed", lambda: harness.status("call-t") is Status.COMMITTED
        )
        late = await call_tool(session, "call-t", "slow_charge", args)
        assert not late.is_error
        assert text_of(late) == "slow charge of acct_4 done (run 1)"
        assert harness.runs("slow_charge") == 1

    run(harness, scenario)


def test_async_tool_timed_out_and_retried_runs_once(harness: Harness) -> None:
    """The client's cancel cancels the coroutine: the call is recorded unknown, and every retry under
    its id is refused with the text that tells the model not to issue it again."""

    async def scenario(session: ClientSession) -> None:
        args = {"account": "acct_5", "seconds": 60.0}
        with pytest.raises(MCPError):
            await call_tool(session, "call-u", "aslow_charge", args, read_timeout_seconds=CLIENT_TIMEOUT)
        await harness.until("the body started", lambda: harness.runs("aslow_charge") == 1)

        retry = await call_tool(session, "call-u", "aslow_charge", args)
        assert retry.is_error and in_doubt_text("aslow_charge") in text_of(retry)

        await harness.until("the cancel recorded", lambda: harness.status("call-u") is Status.UNKNOWN)
        later = await call_tool(session, "call-u", "aslow_charge", args)
        assert later.is_error and in_doubt_text("aslow_charge") in text_of(later)
        assert harness.runs("aslow_charge") == 1

    run(harness, scenario)


def test_reversible_tool_timed_out_runs_again_on_retry(harness: Harness) -> None:
    async def scenario(session: ClientSession) -> None:
        args = {"query": "q", "seconds": 60.0}
        with pytest.raises(MCPError):
            await call_tool(session, "call-r", "aslow_lookup", args, read_timeout_seconds=CLIENT_TIMEOUT)
        await harness.until("the body started", lambda: harness.runs("aslow_lookup") == 1)

        retry = await call_tool(session, "call-r", "aslow_lookup", args)
        assert not retry.is_error and text_of(retry) == "q: found (run 2)"
        again = await call_tool(session, "call-r", "aslow_lookup", args)
        assert text_of(again) == "q: found (run 2)"  # committed now: replayed
        assert harness.runs("aslow_lookup") == 2

    run(harness, scenario)


# -- the first error in doubt (an in-process server on the same redis-server) ----------------------------
def in_process_server(store: RedisEffectStore, runs: list[str]) -> MCPServer[Any]:
    """A server whose tools fail: ``charge``/``acharge`` time out (in doubt), ``cancel`` fails plainly,
    ``lookup`` (reversible) times out once."""
    server: MCPServer[Any] = MCPServer("failing")

    @server.tool()
    def charge(account: str, cents: int) -> str:
        runs.append("charge")
        raise TimeoutError("payments api: read timed out")

    @server.tool()
    async def acharge(account: str, cents: int) -> str:
        runs.append("acharge")
        raise TimeoutError("payments api: read timed out")

    @server.tool()
    def cancel(order: str) -> str:
        runs.append("cancel")
        raise ValueError("order is already shipped")

    @server.tool()
    @reversibility("reversible")
    def lookup(query: str) -> str:
        runs.append("lookup")
        if runs.count("lookup") == 1:
            raise TimeoutError("search api: read timed out")
        return f"{query}: found"

    guard_server(server, EffectGuard(store))
    return server


def in_process(
    store: RedisEffectStore, scenario: Callable[[Client], Awaitable[None]], runs: list[str]
) -> None:
    async def main() -> None:
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with Client(in_process_server(store, runs)) as client:
                await scenario(client)

    anyio.run(main)


@pytest.fixture
def store(redis_server: EmbeddedRedis, namespace: str) -> RedisEffectStore:
    return RedisEffectStore(redis_server.url, namespace=namespace, socket_timeout=30)


@pytest.mark.parametrize("tool", ("charge", "acharge"))
def test_the_first_in_doubt_error_reaches_the_client_as_the_refusal_text(
    tool: str, store: RedisEffectStore
) -> None:
    """The tool times out: on this very call the client gets the refusal text as the error result, not
    MCP's bare "Error executing tool <name>"; a retry of the same id is refused without running."""
    runs: list[str] = []

    async def scenario(client: Client) -> None:
        first = await call_tool(client, "call-d", tool, {"account": "acct_8", "cents": 5})
        assert first.is_error
        text = text_of(first)
        # MCPServer puts its "Error executing tool <name>: " before a ToolError's text
        refusal = f"The call to {tool!r} may have taken effect: it ended with TimeoutError"
        assert text.startswith(f"Error executing tool {tool}: {refusal}")
        assert "Do not call it again, under this id or a new one." in text
        assert "try again" not in text.lower() and "read timed out" not in text
        again = await call_tool(client, "call-d", tool, {"account": "acct_8", "cents": 5})
        assert again.is_error and in_doubt_text(tool) in text_of(again)

    in_process(store, scenario, runs)
    assert runs == [tool]
    record = store.get("call-d")
    assert record is not None and record.status is Status.UNKNOWN


def test_an_ordinary_error_and_a_reversible_tools_timeout_keep_mcps_handling(store: RedisEffectStore) -> None:
    """A ValueError leaves nothing in doubt (released), and a reversible tool may run again: both get
    the server's own error result, and a retry of the same id runs the tool."""
    runs: list[str] = []

    async def scenario(client: Client) -> None:
        failed = await call_tool(client, "call-v", "cancel", {"order": "o1"})
        assert failed.is_error and text_of(failed).startswith("Error executing tool cancel")
        assert store.get("call-v") is None
        timed_out = await call_tool(client, "call-l", "lookup", {"query": "q"})
        assert timed_out.is_error and text_of(timed_out).startswith("Error executing tool lookup")
        record = store.get("call-l")
        assert record is not None and record.status is Status.UNKNOWN
        retried = await call_tool(client, "call-l", "lookup", {"query": "q"})
        assert not retried.is_error and text_of(retried) == "q: found"

    in_process(store, scenario, runs)
    assert runs == ["cancel", "lookup", "lookup"]


# -- a call without the id ------------------------------------------------------------------------------
def test_call_without_the_id_is_refused_naming_the_meta_key(harness: Harness) -> None:
    async def scenario(session: ClientSession) -> None:
        missing = await session.call_tool("charge", {"account": "acct_6", "cents": 1})
        assert missing.is_error
        text = text_of(missing)
        assert "carries no tool call id in its _meta" in text and repr(TOOL_CALL_ID_META_KEY) in text
        assert "do not retry" in text

        empty = await session.call_tool(
            "acharge",
            {"account": "acct_6", "cents": 1},
            meta=cast(RequestParamsMeta, {TOOL_CALL_ID_META_KEY: "  "}),
        )
        assert empty.is_error
        assert "unusable tool call id" in text_of(empty) and TOOL_CALL_ID_META_KEY in text_of(empty)
        assert harness.runs("charge") == harness.runs("acharge") == 0

        # reversible tools (by the mapping, or by their tag) run without one
        refreshed = await session.call_tool("refresh", {"query": "q"})
        looked_up = await session.call_tool("aslow_lookup", {"query": "q", "seconds": 0.0})
        assert (refreshed.is_error, looked_up.is_error) == (False, False)
        assert harness.runs("refresh") == harness.runs("aslow_lookup") == 1

    run(harness, scenario)


# -- the OpenAI Agents SDK's MCP client -----------------------------------------------------------------
def test_openai_agents_mcp_client_retries_with_the_same_id(harness: Harness) -> None:
    """``MCPServerStdio(tool_meta_resolver=...)`` with the SDK's own retry: the tool runs once, and the
    model gets the refusal text as the tool's output (the first attempt still runs: in progress)."""
    from agents import RunContextWrapper
    from agents.mcp import MCPServerStdio, MCPToolMetaContext, MCPUtil
    from agents.tool_context import ToolContext

    async def main() -> None:
        server = MCPServerStdio(
            params={"command": sys.executable, "args": [str(APP)], "env": harness.env(), "cwd": PROJECT_ROOT},
            client_session_timeout_seconds=CLIENT_TIMEOUT,
            max_retry_attempts=1,
            retry_backoff_seconds_base=1.0,  # time for the first attempt to start before the retry
            tool_meta_resolver=tool_meta_resolver,
        )
        with anyio.fail_after(SCENARIO_TIMEOUT):
            async with server:
                tools = {tool.name: tool for tool in await server.list_tools()}
                arguments = json.dumps({"account": "acct_7", "seconds": SLOW})
                context = ToolContext(
                    None, tool_name="slow_charge", tool_call_id="call_sdk", tool_arguments=arguments
                )
                output = await MCPUtil.invoke_mcp_tool(server, tools["slow_charge"], context, arguments)
                harness.open_gate("slow_charge")
                assert in_progress_text("slow_charge") in json.dumps(output)
                assert harness.runs("slow_charge") == 1
                # without a tool call in the run context, no id is sent
                bare = MCPToolMetaContext(RunContextWrapper(None), "s", "slow_charge", None)
                assert tool_meta_resolver(bare) is None

    anyio.run(main)


# -- without a server process -----------------------------------------------------------------------------
def test_meta_key_follows_the_spec_rules_for_meta_keys() -> None:
    label = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    prefix, name = TOOL_CALL_ID_META_KEY.split("/")
    assert re.fullmatch(rf"{label}(?:\.{label})*", prefix)
    assert re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", name)
    assert prefix.split(".")[1] not in ("modelcontextprotocol", "mcp")  # reserved for MCP itself


def test_tool_call_meta_keeps_other_entries_and_refuses_a_blank_id() -> None:
    assert tool_call_meta("call-1", {"trace": "t"}) == {"trace": "t", TOOL_CALL_ID_META_KEY: "call-1"}
    for bad in ("", "   ", None):
        with pytest.raises(ValueError, match="tool_call_id"):
            tool_call_meta(bad)  # type: ignore[arg-type]


def test_guard_server_guards_each_tool_once_and_refuses_other_servers() -> None:
    server: MCPServer[Any] = MCPServer("s")

    @server.tool()
    def ping() -> str:
        return "pong"

    @server.tool()
    def clash(airlock_mcp_context: str) -> str:
        return airlock_mcp_context

    guard = EffectGuard()
    with pytest.raises(ValueError, match="airlock_mcp_context"):
        guard_server(server, guard)
    server.remove_tool("clash")
    assert guard_server(server, guard) == ["ping"]  # the refused call guarded none
    assert guard_server(server, guard) == []
    with pytest.raises(TypeError, match="MCPServer"):
        guard_server(object(), guard)  # type: ignore[arg-type]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60, env=child_env()
    )


def test_import_airlock_redis_does_not_import_mcp() -> None:
    done = _python("import sys, airlock_redis, airlock_redis.integrations; print('mcp' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_integration_without_mcp_names_the_extra() -> None:
    done = _python(
        "import sys; sys.modules['mcp'] = None\n"
        "try:\n    import airlock_redis.integrations.mcp\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'airlock-redis[mcp]'" in done.stdout
