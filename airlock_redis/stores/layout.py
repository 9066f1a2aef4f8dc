"""A record as Redis holds it: one string, a compact header, the fields, then the stored result.

::

    a<status>,<attempt>,<begun>,<committed>,<stored>,<#owner>,<#key>,<#tool>,<#mac>,<#released>;
    <owner><key><tool><mac><released><value>

``a`` is the layout's version (see "Versions" below). ``status`` is one letter (``p`` pending,
``c`` committed, ``u`` unknown, ``r`` released: a tombstone). ``attempt``, the two timestamps (ms
since the epoch, empty when not known) and the byte lengths of the five fields that follow are
decimal; ``stored`` is ``1`` when a committed value is kept. The value runs to the end of the string.
``released`` lists every token that gave the record back while the key lives, each as
``<length>:<bytes>``.

One string, not a hash: a hash whose value is over 64 bytes leaves its compact encoding and costs about
1 KB more per record; a string costs its length, rounded up by the allocator. The Lua scripts
(``lua/common.lua``) read and write the same format with ``string.find``/``string.sub`` only, and this
module is its Python mirror: the store's reads, the operator's views, and tests that build or damage
records use it.

Owner tokens and idempotency keys are packed (:func:`pack_id`): the hex a guard makes (32 digits for a
token, 64 for a key) is stored as its raw bytes, any other text as itself. The scripts receive them
packed and compare bytes; readers unpack them, so :class:`~airlock_redis.core.records.Record` keeps its
hex strings.

Versions: the first byte of a record is its layout version, a lowercase letter (this layout: ``a``).
Every layout, this one and any later one, begins with a header of one shape: the version letter, a
lowercase letter (here the status), then lowercase letters, digits and commas up to the first ``;``.
A string of that shape whose letter this reader does not know (``b`` to ``z``) is a record of a newer
airlock-redis: :class:`LayoutVersionError`, which the store raises as
:class:`~airlock_redis.core.records.RecordVersionError` (the guard refuses the call, no script writes
over the record, the message says to upgrade). Anything else that does not parse is corrupt
(:class:`LayoutError`). Why the shape and not "any first byte but ``a``": bytes that merely do not
start with ``a`` (written by something else; a record cut at the start, which begins ``c,`` or
``p,``) stay corrupt, which an operator may resolve; a record of a newer layout is never taken for a
damaged one (which an operator of an older host could resolve away) as long as later layouts keep
the shape; and a damaged string that happens to look like a newer header is still refused, only
saying "upgrade" for "corrupt". The scripts apply the same rule (``lua/common.lua``,
``OTHER_VERSION``); docs/store.md says how to roll an upgrade across hosts.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.records import LAYOUT_VERSION, LEASED_LAYOUT_VERSION, RELEASED, Holder, Status

VERSION = LAYOUT_VERSION.encode("ascii")
LEASED_VERSION = LEASED_LAYOUT_VERSION.encode("ascii")
TOKEN_HEX = 32  # a guard's owner token: secrets.token_hex(16)
KEY_HEX = 64  # an idempotency key: a sha256 in hex
_CODES = {"pending": b"p", "committed": b"c", "unknown": b"u", RELEASED: b"r"}
_STATUSES = {code[0]: name for name, code in _CODES.items()}
_HEADER = re.compile(
    re.escape(VERSION)
    + rb"(.),([0-9]+),([0-9]*),([0-9]*),([01]),([0-9]+),([0-9]+),([0-9]+),([0-9]+),([0-9]+);",
    re.DOTALL,
)
# layout b: a pending record held under a lease; two more numbers after ``stored``: the lease and the
# TTL the record was last written with (ms)
_LEASED_HEADER = re.compile(
    re.escape(LEASED_VERSION)
    + rb"(.),([0-9]+),([0-9]*),([0-9]*),([01]),([0-9]+),([0-9]+),([01]),"
    + rb"([0-9]+),([0-9]+),([0-9]+),([0-9]+),([0-9]+);",
    re.DOTALL,
)
# the shape every layout version's header keeps: a record of a version this one does not know
_OTHER_VERSION = re.compile(rb"([c-z])[a-z][0-9a-z,]*;")
_ENTRY = re.compile(rb"([0-9]+):")
# the first pending record (pack_pending): header and fields, in one formatting step
_PENDING = VERSION + _CODES["pending"] + b",1,%d,,0,%d,%d,%d,0,0;%s%s%s"
_LEASED_PENDING = LEASED_VERSION + _CODES["pending"] + b",1,%d,,0,%d,%d,0,%d,%d,%d,0,0;%s%s%s"
_COMMITTED_FIRST = VERSION + _CODES["committed"] + b",1,%d,%d,%s,%d,%d,%d,%d,0;%s%s%s%s"


class LayoutError(ValueError):
    """Bytes that are not a record of this layout; the message says why (as the scripts say it)."""


class LayoutVersionError(LayoutError):
    """A record of a layout version this one does not know (a newer airlock-redis wrote it).
    ``version`` is its version letter; the message is the one the scripts give."""

    def __init__(self, version: str) -> None:
        self.version = version
        super().__init__(f"the record was written by a newer airlock-redis (record layout version {version})")


def pack_id(text: str, hex_digits: int) -> bytes:
    """An owner token (``hex_digits`` 32) or idempotency key (64) as records hold it: ``hex_digits``
    lowercase hex digits -> their bytes; any other text -> its UTF-8, with a NUL added when that is
    ``hex_digits / 2`` bytes or longer, so that no text packs like hex. One-to-one: equal packs mean
    equal texts, which is all the scripts compare."""
    if len(text) == hex_digits:
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            pass
        else:
            if raw.hex() == text:  # lowercase, and no blanks (which fromhex skips)
                return raw
    raw = text.encode("utf-8")
    return raw + b"\x00" if len(raw) >= hex_digits // 2 else raw


def unpack_id(raw: bytes, hex_digits: int) -> str:
    """The text :func:`pack_id` packed (bytes that are not valid UTF-8 are replaced, never raised)."""
    if len(raw) == hex_digits // 2:
        return raw.hex()
    if len(raw) > hex_digits // 2 and raw.endswith(b"\x00"):
        raw = raw[:-1]
    return raw.decode("utf-8", "replace")


def pack_token(token: str) -> bytes:
    return pack_id(token, TOKEN_HEX)


def pack_key(idempotency_key: str) -> bytes:
    return pack_id(idempotency_key, KEY_HEX)


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record, as its string holds it (owner, key and released tokens packed)."""

    status: str  # pending, committed, unknown, or released (a tombstone)
    attempt: int = 0
    begun_ms: int | None = None
    committed_ms: int | None = None
    stored: bool = False
    owner: bytes = b""
    key: bytes = b""
    tool: bytes = b""
    mac: bytes = b""
    released: tuple[bytes, ...] = ()
    value: bytes = b""
    value_at: int = field(default=0, compare=False)  # where the value starts in the string (parse)
    # layout b, a pending record under a lease: the lease and the TTL it was last written with (ms);
    # None for every other record (layout a)
    lease_ms: int | None = None
    ttl_ms: int | None = None
    waited: bool = False  # layout b: a call waits for this attempt to end (its end publishes)

    @property
    def owner_text(self) -> str:
        return unpack_id(self.owner, TOKEN_HEX)

    @property
    def key_text(self) -> str:
        return unpack_id(self.key, KEY_HEX)

    @property
    def tool_text(self) -> str:
        return self.tool.decode("utf-8", "replace")

    @property
    def is_tombstone(self) -> bool:
        return self.status == RELEASED

    def record_status(self) -> Status | None:
        """The status as :class:`Status`; None for a tombstone."""
        return None if self.is_tombstone else Status(self.status)


