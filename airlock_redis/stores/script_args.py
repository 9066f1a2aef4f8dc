"""The arguments of each transition script, packed as ``lua/`` reads them, and the command each
script travels as.

Owner tokens and idempotency keys travel packed (:func:`.layout.pack_id`); TTLs in milliseconds. One
:class:`ScriptArgs` per store, made from its TTLs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import time
from typing import Any, NamedTuple

from ..core.records import BeginRequest, Settlement, Status
from .base import check_verdict
from .layout import pack_committed_head, pack_key, pack_pending, pack_token
from .scripts import SCRIPT_NAMES, script_bytes, script_source
from .server_facts import DEFAULT_MAX_BULK
from .ttl import TOMBSTONE_TTL, StatusTTLs

log = logging.getLogger("airlock_redis")

TOMBSTONE_MS = round(TOMBSTONE_TTL * 1000)
# At most this many first records are remembered for their commits (see ScriptArgs.first_record): a
# call whose entry was dropped (more calls than this under way at once) commits through the script's
# general path, as before.
REMEMBERED_FIRSTS = 8192
SHAS = {name: hashlib.sha1(script_source(name).encode("utf-8")).hexdigest() for name in SCRIPT_NAMES}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def tool_bytes(tool: str) -> bytes:
    """A tool's name as the records hold it: UTF-8, a lone surrogate kept as its three bytes (a name
    that ``json.loads`` made from a model's escaped text), so that every store takes every name."""
    return tool.encode("utf-8", "surrogatepass")


