"""The refusals the guard raises, each with a message that says what happened and what to do."""

from __future__ import annotations

import shlex
import threading
from collections.abc import Sequence

from .errors import (
    ApprovalDenied,
    EffectInProgress,
    EffectPolicyViolation,
    EffectRefused,
    EffectStatusUnknown,
    RecordCorrupt,
    RefusalReason,
    ResultNotStored,
    StoreUnavailable,
    TargetArgsRequired,
    ToolCallIdRequired,
)
from .records import BeginKind, BeginOutcome, BeginRequest, Record
from .reversibility import Reversibility


def resolve_command(tool_call_id: str, verdicts: str, target: str | None) -> str:
    """How an operator records a verdict on this call: the ``airlock-redis resolve`` command line
    for the store's Redis (``target``: its ``--url``/``--namespace`` options), or, for a store that
    lives in the process (``target`` None), the guard's method."""
    if target is None:
        return f"guard.resolve({tool_call_id!r}, ..., seen=guard.store.get({tool_call_id!r})) in the process"
    return f"airlock-redis resolve {shlex.quote(tool_call_id)} {target} {verdicts}".replace("  ", " ")


def _ask_backend(tool_call_id: str, key: str, target: str | None) -> str:
    return (
        f"Do not retry. Ask the backend whether the operation with idempotency key {key} took place, "
        "then record the answer (a command for each, so that none pastes as a shell pipe): if it took "
        f"place, the command below with --committed in place of --release; if it did not: "
        f"{resolve_command(tool_call_id, '--release', target)}."
    )


def _seconds(ms: int | None) -> str:
    return "?" if ms is None else f"{ms / 1000:.3g} s"


def status_unknown(
    tool: str, tool_call_id: str, key: str, outcome: BeginOutcome, target: str | None = ""
) -> EffectStatusUnknown:
    found = outcome.kind.value
    if outcome.kind is BeginKind.ABANDONED:
        found = (
            f"abandoned: its lease of {_seconds(outcome.lease_ms)} lapsed (not renewed for "
            f"{_seconds(outcome.since_renewal_ms)}), so its worker is gone or hung"
        )
    return EffectStatusUnknown(
        f"An earlier attempt of {tool!r} under tool_call_id {tool_call_id!r} is {found} "
        f"(attempt {outcome.attempt}): it may already have taken effect, and the tool is not reversible.",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint=_ask_backend(tool_call_id, key, target),
    )


def for_begin(
    reason: RefusalReason, request: BeginRequest, outcome: BeginOutcome, target: str | None = ""
) -> EffectRefused:
    """The refusal for what begin found (:func:`~airlock_redis.core.decision.decide`'s reason)."""
    tool, tool_call_id, key = request.tool, request.tool_call_id, request.idempotency_key
    if reason == "policy_violation":
        return policy_violation(tool, tool_call_id, key, outcome)
    if reason == "result_not_stored":
        return result_not_stored(tool, tool_call_id, key)
    if reason == "effect_in_progress":
        return in_progress(tool, tool_call_id, key, outcome, target)
    return status_unknown(tool, tool_call_id, key, outcome, target)


def backend_cannot_tell(request: BeginRequest, attempt: int, target: str | None = "") -> EffectStatusUnknown:
    """In doubt, and the tool's probe could not tell (it answered None, raised, or ran out of time)."""
    tool, tool_call_id, key = request.tool, request.tool_call_id, request.idempotency_key
    return EffectStatusUnknown(
        f"An earlier attempt of {tool!r} under tool_call_id {tool_call_id!r} may already have taken effect "
        f"(attempt {attempt}), and its backend could not tell (the tool's probe gave no answer): the tool "
        "is not reversible.",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint=_ask_backend(tool_call_id, key, target),
    )


def _watch(tool_call_id: str, target: str | None) -> str:
    """How an operator watches a running call: the ``inspect`` command, or the store's record."""
    if target is None:
        return "the store's record"
    return f"airlock-redis inspect {shlex.quote(tool_call_id)} {target}".replace("  ", " ")


def in_progress(
    tool: str, tool_call_id: str, key: str, outcome: BeginOutcome, target: str | None = ""
) -> EffectInProgress:
    """An earlier attempt runs: its record is renewed within its lease. The hint never says resolve
    (a verdict would fence off an attempt that is working)."""
    where = _watch(tool_call_id, target)
    return EffectInProgress(
        f"An earlier attempt of {tool!r} under tool_call_id {tool_call_id!r} is still running "
        f"(attempt {outcome.attempt}, renewed {_seconds(outcome.since_renewal_ms)} ago within its lease "
        f"of {_seconds(outcome.lease_ms)}): it is not run a second time beside it.",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint=(
            f"Ask again later with the same tool_call_id: it then gets that attempt's outcome. Do not "
            f"retry under a new id. To watch it: {where}."
        ),
    )


