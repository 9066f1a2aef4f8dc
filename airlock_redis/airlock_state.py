"""The per-call state of the agent_airlock adapter (``airlock_redis.airlock``): what agent_airlock's
policy step leaves for the guard (:class:`CallState`) and what the guard leaves for agent_airlock's
audit writer and ``return_dict`` (:class:`Note`), each in a context variable. Loaded by
``airlock_redis.airlock`` once it has checked the installed agent-airlock."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from agent_airlock import SecurityPolicy as _BasePolicy
from agent_airlock.policy import PolicyEscalation

from .guard import EffectGuard


@dataclass
class CallState:
    """Written at agent_airlock's policy step, read by the guard below it."""

    tool: str
    policy: _BasePolicy | None
    escalation: PolicyEscalation | None = None
    ambient_agent: str | None = None
    ambient_id: Any = None
    checking: bool = False  # True while agent_airlock's policy step runs
    # The call's arguments as the caller passed them (ghosts stripped), before agent_airlock's
    # validation hands the tool every defaulted parameter too: what target_args counts.
    given: tuple[tuple[Any, ...], dict[str, Any]] | None = None


@dataclass
class Note:
    """What the guard tells agent_airlock's audit writer and return_dict about this call."""

    audit: dict[str, Any] | None = None
    refused: bool = False


CALL_STATE: contextvars.ContextVar[CallState | None] = contextvars.ContextVar(
    "airlock_redis_airlock_call", default=None
)
CALL_NOTE: contextvars.ContextVar[Note | None] = contextvars.ContextVar(
    "airlock_redis_airlock_note", default=None
)


def guard_of(policy: Any) -> EffectGuard | None:
    guard = getattr(policy, "effect_guard", None)
    return guard if isinstance(guard, EffectGuard) else None


def is_checking(tool: str) -> bool:
    """Whether airlock_redis.Airlock's policy step for ``tool`` is running in this context."""
    state = CALL_STATE.get()
    return state is not None and state.tool == tool and state.checking
