"""The first in-doubt error tells the model the truth (issue 25, item 4).

The machine: ``raised(error, refuse_in_doubt=True)`` ends an attempt whose tool may not run again
and whose error leaves it in doubt with an ``effect_status_unknown`` refusal raised from the error
(the record still settles unknown); everything else is re-raised as before. The guard: only a call
run inside ``refusing_in_doubt`` for its own id gets the refusal; a direct ``guard.call`` and a
guarded call nested under another id keep re-raising the tool's error. The framework integrations
are tested in their own modules with a scripted model.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectOutcomeUnknown,
    EffectStatusUnknown,
    InMemoryEffectStore,
    Reversibility,
    Status,
    reversibility,
    tool_call_context,
)
from airlock_redis.context import refuses_in_doubt, refusing_in_doubt
from airlock_redis.core.ambiguity import AmbiguityRule
from airlock_redis.core.call_machine import (
    CallMachine,
    CallRules,
    Refuse,
    Reraise,
    Running,
    RunTool,
    State,
    Write,
)
from airlock_redis.core.gates import GuardedCall, GuardOptions
from airlock_redis.core.outcome import DEFAULT_AMBIGUOUS_ERRORS
from airlock_redis.core.records import BeginKind, BeginOutcome, Settlement
from airlock_redis.integrations._common import GuardedToolCalls

NOBODY = Running(None, None, False)
STARTED = BeginOutcome(BeginKind.STARTED, 1)
TARGET = "--url redis://localhost:6379/0"


def _running(level: Reversibility) -> CallMachine:
    rules = CallRules(GuardOptions(), AmbiguityRule.of(DEFAULT_AMBIGUOUS_ERRORS), 1 << 20, None, TARGET)
    call = GuardedCall("charge", "call_1", {"account": "a", "cents": 5}, level, frozenset())
    machine = CallMachine(rules, call, lambda: Any)
    machine.start(NOBODY)
    assert isinstance(machine.begun(STARTED, durable=False), RunTool)
    return machine


NOT_REVERSIBLE = (Reversibility.IRREVERSIBLE, Reversibility.COSTLY)


@pytest.mark.parametrize("level", NOT_REVERSIBLE)
@pytest.mark.parametrize(
    "error",
    [TimeoutError("read timed out"), EffectOutcomeUnknown("gateway said maybe"), ConnectionResetError()],
)
def test_an_ambiguous_error_of_a_tool_that_may_not_run_again_ends_as_a_refusal_from_it(
    level: Reversibility, error: Exception
) -> None:
    machine = _running(level)
    write = machine.raised(error, refuse_in_doubt=True)
    assert isinstance(write, Write) and write.step is Settlement.UNKNOWN  # the record still settles unknown
    end = machine.written()
    assert isinstance(end, Refuse) and end.cause is error
    refusal = end.refusal
    assert isinstance(refusal, EffectStatusUnknown) and refusal.reason == "effect_status_unknown"
    assert (refusal.tool, refusal.tool_call_id) == ("charge", "call_1")
    assert refusal.idempotency_key == machine.plan.idempotency_key  # type: ignore[union-attr]
    name = type(error).__name__
    assert refusal.model_message.startswith(
        f"The call to 'charge' may have taken effect: it ended with {name}"
    )
    assert "Do not call it again, under this id or a new one." in refusal.model_message
    assert "not run" not in refusal.model_message  # it ran
    assert "try again" not in refusal.model_message.lower()
    assert str(error) not in refusal.model_message or not str(error)  # the error's text is not the model's
    # the operator's hint: ask the backend, then resolve this record on this store
    assert refusal.fix_hint.startswith("Do not retry. Ask the backend")
    assert f"airlock-redis resolve call_1 {TARGET} --release" in refusal.fix_hint
    assert machine.state is State.DONE


@pytest.mark.parametrize(
    ("level", "error", "settlement"),
    [
        # a reversible tool may be retried: the framework handles its error as it always did
        (Reversibility.REVERSIBLE, TimeoutError(), Settlement.UNKNOWN),
        # not in doubt: the record is released and the error goes on
        (Reversibility.IRREVERSIBLE, ValueError("bad account"), Settlement.RELEASE),
        (Reversibility.COSTLY, KeyError("cents"), Settlement.RELEASE),
        # a cancellation or an interrupt is in doubt, and is never turned into a refusal
        (Reversibility.IRREVERSIBLE, asyncio.CancelledError(), Settlement.UNKNOWN),
        (Reversibility.IRREVERSIBLE, KeyboardInterrupt(), Settlement.UNKNOWN),
        (Reversibility.COSTLY, SystemExit(1), Settlement.UNKNOWN),
    ],
)
def test_everything_else_is_reraised_even_when_refusals_are_asked_for(
    level: Reversibility, error: BaseException, settlement: Settlement
) -> None:
    machine = _running(level)
    write = machine.raised(error, refuse_in_doubt=True)
    assert isinstance(write, Write) and write.step is settlement
    assert machine.written() == Reraise(error)


@pytest.mark.parametrize("level", NOT_REVERSIBLE)
def test_without_refuse_in_doubt_an_ambiguous_error_is_reraised_as_the_spec_says(
    level: Reversibility,
) -> None:
    machine = _running(level)
    error = TimeoutError()
    write = machine.raised(error)
    assert isinstance(write, Write) and write.step is Settlement.UNKNOWN
    assert machine.written() == Reraise(error)


def test_a_bare_call_reraises_without_a_write_even_when_refusals_are_asked_for() -> None:
    rules = CallRules(
        GuardOptions(require_tool_call_id=False),
        AmbiguityRule.of(DEFAULT_AMBIGUOUS_ERRORS),
        1 << 20,
        None,
        "",
    )
    machine = CallMachine(
        rules, GuardedCall("charge", None, {}, Reversibility.IRREVERSIBLE, frozenset()), lambda: Any
    )
    op = machine.start(NOBODY)
    assert isinstance(op, RunTool) and op.bare
    error = TimeoutError()
    assert machine.raised(error, refuse_in_doubt=True) == Reraise(error)


# -- the context the integrations set --------------------------------------------------------------
def test_refusing_in_doubt_names_one_call_id_and_is_undone_on_exit() -> None:
    assert not refuses_in_doubt("c1")
    with refusing_in_doubt("c1"):
        assert refuses_in_doubt("c1")
        assert not refuses_in_doubt("c2")
        assert not refuses_in_doubt(None)
        with refusing_in_doubt(None):  # an integration that got no id asks for nothing
            assert not refuses_in_doubt("c1")
        assert refuses_in_doubt("c1")
    assert not refuses_in_doubt("c1")


def _charges(runs: list[str], error: BaseException) -> Any:
    def charge(account: str, cents: int) -> str:
        runs.append(account)
        raise error

    return charge


def test_a_direct_guard_call_keeps_reraising_the_tools_error() -> None:
    guard = EffectGuard(InMemoryEffectStore())
    runs: list[str] = []
    with pytest.raises(TimeoutError):
        guard.call("c1", _charges(runs, TimeoutError("read timed out")), "acct", 5)
    record = guard.store.get("c1")
    assert record is not None and record.status is Status.UNKNOWN
    with pytest.raises(EffectStatusUnknown):  # its retry is refused, as before
        guard.call("c1", _charges(runs, TimeoutError()), "acct", 5)
    assert runs == ["acct"]


@pytest.mark.parametrize("mode", ("sync", "async"))
def test_the_integrations_runner_refuses_on_the_first_attempt_and_the_retry_too(mode: str) -> None:
    guard = EffectGuard(InMemoryEffectStore())
    calls = GuardedToolCalls(guard)
    runs: list[str] = []

    def attempt(tool_call_id: str) -> Any:
        def body() -> Any:
            runs.append(tool_call_id)
            raise TimeoutError("read timed out")

        if mode == "sync":
            return calls.run(tool_call_id, "charge", Reversibility.IRREVERSIBLE, {"cents": 5}, body)

        async def abody() -> Any:
            return body()

        return asyncio.run(
            calls.arun(tool_call_id, "charge", Reversibility.IRREVERSIBLE, {"cents": 5}, abody)
        )

    with pytest.raises(EffectStatusUnknown) as first:
        attempt("c1")
    assert isinstance(first.value.__cause__, TimeoutError)
    assert first.value.model_message.startswith("The call to 'charge' may have taken effect")
    record = guard.store.get("c1")
    assert record is not None and record.status is Status.UNKNOWN
    with pytest.raises(EffectStatusUnknown) as retry:  # the same id: refused without running
        attempt("c1")
    assert retry.value.model_message.startswith("Tool 'charge' was not run.")
    assert runs == ["c1"]


def test_a_cancellation_in_the_integrations_runner_propagates_unchanged() -> None:
    guard = EffectGuard(InMemoryEffectStore())
    calls = GuardedToolCalls(guard)

    async def body() -> Any:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(calls.arun("c1", "charge", Reversibility.IRREVERSIBLE, {}, body))
    record = guard.store.get("c1")
    assert record is not None and record.status is Status.UNKNOWN


def test_a_guarded_call_under_another_id_inside_the_tool_keeps_reraising() -> None:
    """Only the integration's own call is refused in doubt: a guarded call the tool makes under an
    id of its own re-raises its error to the tool, as a direct call does."""
    guard = EffectGuard(InMemoryEffectStore())
    calls = GuardedToolCalls(guard)
    seen: list[BaseException] = []

    @reversibility("irreversible")
    def inner(cents: int) -> str:
        raise TimeoutError("inner backend")

    def body() -> Any:
        with tool_call_context("inner-1"):
            try:
                guard.wrap(inner)(5)
            except BaseException as error:
                seen.append(error)
                raise
        return "unreachable"

    with pytest.raises(EffectStatusUnknown) as outer:
        calls.run("outer-1", "book", Reversibility.IRREVERSIBLE, {"trip": "t"}, body)
    (inner_error,) = seen
    assert type(inner_error) is TimeoutError  # not a refusal: the tool sees its callee's error
    assert outer.value.__cause__ is inner_error
    for tool_call_id in ("outer-1", "inner-1"):
        record = guard.store.get(tool_call_id)
        assert record is not None and record.status is Status.UNKNOWN


# -- the agent_airlock adapter ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ("sync", "async"))
def test_airlock_gives_the_first_in_doubt_error_as_a_blocked_refusal(mode: str, tmp_path: Any) -> None:
    """Under ``@Airlock`` a tool error comes back as agent_airlock's blocked response. One that left an
    irreversible call in doubt is the guard's ``effect_status_unknown`` refusal on its first attempt,
    never agent_airlock's "An internal error occurred. Please try again."; an ordinary error and a
    reversible tool's timeout keep agent_airlock's own answer."""
    pytest.importorskip("agent_airlock")
    from agent_airlock import AirlockConfig, AirlockContext

    from airlock_redis import Airlock, SecurityPolicy

    store = InMemoryEffectStore()
    policy = SecurityPolicy(effect_guard=EffectGuard(store=store))
    config = AirlockConfig(audit_log_path=tmp_path / "audit.jsonl")
    runs: list[str] = []

    def fails(name: str, error: type[Exception]) -> Any:
        def body() -> str:
            runs.append(name)
            raise error(f"{name}: the backend did not answer")

        if mode == "sync":

            def tool(order: str) -> str:
                return body()

        else:

            async def tool(order: str) -> str:  # type: ignore[misc]
                return body()

        tool.__name__ = tool.__qualname__ = name
        return tool

    pay = Airlock(policy=policy, config=config)(fails("pay", TimeoutError))
    cancel = Airlock(policy=policy, config=config)(fails("cancel", ValueError))
    lookup = Airlock(policy=policy, config=config)(reversibility("reversible")(fails("lookup", TimeoutError)))

    def call(tool: Any, tool_call_id: str) -> Any:
        with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": tool_call_id}):
            out = tool(order="o1")
            return asyncio.run(out) if mode == "async" else out

    first, again = call(pay, "p1"), call(pay, "p1")
    assert first["block_reason"] == again["block_reason"] == "effect_status_unknown"
    assert first["error"].startswith("AIRLOCK_BLOCK: 'pay' under tool_call_id 'p1' raised TimeoutError")
    assert first["fix_hints"][0].startswith("Do not retry")
    assert "try again" not in str(first).lower()
    record = store.get("p1")
    assert record is not None and record.status is Status.UNKNOWN

    for tool, tool_call_id in ((cancel, "c1"), (lookup, "l1")):
        answer = call(tool, tool_call_id)
        assert answer["block_reason"] == "validation_error"  # agent_airlock's "Unexpected error"
        assert answer["fix_hints"] == ["An internal error occurred. Please try again."]
    assert store.get("c1") is None  # released
    assert runs == ["pay", "cancel", "lookup"]
