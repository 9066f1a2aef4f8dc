"""``airlock-redis demo --framework``: the story told by one agent of a real framework (LangChain or
the OpenAI Agents SDK), guarded by its integration, with a scripted model (no network, no API key).
The framework is imported only here, and only when asked for; see :mod:`.demo_common` for what this
part shares with the rest of the demo (:mod:`.demo_cmd`): its keys, counters, TTLs and clean-up."""

from __future__ import annotations

import argparse
import importlib
import secrets
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import MODEL_MESSAGES
from ..core.records import Status
from ..core.reversibility import reversibility
from ..integrations._common import install_hint
from ..stores.url import SyncClient
from . import demo_common
from .common import check_given_url, embedded_or_given
from .demo_common import DEMO_TTL, FRAMEWORKS, backend_client, count_execution, execution_count, say

if TYPE_CHECKING:
    from ..guard import EffectGuard
    from ..stores.redis_store import RedisEffectStore


# -- --framework: one agent of a real framework, guarded by its integration -------------------------
FRAMEWORK_TOOLS = ("charge_card", "send_email", "lookup")
FRAMEWORK_EXECUTIONS = {"charge_card": 1, "send_email": 1, "lookup": 2}  # what the story must end with
FINAL_ANSWER = "Done."  # what the scripted model says once it has the tool's result


@dataclass(frozen=True)
class AgentCall:
    """The one tool call a scripted model asks for."""

    tool_call_id: str
    tool: str
    args: dict[str, Any]


@dataclass(frozen=True)
class AgentTurn:
    """What one agent run did with its tool call: the error that ended the run ("Type: message"), the
    tool's result as the model was shown it, and the agent's final answer."""

    error: str | None
    shown: str | None
    final: str | None


class AgentHost(Protocol):
    """Runs a framework's agent whose model asks for one tool call: the first time, and again as a
    host that retries it (the same tool call id)."""

    description: str

    def first(self, call: AgentCall) -> AgentTurn: ...

    def retry(self, call: AgentCall) -> AgentTurn: ...


def framework_tools(backend: SyncClient, namespace: str, times_out: set[str]) -> list[Callable[..., str]]:
    """The agent's tools, plain functions for any framework's decorator. Each counts its real runs
    in Redis; a tool named in ``times_out`` acts, then loses its answer (TimeoutError) once."""

    def execute(tool: str) -> None:
        count_execution(backend, namespace, tool)
        if tool in times_out:
            times_out.discard(tool)
            raise TimeoutError(f"{tool}: the answer was lost")

    def charge_card(card: str, cents: int) -> str:
        """Charge a card."""
        execute("charge_card")
        return f"charged {cents} cents to {card}"

    def send_email(to: str, subject: str) -> str:
        """Send an email."""
        execute("send_email")
        return f"sent {subject!r} to {to}"

    @reversibility("reversible")
    def lookup(order: str) -> str:
        """Look an order up."""
        execute("lookup")
        return f"order {order}: shipped"

    return [charge_card, send_email, lookup]  # untagged tools are irreversible


