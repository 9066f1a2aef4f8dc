"""guard_tools against the real OpenAI Agents SDK: its ScriptedModel (no LLM, no network), records on a
real redis-server.

The SDK itself refuses a tool call id reused within one run; what it cannot see is the same call
run again by another run or another worker: two workers resuming the same approved RunState, or a
run re-driven after a crash. There the tool runs once and the second gets the replay; a call left in
doubt reaches the model as a refusal that says not to issue it again (never "please try again"), on
its first attempt as on a retry, and the run finishes; an ordinary error, and a reversible tool's,
are the SDK's to handle.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from agents import (
    Agent,
    FunctionTool,
    RunContextWrapper,
    Runner,
    RunResult,
    RunState,
    Tool,
    ToolCallOutputItem,
    WebSearchTool,
    function_tool,
)
from agents.exceptions import UserError
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from airlock_redis import (
    EffectGuard,
    EffectStore,
    ProbeCall,
    Status,
    TookEffect,
    idempotency_key,
    reversibility,
)
from airlock_redis.core.errors import MODEL_MESSAGES
from airlock_redis.core.reversibility import ReversibilityName
from airlock_redis.integrations.openai_agents import guard_tools

from .conftest import make_store

MODES = ("sync", "async")
IN_DOUBT = MODEL_MESSAGES["effect_status_unknown"]
SDK_GENERIC_ERROR = "An error occurred while running the tool. Please try again."


@pytest.fixture
def store(request: pytest.FixtureRequest, namespace: str) -> EffectStore:
    return make_store("redis", request, namespace)


@pytest.fixture
def guard(store: EffectStore) -> EffectGuard:
    return EffectGuard(store)


def make_refund(mode: str, runs: list[str], *, fail_first: bool = False, **options: Any) -> FunctionTool:
    """A refund tool (a sync or an async function) that times out on its first call when fail_first."""

    def body(order: str) -> str:
        runs.append(order)
        if fail_first and len(runs) == 1:
            raise TimeoutError("payments api: read timed out")
        return f"refunded {order}"

    if mode == "sync":

        def refund(order: str) -> str:
            """Refund an order."""
            return body(order)

        return function_tool(refund, **options)

    async def refund_async(order: str) -> str:
        """Refund an order."""
        await asyncio.sleep(0)
        return body(order)

    return function_tool(refund_async, name_override="refund", **options)


def calls_refund(call_id: str, order: str) -> ScriptedModel:
    """A model that asks for one refund, then answers "done"."""
    return ScriptedModel(
        [[function_call("refund", {"order": order}, call_id=call_id)], [assistant_message("done")]]
    )


def run(mode: str, agent: Agent[Any], payload: Any) -> RunResult:
    if mode == "sync":
        return Runner.run_sync(agent, payload)
    return asyncio.run(Runner.run(agent, payload))


def outputs(result: RunResult) -> list[Any]:
    return [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]


def shown_to_model(model: ScriptedModel) -> list[str]:
    """The tool outputs in the input of the model's last call."""
    items = model.calls[-1].input
    return [str(item.get("output")) for item in items if item.get("type") == "function_call_output"]


@pytest.mark.parametrize("mode", MODES)
def test_same_id_in_two_runs_runs_once_and_replays(mode: str, guard: EffectGuard) -> None:
    runs: list[str] = []
    tools = guard_tools([make_refund(mode, runs)], guard)

    first = run(mode, Agent(name="ops", model=calls_refund("call_1", "o1"), tools=tools), "refund o1")
    again = run(mode, Agent(name="ops", model=calls_refund("call_1", "o1"), tools=tools), "refund o1")

    assert runs == ["o1"]
    assert outputs(first) == outputs(again) == ["refunded o1"]
    assert first.final_output == again.final_output == "done"
    record = guard.store.get("call_1")
    assert record is not None and record.status is Status.COMMITTED and record.tool == "refund"
    assert record.idempotency_key == idempotency_key("refund", {"order": "o1"})


