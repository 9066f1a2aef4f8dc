"""Reconciling a call in doubt with its backend: a tool's probe and what it may answer. Pure.

A tool that may not run again can come with a probe (``guard.wrap(fn, reconcile=probe)``, or the
tool tagged with :func:`reconcile_with`): a function that asks the backend, by the call's
idempotency key, whether the call took effect. The guard asks it when the call's outcome is in doubt:
right after the tool raised an error that leaves it so (the attempt itself), and when a later call
finds the record in doubt (``unknown``, or ``pending`` with a lapsed lease). The probe answers:

- :class:`TookEffect` ``(value)``: it did; the record is committed with ``value``, which the caller
  gets (and every replay after);
- :class:`NeverTookEffect` ``()``: it did not; the call runs now, once, even though the tool may not
  run again;
- ``None``: the backend cannot tell; the call is refused as in doubt, as without a probe.

A probe must only ask, and must be authoritative: the tool sends the idempotency key to a backend
that deduplicates on it, and the probe looks the key up there. A probe that raises, answers anything
else, or runs past the guard's ``probe_timeout`` counts as ``None``. A request the backend has seen
but not finished must be answered ``None``, not ``NeverTookEffect``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeAlias, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

PROBE_ATTRIBUTE = "__airlock_reconcile__"


@dataclass(frozen=True, slots=True)
class TookEffect:
    """The probe's answer: the call took effect, and ``value`` is its result (what the tool would
    have returned)."""

    value: Any


@dataclass(frozen=True, slots=True)
class NeverTookEffect:
    """The probe's answer: the call did not take effect; it may run now."""


Found = Literal["unknown", "abandoned", "error"]


class ProbeCall(NamedTuple):
    """What a probe is asked about: the call in doubt.

    ``found``: ``"error"`` when the attempt itself just raised an error that leaves it in doubt,
    ``"unknown"`` or ``"abandoned"`` when a later call found the record so."""

    tool: str
    tool_call_id: str
    idempotency_key: str
    arguments: Mapping[str, Any]
    attempt: int
    found: Found


Verdict: TypeAlias = TookEffect | NeverTookEffect | None
Probe: TypeAlias = Callable[[ProbeCall], "Verdict | Awaitable[Verdict]"]


def verdict_of(answer: Any) -> Verdict:
    """What a probe's answer counts as: itself when it is a verdict, else None (can't tell)."""
    if isinstance(answer, (TookEffect, NeverTookEffect)):
        return answer
    return None


def reconcile_with(probe: Probe) -> Callable[[F], F]:
    """Tag a tool with its probe, so that every guard that runs it (``guard.wrap``, ``guard.call``,
    the integrations) asks the probe when the call is in doubt::

        @reconcile_with(lookup_charge)
        def charge(account: str, cents: int) -> dict: ...
    """
    if not callable(probe):
        raise TypeError(f"reconcile_with takes a probe function, not {probe!r}")

    def tag(fn: F) -> F:
        setattr(fn, PROBE_ATTRIBUTE, probe)
        return fn

    return tag


def probe_of(fn: Any) -> Probe | None:
    """The probe a tool was tagged with (on it or along its ``__wrapped__`` chain), or None."""
    current, depth = fn, 0
    while current is not None and depth < 64:
        found = getattr(current, PROBE_ATTRIBUTE, None)
        if found is not None:
            return found  # type: ignore[no-any-return]
        current, depth = getattr(current, "__wrapped__", None), depth + 1
    return None
