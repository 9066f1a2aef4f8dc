"""What the stores hold and answer: statuses, begin outcomes, transition results."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from .errors import CorruptRecordError


class Word(str, enum.Enum):
    """The base of the stores' vocabularies: a member equals its text (``Status.UNKNOWN == "unknown"``,
    and hashes as it), but never a member of another vocabulary: ``Settlement.UNKNOWN`` (how an attempt
    leaves its record) is not ``Status.UNKNOWN`` (what a record holds)."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, enum.Enum):
            return self is other
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


class Status(Word):
    """The status of one tool call's record."""

    PENDING = "pending"
    COMMITTED = "committed"
    UNKNOWN = "unknown"


class BeginKind(Word):
    """What ``begin`` found (and did) for a call."""

    STARTED = "started"  # this attempt now owns the record and may run the tool
    COMMITTED = "committed"  # an earlier attempt committed
    PENDING = "pending"  # an earlier attempt is running, or was lost while running (no lease to tell)
    UNKNOWN = "unknown"  # an earlier attempt ended in doubt
    RUNNING = "running"  # an earlier attempt holds the record under a lease it renews: it is running
    ABANDONED = "abandoned"  # an earlier attempt's lease lapsed: gone or hung, its effect in doubt
    PROBE = "probe"  # in doubt, and this attempt (whose tool has a probe) took the record to ask it
    MISMATCH = "mismatch"  # the id was used for another tool or other arguments


class Settlement(Word):
    """How an attempt that did not commit leaves its record."""

    UNKNOWN = "unknown"  # the effect may have happened: keep the record, refuse re-runs
    RELEASE = "release"  # the effect did not happen: delete the record, the call may run again


class TransitionResult(Word):
    """The answer of commit, settle and resolve."""

    OK = "ok"
    SUPERSEDED = "superseded"  # another attempt (or an operator) owns the record now
    MISSING = "missing"  # no record (expired, released or resolved away)
    MISMATCH = "mismatch"  # resolve: the record's idempotency key is not the expected one
    CHANGED = "changed"  # resolve: the record is no longer the one the operator was shown
    RECREATED = "recreated"  # commit/settle found no record (it expired while the tool ran): written again


# A released record's tombstone: it keeps the releasing attempt's token for a short while, so that a
# request of that attempt arriving late (a delayed begin, a client's re-send) writes nothing. To every
# reader it is no record at all.
RELEASED = "released"

# The record layout versions this airlock-redis reads and writes (the first byte of every record: see
# airlock_redis/stores/layout.py): "b" for a pending record held under a lease, "a" for every other.
LAYOUT_VERSION = "a"
LEASED_LAYOUT_VERSION = "b"


class BeginRequest(NamedTuple):
    """What a guarded call asks the store to begin (immutable; a named tuple, as it is built on
    every call and a frozen dataclass costs about two and a half times as much to build)."""

    tool_call_id: str
    idempotency_key: str
    tool: str
    token: str
    reversible: bool
    # ms the attempt promises to renew its record within while its tool runs (see airlock_redis.lease);
    # None: no lease, the record cannot tell a running attempt from a lost one
    lease_ms: int | None = None
    # the tool may not run again and has a probe: a record in doubt (unknown, or abandoned) is taken
    # over for this attempt to ask the probe (PROBE), rather than refused
    probes: bool = False


class Holder(NamedTuple):
    """The call that holds an idempotency key's index entry (``EffectGuard(dedupe=...)``): its
    tool_call_id and owner token, and the entry as the store holds it (what a compare-and-set
    expects)."""

    tool_call_id: str
    token: str
    raw: bytes = b""


@dataclass(frozen=True, slots=True)
class BeginOutcome:
    """What a store's ``begin`` answers: ``kind`` (what it found and did), the record's ``attempt``
    number, for COMMITTED the stored ``value`` (None when it could not be stored) and its ``mac``,
    for MISMATCH the ``tool`` and ``idempotency_key`` the record belongs to, for RUNNING and
    ABANDONED the attempt's ``lease_ms`` and how long ago its record was last renewed
    (``since_renewal_ms``, by the server's clock)."""

    kind: BeginKind
    attempt: int = 1
    value: bytes | None = None  # committed: the stored result, None when it could not be stored
    mac: bytes | None = None
    tool: str | None = None  # mismatch: the tool the record belongs to
    idempotency_key: str | None = None  # mismatch: the key the record belongs to
    lease_ms: int | None = None  # running, abandoned: the earlier attempt's lease
    since_renewal_ms: int | None = None  # running, abandoned: ms since its record was last renewed
    found: str | None = None  # probe: what the record was ("unknown" or "abandoned")


@dataclass(frozen=True, slots=True)
class Record:
    """A full record, as operators see it."""

    tool_call_id: str
    status: Status
    idempotency_key: str
    tool: str
    owner: str
    attempt: int
    value: bytes | None
    stored: bool  # False when the call committed but its result could not be stored
    mac: bytes | None
    begun_ms: int | None
    committed_ms: int | None
    ttl_ms: int | None  # None: no expiry (or unknown)
    note: str | None = None
    lease_ms: int | None = None  # a pending record held under a lease: the lease (else None)
    since_renewal_ms: int | None = None  # ... and ms since it was last renewed (the server's clock)

    @property
    def liveness(self) -> str | None:
        """For a pending record held under a lease: ``"running"`` while its attempt renews it,
        ``"abandoned"`` once the lease lapsed (the attempt is gone or hung: in doubt). None for any
        other record, and for one whose TTL was changed by hand (its lease cannot be told)."""
        if self.status is not Status.PENDING or self.lease_ms is None or self.since_renewal_ms is None:
            return None
        return "running" if self.since_renewal_ms <= self.lease_ms else "abandoned"


class RecordVersionError(CorruptRecordError):
    """The key holds a record in a layout version this airlock-redis does not know: one written by a
    newer airlock-redis (see docs/store.md, "Record layout versions"). Refused like a corrupt record
    (the tool does not run, nothing is written over it), with a message that says to upgrade.
    ``version`` is the record's layout version letter."""

    def __init__(self, version: str, tool_call_id: str | None = None) -> None:
        self.version = version
        which = "the record" if tool_call_id is None else f"the record of {tool_call_id!r}"
        super().__init__(
            f"{which} was written by a newer airlock-redis (record layout version {version!r}; this one "
            f"reads versions {LAYOUT_VERSION!r} and {LEASED_LAYOUT_VERSION!r}): upgrade airlock-redis on "
            "this host. Nothing was run or "
            "written; resolving it from a host that runs this version is refused too"
        )
