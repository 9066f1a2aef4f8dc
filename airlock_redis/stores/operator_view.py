"""What an operator's views need of a store: :class:`OperatorStore`, the small protocol that
``airlock-redis inspect|list|resolve|audit`` go through, and the types it answers.

A store keeps it beside :class:`~airlock_redis.stores.base.EffectStore`: read one record as a
:class:`RecordView`, list a page of them (:class:`ListFilter`, a cursor, :class:`ListPage`), apply a
fenced verdict through the store's own ``resolve`` transition, and append and read the audit trail.
:func:`views_of` gives the implementation for a store: :class:`~.redis_operator.RedisOperatorView`
for the Redis store, :class:`~.memory.InMemoryOperatorView` for the in-memory one.

Reading here is tolerant on purpose: a record that the guard refuses as corrupt (unknown status,
missing fields, damaged value) is exactly the one an operator has to look at, so a view reports
odd content in ``RecordView.problems`` instead of raising.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ..core.codec import decode_result
from ..core.errors import ResultDecodingError
from ..core.records import Record, Settlement, Status, TransitionResult
from ..core.verdicts import Fence
from ..redaction import redact
from .base import EffectStore

AUDIT_MAX_ENTRIES = 10_000  # audit entries a store keeps per namespace (Redis: XADD MAXLEN ~)


# -- one record --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordView:
    """A record as an operator sees it: every field optional, oddities listed in ``problems``."""

    tool_call_id: str
    status: str | None
    tool: str | None
    idempotency_key: str | None
    owner: str | None
    attempt: int | None
    begun_ms: int | None
    committed_ms: int | None
    ttl_ms: int | None
    stored: bool
    has_mac: bool
    value_bytes: int | None
    value: bytes | None = field(default=None, repr=False)
    problems: tuple[str, ...] = ()
    # a record of a layout version this airlock-redis does not know (written by a newer one): its
    # version letter; every other field is then unknown
    layout_version: str | None = None
    # a pending record held under a lease: the lease, and ms since its owner last renewed it (by the
    # server's clock); None for every other record
    lease_ms: int | None = None
    since_renewal_ms: int | None = None

    @property
    def liveness(self) -> str | None:
        """``"running"`` (its attempt renews its lease), ``"abandoned"`` (the lease lapsed: the
        attempt is gone or hung, and the call is in doubt), or None (no lease to tell by)."""
        if self.status != "pending" or self.lease_ms is None or self.since_renewal_ms is None:
            return None
        return "running" if self.since_renewal_ms <= self.lease_ms else "abandoned"

    def age_ms(self, now_ms: int | None = None) -> int | None:
        """Milliseconds since the attempt began (None when the record does not say)."""
        if self.begun_ms is None:
            return None
        now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        return max(0, now - self.begun_ms)

    def preview(self, limit: int = 200) -> str | None:
        """The stored result decoded and shortened; None when there is none."""
        if self.value is None:
            return None
        try:
            decoded = decode_result(self.value)
        except ResultDecodingError as exc:
            return f"<undecodable: {exc}>"
        try:
            text = json.dumps(decoded, default=_jsonable, ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError):
            text = repr(decoded)
        text = redact(text)
        return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"

    def as_dict(self, *, preview_chars: int | None = 200) -> dict[str, Any]:
        """The view as JSON-ready data (the value as a preview, never its bytes)."""
        data = asdict(self)
        data.pop("value")
        data["problems"] = list(self.problems)
        data["age_ms"] = self.age_ms()
        data["liveness"] = self.liveness
        if preview_chars is not None:
            data["value_preview"] = self.preview(preview_chars)
        return data


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return {"bytes": value.hex()} if len(value) <= 64 else {"bytes": value[:64].hex() + "…"}
    return str(value)


# the fields a view shows as the record holds them
_AS_RECORDED = (
    "tool_call_id", "tool", "idempotency_key", "owner", "attempt",
    "begun_ms", "committed_ms", "ttl_ms", "stored", "lease_ms", "since_renewal_ms",
)  # fmt: skip


def view_of_record(record: Record, *, with_value: bool = True, value_bytes: int | None = None) -> RecordView:
    """The view of a record as a store's ``get`` answers it (``with_value=False``: as a listing shows
    it, without the value's bytes; ``value_bytes``: the value's size when ``record`` was read
    without it). Its problems are what the guard would refuse it for (``record_corrupt``): no
    idempotency key, tool or owner, a committed value that does not decode."""
    value = record.value if record.stored else None
    if value_bytes is None and value is not None:
        value_bytes = len(value)
    shown = value if with_value else None
    fields = {"key": record.idempotency_key, "tool": record.tool, "owner": record.owner}
    problems = [f"no {name}" for name, text in fields.items() if not text]
    if record.status is Status.COMMITTED and shown is not None:
        try:
            decode_result(shown)
        except ResultDecodingError as exc:
            problems.append(f"value does not decode ({exc})")
    return RecordView(
        **{name: getattr(record, name) for name in _AS_RECORDED},
        status=record.status.value,
        has_mac=bool(record.mac),
        value_bytes=value_bytes,
        value=shown,
        problems=tuple(problems),
    )


# -- listing -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ListFilter:
    """Which records a listing keeps (None: any)."""

    status: str | None = None
    tool: str | None = None
    older_than_s: float | None = None
    liveness: str | None = None  # "running" or "abandoned": pending records under a lease

    def accepts(self, view: RecordView, now_ms: int) -> bool:
        """Whether ``view`` passes the filter at ``now_ms``."""
        if self.status is not None and view.status != self.status:
            return False
        if self.liveness is not None and view.liveness != self.liveness:
            return False
        if self.tool is not None and view.tool != self.tool:
            return False
        if self.older_than_s is not None:
            age = view.age_ms(now_ms)
            if age is None or age < self.older_than_s * 1000:
                return False
        return True


@dataclass(frozen=True)
class ListPage:
    """One page of a listing."""

    records: list[RecordView]
    scanned: int  # keys examined
    next_cursor: str | None  # None: the whole keyspace was covered


ANY_RECORD = ListFilter()
"""The filter that keeps every record (a listing's default)."""


@dataclass(frozen=True)
class ListQuery:
    """What one page of a listing asks for (see :meth:`OperatorStore.list_records`); ValueError for
    bounds that are not positive."""

    where: ListFilter = ANY_RECORD
    limit: int = 50
    scan_count: int = 500
    max_scanned: int = 100_000
    cursor: str | None = None

    def __post_init__(self) -> None:
        if self.limit <= 0 or self.scan_count <= 0 or self.max_scanned <= 0:
            raise ValueError("limit, scan count and max scanned must be positive")


FIRST_PAGE = ListQuery()
"""The first page of every record, with the default bounds."""


def parse_cursor(cursor: str | None, nodes: int) -> tuple[int, int, int]:
    """``node:position:skip`` as a page printed it (``(0, 0, 0)`` for the first page): ValueError for
    text no listing printed, or a node beyond the ``nodes`` this deployment has."""
    if not cursor:
        return 0, 0, 0
    parts = cursor.split(":")
    try:
        node, position, skip = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"not a cursor from a previous list: {cursor!r}") from None
    if node < 0 or position < 0 or skip < 0:
        raise ValueError(f"not a cursor from a previous list: {cursor!r}")
    if node >= nodes:  # a page never names a server the deployment does not have
        raise ValueError(f"not a cursor from a previous list of this deployment: {cursor!r}")
    return node, position, skip


