"""Errors raised by the guard and the stores.

Every refusal is an :class:`EffectRefused` with a machine-readable ``reason`` (one of
:data:`RefusalReason`) and a message that says what happened and what to do next.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

RefusalReason = Literal[
    "effect_status_unknown",
    "policy_violation",
    "tool_call_id_required",
    "target_args_required",
    "approval_denied",
    "store_unavailable",
    "result_not_stored",
    "record_corrupt",
    "effect_in_progress",
]
REFUSAL_REASONS: tuple[str, ...] = get_args(RefusalReason)

# What a model is told for each refusal (EffectRefused.model_message): what happened, what to do.
MODEL_MESSAGES: dict[str, str] = {
    "effect_status_unknown": (
        "An earlier attempt of this same call may already have taken effect, and whether it did is "
        "unknown. Do not issue this call again, under this id or a new one. Tell the user that this "
        "action needs to be checked by a person before anything else is done about it."
    ),
    "policy_violation": (
        "Its tool call id was already used for a different tool or different arguments, so it "
        "cannot be run under that id. Do not retry it under the same id; if a different action is "
        "really intended, make it as a new tool call."
    ),
    "tool_call_id_required": (
        "The call reached the tool without a tool call id, so it could not be guarded against "
        "running twice. This is a setup problem of the host, not of the call: do not retry; tell "
        "the user."
    ),
    "target_args_required": (
        "The call does not name the target it acts on, which this tool requires. Call it again "
        "with its target argument filled in, or ask the user for the target."
    ),
    "approval_denied": (
        "Approval for this call was not given. Do not retry it; tell the user that it was not approved."
    ),
    "store_unavailable": (
        "The record that guards it against running twice could not be written, so nothing was "
        "done. It is safe to try again later; if it keeps failing, tell the user."
    ),
    "result_not_stored": (
        "This same call already ran earlier, but its result could not be kept, so it is neither "
        "run again nor repeated here. Do not issue it again; tell the user it was done and that "
        "its result is not available."
    ),
    "record_corrupt": (
        "The record of an earlier attempt of this call is damaged, so it is neither run again nor "
        "replayed. Do not retry it; tell the user it needs to be checked by a person."
    ),
    "effect_in_progress": (
        "An earlier attempt of this same call is still running. Do not issue it under a new id: it "
        "may take effect. Ask again later with the same tool call id to get its result."
    ),
}


class EffectOutcomeUnknown(Exception):
    """Raised by a tool to say it cannot tell whether its effect took place.

    The guard records the call ``unknown``: a retry of a tool that is not reversible is refused
    until an operator resolves the record.
    """


class EffectRefused(Exception):
    """The guard refused to run (or replay) a tool call. ``reason`` says why.

    Catch this class for every refusal; each reason has a subclass. Attributes:

    - ``reason``: one of :data:`RefusalReason` (``effect_status_unknown``, ``policy_violation``,
      ``tool_call_id_required``, ``target_args_required``, ``approval_denied``,
      ``store_unavailable``, ``result_not_stored``, ``record_corrupt``, ``effect_in_progress``); a
      class attribute of the subclass.
    - ``message``: what happened, for people and logs.
    - ``fix_hint``: what to do next (for a call in doubt: the ``airlock-redis resolve`` command for
      this store); ``str(error)`` is ``[reason] message fix_hint``.
    - ``model_message``: the text to give the model in place of the tool's result (no key or
      operator command in it).
    - ``tool``: the tool's name.
    - ``tool_call_id``: the call's id (None when the call carried no usable one).
    - ``idempotency_key``: the sha256 of the tool and its canonical arguments, to ask the backend
      about (None when the refusal came before it was computed).

    ``repr(error)`` shows the class, reason, tool, tool_call_id and message. A refusal survives
    ``copy.copy`` and a pickle round trip (to another process) with its class and every attribute.

    This class itself is abstract: raise one of its subclasses (``EffectRefused(...)`` raises
    ``TypeError``).
    """

    reason: RefusalReason  # set by each subclass

    def __init__(
        self,
        message: str,
        *,
        tool: str,
        tool_call_id: str | None,
        idempotency_key: str | None = None,
        fix_hint: str = "",
    ) -> None:
        reason = getattr(type(self), "reason", None)
        if reason not in MODEL_MESSAGES:  # the abstract base, or a subclass without a known reason
            has = "no reason" if reason is None else f"reason {reason!r}, which is not a refusal reason"
            raise TypeError(
                f"{type(self).__name__} has {has}, so it cannot be raised: raise the subclass for the "
                f"reason instead ({', '.join(c.__name__ for c in _SUBCLASSES)})"
            )
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

    def __repr__(self) -> str:
        # frameworks print the repr of a tool's exception: it shows why, not only the class
        return (
            f"{type(self).__name__}(reason={self.reason!r}, tool={self.tool!r}, "
            f"tool_call_id={self.tool_call_id!r}, message={self.message!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # the keyword-only arguments are not in ``args``: Exception's own reduce would call
        # ``cls(message)`` and fail, in copy.copy and in pickle alike
        fields = {
            "tool": self.tool,
            "tool_call_id": self.tool_call_id,
            "idempotency_key": self.idempotency_key,
            "fix_hint": self.fix_hint,
        }
        return (_rebuild_refusal, (type(self), self.message, fields), self.__dict__)

    @property
    def model_message(self) -> str:
        """What to tell the model in place of the tool's result: what happened, and what to do
        (never "please try again" for a call that may have taken effect). No key or command for an
        operator: those are in ``str(error)`` for the logs."""
        return f"Tool {self.tool!r} was not run. {MODEL_MESSAGES[self.reason]}"


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


class EffectInProgress(EffectRefused):
    """An earlier attempt of the call still runs (it renews its lease): it is neither run a second
    time beside it nor in doubt; the same tool_call_id asked again later gets its outcome."""

    reason = "effect_in_progress"


_SUBCLASSES: tuple[type[EffectRefused], ...] = (
    EffectStatusUnknown,
    EffectPolicyViolation,
    ToolCallIdRequired,
    TargetArgsRequired,
    ApprovalDenied,
    StoreUnavailable,
    ResultNotStored,
    RecordCorrupt,
    EffectInProgress,
)


def _rebuild_refusal(cls: type[EffectRefused], message: str, fields: dict[str, Any]) -> EffectRefused:
    """A refusal again, from what :meth:`EffectRefused.__reduce__` kept (for copy and pickle)."""
    return cls(message, **fields)


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
