"""airlock_redis's Airlock and SecurityPolicy held to agent_airlock 0.10.26's own behaviour.

agent-airlock's sdist on the package index ships no tests, so this file is the parity check: each
scenario runs twice, once with agent_airlock's classes and once with ours, and compares everything
a caller can see (results, refusals, exceptions, callbacks, approver requests, audit lines, the
decorated tool's attributes, policy digests).

- Without an ``effect_guard`` the two runs must be identical.
- With one, a refusal the guard only relays (an escalation the approver did not grant, a call
  agent_airlock's own policy checks refuse) keeps agent_airlock's reason code and detail, and
  ``policy.check()`` answers ``effect_guard_unsupported`` only for calls agent_airlock would let
  through. These run on the in-memory store and on a real redis-server.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from agent_airlock import Airlock as PlainAirlock
from agent_airlock import AirlockConfig, AirlockContext
from agent_airlock import SecurityPolicy as PlainPolicy
from agent_airlock.oversight import OversightRequest, OversightResponse, OversightVerdict
from agent_airlock.policy import AgentIdentity, PolicyMutationError, PolicyViolation
from agent_airlock.unknown_args import UnknownArgsMode

from airlock_redis import Airlock, EffectGuard, EffectStore, SecurityPolicy, Status
from tests.conftest import make_store

Scenario = Callable[["Kit", AirlockConfig], list[Any]]


@dataclass(frozen=True)
class Kit:
    """One side of the comparison: which Airlock and SecurityPolicy the scenario uses."""

    name: str
    airlock: type[PlainAirlock]
    policy: type[PlainPolicy]


UPSTREAM = Kit("upstream", PlainAirlock, PlainPolicy)
OURS = Kit("ours", Airlock, SecurityPolicy)


# -- what a caller sees, made comparable ---------------------------------------------------------
def raised(error: BaseException) -> dict[str, Any]:
    seen: dict[str, Any] = {"raised": type(error).__name__, "message": str(error)}
    if isinstance(error, PolicyViolation):
        seen.update(violation_type=error.violation_type, details=error.details)
    return seen


def checked(policy: PlainPolicy, tool: str, agent: AgentIdentity | None = None) -> dict[str, Any]:
    try:
        policy.check(tool, agent=agent)
    except Exception as error:
        return raised(error)
    return {"passed": tool}


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def steady(seen: Any) -> Any:
    """``seen`` without what differs from run to run: the rate limiter's seconds-to-wait, which
    depend on the clock, and random request ids."""
    if isinstance(seen, dict):
        return {k: "<seconds>" if k == "reset_seconds" else steady(v) for k, v in seen.items()}
    if isinstance(seen, list | tuple):
        return [steady(v) for v in seen]
    if isinstance(seen, str):
        return _UUID.sub("<uuid>", re.sub(r"Wait \d+ seconds?", "Wait <seconds>", seen))
    return seen


def audit_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8").splitlines()
    lines = [json.loads(line) for line in text if line and not line.startswith("#")]
    return [{k: v for k, v in line.items() if k not in ("timestamp", "duration_ms")} for line in lines]


class Approver:
    """agent_airlock's approver protocol, answering from a script and recording each request."""

    def __init__(self, *answers: OversightVerdict | str) -> None:
        self.answers = list(answers)
        self.requests: list[OversightRequest] = []

    def __call__(self, request: OversightRequest) -> OversightResponse:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if answer == "raise":
            raise ConnectionError("pager unreachable")
        if answer == "mismatch":
            return OversightResponse(request_id="another", verdict=OversightVerdict.GRANT, approver="bot")
        assert isinstance(answer, OversightVerdict)
        return OversightResponse(
            request_id=request.request_id,
            verdict=answer,
            detail=f"{answer.value} by the on-call reviewer",
            approver="alice@example.com",
        )

    def asked(self) -> list[dict[str, Any]]:
        keep = ("escalation_reason", "escalation_rule")
        return [
            {
                "tool": r.tool_name,
                "args": {k: v for k, v in r.args.items() if k in keep},
                "channel": r.channel,
                "timeout": r.timeout_seconds,
            }
            for r in self.requests
        ]


class AsyncApprover(Approver):
    async def __call__(self, request: OversightRequest) -> OversightResponse:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__call__(request)