# -- the audit trail ---------------------------------------------------------------------------------
class AuditWriteError(Exception):
    """An audit entry could not be added to the store's audit trail (after the action it describes)."""


def audit_entry(raw: Any, entry_id: Any) -> dict[str, Any]:
    """One stored audit entry (JSON text) as data, with its id as ``stream_id``; an entry that is not
    JSON comes back as ``{"unreadable": text}``."""
    try:
        entry = json.loads(raw)
    except (TypeError, ValueError):
        entry = None
    if not isinstance(entry, dict):
        entry = {"unreadable": _text(raw)}
    entry["stream_id"] = _text(entry_id)
    return entry


def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return str(raw)


# -- the protocol ------------------------------------------------------------------------------------
@runtime_checkable
class OperatorStore(Protocol):
    """The operator's views of one store's records (one namespace of them).

    Reads never raise on odd content (see the module docstring); every operation raises
    :class:`~airlock_redis.core.errors.StoreError` when the store cannot answer."""

    @property
    def namespace(self) -> str:
        """The namespace whose records these are (the audit trail is per namespace too)."""
        ...

    @property
    def store(self) -> EffectStore:
        """The effect store itself: ``EffectGuard(view.store).resolve(...)`` encodes, signs and fences a
        verdict, then applies it through :meth:`resolve`'s transition."""
        ...

    def read_record(self, tool_call_id: str) -> RecordView | None:
        """One record with its value; None when there is none (a released record's tombstone
        included)."""
        ...

    def list_records(self, query: ListQuery = FIRST_PAGE) -> ListPage:
        """Records that pass ``query.where``, at most ``query.limit`` of them, examining about
        ``query.max_scanned`` records (``query.scan_count`` a batch) at most, without their values.
        ``next_cursor`` (text of the form ``node:position:skip``) resumes where the page stopped; a
        record may show up twice, but one that lived through the whole listing is never left out.
        ValueError for a cursor no listing of this store printed."""
        ...

    def resolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        fence: Fence,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        """The operator's verdict, through the store's ``resolve`` transition, applied only while the
        record is still what ``fence`` says the operator was shown: OK, MISSING, MISMATCH or CHANGED
        (see :meth:`~airlock_redis.stores.base.EffectStore.resolve`). This body serves the views that
        subclass the protocol (:class:`StoreViews`); a store's own verdict path may replace it."""
        return self.store.resolve(
            tool_call_id,
            verdict,
            expect_key=fence.key,
            expect_status=fence.status,
            expect_owner=fence.owner,
            value=value,
            mac=mac,
        )

    def append_audit(self, text: str) -> None:
        """Add one audit entry (JSON text) to the namespace's trail, which keeps about
        :data:`AUDIT_MAX_ENTRIES` of them; :class:`AuditWriteError` when the store refuses it."""
        ...

    def read_audit(self, *, limit: int = 20) -> list[dict[str, Any]]:
        """The newest ``limit`` audit entries, newest first (see :func:`audit_entry`)."""
        ...