class ScriptArgs:
    """Each script's arguments for one store (its TTLs, and the largest value its server takes)."""

    __slots__ = ("_firsts", "committed_ms", "max_value_bytes", "pending", "pending_ms", "ttls", "unknown_ms")

    def __init__(self, ttls: StatusTTLs) -> None:
        self.ttls = ttls
        self.pending = ttls.millis(Status.PENDING)
        self.pending_ms = str(self.pending).encode()
        self.committed_ms = str(ttls.millis(Status.COMMITTED)).encode()
        self.unknown_ms = str(ttls.millis(Status.UNKNOWN)).encode()
        # proto-max-bulk-len of the primaries, once read (a larger value is committed without it)
        self.max_value_bytes = DEFAULT_MAX_BULK
        # owner token -> what a begin's SET NX wrote for it, until its commit or settle: see first_record
        self._firsts: dict[str, _First] = {}

    def first_record(self, request: BeginRequest) -> bytes:
        """The pending record lua/begin.lua writes for attempt 1 where the key holds nothing, so
        that a begin can write it with a plain ``SET NX PX`` (no script, the common case). Its
        bytes are remembered for the attempt's commit, which sends them with the committed record
        made of them (see :meth:`commit`); a begin that did not land leaves an entry no record
        matches, dropped at the attempt's commit or settle or when there are too many."""
        owner, key, tool = (
            pack_token(request.token),
            pack_key(request.idempotency_key),
            tool_bytes(request.tool),
        )
        begun = now_ms()
        record = pack_pending(owner, key, tool, begun, request.lease_ms, self.pending)
        firsts = self._firsts
        firsts[request.token] = _First(record, owner, key, tool, begun, _call_of(request))
        if len(firsts) > REMEMBERED_FIRSTS:
            with contextlib.suppress(RuntimeError, StopIteration, KeyError):  # another thread's change
                del firsts[next(iter(firsts))]
        return record

    def begin(self, request: BeginRequest) -> list[Any]:
        lease = request.lease_ms
        return [
            pack_key(request.idempotency_key),
            tool_bytes(request.tool),
            pack_token(request.token),
            b"1" if request.reversible else b"0",
            self.pending_ms,
            now_ms(),
            b"" if lease is None else b"%d" % lease,
            b"1" if request.probes else b"0",
        ]

    @staticmethod
    def renew(request: BeginRequest) -> list[Any]:
        return [pack_token(request.token)]

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> list[Any]:
        if value is not None and len(value) > self.max_value_bytes:
            log.warning(
                "airlock_redis: the result of %s under tool_call_id=%r is %d bytes, over the server's "
                "proto-max-bulk-len (%d): it is committed without its value, and replays are refused "
                "(result_not_stored)",
                request.tool,
                request.tool_call_id,
                len(value),
                self.max_value_bytes,
            )
            value, mac = None, None
        stored, data = (b"0", b"") if value is None else (b"1", value)
        mac = mac or b""
        now = now_ms()
        first = self._firsts.pop(request.token, None)
        # only the begin of this very call (a token is an attempt's, but a caller may reuse one)
        if first is None or attempt != 1 or first.of != _call_of(request):
            owner, key, tool = (
                pack_token(request.token),
                pack_key(request.idempotency_key),
                tool_bytes(request.tool),
            )
            return [owner, stored, data, mac, self.committed_ms, now, key, tool, attempt]
        # what the begin wrote, and the committed record over it but for the value: when the key still
        # holds exactly those bytes, the script writes these without reading the record
        head = pack_committed_head(
            first.owner, first.key, first.tool, first.begun, now, value is not None, mac
        )
        return [
            first.owner,
            stored,
            data,
            mac,
            self.committed_ms,
            now,
            first.key,
            first.tool,
            attempt,
            first.record,
            head,
        ]

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> list[Any]:
        self._firsts.pop(request.token, None)
        return [
            pack_token(request.token),
            settlement.value,
            self.unknown_ms,
            pack_key(request.idempotency_key),
            tool_bytes(request.tool),
            attempt,
            TOMBSTONE_MS,
        ]

    def resolve(  # noqa: PLR0917 - one argument per script argument, passed through
        self,
        verdict: Status | Settlement,
        expect_key: str | None,
        expect_status: Status | None,
        expect_owner: str | None,
        value: bytes | None,
        mac: bytes | None,
    ) -> list[Any]:
        verdict = check_verdict(verdict)
        if verdict is Settlement.RELEASE:
            name, ttl = "release", TOMBSTONE_MS
        elif verdict is Status.COMMITTED:
            name, ttl = "committed", self.ttls.millis(Status.COMMITTED)
        else:
            name, ttl = "unknown", self.ttls.millis(Status.UNKNOWN)
        # made once: a client's re-send carries the same token, and the script answers "ok" to it
        owner = "operator:" + secrets.token_hex(8)
        stored = "1" if value is not None else "0"
        status = expect_status.value if expect_status is not None else ""
        return [
            name,
            pack_key(expect_key) if expect_key else b"",
            pack_token(owner),
            stored,
            value or b"",
            mac or b"",
            ttl,
            now_ms(),
            status,
            pack_token(expect_owner) if expect_owner else b"",
        ]


class ScriptCommand:
    """The command a transition script travels as, try by try (see :mod:`.redis_store`): the first
    try an ``EVALSHA`` unless ``with_source``; every re-send, and the answer to NOSCRIPT, an ``EVAL``
    with the source."""

    __slots__ = ("_args", "_name", "_tries")

    def __init__(self, name: str, key: bytes, args: list[Any], with_source: bool) -> None:
        self._name = name
        self._args = (1, key, *args)
        self._tries = 1 if with_source else 0

    def next_try(self) -> tuple[Any, ...]:
        self._tries += 1
        if self._tries == 1:
            return ("EVALSHA", SHAS[self._name], *self._args)
        return self.with_source()

    def with_source(self) -> tuple[Any, ...]:
        return ("EVAL", script_bytes(self._name), *self._args)


def _call_of(request: BeginRequest) -> tuple[str, str, str]:
    """What a commit must share with a begin to use the bytes that begin wrote."""
    return (request.tool_call_id, request.idempotency_key, request.tool)


class _First(NamedTuple):
    """What a begin's ``SET NX`` wrote (``record``), and the fields the commit's record is made of."""

    record: bytes
    owner: bytes
    key: bytes
    tool: bytes
    begun: int
    of: tuple[str, str, str]  # the begin's tool_call_id, idempotency key and tool
