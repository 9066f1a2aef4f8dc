"""Mirror of agent_airlock's ``agent_airlock.effect_guard`` module path."""

from __future__ import annotations

from .core.canonical import idempotency_key
from .core.errors import EffectOutcomeUnknown, EffectRefused
from .core.outcome import DEFAULT_AMBIGUOUS_ERRORS
from .core.reversibility import Reversibility, reversibility
from .guard import EffectGuard
from .stores.base import EffectStore
from .stores.memory import InMemoryEffectStore

__all__ = [
    "DEFAULT_AMBIGUOUS_ERRORS",
    "EffectGuard",
    "EffectOutcomeUnknown",
    "EffectRefused",
    "EffectStore",
    "InMemoryEffectStore",
    "Reversibility",
    "idempotency_key",
    "reversibility",
]