StoreT = TypeVar("StoreT", bound=EffectStore)


class StoreViews(OperatorStore, Generic[StoreT]):
    """What the operator's views of every store share: the store and the namespace, and (from
    :class:`OperatorStore`) verdicts through the store's own ``resolve``. A store's views add
    ``read_record``, ``list_records`` and the audit trail."""

    def __init__(self, store: StoreT, namespace: str) -> None:
        self._store = store
        self._namespace = namespace

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._store!r})"

    @property
    def namespace(self) -> str:
        """The namespace whose records these are."""
        return self._namespace

    @property
    def store(self) -> StoreT:
        """The store these views read."""
        return self._store


def views_of(store: EffectStore | OperatorStore) -> OperatorStore:
    """The operator's views of ``store``: a store that keeps :class:`OperatorStore` itself, one whose
    ``views_of()`` makes them (the in-memory store), or a :class:`~.redis_store.RedisEffectStore`.
    TypeError for a store that offers none."""
    if isinstance(store, OperatorStore):
        return store
    make = getattr(store, "operator_view", None)
    if callable(make):
        view = make()
        if isinstance(view, OperatorStore):
            return view
    from .redis_store import RedisEffectStore  # not at import time: memory:// needs no redis-py

    if isinstance(store, RedisEffectStore):
        from .redis_operator import RedisOperatorView

        return RedisOperatorView(store)
    raise TypeError(f"{type(store).__name__} offers no operator views (inspect, list, resolve, audit)")
