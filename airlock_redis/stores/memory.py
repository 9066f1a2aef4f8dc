"""An effect store inside one process: the default, and the reference for the Redis store.

Its transitions are the Lua scripts' (``lua/*.lua``), rule for rule; ``tests/test_model_check.py``
keeps the two equal.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..core.errors import StoreError
from ..core.records import (
    BeginKind,
    BeginOutcome,
    BeginRequest,
    Holder,
    Record,
    Settlement,
    Status,
    TransitionResult,
)
from .base import check_verdict
from .keys import DEFAULT_NAMESPACE
from .layout import pack_holder, parse_holder
from .operator_view import (
    AUDIT_MAX_ENTRIES,
    FIRST_PAGE,
    ListPage,
    ListQuery,
    RecordView,
    StoreViews,
    audit_entry,
    parse_cursor,
    view_of_record,
)
from .ttl import DEFAULT_COMMITTED_TTL, DEFAULT_PENDING_TTL, DEFAULT_UNKNOWN_TTL, TOMBSTONE_TTL, StatusTTLs
from .wakeups import AFTER_LEASE, Signal


class _Row:
    """One call's record, changed in place under the store's lock. ``status`` None: a tombstone of
    ``owner`` (see :data:`~airlock_redis.core.records.RELEASED`)."""

    __slots__ = (
        "attempt",
        "begun_ms",
        "committed_ms",
        "expires_at",
        "key",
        "lease_ms",
        "mac",
        "owner",
        "released",
        "renewed_at",
        "seq",
        "status",
        "stored",
        "tool",
        "value",
    )

    def __init__(self, request: BeginRequest, attempt: int, status: Status | None, now_ms: int) -> None:
        self.status: Status | None = status
        self.key = request.idempotency_key
        self.tool = request.tool
        self.owner = request.token
        self.attempt = attempt
        self.value: bytes | None = None
        self.stored = False
        self.mac: bytes | None = None
        self.begun_ms: int | None = now_ms
        self.committed_ms: int | None = None
        self.expires_at = 0.0  # on the store's clock, seconds
        # a pending row held under a lease: the lease, and when its owner last renewed it (store's clock)
        self.lease_ms = request.lease_ms
        self.renewed_at = 0.0
        self.released: frozenset[str] = frozenset()  # tokens that gave this key's record back
        self.seq = 0  # when the id came into the store (its place in an operator's listing)

    def commit(self, owner: str, value: bytes | None, mac: bytes | None, now_ms: int) -> None:
        self.status = Status.COMMITTED
        self.owner = owner
        self.value = value
        self.stored = value is not None
        self.mac = mac
        self.committed_ms = now_ms


_STARTED_FIRST = BeginOutcome(BeginKind.STARTED, attempt=1)
# new rows between two sweeps, and the rows a sweep looks at (see InMemoryEffectStore._admit)
_SWEEP_BATCH = 32
# index entries (dedupe) below which expired ones are not swept
_INDEX_SWEEP_LEAST = 1024


class _Waking:
    """Entered with the store's lock held, by each transition that ends or hands over a record: on the
    way out it wakes the calls that wait for that record (see ``wait_running``)."""

    __slots__ = ("store", "tool_call_id")

    def __init__(self, store: InMemoryEffectStore, tool_call_id: str) -> None:
        self.store, self.tool_call_id = store, tool_call_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        waiters = self.store._waiters
        if waiters:
            for signal in waiters.pop(self.tool_call_id, ()):
                signal.set(b"ended")


class InMemoryEffectStore:
    """Holds one process's records. Two processes never see each other's calls: use a shared
    store such as :class:`~airlock_redis.RedisEffectStore` to cover replicas.

    ``committed_ttl``, ``pending_ttl`` and ``unknown_ttl`` are how many seconds a record lives in
    each status; ``clock`` (monotonic seconds) is what they are measured with. Thread-safe: one lock
    guards every transition."""

    def __init__(
        self,
        *,
        committed_ttl: float = DEFAULT_COMMITTED_TTL,
        pending_ttl: float = DEFAULT_PENDING_TTL,
        unknown_ttl: float = DEFAULT_UNKNOWN_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttls = StatusTTLs(committed=committed_ttl, pending=pending_ttl, unknown=unknown_ttl)
        # seconds a row lives in each status (None: a tombstone), looked up on every transition
        self._lifetimes: dict[Status | None, float] = {status: self.ttls.seconds(status) for status in Status}
        self._lifetimes[None] = TOMBSTONE_TTL
        self._clock = clock
        self._rows: dict[str, _Row] = {}
        # every id in _rows, oldest first (an id may be here twice, or no longer in _rows): the sweep's
        # queue, so that a row nobody asks for again is removed once it expires
        self._queue: deque[str] = deque()
        self._admitted = 0
        self._lock = threading.Lock()
        # the operators' audit entries (JSON text, oldest first), see InMemoryOperatorView
        self._audit: deque[tuple[str, str]] = deque(maxlen=AUDIT_MAX_ENTRIES)
        # the calls waiting for a running attempt, by tool_call_id (see wait_running)
        self._waiters: dict[str, list[Signal]] = {}
        # dedupe: idempotency key -> (its index entry, when it expires on the store's clock)
        self._index: dict[str, tuple[bytes, float]] = {}
        self._index_sweep_at = _INDEX_SWEEP_LEAST  # entries at which expired ones are next swept
        self._audited = 0

    def __repr__(self) -> str:
        return f"InMemoryEffectStore(records={len(self._rows)})"

    # -- helpers (call with the lock held) -------------------------------------------------------
    # ``now`` is the store's clock, read once per transition
    def _live(self, tool_call_id: str, now: float) -> _Row | None:
        """The row, tombstones included; None when there is none or it expired."""
        row = self._rows.get(tool_call_id)
        if row is not None and row.expires_at <= now:
            del self._rows[tool_call_id]
            return None
        return row

    def _keep(self, row: _Row, now: float) -> None:
        """Restart the row's TTL for its (new) status (for a pending row: renew its lease)."""
        row.expires_at = now + self._lifetimes[row.status]
        row.renewed_at = now

    @staticmethod
    def _since_renewal_ms(row: _Row, now: float) -> int | None:
        """Ms since a pending row under a lease was renewed (None for any other row), as the Redis
        store reads it from the record's TTL."""
        if row.status is not Status.PENDING or row.lease_ms is None:
            return None
        return max(0, round((now - row.renewed_at) * 1000))

    def _bury(self, tool_call_id: str, owner: str, old: _Row | None, now: float) -> None:
        """Replace the record by a tombstone of ``owner``, keeping the tokens released before."""
        row = _Row(BeginRequest(tool_call_id, "", "", owner, False), 0, None, 0)
        row.begun_ms = None
        self._put(tool_call_id, row, now, old, released=owner)

    def _admit(self, tool_call_id: str, now: float) -> None:
        """Note a row just added under a new id. Every _SWEEP_BATCH of them, look at as many ids from
        the front of the queue: a row that expired goes, a live one goes to the back. So every row is
        looked at once per turn of the queue, and one that expired is gone within that many new rows,
        whether or not anyone asks for it again (a row is otherwise only removed when it is read)."""
        self._queue.append(tool_call_id)
        self._admitted += 1
        if self._admitted % _SWEEP_BATCH:
            return
        rows, queue = self._rows, self._queue
        for _ in range(min(_SWEEP_BATCH, len(queue))):
            swept = queue.popleft()
            row = rows.get(swept)
            if row is None:
                continue  # removed already (read after it expired), or queued twice
            if row.expires_at <= now:
                del rows[swept]
            else:
                queue.append(swept)

    def _put(
        self, tool_call_id: str, row: _Row, now: float, old: _Row | None = None, released: str = ""
    ) -> None:
        """Store ``row`` in place of ``old`` (None: the id holds nothing), carrying over the tokens
        released before (plus ``released``)."""
        if old is not None:
            row.released = old.released
            row.seq = old.seq
        else:
            row.seq = self._admitted + 1  # the number _admit gives it
        if released:
            row.released = row.released | {released}
        self._rows[tool_call_id] = row
        self._keep(row, now)
        if old is None:
            self._admit(tool_call_id, now)  # after the row is in: the sweep may look at it

    # -- the transitions -------------------------------------------------------------------------
    def begin(self, request: BeginRequest) -> BeginOutcome:
        """Record the call pending for ``request.token``, or report what an earlier attempt left
        (STARTED, COMMITTED with the value, MISMATCH, or the status in doubt); a reversible request
        takes over a pending or unknown record (attempt + 1). The contract:
        :meth:`airlock_redis.EffectStore.begin`."""
        with self._lock:
            now = self._clock()
            row = self._live(request.tool_call_id, now)
            if row is not None and request.token in row.released:
                raise _late_begin()
            if row is None or row.status is None:
                self._put(request.tool_call_id, _Row(request, 1, Status.PENDING, _wall_ms()), now, row)
                return _STARTED_FIRST
            if row.key != request.idempotency_key or row.tool != request.tool:
                return BeginOutcome(BeginKind.MISMATCH, row.attempt, tool=row.tool, idempotency_key=row.key)
            if row.status is Status.COMMITTED:
                value = row.value if row.stored else None
                return BeginOutcome(BeginKind.COMMITTED, row.attempt, value=value, mac=row.mac)
            if row.owner == request.token and row.status is Status.PENDING:
                self._keep(row, now)
                return BeginOutcome(BeginKind.STARTED, row.attempt)
            since = self._since_renewal_ms(row, now)
            lease = row.lease_ms
            if since is not None and lease is not None and since <= lease:
                return BeginOutcome(BeginKind.RUNNING, row.attempt, lease_ms=lease, since_renewal_ms=since)
            probe = request.probes and (row.status is Status.UNKNOWN or since is not None)
            if request.reversible or probe:
                found = "unknown" if row.status is Status.UNKNOWN else "abandoned"
                row.status = Status.PENDING
                row.owner = request.token
                row.attempt += 1
                row.begun_ms = _wall_ms()
                row.lease_ms = request.lease_ms
                self._keep(row, now)
                if probe and not request.reversible:
                    return BeginOutcome(BeginKind.PROBE, row.attempt, found=found)
                return BeginOutcome(BeginKind.STARTED, row.attempt)
            if since is not None:
                return BeginOutcome(BeginKind.ABANDONED, row.attempt, lease_ms=lease, since_renewal_ms=since)
            return BeginOutcome(BeginKind(row.status.value), row.attempt)

    @property
    def keeps_leases(self) -> bool:
        """Always: renewing a lease here is a method call."""
        return True

    # -- waiting for a running attempt ------------------------------------------------------------
    @property
    def can_wait(self) -> bool:
        """Always: a waiter here is an event (or a future) the ending transition sets."""
        return True

    def _join(self, tool_call_id: str, loop: asyncio.AbstractEventLoop | None) -> tuple[Signal, float] | None:
        """Register a waiter while the record's attempt runs: its signal and the seconds its lease
        has left; None when it no longer runs (begin again at once)."""
        with self._lock:
            now = self._clock()
            row = self._live(tool_call_id, now)
            since = None if row is None else self._since_renewal_ms(row, now)
            if row is None or since is None or row.lease_ms is None or since > row.lease_ms:
                return None
            signal = Signal(loop)
            self._waiters.setdefault(tool_call_id, []).append(signal)
            return signal, (row.lease_ms - since) / 1000

    def _leave(self, tool_call_id: str, signal: Signal) -> None:
        with self._lock:
            signals = self._waiters.get(tool_call_id)
            if signals is not None and signal in signals:
                signals.remove(signal)
                if not signals:
                    del self._waiters[tool_call_id]

    def wait_running(self, request: BeginRequest, seconds: float) -> BeginOutcome:
        """Wait up to ``seconds`` for the attempt that runs ``request``'s call to end (or its lease
        to lapse unrenewed), then begin again: what begin answers then."""
        self.wait_ended(request.tool_call_id, seconds)
        return self.begin(request)

    async def await_running(self, request: BeginRequest, seconds: float) -> BeginOutcome:
        """Coroutine form of :meth:`wait_running`; cancelled, it leaves nothing behind."""
        await self.await_ended(request.tool_call_id, seconds)
        return self.begin(request)

    def wait_ended(self, tool_call_id: str, seconds: float) -> None:
        """Wait up to ``seconds`` for the running attempt of ``tool_call_id`` to end (or its lease to
        lapse unrenewed); the record is only watched."""
        joined = self._join(tool_call_id, None)
        if joined is not None:
            signal, lease_left = joined
            try:
                signal.wait(min(seconds, lease_left + AFTER_LEASE))
            finally:
                self._leave(tool_call_id, signal)

    async def await_ended(self, tool_call_id: str, seconds: float) -> None:
        """Coroutine form of :meth:`wait_ended`; cancelled, it leaves nothing behind."""
        joined = self._join(tool_call_id, asyncio.get_running_loop())
        if joined is not None:
            signal, lease_left = joined
            try:
                await signal.await_(min(seconds, lease_left + AFTER_LEASE))
            finally:
                self._leave(tool_call_id, signal)

    # -- dedupe: the index from idempotency key to the tool_call_id that holds it ---------------------
    def claim(self, request: BeginRequest, expected: Holder | None = None) -> Holder | None:
        """Make the key's index entry name this attempt (see
        :meth:`airlock_redis.stores.base.DedupingEffectStore.claim`); as lua/claim.lua."""
        mine = pack_holder(request.tool_call_id, request.token)
        with self._lock:
            now = self._clock()
            entry = self._index.get(request.idempotency_key)
            current = entry[0] if entry is not None and entry[1] > now else None
            if current is not None and current != mine and (expected is None or current != expected.raw):
                holder = parse_holder(current)
                if holder.tool_call_id != request.tool_call_id:
                    return holder
            self._index[request.idempotency_key] = (mine, now + self.ttls.seconds(Status.PENDING))
            if len(self._index) >= self._index_sweep_at:  # amortised: each sweep doubles the next bound
                self._index = {key: entry for key, entry in self._index.items() if entry[1] > now}
                self._index_sweep_at = max(_INDEX_SWEEP_LEAST, 2 * len(self._index))
            return None

    def unclaim(self, request: BeginRequest, keep: Status | None) -> bool:
        """End this attempt's index entry: kept as long as a record in status ``keep`` lives, or
        deleted (None); fenced on the entry. As lua/unclaim.lua."""
        mine = pack_holder(request.tool_call_id, request.token)
        with self._lock:
            now = self._clock()
            entry = self._index.get(request.idempotency_key)
            if entry is None or entry[1] <= now or entry[0] != mine:
                return False
            if keep is None:
                del self._index[request.idempotency_key]
            else:
                self._index[request.idempotency_key] = (mine, now + self.ttls.seconds(keep))
            return True

    def index_entry(self, idempotency_key: str) -> Holder | None:
        """The holder the key's index entry names now (None: no entry), for tests and operators."""
        with self._lock:
            entry = self._index.get(idempotency_key)
            if entry is None or entry[1] <= self._clock():
                return None
            return parse_holder(entry[0])

    async def aclaim(self, request: BeginRequest, expected: Holder | None = None) -> Holder | None:
        """Coroutine form of :meth:`claim` (nothing here waits)."""
        return self.claim(request, expected)

    async def aunclaim(self, request: BeginRequest, keep: Status | None) -> bool:
        """Coroutine form of :meth:`unclaim`."""
        return self.unclaim(request, keep)

    def renew_leases(self, requests: Sequence[BeginRequest]) -> list[TransitionResult | StoreError]:
        """Renew the lease of each running attempt (see :meth:`renew`)."""
        return [self.renew(request) for request in requests]

    def renew(self, request: BeginRequest) -> TransitionResult:
        """The owner of a running call renews its lease: OK, SUPERSEDED (another owner, or the call
        ended), MISSING (no record). As lua/renew.lua."""
        with self._lock:
            now = self._clock()
            row = self._live(request.tool_call_id, now)
            if row is None:
                return TransitionResult.MISSING
            if row.status is not Status.PENDING or row.owner != request.token or row.lease_ms is None:
                return TransitionResult.SUPERSEDED
            self._keep(row, now)
            return TransitionResult.OK

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        """The attempt that owns the record (``request.token``) marks it committed with the tool's
        encoded ``value`` (None: ran, result not stored) and its ``mac``: OK, SUPERSEDED for an
        attempt that no longer owns it, RECREATED when no record was left (written again as
        committed). The contract: :meth:`airlock_redis.EffectStore.commit`."""
        with self._lock, _Waking(self, request.tool_call_id):
            now = self._clock()
            row = self._live(request.tool_call_id, now)
            if row is None or row.status is None:
                fresh = _Row(request, attempt, Status.COMMITTED, _wall_ms())
                fresh.begun_ms = None
                fresh.commit(request.token, value, mac, _wall_ms())
                self._put(request.tool_call_id, fresh, now, row)
                return TransitionResult.RECREATED
            if row.owner != request.token:
                return TransitionResult.SUPERSEDED
            if row.status is not Status.COMMITTED:
                row.commit(request.token, value, mac, _wall_ms())
                self._keep(row, now)
            return TransitionResult.OK

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        """The owning attempt marks its pending record unknown, or releases it (leaving a short-lived
        tombstone of its token). The contract: :meth:`airlock_redis.EffectStore.settle`."""
        with self._lock, _Waking(self, request.tool_call_id):
            tool_call_id = request.tool_call_id
            now = self._clock()
            row = self._live(tool_call_id, now)
            if row is not None and row.status is None and request.token in row.released:
                return TransitionResult.OK  # this attempt released it already: a re-send
            if row is None or row.status is None:
                if settlement is Settlement.RELEASE:
                    self._bury(tool_call_id, request.token, row, now)
                    return TransitionResult.MISSING
                fresh = _Row(request, attempt, Status.UNKNOWN, _wall_ms())
                fresh.begun_ms = None
                self._put(tool_call_id, fresh, now, row)
                return TransitionResult.RECREATED
            if row.owner != request.token:
                return TransitionResult.SUPERSEDED
            if row.status is Status.PENDING:
                if settlement is Settlement.RELEASE:
                    self._bury(tool_call_id, request.token, row, now)
                else:
                    row.status = Status.UNKNOWN
                    self._keep(row, now)
            return TransitionResult.OK

    def get(self, tool_call_id: str) -> Record | None:
        """The record of ``tool_call_id`` (with its remaining TTL), or None when there is none, it
        expired, or it was released."""
        with self._lock:
            now = self._clock()
            row = self._live(tool_call_id, now)
            if row is None or row.status is None:
                return None
            return Record(
                tool_call_id=tool_call_id,
                status=row.status,
                idempotency_key=row.key,
                tool=row.tool,
                owner=row.owner,
                attempt=row.attempt,
                value=row.value,
                stored=row.stored,
                mac=row.mac,
                begun_ms=row.begun_ms,
                committed_ms=row.committed_ms,
                ttl_ms=max(0, round((row.expires_at - now) * 1000)),
                lease_ms=row.lease_ms if row.status is Status.PENDING else None,
                since_renewal_ms=self._since_renewal_ms(row, now),
            )

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
        """An operator's verdict (committed with ``value``, unknown, or release), applied only when
        the record still matches what the operator was shown (``expect_*``; None skips a check):
        OK, MISSING, MISMATCH or CHANGED. The contract: :meth:`airlock_redis.EffectStore.resolve`."""
        verdict = check_verdict(verdict)
        with self._lock, _Waking(self, tool_call_id):
            now = self._clock()
            row = self._live(tool_call_id, now)
            if row is None or row.status is None:
                return TransitionResult.MISSING
            if expect_key and row.key != expect_key:  # "" skips the check, as in the script
                return TransitionResult.MISMATCH
            if (expect_status is not None and row.status is not expect_status) or (
                expect_owner is not None and row.owner != expect_owner
            ):
                return TransitionResult.CHANGED
            owner = "operator:" + secrets.token_hex(8)
            if verdict is Settlement.RELEASE:
                self._bury(tool_call_id, owner, row, now)
                return TransitionResult.OK
            if verdict is Status.COMMITTED:
                row.commit(owner, value, mac, _wall_ms())
            else:
                row.status = Status.UNKNOWN
                row.owner = owner
            self._keep(row, now)
            return TransitionResult.OK

    # -- what the operator's views read (InMemoryOperatorView) ----------------------------------
    def operator_view(self) -> InMemoryOperatorView:
        """The operator's views of these records (:class:`~.operator_view.OperatorStore`): read,
        list, resolve, and an audit trail kept in this process."""
        return InMemoryOperatorView(self)

    def _ids_after(self, seq: int) -> list[tuple[int, str]]:
        """The ids of the live rows that came in after ``seq``, each with its place, in the order
        they came (tombstones included)."""
        with self._lock:
            now = self._clock()
            return sorted(
                (row.seq, tool_call_id)
                for tool_call_id, row in self._rows.items()
                if row.seq > seq and row.expires_at > now
            )

    def _add_audit(self, text: str) -> None:
        with self._lock:
            self._audited += 1
            self._audit.append((f"{_wall_ms()}-{self._audited}", text))

    def _newest_audit(self, limit: int) -> list[tuple[str, str]]:
        with self._lock:
            return [self._audit[-i] for i in range(1, min(limit, len(self._audit)) + 1)]

    # -- the same, for coroutines (nothing here blocks) ------------------------------------------
    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        """Coroutine form of :meth:`begin` (nothing here waits)."""
        return self.begin(request)

    async def acommit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        """Coroutine form of :meth:`commit`."""
        return self.commit(request, attempt, value, mac)

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        """Coroutine form of :meth:`settle`."""
        return self.settle(request, attempt, settlement)

    async def aget(self, tool_call_id: str) -> Record | None:
        """Coroutine form of :meth:`get`."""
        return self.get(tool_call_id)

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
        return self.resolve(
            tool_call_id,
            verdict,
            expect_key=expect_key,
            expect_status=expect_status,
            expect_owner=expect_owner,
            value=value,
            mac=mac,
        )


