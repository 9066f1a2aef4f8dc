"""How an attempt that ran leaves its record: commit, unknown or release. Pure."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from .errors import CorruptRecordError, EffectOutcomeUnknown, StoreError
from .records import Settlement

DEFAULT_AMBIGUOUS_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    EffectOutcomeUnknown,
)


def is_deferred(value: Any) -> bool:
    """A result that takes effect as it is consumed, after the call returned."""
    return (
        inspect.isgenerator(value)
        or inspect.isasyncgen(value)
        or inspect.isawaitable(value)
        or isinstance(value, Iterator)
        or hasattr(value, "__anext__")
    )


_PLAIN_RESULTS = frozenset({dict, list, tuple, str, bytes, int, float, bool, type(None), set, frozenset})


def settlement_for_return(value: Any) -> Settlement | None:
    """None: commit the value. UNKNOWN: the result is deferred, its effect comes later."""
    if type(value) in _PLAIN_RESULTS:
        return None
    return Settlement.UNKNOWN if is_deferred(value) else None


def settlement_for_error(error: BaseException, ambiguous: tuple[type[BaseException], ...]) -> Settlement:
    """An ambiguous error, or anything that is not an ordinary Exception (cancellation, interrupt,
    exit), leaves the effect in doubt; any other error releases the record."""
    if isinstance(error, ambiguous) or not isinstance(error, Exception):
        return Settlement.UNKNOWN
    return Settlement.RELEASE


def gives_back_after_failed_begin(error: StoreError) -> bool:
    """A begin that failed may still have landed (its reply was lost: a timeout, a dropped
    connection), so the attempt gives back whatever it may hold. Not when the store answered that the
    record is corrupt: the begin changed nothing then."""
    return error.maybe_applied and not isinstance(error, CorruptRecordError)