@pytest.mark.parametrize("mode", MODES)
def test_on_invoke_tool_called_directly_is_keyed_on_the_tool_call_id(mode: str, guard: EffectGuard) -> None:
    runs: list[str] = []
    (tool,) = guard_tools([make_refund(mode, runs)], guard)
    assert isinstance(tool, FunctionTool)

    async def call(ctx: ToolContext[Any], arguments: str) -> Any:
        return await tool.on_invoke_tool(ctx, arguments)

    def invoke(call_id: str, arguments: str) -> Any:
        ctx = ToolContext(context=None, tool_name="refund", tool_call_id=call_id, tool_arguments=arguments)
        return asyncio.run(call(ctx, arguments))

    assert invoke("call_1", '{"order": "o1"}') == "refunded o1"
    assert invoke("call_1", '{"order":"o1"}') == "refunded o1"  # same arguments, other spacing
    assert invoke("call_2", '{"order": "o1"}') == "refunded o1"
    refused = invoke("call_1", '{"order": "o2"}')
    assert runs == ["o1", "o1"]
    assert refused == f"Tool 'refund' was not run. {MODEL_MESSAGES['policy_violation']}"


def first_in_doubt_text(tool: str, error: str = "TimeoutError") -> str:
    """What the model reads on the first attempt whose error left the call in doubt."""
    return f"The call to {tool!r} may have taken effect: it ended with {error}"


@pytest.mark.parametrize("mode", MODES)
def test_the_first_in_doubt_error_reaches_the_model_as_a_refusal_and_the_model_stops(
    mode: str, guard: EffectGuard
) -> None:
    """The refund times out (the money may have moved): on this very attempt the model gets, as the
    tool's output, that the call may have taken effect and must not be issued again, never the SDK's
    "please try again"; the model stops, and the refund ran once."""
    runs: list[str] = []
    tools = guard_tools([make_refund(mode, runs, fail_first=True)], guard)
    model = calls_refund("call_1", "o1")

    result = run(mode, Agent(name="ops", model=model, tools=tools), "refund o1")

    (refused,) = outputs(result)
    assert refused.startswith(first_in_doubt_text("refund"))
    assert "Do not call it again, under this id or a new one." in refused
    assert SDK_GENERIC_ERROR not in refused and "try again" not in refused.lower()
    assert "read timed out" not in refused  # the error's own text is not the model's
    assert shown_to_model(model) == [refused]
    assert result.final_output == "done"
    assert runs == ["o1"]
    record = guard.store.get("call_1")
    assert record is not None and record.status is Status.UNKNOWN


@pytest.mark.parametrize("mode", MODES)
def test_a_model_that_would_retry_under_a_new_id_is_told_not_to(mode: str, guard: EffectGuard) -> None:
    """The scenario of issue 25: a scripted model that retries the refund under a new call id after a
    timeout. It used to be shown the SDK's "An error occurred while running the tool. Please try
    again."; now the output it reads before its retry is the refusal. (A new id is still a new call
    for the guard: telling the two apart is the ``dedupe`` option's job, not this one's.)"""
    runs: list[str] = []
    tools = guard_tools([make_refund(mode, runs, fail_first=True)], guard)
    model = ScriptedModel(
        [
            [function_call("refund", {"order": "o1"}, call_id="call_1")],
            [function_call("refund", {"order": "o1"}, call_id="call_2")],
            [assistant_message("done")],
        ]
    )

    result = run(mode, Agent(name="ops", model=model, tools=tools), "refund o1")

    first = outputs(result)[0]
    assert first.startswith(first_in_doubt_text("refund"))
    shown = [
        str(item.get("output")) for item in model.calls[1].input if item.get("type") == "function_call_output"
    ]
    assert shown == [first]  # what the model read before it issued call_2
    assert not any(SDK_GENERIC_ERROR in text for text in shown_to_model(model))


