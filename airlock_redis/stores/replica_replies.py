"""What a READONLY reply means to the wires that write on a Sentinel primary's connections
themselves (:mod:`.exchange`, :mod:`.blocking_wire`).

Behind Sentinel, a ``READONLY`` answer means the server a connection reaches was demoted by a
failover. redis-py's Sentinel connection turns a plain ``READONLY`` into a dropped connection, but a
script's ``READONLY`` comes back as a plain error reply on Redis 6.2 (``ERR Error running script ...
-READONLY ...``), and the connection would go on reaching the demoted server. Either becomes
:class:`OnReplica`: a connection error that says the command was refused, never applied, so the
store's tries send it again (see :mod:`.tries`) once the wire has closed the connection and let the
pool ask Sentinel for the primary.
"""

from __future__ import annotations

from typing import Any

import redis


class OnReplica(redis.ConnectionError):
    """The server answered READONLY: a failover made it a replica. The command was refused, never
    applied (a replica runs no write, and a script stops at its first one)."""


def from_a_replica(reply: Any) -> bool:
    """A READONLY error reply: a plain one, or a script's as Redis 6.2 wraps it."""
    if not isinstance(reply, redis.ResponseError):
        return False
    text = str(reply)
    plain = isinstance(reply, redis.exceptions.ReadOnlyError) or text.startswith("READONLY")
    return plain or "-READONLY " in text


def as_refused(reply: Any) -> Any:
    """``reply`` itself, or :class:`OnReplica` in place of a READONLY error reply."""
    if not from_a_replica(reply):
        return reply
    return OnReplica(f"a failover made the server a replica; the command was refused, not applied ({reply})")
