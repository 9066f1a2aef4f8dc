"""OpenAI Agents SDK: guard an agent's function tools, keyed on the model's tool call id.

::

    from airlock_redis.integrations.openai_agents import guard_tools

    agent = Agent(name="ops", tools=guard_tools([refund, send_email], guard))

Each returned :class:`agents.FunctionTool` runs its ``on_invoke_tool`` under
``ToolContext.tool_call_id``: the record holds the tool's name and the JSON arguments the model
sent. A replay returns the stored output; a refusal comes back to the model as the tool's output,
a text that says what happened and what to do (never the SDK's "please try again"). An error of the
tool itself is recorded first. One that leaves a tool that is not reversible in doubt (a
``TimeoutError``, ...: the call is ``unknown``) is a refusal too, on its first attempt: the model
reads that the call may have taken effect and must not be issued again, under this id or another.
Any other error (an ordinary one, which releases the call, or a reversible tool's) is handled as
the SDK handles tool errors (the tool's ``failure_error_function``). ``needs_approval`` and the
other settings of each tool are kept.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.errors import EffectRefused
from ._common import GuardedToolCalls, ProbeMap, ReversibilityMap, framework_missing, refusal_text

try:
    from agents import FunctionTool, Tool
    from agents.tool import maybe_invoke_function_tool_failure_error_function
    from agents.tool import set_function_tool_failure_error_function as _set_failure_function
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise framework_missing("openai_agents", extra="openai-agents") from exc

if TYPE_CHECKING:
    from ..guard import EffectGuard

__all__ = ["guard_tools"]


def guard_tools(
    tools: Iterable[Tool],
    guard: EffectGuard,
    *,
    reversibility: ReversibilityMap | None = None,
    reconcile: ProbeMap | None = None,
) -> list[Tool]:
    """Return copies of ``tools`` whose calls run at most once through ``guard``.

    ``reversibility`` maps tool names to ``"reversible"``, ``"costly"`` or ``"irreversible"`` for
    tools you do not own; otherwise a tool takes the ``@reversibility`` tag on the function under
    ``@function_tool`` (or on the FunctionTool itself; untagged: irreversible). Only function tools
    run in this process, so anything else (a hosted tool) is a TypeError: pass it to the Agent as is.
    The list is typed ``list[Tool]`` so that it goes straight into ``Agent(tools=...)``; each item
    is a :class:`~agents.FunctionTool`. ``reconcile`` maps tool names to probes, asked when a call
    is in doubt (docs/in-doubt.md).
    """
    calls = GuardedToolCalls(guard, reversibility, reconcile)
    guarded: list[Tool] = []
    for tool in tools:
        if not isinstance(tool, FunctionTool):
            raise TypeError(
                f"guard_tools guards FunctionTools (run by this process), not {type(tool).__name__}: "
                "pass it to the Agent without guard_tools"
            )
        guarded.append(_guarded(tool, calls))
    return guarded


def _guarded(tool: FunctionTool, calls: GuardedToolCalls) -> FunctionTool:
    # A copy whose errors are raised, not turned into text: the guard must see the exception to
    # tell a failure from a call in doubt. The SDK's handling is applied after the guard has
    # recorded the outcome, with the original tool's failure_error_function.
    raising = _set_failure_function(dataclasses.replace(tool), None)
    name = tool.name

    async def on_invoke_tool(ctx: ToolContext[Any], input: str) -> Any:
        level = calls.level_of(name, tool)
        try:
            return await calls.arun(
                ctx.tool_call_id, name, level, _arguments(input), lambda: raising.on_invoke_tool(ctx, input)
            )
        except EffectRefused as refusal:
            return refusal_text(refusal)
        except Exception as error:
            handled = await maybe_invoke_function_tool_failure_error_function(
                function_tool=guarded, context=ctx, error=error
            )
            if handled is None:
                raise
            return handled

    guarded = dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
    return guarded


def _arguments(input: str) -> Mapping[str, Any]:
    """The model's arguments as the record holds them: the JSON object by name, or the raw text
    when it is not one (the tool then refuses it, and the failure is recorded as such)."""
    try:
        parsed = json.loads(input) if input else {}
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"arguments_json": input}
