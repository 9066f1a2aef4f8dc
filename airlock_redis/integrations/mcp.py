"""MCP (Model Context Protocol): the host's tool call id travels in the request's ``_meta``.

MCP has no id of its own for a tool call: the JSON-RPC request id is per connection, is reused by
other sessions and changes when a client sends the call again, so nothing is keyed on it. The client
puts the model's tool call id into ``_meta`` under :data:`TOOL_CALL_ID_META_KEY`, and the server
runs each tool call through the guard under that id.

Server (mcp 2.3, ``mcp.server.mcpserver.MCPServer``)::

    server = MCPServer("billing")

    @server.tool()
    def charge(account: str, cents: int) -> str: ...

    guard_server(server, EffectGuard(RedisEffectStore(url)))  # after the tools are registered
    server.run("stdio")

Client: ``await session.call_tool(name, args, meta=tool_call_meta(tool_call.id))`` (or
:func:`call_tool`); under the OpenAI Agents SDK, ``MCPServerStdio(...,
tool_meta_resolver=tool_meta_resolver)``.

A refusal reaches the client as the tool's error result (``isError``) whose text tells the model
what happened and what to do; a call to a tool that is not reversible without the id in ``_meta``
is refused with a text that names the key. So does the first error of a tool that is not reversible
when it leaves the call in doubt (a ``TimeoutError``, ...: the record is ``unknown``): the text says
the call may have taken effect and must not be issued again, where the server alone would say
"Error executing tool <name>". Any other error of the tool is the server's to report, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..core.errors import EffectRefused, ToolCallIdRequired
from ._common import GuardedToolCalls, ProbeMap, ReversibilityMap, install_hint, refusal_text

try:
    from mcp.client import Client, ClientSession
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.tools import Tool
    from mcp.types import CallToolResult, RequestParamsMeta
except ImportError as exc:
    raise ImportError(
        "airlock_redis.integrations.mcp needs the MCP SDK 2.3 ('mcp', with mcp.server.mcpserver), "
        f"which is not installed: {install_hint('mcp')}"
    ) from exc

if TYPE_CHECKING:
    from ..guard import EffectGuard

__all__ = [
    "TOOL_CALL_ID_META_KEY",
    "call_tool",
    "guard_server",
    "tool_call_id_from",
    "tool_call_meta",
    "tool_meta_resolver",
]

TOOL_CALL_ID_META_KEY = "io.github.airlock-redis/tool_call_id"
"""The ``_meta`` key that carries the host's tool call id. Named by the spec's rules for ``_meta``
keys: a reverse-DNS prefix (whose second label is neither ``modelcontextprotocol`` nor ``mcp``, which
MCP reserves), a slash, and a name."""

# the keyword under which MCPServer hands a guarded tool its Context, when the tool takes none itself
_CONTEXT_KWARG = "airlock_mcp_context"
# set on a tool function guard_server has replaced: the guard it runs under
_GUARDED_MARK = "__airlock_mcp_guard__"


# -- client side -----------------------------------------------------------------------------------
def tool_call_meta(tool_call_id: str, meta: Mapping[str, Any] | None = None) -> RequestParamsMeta:
    """The ``_meta`` of a ``tools/call`` that carries ``tool_call_id`` (plus the entries of ``meta``)::

    await session.call_tool("charge", {"cents": 500}, meta=tool_call_meta(tool_call.id))

    Raises ValueError when ``tool_call_id`` is not a non-blank string.
    """
    if not isinstance(tool_call_id, str) or not tool_call_id.strip():
        raise ValueError(f"tool_call_id must be a non-blank string, not {tool_call_id!r}")
    return cast(RequestParamsMeta, {**(meta or {}), TOOL_CALL_ID_META_KEY: tool_call_id})


async def call_tool(
    session: ClientSession | Client,
    tool_call_id: str,
    name: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    read_timeout_seconds: float | None = None,
    meta: Mapping[str, Any] | None = None,
) -> CallToolResult:
    """``session.call_tool(name, arguments)`` with ``tool_call_id`` in its ``_meta``. Send the same
    id again to retry the same call (after a timeout, a lost connection, a restart): a guarded tool
    runs once, and the retry gets its stored result or a refusal that says why."""
    return await session.call_tool(
        name,
        dict(arguments) if arguments is not None else None,
        read_timeout_seconds=read_timeout_seconds,
        meta=tool_call_meta(tool_call_id, meta),
    )


class ToolMetaContext(Protocol):
    """What :func:`tool_meta_resolver` reads of the OpenAI Agents SDK's ``MCPToolMetaContext``."""

    @property
    def run_context(self) -> Any: ...


def tool_meta_resolver(context: ToolMetaContext) -> dict[str, Any] | None:
    """A ``tool_meta_resolver`` for the OpenAI Agents SDK's MCP servers (``MCPServerStdio``,
    ``MCPServerStreamableHttp``, ...): puts the model's tool call id (``ToolContext.tool_call_id``)
    into every ``tools/call`` the agent makes. The SDK resolves it once per tool call, so its own
    retries (``max_retry_attempts``) carry the same id. Returns None when the run context has no tool
    call id; the server then refuses a tool that is not reversible, naming the key."""
    tool_call_id = getattr(context.run_context, "tool_call_id", None)
    if not isinstance(tool_call_id, str) or not tool_call_id.strip():
        return None
    return {TOOL_CALL_ID_META_KEY: tool_call_id}


