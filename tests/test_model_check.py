"""Model check: random interleavings of begin / commit / settle / expiry / resolve from several
attempts, on the in-memory store and on a real redis-server, against a small reference model of the
transitions. Every answer and every record must match the model after every step.

Expiry: the in-memory store runs on a fake clock, so its own TTL logic decides what expires; on Redis
the model names the records whose TTL ran out and the test makes them expire (PEXPIRE 1 ms and wait
until gone, or DEL).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from hypothesis.stateful import run_state_machine_as_test as _run_machine

from airlock_redis import EffectStore, InMemoryEffectStore, RedisEffectStore
from airlock_redis.core.errors import StoreError
from airlock_redis.core.records import (
    BeginKind,
    BeginOutcome,
    BeginRequest,
    Settlement,
    Status,
    TransitionResult,
)
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.ttl import TOMBSTONE_TTL

IDS = ("call-a", "call-b")
TOKENS = ("t1", "t2", "t3")
KEYS = ("a" * 64, "b" * 64)
TOOL = "charge"
TTL = {Status.COMMITTED: 10.0, Status.PENDING: 100.0, Status.UNKNOWN: 100.0}
OPERATOR = "operator"

# Typed, whichever hypothesis release is installed (some annotate it, some do not).
run_machine: Callable[..., None] = _run_machine


@dataclass(frozen=True)
class ModelRecord:
    status: Status | None  # None: a tombstone of ``owner`` (a released record; readers see nothing)
    key: str
    owner: str  # a token, or OPERATOR after a resolve
    attempt: int
    value: bytes | None
    stored: bool
    expires_at: float
    released: frozenset[str] = frozenset()  # tokens that gave this key's record back (kept while it lives)


LATE = ("late",)  # begin of an attempt whose record was released: the store raises StoreError


class Model:
    """The transitions as the store contract (stores/base.py and lua/*.lua) describes them."""

    def __init__(self) -> None:
        self.records: dict[str, ModelRecord] = {}
        self.now = 0.0

    def _put(self, tool_call_id: str, record: ModelRecord) -> None:
        ttl = TOMBSTONE_TTL if record.status is None else TTL[record.status]
        old = self.records.get(tool_call_id)
        released = record.released | (old.released if old is not None else frozenset())
        self.records[tool_call_id] = replace(record, expires_at=self.now + ttl, released=released)

    def _bury(self, tool_call_id: str, owner: str) -> None:
        self._put(tool_call_id, ModelRecord(None, "", owner, 0, None, False, 0.0, frozenset({owner})))

    def visible(self, tool_call_id: str) -> ModelRecord | None:
        record = self.records.get(tool_call_id)
        return None if record is None or record.status is None else record

    def begin(self, tool_call_id: str, key: str, token: str, reversible: bool) -> tuple[Any, ...]:
        record = self.records.get(tool_call_id)
        if record is not None and token in record.released:
            return LATE
        if record is None or record.status is None:
            self._put(tool_call_id, ModelRecord(Status.PENDING, key, token, 1, None, False, 0.0))
            return (BeginKind.STARTED, 1)
        if record.key != key:
            return (BeginKind.MISMATCH, record.attempt)
        if record.status is Status.COMMITTED:
            return (BeginKind.COMMITTED, record.attempt, record.value if record.stored else None)
        if record.status is Status.PENDING and record.owner == token:
            self._put(tool_call_id, record)  # a re-send writes again: the TTL restarts
            return (BeginKind.STARTED, record.attempt)
        if reversible:
            attempt = record.attempt + 1
            self._put(tool_call_id, replace(record, status=Status.PENDING, owner=token, attempt=attempt))
            return (BeginKind.STARTED, attempt)
        return (BeginKind(record.status.value), record.attempt)

    def commit(
        self, tool_call_id: str, key: str, token: str, attempt: int, value: bytes | None
    ) -> TransitionResult:
        record = self.records.get(tool_call_id)
        if record is None or record.status is None:
            committed = ModelRecord(Status.COMMITTED, key, token, attempt, value, value is not None, 0.0)
            self._put(tool_call_id, committed)
            return TransitionResult.RECREATED
        if record.owner != token:
            return TransitionResult.SUPERSEDED
        if record.status is not Status.COMMITTED:
            self._put(
                tool_call_id, replace(record, status=Status.COMMITTED, value=value, stored=value is not None)
            )
        return TransitionResult.OK

    def settle(
        self, tool_call_id: str, key: str, token: str, attempt: int, settlement: Settlement
    ) -> TransitionResult:
        record = self.records.get(tool_call_id)
        if record is not None and record.status is None and token in record.released:
            return TransitionResult.OK  # released by this attempt already: a re-send
        if record is None or record.status is None:
            if settlement is Settlement.RELEASE:
                self._bury(tool_call_id, token)
                return TransitionResult.MISSING
            self._put(tool_call_id, ModelRecord(Status.UNKNOWN, key, token, attempt, None, False, 0.0))
            return TransitionResult.RECREATED
        if record.owner != token:
            return TransitionResult.SUPERSEDED
        if record.status is Status.PENDING:
            if settlement is Settlement.RELEASE:
                self._bury(tool_call_id, token)
            else:
                self._put(tool_call_id, replace(record, status=Status.UNKNOWN))
        return TransitionResult.OK

    def resolve(  # noqa: PLR0917
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        expect_key: str | None,
        expect_status: Status | None,
        expect_owner: str | None,
        value: bytes | None,
    ) -> TransitionResult:
        record = self.visible(tool_call_id)
        if record is None:
            return TransitionResult.MISSING
        if expect_key is not None and record.key != expect_key:
            return TransitionResult.MISMATCH
        if (expect_status is not None and record.status is not expect_status) or (
            expect_owner is not None and record.owner != expect_owner
        ):
            return TransitionResult.CHANGED
        if verdict is Settlement.RELEASE:
            self._bury(tool_call_id, OPERATOR)
        elif verdict is Status.COMMITTED:
            self._put(
                tool_call_id,
                replace(
                    record, status=Status.COMMITTED, owner=OPERATOR, value=value, stored=value is not None
                ),
            )
        else:
            self._put(tool_call_id, replace(record, status=Status.UNKNOWN, owner=OPERATOR))
        return TransitionResult.OK

    def advance(self, seconds: float) -> list[str]:
        """Time passes; returns the ids whose records (or tombstones) expired."""
        self.now += seconds
        gone = [i for i, r in self.records.items() if r.expires_at <= self.now]
        for tool_call_id in gone:
            del self.records[tool_call_id]
        return gone


def _outcome_tuple(outcome: BeginOutcome) -> tuple[Any, ...]:
    if outcome.kind is BeginKind.COMMITTED:
        return (outcome.kind, outcome.attempt, outcome.value)
    return (outcome.kind, outcome.attempt)


ids = st.sampled_from(IDS)
tokens = st.sampled_from(TOKENS)
values = st.none() | st.binary(min_size=1, max_size=8)
attempts = st.sampled_from([1, 2])


class StoreMachine(RuleBasedStateMachine):
    """Drives one store and the model side by side."""

    make_store: Callable[[], EffectStore]
    expire: Callable[[EffectStore, list[str], float], None]

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.store = type(self).make_store()

    @rule(tool_call_id=ids, key=st.sampled_from(KEYS), token=tokens, reversible=st.booleans())
    def begin(self, tool_call_id: str, key: str, token: str, reversible: bool) -> None:
        try:
            got = _outcome_tuple(self.store.begin(BeginRequest(tool_call_id, key, TOOL, token, reversible)))
        except StoreError as exc:
            assert "late" in str(exc)
            got = LATE
        assert got == self.model.begin(tool_call_id, key, token, reversible)

    @rule(tool_call_id=ids, key=st.sampled_from(KEYS), token=tokens, attempt=attempts, value=values)
    def commit(self, tool_call_id: str, key: str, token: str, attempt: int, value: bytes | None) -> None:
        request = BeginRequest(tool_call_id, key, TOOL, token, False)
        got = self.store.commit(request, attempt, value, None)
        assert got == self.model.commit(tool_call_id, key, token, attempt, value)

    @rule(
        tool_call_id=ids,
        key=st.sampled_from(KEYS),
        token=tokens,
        attempt=attempts,
        settlement=st.sampled_from(list(Settlement)),
    )
    def settle(self, tool_call_id: str, key: str, token: str, attempt: int, settlement: Settlement) -> None:
        request = BeginRequest(tool_call_id, key, TOOL, token, False)
        got = self.store.settle(request, attempt, settlement)
        assert got == self.model.settle(tool_call_id, key, token, attempt, settlement)

    @rule(
        tool_call_id=ids,
        verdict=st.sampled_from([Status.COMMITTED, Status.UNKNOWN, Settlement.RELEASE]),
        expect_key=st.none() | st.sampled_from(KEYS),
        expect_status=st.none() | st.sampled_from(list(Status)),
        expect_owner=st.none() | tokens,
        value=values,
    )
    def resolve(  # noqa: PLR0917
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        expect_key: str | None,
        expect_status: Status | None,
        expect_owner: str | None,
        value: bytes | None,
    ) -> None:
        value = value if verdict is Status.COMMITTED else None
        got = self.store.resolve(
            tool_call_id,
            verdict,
            expect_key=expect_key,
            expect_status=expect_status,
            expect_owner=expect_owner,
            value=value,
        )
        want = self.model.resolve(tool_call_id, verdict, expect_key, expect_status, expect_owner, value)
        assert got == want

    @rule(seconds=st.sampled_from([5.0, 15.0, 150.0]))
    def time_passes(self, seconds: float) -> None:
        gone = self.model.advance(seconds)
        type(self).expire(self.store, gone, seconds)

    @invariant()
    def records_match(self) -> None:
        for tool_call_id in IDS:
            record = self.store.get(tool_call_id)
            expected = self.model.visible(tool_call_id)
            if expected is None:
                assert record is None, f"{tool_call_id}: store has {record}, model has nothing"
                continue
            assert record is not None, f"{tool_call_id}: store has nothing, model has {expected}"
            owner = OPERATOR if record.owner.startswith("operator:") else record.owner
            got = (record.status, record.idempotency_key, owner, record.attempt, record.stored, record.value)
            want = (
                expected.status,
                expected.key,
                expected.owner,
                expected.attempt,
                expected.stored,
                expected.value,
            )
            assert got == want

    def teardown(self) -> None:
        if isinstance(self.store, RedisEffectStore):
            self.store.close()


SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_in_memory_store_matches_the_model() -> None:
    class Clock:
        now = 0.0

    def make() -> EffectStore:
        Clock.now = 0.0
        return InMemoryEffectStore(
            committed_ttl=TTL[Status.COMMITTED],
            pending_ttl=TTL[Status.PENDING],
            unknown_ttl=TTL[Status.UNKNOWN],
            clock=lambda: Clock.now,
        )

    def expire(store: EffectStore, gone: list[str], seconds: float) -> None:
        Clock.now += seconds  # the store's own TTL bookkeeping decides what is gone

    machine = type(
        "MemoryMachine", (StoreMachine,), {"make_store": staticmethod(make), "expire": staticmethod(expire)}
    )
    run_machine(machine, settings=SETTINGS)


@pytest.mark.redis_server
def test_redis_store_matches_the_model(redis_server: EmbeddedRedis) -> None:
    def make() -> EffectStore:
        return RedisEffectStore(redis_server.url, namespace=f"model:{secrets.token_hex(6)}")

    def expire(store: EffectStore, gone: list[str], seconds: float) -> None:
        assert isinstance(store, RedisEffectStore)
        client = store.client
        for i, tool_call_id in enumerate(gone):
            key = store.key(tool_call_id)
            if i % 2:
                client.delete(key)
                continue
            client.pexpire(key, 1)  # the TTL runs out
            deadline = time.monotonic() + 5.0
            while client.exists(key):
                assert time.monotonic() < deadline, "Redis did not expire a key within 5 s"
                time.sleep(0.002)

    machine = type(
        "RedisMachine",
        (StoreMachine,),
        {"make_store": staticmethod(make), "expire": staticmethod(expire)},
    )
    redis_settings = settings(SETTINGS, max_examples=25)
    run_machine(machine, settings=redis_settings)


def test_the_model_would_catch_a_store_that_diverges() -> None:
    """The machine is not vacuous: a store that lets a superseded attempt commit is caught."""

    class LaxStore(InMemoryEffectStore):
        def commit(
            self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
        ) -> TransitionResult:
            record = self.get(request.tool_call_id)
            if record is not None and record.owner != request.token:
                request = request._replace(token=record.owner)  # ignores the fence
            return super().commit(request, attempt, value, mac)

    def make() -> EffectStore:
        return LaxStore(committed_ttl=1e8, pending_ttl=1e8, unknown_ttl=1e8)

    def expire(store: EffectStore, gone: list[str], seconds: float) -> None:
        raise AssertionError("no expiry in this run")

    class LaxMachine(StoreMachine):
        @rule(seconds=st.just(0.0))
        def time_passes(self, seconds: float) -> None:
            pass

    machine = type(
        "LaxMachine2", (LaxMachine,), {"make_store": staticmethod(make), "expire": staticmethod(expire)}
    )
    with pytest.raises(AssertionError):
        lax_settings = settings(SETTINGS, max_examples=200, database=None)
        run_machine(machine, settings=lax_settings)
