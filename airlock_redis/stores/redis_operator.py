"""The operator's views of the Redis store (:class:`~.operator_view.OperatorStore`):
:class:`RedisOperatorView`, and the raw reads it is made of.

A record is read raw (GET and PTTL) and parsed tolerantly (see :mod:`.layout`). Listing SCANs (with
MATCH and COUNT, never KEYS) every primary of a Redis Cluster, or the one server otherwise, reads the
head of each record (GETRANGE, never the value), and stops after a bounded number of keys; a cursor
lets the caller page on. The audit trail is a capped stream beside the records (``<namespace>:audit``).
A verdict goes through the store's ``resolve`` script.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..core.errors import StoreError
from ..redaction import redact
from .keys import record_key, record_pattern, tool_call_id_of
from .layout import LayoutError, LayoutVersionError, fields_end, parse
from .operator_view import (
    AUDIT_MAX_ENTRIES,
    FIRST_PAGE,
    AuditWriteError,
    ListPage,
    ListQuery,
    RecordView,
    StoreViews,
    audit_entry,
    parse_cursor,
    view_of_record,
)
from .redis_store import RedisEffectStore
from .replies import parse_record

# What the operator commands send besides the store's own commands (stores.acl.required_commands():
# resolve runs the store's resolve script, inspect reads like the store): list SCANs and reads the
# head of each record (GETRANGE, STRLEN, PTTL), resolve appends to the audit stream and audit reads
# it. docs/security.md lists them.
OPERATOR_COMMANDS: tuple[str, ...] = ("scan", "getrange", "strlen", "xadd", "xrevrange")
AUDIT_STREAM_MAXLEN = AUDIT_MAX_ENTRIES  # entries kept per namespace (approximately: XADD MAXLEN ~)
_HEAD_BYTES = 512  # a listing reads this much of each record (more only when its fields are longer)
# the view of a key that holds a list, a hash, a set...: no record (as the store says it)
_NOT_A_STRING = "the key holds another Redis type, not a string: not a record"


class RedisOperatorView(StoreViews[RedisEffectStore]):
    """:class:`~.operator_view.OperatorStore` over a :class:`~.redis_store.RedisEffectStore`: its
    blocking client, its namespace, its ``resolve`` script. Only the store's public face is used."""

    def __init__(self, store: RedisEffectStore) -> None:
        super().__init__(store, store.namespace)

    def read_record(self, tool_call_id: str) -> RecordView | None:
        """One record, read raw (any content; see :func:`read_record`)."""
        return read_record(self.store.client, self.namespace, tool_call_id)

    def list_records(self, query: ListQuery = FIRST_PAGE) -> ListPage:
        """A page of records, SCANned on every primary (see :func:`list_records`)."""
        return scan_page(self.store.client, self.namespace, query)

    def append_audit(self, text: str) -> None:
        """XADD the entry to the namespace's capped audit stream."""
        stream = audit_stream_key(self.namespace)
        try:
            self.store.client.xadd(stream, {"entry": text}, maxlen=AUDIT_STREAM_MAXLEN, approximate=True)
        except Exception as exc:
            raise AuditWriteError(redact(f"{type(exc).__name__}: {exc}")) from exc

    def read_audit(self, *, limit: int = 20) -> list[dict[str, Any]]:
        """The newest ``limit`` entries of the audit stream, newest first."""
        return read_audit(self.store.client, self.namespace, limit=limit)


# -- one record, as read raw ---------------------------------------------------------------------------
def view_from_string(
    tool_call_id: str, data: bytes, pttl: int | None, *, total: int | None = None
) -> RecordView | None:
    """Build a view from a record's string (see stores.layout). ``total`` is the string's length when
    ``data`` stops where the value starts (a listing reads no value). None for a tombstone."""
    ttl_ms = _ttl(pttl) if pttl is not None else None
    try:
        record = parse(data)
    except LayoutVersionError as exc:
        return _damaged(
            tool_call_id,
            ttl_ms,
            f"written by a newer airlock-redis (layout {exc.version}): upgrade airlock-redis on this "
            "host to read or resolve it",
            layout_version=exc.version,
        )
    except LayoutError as exc:
        return _damaged(tool_call_id, ttl_ms, str(exc))
    if record.is_tombstone:
        return None
    whole = parse_record(tool_call_id, data, pttl if pttl is not None else -1)  # parses again, as get does
    assert whole is not None  # not a tombstone
    if total is None:
        return view_of_record(whole)
    value_bytes = max(0, total - record.value_at) if record.stored else None
    return view_of_record(whole, with_value=False, value_bytes=value_bytes)


def _damaged(
    tool_call_id: str, ttl_ms: int | None, problem: str, *, layout_version: str | None = None
) -> RecordView:
    """A key that holds no record this airlock-redis can read: nothing but the problem to show."""
    return RecordView(
        tool_call_id=tool_call_id,
        status=None,
        tool=None,
        idempotency_key=None,
        owner=None,
        attempt=None,
        begun_ms=None,
        committed_ms=None,
        ttl_ms=ttl_ms,
        stored=False,
        has_mac=False,
        value_bytes=None,
        problems=(problem,),
        layout_version=layout_version,
    )


def _ttl(pttl: int) -> int | None:
    return pttl if pttl >= 0 else None


def _is_wrongtype(reply: Any) -> bool:
    return isinstance(reply, Exception) and "WRONGTYPE" in str(reply)


def _no_answer(exc: Exception) -> StoreError:
    return StoreError(redact(f"Redis did not answer: {type(exc).__name__}: {exc}"))