def _number(value: int | None) -> bytes:
    return b"" if value is None else str(value).encode("ascii")


def is_leased(record: StoredRecord) -> bool:
    """Written in layout b: a pending record held under a lease (every other record is layout a)."""
    return record.status == "pending" and record.lease_ms is not None


def pack(record: StoredRecord) -> bytes:
    """The string the scripts write for ``record``."""
    released = b"".join(b"%d:%s" % (len(token), token) for token in record.released)
    fields = (record.owner, record.key, record.tool, record.mac, released)
    leased = is_leased(record)
    waited = b"1" if record.waited else b"0"
    lease = (_number(record.lease_ms), _number(record.ttl_ms or 0), waited) if leased else ()
    numbers = (
        _number(record.attempt),
        _number(record.begun_ms),
        _number(record.committed_ms),
        b"1" if record.stored else b"0",
        *lease,
        *(_number(len(f)) for f in fields),
    )
    version = LEASED_VERSION if leased else VERSION
    return b"".join((version, _CODES[record.status], b",", b",".join(numbers), b";", *fields, record.value))


def pack_pending(  # noqa: PLR0917 - built on every call: positional is the cheap way
    owner: bytes, key: bytes, tool: bytes, begun_ms: int, lease_ms: int | None = None, ttl_ms: int = 0
) -> bytes:
    """``pack`` of the first attempt's pending record (no MAC, nothing released, no value): what a
    begin writes on a key that holds nothing, under a lease of ``lease_ms`` (layout b, written with
    a TTL of ``ttl_ms``) or none (layout a). Built on every guarded call, so in one formatting step
    rather than through a :class:`StoredRecord` packed field by field (0.3 us against 3.7 us for
    :func:`pack`: docs/performance.md); test_layout checks the two agree byte for byte."""
    if lease_ms is None:
        return _PENDING % (begun_ms, len(owner), len(key), len(tool), owner, key, tool)
    return _LEASED_PENDING % (begun_ms, lease_ms, ttl_ms, len(owner), len(key), len(tool), owner, key, tool)