class InMemoryOperatorView(StoreViews[InMemoryEffectStore]):
    """:class:`~.operator_view.OperatorStore` over an :class:`InMemoryEffectStore` (made by its
    :meth:`~InMemoryEffectStore.operator_view`). A listing goes through the records in the order their
    ids came into the store (a cursor is ``0:<the last place examined>:<records after it to skip>``);
    the audit trail lives in the store, in this process, and keeps the newest
    :data:`~.operator_view.AUDIT_MAX_ENTRIES` entries. ``namespace`` is only what audit entries name:
    an in-memory store holds one set of records."""

    def __init__(self, store: InMemoryEffectStore, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        super().__init__(store, namespace)

    def read_record(self, tool_call_id: str) -> RecordView | None:
        """The record with its value, as the store's ``get`` answers it; None when there is none."""
        record = self.store.get(tool_call_id)
        return view_of_record(record) if record is not None else None

    def list_records(self, query: ListQuery = FIRST_PAGE) -> ListPage:
        """Records that pass ``query.where``, in the order they came, without their values
        (``scan_count`` is not used: the rows are in this process)."""
        _, after, skip = parse_cursor(query.cursor, 1)
        rows = self.store._ids_after(after)
        now_ms = _wall_ms()
        found: list[RecordView] = []
        for scanned, (place, tool_call_id) in enumerate(rows, start=1):
            record = self.store.get(tool_call_id)  # None: a tombstone, or gone since
            if record is not None:
                view = view_of_record(record, with_value=False)
                if query.where.accepts(view, now_ms):
                    if skip:
                        skip -= 1
                    else:
                        found.append(view)
            if (len(found) >= query.limit or scanned >= query.max_scanned) and scanned < len(rows):
                return ListPage(found, scanned, f"0:{place}:0")
        return ListPage(found, len(rows), None)

    def append_audit(self, text: str) -> None:
        """Keep the entry in the store's audit trail (in this process)."""
        self.store._add_audit(text)

    def read_audit(self, *, limit: int = 20) -> list[dict[str, Any]]:
        """The newest ``limit`` entries, newest first."""
        return [audit_entry(text, entry_id) for entry_id, text in self.store._newest_audit(limit)]


def _wall_ms() -> int:
    """Wall-clock milliseconds: what a record's begun/committed times are read in."""
    return time.time_ns() // 1_000_000


def _late_begin() -> StoreError:
    return StoreError("this attempt already gave its record back; a begin that arrives late records nothing")