def _langchain_host(guard: EffectGuard, tools: list[Callable[..., str]]) -> AgentHost:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from ..integrations.langchain import EffectGuardMiddleware

    class ScriptedChat(FakeMessagesListChatModel):
        """Answers with its scripted messages in order (then the last one again); keeps the messages
        of its last call, which is what the model was shown."""

        shown: list[BaseMessage] = []  # noqa: RUF012 - a pydantic field (copied per instance)

        def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:
            return self

        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
            self.shown = list(messages)
            reply = self.responses[min(self.i, len(self.responses) - 1)]
            self.i += 1
            return ChatResult(generations=[ChatGeneration(message=reply)])

    class Host:
        description = "A LangChain agent (create_agent), its tools guarded by EffectGuardMiddleware"

        def __init__(self) -> None:
            self.tools = [tool(function) for function in tools]
            self.middleware = EffectGuardMiddleware(guard)
            self.checkpointer = InMemorySaver()
            self.agents: dict[str, tuple[Any, ScriptedChat]] = {}

        def first(self, call: AgentCall) -> AgentTurn:
            asks = {"id": call.tool_call_id, "name": call.tool, "args": call.args, "type": "tool_call"}
            model = ScriptedChat(responses=[AIMessage("", tool_calls=[asks]), AIMessage(FINAL_ANSWER)])
            agent = create_agent(
                model, self.tools, middleware=[self.middleware], checkpointer=self.checkpointer
            )
            self.agents[call.tool_call_id] = (agent, model)
            config: RunnableConfig = {"configurable": {"thread_id": call.tool_call_id}}
            return self._turn(call, model, lambda: agent.invoke({"messages": [HumanMessage("go")]}, config))

        def retry(self, call: AgentCall) -> AgentTurn:
            # the host resumes the thread from its last checkpoint before the tool step, as after a
            # worker that died or lost the step's outcome: the graph runs the same tool call again
            agent, model = self.agents[call.tool_call_id]
            config: RunnableConfig = {"configurable": {"thread_id": call.tool_call_id}}
            before = next(s for s in agent.get_state_history(config) if s.next == ("tools",))
            return self._turn(call, model, lambda: agent.invoke(None, before.config))

        @staticmethod
        def _turn(call: AgentCall, model: ScriptedChat, invoke: Callable[[], Any]) -> AgentTurn:
            model.shown = []
            try:
                result = invoke()
            except Exception as error:  # LangGraph ends the run on a tool's exception
                return AgentTurn(_error_text(error), None, None)
            replies = [
                m for m in model.shown if isinstance(m, ToolMessage) and m.tool_call_id == call.tool_call_id
            ]
            shown = str(replies[-1].content) if replies else None
            return AgentTurn(None, shown, str(result["messages"][-1].content))

    return Host()


def _openai_agents_host(guard: EffectGuard, tools: list[Callable[..., str]]) -> AgentHost:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from ..integrations.openai_agents import guard_tools

    class Host:
        description = "An OpenAI Agents SDK agent, its tools guarded by guard_tools"

        def __init__(self) -> None:
            self.tools = guard_tools([function_tool(function) for function in tools], guard)

        def first(self, call: AgentCall) -> AgentTurn:
            return self._run(call)

        def retry(self, call: AgentCall) -> AgentTurn:
            # the SDK refuses an id reused within one run; the host's retry is another run of the
            # same call (another worker, a re-driven run), which only the guard can recognise
            return self._run(call)

        def _run(self, call: AgentCall) -> AgentTurn:
            model = ScriptedModel(
                [
                    [function_call(call.tool, call.args, call_id=call.tool_call_id)],
                    [assistant_message(FINAL_ANSWER)],
                ]
            )
            agent = Agent(name="ops", model=model, tools=self.tools)
            try:
                result = Runner.run_sync(agent, "go", run_config=RunConfig(tracing_disabled=True))
            except Exception as error:
                return AgentTurn(_error_text(error), None, None)
            last = model.last_call
            items = last.input if last is not None and isinstance(last.input, list) else []
            replies = [
                str(item.get("output"))
                for item in items
                if isinstance(item, dict)
                and item.get("type") == "function_call_output"
                and item.get("call_id") == call.tool_call_id
            ]
            return AgentTurn(None, replies[-1] if replies else None, str(result.final_output))

    return Host()


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


HOSTS: dict[str, Callable[[EffectGuard, list[Callable[..., str]]], AgentHost]] = {
    "langchain": _langchain_host,
    "openai-agents": _openai_agents_host,
}


def framework_problem(framework: str) -> str | None:
    """None when the framework's integration imports; else one line naming the extra to install."""
    module, extra, name = FRAMEWORKS[framework]
    try:
        importlib.import_module(f"airlock_redis.integrations.{module}")
    except ImportError:
        return f"--framework {framework} needs {name}, which is not installed: {install_hint(extra)}"
    return None


class _Story:
    """Tells the framework story one step at a time, each checked against what the spec says."""

    def __init__(self, host: AgentHost, store: RedisEffectStore, backend: SyncClient, namespace: str) -> None:
        self.host, self.store, self.backend, self.namespace = host, store, backend, namespace
        self.failures = 0

    def runs(self, tool: str, step: Callable[[], AgentTurn]) -> tuple[AgentTurn, int]:
        """Take one step: what the agent run did, and how many times the tool really ran in it."""
        before = execution_count(self.backend, self.namespace, tool)
        turn = step()
        return turn, execution_count(self.backend, self.namespace, tool) - before

    def status(self, call: AgentCall) -> Status | None:
        record = self.store.get(call.tool_call_id)
        return record.status if record is not None else None

    def say(self, text: str, ok: bool, turn: AgentTurn) -> None:
        if not ok:
            self.failures += 1
            ended = f"; the run ended with {turn.error}" if turn.error else ""
            text = f"{text}  <- NOT as the spec says{ended}"
        say(text)