@pytest.mark.parametrize("mode", MODES)
def test_with_dedupe_the_retry_under_a_new_id_runs_the_refund_zero_more_times(
    mode: str, store: EffectStore
) -> None:
    """The issue's scenario end to end, with ``dedupe="in_doubt"``: the refund times out under call_1,
    the scripted model retries it under call_2 with the same arguments, and the refund ran once: the
    retry is refused as the same call, in doubt."""
    runs: list[str] = []
    guard = EffectGuard(store, dedupe="in_doubt")
    tools = guard_tools([make_refund(mode, runs, fail_first=True)], guard)
    model = ScriptedModel(
        [
            [function_call("refund", {"order": "o1"}, call_id="call_1")],
            [function_call("refund", {"order": "o1"}, call_id="call_2")],
            [assistant_message("done")],
        ]
    )

    result = run(mode, Agent(name="ops", model=model, tools=tools), "refund o1")

    assert runs == ["o1"]  # refund ran: 1 time
    first, second = outputs(result)
    assert first.startswith(first_in_doubt_text("refund"))
    assert MODEL_MESSAGES["effect_status_unknown"] in second, second
    assert result.final_output == "done"


@pytest.mark.parametrize("mode", MODES)
def test_in_doubt_call_run_again_is_refused_for_the_model_and_the_run_finishes(
    mode: str, guard: EffectGuard
) -> None:
    """The first run's tool times out: the model is told the call may have taken effect, and the call
    is recorded in doubt. A second run of the same call (another worker, a re-driven run) does not run
    the tool: the model gets the refusal as the tool's output, and the run finishes."""
    runs: list[str] = []
    tools = guard_tools([make_refund(mode, runs, fail_first=True)], guard)

    first = run(mode, Agent(name="ops", model=calls_refund("call_1", "o1"), tools=tools), "refund o1")
    (told,) = outputs(first)
    assert told.startswith(first_in_doubt_text("refund"))
    record = guard.store.get("call_1")
    assert record is not None and record.status is Status.UNKNOWN

    model = calls_refund("call_1", "o1")
    again = run(mode, Agent(name="ops", model=model, tools=tools), "refund o1")

    assert runs == ["o1"]
    (refused,) = outputs(again)
    assert refused == f"Tool 'refund' was not run. {IN_DOUBT}"
    assert "try again" not in refused.lower()
    assert shown_to_model(model) == [refused]
    assert again.final_output == "done"


@pytest.mark.parametrize("mode", MODES)
def test_an_ordinary_error_keeps_the_sdks_handling_and_releases_the_call(
    mode: str, guard: EffectGuard
) -> None:
    """A ValueError leaves nothing in doubt: the model gets what the SDK gives for a tool error, and
    the call is released."""
    runs: list[str] = []

    def cancel(order: str) -> str:
        """Cancel an order."""
        runs.append(order)
        raise ValueError("order is already shipped")

    tools = guard_tools([function_tool(cancel)], guard)
    model = ScriptedModel(
        [[function_call("cancel", {"order": "o1"}, call_id="call_1")], [assistant_message("done")]]
    )

    result = run(mode, Agent(name="ops", model=model, tools=tools), "cancel o1")

    assert outputs(result) == [SDK_GENERIC_ERROR]
    assert runs == ["o1"]
    assert guard.store.get("call_1") is None


def test_without_a_failure_function_an_ordinary_error_is_raised_and_released(guard: EffectGuard) -> None:
    runs: list[str] = []

    def cancel(order: str) -> str:
        """Cancel an order."""
        runs.append(order)
        raise ValueError("order is already shipped")

    tools = guard_tools([function_tool(cancel, failure_error_function=None)], guard)
    model = ScriptedModel(
        [[function_call("cancel", {"order": "o1"}, call_id="call_1")], [assistant_message("done")]]
    )
    with pytest.raises(UserError) as failed:  # how the SDK fails a run on a tool error
        run("async", Agent(name="ops", model=model, tools=tools), "cancel o1")
    assert isinstance(failed.value.__cause__, ValueError)
    assert guard.store.get("call_1") is None


