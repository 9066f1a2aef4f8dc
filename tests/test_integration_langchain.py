"""EffectGuardMiddleware against the real LangChain / LangGraph packages: a scripted chat model (no
LLM, no network), records on a real redis-server.

The same tool call id twice runs the tool once and replays its ToolMessage; a call left in doubt
(the tool timed out, the run crashed, the graph is resumed from its checkpoint) reaches the model as
an error ToolMessage that says not to issue it again, on its first attempt too, and the agent
finishes; an ordinary error and a reversible tool's error are the framework's to handle, and a
reversible tool runs again; a tool also wrapped by guard.wrap gives one record; on_refusal="raise"
raises.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from airlock_redis import (
    EffectGuard,
    EffectPolicyViolation,
    EffectStatusUnknown,
    EffectStore,
    Status,
    idempotency_key,
    reversibility,
)
from airlock_redis.core.errors import MODEL_MESSAGES
from airlock_redis.core.reversibility import ReversibilityName
from airlock_redis.integrations.langchain import EffectGuardMiddleware

from .conftest import make_store

MODES = ("sync", "async")
IN_DOUBT = MODEL_MESSAGES["effect_status_unknown"]


class ScriptedChat(FakeMessagesListChatModel):
    """Answers with the scripted messages in order; keeps what it was shown."""

    seen: list[list[BaseMessage]] = []  # noqa: RUF012 - a pydantic field (copied per instance)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def calls_tool(call_id: str, name: str, **args: Any) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"id": call_id, "name": name, "args": args, "type": "tool_call"}]
    )


def script(*steps: AIMessage) -> ScriptedChat:
    return ScriptedChat(responses=[*steps, AIMessage(content="done")])


def run_agent(mode: str, agent: Any, payload: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    if mode == "sync":
        result: dict[str, Any] = agent.invoke(payload, config)
    else:
        result = asyncio.run(agent.ainvoke(payload, config))
    return result


def ask(text: str = "go") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def final_text(result: dict[str, Any]) -> Any:
    return result["messages"][-1].content


def make_send_email(mode: str, runs: list[str], *, fail_first: bool = False) -> BaseTool:
    """A send_email tool, sync or async, that times out on its first call when fail_first."""

    def body(to: str) -> str:
        runs.append(to)
        if fail_first and len(runs) == 1:
            raise TimeoutError("smtp: read timed out")
        return f"sent to {to}"

    if mode == "sync":

        def send_email(to: str) -> str:
            """Send an email."""
            return body(to)

        return tool(send_email)

    async def asend_email(to: str) -> str:
        """Send an email."""
        await asyncio.sleep(0)
        return body(to)

    return tool("send_email")(asend_email)


@pytest.fixture
def store(request: pytest.FixtureRequest, namespace: str) -> EffectStore:
    return make_store("redis", request, namespace)


@pytest.fixture
def guard(store: EffectStore) -> EffectGuard:
    return EffectGuard(store)


@pytest.mark.parametrize("mode", MODES)
def test_same_id_twice_runs_once_and_replays_the_tool_message(mode: str, guard: EffectGuard) -> None:
    runs: list[str] = []
    model = script(calls_tool("c1", "send_email", to="ann"), calls_tool("c1", "send_email", to="ann"))
    agent = create_agent(model, [make_send_email(mode, runs)], middleware=[EffectGuardMiddleware(guard)])

    result = run_agent(mode, agent, ask())

    first, replay = tool_messages(result)
    assert runs == ["ann"]
    assert (replay.content, replay.status, replay.tool_call_id) == ("sent to ann", "success", "c1")
    assert (first.content, first.status) == (replay.content, replay.status)
    assert final_text(result) == "done"
    record = guard.store.get("c1")
    assert record is not None and record.status is Status.COMMITTED and record.tool == "send_email"
    # the record holds the tool call's own name and args
    assert record.idempotency_key == idempotency_key("send_email", {"to": "ann"})


@pytest.mark.parametrize("mode", MODES)
def test_parallel_tool_calls_are_guarded_each_under_its_own_id(mode: str, guard: EffectGuard) -> None:
    """Several tool calls in one model message run concurrently (threads or tasks): each is its own
    record, and a second message with the same calls replays each one's own result."""
    runs: list[str] = []
    people = ("ann", "bob", "cat")

    def all_three() -> AIMessage:  # a new message each time (the same object would be merged by id)
        return AIMessage(
            content="",
            tool_calls=[
                {"id": f"c_{to}", "name": "send_email", "args": {"to": to}, "type": "tool_call"}
                for to in people
            ],
        )

    model = script(all_three(), all_three())
    agent = create_agent(model, [make_send_email(mode, runs)], middleware=[EffectGuardMiddleware(guard)])

    result = run_agent(mode, agent, ask())

    assert sorted(runs) == list(people)
    replies = {(m.tool_call_id, m.content) for m in tool_messages(result)}
    assert replies == {(f"c_{to}", f"sent to {to}") for to in people}
    assert len(tool_messages(result)) == 2 * len(people)