# -- server side -----------------------------------------------------------------------------------
def tool_call_id_from(context: Context[Any, Any]) -> Any:
    """The tool call id the request carries in its ``_meta`` (None without one, or outside a request).
    Returned as sent: the guard decides whether it is usable."""
    try:
        meta = context.request_context.meta
    except ValueError:  # a Context made outside a request (MCPServer.call_tool called in process)
        return None
    return meta.get(TOOL_CALL_ID_META_KEY) if meta else None


def guard_server(
    server: MCPServer[Any],
    guard: EffectGuard,
    *,
    reversibility: ReversibilityMap | None = None,
    reconcile: ProbeMap | None = None,
) -> list[str]:
    """Guard every tool registered on ``server`` so far; returns the names of those it guarded now.

    Each call runs under the tool call id of its request's ``_meta`` (:data:`TOOL_CALL_ID_META_KEY`).
    A tool's reversibility is ``reversibility[name]`` when the mapping names it, else its
    ``@reversibility`` tag (untagged: irreversible). A replay returns the stored result, which the
    server converts as it converts the tool's own return value. A refusal is raised as the tool's
    :class:`ToolError`, so the client gets an ``isError`` result whose text says what happened and
    what to do. A tool already wrapped with ``guard.wrap`` still gives one record and one execution.
    Tools registered later are not guarded (call this again: guarded tools are skipped).
    ``reconcile`` maps tool names to probes, asked when a call is in doubt (docs/in-doubt.md).

    Works on the tools MCPServer 2.3 keeps (its ``_tool_manager``): the ``mcp`` extra pins that.
    Raises TypeError when ``server`` has no such tools, and ValueError (guarding none) when a tool
    has an argument named ``airlock_mcp_context``, the keyword its Context is passed under.
    """
    manager = getattr(server, "_tool_manager", None)
    if manager is None or not callable(getattr(manager, "list_tools", None)):
        raise TypeError(
            f"guard_server needs an mcp.server.mcpserver.MCPServer (mcp 2.3), not {type(server).__name__}"
        )
    calls = GuardedToolCalls(guard, reversibility, reconcile)
    tools = [tool for tool in cast(list[Tool], manager.list_tools()) if not hasattr(tool.fn, _GUARDED_MARK)]
    for tool in tools:
        if _CONTEXT_KWARG in tool.parameters.get("properties", {}):
            raise ValueError(
                f"tool {tool.name!r} has an argument named {_CONTEXT_KWARG!r}, which guard_server uses"
            )
    for tool in tools:
        _guard_tool(calls, tool)
    return [tool.name for tool in tools]


def _guard_tool(calls: GuardedToolCalls, tool: Tool) -> None:
    """Swap the tool's function for one that runs it through the guard; its schema, argument
    validation and result conversion stay the tool's own."""
    fn, name = tool.fn, tool.name
    own_context = tool.context_kwarg  # the tool's own Context parameter, if it has one
    context_kwarg = own_context or _CONTEXT_KWARG
    # what is recorded: the model's arguments, not the Context nor values filled in by resolvers
    not_arguments = {context_kwarg, *tool.resolved_params}

    def split(kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        context = kwargs[context_kwarg]
        passed = kwargs if own_context else {k: v for k, v in kwargs.items() if k != context_kwarg}
        arguments = {k: v for k, v in kwargs.items() if k not in not_arguments}
        return tool_call_id_from(context), passed, arguments

    if tool.is_async:

        async def run_async(**kwargs: Any) -> Any:
            tool_call_id, passed, arguments = split(kwargs)
            level = calls.level_of(name, fn)
            try:
                return await calls.arun(tool_call_id, name, level, arguments, lambda: fn(**passed))
            except EffectRefused as refusal:
                raise ToolError(_refusal_text(refusal, tool_call_id)) from refusal

        runner: Callable[..., Any] = run_async
    else:

        def run_sync(**kwargs: Any) -> Any:  # MCPServer runs it on a worker thread
            tool_call_id, passed, arguments = split(kwargs)
            level = calls.level_of(name, fn)
            try:
                return calls.run(tool_call_id, name, level, arguments, lambda: fn(**passed))
            except EffectRefused as refusal:
                raise ToolError(_refusal_text(refusal, tool_call_id)) from refusal

        runner = run_sync
    setattr(runner, _GUARDED_MARK, calls.guard)
    tool.fn = runner
    tool.context_kwarg = context_kwarg


def _refusal_text(refusal: EffectRefused, tool_call_id: Any) -> str:
    """The model's text for a refusal; for a missing or unusable id, one that names the key."""
    if not isinstance(refusal, ToolCallIdRequired):
        return refusal_text(refusal)
    problem = (
        "no tool call id"
        if tool_call_id is None
        else "an unusable tool call id (blank, too long or not a string)"
    )
    return (
        f"Tool {refusal.tool!r} was not run: the request carries {problem} in its _meta "
        f"(key {TOOL_CALL_ID_META_KEY!r}), so it could not be guarded against running twice. This is "
        "a setup problem of the MCP client, not of the call: do not retry; tell the user."
    )