def policy_violation(tool: str, tool_call_id: str, key: str, outcome: BeginOutcome) -> EffectPolicyViolation:
    what = f"another tool ({outcome.tool!r})" if outcome.tool and outcome.tool != tool else "other arguments"
    return EffectPolicyViolation(
        f"tool_call_id {tool_call_id!r} was already used for {what}; a replay must repeat the same tool "
        "with the same arguments.",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint="Do not retry under this id: a different call needs a new tool_call_id.",
    )


def result_not_stored(tool: str, tool_call_id: str, key: str) -> ResultNotStored:
    return ResultNotStored(
        f"{tool!r} already ran under tool_call_id {tool_call_id!r}, but its result could not be stored "
        "(not serialisable, or over the size limit), so it cannot be replayed.",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint=f"Do not retry. The effect took place; its idempotency key is {key}.",
    )


def record_corrupt(tool: str, tool_call_id: str, key: str, why: str) -> RecordCorrupt:
    return RecordCorrupt(
        f"The stored record of tool_call_id {tool_call_id!r} ({tool!r}) cannot be trusted: {why}. "
        "It is neither replayed nor run again.",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint=(
            "Do not retry. Inspect it with airlock-redis inspect, ask the backend about idempotency key "
            f"{key}, then resolve it."
        ),
    )


def record_from_a_newer_release(tool: str, tool_call_id: str, key: str, version: str) -> RecordCorrupt:
    """A record in a layout this release does not read: refused as it is, and the fix is an upgrade
    (resolving it from here is refused too, so the hint does not send anyone there)."""
    return RecordCorrupt(
        f"The stored record of tool_call_id {tool_call_id!r} ({tool!r}) was written by a newer "
        f"airlock-redis (record layout version {version!r}), which this one cannot read. It is neither "
        "replayed nor run again.",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint=(
            "Do not retry from this host: upgrade airlock-redis on this host to the release the other hosts "
            "run (docs/store.md, 'Record layout versions and upgrades'); the call replays there."
        ),
    )


def store_unavailable(
    tool: str, tool_call_id: str, key: str, why: str, target: str | None = ""
) -> StoreUnavailable:
    return StoreUnavailable(
        f"The effect store could not record the call, so {tool!r} did not run ({why}).",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint=(
            "Nothing took effect: retry with the same tool_call_id once the store is reachable. "
            f"If the store kept this attempt's record and a retry is refused as effect_status_unknown, "
            f"clear it with: {resolve_command(tool_call_id, '--release', target)}."
        ),
    )


# Said whenever an id is missing: a worker thread does not see the context it was submitted from.
_BY_HAND = (
    "A worker thread (a ThreadPoolExecutor, loop.run_in_executor) does not see the context variables "
    "of the code that submitted it, even inside that `with` block: there, pass the id by hand, "
    "`guard.call(tool_call.id, fn, *args, **kwargs)` (or `await guard.acall(...)` for an async tool)."
)


def tool_call_id_required(tool: str, tag: Reversibility, problem: str) -> ToolCallIdRequired:
    """The refusal of a call that carries no usable tool_call_id. Its hint names both ways to carry
    the id; in a thread other than the main one (where a context variable set by the submitting
    code is not seen) it starts with the by-hand way, ``guard.call``."""
    in_context = (
        "The host must carry the model's tool call id on the call: "
        "`with tool_call_context(tool_call.id): ...`, or under agent_airlock "
        "`with AirlockContext(metadata={'tool_call_id': tool_call.id}): ...`."
    )
    if threading.current_thread() is threading.main_thread():
        hint = f"{in_context} {_BY_HAND}"
    else:
        where = f"This call runs in the thread {threading.current_thread().name!r}, not the main one."
        hint = f"{where} {_BY_HAND} Elsewhere: {in_context[0].lower()}{in_context[1:]}"
    return ToolCallIdRequired(
        f"{tool!r} is {tag.value} and {problem}, so it cannot be run at most once.",
        tool=tool,
        tool_call_id=None,
        fix_hint=hint,
    )


def target_args_required(tool: str, tool_call_id: str | None, targets: Sequence[str]) -> TargetArgsRequired:
    names = ", ".join(targets)
    return TargetArgsRequired(
        f"{tool!r} is irreversible and the call names none of its targets ({names}).",
        tool=tool,
        tool_call_id=tool_call_id,
        fix_hint=f"Pass at least one of these arguments with a value: {names}.",
    )


