"""The store's tries of one command: how many, the pause between them, and whether ANY of them may
have reached the server. Pure bookkeeping: the blocking and asyncio loops in :mod:`.redis_store`
only send, sleep and ask this.

Why the store re-sends by itself instead of leaving it to redis-py: redis-py's retry raises the LAST
try's error only. A ``SET NX`` that was applied, whose reply was lost, and whose re-sends then failed
to connect, ends in "connection refused", which on its own reads as "never sent": the begin was
taken as not applied, no release went out, and a tool that never ran left its record pending. Here
every try's error is looked at.

A client the store did not build (``client=``, ``async_client=``) or a Cluster client retries
inside redis-py, where the earlier tries cannot be seen: its connection errors are taken as "may
have reached the server" whatever the last one says (:func:`Tries.blind`), unless the client is
known to make one try.
"""

from __future__ import annotations

import random
from typing import Any, Final

import redis

from .autopipe import NotSent
from .replica_replies import OnReplica

RETRIES: Final = 2  # re-sends after the first try
RETRY_BACKOFF: Final = (0.05, 0.5)  # seconds: base and cap of the exponential backoff with full jitter

RETRYABLE: Final = (redis.ConnectionError, redis.TimeoutError)
"""The errors after which a command is sent again: a dropped connection or a timeout. Every store
command is safe to re-send (the attempt's owner token; see lua/*.lua)."""


def never_sent(exc: BaseException) -> bool:
    """True when ``exc`` proves that this one try never reached the server: an error reply (the
    server answered: it refused the command), a failure to connect, or no free pooled connection."""
    if isinstance(exc, redis.ResponseError):
        return True
    if isinstance(exc, (NotSent, OnReplica, getattr(redis.exceptions, "MaxConnectionsError", ()))):
        return True
    text = str(exc).lower()
    return isinstance(exc, redis.ConnectionError) and (
        "connecting" in text or "connection refused" in text or "too many connections" in text
    )


class Tries:
    """One command's tries. ``failed(exc)`` notes a failed try and gives the pause before the next
    one, or None when there is no next one; ``maybe_sent`` says whether any try may have landed."""

    __slots__ = ("_blind", "_failures", "_retries", "maybe_sent")

    def __init__(self, retries: int, *, blind: bool = False) -> None:
        # blind: the client re-sends inside redis-py, so a try we cannot see may have landed
        self._blind = blind
        self._retries = 0 if blind else retries
        self._failures = 0
        self.maybe_sent = False

    @classmethod
    def blind(cls) -> Tries:
        """For a client that re-sends by itself: only its last error is seen."""
        return cls(0, blind=True)

    def failed(self, exc: BaseException) -> float | None:
        if (self._blind and isinstance(exc, RETRYABLE)) or not never_sent(exc):
            self.maybe_sent = True
        if not isinstance(exc, RETRYABLE) or self._failures >= self._retries:
            return None
        self._failures += 1
        return backoff(self._failures, RETRY_BACKOFF)


def backoff(failures: int, base_and_cap: tuple[float, float]) -> float:
    """The pause before the next try after ``failures`` failed ones: exponential from ``base``, at
    most ``cap`` seconds, with full jitter."""
    base, cap = base_and_cap
    return random.uniform(0, min(cap, base * 2 ** min(failures, 16)))


def makes_one_try(client: Any) -> bool:
    """True for a plain redis-py client whose own retry policy makes no re-sends."""
    get_retry = getattr(client, "get_retry", None)
    if not callable(get_retry):
        return False
    try:
        retry = get_retry()
        count = retry.get_retries() if retry is not None else None
    except Exception:
        return False
    return count == 0
