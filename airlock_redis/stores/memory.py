"""An effect store inside one process: the default, and the reference for the Redis store."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..core.records import (
    BeginKind,
    BeginOutcome,
    BeginRequest,
    Record,
    Settlement,
    Status,
    TransitionResult,
)
from .base import check_verdict
from .ttl import DEFAULT_COMMITTED_TTL, DEFAULT_PENDING_TTL, DEFAULT_UNKNOWN_TTL, StatusTTLs


@dataclass(slots=True)
class _Entry:
    record: Record
    expires_at: float  # on the store's clock, seconds


class InMemoryEffectStore:
    """Holds one process's records. Two processes never see each other's calls: use a shared
    store such as :class:`~airlock_redis.RedisEffectStore` to cover replicas."""

    def __init__(
        self,
        *,
        committed_ttl: float = DEFAULT_COMMITTED_TTL,
        pending_ttl: float = DEFAULT_PENDING_TTL,
        unknown_ttl: float = DEFAULT_UNKNOWN_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttls = StatusTTLs(committed=committed_ttl, pending=pending_ttl, unknown=unknown_ttl)
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"InMemoryEffectStore(records={len(self._entries)})"

    # -- helpers (call with the lock held) -------------------------------------------------------
    def _live(self, tool_call_id: str) -> _Entry | None:
        entry = self._entries.get(tool_call_id)
        if entry is not None and entry.expires_at <= self._clock():
            del self._entries[tool_call_id]
            return None
        return entry

    def _put(self, record: Record) -> None:
        self._entries[record.tool_call_id] = _Entry(record, self._clock() + self.ttls.seconds(record.status))

    @staticmethod
    def _now_ms() -> int:
        return time.time_ns() // 1_000_000

    # -- the transitions -------------------------------------------------------------------------
    def begin(self, request: BeginRequest) -> BeginOutcome:
        with self._lock:
            entry = self._live(request.tool_call_id)
            if entry is None:
                self._put(
                    Record(
                        tool_call_id=request.tool_call_id,
                        status=Status.PENDING,
                        idempotency_key=request.idempotency_key,
                        tool=request.tool,
                        owner=request.token,
                        attempt=1,
                        value=None,
                        stored=False,
                        mac=None,
                        begun_ms=self._now_ms(),
                        committed_ms=None,
                        ttl_ms=None,
                    )
                )
                return BeginOutcome(BeginKind.STARTED, attempt=1)
            record = entry.record
            if record.idempotency_key != request.idempotency_key or record.tool != request.tool:
                return BeginOutcome(
                    BeginKind.MISMATCH,
                    record.attempt,
                    tool=record.tool,
                    idempotency_key=record.idempotency_key,
                )
            if record.status is Status.COMMITTED:
                value = record.value if record.stored else None
                return BeginOutcome(BeginKind.COMMITTED, record.attempt, value=value, mac=record.mac)
            if record.owner == request.token and record.status is Status.PENDING:
                return BeginOutcome(BeginKind.STARTED, record.attempt)
            if request.reversible:
                attempt = record.attempt + 1
                self._put(
                    replace(
                        record,
                        status=Status.PENDING,
                        owner=request.token,
                        attempt=attempt,
                        begun_ms=self._now_ms(),
                    )
                )
                return BeginOutcome(BeginKind.STARTED, attempt)
            return BeginOutcome(BeginKind(record.status.value), record.attempt)

    def commit(
        self, tool_call_id: str, token: str, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        with self._lock:
            entry = self._live(tool_call_id)
            if entry is None:
                return TransitionResult.MISSING
            record = entry.record
            if record.owner != token:
                return TransitionResult.SUPERSEDED
            if record.status is not Status.COMMITTED:
                self._put(
                    replace(
                        record,
                        status=Status.COMMITTED,
                        value=value,
                        stored=value is not None,
                        mac=mac,
                        committed_ms=self._now_ms(),
                    )
                )
            return TransitionResult.OK

    def settle(self, tool_call_id: str, token: str, settlement: Settlement) -> TransitionResult:
        with self._lock:
            entry = self._live(tool_call_id)
            if entry is None:
                return TransitionResult.MISSING
            record = entry.record
            if record.owner != token:
                return TransitionResult.SUPERSEDED
            if record.status is Status.PENDING:
                if settlement is Settlement.RELEASE:
                    del self._entries[tool_call_id]
                else:
                    self._put(replace(record, status=Status.UNKNOWN))
            return TransitionResult.OK

    def get(self, tool_call_id: str) -> Record | None:
        with self._lock:
            entry = self._live(tool_call_id)
            if entry is None:
                return None
            remaining = max(0, round((entry.expires_at - self._clock()) * 1000))
            return replace(entry.record, ttl_ms=remaining)

    def resolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        expect_key: str | None = None,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        verdict = check_verdict(verdict)
        with self._lock:
            entry = self._live(tool_call_id)
            if entry is None:
                return TransitionResult.MISSING
            record = entry.record
            if expect_key is not None and record.idempotency_key != expect_key:
                return TransitionResult.MISMATCH
            if verdict is Settlement.RELEASE:
                del self._entries[tool_call_id]
                return TransitionResult.OK
            owner = "operator:" + secrets.token_hex(8)
            if verdict is Status.COMMITTED:
                record = replace(
                    record,
                    status=Status.COMMITTED,
                    owner=owner,
                    value=value,
                    stored=value is not None,
                    mac=mac,
                    committed_ms=self._now_ms(),
                )
            else:
                record = replace(record, status=Status.UNKNOWN, owner=owner)
            self._put(record)
            return TransitionResult.OK

    # -- the same, for coroutines (nothing here blocks) ------------------------------------------
    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        return self.begin(request)

    async def acommit(
        self, tool_call_id: str, token: str, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        return self.commit(tool_call_id, token, value, mac)

    async def asettle(self, tool_call_id: str, token: str, settlement: Settlement) -> TransitionResult:
        return self.settle(tool_call_id, token, settlement)

    async def aget(self, tool_call_id: str) -> Record | None:
        return self.get(tool_call_id)

    async def aresolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        expect_key: str | None = None,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        return self.resolve(tool_call_id, verdict, expect_key=expect_key, value=value, mac=mac)
