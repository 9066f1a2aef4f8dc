"""airlock_redis: at-most-once tool calls for AI agents, shared across processes through Redis.

Start with :class:`EffectGuard` on a :class:`RedisEffectStore`, ``guard.wrap`` your tools, and carry
the model's tool call id with :func:`tool_call_context` (or pass it by hand: ``guard.call``).

Public names (``__all__``): what tool authors and operators use, by what they use it for.

- Guarding tools: ``EffectGuard``, ``RedisEffectStore``, ``InMemoryEffectStore``, ``EffectStore``
  (the type of any store), ``tool_call_context``, ``CallContext``, ``current_call_context``,
  ``current_idempotency_key``, ``reversibility``, ``reversibility_of``, ``Reversibility``,
  ``reconcile_with``, ``ProbeCall``, ``TookEffect``, ``NeverTookEffect`` (a tool's probe),
  ``GuardedCall`` and ``Execution`` (what ``guard.execute`` takes and returns), ``Airlock``,
  ``SecurityPolicy``, ``Approver``, ``ApprovalRequest``.
- Errors that leave a call in doubt: ``DEFAULT_AMBIGUOUS_ERRORS``, ``AmbiguityRule``, ``Settlement``,
  ``EffectOutcomeUnknown``, ``is_ambiguous``, ``explain``.
- Refusals (catch ``EffectRefused``; each reason has its subclass): ``EffectRefused``,
  ``EffectStatusUnknown``, ``EffectPolicyViolation``, ``ToolCallIdRequired``, ``TargetArgsRequired``,
  ``ApprovalDenied``, ``StoreUnavailable``, ``ResultNotStored``, ``RecordCorrupt``, ``EffectInProgress``,
  ``REFUSAL_REASONS``, ``RefusalReason``.
- Other errors: ``StoreError``, ``InvalidToolCallId``, ``CanonicalizationError``.
- Operating: ``Record``, ``Status``, ``TransitionResult`` (what ``guard.resolve`` answers),
  ``idempotency_key``, ``canonical_arguments``, ``__version__``.

Writing a store of your own: the types only a store takes and answers (``BeginRequest``,
``BeginOutcome``, ``BeginKind``, and the optional store protocols) are in :mod:`airlock_redis.stores`.

The names below are values, not classes or functions, so they are described here:

- ``DEFAULT_AMBIGUOUS_ERRORS``: the exception classes that leave a call ``unknown`` by default
  (``TimeoutError``, ``ConnectionResetError``, ``ConnectionAbortedError``, ``BrokenPipeError``,
  :class:`EffectOutcomeUnknown`); extend it with ``ambiguous_errors=(*DEFAULT_AMBIGUOUS_ERRORS, E)``.
- ``REFUSAL_REASONS``: every value :attr:`EffectRefused.reason` takes, as a tuple of strings.
- ``RefusalReason``: the same values as a ``typing.Literal`` type.
- ``Approver``: the type of ``EffectGuard(approver=...)``: a callable that takes an
  :class:`ApprovalRequest` and returns (or awaits to) True to let the call run.
- ``Airlock``, ``SecurityPolicy``: agent_airlock's classes with the guard inside (the ``airlock``
  extra); loaded on first use.
- ``__version__``: this package's version (``airlock_redis._version``, which any module may import).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .approval import ApprovalRequest, Approver
from .context import CallContext, current_call_context, current_idempotency_key, tool_call_context
from .core.ambiguity import AmbiguityRule, explain, is_ambiguous
from .core.call_machine import Execution
from .core.canonical import canonical_arguments, idempotency_key
from .core.errors import (
    REFUSAL_REASONS,
    ApprovalDenied,
    CanonicalizationError,
    EffectInProgress,
    EffectOutcomeUnknown,
    EffectPolicyViolation,
    EffectRefused,
    EffectStatusUnknown,
    InvalidToolCallId,
    RecordCorrupt,
    RefusalReason,
    ResultNotStored,
    StoreError,
    StoreUnavailable,
    TargetArgsRequired,
    ToolCallIdRequired,
)
from .core.gates import GuardedCall
from .core.outcome import DEFAULT_AMBIGUOUS_ERRORS
from .core.probes import NeverTookEffect, ProbeCall, TookEffect, reconcile_with
from .core.records import Record, Settlement, Status, TransitionResult
from .core.reversibility import Reversibility, reversibility, reversibility_of
from .guard import EffectGuard
from .stores.base import EffectStore
from .stores.memory import InMemoryEffectStore
from .stores.redis_store import RedisEffectStore

if TYPE_CHECKING:
    from .airlock import Airlock, SecurityPolicy

_AIRLOCK_NAMES = ("Airlock", "SecurityPolicy")


def __getattr__(name: str) -> Any:
    # agent-airlock is an optional extra: its adapter loads on first use of these names.
    if name in _AIRLOCK_NAMES:
        from . import airlock

        return getattr(airlock, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_AMBIGUOUS_ERRORS",
    "REFUSAL_REASONS",
    "Airlock",
    "AmbiguityRule",
    "ApprovalDenied",
    "ApprovalRequest",
    "Approver",
    "CallContext",
    "CanonicalizationError",
    "EffectGuard",
    "EffectInProgress",
    "EffectOutcomeUnknown",
    "EffectPolicyViolation",
    "EffectRefused",
    "EffectStatusUnknown",
    "EffectStore",
    "Execution",
    "GuardedCall",
    "InMemoryEffectStore",
    "InvalidToolCallId",
    "NeverTookEffect",
    "ProbeCall",
    "Record",
    "RecordCorrupt",
    "RedisEffectStore",
    "RefusalReason",
    "ResultNotStored",
    "Reversibility",
    "SecurityPolicy",
    "Settlement",
    "Status",
    "StoreError",
    "StoreUnavailable",
    "TargetArgsRequired",
    "TookEffect",
    "ToolCallIdRequired",
    "TransitionResult",
    "__version__",
    "canonical_arguments",
    "current_call_context",
    "current_idempotency_key",
    "explain",
    "idempotency_key",
    "is_ambiguous",
    "reconcile_with",
    "reversibility",
    "reversibility_of",
    "tool_call_context",
]