def read_record(client: Any, namespace: str, tool_call_id: str) -> RecordView | None:
    """One record, read raw (works on any content). None when there is no such key."""
    key = record_key(namespace, tool_call_id)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        data, pttl = pipe.execute(raise_on_error=False)
        if isinstance(pttl, Exception):
            raise pttl
        if _is_wrongtype(data):
            return _damaged(tool_call_id, _ttl(int(pttl)), _NOT_A_STRING)
        if isinstance(data, Exception):
            raise data
    except Exception as exc:
        raise _no_answer(exc) from exc
    if data is None:
        return None
    return view_from_string(tool_call_id, data, int(pttl))


# -- listing -----------------------------------------------------------------------------------------
def scan_nodes(client: Any) -> list[Any]:
    """Clients to SCAN: one per primary of a Redis Cluster, else the client itself."""
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py always ships it
        return [client]
    if isinstance(client, RedisCluster):
        primaries = sorted(client.get_primaries(), key=lambda n: str(n.name))
        return [client.get_redis_connection(node) for node in primaries]
    return [client]


def list_records(client: Any, namespace: str, **query: Any) -> ListPage:
    """``list_records(client, namespace, where=..., limit=..., scan_count=..., max_scanned=...,
    cursor=...)``: :func:`scan_page` of a :class:`~.operator_view.ListQuery` of these arguments."""
    return scan_page(client, namespace, ListQuery(**query))


def scan_page(client: Any, namespace: str, query: ListQuery) -> ListPage:
    """Records of ``namespace`` that pass ``query.where``, at most ``query.limit`` of them, examining
    at most about ``query.max_scanned`` keys. ``next_cursor`` resumes where this page stopped
    (``node:scan cursor:records of that batch already shown``); like SCAN itself, a record may show
    up twice."""
    where, limit, scan_count, max_scanned = query.where, query.limit, query.scan_count, query.max_scanned
    nodes = scan_nodes(client)
    node_index, position, skip = parse_cursor(query.cursor, len(nodes))
    pattern = record_pattern(namespace)
    found: list[RecordView] = []
    scanned = 0
    now_ms = time.time_ns() // 1_000_000
    try:
        while node_index < len(nodes):
            node = nodes[node_index]
            batch_start = position
            next_position, keys = node.scan(cursor=position, match=pattern, count=scan_count)
            scanned += len(keys)
            accepted = [v for v in _read_views(node, namespace, keys) if where.accepts(v, now_ms)]
            accepted = accepted[skip:]
            room = limit - len(found)
            if len(accepted) > room:
                found.extend(accepted[:room])
                return ListPage(found, scanned, f"{node_index}:{batch_start}:{skip + room}")
            found.extend(accepted)
            skip = 0
            position = int(next_position)
            if position == 0:
                node_index += 1
            if len(found) >= limit or scanned >= max_scanned:
                break
    except Exception as exc:
        raise _no_answer(exc) from exc
    done = node_index >= len(nodes)
    return ListPage(found, scanned, None if done else f"{node_index}:{position}:0")


def _read_views(node: Any, namespace: str, keys: Sequence[Any]) -> Iterator[RecordView]:
    """The head of each record (never its value), one pipelined round trip for most keys."""
    parsed: list[tuple[Any, str]] = []
    for key in keys:
        # parsed from the left (the namespace is known): an id holding ":{<16 hex digits>}:" is
        # still this namespace's, and a key of "<namespace>:eu" is not
        tool_call_id = tool_call_id_of(namespace, key)
        if tool_call_id is not None:
            parsed.append((key, tool_call_id))
    if not parsed:
        return
    pipe = node.pipeline(transaction=False)
    for key, _ in parsed:
        pipe.getrange(key, 0, _HEAD_BYTES - 1)
        pipe.strlen(key)
        pipe.pttl(key)
    replies = pipe.execute(raise_on_error=False)
    for i, (key, tool_call_id) in enumerate(parsed):
        head, total, pttl = replies[3 * i : 3 * i + 3]
        if isinstance(pttl, Exception):
            raise pttl
        view: RecordView | None
        if _is_wrongtype(head):
            view = _damaged(tool_call_id, _ttl(int(pttl)), _NOT_A_STRING)
        elif isinstance(head, Exception):
            raise head
        elif int(pttl) == -2:
            continue  # expired or deleted since the SCAN
        else:
            view = view_from_string(tool_call_id, _head(node, key, head), int(pttl), total=int(total))
        if view is not None:  # None: a released record's tombstone
            yield view


def _head(node: Any, key: Any, head: bytes) -> bytes:
    """The header and fields of a record whose first bytes are ``head`` (read again, once, when its
    fields run past them: a long tool name, many released tokens)."""
    try:
        end = fields_end(head)
    except LayoutError:
        return head  # not a record: parsing it again says why
    if end <= len(head):
        return head[:end]
    longer: bytes | None = node.getrange(key, 0, end - 1)
    return longer or head


# -- the audit trail ---------------------------------------------------------------------------------
def audit_stream_key(namespace: str) -> str:
    """The namespace's audit stream: beside the records (same ACL key pattern), never a record key."""
    return f"{namespace}:audit"


def read_audit(client: Any, namespace: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` entries of the namespace's audit stream, newest first."""
    try:
        rows = client.xrevrange(audit_stream_key(namespace), count=limit)
    except Exception as exc:
        raise _no_answer(exc) from exc
    return [audit_entry(fields.get(b"entry", fields.get("entry")), stream_id) for stream_id, fields in rows]
