"""Lease renewals as Redis commands: one pipeline of ``renew`` scripts for every lease due at once
(see :mod:`airlock_redis.lease`, which decides when; ``lua/renew.lua``, which decides whether).

Sent through the store's blocking client from the keeper's thread. A renewal is safe to send again
(it only restarts the TTL of a pending record its token owns), and the next tick is its retry, so
a failure here is reported per lease and never re-sent in place. On a Cluster, redis-py's pipeline
sends each node its own commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError

from ..core.errors import StoreError
from ..core.records import TransitionResult
from .replies import parse_transition
from .script_args import SHAS
from .scripts import script_bytes

Renewal = tuple[bytes, list[Any]]  # the record's key, the script's arguments
Renewed = TransitionResult | StoreError


def renew_all(client: Any, renewals: Sequence[Renewal]) -> list[Renewed]:
    """Renew each lease: one pipeline round trip (and one more, with the script's source, for the
    ones a server whose script cache was emptied answered NOSCRIPT)."""
    replies = _send(client, [("EVALSHA", SHAS["renew"], 1, key, *args) for key, args in renewals])
    again = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if again:
        source = script_bytes("renew")
        resent = _send(client, [("EVAL", source, 1, renewals[i][0], *renewals[i][1]) for i in again])
        for i, reply in zip(again, resent, strict=True):
            replies[i] = reply
    return [_renewed(reply) for reply in replies]


def _send(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Each command's reply or error, in order; a failure of the whole round trip is each one's."""
    try:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies = pipe.execute(raise_on_error=False)
    except (redis.RedisError, OSError) as exc:
        return [exc] * len(commands)
    if len(replies) != len(commands):
        error = StoreError(f"a pipeline of {len(commands)} renewals got {len(replies)} replies")
        return [error] * len(commands)
    return list(replies)


def _renewed(reply: Any) -> Renewed:
    if isinstance(reply, StoreError):
        return reply
    if isinstance(reply, BaseException):
        return StoreError(f"the lease was not renewed: {type(reply).__name__}: {reply}")
    try:
        return parse_transition(reply)
    except StoreError as exc:
        return exc
