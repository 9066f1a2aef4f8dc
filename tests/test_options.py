"""Every option of the spec's options table, each with a test that fails if the option is ignored.

| option                            | default               | proven by                                   |
|-----------------------------------|-----------------------|---------------------------------------------|
| store                             | InMemoryEffectStore() | two default guards do not share records     |
| require_tool_call_id              | True                  | refusal without an id; False runs unguarded |
| require_approval_for_irreversible | False                 | approver asked every call, denial refuses   |
| target_args                       | ()                    | an irreversible call must name a target     |
| ambiguous_errors                  | the spec's five       | tests/test_outcomes.py (a custom list)      |
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from airlock_redis import (
    ApprovalRequest,
    EffectGuard,
    EffectRefused,
    EffectStore,
    GuardedCall,
    InMemoryEffectStore,
    Reversibility,
    Status,
    idempotency_key,
    reversibility,
    tool_call_context,
)
from airlock_redis.core.reversibility import ReversibilityName
from tests.tools import Counted, call_with_id, make_tool

KINDS = ("sync", "async")


def refusal(tool: Callable[..., Any], tool_call_id: Any, *args: Any, **kwargs: Any) -> EffectRefused:
    with pytest.raises(EffectRefused) as refused, tool_call_context(tool_call_id):
        tool(*args, **kwargs)
    return refused.value


# -- store ---------------------------------------------------------------------------------------


def test_the_default_store_is_a_new_in_memory_store_per_guard() -> None:
    first, second = EffectGuard(), EffectGuard()
    assert isinstance(first.store, InMemoryEffectStore)
    assert isinstance(second.store, InMemoryEffectStore)
    assert first.store is not second.store


@pytest.mark.parametrize("kind", KINDS)
def test_two_default_guards_do_not_share_records(kind: str) -> None:
    counted = Counted("charge")
    one = make_tool(EffectGuard(), counted, kind)
    two = make_tool(EffectGuard(), counted, kind)
    call_with_id(one, "shared-id", "acct", 5)
    call_with_id(one, "shared-id", "acct", 5)  # replayed by the first guard's own store
    assert len(counted.runs) == 1
    call_with_id(two, "shared-id", "acct", 5)  # the second guard has never seen the id
    assert len(counted.runs) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_given_store_is_the_one_used(store: EffectStore, kind: str) -> None:
    counted = Counted("charge")
    one = make_tool(EffectGuard(store=store), counted, kind)
    two = make_tool(EffectGuard(store=store), counted, kind)
    call_with_id(one, "shared-id", "acct", 5)
    assert call_with_id(two, "shared-id", "acct", 5)["run"] == 1
    assert len(counted.runs) == 1
    record = store.get("shared-id")
    assert record is not None and record.status is Status.COMMITTED


# -- require_tool_call_id ------------------------------------------------------------------------

MISSING_IDS: dict[str, Any] = {"no id": None, "empty string": "", "an int": 123, "bytes": b"call-1"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tag", [None, "irreversible", "costly"])
@pytest.mark.parametrize("missing", list(MISSING_IDS))
def test_a_tool_not_reversible_without_an_id_is_refused(
    store: EffectStore, kind: str, tag: ReversibilityName | None, missing: str
) -> None:
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store), counted, kind, tag)
    refused = refusal(charge, MISSING_IDS[missing], "acct", 5)
    assert refused.reason == "tool_call_id_required"
    assert refused.tool_call_id is None
    assert "tool_call_context" in str(refused)
    assert counted.runs == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("missing", list(MISSING_IDS))
def test_a_reversible_tool_without_an_id_runs_unguarded(store: EffectStore, kind: str, missing: str) -> None:
    counted = Counted("read_balance")
    read = make_tool(EffectGuard(store=store), counted, kind, "reversible")
    call_with_id(read, MISSING_IDS[missing], "acct")
    call_with_id(read, MISSING_IDS[missing], "acct")
    assert len(counted.runs) == 2  # no record, so nothing is replayed


def test_an_unguarded_call_reports_effect_unguarded(store: EffectStore) -> None:
    guard = EffectGuard(store=store, require_tool_call_id=False)
    call = GuardedCall("charge", None, {"account": "a"}, Reversibility.IRREVERSIBLE)
    done = guard.execute(call, lambda: "paid")
    assert (done.effect, done.tool_call_id, done.value) == ("unguarded", None, "paid")
    assert done.idempotency_key == idempotency_key("charge", {"account": "a"})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tag", [None, "costly"])
def test_require_tool_call_id_false_runs_without_an_id_and_without_a_record(
    store: EffectStore, kind: str, tag: ReversibilityName | None
) -> None:
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store, require_tool_call_id=False), counted, kind, tag)
    for missing in MISSING_IDS.values():
        call_with_id(charge, missing, "acct", 5)
    assert len(counted.runs) == len(MISSING_IDS)
    # the option only waives the id; a call that has one is still recorded and replayed
    call_with_id(charge, "with-id", "acct", 5)
    call_with_id(charge, "with-id", "acct", 5)
    assert len(counted.runs) == len(MISSING_IDS) + 1
    record = store.get("with-id")
    assert record is not None and record.status is Status.COMMITTED


# -- require_approval_for_irreversible -----------------------------------------------------------


class Approvals:
    """A sync or async approver that answers from a script and keeps every request it saw."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.requests: list[ApprovalRequest] = []

    def answer(self, request: ApprovalRequest) -> bool:
        self.requests.append(request)
        return self.answers.pop(0) if self.answers else True

    def sync(self) -> Callable[[ApprovalRequest], bool]:
        return self.answer

    def asynchronous(self) -> Callable[[ApprovalRequest], Awaitable[bool]]:
        async def approver(request: ApprovalRequest) -> bool:
            await asyncio.sleep(0)
            return self.answer(request)

        return approver


