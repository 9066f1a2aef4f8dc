"""Reference implementations of two rival store designs, for the comparison harness only.

Both keep a call's record as one msgpack string and plug into the same EffectGuard, so the
harness compares store designs and nothing else. Only the blocking begin/commit/settle path is
implemented: that is all a sequential benchmark exercises.

- :class:`WatchMultiStore`: optimistic transactions. begin = WATCH, GET, then MULTI/SET/EXEC;
  commit = WATCH, GET (owner check), then MULTI/SET/EXEC. Atomic, but three round trips a step.
- :class:`PowertoolsStyleStore`: the shape of AWS Lambda Powertools' Redis persistence layer.
  begin = SET NX (then GET when the key exists); commit = a plain SET. Two round trips, but the
  commit is unconditional: an attempt that was taken over still overwrites the record, the flaw
  behind powertools-lambda-python #8386.
"""

from __future__ import annotations

from typing import Any

import msgpack
import redis

from airlock_redis.core.records import (
    BeginKind,
    BeginOutcome,
    BeginRequest,
    Record,
    Settlement,
    Status,
    TransitionResult,
)
from airlock_redis.stores.keys import record_key

_PENDING_MS = 7 * 24 * 3600 * 1000
_COMMITTED_MS = 24 * 3600 * 1000


def _pack(record: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(record, use_bin_type=True)
    return data


def _unpack(raw: Any) -> dict[str, Any]:
    record: dict[str, Any] = msgpack.unpackb(raw, raw=False)
    return record


def _pending(request: BeginRequest, attempt: int) -> dict[str, Any]:
    return {
        "s": "pending",
        "k": request.idempotency_key,
        "t": request.tool,
        "o": request.token,
        "a": attempt,
    }


def _found(record: dict[str, Any], request: BeginRequest) -> BeginOutcome | None:
    """What begin reports about an existing record; None when this attempt may take it over."""
    attempt = int(record.get("a", 1))
    if record.get("k") != request.idempotency_key or record.get("t") != request.tool:
        return BeginOutcome(
            BeginKind.MISMATCH, attempt, tool=record.get("t"), idempotency_key=record.get("k")
        )
    status = record.get("s")
    if status == "committed":
        return BeginOutcome(BeginKind.COMMITTED, attempt, value=record.get("v"))
    if status == "pending" and record.get("o") == request.token:
        return BeginOutcome(BeginKind.STARTED, attempt)
    if request.reversible:
        return None
    return BeginOutcome(BeginKind(status), attempt)


class _ReferenceStore:
    """The parts of the EffectStore contract a sequential benchmark does not use."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    def key(self, tool_call_id: str) -> bytes:
        return record_key(self.namespace, tool_call_id)

    def get(self, tool_call_id: str) -> Record | None:
        raise NotImplementedError("benchmark reference store: begin/commit/settle only")

    def resolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        expect_key: str | None = None,
        expect_status: Status | None = None,
        expect_owner: str | None = None,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        raise NotImplementedError("benchmark reference store: begin/commit/settle only")

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        raise NotImplementedError("benchmark reference store: blocking calls only")

    async def acommit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        raise NotImplementedError("benchmark reference store: blocking calls only")

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        raise NotImplementedError("benchmark reference store: blocking calls only")

    async def aget(self, tool_call_id: str) -> Record | None:
        raise NotImplementedError("benchmark reference store: blocking calls only")

    async def aresolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        expect_key: str | None = None,
        expect_status: Status | None = None,
        expect_owner: str | None = None,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        raise NotImplementedError("benchmark reference store: blocking calls only")


class WatchMultiStore(_ReferenceStore):
    """Optimistic transactions: every step is WATCH, GET, check, then MULTI/SET/EXEC."""

    def begin(self, request: BeginRequest) -> BeginOutcome:
        key = self.key(request.tool_call_id)
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    attempt = 1
                    if raw is not None:
                        record = _unpack(raw)
                        outcome = _found(record, request)
                        if outcome is not None:
                            return outcome
                        attempt = int(record.get("a", 1)) + 1
                    pipe.multi()
                    pipe.set(key, _pack(_pending(request, attempt)), px=_PENDING_MS)
                    pipe.execute()
                    return BeginOutcome(BeginKind.STARTED, attempt)
                except redis.WatchError:
                    continue

    def _owned_update(self, tool_call_id: str, token: str, change: dict[str, Any] | None, ttl: int) -> str:
        key = self.key(tool_call_id)
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if raw is None:
                        return "missing"
                    record = _unpack(raw)
                    if record.get("o") != token:
                        return "superseded"
                    pipe.multi()
                    if change is None:
                        pipe.delete(key)
                    else:
                        pipe.set(key, _pack({**record, **change}), px=ttl)
                    pipe.execute()
                    return "ok"
                except redis.WatchError:
                    continue

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        tool_call_id, token = request.tool_call_id, request.token
        change = {"s": "committed", "v": value}
        return TransitionResult(self._owned_update(tool_call_id, token, change, _COMMITTED_MS))

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        tool_call_id, token = request.tool_call_id, request.token
        change = None if settlement is Settlement.RELEASE else {"s": "unknown"}
        return TransitionResult(self._owned_update(tool_call_id, token, change, _PENDING_MS))


class PowertoolsStyleStore(_ReferenceStore):
    """SET NX to claim, GET on conflict, and a plain (unfenced) SET to commit."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        super().__init__(client, namespace)
        # like Powertools, the attempt keeps its record's identity in memory between begin and commit
        self._identity: dict[str, tuple[str, str]] = {}

    def begin(self, request: BeginRequest) -> BeginOutcome:
        key = self.key(request.tool_call_id)
        self._identity[request.tool_call_id] = (request.idempotency_key, request.tool)
        if self.client.set(key, _pack(_pending(request, 1)), nx=True, px=_PENDING_MS):
            return BeginOutcome(BeginKind.STARTED, 1)
        raw = self.client.get(key)
        if raw is None:  # expired in between: claim again
            return self.begin(request)
        record = _unpack(raw)
        outcome = _found(record, request)
        if outcome is not None:
            return outcome
        attempt = int(record.get("a", 1)) + 1
        self.client.set(key, _pack(_pending(request, attempt)), px=_PENDING_MS)
        return BeginOutcome(BeginKind.STARTED, attempt)

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        tool_call_id, token = request.tool_call_id, request.token
        record = {"s": "committed", "o": token, "v": value}
        record["k"], record["t"] = self._identity.pop(tool_call_id, ("", ""))
        self.client.set(self.key(tool_call_id), _pack(record), px=_COMMITTED_MS)
        return TransitionResult.OK

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        tool_call_id, token = request.tool_call_id, request.token
        key = self.key(tool_call_id)
        if settlement is Settlement.RELEASE:
            self.client.delete(key)
        else:
            self.client.set(key, _pack({"s": "unknown", "o": token}), px=_PENDING_MS)
        return TransitionResult.OK
