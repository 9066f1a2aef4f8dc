"""Errors raised by the guard and the stores.

Every refusal is an :class:`EffectRefused` with a machine-readable ``reason`` (one of
:data:`RefusalReason`) and a message that says what happened and what to do next.
"""

from __future__ import annotations

from typing import Literal, get_args

RefusalReason = Literal[
    "effect_status_unknown",
    "policy_violation",
    "tool_call_id_required",
    "target_args_required",
    "approval_denied",
    "store_unavailable",
    "result_not_stored",
    "record_corrupt",
]
REFUSAL_REASONS: tuple[str, ...] = get_args(RefusalReason)


class EffectOutcomeUnknown(Exception):
    """Raised by a tool to say it cannot tell whether its effect took place.

    The guard records the call ``unknown``: a retry of a tool that is not reversible is refused
    until an operator resolves the record.
    """


class EffectRefused(Exception):
    """The guard refused to run (or replay) a tool call. ``reason`` says why."""

    reason: RefusalReason

    def __init__(
        self,
        message: str,
        *,
        tool: str,
        tool_call_id: str | None,
        idempotency_key: str | None = None,
        fix_hint: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.tool = tool
        self.tool_call_id = tool_call_id
        self.idempotency_key = idempotency_key
        self.fix_hint = fix_hint

    def __str__(self) -> str:
        if self.fix_hint:
            return f"[{self.reason}] {self.message} {self.fix_hint}"
        return f"[{self.reason}] {self.message}"


class EffectStatusUnknown(EffectRefused):
    """An earlier attempt may have taken effect; a tool that is not reversible is not run again."""

    reason = "effect_status_unknown"


class EffectPolicyViolation(EffectRefused):
    """The tool_call_id was already used for another tool or other arguments."""

    reason = "policy_violation"


class ToolCallIdRequired(EffectRefused):
    """The call carries no usable tool_call_id, so it cannot be run at most once."""

    reason = "tool_call_id_required"


class TargetArgsRequired(EffectRefused):
    """An irreversible call names none of the configured target arguments."""

    reason = "target_args_required"


class ApprovalDenied(EffectRefused):
    """The approver denied the call (or no approver was configured where one is required)."""

    reason = "approval_denied"


class StoreUnavailable(EffectRefused):
    """The effect store could not record the call, so the tool was not run (fail closed)."""

    reason = "store_unavailable"


class ResultNotStored(EffectRefused):
    """The earlier attempt ran, but its result could not be stored, so it cannot be replayed."""

    reason = "result_not_stored"


class RecordCorrupt(EffectRefused):
    """The stored record is damaged or failed verification; it is neither replayed nor re-run."""

    reason = "record_corrupt"


class StoreError(Exception):
    """A store could not complete an operation (connection lost, timeout, server error).

    ``maybe_applied`` is True when the operation may have reached the store before the failure
    (a reply lost to a timeout or a dropped connection), False when it cannot have (the store was
    never reached).
    """

    def __init__(self, *args: object, maybe_applied: bool = False) -> None:
        super().__init__(*args)
        self.maybe_applied = maybe_applied


class CorruptRecordError(StoreError):
    """The store holds something under the call's key that is not a well-formed record (edited by
    hand or damaged). The guard refuses the call as ``record_corrupt``; the tool does not run."""


class InvalidToolCallId(ValueError):
    """A tool_call_id that is present but cannot be used as a record key."""


class CanonicalizationError(TypeError):
    """Tool arguments that have no canonical form, so no idempotency key can be computed."""


class ResultEncodingError(TypeError):
    """A tool result that the codec cannot store."""


class ResultDecodingError(ValueError):
    """Stored bytes that do not decode to a result."""
