"""The attempt object decides every step of a guarded call without I/O (tests here run no store); the
drivers only send what it asks. And every coroutine method of the guard, the stores and the replica
wait has a blocking twin with the same parameters."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from airlock_redis import EffectGuard, InMemoryEffectStore, RedisEffectStore, Reversibility
from airlock_redis.attempts import Attempt, AttemptRules, Commit, Reporter
from airlock_redis.context import running_key
from airlock_redis.core.ambiguity import AmbiguityRule
from airlock_redis.core.codec import encode_result
from airlock_redis.core.errors import (
    EffectOutcomeUnknown,
    EffectPolicyViolation,
    EffectStatusUnknown,
    RecordCorrupt,
    ResultNotStored,
    StoreError,
    StoreUnavailable,
    ToolCallIdRequired,
)
from airlock_redis.core.gates import GuardedCall, GuardOptions
from airlock_redis.core.outcome import DEFAULT_AMBIGUOUS_ERRORS, give_back, stream_items
from airlock_redis.core.records import BeginKind, BeginOutcome, Settlement
from airlock_redis.core.signing import Signer
from airlock_redis.stores.durability import ReplicaWait


def _rules(**options: Any) -> AttemptRules:
    signer = options.pop("signer", None)
    return AttemptRules(
        GuardOptions(**options),
        AmbiguityRule.of(DEFAULT_AMBIGUOUS_ERRORS),
        1 << 20,
        signer,
        Reporter(None, None),
    )


def _call(
    tool_call_id: Any = "call_1", reversibility: Reversibility = Reversibility.IRREVERSIBLE
) -> GuardedCall:
    return GuardedCall("charge", tool_call_id, {"account": "a", "cents": 5}, reversibility, frozenset())


def _started(rules: AttemptRules | None = None, **call: Any) -> Attempt:
    attempt = Attempt(rules or _rules(), _call(**call), lambda: Any)
    assert attempt.begin_request() is not None
    assert attempt.on_begun(BeginOutcome(BeginKind.STARTED, 1)) is None
    return attempt


def test_the_gates_run_when_the_attempt_is_made() -> None:
    with pytest.raises(ToolCallIdRequired):
        Attempt(_rules(), _call(None), lambda: Any)
    unguarded = Attempt(_rules(require_tool_call_id=False), _call(None), lambda: Any)
    assert unguarded.begin_request() is None
    assert unguarded.without_record("v").effect == "unguarded"


def test_a_call_inside_the_body_of_the_same_id_needs_no_record() -> None:
    with running_key("k" * 64, "call_1"):
        nested = Attempt(_rules(), _call("call_1"), lambda: Any)
        assert nested.begin_request() is None
        done = nested.without_record("v")
        assert (done.effect, done.idempotency_key) == ("nested", "k" * 64)
        other = Attempt(_rules(), _call("call_2"), lambda: Any)
        assert other.begin_request() is not None


def test_each_begin_request_has_a_fresh_owner_token() -> None:
    first, second = Attempt(_rules(), _call(), lambda: Any), Attempt(_rules(), _call(), lambda: Any)
    a, b = first.begin_request(), second.begin_request()
    assert a is not None and b is not None
    assert a.token != b.token and len(a.token) == 32
    assert (a.tool_call_id, a.idempotency_key, a.reversible) == (b.tool_call_id, b.idempotency_key, False)


@pytest.mark.parametrize(
    ("outcome", "refusal"),
    [
        (BeginOutcome(BeginKind.PENDING, 1), EffectStatusUnknown),
        (BeginOutcome(BeginKind.UNKNOWN, 2), EffectStatusUnknown),
        (BeginOutcome(BeginKind.MISMATCH, 1, tool="other", idempotency_key="x"), EffectPolicyViolation),
        (BeginOutcome(BeginKind.COMMITTED, 1, None), ResultNotStored),
        (BeginOutcome(BeginKind.COMMITTED, 1, b"\xc1not msgpack"), RecordCorrupt),
    ],
)
def test_what_begin_found_decides_the_refusal(outcome: BeginOutcome, refusal: type[Exception]) -> None:
    attempt = Attempt(_rules(), _call(), lambda: Any)
    attempt.begin_request()
    with pytest.raises(refusal):
        attempt.on_begun(outcome)


def test_started_runs_and_committed_replays() -> None:
    attempt = _started()
    assert attempt.attempt == 1
    replaying = Attempt(_rules(), _call(), lambda: Any)
    replaying.begin_request()
    replay = replaying.on_begun(BeginOutcome(BeginKind.COMMITTED, 3, encode_result({"ok": 1}, 100)))
    assert replay is not None and (replay.value, replay.effect, replay.attempt) == ({"ok": 1}, "replayed", 3)


def test_a_replay_whose_signature_does_not_verify_is_refused() -> None:
    signer = Signer(b"k" * 32)
    rules = _rules(signer=signer)
    attempt = Attempt(rules, _call(), lambda: Any)
    request = attempt.begin_request()
    assert request is not None
    data = encode_result("v", 100)
    good = signer.sign(request.tool_call_id, request.idempotency_key, data)
    with pytest.raises(RecordCorrupt):
        attempt.on_begun(BeginOutcome(BeginKind.COMMITTED, 1, data, b"\x00" * len(good)))
    replay = attempt.on_begun(BeginOutcome(BeginKind.COMMITTED, 1, data, good))
    assert replay is not None and replay.value == "v"


def test_a_failed_begin_gives_back_only_what_may_have_landed() -> None:
    attempt = Attempt(_rules(), _call(), lambda: Any)
    attempt.begin_request()
    release, refusal = attempt.on_begin_failed(StoreError("lost reply", maybe_applied=True))
    assert release and isinstance(refusal, StoreUnavailable)
    release, refusal = attempt.on_begin_failed(StoreError("refused", maybe_applied=False))
    assert not release and isinstance(refusal, StoreUnavailable)


def test_what_the_attempt_writes_after_the_tool() -> None:
    attempt = _started()
    step = attempt.on_returned({"charged": 5})
    assert isinstance(step, Commit) and step.data == encode_result({"charged": 5}, 100) and step.mac is None
    assert attempt.on_returned(iter([1])) is Settlement.UNKNOWN  # deferred: takes effect later
    unstorable = attempt.on_returned(object())
    assert unstorable == Commit(None, None)
    assert attempt.on_raised(ValueError("bad input")) is Settlement.RELEASE
    assert attempt.on_raised(EffectOutcomeUnknown()) is Settlement.UNKNOWN
    assert attempt.on_raised(TimeoutError()) is Settlement.UNKNOWN
    assert attempt.executed("v").effect == "executed"


def test_giving_back_releases_a_first_attempt_and_keeps_the_doubt_of_a_take_over() -> None:
    assert give_back(1) is Settlement.RELEASE
    assert give_back(2) is Settlement.UNKNOWN
    assert _started().give_back() is Settlement.RELEASE


def test_a_replayed_stream_yields_the_stored_items() -> None:
    assert stream_items([1, 2]) == [1, 2]
    assert stream_items("one") == ["one"]


# -- parity: every coroutine method has a blocking twin with the same parameters -----------------
def _public_coroutines(cls: type) -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(cls)
        if inspect.iscoroutinefunction(member) and name.startswith("a") and not name.startswith("__")
    ]


@pytest.mark.parametrize("cls", [EffectGuard, RedisEffectStore, InMemoryEffectStore, ReplicaWait])
def test_every_coroutine_method_has_a_blocking_twin_with_the_same_parameters(cls: type) -> None:
    names = _public_coroutines(cls)
    assert names, f"{cls.__name__} has no coroutine methods"
    for name in names:
        twin = getattr(cls, name[1:], None)
        assert twin is not None, f"{cls.__name__}.{name} has no blocking twin {name[1:]}"
        ours = inspect.signature(getattr(cls, name)).parameters
        theirs = inspect.signature(twin).parameters
        assert list(ours) == list(theirs), f"{cls.__name__}.{name} and {name[1:]} take different parameters"
        for param in ours:
            assert ours[param].kind == theirs[param].kind
            assert ours[param].default == theirs[param].default


def test_guard_call_and_acall_use_the_attempt() -> None:
    """The drivers only do I/O: a call made through them goes through the same decisions."""
    guard = EffectGuard(InMemoryEffectStore())
    assert guard.call("call_p", lambda: 1) == 1
    assert guard.call("call_p", lambda: 2) == 1  # replayed (same tool name "<lambda>", no arguments)
