"""The guard inside agent_airlock 0.10.26's @Airlock (airlock_redis.Airlock), on the in-memory store
and on a real redis-server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_airlock import Airlock as PlainAirlock
from agent_airlock import AirlockConfig, AirlockContext, get_current_context, is_refusal
from agent_airlock.oversight import OversightRequest, OversightResponse, OversightVerdict
from agent_airlock.unknown_args import UnknownArgsMode

from airlock_redis import (
    Airlock,
    EffectGuard,
    EffectOutcomeUnknown,
    EffectStore,
    SecurityPolicy,
    Status,
    idempotency_key,
    reversibility,
)
from tests.conftest import make_store

KEY_STORES = ("memory", "redis")


@dataclass
class Env:
    store: EffectStore
    config: AirlockConfig
    audit_path: Path

    def guard(self, **options: Any) -> EffectGuard:
        return EffectGuard(store=self.store, **options)

    def audit(self) -> list[dict[str, Any]]:
        lines = self.audit_path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line and not line.startswith("#")]


@pytest.fixture(params=KEY_STORES)
def env(request: pytest.FixtureRequest, namespace: str, tmp_path: Path) -> Env:
    path = tmp_path / "audit.jsonl"
    config = AirlockConfig(audit_log_path=path, unknown_args=UnknownArgsMode.BLOCK)
    return Env(make_store(request.param, request, namespace), config, path)


@pytest.fixture
def memory_env(namespace: str, tmp_path: Path, request: pytest.FixtureRequest) -> Env:
    path = tmp_path / "audit.jsonl"
    config = AirlockConfig(audit_log_path=path, unknown_args=UnknownArgsMode.BLOCK)
    return Env(make_store("memory", request, namespace), config, path)


class Approvals:
    """A policy approver (agent_airlock's protocol) that records every request."""

    def __init__(self, *verdicts: OversightVerdict) -> None:
        self.requests: list[OversightRequest] = []
        self.verdicts = list(verdicts)

    def answer(self, request: OversightRequest) -> OversightResponse:
        self.requests.append(request)
        verdict = self.verdicts.pop(0) if self.verdicts else OversightVerdict.GRANT
        return OversightResponse(request_id=request.request_id, verdict=verdict)

    def __call__(self, request: OversightRequest) -> OversightResponse:
        return self.answer(request)


class AsyncApprovals(Approvals):
    async def __call__(self, request: OversightRequest) -> OversightResponse:  # type: ignore[override]
        await asyncio.sleep(0)
        return self.answer(request)


def charge_tool(policy: Any, env: Env, runs: list[dict[str, Any]], **airlock: Any) -> Callable[..., Any]:
    @Airlock(policy=policy, config=env.config, **airlock)
    def charge(account: str, cents: int) -> dict[str, Any]:
        runs.append({"account": account, "cents": cents, "key": get_current_context().idempotency_key})  # type: ignore[union-attr]
        return {"charged": cents, "run": len(runs)}

    return charge


def anyway(tool: Any) -> Any:
    """An @Airlock async tool, typed loosely (agent_airlock types it as returning R | dict)."""
    return tool


def with_id(tool_call_id: str | None, agent_id: str = "agent-1") -> AirlockContext[Any]:
    metadata = {} if tool_call_id is None else {"tool_call_id": tool_call_id}
    return AirlockContext(agent_id=agent_id, metadata=metadata)


def blocked(result: Any, reason: str) -> dict[str, Any]:
    assert isinstance(result, dict) and is_refusal(result), result
    assert result["block_reason"] == reason, result
    return result


# -- the guard is the last step: gate refusals leave no record ---------------------------------
def test_calls_refused_by_a_gate_leave_no_record(env: Env) -> None:
    runs: list[dict[str, Any]] = []
    policy = SecurityPolicy(
        allowed_tools=["charge", "wipe"],
        denied_tools=["wipe"],
        rate_limits={"charge": "2/minute"},  # the invalid call below spends one too
        effect_guard=env.guard(),
    )
    charge = charge_tool(policy, env, runs)

    @Airlock(policy=policy, config=env.config)
    def wipe(account: str) -> str:
        runs.append({"wipe": account})
        return "wiped"

    with with_id("denied"):
        blocked(wipe(account="a"), "policy_violation")
    with with_id("ghost"):
        blocked(charge(account="a", cents=1, hallucinated=True), "ghost_arguments")
    with with_id("first"):
        assert charge(account="a", cents=1) == {"charged": 1, "run": 1}
    with with_id("invalid"):
        blocked(charge(account="a", cents="1"), "validation_error")
    with with_id("limited"):
        blocked(charge(account="a", cents=2), "rate_limit")
    assert runs == [
        {"account": "a", "cents": 1, "key": idempotency_key("charge", {"account": "a", "cents": 1})}
    ]
    for refused in ("denied", "ghost", "invalid", "limited"):
        assert env.store.get(refused) is None
    record = env.store.get("first")
    assert record is not None and record.status is Status.COMMITTED


# -- every gate runs again on a replay ---------------------------------------------------------
def test_a_policy_that_now_denies_refuses_the_replay(env: Env) -> None:
    runs: list[dict[str, Any]] = []
    policy = SecurityPolicy(allowed_tools=["charge"], effect_guard=env.guard())
    charge = charge_tool(policy, env, runs)
    with with_id("c1"):
        assert charge(account="a", cents=5)["charged"] == 5
        policy.denied_tools.append("charge")
        blocked(charge(account="a", cents=5), "policy_violation")
    assert len(runs) == 1
    record = env.store.get("c1")
    assert record is not None and record.status is Status.COMMITTED


def test_an_escalation_asks_again_on_every_replay(env: Env) -> None:
    runs: list[dict[str, Any]] = []
    approvals = Approvals(OversightVerdict.GRANT, OversightVerdict.GRANT, OversightVerdict.DENY)
    policy = SecurityPolicy(
        escalate_tools={"charge": "money moves"}, approver=approvals, effect_guard=env.guard()
    )
    charge = charge_tool(policy, env, runs)
    with with_id("c1"):
        first = charge(account="a", cents=5)
        assert charge(account="a", cents=5) == first
        refused = blocked(charge(account="a", cents=5), "escalation_denied")
    assert len(runs) == 1
    assert len(approvals.requests) == 3
    assert len({r.request_id for r in approvals.requests}) == 3
    key = idempotency_key("charge", {"account": "a", "cents": 5})
    for request in approvals.requests:
        assert request.tool_name == "charge"
        assert request.args["idempotency_key"] == key
        assert request.args["escalation_reason"] == "money moves"
    assert "try again" not in json.dumps(refused).lower()
    record = env.store.get("c1")
    assert record is not None and record.status is Status.COMMITTED


def make_approvals(kind: str, *verdicts: OversightVerdict) -> Approvals:
    return Approvals(*verdicts) if kind == "sync" else AsyncApprovals(*verdicts)


def async_charge_tool(policy: Any, env: Env, runs: list[dict[str, Any]]) -> Callable[..., Any]:
    @Airlock(policy=policy, config=env.config)
    async def charge(account: str, cents: int) -> dict[str, Any]:
        await asyncio.sleep(0)
        runs.append({"account": account, "cents": cents, "key": get_current_context().idempotency_key})  # type: ignore[union-attr]
        return {"charged": cents, "run": len(runs)}

    tool: Callable[..., Any] = anyway(charge)
    return tool


@pytest.mark.parametrize("approver_kind", ["sync", "async"])
def test_an_async_tool_asks_the_escalation_again_on_every_replay(env: Env, approver_kind: str) -> None:
    runs: list[dict[str, Any]] = []
    grant, deny = OversightVerdict.GRANT, OversightVerdict.DENY
    approvals = make_approvals(approver_kind, grant, grant, deny, grant)
    policy = SecurityPolicy(
        escalate_tools={"charge": "money moves"}, approver=approvals, effect_guard=env.guard()
    )
    charge = async_charge_tool(policy, env, runs)

    async def scenario() -> list[Any]:
        with with_id("c1"):
            return [await charge(account="a", cents=5) for _ in range(4)]

    first, replay, refused, replay_again = asyncio.run(scenario())
    key = idempotency_key("charge", {"account": "a", "cents": 5})
    assert first == replay == replay_again == {"charged": 5, "run": 1}
    assert runs == [{"account": "a", "cents": 5, "key": key}]
    # Every call, replays included, asked the approver with a new request: no approval is reused.
    assert len(approvals.requests) == 4 and approvals.verdicts == []
    assert len({r.request_id for r in approvals.requests}) == 4
    for request in approvals.requests:
        assert request.tool_name == "charge"
        assert request.args["idempotency_key"] == key
        assert request.args["tool_call_id"] == "c1"
        assert request.args["escalation_reason"] == "money moves"
    assert blocked(refused, "escalation_denied")["metadata"]["function"] == "charge"
    assert refused["metadata"]["escalation_rule"] == "charge"
    assert "try again" not in json.dumps(refused).lower()
    record = env.store.get("c1")
    assert record is not None and record.status is Status.COMMITTED and record.attempt == 1
    effects = [line.get("effect") for line in env.audit()]
    assert effects == ["executed", "replayed", "refused", "replayed"]


@pytest.mark.parametrize("approver_kind", ["sync", "async"])
def test_an_async_tool_denied_by_the_escalation_does_not_run(env: Env, approver_kind: str) -> None:
    runs: list[dict[str, Any]] = []
    approvals = make_approvals(approver_kind, OversightVerdict.DENY, OversightVerdict.GRANT)
    policy = SecurityPolicy(
        escalate_tools={"charge": "money moves"}, approver=approvals, effect_guard=env.guard()
    )
    charge = async_charge_tool(policy, env, runs)

    async def scenario() -> tuple[Any, Any, Any]:
        with with_id("c1"):
            denied = await charge(account="a", cents=5)
            record = await env.store.aget("c1")
            granted = await charge(account="a", cents=5)
        return denied, record, granted

    denied, record_after_denial, granted = asyncio.run(scenario())
    # The guard only relays the escalation: agent_airlock's reason and hints.
    refused = blocked(denied, "escalation_denied")
    assert any(hint.startswith("Do not retry") for hint in refused["fix_hints"])
    assert record_after_denial is None  # a denial refuses before any record is made
    assert granted == {"charged": 5, "run": 1} and len(runs) == 1
    assert len(approvals.requests) == 2
    assert approvals.requests[0].request_id != approvals.requests[1].request_id
    record = env.store.get("c1")
    assert record is not None and record.status is Status.COMMITTED


def test_an_escalation_is_not_asked_for_a_call_that_fails_validation(memory_env: Env) -> None:
    approvals = Approvals()
    policy = SecurityPolicy(
        escalate_tools={"charge": "money"}, approver=approvals, effect_guard=memory_env.guard()
    )
    charge = charge_tool(policy, memory_env, [])
    with with_id("c1"):
        blocked(charge(account="a", cents="5"), "validation_error")
    assert approvals.requests == []


# -- require_approval_for_irreversible ---------------------------------------------------------
@pytest.mark.parametrize("approver_kind", ["sync", "async"])
def test_every_irreversible_call_goes_to_the_policy_approver(env: Env, approver_kind: str) -> None:
    runs: list[dict[str, Any]] = []
    approvals = Approvals() if approver_kind == "sync" else AsyncApprovals()
    guard = env.guard(require_approval_for_irreversible=True)
    policy = SecurityPolicy(allowed_tools=["charge", "peek"], approver=approvals, effect_guard=guard)
    charge = charge_tool(policy, env, runs)

    @reversibility("reversible")
    @Airlock(policy=policy, config=env.config)
    def peek(account: str) -> str:
        return account

    with with_id("c1"):
        first = charge(account="a", cents=5)
        assert charge(account="a", cents=5) == first
    with with_id("p1"):
        assert peek(account="a") == "a"
    assert len(runs) == 1
    assert [r.tool_name for r in approvals.requests] == ["charge", "charge"]
    request = approvals.requests[0]
    assert request.args["idempotency_key"] == idempotency_key("charge", {"account": "a", "cents": 5})
    assert "irreversible" in request.args["why"]
    assert request.args["tool_call_id"] == "c1"
    assert approvals.requests[0].request_id != approvals.requests[1].request_id


@pytest.mark.parametrize("approver_kind", ["sync", "async"])
def test_an_async_tool_asks_sync_and_async_approvers(memory_env: Env, approver_kind: str) -> None:
    approvals = (
        Approvals(OversightVerdict.DENY) if approver_kind == "sync" else AsyncApprovals(OversightVerdict.DENY)
    )
    guard = memory_env.guard(require_approval_for_irreversible=True)
    policy = SecurityPolicy(approver=approvals, effect_guard=guard)
    runs: list[int] = []

    @Airlock(policy=policy, config=memory_env.config)
    async def send(to: str) -> str:
        runs.append(1)
        return to

    async def scenario() -> tuple[Any, Any]:
        with with_id("s1"):
            denied = await anyway(send)(to="bob")
            granted = await anyway(send)(to="bob")
        return denied, granted

    denied, granted = asyncio.run(scenario())
    assert blocked(denied, "approval_denied")["metadata"]["function"] == "send"
    assert granted == "bob" and runs == [1]
    assert len(approvals.requests) == 2


def test_a_denied_approval_leaves_no_record(env: Env) -> None:
    approvals = Approvals(OversightVerdict.DENY)
    policy = SecurityPolicy(
        approver=approvals, effect_guard=env.guard(require_approval_for_irreversible=True)
    )
    runs: list[dict[str, Any]] = []
    charge = charge_tool(policy, env, runs)
    with with_id("c1"):
        refused = blocked(charge(account="a", cents=5), "approval_denied")
    assert runs == [] and env.store.get("c1") is None
    assert "Do not retry" in refused["fix_hints"][0]


@pytest.mark.parametrize("verdict", [OversightVerdict.DENY, OversightVerdict.TIMEOUT])
def test_the_guards_own_approval_keeps_the_approvers_detail(env: Env, verdict: OversightVerdict) -> None:
    """require_approval_for_irreversible is the guard's gate: its reason, with the approver's answer."""

    def approver(request: OversightRequest) -> OversightResponse:
        return OversightResponse(
            request_id=request.request_id, verdict=verdict, detail="outside business hours", approver="bob"
        )

    policy = SecurityPolicy(approver=approver, effect_guard=env.guard(require_approval_for_irreversible=True))
    runs: list[dict[str, Any]] = []
    with with_id("c1"):
        refused = blocked(charge_tool(policy, env, runs)(account="a", cents=5), "approval_denied")
    # agent_airlock's words for an escalation's outcome
    assert refused["metadata"]["approval_outcome"] == (
        "denied" if verdict is OversightVerdict.DENY else "timeout"
    )
    assert refused["metadata"]["detail"] == "outside business hours"
    assert refused["metadata"]["approver"] == "bob"
    assert runs == [] and env.store.get("c1") is None


# -- the id and the key ------------------------------------------------------------------------
def test_the_key_is_on_the_context_and_the_id_comes_only_from_metadata(env: Env) -> None:
    seen: list[Any] = []
    policy = SecurityPolicy(effect_guard=env.guard())

    @Airlock(policy=policy, config=env.config)
    def notify(user: str, tool_call_id: str) -> str:
        seen.append(get_current_context().idempotency_key)  # type: ignore[union-attr]
        return f"{user}:{tool_call_id}"

    with with_id("host-id"):
        assert notify(user="u", tool_call_id="model-id") == "u:model-id"
    assert seen == [idempotency_key("notify", {"user": "u", "tool_call_id": "model-id"})]
    assert env.store.get("model-id") is None
    record = env.store.get("host-id")
    assert record is not None and record.status is Status.COMMITTED
    # Without a host id the model's argument does not stand in for one.
    refused = blocked(notify(user="u", tool_call_id="model-id"), "tool_call_id_required")
    assert "metadata={'tool_call_id'" in refused["fix_hints"][0]
    assert len(seen) == 1


@dataclass
class Identity:
    agent_id: str


class RunWrapper:
    """A framework's run wrapper: agent_airlock reads the call's identity from ``.context``."""

    def __init__(self, agent_id: str) -> None:
        self.context = Identity(agent_id)


def test_an_ambient_id_for_another_agent_refuses_irreversible_calls(memory_env: Env) -> None:
    policy = SecurityPolicy(effect_guard=memory_env.guard())
    runs: list[str] = []

    @Airlock(policy=policy, config=memory_env.config)
    def transfer(ctx: Any, amount: int) -> int:
        runs.append("transfer")
        return amount

    @reversibility("reversible")
    @Airlock(policy=policy, config=memory_env.config)
    def lookup(ctx: Any, amount: int) -> int:
        runs.append("lookup")
        return amount

    with AirlockContext(agent_id="agent-other", metadata={"tool_call_id": "c1"}):
        refused = blocked(transfer(RunWrapper("agent-1"), amount=3), "tool_call_id_required")
        assert lookup(RunWrapper("agent-1"), amount=3) == 3
    assert "'agent-other'" in refused["error"] and "'agent-1'" in refused["error"]
    assert "metadata={'tool_call_id': tool_call.id}" in refused["fix_hints"][0]
    assert runs == ["lookup"] and memory_env.store.get("c1") is None
    # The same agent: the wrapper is not an argument, and the ambient id is used.
    with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": "c2"}):
        assert transfer(RunWrapper("agent-1"), amount=4) == 4
        assert transfer(RunWrapper("agent-1"), amount=4) == 4
    assert runs == ["lookup", "transfer"]
    record = memory_env.store.get("c2")
    assert record is not None and record.idempotency_key == idempotency_key("transfer", {"amount": 4})


# -- replays and refusals through Airlock's output path ----------------------------------------
def test_a_replay_goes_through_the_output_path_and_is_audited(env: Env) -> None:
    runs: list[int] = []
    policy = SecurityPolicy(effect_guard=env.guard())

    @Airlock(policy=policy, config=env.config, return_dict=True)
    def email(to: str) -> str:
        runs.append(1)
        return f"sent to {to}"

    with with_id("e1"):
        first: Any = email(to="bob@example.com")
        again = email(to="bob@example.com")
    assert first == again and runs == [1]
    assert first["success"] is True and "bob@example.com" not in json.dumps(first)
    lines = env.audit()
    assert [(line["tool_name"], line["blocked"], line["effect"]) for line in lines] == [
        ("email", False, "executed"),
        ("email", False, "replayed"),
    ]


@pytest.mark.parametrize("return_dict", [False, True])
def test_an_effect_in_doubt_is_refused_with_our_reason_and_hint(env: Env, return_dict: bool) -> None:
    attempts: list[int] = []
    policy = SecurityPolicy(effect_guard=env.guard())

    @Airlock(policy=policy, config=env.config, return_dict=return_dict)
    def pay(cents: int) -> int:
        attempts.append(cents)
        raise TimeoutError("the bank did not answer")

    with with_id("p1"):
        first = pay(cents=5)
        refused: Any = pay(cents=5)
    assert attempts == [5]
    # the first attempt, which timed out, is told it may have taken effect: never "please try again"
    assert blocked(first, "effect_status_unknown")["error"].startswith(
        "AIRLOCK_BLOCK: 'pay' under tool_call_id 'p1' raised TimeoutError"
    )
    assert blocked(first, "effect_status_unknown")["fix_hints"][0].startswith("Do not retry")
    assert "try again" not in json.dumps(first).lower()
    blocked(refused, "effect_status_unknown")
    assert refused["fix_hints"][0].startswith("Do not retry")
    assert "try again" not in json.dumps(refused).lower()
    assert refused["metadata"]["idempotency_key"] == idempotency_key("pay", {"cents": 5})
    record = env.store.get("p1")
    assert record is not None and record.status is Status.UNKNOWN
    lines = env.audit()
    assert lines[-1]["blocked"] is True and lines[-1]["block_reason"] == "effect_status_unknown"
    assert lines[-1]["effect"] == "refused"
    assert lines[-2]["blocked"] is True and lines[-2]["effect"] == "unknown"


def test_an_ordinary_error_releases_the_record(env: Env) -> None:
    attempts: list[int] = []
    policy = SecurityPolicy(effect_guard=env.guard())

    @Airlock(policy=policy, config=env.config)
    def book(seat: int) -> int:
        attempts.append(seat)
        if len(attempts) == 1:
            raise ValueError("seat map not loaded")
        return seat

    with with_id("b1"):
        failed = book(seat=3)
        assert env.store.get("b1") is None
        assert book(seat=3) == 3
    assert blocked(failed, "validation_error")["fix_hints"] == [
        "An internal error occurred. Please try again."
    ]
    assert attempts == [3, 3]
    assert [line.get("effect") for line in env.audit()] == ["released", "executed"]


def test_effect_outcome_unknown_records_unknown(memory_env: Env) -> None:
    policy = SecurityPolicy(effect_guard=memory_env.guard())

    @Airlock(policy=policy, config=memory_env.config)
    def ship(order: str) -> str:
        raise EffectOutcomeUnknown("carrier API timed out after accepting")

    with with_id("o1"):
        ship(order="x")
    record = memory_env.store.get("o1")
    assert record is not None and record.status is Status.UNKNOWN


# -- generators, sandbox, freeze, reversibility ------------------------------------------------
def test_a_generator_tool_is_recorded_unknown(memory_env: Env) -> None:
    policy = SecurityPolicy(effect_guard=memory_env.guard())
    produced: list[int] = []

    @Airlock(policy=policy, config=memory_env.config)
    def stream(n: int) -> Iterator[int]:
        for i in range(n):
            produced.append(i)
            yield i

    with with_id("g1"):
        assert list(stream(n=2)) == [0, 1]
        blocked(stream(n=2), "effect_status_unknown")
    record = memory_env.store.get("g1")
    assert record is not None and record.status is Status.UNKNOWN
    assert produced == [0, 1]


def test_sandbox_with_a_guard_is_refused(memory_env: Env) -> None:
    guarded = SecurityPolicy(effect_guard=memory_env.guard())
    with pytest.raises(TypeError, match=r"sandbox=True cannot be combined with an effect_guard"):

        @Airlock(policy=guarded, config=memory_env.config, sandbox=True)
        def run_code(code: str) -> str:
            return code

    # A resolver picks the policy per call: the refusal then comes before anything runs.
    @Airlock(policy=lambda context: guarded, config=memory_env.config, sandbox=True)
    def run_later(code: str) -> str:
        return code

    with with_id("s1"):
        refused = blocked(run_later(code="1"), "sandbox_error")
    assert "effect_guard" in refused["error"] and memory_env.store.get("s1") is None


def test_freeze_keeps_the_guard(env: Env) -> None:
    guard = env.guard()
    frozen = SecurityPolicy(allowed_tools=["charge"], effect_guard=guard).freeze()
    assert type(frozen) is SecurityPolicy and frozen.effect_guard is guard and frozen.is_frozen()
    frozen.verify_frozen()
    runs: list[dict[str, Any]] = []
    charge = charge_tool(frozen, env, runs)
    with with_id("f1"):
        assert charge(account="a", cents=1) == charge(account="a", cents=1)
    assert len(runs) == 1
    frozen.effect_guard = EffectGuard(store=env.store, require_tool_call_id=False)
    with with_id("f2"):
        blocked(charge(account="a", cents=1), "policy_violation")
    assert len(runs) == 1


@pytest.mark.parametrize("placement", ["above", "below", "untagged"])
def test_reversibility_above_or_below(memory_env: Env, placement: str) -> None:
    policy = SecurityPolicy(effect_guard=memory_env.guard())
    attempts: list[int] = []

    def poll(n: int) -> int:
        attempts.append(n)
        if len(attempts) == 1:
            raise TimeoutError("lost")
        return n

    if placement == "above":
        tool = reversibility("reversible")(Airlock(policy=policy, config=memory_env.config)(poll))
    elif placement == "below":
        tool = Airlock(policy=policy, config=memory_env.config)(reversibility("reversible")(poll))
    else:
        tool = Airlock(policy=policy, config=memory_env.config)(poll)
    with with_id("r1"):
        tool(n=1)
        second = tool(n=1)
    if placement == "untagged":
        blocked(second, "effect_status_unknown")
        assert attempts == [1]
    else:
        assert second == 1 and attempts == [1, 1]


# -- async tools -------------------------------------------------------------------------------
def test_async_tools_behave_like_sync_ones(env: Env) -> None:
    policy = SecurityPolicy(effect_guard=env.guard())
    runs: list[Any] = []

    @Airlock(policy=policy, config=env.config)
    async def refund(cents: int) -> dict[str, int]:
        await asyncio.sleep(0)
        runs.append(get_current_context().idempotency_key)  # type: ignore[union-attr]
        return {"refunded": cents}

    @Airlock(policy=policy, config=env.config)
    async def cancel(order: str) -> str:
        await asyncio.sleep(0)
        raise ConnectionResetError("peer went away")

    async def scenario() -> list[Any]:
        with with_id("a1"):
            out = [await anyway(refund)(cents=c) for c in (7, 7, 8)]
        with with_id("a2"):
            out += [await anyway(cancel)(order="o") for _ in range(2)]
        out.append(await anyway(refund)(cents=7))
        return out

    first, replay, other, failed, refused, no_id = asyncio.run(scenario())
    assert first == replay == {"refunded": 7}
    assert runs == [idempotency_key("refund", {"cents": 7})]
    blocked(other, "policy_violation")
    blocked(failed, "effect_status_unknown")  # ConnectionResetError: in doubt, told so at once
    blocked(refused, "effect_status_unknown")
    blocked(no_id, "tool_call_id_required")
    record = env.store.get("a2")
    assert record is not None and record.status is Status.UNKNOWN
    effects = [line.get("effect") for line in env.audit()]
    assert effects == ["executed", "replayed", "refused", "unknown", "refused", "refused"]


# -- a guarded policy under the plain decorator ------------------------------------------------
def test_a_guarded_policy_under_plain_airlock_refuses(memory_env: Env) -> None:
    policy = SecurityPolicy(effect_guard=memory_env.guard())
    runs: list[int] = []

    @PlainAirlock(policy=policy, config=memory_env.config)
    def charge(cents: int) -> int:
        runs.append(cents)
        return cents

    with with_id("x1"):
        refused = blocked(charge(cents=1), "policy_violation")
    assert runs == [] and "airlock_redis" in refused["error"]