def approval_denied(tool: str, tool_call_id: str | None, key: str | None, why: str) -> ApprovalDenied:
    return ApprovalDenied(
        f"{tool!r} needs approval and was not approved: {why}.",
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint="Do not retry unless an approver grants this call.",
    )


def nested_in_reversible(tool: str, tool_call_id: str) -> EffectPolicyViolation:
    return EffectPolicyViolation(
        f"{tool!r} may not run again, but it was called inside the body of a reversible call under the "
        f"same tool_call_id {tool_call_id!r}: a retry of that call would run it again.",
        tool=tool,
        tool_call_id=tool_call_id,
        fix_hint="Tag the outer tool with the strictest reversibility of what it calls, or call "
        f"{tool!r} under a tool_call_id of its own.",
    )


class InDoubtAfterError(EffectStatusUnknown):
    """An :class:`EffectStatusUnknown` for the attempt that ran: its tool raised an error that
    leaves its effect in doubt (its record is ``unknown``). Its ``model_message`` says that the call
    ran and may have taken effect, not that it "was not run"."""

    def __init__(
        self,
        message: str,
        *,
        tool: str,
        tool_call_id: str | None,
        idempotency_key: str | None = None,
        fix_hint: str = "",
        model_message: str = "",
    ) -> None:
        super().__init__(
            message, tool=tool, tool_call_id=tool_call_id, idempotency_key=idempotency_key, fix_hint=fix_hint
        )
        self._model_message = model_message

    @property
    def model_message(self) -> str:
        """What to tell the model: the call may have taken effect; do not call it again."""
        return self._model_message or super().model_message


def in_doubt_after_error(
    tool: str, tool_call_id: str, key: str, error: BaseException, target: str | None = ""
) -> EffectStatusUnknown:
    """The refusal that ends an attempt whose tool raised ``error``, an error that leaves its effect
    in doubt (the tool is not reversible): what an integration gives the model on the first
    attempt, in place of the framework's "please try again". Names the error's class, never its
    text (which may hold data the model should not see)."""
    kind = type(error).__name__
    return InDoubtAfterError(
        f"{tool!r} under tool_call_id {tool_call_id!r} raised {kind}, which leaves its effect in doubt: "
        "it may have taken effect, and the tool is not reversible. Its record is unknown, and a retry "
        "is refused.",
        model_message=(
            f"The call to {tool!r} may have taken effect: it ended with {kind}, which does not tell "
            "whether it did. Do not call it again, under this id or a new one. Tell the user that this "
            "action needs to be checked by a person before anything else is done about it."
        ),
        tool=tool,
        tool_call_id=tool_call_id,
        idempotency_key=key,
        fix_hint=_ask_backend(tool_call_id, key, target),
    )


def held_in_progress(request: BeginRequest, holder: Record, target: str | None = "") -> EffectInProgress:
    """Dedupe: the same call (same idempotency key) runs under another tool_call_id, and still ran
    when this call's wait ended. This call did not run and left no record."""
    tool, key, other = request.tool, request.idempotency_key, holder.tool_call_id
    where = _watch(other, target)
    return EffectInProgress(
        f"The same call of {tool!r} (idempotency key {key}) is still running under tool_call_id "
        f"{other!r} (attempt {holder.attempt}, lease {_seconds(holder.lease_ms)}): tool_call_id "
        f"{request.tool_call_id!r} is not run beside it.",
        tool=tool,
        tool_call_id=request.tool_call_id,
        idempotency_key=key,
        fix_hint=(
            f"Ask again later (with this tool_call_id or {other!r}): it then gets that call's outcome. "
            f"To watch it: {where}."
        ),
    )


def held_in_doubt(request: BeginRequest, holder: Record, target: str | None = "") -> EffectStatusUnknown:
    """Dedupe: the same call (same idempotency key) under another tool_call_id is in doubt (unknown,
    abandoned, or pending without a lease), and the tool is not reversible. This call did not run
    and left no record; the operator resolves the other id's record."""
    tool, key, other = request.tool, request.idempotency_key, holder.tool_call_id
    found = holder.liveness or holder.status.value
    return EffectStatusUnknown(
        f"The same call of {tool!r} (idempotency key {key}) was made under tool_call_id {other!r}, whose "
        f"record is {found} (attempt {holder.attempt}): it may already have taken effect, and the tool is "
        f"not reversible, so tool_call_id {request.tool_call_id!r} is not run.",
        tool=tool,
        tool_call_id=request.tool_call_id,
        idempotency_key=key,
        fix_hint=_ask_backend(other, key, target),
    )
