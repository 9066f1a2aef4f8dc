"""The agent_airlock adapter's hook on agent_airlock's audit log: the guard's fields (``effect``, and
``blocked`` for its refusals) added to the one JSON line agent_airlock writes for a call. Loaded by
``airlock_redis.airlock`` once it has checked the installed agent-airlock."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from agent_airlock.audit import AuditLogger, AuditRecord

from .airlock_state import CALL_NOTE

log = logging.getLogger("airlock_redis")

_HOOKING = threading.Lock()


def install_audit_hook(audit: AuditLogger) -> None:
    """Let the guard add fields (``effect``, and ``blocked`` for its refusals) to the one JSON line
    agent_airlock writes for the call. Installed on a tool's first guarded call, so a logger only
    unguarded tools use is left alone; lines of calls the guard did not see are unchanged."""
    if not audit.enabled or audit.__dict__.get("_airlock_redis_hooked", False):
        return
    with _HOOKING:
        if audit.__dict__.get("_airlock_redis_hooked", False):
            return
        original: Callable[[AuditRecord], None] = audit._write_record

        def write_record(record: AuditRecord) -> None:
            note = CALL_NOTE.get()
            extra = note.audit if note is not None else None
            if extra is None or audit.path is None:
                original(record)
                return
            note.audit = None  # type: ignore[union-attr]
            line = {**record.to_dict(), **extra}
            try:
                with audit._file_lock, open(audit.path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(line, default=str, ensure_ascii=False) + "\n")
            except OSError as exc:
                log.error("airlock_redis: audit log write failed (%s): %s", audit.path, exc)

        audit._write_record = write_record  # type: ignore[method-assign]
        audit._airlock_redis_hooked = True  # type: ignore[attr-defined]
