"""Where a call's tool_call_id comes from, and where the running call's idempotency key is read.

Only the host (or an adapter) sets the id, through :func:`tool_call_context`; a tool argument that
happens to be named ``tool_call_id`` belongs to the model and is never read.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

_NO_METADATA: Mapping[str, Any] = MappingProxyType({})


class CallContext(NamedTuple):
    """What the host says about the current tool call (immutable; a named tuple, as one is built
    for every call)."""

    tool_call_id: Any = None
    agent_id: str | None = None
    metadata: Mapping[str, Any] = _NO_METADATA


_host_context: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "airlock_redis_call_context", default=None
)
# (idempotency key, tool_call_id, whether that call's tool may run again) of the guarded call whose
# body runs now
_running: contextvars.ContextVar[tuple[str | None, str | None, bool]] = contextvars.ContextVar(
    "airlock_redis_running_call", default=(None, None, False)
)


class tool_call_context:
    """Carry the model's tool call id onto the guarded calls made inside the block::

    with tool_call_context(tool_call.id, agent_id="agent-1") as context:
        charge(account="acct_1", cents=500)
    """

    __slots__ = ("_context", "_token")

    def __init__(self, tool_call_id: str | None, agent_id: str | None = None, **metadata: Any) -> None:
        self._context = CallContext(tool_call_id, agent_id, metadata)

    def __enter__(self) -> CallContext:
        self._token = _host_context.set(self._context)
        return self._context

    def __exit__(self, *exc: object) -> None:
        _host_context.reset(self._token)


def current_call_context() -> CallContext | None:
    """The innermost :func:`tool_call_context`, or None."""
    return _host_context.get()


# the same, without a Python frame: what the guard reads on every call
read_call_context = _host_context.get


def current_idempotency_key() -> str | None:
    """The idempotency key of the guarded call running now (None outside one)."""
    return _running.get()[0]


# (idempotency key, tool_call_id, may run again) of the guarded call whose body runs now, read
# without a Python frame (the guard reads it on every call). A guarded call made inside that body
# under the same tool_call_id is part of it: it runs without a record of its own.
read_running = _running.get


def running_may_run_again() -> bool:
    """Whether the tool of the guarded call whose body runs now may run again (reversible)."""
    return _running.get()[2]


class running_key:
    """Expose ``key`` (with the call's ``tool_call_id``, and whether its tool may run again) as the
    running call's inside the block."""

    __slots__ = ("_running", "_token")

    def __init__(self, key: str | None, tool_call_id: str | None = None, may_run_again: bool = False) -> None:
        self._running = (key, tool_call_id, may_run_again)

    def __enter__(self) -> None:
        self._token = _running.set(self._running)

    def __exit__(self, *exc: object) -> None:
        _running.reset(self._token)


# the tool_call_id whose guarded call is run by an integration that wants an error leaving the call
# in doubt (tool not reversible) to end as a refusal the model reads; read on the error path only
_refuse_in_doubt: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "airlock_redis_refuse_in_doubt", default=None
)


class refusing_in_doubt:
    """Inside the block, the guarded call made under ``tool_call_id`` (and no other: a guarded call
    its tool makes under another id keeps its own behaviour) ends an error that leaves it in doubt,
    for a tool that is not reversible, with an :class:`~airlock_redis.EffectStatusUnknown` refusal
    (raised from the error) instead of re-raising the error. The record settles ``unknown`` either
    way. What a framework integration sets, so that the model reads "do not call it again" on the
    first attempt rather than the framework's "please try again"."""

    __slots__ = ("_token", "_tool_call_id")

    def __init__(self, tool_call_id: Any) -> None:
        self._tool_call_id = tool_call_id

    def __enter__(self) -> None:
        self._token = _refuse_in_doubt.set(self._tool_call_id)

    def __exit__(self, *exc: object) -> None:
        _refuse_in_doubt.reset(self._token)


def refuses_in_doubt(tool_call_id: Any) -> bool:
    """Whether the call under ``tool_call_id`` (as the host gave it) runs inside
    :class:`refusing_in_doubt` for that id. Never raises (it is read after the tool raised, before
    the record settles): only two plain strings are compared."""
    wanted = _refuse_in_doubt.get()
    return type(wanted) is str and type(tool_call_id) is str and wanted == tool_call_id
