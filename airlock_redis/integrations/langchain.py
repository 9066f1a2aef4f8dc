"""LangChain / LangGraph: guard every tool call of an agent, keyed on the model's tool call id.

::

    from airlock_redis.integrations.langchain import EffectGuardMiddleware

    agent = create_agent(model, tools, middleware=[EffectGuardMiddleware(guard)])

    # or a LangGraph ToolNode of your own
    mw = EffectGuardMiddleware(guard)
    node = ToolNode(tools, wrap_tool_call=mw.wrap_tool_call, awrap_tool_call=mw.awrap_tool_call)

The record is keyed on ``tool_call["id"]`` and holds ``tool_call["name"]`` and ``tool_call["args"]``.
A replay gives back the first ToolMessage's content and status under this call's id; a refusal
becomes an error ToolMessage that tells the model what happened and what to do
(``on_refusal="raise"`` raises the :class:`~airlock_redis.EffectRefused` instead). An error of a
tool that is not reversible that leaves the call in doubt (a ``TimeoutError``, ...: the record is
``unknown``) is such a refusal on its first attempt already: the model reads that the call may have
taken effect and must not be issued again. Any other error of the tool (an ordinary one, or a
reversible tool's) goes on to the framework's error handling. A ToolNode made with
``handle_tool_errors=True`` turns a tool's error into an error ToolMessage before the guard sees it:
the guard then stores that message as the call's result, and the model gets the ToolNode's text.

Put it last in ``middleware=[...]`` (innermost), so that retry and error-handling middleware wrap
it: an exception from the tool then reaches the guard first, and a call in doubt is recorded as such.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from ..core.codec import encode_result
from ..core.errors import EffectRefused, ResultEncodingError
from ..core.reversibility import Reversibility
from ._common import GuardedToolCalls, ProbeMap, ReversibilityMap, framework_missing, refusal_text

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, ToolCallRequest
    from langchain_core.messages import ToolMessage
    from langgraph.types import Command
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise framework_missing("langchain", extra="langchain") from exc

if TYPE_CHECKING:
    from ..guard import EffectGuard

__all__ = ["EffectGuardMiddleware"]

ToolResult = ToolMessage | Command[Any]
OnRefusal = Literal["message", "raise"]

# what a guarded call stores: the ToolMessage's parts the model sees (and a plain-data artifact)
_CONTENT, _STATUS, _ARTIFACT = "content", "status", "artifact"


class _NotStored:
    """Stands for a result that is not a ToolMessage (a Command): the guard cannot store it, so the
    call still runs at most once, and a retry is refused as ``result_not_stored``."""

    __slots__ = ()


class EffectGuardMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Guards each tool call of a LangChain agent (or a LangGraph ``ToolNode``) with ``guard``.

    ``reversibility`` maps tool names to ``"reversible"``, ``"costly"`` or ``"irreversible"`` for
    tools you do not own; otherwise a tool takes the ``@reversibility`` tag on the function under
    ``@tool`` (untagged: irreversible). ``on_refusal="message"`` answers a refusal with an error
    ToolMessage for the model; ``"raise"`` raises the :class:`~airlock_redis.EffectRefused`.
    ``reconcile`` maps tool names to probes, asked when a call is in doubt (docs/in-doubt.md).
    """

    def __init__(
        self,
        guard: EffectGuard,
        *,
        reversibility: ReversibilityMap | None = None,
        on_refusal: OnRefusal = "message",
        reconcile: ProbeMap | None = None,
    ) -> None:
        super().__init__()
        if on_refusal not in ("message", "raise"):
            raise ValueError(f"on_refusal must be 'message' or 'raise', not {on_refusal!r}")
        self.guard = guard
        self.on_refusal: OnRefusal = on_refusal
        self._calls = GuardedToolCalls(guard, reversibility, reconcile)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        call = request.tool_call
        ran: list[ToolResult] = []

        def body() -> Any:
            result = handler(request)
            ran.append(result)
            return _stored_form(result)

        try:
            stored = self._calls.run(call["id"], call["name"], self._level(request), _args(call), body)
        except EffectRefused as refusal:
            return self._refused(request, refusal)
        return ran[0] if ran else _replayed(request, stored)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        call = request.tool_call
        ran: list[ToolResult] = []

        async def body() -> Any:
            result = await handler(request)
            ran.append(result)
            return _stored_form(result)

        try:
            stored = await self._calls.arun(call["id"], call["name"], self._level(request), _args(call), body)
        except EffectRefused as refusal:
            return self._refused(request, refusal)
        return ran[0] if ran else _replayed(request, stored)

    def _level(self, request: ToolCallRequest) -> Reversibility:
        tool = request.tool
        sources: tuple[Any, ...] = ()
        if tool is not None:
            # @reversibility sits on the function under @tool (a StructuredTool's func/coroutine),
            # or on the _run/_arun of a BaseTool subclass
            sources = (
                getattr(tool, "func", None),
                getattr(tool, "coroutine", None),
                getattr(type(tool), "_run", None),
                getattr(type(tool), "_arun", None),
            )
        return self._calls.level_of(request.tool_call["name"], *sources)

    def _refused(self, request: ToolCallRequest, refusal: EffectRefused) -> ToolMessage:
        if self.on_refusal == "raise":
            raise refusal
        call = request.tool_call
        return ToolMessage(
            content=refusal_text(refusal),
            status="error",
            tool_call_id=call["id"] or "",
            name=call["name"],
        )


def _args(call: Mapping[str, Any]) -> Mapping[str, Any]:
    args = call.get("args")
    return args if isinstance(args, Mapping) else {}


def _stored_form(result: Any) -> Any:
    if not isinstance(result, ToolMessage):
        return _NotStored()
    stored: dict[str, Any] = {_CONTENT: result.content, _STATUS: result.status}
    if result.artifact is not None:
        # the artifact never reaches the model: kept when it is plain data, else left out of the
        # replay rather than making the whole result unstorable
        try:
            encode_result(result.artifact)
        except ResultEncodingError:
            pass
        else:
            stored[_ARTIFACT] = result.artifact
    return stored


def _replayed(request: ToolCallRequest, stored: Any) -> ToolMessage:
    call = request.tool_call
    if isinstance(stored, Mapping) and _CONTENT in stored:
        content, status = stored[_CONTENT], stored.get(_STATUS, "success")
        artifact = stored.get(_ARTIFACT)
    else:  # stored by another integration under this id, tool and arguments: show it as it is
        content, status, artifact = str(stored), "success", None
    return ToolMessage(
        content=content,
        status=status if status in ("success", "error") else "success",
        artifact=artifact,
        tool_call_id=call["id"] or "",
        name=call["name"],
    )
