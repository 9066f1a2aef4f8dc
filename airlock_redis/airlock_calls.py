"""One guarded call through the agent_airlock adapter: :class:`Tool` (what the guard knows about a
decorated tool, read once), :class:`GuardedRun` (what both of ``Airlock``'s wrappers, blocking and
async, prepare before the guard runs the call and make of what came out), and the notes a call
leaves (:func:`note_error`, :func:`explained`). Loaded by ``airlock_redis.airlock`` once it has checked
the installed agent-airlock."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent_airlock import AirlockContext, get_current_context
from agent_airlock.audit import AuditLogger

from .airlock_approval import PolicyApprover, escalation_request
from .airlock_audit import install_audit_hook
from .airlock_state import CALL_NOTE, CALL_STATE, CallState, Note, guard_of
from .approval import ApprovalRequest
from .context import current_idempotency_key
from .core.call_machine import Execution
from .core.canonical import ArgumentBinder
from .core.codec import return_annotation
from .core.errors import EffectRefused, ToolCallIdRequired
from .core.gates import GuardedCall, Plan, plan
from .core.outcome import settlement_for_error
from .core.records import Settlement
from .core.reversibility import reversibility_of
from .guard import EffectGuard

if TYPE_CHECKING:
    from .airlock import Airlock


class GuardedRun:
    """One call of a guarded tool through agent_airlock: what both wrappers (blocking and async)
    prepare before the guard runs it and make of what came out."""

    __slots__ = (
        "airlock",
        "approver",
        "args",
        "call",
        "func",
        "guard",
        "kwargs",
        "ran",
        "started",
        "state",
        "tool",
    )

    def __init__(  # noqa: PLR0917
        self,
        airlock: Airlock,
        tool: Tool,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        state: CallState,
        guard: EffectGuard,
    ) -> None:
        self.airlock, self.tool, self.func, self.args, self.kwargs = airlock, tool, func, args, kwargs
        self.state, self.guard = state, guard
        self.approver = PolicyApprover.of(state.policy, state.escalation)
        self.started, self.ran = time.time(), False

    @classmethod
    def open(
        cls,
        airlock: Airlock,
        tool: Tool,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> GuardedRun | None:
        """The call, or None when its policy has no guard (then the tool just runs)."""
        state = _take_state(tool.name)
        guard = guard_of(state.policy) if state is not None else None
        if guard is None or state is None:
            return None
        install_audit_hook(tool.audit)
        return cls(airlock, tool, func, args, kwargs, state, guard)

    def prepare(self) -> tuple[GuardedCall, ApprovalRequest | None]:
        """The call as the guard sees it, and the escalation to ask the approver about first, if
        any (one the guard does not ask itself)."""
        call, planned = self.tool.prepare(self.guard, self.args, self.kwargs, given=self.state.given)
        escalation = self.state.escalation
        if escalation is not None and planned.approval_why is None:
            return call, escalation_request(call, planned, escalation)
        return call, None

    def invoke(self) -> Any:
        """The tool body (a coroutine for an async tool), as the guard runs it."""
        self.ran = True
        _expose_key()
        return self.func(*self.args, **self.kwargs)

    def failed(self, error: Exception) -> Any:
        return self.airlock._failed(
            self.tool.name, self.guard, self.state, self.approver, error, ran=self.ran, started=self.started
        )

    def done(self, done: Execution[Any]) -> Any:
        CALL_NOTE.set(Note(audit={"effect": done.effect}))
        return done.value


class Tool:
    """What the guard needs to know about one decorated tool, read once."""

    def __init__(self, func: Callable[..., Any], outer: list[Callable[..., Any]], audit: AuditLogger) -> None:
        self.func = func
        self.name: str = getattr(func, "__name__", type(func).__name__)
        self.outer = outer  # agent_airlock's wrapper, once built: @reversibility may sit on it
        self.audit = audit  # the logger agent_airlock's wrapper writes this tool's lines with
        self.binder = ArgumentBinder(func)
        self._annotation: list[Any] = []

    def returns(self) -> Any:
        if not self._annotation:
            self._annotation.append(return_annotation(self.func))
        return self._annotation[0]

    def describe(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        given: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
    ) -> GuardedCall:
        """The call as the guard sees it: the validated ``args`` and ``kwargs`` (agent_airlock's
        validation passes every defaulted parameter explicitly), with the names the caller passed
        read from ``given``, the call's arguments before that validation, when known."""
        context = get_current_context()
        arguments, passed = self.binder.bind(args, kwargs)
        if given is not None:
            passed = self.binder.bind(*given)[1]
        carrier = context.user_context if context is not None else None
        # The run wrapper agent_airlock reads the context from is the host's, not an argument.
        skipped = {
            name
            for name, value in arguments.items()
            if isinstance(value, AirlockContext) or (carrier is not None and value is carrier)
        }
        metadata: Mapping[str, Any] = context.metadata if context is not None else {}
        return GuardedCall(
            tool=self.name,
            raw_tool_call_id=metadata.get("tool_call_id"),  # never a tool argument
            arguments={k: v for k, v in arguments.items() if k not in skipped},
            reversibility=reversibility_of(self.outer[0] if self.outer else self.func),
            passed=frozenset(passed - skipped),
        )

    def prepare(
        self,
        guard: EffectGuard,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        given: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
    ) -> tuple[GuardedCall, Plan]:
        call = self.describe(args, kwargs, given)
        if guard.dedupe is not None:  # the guard's dedupe= (see docs/in-doubt.md, "Dedupe across ids")
            call = call._replace(dedupe=guard.dedupe)
        return call, plan(call, guard.options)


def _expose_key() -> None:
    context = get_current_context()
    if context is not None:
        context.idempotency_key = current_idempotency_key()  # type: ignore[attr-defined]


def _take_state(tool: str) -> CallState | None:
    state = CALL_STATE.get()
    CALL_STATE.set(None)
    CALL_NOTE.set(None)
    return state if state is not None and state.tool == tool else None


def note_error(guard: EffectGuard, error: BaseException) -> None:
    settlement = settlement_for_error(error, guard.ambiguity)
    CALL_NOTE.set(Note(audit={"effect": "unknown" if settlement is Settlement.UNKNOWN else "released"}))


def explained(refusal: EffectRefused, state: CallState) -> EffectRefused:
    """Say why the id is missing when an ambient context carried one for another agent."""
    if not isinstance(refusal, ToolCallIdRequired) or state.ambient_id is None:
        return refusal
    context = get_current_context()
    agent = context.agent_id if context is not None else None
    if state.ambient_agent and agent and state.ambient_agent != agent:
        why = (
            f"it names agent {state.ambient_agent!r} and this call runs as agent {agent!r}, so agent_airlock "
            "does not pass its metadata on"
        )
    else:
        why = "agent_airlock took this call's metadata from the run wrapper's own context instead"
    message = f"{refusal.message} The AirlockContext around the call carries a tool_call_id, but {why}."
    return ToolCallIdRequired(
        message, tool=refusal.tool, tool_call_id=None, idempotency_key=None, fix_hint=refusal.fix_hint
    )
