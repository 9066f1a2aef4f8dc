"""Spec rules a review found without a test, each on the in-memory store and a real redis-server.

| rule (spec)                                                        | tests                          |
|--------------------------------------------------------------------|--------------------------------|
| target_args: the call must *pass* a target with a value (@Airlock) | test_target_args_through_*     |
| other arguments or another tool under a live id: policy violation  | test_a_live_call_*             |
| the default store's begin is atomic (one run under a burst)        | test_a_burst_on_one_new_id_*   |
| require_approval_for_irreversible + escalate_tools: asked once     | test_an_irreversible_*         |
| the idempotency key does not depend on the tool_call_id            | test_the_idempotency_key_*     |
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_airlock import AirlockConfig, get_current_context
from agent_airlock.oversight import OversightVerdict
from agent_airlock.unknown_args import UnknownArgsMode

from airlock_redis import (
    Airlock,
    EffectGuard,
    EffectRefused,
    EffectStore,
    InMemoryEffectStore,
    SecurityPolicy,
    Status,
    current_idempotency_key,
    idempotency_key,
    reversibility,
    tool_call_context,
)
from tests.conftest import make_store
from tests.test_airlock_adapter import Approvals, Env, anyway, blocked, with_id
from tests.test_options import refusal

KEY_STORES = ("memory", "redis")


@pytest.fixture(params=KEY_STORES)
def env(request: pytest.FixtureRequest, namespace: str, tmp_path: Path) -> Env:
    path = tmp_path / "audit.jsonl"
    config = AirlockConfig(audit_log_path=path, unknown_args=UnknownArgsMode.BLOCK)
    return Env(make_store(request.param, request, namespace), config, path)


@pytest.fixture(params=KEY_STORES)
def key_store(request: pytest.FixtureRequest, namespace: str) -> EffectStore:
    return make_store(request.param, request, namespace)


# -- 1. target_args through @Airlock: a target counts only when the caller passed it ------------------
def deploy_tool(
    policy: SecurityPolicy, env: Env, kind: str, runs: list[dict[str, Any]]
) -> Callable[..., Any]:
    """An @Airlock tool ``deploy(service, project=None, region="eu")``, sync or async; returns a
    blocking caller."""
    if kind == "sync":

        @Airlock(policy=policy, config=env.config)
        def deploy(service: str, project: str | None = None, region: str = "eu") -> str:
            runs.append({"service": service, "project": project, "region": region})
            return f"{service}@{project}/{region}"

        return deploy

    @Airlock(policy=policy, config=env.config)
    async def deploy_async(service: str, project: str | None = None, region: str = "eu") -> str:
        await asyncio.sleep(0)
        runs.append({"service": service, "project": project, "region": region})
        return f"{service}@{project}/{region}"

    tool = anyway(deploy_async)

    def call(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(tool(*args, **kwargs))

    return call


REFUSED_TARGETS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    # neither target passed: "project" is missing, "region" is there only by its default
    "missing, region only by default": ((), {"service": "api"}),
    "positional, region only by default": (("api",), {}),
    "project None": ((), {"service": "api", "project": None}),
    "project empty": ((), {"service": "api", "project": ""}),
    "region empty": ((), {"service": "api", "region": ""}),
    "both empty, positionally": (("api", "", ""), {}),
}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("case", list(REFUSED_TARGETS))
def test_target_args_through_airlock_refuses_a_call_that_passes_no_target(
    env: Env, kind: str, case: str
) -> None:
    runs: list[dict[str, Any]] = []
    policy = SecurityPolicy(effect_guard=env.guard(target_args=("project", "region")))
    deploy = deploy_tool(policy, env, kind, runs)
    args, kwargs = REFUSED_TARGETS[case]
    with with_id("tgt-refused"):
        refused = blocked(deploy(*args, **kwargs), "target_args_required")
    assert "project" in refused["error"] and "region" in refused["error"]
    assert runs == []
    assert env.store.get("tgt-refused") is None


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_target_args_through_airlock_runs_a_call_that_passes_a_target(env: Env, kind: str) -> None:
    runs: list[dict[str, Any]] = []
    policy = SecurityPolicy(effect_guard=env.guard(target_args=("project", "region")))
    deploy = deploy_tool(policy, env, kind, runs)
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
        # the default's own value, passed explicitly, names the target
        ("t1", (), {"service": "api", "region": "eu"}, "api@None/eu"),
        ("t2", (), {"service": "api", "project": "p1"}, "api@p1/eu"),
        ("t3", ("api", None, "us"), {}, "api@None/us"),
        ("t4", ("api", "p2"), {}, "api@p2/eu"),
    ]
    for tool_call_id, args, kwargs, expected in calls:
        with with_id(tool_call_id):
            assert deploy(*args, **kwargs) == expected
        record = env.store.get(tool_call_id)
        assert record is not None and record.status is Status.COMMITTED
    assert len(runs) == len(calls)


# -- 2. other arguments or another tool under a live call: policy_violation at once -------------------
def test_a_live_call_refuses_other_arguments_and_another_tool_at_once(key_store: EffectStore) -> None:
    guard = EffectGuard(store=key_store)  # the defaults: a lease, wait_for_running 5 s
    assert guard.lease is not None and guard.wait_for_running == 5.0
    started, go = threading.Event(), threading.Event()
    runs: list[tuple[str, int]] = []

    def charge(cents: int) -> dict[str, int]:
        runs.append(("charge", cents))
        started.set()
        assert go.wait(30)
        return {"charged": cents}

    def refund(cents: int) -> dict[str, int]:
        runs.append(("refund", cents))
        return {"refunded": cents}

    guarded_charge, guarded_refund = guard.wrap(charge), guard.wrap(refund)
    first: list[Any] = []

    def run_first() -> None:
        with tool_call_context("live-1"):
            first.append(guarded_charge(5))

    worker = threading.Thread(target=run_first)
    worker.start()
    try:
        assert started.wait(10)
        record = key_store.get("live-1")
        assert record is not None and record.status is Status.PENDING  # the call is running
        for tool, cents in ((guarded_charge, 6), (guarded_refund, 5)):
            began = time.monotonic()
            refused = refusal(tool, "live-1", cents)
            waited = time.monotonic() - began
            assert refused.reason == "policy_violation", refused
            assert waited < 2.0, f"refused after {waited:.2f} s: it waited for the running call"
        assert runs == [("charge", 5)]
    finally:
        go.set()
        worker.join(30)
    assert not worker.is_alive()
    assert first == [{"charged": 5}]
    record = key_store.get("live-1")
    assert record is not None and record.status is Status.COMMITTED
    assert runs == [("charge", 5)]


# -- 3. the default in-memory store's begin is atomic -------------------------------------------------
@pytest.mark.parametrize("tag", [None, "reversible"])
def test_a_burst_on_one_new_id_runs_the_tool_once_on_the_default_store(tag: str | None) -> None:
    guard = EffectGuard()
    assert isinstance(guard.store, InMemoryEffectStore)
    threads = 32
    barrier = threading.Barrier(threads)
    runs: list[int] = []
    lock = threading.Lock()

    def charge(cents: int) -> dict[str, int]:
        with lock:
            runs.append(cents)
        time.sleep(0.2)  # still running while the others arrive
        return {"charged": cents}

    tool = guard.wrap(charge if tag is None else reversibility("reversible")(charge))
    results: list[Any] = [None] * threads

    def call(index: int) -> None:
        barrier.wait(10)
        with tool_call_context("burst-1"):
            try:
                results[index] = tool(7)
            except EffectRefused as refused:
                results[index] = refused

    workers = [threading.Thread(target=call, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert not any(worker.is_alive() for worker in workers)
    assert runs == [7]  # exactly one run, never a second
    assert all(r == {"charged": 7} or isinstance(r, EffectRefused) for r in results), results
    assert results.count({"charged": 7}) >= 1  # the one that ran got its value
    record = guard.store.get("burst-1")
    assert record is not None and record.status is Status.COMMITTED and record.attempt == 1


# -- 4. require_approval_for_irreversible with escalate_tools on the same tool: asked once -----------
def test_an_irreversible_escalated_tool_asks_the_approver_once_per_call(env: Env) -> None:
    runs: list[dict[str, Any]] = []
    approvals = Approvals(OversightVerdict.GRANT, OversightVerdict.GRANT, OversightVerdict.DENY)
    policy = SecurityPolicy(
        escalate_tools={"charge": "money moves"},
        approver=approvals,
        effect_guard=env.guard(require_approval_for_irreversible=True),
    )

    @Airlock(policy=policy, config=env.config)
    def charge(account: str, cents: int) -> dict[str, Any]:
        runs.append({"account": account, "cents": cents})
        return {"charged": cents}

    with with_id("esc-1"):
        assert charge(account="a", cents=5) == {"charged": 5}
    assert len(approvals.requests) == 1  # both rules, one question
    with with_id("esc-1"):
        assert charge(account="a", cents=5) == {"charged": 5}  # the replay asks again, once
    assert len(approvals.requests) == 2
    with with_id("esc-2"):
        refused = charge(account="b", cents=1)
    # one denial, relayed as agent_airlock answers its escalation
    assert blocked(refused, "escalation_denied")["metadata"]["escalation_rule"] == "charge"
    assert len(approvals.requests) == 3 and approvals.verdicts == []
    assert runs == [{"account": "a", "cents": 5}]
    assert env.store.get("esc-2") is None
    assert len({r.request_id for r in approvals.requests}) == 3
    for request in approvals.requests:
        assert request.tool_name == "charge"
        assert "irreversible" in request.args["why"]
        assert request.args["escalation_reason"] == "money moves"
    assert approvals.requests[0].args["idempotency_key"] == idempotency_key(
        "charge", {"account": "a", "cents": 5}
    )


# -- 5. the idempotency key depends on the tool and its arguments, not on the tool_call_id ----------
def test_the_idempotency_key_is_the_same_under_two_ids_and_differs_with_the_arguments(
    key_store: EffectStore,
) -> None:
    guard = EffectGuard(store=key_store)
    seen: list[tuple[str, str | None]] = []

    def charge(account: str, cents: int) -> int:
        with_key = current_idempotency_key()
        seen.append((account, with_key))
        return cents

    tool = guard.wrap(charge)
    for tool_call_id, account in (("key-1", "a"), ("key-2", "a"), ("key-3", "b")):
        with tool_call_context(tool_call_id):
            assert tool(account, cents=5) == 5
    (_, first), (_, second), (_, other) = seen
    assert first is not None and first == second
    assert first == idempotency_key("charge", {"account": "a", "cents": 5})
    assert other is not None and other != first
    records = [key_store.get(i) for i in ("key-1", "key-2", "key-3")]
    assert [r.idempotency_key if r is not None else None for r in records] == [first, first, other]


def test_the_idempotency_key_on_the_airlock_context_does_not_depend_on_the_id(env: Env) -> None:
    keys: list[Any] = []
    policy = SecurityPolicy(effect_guard=env.guard())

    @Airlock(policy=policy, config=env.config)
    def charge(account: str, cents: int) -> int:
        keys.append(get_current_context().idempotency_key)  # type: ignore[union-attr]
        return cents

    for tool_call_id, cents in (("ctx-1", 5), ("ctx-2", 5), ("ctx-3", 6)):
        with with_id(tool_call_id):
            assert charge(account="a", cents=cents) == cents
    assert keys[0] is not None and keys[0] == keys[1]
    assert keys[0] == idempotency_key("charge", {"account": "a", "cents": 5})
    assert keys[2] is not None and keys[2] != keys[0]