def pack_committed_head(  # noqa: PLR0917 - built on every call, as pack_pending
    owner: bytes, key: bytes, tool: bytes, begun_ms: int, committed_ms: int, stored: bool, mac: bytes
) -> bytes:
    """``pack`` of the first attempt's committed record without its value (the value follows it): what
    lua/commit.lua writes over the pending record :func:`pack_pending` made of the same fields (no
    lease: a committed record is layout a). One formatting step, as :func:`pack_pending`;
    test_layout checks it against :func:`pack` and against the script's own writer."""
    return _COMMITTED_FIRST % (
        begun_ms,
        committed_ms,
        b"1" if stored else b"0",
        len(owner),
        len(key),
        len(tool),
        len(mac),
        owner,
        key,
        tool,
        mac,
    )


def _released(data: bytes) -> tuple[bytes, ...]:
    entries: list[bytes] = []
    at = 0
    while at < len(data):
        match = _ENTRY.match(data, at)
        if match is None or len(match.group(1)) > 9:
            raise LayoutError("the record's list of released tokens does not parse")
        start = match.end()
        at = start + int(match.group(1))
        if at > len(data):
            raise LayoutError("the record's list of released tokens does not parse")
        entries.append(data[start:at])
    return tuple(entries)


def _header(data: bytes) -> re.Match[bytes]:
    """The header of ``data`` (layout a or b): LayoutVersionError for a record of another layout
    version (see the module docstring), LayoutError for anything else that is no header."""
    match = _HEADER.match(data) if data[:1] != LEASED_VERSION else _LEASED_HEADER.match(data)
    if match is None:
        other = _OTHER_VERSION.match(data)
        if other is not None:
            raise LayoutVersionError(other.group(1).decode("ascii"))
        raise LayoutError("the record's header does not parse")
    return match