def _tell_framework(story: _Story, times_out: set[str]) -> None:
    host = story.host
    charge = AgentCall("call_1", "charge_card", {"card": "card_4242", "cents": 500})
    turn, ran = story.runs(charge.tool, lambda: host.first(charge))
    stored = story.status(charge) is Status.COMMITTED
    story.say(
        f"1. charge_card (irreversible), id call_1: the tool ran, its result is stored: {turn.shown!r}",
        ran == 1 and turn.error is None and stored,
        turn,
    )
    result = turn.shown
    turn, ran = story.runs(charge.tool, lambda: host.retry(charge))
    story.say(
        f"2. the host retries call_1 (same id): replayed, the tool did not run again: {turn.shown!r}",
        ran == 0 and turn.error is None and turn.shown == result,
        turn,
    )

    email = AgentCall("call_2", "send_email", {"to": "ann@example.com", "subject": "Invoice"})
    times_out.add(email.tool)
    turn, ran = story.runs(email.tool, lambda: host.first(email))
    in_doubt = story.status(email) is Status.UNKNOWN
    story.say(
        "3. send_email, id call_2: it acts, then times out (TimeoutError): recorded in doubt",
        ran == 1 and in_doubt,
        turn,
    )
    turn, ran = story.runs(email.tool, lambda: host.retry(email))
    told = turn.shown is not None and MODEL_MESSAGES["effect_status_unknown"] in turn.shown
    story.say(
        f"   the host retries call_2: refused, the model receives: {turn.shown}", ran == 0 and told, turn
    )
    story.say(
        f"   the agent run finishes normally: {turn.final!r}",
        turn.error is None and turn.final == FINAL_ANSWER,
        turn,
    )

    lookup = AgentCall("call_3", "lookup", {"order": "1042"})
    times_out.add(lookup.tool)
    turn, ran_first = story.runs(lookup.tool, lambda: host.first(lookup))
    turn, ran = story.runs(lookup.tool, lambda: host.retry(lookup))
    story.say(
        f"4. lookup (reversible), id call_3: it times out too; the retry runs it again: {turn.shown!r}",
        ran_first == 1 and ran == 1 and turn.shown == "order 1042: shipped",
        turn,
    )


def run_framework(
    args: argparse.Namespace,
    *,
    clean: Callable[[str, str, Sequence[str]], dict[str, int]] = demo_common.clean,
) -> int:
    """``demo --framework ...``: the story told by one agent of that framework, in this process.
    ``clean`` reads the run's execution counts and removes its keys (``demo`` passes its own)."""
    from ..guard import EffectGuard
    from ..stores.redis_store import RedisEffectStore

    namespace = f"{args.namespace}:demo:{secrets.token_hex(4)}"
    problem = framework_problem(args.framework) or check_given_url(args.url, namespace=namespace)
    if problem is not None:
        print(f"airlock-redis demo: {problem}", file=sys.stderr)
        return 2
    failures = 0
    with embedded_or_given(args.url) as target:
        try:
            say(f"Redis: {target.description}")
            backend = backend_client(target.url)
            store = RedisEffectStore(
                target.url,
                namespace=namespace,
                committed_ttl=DEMO_TTL,
                pending_ttl=DEMO_TTL,
                unknown_ttl=DEMO_TTL,
            )
            try:
                times_out: set[str] = set()
                host = HOSTS[args.framework](
                    EffectGuard(store=store), framework_tools(backend, namespace, times_out)
                )
                say(f"{host.description}; a scripted model (no network, no API key) asks for the calls.\n")
                story = _Story(host, store, backend, namespace)
                _tell_framework(story, times_out)
                failures = story.failures
            finally:
                store.close()
                backend.close()
        finally:  # also when the run ends early: its keys go now, not when their TTL runs out
            counts = clean(target.url, namespace, FRAMEWORK_TOOLS)
    say("\nexecutions: " + ", ".join(f"{tool} {counts[tool]}" for tool in FRAMEWORK_TOOLS))
    if failures or counts != FRAMEWORK_EXECUTIONS:
        print(f"DEMO FAILED: {failures} step(s) did not behave as the spec says", file=sys.stderr)
        return 1
    say("every irreversible call ran at most once.")
    return 0
