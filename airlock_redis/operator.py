"""What an operator needs around the records: read one, list many, resolve one with an audit line.

Reading here is tolerant on purpose: a record that the guard refuses as corrupt (unknown status,
missing fields, damaged value) is exactly the one an operator has to look at, so nothing in this
module raises on odd content; it reports it in ``RecordView.problems``.

Listing SCANs (with MATCH and COUNT, never KEYS) every primary of a Redis Cluster, or the one
server otherwise, and stops after a bounded number of keys; a cursor lets the caller page on.
"""

from __future__ import annotations

import datetime as dt
import errno
import getpass
import hashlib
import json
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from .core.codec import decode_result
from .core.errors import ResultDecodingError, StoreError
from .core.records import Status
from .redaction import redact
from .stores.keys import record_key, record_pattern, tool_call_id_of
from .stores.layout import LayoutError, LayoutVersionError, fields_end, parse

AUDIT_LOG_ENV = "AIRLOCK_REDIS_AUDIT_LOG"

# What the operator commands send besides the store's own commands (stores.acl.required_commands():
# resolve runs the store's resolve script, inspect reads like the store): list SCANs and reads the
# head of each record (GETRANGE, STRLEN, PTTL), resolve appends to the audit stream and audit reads
# it. docs/security.md lists them.
OPERATOR_COMMANDS: tuple[str, ...] = ("scan", "getrange", "strlen", "xadd", "xrevrange")
_HEAD_BYTES = 512  # a listing reads this much of each record (more only when its fields are longer)
# the view of a key that holds a list, a hash, a set...: no record (as the store says it)
_NOT_A_STRING = "the key holds another Redis type, not a string: not a record"

# -- durations -----------------------------------------------------------------------------------
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``"10m"`` -> 600.0 seconds. Units: ms, s, m, h, d; a bare number is refused (is "10" ten
    seconds or ten minutes?)."""
    match = _DURATION_RE.match(text)
    if match is None:
        hint = "give it a unit" if re.match(r"^\s*\d+(?:\.\d+)?\s*$", text) else "not a duration"
        raise ValueError(f"{hint}: {text!r} (examples: 90s, 10m, 2h, 1d; units ms, s, m, h, d)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def format_duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


# -- one record, as read raw -----------------------------------------------------------------------
def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return str(raw)


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

    def age_ms(self, now_ms: int | None = None) -> int | None:
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
        data = asdict(self)
        data.pop("value")
        data["problems"] = list(self.problems)
        data["age_ms"] = self.age_ms()
        if preview_chars is not None:
            data["value_preview"] = self.preview(preview_chars)
        return data


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return {"bytes": value.hex()} if len(value) <= 64 else {"bytes": value[:64].hex() + "…"}
    return str(value)


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
    problems: list[str] = []
    for name, raw in (("key", record.key), ("tool", record.tool), ("owner", record.owner)):
        if not raw:
            problems.append(f"no {name}")
    value = record.value if record.stored and total is None else None
    value_bytes = None
    if record.stored:
        value_bytes = len(record.value) if total is None else max(0, total - record.value_at)
    if record.status == Status.COMMITTED.value and value is not None:
        try:
            decode_result(value)
        except ResultDecodingError as exc:
            problems.append(f"value does not decode ({exc})")
    return RecordView(
        tool_call_id=tool_call_id,
        status=record.status,
        tool=record.tool_text,
        idempotency_key=record.key_text,
        owner=record.owner_text,
        attempt=record.attempt,
        begun_ms=record.begun_ms,
        committed_ms=record.committed_ms,
        ttl_ms=ttl_ms,
        stored=record.stored,
        has_mac=bool(record.mac),
        value_bytes=value_bytes,
        value=value,
        problems=tuple(problems),
    )


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
        raise StoreError(redact(f"Redis did not answer: {type(exc).__name__}: {exc}")) from exc
    if data is None:
        return None
    return view_from_string(tool_call_id, data, int(pttl))


# -- listing ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ListFilter:
    status: str | None = None
    tool: str | None = None
    older_than_s: float | None = None

    def accepts(self, view: RecordView, now_ms: int) -> bool:
        if self.status is not None and view.status != self.status:
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
    records: list[RecordView]
    scanned: int  # keys examined
    next_cursor: str | None  # None: the whole keyspace was covered


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


def _parse_cursor(cursor: str | None) -> tuple[int, int, int]:
    if not cursor:
        return 0, 0, 0
    parts = cursor.split(":")
    try:
        node, position, skip = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"not a cursor from a previous list: {cursor!r}") from None
    if node < 0 or position < 0 or skip < 0:
        raise ValueError(f"not a cursor from a previous list: {cursor!r}")
    return node, position, skip


def list_records(
    client: Any,
    namespace: str,
    *,
    where: ListFilter = ListFilter(),
    limit: int = 50,
    scan_count: int = 500,
    max_scanned: int = 100_000,
    cursor: str | None = None,
) -> ListPage:
    """Records of ``namespace`` that pass ``where``, at most ``limit`` of them, examining at most
    about ``max_scanned`` keys. ``next_cursor`` resumes where this page stopped (``node:scan
    cursor:records of that batch already shown``); like SCAN itself, a record may show up twice."""
    if limit <= 0 or scan_count <= 0 or max_scanned <= 0:
        raise ValueError("limit, scan count and max scanned must be positive")
    node_index, position, skip = _parse_cursor(cursor)
    nodes = scan_nodes(client)
    if node_index >= len(nodes):  # a page never names a server the deployment does not have
        raise ValueError(f"not a cursor from a previous list of this deployment: {cursor!r}")
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
        raise StoreError(redact(f"Redis did not answer: {type(exc).__name__}: {exc}")) from exc
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


# -- the audit trail -------------------------------------------------------------------------------
AUDIT_STREAM_MAXLEN = 10_000  # entries kept per namespace (approximately: XADD MAXLEN ~)


def audit_stream_key(namespace: str) -> str:
    """The namespace's audit stream: beside the records (same ACL key pattern), never a record key."""
    return f"{namespace}:audit"