def fields_end(data: bytes) -> int:
    """Where the value starts: the length of header and fields, read from the header alone (a prefix
    of the string is enough). Raises LayoutError when the header does not parse (LayoutVersionError
    for a record of a newer layout)."""
    match = _header(data)
    return match.end() + sum(int(n) for n in match.groups()[-5:])


def parse(data: bytes) -> StoredRecord:
    """The record ``data`` holds; LayoutError (with the scripts' reason) when it is not one, and
    LayoutVersionError when it is a record of a newer layout. ``data`` may stop where the value starts
    (a listing reads no value): the value is then empty."""
    match = _header(data)
    code, attempt, begun, committed, stored, *numbers = match.groups()
    lease_ms = ttl_ms = None
    waited = False
    if len(numbers) == 8:  # layout b: the lease, the TTL and the waited flag, then the lengths
        if len(numbers[0]) > 15 or len(numbers[1]) > 15:
            raise LayoutError("the record has a malformed lease")
        lease_ms, ttl_ms, waited = int(numbers[0]), int(numbers[1]), numbers[2] == b"1"
    lengths = numbers[-5:]
    status = _STATUSES.get(code[0])
    if status is None:
        raise LayoutError(f"the record has an unknown status {code.decode('latin-1')!r}")
    if lease_ms is not None and status != "pending":
        raise LayoutError("the record has a malformed lease")
    if len(attempt) > 9:
        raise LayoutError("the record has a malformed attempt")
    if len(begun) > 15 or len(committed) > 15:
        raise LayoutError("the record has a malformed timestamp")
    if any(len(n) > 9 for n in lengths):
        raise LayoutError("the record is cut short (its fields run past its end)")
    bounds = [match.end()]
    for n in lengths:
        bounds.append(bounds[-1] + int(n))
    if bounds[-1] > len(data):
        raise LayoutError("the record is cut short (its fields run past its end)")
    owner, key, tool, mac, released = (data[a:b] for a, b in itertools.pairwise(bounds))
    return StoredRecord(
        status=status,
        attempt=int(attempt),
        begun_ms=int(begun) if begun else None,
        committed_ms=int(committed) if committed else None,
        stored=stored == b"1",
        owner=owner,
        key=key,
        tool=tool,
        mac=mac,
        released=_released(released),
        value=data[bounds[-1] :],
        value_at=bounds[-1],
        lease_ms=lease_ms,
        ttl_ms=ttl_ms,
        waited=waited,
    )


def edit(data: bytes, **changes: Any) -> bytes:
    """``data``, a record, with some of its fields changed (``StoredRecord`` field names): what an
    operator's tool or a test writes back."""
    record = parse(data)
    return pack(replace(record, **changes))


# -- the index entry of an idempotency key (dedupe): which tool_call_id holds it -------------------
# ``a,<#tool_call_id>,<#owner>;<tool_call_id><owner>``: a version letter first, like records.
_HOLDER = re.compile(rb"a,([0-9]{1,9}),([0-9]{1,9});", re.DOTALL)


def pack_holder(tool_call_id: str, token: str) -> bytes:
    """The index entry that names ``tool_call_id``'s attempt ``token`` (lua/claim.lua compares it
    whole, and reads the id from it)."""
    ident, owner = tool_call_id.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass")
    return b"a,%d,%d;%s%s" % (len(ident), len(owner), ident, owner)


def parse_holder(raw: bytes) -> Holder:
    """The holder an index entry names; an entry that does not parse names no id (``""``), which
    no record has: it is taken as stale and claimed from (by its exact bytes)."""
    found = _HOLDER.match(raw)
    if found is not None:
        start, ident, owner = found.end(), int(found.group(1)), int(found.group(2))
        if len(raw) == start + ident + owner:
            text = raw[start : start + ident].decode("utf-8", "surrogatepass")
            token = raw[start + ident :].decode("utf-8", "surrogatepass")
            return Holder(text, token, raw)
    return Holder("", "", raw)
