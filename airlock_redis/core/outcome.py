"""How an attempt that ran leaves its record: commit, unknown or release. Pure."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from .ambiguity import DEFAULT_AMBIGUOUS_ERRORS, DEFAULT_RULE, AmbiguityRule, AmbiguousErrors, is_ambiguous
from .errors import CorruptRecordError, StoreError
from .records import Settlement

__all__ = [
    "DEFAULT_AMBIGUOUS_ERRORS",
    "AmbiguityRule",
    "give_back",
    "gives_back_after_failed_begin",
    "is_deferred",
    "settlement_for_error",
    "settlement_for_return",
    "stream_items",
]


def is_deferred(value: Any) -> bool:
    """A result that takes effect as it is consumed, after the call returned."""
    return (
        inspect.isgenerator(value)
        or inspect.isasyncgen(value)
        or inspect.isawaitable(value)
        or isinstance(value, Iterator)
        or hasattr(type(value), "__anext__")  # the type's: an instance __getattr__ may raise anything
    )


_PLAIN_RESULTS = frozenset({dict, list, tuple, str, bytes, int, float, bool, type(None), set, frozenset})


def settlement_for_return(value: Any) -> Settlement | None:
    """None: commit the value. UNKNOWN: the result is deferred, its effect comes later. Never raises:
    the tool has run, and a result whose type misbehaves when inspected is committed (not stored,
    if it cannot be encoded either)."""
    if type(value) in _PLAIN_RESULTS:
        return None
    try:
        deferred = is_deferred(value)
    except Exception:
        return None
    return Settlement.UNKNOWN if deferred else None


def settlement_for_error(error: BaseException, ambiguous: AmbiguousErrors = DEFAULT_RULE) -> Settlement:
    """UNKNOWN when the error leaves the effect in doubt, RELEASE otherwise.

    ``ambiguous`` is an :class:`AmbiguityRule` or a tuple of classes (the guard's
    ``ambiguous_errors``; the common clients are recognised as well). Anything that is not an
    ordinary Exception (cancellation, interrupt, exit) is in doubt. The full rule, causes and
    exception groups included: :mod:`airlock_redis.core.ambiguity`.
    """
    return Settlement.UNKNOWN if is_ambiguous(error, ambiguous) else Settlement.RELEASE


def gives_back_after_failed_begin(error: StoreError) -> bool:
    """A begin that failed may still have landed (its reply was lost: a timeout, a dropped
    connection), so the attempt gives back whatever it may hold. Not when the store answered that the
    record is corrupt: the begin changed nothing then."""
    return error.maybe_applied and not isinstance(error, CorruptRecordError)


def give_back(attempt: int) -> Settlement:
    """How an attempt leaves a record it took when its tool will NOT run: the record did not reach
    enough replicas, or the caller was cancelled while ``begin`` ran.

    A first attempt is released (owner-fenced): nothing took effect, so releasing it restores exactly
    the state before the call. Releasing cannot cause a duplicate even if the record did reach a
    replica: the release follows it down the same replication stream, and if a failover promotes that
    replica before the release arrives, the new primary holds a pending record and retries are
    refused (conservative), never run twice. Keeping it pending instead would refuse every retry of a
    call that never ran, until an operator resolves it.
    A reversible take-over (attempt > 1) is marked unknown instead: an earlier attempt may have run,
    and that doubt must not be erased.
    """
    return Settlement.RELEASE if attempt <= 1 else Settlement.UNKNOWN


def stream_items(value: Any) -> list[Any]:
    """The items a replayed stream yields: a stored list (or other collection) item by item, a
    lone value as one item."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    return [value]