@pytest.mark.parametrize("mode", MODES)
def test_same_id_with_other_args_is_refused_as_a_message(mode: str, guard: EffectGuard) -> None:
    runs: list[str] = []
    model = script(calls_tool("c1", "send_email", to="ann"), calls_tool("c1", "send_email", to="bob"))
    agent = create_agent(model, [make_send_email(mode, runs)], middleware=[EffectGuardMiddleware(guard)])

    result = run_agent(mode, agent, ask())

    _, refused = tool_messages(result)
    assert runs == ["ann"]
    assert refused.status == "error" and refused.tool_call_id == "c1"
    assert refused.content == f"Tool 'send_email' was not run. {MODEL_MESSAGES['policy_violation']}"
    assert final_text(result) == "done"


def first_in_doubt_text(tool: str, error: str = "TimeoutError") -> str:
    """What the model reads on the first attempt whose error left the call in doubt."""
    return f"The call to {tool!r} may have taken effect: it ended with {error}"


@pytest.mark.parametrize("mode", MODES)
def test_the_first_in_doubt_error_reaches_the_model_as_a_refusal_and_the_model_stops(
    mode: str, guard: EffectGuard
) -> None:
    """The tool times out (the email may have gone out): on this very attempt the model is told that
    the call may have taken effect and must not be issued again, not the tool's error; the run goes
    on, the model stops, and the tool ran once."""
    runs: list[str] = []
    model = script(calls_tool("c1", "send_email", to="ann"))
    agent = create_agent(
        model, [make_send_email(mode, runs, fail_first=True)], middleware=[EffectGuardMiddleware(guard)]
    )

    result = run_agent(mode, agent, ask())

    (refused,) = tool_messages(result)
    assert refused.status == "error" and refused.tool_call_id == "c1" and refused.name == "send_email"
    content = str(refused.content)
    assert content.startswith(first_in_doubt_text("send_email"))
    assert "Do not call it again, under this id or a new one." in content
    assert "try again" not in content.lower() and "read timed out" not in content
    assert any(m.content == content for m in model.seen[-1] if isinstance(m, ToolMessage))  # the model saw it
    assert final_text(result) == "done"
    assert runs == ["ann"]
    record = guard.store.get("c1")
    assert record is not None and record.status is Status.UNKNOWN


@pytest.mark.parametrize("mode", MODES)
def test_in_doubt_retry_reaches_the_model_as_a_refusal_and_the_run_finishes(
    mode: str, guard: EffectGuard
) -> None:
    """The first run's tool times out and its model is told so; the same tool call run again (another
    run of the same conversation, a re-driven run) does not run the tool: the model is told not to
    issue it again, and the agent finishes."""
    runs: list[str] = []
    tools = [make_send_email(mode, runs, fail_first=True)]
    first = run_agent(
        mode,
        create_agent(
            script(calls_tool("c1", "send_email", to="ann")), tools, middleware=[EffectGuardMiddleware(guard)]
        ),
        ask(),
    )
    assert str(tool_messages(first)[0].content).startswith(first_in_doubt_text("send_email"))

    model = script(calls_tool("c1", "send_email", to="ann"))
    result = run_agent(mode, create_agent(model, tools, middleware=[EffectGuardMiddleware(guard)]), ask())

    (refused,) = tool_messages(result)
    assert runs == ["ann"]
    assert refused.status == "error" and refused.tool_call_id == "c1"
    assert IN_DOUBT in str(refused.content)
    assert "try again" not in str(refused.content).lower()
    assert any(IN_DOUBT in str(m.content) for m in model.seen[-1])  # the model was shown it
    assert final_text(result) == "done"