def approver_of(approvals: Approvals, flavour: str) -> Any:
    return approvals.sync() if flavour == "sync" else approvals.asynchronous()


APPROVER_FLAVOURS = ("sync", "async")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", APPROVER_FLAVOURS)
def test_the_approver_is_asked_every_call_replays_included_with_a_fresh_request(
    store: EffectStore, kind: str, flavour: str
) -> None:
    approvals = Approvals()
    guard = EffectGuard(
        store=store, require_approval_for_irreversible=True, approver=approver_of(approvals, flavour)
    )
    counted = Counted("charge")
    charge = make_tool(guard, counted, kind)
    first = call_with_id(charge, "appr-1", "acct", 5)
    assert call_with_id(charge, "appr-1", "acct", 5) == first
    assert call_with_id(charge, "appr-1", account="acct", cents=5) == first
    assert len(counted.runs) == 1
    assert len(approvals.requests) == 3
    assert len({id(r) for r in approvals.requests}) == 3  # never the first attempt's request again
    key = idempotency_key("charge", {"account": "acct", "cents": 5})
    for request in approvals.requests:
        assert request.tool == "charge"
        assert request.tool_call_id == "appr-1"
        assert request.idempotency_key == key
        assert request.reversibility is Reversibility.IRREVERSIBLE
        assert "irreversible" in request.why
        assert dict(request.arguments) == {"account": "acct", "cents": 5}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", APPROVER_FLAVOURS)
def test_a_denial_refuses_and_records_nothing(store: EffectStore, kind: str, flavour: str) -> None:
    approvals = Approvals(False)
    guard = EffectGuard(
        store=store, require_approval_for_irreversible=True, approver=approver_of(approvals, flavour)
    )
    counted = Counted("charge")
    charge = make_tool(guard, counted, kind)
    refused = refusal(charge, "appr-deny", "acct", 5)
    assert refused.reason == "approval_denied"
    assert counted.runs == []
    assert store.get("appr-deny") is None
    # the denial left nothing behind: an approved retry under the same id runs
    assert call_with_id(charge, "appr-deny", "acct", 5)["run"] == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", APPROVER_FLAVOURS)
def test_the_first_approval_is_never_reused_for_a_replay(store: EffectStore, kind: str, flavour: str) -> None:
    approvals = Approvals(True, False)
    guard = EffectGuard(
        store=store, require_approval_for_irreversible=True, approver=approver_of(approvals, flavour)
    )
    counted = Counted("charge")
    charge = make_tool(guard, counted, kind)
    call_with_id(charge, "appr-2", "acct", 5)
    refused = refusal(charge, "appr-2", "acct", 5)
    assert refused.reason == "approval_denied"
    assert len(counted.runs) == 1
    record = store.get("appr-2")
    assert record is not None and record.status is Status.COMMITTED


@pytest.mark.parametrize("kind", KINDS)
def test_with_no_approver_an_irreversible_call_is_refused(store: EffectStore, kind: str) -> None:
    counted = Counted("charge")
    charge = make_tool(EffectGuard(store=store, require_approval_for_irreversible=True), counted, kind)
    refused = refusal(charge, "appr-none", "acct", 5)
    assert refused.reason == "approval_denied"
    assert "no approver" in str(refused)
    assert counted.runs == []
    assert store.get("appr-none") is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", APPROVER_FLAVOURS)
def test_an_approver_that_fails_denies(store: EffectStore, kind: str, flavour: str) -> None:
    def broken(request: ApprovalRequest) -> bool:
        raise RuntimeError("approval service down")

    async def abroken(request: ApprovalRequest) -> bool:
        raise RuntimeError("approval service down")

    approver: Any = broken if flavour == "sync" else abroken
    guard = EffectGuard(store=store, require_approval_for_irreversible=True, approver=approver)
    counted = Counted("charge")
    charge = make_tool(guard, counted, kind)
    refused = refusal(charge, "appr-err", "acct", 5)
    assert refused.reason == "approval_denied"
    assert "approval service down" in str(refused)
    assert counted.runs == []
    assert store.get("appr-err") is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tag", ["costly", "reversible"])
