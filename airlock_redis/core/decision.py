"""The replay table: what a call does given what ``begin`` found. Pure, no I/O.

| what begin found                   | not reversible              | reversible          |
|------------------------------------|-----------------------------|---------------------|
| nothing (or this attempt's own)    | run                         | run                 |
| committed with a stored value      | replay the value            | replay the value    |
| committed, value not storable      | refuse result_not_stored    | same                |
| pending (no lease) or unknown      | refuse effect_status_unknown| run again           |
| pending, its lease lapsed          | refuse effect_status_unknown| run again           |
| pending, its lease renewed: running| refuse effect_in_progress   | same                |
| in doubt, the tool has a probe     | ask the probe (PROBE)       | (runs again)        |
| other tool or other arguments      | refuse policy_violation     | same                |

A record held under a lease (``EffectGuard(lease=...)``) tells a running attempt (renewed within its
lease, by the server's clock) from an abandoned one (lapsed: gone or hung, so in doubt). A running
one is never run a second time beside it, whatever the tool; without a lease the table is the
spec's, where a pending record is in doubt.

The "run again" cell is carried out atomically by the store's ``begin`` (it takes the record over
for a new attempt when told the tool is reversible and answers ``started``); ``decide`` still
never runs a call on any other answer, so a store can only err on the side of refusing.
Whether the tool may run again is ``Reversibility.may_run_again``, passed to ``begin``.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import RefusalReason
from .records import BeginKind, BeginOutcome


class Run(NamedTuple):
    attempt: int


class Replay(NamedTuple):
    value: bytes
    mac: bytes | None


class Refuse(NamedTuple):
    reason: RefusalReason
    detail: BeginOutcome


class AskProbe(NamedTuple):
    """In doubt, and this attempt holds the record: ask the tool's probe before anything else."""

    attempt: int


Decision = Run | Replay | Refuse | AskProbe


def decide(outcome: BeginOutcome) -> Decision:
    kind = outcome.kind
    if kind is BeginKind.STARTED:
        return Run(outcome.attempt)
    if kind is BeginKind.COMMITTED:
        if outcome.value is None:
            return Refuse("result_not_stored", outcome)
        return Replay(outcome.value, outcome.mac)
    if kind is BeginKind.MISMATCH:
        return Refuse("policy_violation", outcome)
    if kind is BeginKind.RUNNING:
        return Refuse("effect_in_progress", outcome)
    if kind is BeginKind.PROBE:
        return AskProbe(outcome.attempt)
    # pending, abandoned or unknown: the store takes a reversible call over and answers STARTED, so reaching
    # this line means the earlier attempt's effect is in doubt and this tool must not run again.
    return Refuse("effect_status_unknown", outcome)
