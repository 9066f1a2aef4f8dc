"""A client's record of its earlier tries, read after it retried on its own (see "After retries" in
:mod:`.ambiguity`). Each reader returns None when it finds no record, "" when the record proves that no
earlier try was sent, and otherwise why one may have been. Reading never calls into the client:
attributes and the locals of finished frames in the error's traceback only, each read guarded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Final

from .client_errors import (
    BY_RESPONSE,
    BY_SDK,
    BY_TENACITY,
    BY_URLLIB3,
    NOT_SENT,
    SDK_CLIENTS,
    SDK_REQUEST,
    URLLIB3_INCREMENT,
    URLLIB3_RETRY,
    facts,
    qualified,
)

NeverLeft = Callable[[BaseException], bool]


@dataclass
class Budget:
    left: int

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


_CLEAN: Final = ""
_TOO_LONG: Final = "too many traceback entries to read for the client's record of its earlier tries"


def _has_class(value: object, name: str) -> bool:
    return any(qualified(klass) == name for klass in type(value).__mro__)


def _trace(error: BaseException, budget: Budget) -> list[FrameType] | None:
    """The frames of ``error``'s traceback, outermost first; None when the budget ran out."""
    frames: list[FrameType] = []
    tb = error.__traceback__
    while isinstance(tb, TracebackType):
        if not budget.take():
            return None
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _where(frame: FrameType) -> tuple[object, str]:
    return frame.f_globals.get("__name__"), frame.f_code.co_name


def _local(frame: FrameType, name: str) -> object:
    try:
        return frame.f_locals.get(name)
    except Exception:  # a frame whose locals cannot be read: no record
        return None


def _urllib3_history(retry: object, never_left: NeverLeft, budget: Budget) -> str:
    """What a urllib3 ``Retry``'s history says of the tries before it ("": all of them never left)."""
    if not _has_class(retry, URLLIB3_RETRY):
        return "urllib3 retried, and its Retry (the record of the earlier tries) cannot be read"
    try:
        history = getattr(retry, "history", None)
    except Exception:
        history = None
    if not isinstance(history, tuple):
        return "urllib3 retried, and its Retry.history (the record of the earlier tries) cannot be read"
    for entry in history:
        if not budget.take():
            return _TOO_LONG
        try:
            error, status = getattr(entry, "error", None), getattr(entry, "status", None)
        except Exception:
            return "urllib3 retried, and an entry of its Retry.history cannot be read"
        if not isinstance(error, BaseException):
            answered = f" (HTTP {status})" if isinstance(status, int) else ""
            return f"urllib3 retried after an earlier try that was sent and answered{answered}"
        if not never_left(error):
            name = qualified(type(error))
            return f"urllib3 retried after an earlier try that ended {name}: that request may have been sent"
    return _CLEAN


def _urllib3_record(error: BaseException, never_left: NeverLeft, budget: Budget) -> str | None:
    """The ``Retry`` of each ``Retry.increment`` frame ``error`` was raised (or re-raised) through."""
    frames = _trace(error, budget)
    if frames is None:
        return _TOO_LONG
    found: str | None = None
    for frame in frames:
        if _where(frame) == URLLIB3_INCREMENT:
            verdict = _urllib3_history(_local(frame, "self"), never_left, budget)
            if verdict:
                return verdict
            found = _CLEAN
    return found


def _response_record(error: BaseException, never_left: NeverLeft, budget: Budget) -> str | None:
    """requests' ``HTTPError``: the ``Retry`` urllib3 gave the response (``response.raw.retries``)."""
    try:
        retry = getattr(getattr(getattr(error, "response", None), "raw", None), "retries", None)
    except Exception:
        return "the response's record of urllib3's retries cannot be read"
    if retry is None or not _has_class(retry, URLLIB3_RETRY):
        return None  # not a response urllib3 made: nothing says it retried
    return _urllib3_history(retry, never_left, budget)


def _tenacity_record(error: BaseException) -> str:
    """tenacity keeps the last attempt only: the record is clean when that attempt was the first one
    and it raised (its error, the ``__cause__``, is judged with the rest of the chain)."""
    try:
        number = getattr(getattr(error, "last_attempt", None), "attempt_number", None)
    except Exception:
        number = None
    if type(number) is not int:
        return "tenacity gave up retrying, and its RetryError says nothing of the earlier attempts"
    if number > 1:
        return f"tenacity gave up after {number} attempts and keeps the last one's error only"
    if error.__cause__ is None:
        return "tenacity gave up on an attempt that returned: it ran to the end"
    return _CLEAN


def _sdk_record(error: BaseException, budget: Budget) -> str | None:
    """The OpenAI and Anthropic SDKs: ``retries_taken`` in the request frame that raised ``error``."""
    frames = _trace(error, budget)
    if frames is None:
        return _TOO_LONG
    if not frames:
        return None
    module, function = _where(frames[-1])
    if module not in SDK_CLIENTS or function not in SDK_REQUEST:
        return None
    taken = _local(frames[-1], "retries_taken")
    if type(taken) is not int:
        return "the SDK retries, and its count of retries taken cannot be read"
    if taken > 0:
        return f"the SDK retried {taken} time(s) before raising: an earlier try may have been sent"
    return _CLEAN


def after_retries(error: BaseException, kind: int, never_left: NeverLeft, budget: Budget) -> str | None:
    """Why ``error`` may come after a retry whose earlier try was sent (None: nothing says so).
    ``kind``: what ``error`` says on its own; ``never_left``: whether an error proves its request never
    left (the rule's classification)."""
    known = facts(type(error))
    record: str | None
    if known.record == BY_URLLIB3 or (kind == NOT_SENT and error.__traceback__ is not None):
        record = _urllib3_record(error, never_left, budget)
    elif known.record == BY_TENACITY:
        record = _tenacity_record(error)
    elif known.record == BY_SDK:
        record = _sdk_record(error, budget)
    elif known.record == BY_RESPONSE:
        record = _response_record(error, never_left, budget)
    else:
        return None
    if record:
        return record
    if record is None and known.after_retries:
        return "raised when a client's retries gave up, and no record of its earlier tries can be read"
    return None