def test_without_a_failure_function_an_error_in_doubt_is_still_a_refusal(guard: EffectGuard) -> None:
    """A refusal is never a tool error for the SDK (with or without a failure function): the call in
    doubt reaches the model as the refusal text, and the run finishes."""
    runs: list[str] = []
    tools = guard_tools([make_refund("async", runs, fail_first=True, failure_error_function=None)], guard)
    result = run("async", Agent(name="ops", model=calls_refund("call_1", "o1"), tools=tools), "refund o1")
    (refused,) = outputs(result)
    assert refused.startswith(first_in_doubt_text("refund"))
    assert result.final_output == "done"
    record = guard.store.get("call_1")
    assert record is not None and record.status is Status.UNKNOWN


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
    tools = guard_tools([function_tool(lookup)], guard, reversibility=mapping)

    def model() -> ScriptedModel:
        return ScriptedModel(
            [[function_call("lookup", {"city": "Oslo"}, call_id="call_1")], [assistant_message("done")]]
        )

    first = run(mode, Agent(name="ops", model=model(), tools=tools), "weather")
    again = run(mode, Agent(name="ops", model=model(), tools=tools), "weather")

    assert outputs(first) == [SDK_GENERIC_ERROR]
    assert outputs(again) == ["sunny in Oslo"]
    assert runs == ["Oslo", "Oslo"]


@pytest.mark.parametrize("mode", MODES)
def test_tool_also_wrapped_by_guard_wrap_gives_one_record_and_one_run(mode: str, guard: EffectGuard) -> None:
    runs: list[str] = []

    if mode == "sync":

        def refund(order: str) -> str:
            """Refund an order."""
            runs.append(order)
            return f"refunded {order}"

        tool = function_tool(guard.wrap(refund))
    else:

        async def refund_async(order: str) -> str:
            """Refund an order."""
            runs.append(order)
            return f"refunded {order}"

        tool = function_tool(guard.wrap(refund_async), name_override="refund")
    tools = guard_tools([tool], guard)

    first = run(mode, Agent(name="ops", model=calls_refund("call_1", "o1"), tools=tools), "refund o1")
    again = run(mode, Agent(name="ops", model=calls_refund("call_1", "o1"), tools=tools), "refund o1")

    assert outputs(first) == outputs(again) == ["refunded o1"]
    assert runs == ["o1"]
    record = guard.store.get("call_1")
    assert record is not None and record.status is Status.COMMITTED and record.tool == "refund"


# -- approvals ----------------------------------------------------------------------------------------
def approved_state_json(tools: list[Tool]) -> dict[str, Any]:
    """Run until the refund asks for approval, approve it, and serialize the RunState."""
    agent = Agent(name="ops", model=calls_refund("call_1", "o1"), tools=tools)
    paused = asyncio.run(Runner.run(agent, "refund o1"))
    (approval,) = paused.interruptions
    state = paused.to_state()
    state.approve(approval)
    return state.to_json()


@pytest.mark.parametrize("mode", MODES)
def test_two_workers_resuming_the_same_approved_run_run_the_tool_once(
    mode: str, request: pytest.FixtureRequest, namespace: str
) -> None:
    """Each worker has its own guard and its own connection to the same Redis, as two processes
    would; both load the same approved RunState. The first runs the refund; the second gets the
    stored output as the tool's output, and both runs finish."""
    runs: list[str] = []
    refund = make_refund(mode, runs, needs_approval=True)
    payload = approved_state_json(guard_tools([refund], EffectGuard(make_store("redis", request, namespace))))
    assert runs == []  # paused for approval: nothing ran yet

    results = []
    for _worker in range(2):
        guard = EffectGuard(make_store("redis", request, namespace))
        model = ScriptedModel([[assistant_message("done")]])
        agent = Agent(name="ops", model=model, tools=guard_tools([refund], guard))
        state = asyncio.run(RunState.from_json(agent, json.loads(json.dumps(payload))))
        results.append(run(mode, agent, state))

    assert runs == ["o1"]
    assert [outputs(r) for r in results] == [["refunded o1"], ["refunded o1"]]
    assert [r.final_output for r in results] == ["done", "done"]