@pytest.mark.parametrize("mode", MODES)
def test_an_ordinary_error_keeps_the_frameworks_handling_and_releases_the_call(
    mode: str, guard: EffectGuard
) -> None:
    """A ValueError leaves nothing in doubt: the run fails on it as LangGraph fails on a tool error,
    and the call is released (a retry runs it)."""
    runs: list[str] = []

    @tool
    def cancel(order: str) -> str:
        """Cancel an order."""
        runs.append(order)
        raise ValueError("order is already shipped")

    agent = create_agent(
        script(calls_tool("c1", "cancel", order="o1")), [cancel], middleware=[EffectGuardMiddleware(guard)]
    )
    with pytest.raises(ValueError, match="already shipped"):
        run_agent(mode, agent, ask())
    assert runs == ["o1"]
    assert guard.store.get("c1") is None


@pytest.mark.parametrize("how", ("tag", "mapping"))
@pytest.mark.parametrize("mode", MODES)
def test_reversible_tool_runs_again_after_doubt(mode: str, how: str, guard: EffectGuard) -> None:
    runs: list[str] = []

    def lookup(city: str) -> str:
        """Look the weather up."""
        runs.append(city)
        if len(runs) == 1:
            raise TimeoutError("weather api: read timed out")
        return f"sunny in {city}"

    if how == "tag":
        lookup = reversibility("reversible")(lookup)
    mapping: dict[str, ReversibilityName] | None = {"lookup": "reversible"} if how == "mapping" else None
    model = script(calls_tool("c1", "lookup", city="Oslo"))
    agent = create_agent(
        model,
        [tool(lookup)],
        middleware=[EffectGuardMiddleware(guard, reversibility=mapping)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": f"thread-{mode}-{how}"}}

    with pytest.raises(TimeoutError):
        run_agent(mode, agent, ask(), config)
    result = run_agent(mode, agent, None, config)

    (answer,) = tool_messages(result)
    assert runs == ["Oslo", "Oslo"]
    assert (answer.content, answer.status) == ("sunny in Oslo", "success")
    assert final_text(result) == "done"


@pytest.mark.parametrize("mode", ("sync", "async", "sync-tool-in-async-run"))
def test_tool_also_wrapped_by_guard_wrap_gives_one_record_and_one_run(mode: str, guard: EffectGuard) -> None:
    runs: list[str] = []

    if mode == "async":

        async def send_email_async(to: str) -> str:
            """Send an email."""
            runs.append(to)
            return f"sent to {to}"

        guarded: BaseTool = tool("send_email")(guard.wrap(send_email_async))
    else:

        def send_email(to: str) -> str:
            """Send an email."""
            runs.append(to)
            return f"sent to {to}"

        guarded = tool(guard.wrap(send_email))
    model = script(calls_tool("c1", "send_email", to="ann"), calls_tool("c1", "send_email", to="ann"))
    agent = create_agent(model, [guarded], middleware=[EffectGuardMiddleware(guard)])

    result = run_agent("sync" if mode == "sync" else "async", agent, ask())

    assert [m.content for m in tool_messages(result)] == ["sent to ann", "sent to ann"]
    assert all(m.status == "success" for m in tool_messages(result))
    assert runs == ["ann"]
    record = guard.store.get("c1")
    assert record is not None and record.status is Status.COMMITTED


@pytest.mark.parametrize("mode", MODES)
def test_on_refusal_raise_keeps_the_exception(mode: str, guard: EffectGuard) -> None:
    runs: list[str] = []
    model = script(calls_tool("c1", "send_email", to="ann"), calls_tool("c1", "send_email", to="bob"))
    middleware = EffectGuardMiddleware(guard, on_refusal="raise")
    agent = create_agent(model, [make_send_email(mode, runs)], middleware=[middleware])

    with pytest.raises(EffectPolicyViolation) as refused:
        run_agent(mode, agent, ask())
    assert refused.value.tool_call_id == "c1"
    assert runs == ["ann"]


def test_on_refusal_raise_for_a_call_in_doubt(guard: EffectGuard) -> None:
    runs: list[str] = []
    model = script(calls_tool("c1", "send_email", to="ann"))
    agent = create_agent(
        model,
        [make_send_email("sync", runs, fail_first=True)],
        middleware=[EffectGuardMiddleware(guard, on_refusal="raise")],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "raise-in-doubt"}}
    with pytest.raises(EffectStatusUnknown) as first:  # the first attempt: the refusal, from the error
        run_agent("sync", agent, ask(), config)
    assert isinstance(first.value.__cause__, TimeoutError)
    with pytest.raises(EffectStatusUnknown):  # resumed from the checkpoint: refused, not run
        run_agent("sync", agent, None, config)
    assert runs == ["ann"]


# -- a LangGraph ToolNode of one's own --------------------------------------------------------------
def node_input(*messages: AIMessage) -> dict[str, Any]:
    return {"messages": list(messages)}


def graph_of(node: ToolNode) -> Any:
    """A graph whose one node is ``node``: messages in, the tool messages appended."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def run_node(mode: str, node: ToolNode, payload: dict[str, Any]) -> list[ToolMessage]:
    out = run_agent(mode, graph_of(node), payload)
    messages: Sequence[Any] = out["messages"]
    return [m for m in messages if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("mode", MODES)
def test_tool_node_wrappers_run_once_and_replay(mode: str, guard: EffectGuard) -> None:
    runs: list[str] = []
    mw = EffectGuardMiddleware(guard)
    node = ToolNode(
        [make_send_email(mode, runs)], wrap_tool_call=mw.wrap_tool_call, awrap_tool_call=mw.awrap_tool_call
    )
    call = calls_tool("c7", "send_email", to="ann")

    (first,) = run_node(mode, node, node_input(call))
    (again,) = run_node(mode, node, node_input(call))

    assert runs == ["ann"]
    assert first.content == again.content == "sent to ann"
    assert again.tool_call_id == "c7" and again.status == "success"


@pytest.mark.parametrize("mode", MODES)
def test_tool_node_gives_the_first_in_doubt_error_to_the_model_as_a_refusal(
    mode: str, guard: EffectGuard
) -> None:
    """A ToolNode of one's own (default error handling, which raises a tool's error): the timed-out
    call comes out as the refusal ToolMessage, on the first attempt and on a retry of the same id."""
    runs: list[str] = []
    mw = EffectGuardMiddleware(guard)
    node = ToolNode(
        [make_send_email(mode, runs, fail_first=True)],
        wrap_tool_call=mw.wrap_tool_call,
        awrap_tool_call=mw.awrap_tool_call,
    )
    call = calls_tool("c11", "send_email", to="ann")

    (first,) = run_node(mode, node, node_input(call))
    (again,) = run_node(mode, node, node_input(call))

    assert first.status == "error" and first.tool_call_id == "c11"
    assert str(first.content).startswith(first_in_doubt_text("send_email"))
    assert again.status == "error" and IN_DOUBT in str(again.content)
    assert runs == ["ann"]
    record = guard.store.get("c11")
    assert record is not None and record.status is Status.UNKNOWN


@pytest.mark.parametrize("mode", MODES)
def test_tool_node_keeps_raising_the_error_of_a_reversible_tool(mode: str, guard: EffectGuard) -> None:
    """A reversible tool may be run again: its timeout is the framework's to handle (here, the run
    fails on it), and a retry of the same id runs it."""
    runs: list[str] = []

    @tool
    @reversibility("reversible")
    def lookup(city: str) -> str:
        """Look the weather up."""
        runs.append(city)
        if len(runs) == 1:
            raise TimeoutError("weather api: read timed out")
        return f"sunny in {city}"

    mw = EffectGuardMiddleware(guard)
    node = ToolNode([lookup], wrap_tool_call=mw.wrap_tool_call, awrap_tool_call=mw.awrap_tool_call)
    call = calls_tool("c12", "lookup", city="Oslo")

    with pytest.raises(TimeoutError):
        run_node(mode, node, node_input(call))
    (again,) = run_node(mode, node, node_input(call))
    assert (again.content, again.status) == ("sunny in Oslo", "success")
    assert runs == ["Oslo", "Oslo"]


@pytest.mark.parametrize("mode", MODES)
def test_tool_node_replays_an_error_message_with_its_status(mode: str, guard: EffectGuard) -> None:
    """With handle_tool_errors=True the ToolNode turns a tool's exception into an error ToolMessage
    inside the guarded call: that message is the call's result, replayed with its status."""
    runs: list[str] = []

    @tool
    def cancel(order: str) -> str:
        """Cancel an order."""
        runs.append(order)
        raise ValueError("order is already shipped")

    mw = EffectGuardMiddleware(guard)
    node = ToolNode(
        [cancel],
        wrap_tool_call=mw.wrap_tool_call,
        awrap_tool_call=mw.awrap_tool_call,
        handle_tool_errors=True,
    )
    call = calls_tool("c8", "cancel", order="o1")

    (first,) = run_node(mode, node, node_input(call))
    (again,) = run_node(mode, node, node_input(call))

    assert runs == ["o1"]
    assert first.status == again.status == "error"
    assert first.content == again.content and "already shipped" in str(again.content)