def observe(scenario: Scenario, kit: Kit, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / f"{kit.name}-audit.jsonl"
    callbacks: list[Any] = []
    config = AirlockConfig(
        audit_log_path=path,
        unknown_args=UnknownArgsMode.BLOCK,
        on_blocked=lambda *args: callbacks.append(["on_blocked", *args]),
        on_rate_limit=lambda *args: callbacks.append(["on_rate_limit", *args]),
        on_validation_error=lambda name, error: callbacks.append(
            ["on_validation_error", name, type(error).__name__]
        ),
    )
    results = scenario(kit, config)
    seen: dict[str, Any] = steady({"results": results, "callbacks": callbacks, "audit": audit_lines(path)})
    return seen


# -- the scenarios (each runs under both kits, without a guard) ----------------------------------
def loose(tool: Any) -> Any:
    """A decorated tool typed loosely, to call it with the arguments a model might send."""
    return tool


def plain_calls(kit: Kit, config: AirlockConfig) -> list[Any]:
    @kit.airlock(config=config)
    def add(a: int, b: int = 2) -> int:
        return a + b

    as_dict = kit.airlock(config=config, return_dict=True)(add.__wrapped__)  # type: ignore[attr-defined]
    return [add(a=1), add(1, b=5), as_dict(a=3), loose(add)(a="x"), loose(add)(a=1, c=3)]


def async_calls(kit: Kit, config: AirlockConfig) -> list[Any]:
    @kit.airlock(config=config)
    async def add(a: int, b: int = 2) -> int:
        await asyncio.sleep(0)
        return a + b

    @kit.airlock(config=config, return_dict=True)
    async def fail(reason: str) -> int:
        raise TimeoutError(reason)

    async def scenario() -> list[Any]:
        return [await loose(add)(a=1), await loose(add)(a="x"), await loose(fail)(reason="late")]

    return asyncio.run(scenario())


def tool_errors(kit: Kit, config: AirlockConfig) -> list[Any]:
    @kit.airlock(config=config)
    def book(seat: int) -> int:
        raise ValueError if seat else TimeoutError

    return [book(seat=1), book(seat=0)]


def the_wrapper(kit: Kit, config: AirlockConfig) -> list[Any]:
    def charge(account: str, cents: int = 0) -> dict[str, int]:
        """Move money."""
        return {"cents": cents}

    async def refund(cents: int) -> int:
        return cents

    charge.marker = "kept"  # type: ignore[attr-defined]
    seen: list[Any] = []
    for func in (charge, refund):
        airlock = kit.airlock(config=config, return_dict=1)  # type: ignore[arg-type]
        tool = airlock(func)
        seen.append(
            {
                "wrapped_is_func": tool.__wrapped__ is func,  # type: ignore[attr-defined]
                "unwrapped_is_func": inspect.unwrap(tool) is func,
                "name": tool.__name__,
                "qualname": tool.__qualname__,
                "doc": tool.__doc__,
                "module": tool.__module__,
                "signature": str(inspect.signature(tool)),
                "annotations": repr(tool.__annotations__),
                "dict": sorted(vars(tool)),
                "marker": getattr(tool, "marker", None),
                "is_async": inspect.iscoroutinefunction(tool),
                "airlock_vars": sorted(vars(airlock)),
                "return_dict": airlock.return_dict,
            }
        )
    return seen


def policy_refusals(kit: Kit, config: AirlockConfig) -> list[Any]:
    policies = {
        "not_allowed": kit.policy(allowed_tools=["other"]),
        "denied": kit.policy(denied_tools=["ping*"]),
        "agent": kit.policy(require_agent_id=True),
        "role": kit.policy(allowed_roles=["admin"]),
        "rate": kit.policy(rate_limits={"ping": "1/hour"}),
    }
    out: list[Any] = []
    for name, policy in policies.items():

        @kit.airlock(config=config, policy=policy)
        def ping(n: int) -> int:
            return n

        out += [name, ping(n=1), ping(n=2)]
    return out


def direct_checks(kit: Kit, config: AirlockConfig) -> list[Any]:
    agent = AgentIdentity(agent_id="a1", roles=["user"])
    rate = kit.policy(rate_limits={"ping": "1/hour"})
    return [
        checked(kit.policy(allowed_tools=["other"]), "ping"),
        checked(kit.policy(denied_tools=["ping"]), "ping"),
        checked(kit.policy(require_agent_id=True), "ping"),
        checked(kit.policy(allowed_roles=["admin"]), "ping", agent),
        checked(rate, "ping"),
        checked(rate, "ping"),
        checked(kit.policy(escalate_tools={"ping": "a human looks"}), "ping"),
        checked(kit.policy(), "ping", agent),
    ]


def escalations(kit: Kit, config: AirlockConfig) -> list[Any]:
    grant, deny, timeout = OversightVerdict.GRANT, OversightVerdict.DENY, OversightVerdict.TIMEOUT
    approver = Approver(deny, timeout, grant, "raise", "mismatch", deny, timeout, grant)
    policy = kit.policy(escalate_tools={"*pay*": "money moves"}, approver=approver, escalation_channel="ops")
    bare = kit.policy(escalate_tools={"*pay*": "money moves"})

    @kit.airlock(config=config, policy=policy)
    def pay(cents: int) -> int:
        return cents

    @kit.airlock(config=config, policy=policy)
    async def apay(cents: int) -> int:
        return cents

    @kit.airlock(config=config, policy=bare)
    def pay_bare(cents: int) -> int:
        return cents

    async def run_async() -> list[Any]:
        return [await apay(cents=c) for c in (6, 7, 8)]  # type: ignore[misc]

    sync = [pay(cents=c) for c in (1, 2, 3, 4, 5)]
    return [*sync, *asyncio.run(run_async()), pay_bare(cents=9), approver.asked()]


def frozen_policies(kit: Kit, config: AirlockConfig) -> list[Any]:
    policy = kit.policy(allowed_tools=["ping"], rate_limits={"ping": "5/minute"}, escalate_tools={"x": "y"})
    frozen = policy.freeze()

    @kit.airlock(config=config, policy=frozen)
    def ping(n: int) -> int:
        return n

    out: list[Any] = [
        type(frozen) is kit.policy,
        frozen.is_frozen(),
        frozen._frozen_digest,
        policy._compute_policy_digest(),
        repr(frozen._canonical_bytes()),
        ping(n=1),
    ]
    frozen.allowed_tools.append("other")
    try:
        frozen.verify_frozen()
    except PolicyMutationError as error:
        out.append(raised(error))
    out.append(ping(n=2))
    return out


class Adder:
    def __call__(self, a: int) -> int:
        return a


def odd_callables(kit: Kit, config: AirlockConfig) -> list[Any]:
    """Callables without a __name__: agent_airlock refuses them, when decorated or when called."""

    def add(a: int, b: int) -> int:
        return a + b

    out: list[Any] = []
    for func in (functools.partial(add, b=2), Adder()):
        try:
            tool = kit.airlock(config=config)(func)
        except Exception as error:
            out.append(["decorating raised", type(error).__name__])
            continue
        try:
            out.append(tool(a=1))
        except Exception as error:
            out.append(["calling raised", type(error).__name__, str(error)])
    return out


def resolvers(kit: Kit, config: AirlockConfig) -> list[Any]:
    allowed = kit.policy(allowed_tools=["ping"])

    @kit.airlock(config=config, policy=lambda context: allowed)
    def ping(n: int) -> int:
        return n

    @kit.airlock(config=config, policy=lambda context: None)
    def pong(n: int) -> int:
        return n

    with AirlockContext(agent_id="agent-1"):
        return [ping(n=1), pong(n=1)]


SCENARIOS: dict[str, Scenario] = {
    "plain_calls": plain_calls,
    "async_calls": async_calls,
    "tool_errors": tool_errors,
    "the_wrapper": the_wrapper,
    "policy_refusals": policy_refusals,
    "direct_checks": direct_checks,
    "escalations": escalations,
    "frozen_policies": frozen_policies,
    "resolvers": resolvers,
    "odd_callables": odd_callables,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_without_a_guard_ours_behave_as_agent_airlocks(name: str, tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    upstream = observe(scenario, UPSTREAM, tmp_path)
    ours = observe(scenario, OURS, tmp_path)
    assert upstream["results"], "the scenario observed nothing"
    assert ours == upstream


def test_the_wrapped_function_is_the_users(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The one upstream test that changed result: ``Airlock()(f).__wrapped__ is f``."""
    monkeypatch.chdir(tmp_path)  # the default config opens airlock_audit.json in the working directory

    def f(x: int) -> int:
        return x

    async def g(x: int) -> int:
        return x

    assert Airlock()(f).__wrapped__ is f  # type: ignore[attr-defined]
    assert Airlock()(g).__wrapped__ is g  # type: ignore[attr-defined]
    guarded = SecurityPolicy(effect_guard=EffectGuard())
    assert Airlock(policy=guarded)(f).__wrapped__ is f  # type: ignore[attr-defined]


def test_the_escalation_table_saw_each_outcome(tmp_path: Path) -> None:
    """What ``escalations`` compares: agent_airlock's answer for each approver outcome."""
    results = observe(escalations, UPSTREAM, tmp_path)["results"]
    reasons = [r["block_reason"] if isinstance(r, dict) else r for r in results[:9]]
    assert reasons == [
        "escalation_denied",
        "escalation_timeout",
        3,
        "escalation_denied",
        "escalation_denied",
        "escalation_denied",
        "escalation_timeout",
        8,
        "escalation_required",
    ]
    assert results[0]["metadata"]["detail"] == "deny by the on-call reviewer"
    assert results[1]["metadata"]["detail"] == "timeout by the on-call reviewer"


# -- with a guard: relayed refusals keep agent_airlock's reason and detail -------------------------
@pytest.fixture(params=("memory", "redis"))
def store(request: pytest.FixtureRequest, namespace: str) -> EffectStore:
    return make_store(request.param, request, namespace)


def config_for(path: Path, callbacks: list[Any]) -> AirlockConfig:
    return AirlockConfig(
        audit_log_path=path,
        unknown_args=UnknownArgsMode.BLOCK,
        on_blocked=lambda *args: callbacks.append(["on_blocked", *args]),
    )


def pay_tool(
    airlock: type[PlainAirlock], policy: Any, config: AirlockConfig, kind: str
) -> Callable[..., Any]:
    if kind == "sync":

        @airlock(config=config, policy=policy)
        def pay(cents: int) -> int:
            return cents

        return pay

    @airlock(config=config, policy=policy)
    async def apay(cents: int) -> int:
        return cents

    def run(**kwargs: Any) -> Any:
        return asyncio.run(apay(**kwargs))  # type: ignore[arg-type]

    return run


def escalate(policy_type: type[PlainPolicy], approver: Approver, **extra: Any) -> Any:
    return policy_type(escalate_tools={"*pay*": "money moves"}, approver=approver, **extra)


@pytest.mark.parametrize("tool_kind", ["sync", "async"])
@pytest.mark.parametrize("approver_kind", ["sync", "async"])
@pytest.mark.parametrize("verdict", [OversightVerdict.DENY, OversightVerdict.TIMEOUT])
def test_a_relayed_escalation_keeps_agent_airlocks_reason_and_detail(
    store: EffectStore, tmp_path: Path, tool_kind: str, approver_kind: str, verdict: OversightVerdict
) -> None:
    upstream_calls: list[Any] = []
    plain = escalate(PlainPolicy, Approver(verdict))
    plain_pay = pay_tool(
        PlainAirlock, plain, config_for(tmp_path / "upstream.jsonl", upstream_calls), tool_kind
    )
    with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": "c1"}):
        expected = plain_pay(cents=5)

    our_calls: list[Any] = []
    approver = (AsyncApprover if approver_kind == "async" else Approver)(verdict)
    guarded = escalate(SecurityPolicy, approver, effect_guard=EffectGuard(store=store))
    our_pay = pay_tool(Airlock, guarded, config_for(tmp_path / "ours.jsonl", our_calls), tool_kind)
    with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": "c1"}):
        got = our_pay(cents=5)

    reason = "escalation_timeout" if verdict is OversightVerdict.TIMEOUT else "escalation_denied"
    assert expected["block_reason"] == reason
    assert got == expected  # reason, error, hints and metadata (detail, approver, outcome)
    assert got["metadata"]["detail"] == f"{verdict.value} by the on-call reviewer"
    assert our_calls == upstream_calls and len(our_calls) == 1
    assert len(approver.requests) == 1
    assert store.get("c1") is None  # refused before the guard recorded anything
    line = audit_lines(tmp_path / "ours.jsonl")[-1]
    assert (line["blocked"], line["block_reason"], line["effect"]) == (True, reason, "refused")


@pytest.mark.parametrize("tool_kind", ["sync", "async"])
@pytest.mark.parametrize("fault", ["raise", "mismatch"])
def test_an_approver_fault_is_an_escalation_denied_as_agent_airlock_says(
    store: EffectStore, tmp_path: Path, tool_kind: str, fault: str
) -> None:
    upstream_calls: list[Any] = []
    plain_pay = pay_tool(
        PlainAirlock,
        escalate(PlainPolicy, Approver(fault)),
        config_for(tmp_path / "u.jsonl", upstream_calls),
        tool_kind,
    )
    our_calls: list[Any] = []
    guarded = escalate(SecurityPolicy, Approver(fault), effect_guard=EffectGuard(store=store))
    our_pay = pay_tool(Airlock, guarded, config_for(tmp_path / "o.jsonl", our_calls), tool_kind)
    with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": "c1"}):
        expected, got = plain_pay(cents=5), our_pay(cents=5)

    assert got["block_reason"] == expected["block_reason"] == "escalation_denied"
    assert got["fix_hints"] == expected["fix_hints"]
    keys = ("function", "escalation_rule", "escalation_reason", "escalation_outcome", "approver")
    assert {k: got["metadata"][k] for k in keys} == {k: expected["metadata"][k] for k in keys}
    # The detail is ours here (agent_airlock words its own), and says what went wrong.
    assert ("ConnectionError" if fault == "raise" else "'another'") in got["metadata"]["detail"]
    assert our_calls == upstream_calls == []  # agent_airlock calls on_blocked for a verdict only
    assert store.get("c1") is None


def test_a_granted_escalation_runs_once_and_replays(store: EffectStore, tmp_path: Path) -> None:
    runs: list[int] = []
    approver = Approver(OversightVerdict.GRANT, OversightVerdict.GRANT, OversightVerdict.TIMEOUT)
    policy = escalate(SecurityPolicy, approver, effect_guard=EffectGuard(store=store))

    @Airlock(config=config_for(tmp_path / "o.jsonl", []), policy=policy)
    def pay(cents: int) -> int:
        runs.append(cents)
        return cents

    with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": "c1"}):
        answers = [pay(cents=5) for _ in range(3)]
    assert answers[:2] == [5, 5] and runs == [5]
    assert answers[2]["block_reason"] == "escalation_timeout"  # type: ignore[index]
    record = store.get("c1")
    assert record is not None and record.status is Status.COMMITTED


# -- with a guard: policy.check() keeps agent_airlock's reasons ------------------------------------
_CLOSED = (datetime.now().hour + 2) % 24  # a window two hours from now, which does not include now
REFUSED_CHECKS: dict[str, dict[str, Any]] = {
    "tool_not_allowed": {"allowed_tools": ["other"]},
    "tool_denied": {"denied_tools": ["pay*"]},
    "agent_required": {"require_agent_id": True},
    "role_required": {"allowed_roles": ["admin"]},
    "time_restricted": {"time_restrictions": {"pay": f"{_CLOSED:02d}:00-{_CLOSED:02d}:30"}},
}


@pytest.mark.parametrize("violation", sorted(REFUSED_CHECKS))
def test_check_on_a_guarded_policy_keeps_agent_airlocks_refusal(store: EffectStore, violation: str) -> None:
    options = REFUSED_CHECKS[violation]
    expected = checked(PlainPolicy(**options), "pay")
    got = checked(SecurityPolicy(effect_guard=EffectGuard(store=store), **options), "pay")
    assert expected["violation_type"] == violation
    assert got == expected


def test_check_on_a_guarded_policy_keeps_a_rate_limit(store: EffectStore) -> None:
    plain = PlainPolicy(rate_limits={"pay": "1/hour"})
    guarded = SecurityPolicy(rate_limits={"pay": "1/hour"}, effect_guard=EffectGuard(store=store))
    first, expected = checked(plain, "pay"), checked(plain, "pay")
    assert first == {"passed": "pay"} and expected["violation_type"] == "rate_limited"
    assert checked(guarded, "pay")["violation_type"] == "effect_guard_unsupported"
    assert steady(checked(guarded, "pay")) == steady(expected)


@pytest.mark.parametrize(
    "options", [{}, {"escalate_tools": {"pay": "money moves"}}], ids=["allowed", "escalated"]
)
def test_check_on_a_guarded_policy_refuses_what_agent_airlock_lets_through(
    store: EffectStore, options: dict[str, Any]
) -> None:
    plain = checked(PlainPolicy(**options), "pay")
    assert plain.get("violation_type") in (None, "escalation_required")
    got = checked(SecurityPolicy(effect_guard=EffectGuard(store=store), **options), "pay")
    assert got["raised"] == "PolicyViolation" and got["violation_type"] == "effect_guard_unsupported"
    assert "airlock_redis" in got["message"]


def test_plain_airlock_with_a_guarded_policy_answers_with_agent_airlocks_reason(
    store: EffectStore, tmp_path: Path
) -> None:
    runs: list[int] = []
    guard = EffectGuard(store=store)

    def make(policy: Any, path: Path) -> Callable[..., Any]:
        @PlainAirlock(config=config_for(path, []), policy=policy)
        def pay(cents: int) -> int:
            runs.append(cents)
            return cents

        return pay

    expected = make(PlainPolicy(denied_tools=["pay"]), tmp_path / "u.jsonl")(cents=1)
    got = make(SecurityPolicy(denied_tools=["pay"], effect_guard=guard), tmp_path / "o.jsonl")(cents=1)
    assert got == expected and expected["metadata"]["violation_type"] == "tool_denied"
    # A call agent_airlock would run is refused rather than run without the guard, escalated or not.
    approver = Approver(OversightVerdict.GRANT)
    for policy in (
        SecurityPolicy(effect_guard=guard),
        escalate(SecurityPolicy, approver, effect_guard=guard),
    ):
        with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": "x1"}):
            refused = make(policy, tmp_path / "o.jsonl")(cents=2)
        assert refused["block_reason"] == "policy_violation"
        assert refused["metadata"]["violation_type"] == "effect_guard_unsupported"
    assert runs == [] and approver.requests == [] and store.get("x1") is None


def test_guarded_gate_refusals_are_agent_airlocks(store: EffectStore, tmp_path: Path) -> None:
    """A call agent_airlock's gates refuse answers the same with a guard on; nothing is recorded."""
    # The call that fails validation spends one of the two (agent_airlock checks the policy first).
    options: dict[str, Any] = {"allowed_tools": ["pay"], "rate_limits": {"pay": "2/hour"}}

    def answers(airlock: type[PlainAirlock], policy: Any, path: Path) -> list[Any]:
        @airlock(config=config_for(path, []), policy=policy)
        def pay(cents: int) -> int:
            return cents

        @airlock(config=config_for(path, []), policy=policy)
        def wipe(cents: int) -> int:
            return cents

        with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": "g1"}):
            tool = loose(pay)
            return [wipe(cents=1), tool(cents="x"), tool(cents=1, extra=2), tool(cents=1), tool(cents=1)]

    expected = answers(PlainAirlock, PlainPolicy(**options), tmp_path / "u.jsonl")
    got = answers(
        Airlock, SecurityPolicy(effect_guard=EffectGuard(store=store), **options), tmp_path / "o.jsonl"
    )
    assert [r if isinstance(r, int) else r["block_reason"] for r in expected] == [
        "policy_violation",
        "validation_error",
        "ghost_arguments",
        1,
        "rate_limit",
    ]
    assert steady(got) == steady(expected)
    record = store.get("g1")
    assert record is not None and record.status is Status.COMMITTED and record.attempt == 1


def test_a_tool_without_a_name_never_runs_unguarded(store: EffectStore, tmp_path: Path) -> None:
    runs: list[int] = []

    def pay(cents: int, account: str) -> int:
        runs.append(cents)
        return cents

    tool = functools.partial(pay, account="a")
    policy = SecurityPolicy(effect_guard=EffectGuard(store=store))
    guarded: Any = Airlock(config=config_for(tmp_path / "o.jsonl", []), policy=policy)(tool)
    with AirlockContext(agent_id="agent-1", metadata={"tool_call_id": "n1"}):
        with pytest.raises(AttributeError, match="__name__"):  # as under agent_airlock's Airlock
            guarded(cents=1)
        tool.__name__ = "pay"  # type: ignore[attr-defined]
        refused = guarded(cents=1)
    assert refused["metadata"]["violation_type"] == "effect_guard_unsupported"
    assert runs == [] and store.get("n1") is None
