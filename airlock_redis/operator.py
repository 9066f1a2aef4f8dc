"""What an operator needs around the records: read one, list many, resolve one with an audit line.

The records are reached through the store's operator views (:class:`~.stores.operator_view.OperatorStore`:
:mod:`.stores.redis_operator` for Redis, :class:`~.stores.memory.InMemoryOperatorView` in one
process); this module holds what the commands add around them: durations as operators type and read
them, and the audit log of each verdict (the store's trail, an optional file, stderr). The views'
types and the Redis reads are re-exported here under their old names.
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
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from .redaction import redact
from .stores.operator_view import (
    AuditWriteError,
    ListFilter,
    ListPage,
    ListQuery,
    OperatorStore,
    RecordView,
    views_of,
)
from .stores.redis_operator import (
    AUDIT_STREAM_MAXLEN,
    OPERATOR_COMMANDS,
    audit_stream_key,
    list_records,
    read_audit,
    read_record,
    scan_nodes,
    view_from_string,
)

__all__ = [
    "AUDIT_LOG_ENV",
    "AUDIT_STREAM_MAXLEN",
    "OPERATOR_COMMANDS",
    "AuditLog",
    "AuditWriteError",
    "ListFilter",
    "ListPage",
    "ListQuery",
    "OperatorStore",
    "RecordView",
    "audit_log_path",
    "audit_stream_key",
    "digest",
    "format_duration",
    "list_records",
    "parse_duration",
    "read_audit",
    "read_record",
    "scan_nodes",
    "view_from_string",
    "views_of",
]

AUDIT_LOG_ENV = "AIRLOCK_REDIS_AUDIT_LOG"

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


# -- the audit trail -------------------------------------------------------------------------------
def audit_log_path(given: str | None) -> Path | None:
    """The optional audit file: ``--audit-log``, else ``$AIRLOCK_REDIS_AUDIT_LOG``, else none."""
    chosen = given or os.environ.get(AUDIT_LOG_ENV)
    return Path(chosen) if chosen else None


class AuditLog:
    """One JSON entry per operator action: to the store's audit trail (for Redis, the namespace's capped
    stream, where every operator and machine sees it: ``airlock-redis audit``), to an optional
    JSON-lines file, and to stderr.

    The file, when there is one, is opened before the action, so an action that cannot be audited
    there is not taken. The trail's entry is written after the action, with its result; if the store
    refuses it (a Redis ACL without XADD), :meth:`write` raises :class:`AuditWriteError` once the file
    and stderr have the entry.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        trail: OperatorStore | None = None,
        echo: IO[str] | None = None,
    ) -> None:
        self.path = path
        self._trail = trail
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
        if self._trail is not None:
            self._trail.append_audit(text)  # AuditWriteError when the store refuses it
        return line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _operator_name() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def digest(value: bytes | None) -> str | None:
    return hashlib.sha256(value).hexdigest() if value is not None else None