@pytest.mark.parametrize("mode", MODES)
def test_a_command_result_runs_once_and_is_not_replayed(mode: str, guard: EffectGuard) -> None:
    """A tool that returns a Command (a state update) still runs at most once; its result is not
    stored, so a retry under the same id is told so rather than given a made-up result."""
    runs: list[str] = []

    @tool
    def book(room: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Book a room."""
        runs.append(room)
        return Command(update={"messages": [ToolMessage(f"booked {room}", tool_call_id=tool_call_id)]})

    mw = EffectGuardMiddleware(guard)
    node = ToolNode([book], wrap_tool_call=mw.wrap_tool_call, awrap_tool_call=mw.awrap_tool_call)
    call = calls_tool("c9", "book", room="r1")

    (first,) = run_node(mode, node, node_input(call))
    (again,) = run_node(mode, node, node_input(call))

    assert first.content == "booked r1" and first.status == "success"
    assert runs == ["r1"]
    assert again.status == "error"
    assert again.content == f"Tool 'book' was not run. {MODEL_MESSAGES['result_not_stored']}"


def test_an_artifact_that_is_plain_data_is_replayed(guard: EffectGuard) -> None:
    runs: list[str] = []

    @tool(response_format="content_and_artifact")
    def report(day: str) -> tuple[str, dict[str, int]]:
        """Build a report."""
        runs.append(day)
        return f"report for {day}", {"rows": 3}

    mw = EffectGuardMiddleware(guard)
    node = ToolNode([report], wrap_tool_call=mw.wrap_tool_call)
    call = calls_tool("c10", "report", day="mon")
    (first,) = run_node("sync", node, node_input(call))
    (again,) = run_node("sync", node, node_input(call))
    assert runs == ["mon"]
    assert (again.content, again.artifact) == (first.content, first.artifact)
    assert again.artifact == {"rows": 3}


# -- options and packaging ----------------------------------------------------------------------------
def test_bad_options_fail_at_construction(guard: EffectGuard) -> None:
    with pytest.raises(ValueError, match="on_refusal"):
        EffectGuardMiddleware(guard, on_refusal="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'lookup'"):
        EffectGuardMiddleware(guard, reversibility={"lookup": "sometimes"})  # type: ignore[dict-item]


def test_import_airlock_redis_does_not_import_langchain() -> None:
    code = (
        "import sys, airlock_redis, airlock_redis.integrations\n"
        "frameworks = ('langchain', 'langchain_core', 'langgraph')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in frameworks)\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("missing", ("langchain", "langgraph"))
def test_importing_the_integration_without_its_framework_names_the_extra(missing: str) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{missing!r}] = None\n"
        "try:\n"
        "    import airlock_redis.integrations.langchain\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install 'airlock-redis[langchain]'" in out.stdout
