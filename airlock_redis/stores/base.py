"""The contract every effect store keeps.

A store is dumb and atomic: it knows records, owner tokens, TTLs and bytes, never tools or
policies. ``begin`` must be atomic across every process that shares the store. Each operation has
a blocking form and an ``a``-prefixed coroutine form, so one store object serves sync and async
tools. Operations raise :class:`~airlock_redis.core.errors.StoreError` when the store cannot
answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..core.errors import StoreError
from ..core.records import BeginOutcome, BeginRequest, Holder, Record, Settlement, Status, TransitionResult
from ..core.verdicts import parse_verdict


@runtime_checkable
class EffectStore(Protocol):
    """What the guard needs of a store: :class:`~airlock_redis.InMemoryEffectStore` and
    :class:`~airlock_redis.RedisEffectStore` keep it; write your own against it. Every operation
    has a blocking form and an ``a``-prefixed coroutine form (see the module's docstring)."""

    def begin(self, request: BeginRequest) -> BeginOutcome:
        """Record the call pending for ``request.token``, or report what an earlier attempt left.

        Absent -> pending, STARTED. Same owner token -> STARTED again (a re-sent begin is harmless).
        Another tool or idempotency key -> MISMATCH. Committed -> COMMITTED with the value.
        Pending/unknown -> taken over for this token (attempt + 1) and STARTED if ``reversible``,
        else the status.
        """
        ...

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        """Owner (``request.token``) only: mark the call committed with its value (None: ran, result
        not storable). No record left (it expired while the tool ran, or was given back) -> written
        again as committed, RECREATED: the call ran, and the record must say so."""
        ...

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        """Owner only: mark a pending call unknown, or release it. A release leaves a short-lived
        tombstone of the token (a late begin of this attempt then records nothing); a release that
        finds no record leaves one too and answers MISSING. UNKNOWN with no record left -> written
        again as unknown, RECREATED."""
        ...

    def get(self, tool_call_id: str) -> Record | None:
        """The record, or None."""
        ...

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
        """The operator's verdict on a record: committed (with a value), unknown, or release.

        Fenced on what the operator was shown: MISMATCH when the idempotency key is not
        ``expect_key``, CHANGED when the status or owner is not ``expect_status`` / ``expect_owner``
        (None skips a check); nothing is changed then."""
        ...

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        """Coroutine form of :meth:`begin`."""
        ...

    async def acommit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        """Coroutine form of :meth:`commit`."""
        ...

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        """Coroutine form of :meth:`settle`."""
        ...

    async def aget(self, tool_call_id: str) -> Record | None:
        """Coroutine form of :meth:`get`."""
        ...

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
        """Coroutine form of :meth:`resolve`."""
        ...


def check_verdict(verdict: Status | Settlement) -> Status | Settlement:
    """An operator resolves a record to committed, unknown or release; never back to pending. The
    verdict as the member the stores compare by identity (:func:`~airlock_redis.core.verdicts.parse_verdict`,
    the one normalizer)."""
    return parse_verdict(verdict)


@runtime_checkable
class RemoteEffectStore(Protocol):
    """A store that ``airlock-redis`` can reach: ``operator_target`` is the options that point the
    command at it (``--url ... --namespace ...``, no password), printed in refusals."""

    @property
    def operator_target(self) -> str:
        """The ``airlock-redis`` options that reach these records (``--url ... --namespace ...``,
        without a password), printed in refusals' hints."""
        ...


@runtime_checkable
class DurableEffectStore(Protocol):
    """A store that can make a started attempt's pending record durable before the tool runs
    (RedisEffectStore with ``wait_replicas``). The guard calls ``ensure_durable`` after a begin that
    said STARTED, and only when ``wait_replicas`` is above 0; it raises StoreError when the record did
    not reach enough replicas."""

    wait_replicas: int

    def ensure_durable(self, request: BeginRequest) -> None:
        """After a started begin: return once ``wait_replicas`` replicas hold the pending record,
        else raise a StoreError (the tool then does not run)."""
        ...

    async def aensure_durable(self, request: BeginRequest) -> None:
        """Coroutine form of :meth:`ensure_durable`."""
        ...


@runtime_checkable
class WaitingEffectStore(Protocol):
    """A store where a call can wait for the running attempt that holds its record
    (``EffectGuard(wait_for_running=...)``), woken when that attempt ends: no polling."""

    @property
    def can_wait(self) -> bool:
        """Whether calls can wait here now (a Redis store given only an asyncio client cannot: its
        listener runs in a thread)."""
        ...

    def wait_running(self, request: BeginRequest, seconds: float) -> BeginOutcome:
        """Wait up to ``seconds`` for the running attempt that holds ``request``'s record to end (or
        its lease to lapse unrenewed), then begin ``request`` again and answer what begin answers."""
        ...

    async def await_running(self, request: BeginRequest, seconds: float) -> BeginOutcome:
        """Coroutine form of :meth:`wait_running`; cancelled, it leaves nothing behind."""
        ...


@runtime_checkable
class LeasingEffectStore(Protocol):
    """A store that keeps leases (``EffectGuard(lease=...)``): a begin whose request carries
    ``lease_ms`` writes a record that tells a running attempt from an abandoned one, and
    ``renew_leases`` keeps it running. Renewals are sent from the lease keeper's thread
    (:mod:`airlock_redis.lease`), so they are blocking calls."""

    @property
    def keeps_leases(self) -> bool:
        """Whether this store can renew leases now (a Redis store given only an asyncio client
        cannot: renewals are sent from a thread)."""
        ...

    def renew_leases(self, requests: Sequence[BeginRequest]) -> list[TransitionResult | StoreError]:
        """Renew the lease of each running attempt (owner-fenced): OK, SUPERSEDED (another owner,
        or the call ended), MISSING, or the StoreError that kept it from being renewed."""
        ...


@runtime_checkable
class DedupingEffectStore(Protocol):
    """A store that keeps an index from idempotency key to the tool_call_id that holds it
    (``EffectGuard(dedupe=...)``, docs/in-doubt.md "Dedupe across ids"). The index only points: the
    record of the id it names is the only authority on whether the key is busy."""

    def claim(self, request: BeginRequest, expected: Holder | None = None) -> Holder | None:
        """Make the entry of ``request.idempotency_key`` name this attempt (for the pending TTL) where
        it is absent, holds ``expected`` (a compare-and-set), this attempt's own, or another attempt
        of ``request.tool_call_id``: None (claimed). Else the holder, and nothing is written."""
        ...

    def unclaim(self, request: BeginRequest, keep: Status | None) -> bool:
        """Where the entry is still this attempt's: keep it as long as a record in status ``keep``
        lives, or delete it (None). True when it was this attempt's."""
        ...

    def wait_ended(self, tool_call_id: str, seconds: float) -> None:
        """Wait up to ``seconds`` for the running attempt of ``tool_call_id`` to end (or its lease to
        lapse unrenewed); its record is only watched, never begun."""
        ...

    async def aclaim(self, request: BeginRequest, expected: Holder | None = None) -> Holder | None:
        """Coroutine form of :meth:`claim`."""
        ...

    async def aunclaim(self, request: BeginRequest, keep: Status | None) -> bool:
        """Coroutine form of :meth:`unclaim`."""
        ...

    async def await_ended(self, tool_call_id: str, seconds: float) -> None:
        """Coroutine form of :meth:`wait_ended`; cancelled, it leaves nothing behind."""
        ...