def audit_log_path(given: str | None) -> Path | None:
    """The optional audit file: ``--audit-log``, else ``$AIRLOCK_REDIS_AUDIT_LOG``, else none."""
    chosen = given or os.environ.get(AUDIT_LOG_ENV)
    return Path(chosen) if chosen else None


class AuditWriteError(Exception):
    """An audit entry could not be written to the stream (after the action it describes)."""


class AuditLog:
    """One JSON entry per operator action: to the namespace's capped Redis stream, where every
    operator and machine sees it (``airlock-redis audit``), to an optional JSON-lines file, and to
    stderr.

    The file, when there is one, is opened before the action, so an action that cannot be audited
    there is not taken. The stream entry is written after the action, with its result; if Redis
    refuses it (an ACL without XADD), :meth:`write` raises :class:`AuditWriteError` once the file
    and stderr have the entry.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        client: Any = None,
        namespace: str | None = None,
        echo: IO[str] | None = None,
    ) -> None:
        self.path = path
        self._client = client
        self._stream = audit_stream_key(namespace) if namespace is not None else None
        self._echo = echo if echo is not None else sys.stderr
        self._file = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115

    def write(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        line: dict[str, Any] = {
            "ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
            "operator": _operator_name(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            **entry,
        }
        text = redact(json.dumps(line, sort_keys=True, ensure_ascii=False, default=str))
        if self._file is not None:
            self._file.write(text + "\n")
            self._file.flush()
            try:
                os.fsync(self._file.fileno())
            except OSError as exc:  # a pipe or a device (/dev/stderr) cannot be synced; a file can
                if exc.errno != errno.EINVAL:
                    raise
        print(f"audit: {text}", file=self._echo)
        if self._client is not None and self._stream is not None:
            try:
                self._client.xadd(self._stream, {"entry": text}, maxlen=AUDIT_STREAM_MAXLEN, approximate=True)
            except Exception as exc:
                raise AuditWriteError(redact(f"{type(exc).__name__}: {exc}")) from exc
        return line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_audit(client: Any, namespace: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` entries of the namespace's audit stream, newest first."""
    try:
        rows = client.xrevrange(audit_stream_key(namespace), count=limit)
    except Exception as exc:
        raise StoreError(redact(f"Redis did not answer: {type(exc).__name__}: {exc}")) from exc
    entries = []
    for stream_id, fields in rows:
        raw = fields.get(b"entry", fields.get("entry"))
        try:
            entry = json.loads(raw)
        except (TypeError, ValueError):
            entry = {"unreadable": _text(raw)}
        entry["stream_id"] = _text(stream_id)
        entries.append(entry)
    return entries


def _operator_name() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def digest(value: bytes | None) -> str | None:
    return hashlib.sha256(value).hexdigest() if value is not None else None