def test_costly_and_reversible_tools_are_not_sent_for_approval(
    store: EffectStore, kind: str, tag: ReversibilityName
) -> None:
    approvals = Approvals(False, False)
    guard = EffectGuard(store=store, require_approval_for_irreversible=True, approver=approvals.sync())
    counted = Counted("tool")
    tool = make_tool(guard, counted, kind, tag)
    call_with_id(tool, "appr-exempt", "acct", 5)
    assert approvals.requests == []
    assert len(counted.runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_without_the_option_the_approver_is_not_asked(store: EffectStore, kind: str) -> None:
    approvals = Approvals(False)
    guard = EffectGuard(store=store, approver=approvals.sync())
    counted = Counted("charge")
    charge = make_tool(guard, counted, kind)
    call_with_id(charge, "appr-off", "acct", 5)
    assert approvals.requests == []
    assert len(counted.runs) == 1


def test_an_async_approver_serves_a_sync_tool_called_inside_a_running_loop(store: EffectStore) -> None:
    approvals = Approvals(True)
    guard = EffectGuard(
        store=store, require_approval_for_irreversible=True, approver=approvals.asynchronous()
    )
    counted = Counted("charge")
    charge = make_tool(guard, counted, "sync")

    async def host() -> Any:
        return call_with_id(charge, "appr-loop", "acct", 5)

    assert asyncio.run(host())["run"] == 1
    assert len(approvals.requests) == 1


# -- target_args ---------------------------------------------------------------------------------


def deploy_tool(
    guard: EffectGuard, kind: str, runs: list[dict[str, Any]], tag: ReversibilityName | None
) -> Any:
    """A tool ``(service, project=None, region="eu")``; returns a blocking caller."""
    if kind == "sync":

        def deploy(service: str, project: str | None = None, region: str = "eu") -> str:
            runs.append({"service": service, "project": project, "region": region})
            return f"{service}@{project}/{region}"

        fn: Callable[..., Any] = deploy
        return guard.wrap(fn if tag is None else reversibility(tag)(fn))

    async def adeploy(service: str, project: str | None = None, region: str = "eu") -> str:
        runs.append({"service": service, "project": project, "region": region})
        return f"{service}@{project}/{region}"

    afn: Callable[..., Awaitable[str]] = adeploy if tag is None else reversibility(tag)(adeploy)
    wrapped = guard.wrap(afn)
    return lambda *a, **k: asyncio.run(cast(Any, wrapped(*a, **k)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"project": None}, {"project": ""}, {"region": "us"}],
    ids=["missing", "None", "empty", "only-the-default-named-one-passed"],
)
def test_an_irreversible_call_naming_no_target_is_refused(
    store: EffectStore, kind: str, kwargs: dict[str, Any]
) -> None:
    runs: list[dict[str, Any]] = []
    deploy = deploy_tool(EffectGuard(store=store, target_args=("project",)), kind, runs, None)
    refused = refusal(deploy, "tgt-1", "api", **kwargs)
    assert refused.reason == "target_args_required"
    assert "project" in str(refused)
    assert runs == []
    assert store.get("tgt-1") is None


@pytest.mark.parametrize("kind", KINDS)
def test_an_irreversible_call_naming_a_target_runs(store: EffectStore, kind: str) -> None:
    runs: list[dict[str, Any]] = []
    deploy = deploy_tool(EffectGuard(store=store, target_args=("project",)), kind, runs, None)
    assert call_with_id(deploy, "tgt-2", "api", "p1") == "api@p1/eu"  # positionally
    assert call_with_id(deploy, "tgt-3", "api", project="p2") == "api@p2/eu"
    assert len(runs) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_one_of_several_targets_is_enough_and_a_default_does_not_count(store: EffectStore, kind: str) -> None:
    runs: list[dict[str, Any]] = []
    deploy = deploy_tool(EffectGuard(store=store, target_args=("project", "region")), kind, runs, None)
    assert call_with_id(deploy, "tgt-4", "api", region="us") == "api@None/us"
    # "region" has a default value, but the call did not pass it
    assert refusal(deploy, "tgt-5", "api").reason == "target_args_required"
    assert len(runs) == 1


def test_a_single_target_name_given_as_a_string_is_one_name(store: EffectStore) -> None:
    guard = EffectGuard(store=store, target_args="project")
    assert guard.target_args == ("project",)
    runs: list[dict[str, Any]] = []
    deploy = deploy_tool(guard, "sync", runs, None)
    assert refusal(deploy, "tgt-6", "api").reason == "target_args_required"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tag", ["costly", "reversible"])
def test_costly_and_reversible_tools_are_exempt_from_target_args(
    store: EffectStore, kind: str, tag: ReversibilityName
) -> None:
    runs: list[dict[str, Any]] = []
    deploy = deploy_tool(EffectGuard(store=store, target_args=("project",)), kind, runs, tag)
    assert call_with_id(deploy, "tgt-7", "api") == "api@None/eu"
    assert len(runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_without_target_args_no_target_is_required(store: EffectStore, kind: str) -> None:
    runs: list[dict[str, Any]] = []
    deploy = deploy_tool(EffectGuard(store=store), kind, runs, None)
    assert call_with_id(deploy, "tgt-8", "api") == "api@None/eu"
    assert len(runs) == 1
