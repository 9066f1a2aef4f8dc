"""What the call machine (:mod:`.call_machine`) hands out and takes: the call's rules, its result
(:class:`Execution`), and the operations an executor carries out, one named tuple each. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from .ambiguity import AmbiguityRule
from .errors import EffectRefused
from .gates import GuardOptions
from .probes import Probe as ProbeFn
from .probes import ProbeCall
from .records import BeginRequest, Holder, Settlement, Status
from .signing import Signer

T = TypeVar("T")

Effect = Literal["executed", "replayed", "unguarded", "nested", "reconciled"]


@dataclass(slots=True)  # built on every call: a frozen dataclass costs four times as much to build
class Execution(Generic[T]):
    """What a guarded call produced, and how."""

    value: T
    # executed: the tool ran; replayed: the stored value; unguarded: ran without a record (no id);
    # nested: ran inside the guarded body of the same tool_call_id, covered by that call's record;
    # reconciled: the call was in doubt and the tool's probe said it took effect, with this value
    effect: Effect
    tool_call_id: str | None
    idempotency_key: str | None
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class CallRules:
    """What every call of one guard decides by; made once, with the guard."""

    options: GuardOptions
    ambiguity: AmbiguityRule
    max_result_bytes: int
    signer: Signer | None
    target: str | None = ""  # how an operator reaches the store (for refusals' hints); None: in-process
    lease_ms: int | None = None  # each attempt's lease (None: records hold none; see airlock_redis.lease)
    wait_for_running: float = 0.0  # seconds a call waits for a running attempt of its id (0: refused)
    probe_timeout: float = 10.0  # seconds a tool's probe may take (then: can't tell)


class Running(NamedTuple):
    """The guarded call whose body runs now, as the executor read it from its context: its
    idempotency key, tool_call_id, and whether its tool may run again."""

    idempotency_key: str | None
    tool_call_id: str | None
    may_run_again: bool


class Commit(NamedTuple):
    """Store the result: its bytes and their MAC (both None when the result cannot be stored, and
    ``not_stored`` says why)."""

    data: bytes | None
    mac: bytes | None
    not_stored: str | None = None


# -- the operations: what the executor does next ------------------------------------------------
class Ask(NamedTuple):
    """Ask the approver (``why``: the reason approval is needed); then ``approved`` or ``denied``."""

    why: str


class Begin(NamedTuple):
    """Send the begin; then ``begun``, ``begin_failed`` (a StoreError) or ``begin_interrupted``."""

    request: BeginRequest


class Wait(NamedTuple):
    """Wait up to ``seconds`` for the running attempt that holds the record to end, then send the
    begin again; then ``woken`` (with what it answered and the seconds spent), ``begin_failed`` or
    ``begin_interrupted``."""

    request: BeginRequest
    seconds: float


class Probe(NamedTuple):
    """Ask the tool's probe about the call in doubt (at most ``timeout`` seconds; raising, or running
    past it, counts as "can't tell"); then ``probed`` with its answer."""

    probe: ProbeFn
    call: ProbeCall
    timeout: float


class Secure(NamedTuple):
    """Wait until enough replicas hold the pending record; then ``secured`` or ``secure_failed``."""

    request: BeginRequest


class RunTool(NamedTuple):
    """Run the tool body inside ``running`` (the context its own guarded calls see); then
    ``returned`` or ``raised``. ``bare``: it runs without a record of its own. ``lease``: the
    request whose lease to keep renewed until the call's last write is answered (None: no lease)."""

    running: Running
    bare: bool
    lease: BeginRequest | None = None


class Write(NamedTuple):
    """Send the attempt's last write (commit or settle); then ``written`` with the store's answer."""

    request: BeginRequest
    attempt: int
    step: Commit | Settlement


class GiveBack(NamedTuple):
    """Release what a begin whose answer was lost may have taken (owner-fenced: it never touches a
    record another attempt owns); then ``given_back``."""

    request: BeginRequest


class Claim(NamedTuple):
    """Dedupe: make the idempotency key's index entry name this attempt, where it is free, names this
    id, or holds ``expected`` (a compare-and-set; None: only where it is free or this id's); then
    ``claimed``, ``held`` (with the holder), ``claim_failed`` or ``interrupted``."""

    request: BeginRequest
    expected: Holder | None = None


class ReadHolder(NamedTuple):
    """Dedupe: read the record of the id that holds the key (``store.get``); then ``holder_seen``
    (the record, or None), ``check_failed`` or ``interrupted``."""

    holder: Holder


class WaitHolder(NamedTuple):
    """Dedupe: wait up to ``seconds`` for the running attempt of the holder's id to end (its record
    is not begun: this call only watches it); then ``holder_ended`` with the seconds spent,
    ``check_failed`` or ``interrupted``."""

    holder: Holder
    seconds: float


class Unclaim(NamedTuple):
    """Dedupe: after the record's last write, end this attempt's index entry (fenced on its value):
    keep it as long as a record in status ``keep`` lives, or delete it (None); then
    ``unclaimed`` (whatever the store answered)."""

    request: BeginRequest
    keep: Status | None


class Finish(NamedTuple):
    """The call is over: return ``execution``."""

    execution: Execution[Any]


class Refuse(NamedTuple):
    """The call is over: raise ``refusal`` (from ``cause``, when there is one)."""

    refusal: EffectRefused
    cause: BaseException | None = None


class Reraise(NamedTuple):
    """The call is over: raise what the tool (or an interruption) raised."""

    error: BaseException


Operation = (
    Ask
    | Begin
    | Wait
    | Probe
    | Secure
    | RunTool
    | Write
    | GiveBack
    | Claim
    | ReadHolder
    | WaitHolder
    | Unclaim
    | Finish
    | Refuse
    | Reraise
)
Outcome = Finish | Refuse | Reraise
