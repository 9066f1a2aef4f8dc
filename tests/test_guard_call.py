"""guard.call / guard.acall: the id passed by hand (no context variable), in threads and executors;
and a guarded call made inside the body of the same tool_call_id is part of it (one record, one run)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from airlock_redis import (
    EffectGuard,
    EffectPolicyViolation,
    EffectStatusUnknown,
    EffectStore,
    Status,
    reversibility,
)

from .conftest import make_store


@pytest.fixture(params=("memory", "redis"))
def guard(request: pytest.FixtureRequest, namespace: str) -> EffectGuard:
    store: EffectStore = make_store(request.param, request, namespace)
    return EffectGuard(store)


def test_call_runs_once_per_id_and_replays(guard: EffectGuard) -> None:
    runs: list[int] = []

    def charge(account: str, cents: int) -> str:
        runs.append(cents)
        return f"charged {account} {cents}"

    first = guard.call("call_1", charge, "acct", cents=5)
    again = guard.call("call_1", charge, "acct", cents=5)
    other = guard.call("call_2", charge, "acct", cents=5)
    assert (first, again, other) == ("charged acct 5",) * 3
    assert runs == [5, 5]
    record = guard.store.get("call_1")
    assert record is not None and record.status is Status.COMMITTED


def test_call_in_worker_threads_needs_no_context(guard: EffectGuard) -> None:
    """Context variables are not copied into a ThreadPoolExecutor: the id travels as an argument."""
    runs: list[str] = []

    def send(to: str) -> str:
        runs.append(to)
        return f"sent to {to}"

    with ThreadPoolExecutor(4) as pool:  # each id once at a time: a concurrent duplicate is in flight
        first = list(pool.map(lambda i: guard.call(f"call_{i}", send, "bob"), range(4)))
        again = list(pool.map(lambda i: guard.call(f"call_{i}", send, "bob"), range(4)))
    assert first == again == ["sent to bob"] * 4
    assert len(runs) == 4


def test_acall_runs_once_and_works_from_run_in_executor(guard: EffectGuard) -> None:
    runs: list[str] = []

    async def send(to: str) -> str:
        runs.append(to)
        await asyncio.sleep(0)
        return f"sent to {to}"

    def blocking(to: str) -> str:
        runs.append("blocking " + to)
        return "done " + to

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        a = await guard.acall("call_a", send, "ann")
        b = await guard.acall("call_a", send, "ann")
        c = await loop.run_in_executor(None, lambda: guard.call("call_b", blocking, "bo"))
        d = await asyncio.to_thread(guard.call, "call_b", blocking, "bo")
        return [a, b, c, d]

    assert asyncio.run(main()) == ["sent to ann", "sent to ann", "done bo", "done bo"]
    assert runs == ["ann", "blocking bo"]


def test_call_refuses_the_wrong_kind_of_callable(guard: EffectGuard) -> None:
    async def coro() -> None: ...

    def plain() -> None: ...

    with pytest.raises(TypeError, match="acall"):
        guard.call("call_1", coro)  # type: ignore[unused-coroutine]
    with pytest.raises(TypeError, match=r"guard\.call"):
        asyncio.run(guard.acall("call_1", plain))  # type: ignore[arg-type]
    assert guard.store.get("call_1") is None


def test_a_retry_in_doubt_is_refused_through_call(guard: EffectGuard) -> None:
    def transfer() -> str:
        raise TimeoutError("the bank did not answer")

    with pytest.raises(TimeoutError):
        guard.call("call_t", transfer)
    with pytest.raises(EffectStatusUnknown):
        guard.call("call_t", transfer)

    @reversibility("reversible")
    def lookup() -> str:
        raise TimeoutError("slow")

    with pytest.raises(TimeoutError):
        guard.call("call_l", lookup)
    with pytest.raises(TimeoutError):  # reversible: it runs again
        guard.call("call_l", lookup)


def test_an_already_guarded_tool_called_through_call_gives_one_record_and_one_run(guard: EffectGuard) -> None:
    runs: list[str] = []

    @guard.wrap
    def charge(account: str) -> str:
        runs.append(account)
        return "ok " + account

    assert guard.call("call_g", charge, "acct") == "ok acct"
    assert guard.call("call_g", charge, "acct") == "ok acct"
    assert runs == ["acct"]
    record = guard.store.get("call_g")
    assert record is not None and record.tool == "charge"


def test_a_guarded_tool_inside_the_body_of_the_same_id_is_covered_by_the_outer_record(
    guard: EffectGuard,
) -> None:
    """A framework hook guards the call (tool name, arguments) and the tool is also guard-wrapped:
    the inner call runs inside the outer body, without a record of its own, and a retry replays
    the outer record without running either."""
    runs: list[str] = []

    @guard.wrap
    def charge(account: str, cents: int) -> str:
        runs.append(account)
        return f"charged {cents}"

    def framework_handler(request: dict[str, object]) -> str:
        return charge(str(request["account"]), int(str(request["cents"])))

    request: dict[str, object] = {"account": "acct", "cents": 7}
    assert guard.call("call_n", framework_handler, request) == "charged 7"
    assert guard.call("call_n", framework_handler, request) == "charged 7"
    assert runs == ["acct"]
    record = guard.store.get("call_n")
    assert record is not None and record.tool == "framework_handler"
    assert record.status is Status.COMMITTED

    async def ahandler(n: int) -> str:
        async def inner(n: int) -> str:
            runs.append(f"async {n}")
            return f"async {n}"

        return await guard.wrap(inner)(n)

    async def main() -> list[str]:
        return [await guard.acall("call_an", ahandler, 1), await guard.acall("call_an", ahandler, 1)]

    assert asyncio.run(main()) == ["async 1", "async 1"]
    assert runs == ["acct", "async 1"]


def test_every_refusal_has_a_model_message_and_a_repr_that_says_why() -> None:
    from airlock_redis.core import errors

    classes = [
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.EffectRefused)
    ]
    reasons = {c.reason for c in classes if c is not errors.EffectRefused}
    assert reasons == set(errors.REFUSAL_REASONS) == set(errors.MODEL_MESSAGES)
    for cls in classes:
        if cls is errors.EffectRefused:
            continue
        refused = cls("the operator text", tool="charge", tool_call_id="call_9", idempotency_key="k" * 64)
        assert f"reason={cls.reason!r}" in repr(refused) and "the operator text" in repr(refused)
        assert refused.model_message.startswith("Tool 'charge' was not run.")
        assert "k" * 64 not in refused.model_message and "airlock-redis" not in refused.model_message


def test_the_model_message_of_a_call_in_doubt_says_not_to_issue_it_again(guard: EffectGuard) -> None:
    def transfer() -> str:
        raise TimeoutError("the bank did not answer")

    with pytest.raises(TimeoutError):
        guard.call("call_m", transfer)
    with pytest.raises(EffectStatusUnknown) as refused:
        guard.call("call_m", transfer)
    text = refused.value.model_message
    assert "Do not issue this call again, under this id or a new one" in text
    assert "try again" not in text.lower()


def test_a_tool_that_may_not_run_again_is_refused_inside_a_reversible_call_of_the_same_id(
    guard: EffectGuard,
) -> None:
    """The outer record covers a nested call only if the outer call runs at most once: inside a
    reversible call (which a retry runs again) an irreversible tool would run again with it."""
    runs: list[str] = []

    @guard.wrap
    def charge() -> str:
        runs.append("charge")
        return "charged"

    @reversibility("reversible")
    def refresh_and_charge() -> str:
        return charge()

    with pytest.raises(EffectPolicyViolation, match="inside the body of a reversible call"):
        guard.call("call_r", refresh_and_charge)
    assert runs == []

    @reversibility("reversible")
    @guard.wrap
    def lookup() -> str:
        runs.append("lookup")
        return "found"

    @reversibility("reversible")
    def refresh() -> str:
        return lookup()

    assert guard.call("call_r2", refresh) == "found"  # reversible inside reversible: fine
    assert runs == ["lookup"]