def test_needs_approval_still_pauses_and_a_rejection_runs_nothing(guard: EffectGuard) -> None:
    runs: list[str] = []
    asked: list[tuple[dict[str, Any], str]] = []

    async def needs_approval(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        asked.append((params, call_id))
        return True

    tools = guard_tools([make_refund("async", runs, needs_approval=needs_approval)], guard)
    agent = Agent(name="ops", model=calls_refund("call_1", "o1"), tools=tools)
    paused = asyncio.run(Runner.run(agent, "refund o1"))
    (approval,) = paused.interruptions
    assert asked == [({"order": "o1"}, "call_1")]
    state = paused.to_state()
    state.reject(approval)
    finished = asyncio.run(Runner.run(agent, state))
    assert runs == []
    assert guard.store.get("call_1") is None
    assert finished.final_output == "done"


# -- what the returned tools are ----------------------------------------------------------------------
def test_returned_tools_keep_their_settings(guard: EffectGuard) -> None:
    original = make_refund("async", [], needs_approval=True)
    (guarded,) = guard_tools([original], guard)
    assert isinstance(guarded, FunctionTool)
    assert guarded is not original and guarded.on_invoke_tool is not original.on_invoke_tool
    assert (guarded.name, guarded.description, guarded.params_json_schema, guarded.needs_approval) == (
        original.name,
        original.description,
        original.params_json_schema,
        True,
    )


def test_a_hosted_tool_is_refused(guard: EffectGuard) -> None:
    with pytest.raises(TypeError, match="WebSearchTool"):
        guard_tools([WebSearchTool()], guard)


def test_bad_reversibility_fails_at_once(guard: EffectGuard) -> None:
    with pytest.raises(ValueError, match="'refund'"):
        guard_tools([make_refund("sync", [])], guard, reversibility={"refund": "maybe"})  # type: ignore[dict-item]


# -- packaging ----------------------------------------------------------------------------------------
def python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_import_airlock_redis_does_not_import_the_sdk() -> None:
    loaded = python(
        "import sys, airlock_redis, airlock_redis.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('agents', 'openai')))\n"
    )
    assert loaded == "[]"


def test_importing_the_integration_without_the_sdk_names_the_extra() -> None:
    message = python(
        "import sys\n"
        "sys.modules['agents'] = None\n"
        "try:\n"
        "    import airlock_redis.integrations.openai_agents\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert "pip install 'airlock-redis[openai-agents]'" in message


@pytest.mark.parametrize("mode", MODES)
def test_a_probe_mapped_by_tool_name_reconciles_the_first_timeout(mode: str, guard: EffectGuard) -> None:
    """``guard_tools(..., reconcile={"refund": probe})``: the refund timed out, the probe finds it
    at the payments backend, and the model reads the refund's result, not a refusal; the record is
    committed with it."""
    runs: list[str] = []
    asked: list[tuple[str, str]] = []

    def lookup(call: ProbeCall) -> TookEffect:
        asked.append((call.tool_call_id, call.found))
        return TookEffect(f"refunded {call.arguments['order']}")

    tools = guard_tools([make_refund(mode, runs, fail_first=True)], guard, reconcile={"refund": lookup})
    result = run(mode, Agent(name="ops", model=calls_refund("call_p", "o9"), tools=tools), "refund o9")
    assert outputs(result) == ["refunded o9"] and runs == ["o9"] and asked == [("call_p", "error")]
    record = guard.store.get("call_p")
    assert record is not None and record.status is Status.COMMITTED
    with pytest.raises(TypeError, match="probe function"):
        guard_tools([make_refund(mode, runs)], guard, reconcile={"refund": "not a probe"})  # type: ignore[dict-item]
