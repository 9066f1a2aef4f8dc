"""The guard inside agent_airlock's ``@Airlock`` (agent-airlock 0.10.26).

Users change one import line::

    from airlock_redis import Airlock, SecurityPolicy, EffectGuard, RedisEffectStore

and put ``effect_guard=EffectGuard(...)`` on the policy. How it plugs in:

- :class:`Airlock` wraps the tool *before* agent_airlock does (``_decorator``), so the guard runs
  after every agent_airlock gate and after pydantic's strict validation, with the validated
  arguments, inside the call's ``AirlockContext``. A call any gate refuses never reaches the
  guard, so it leaves no record; a replay goes through every gate again.
- The guard's refusals come back as agent_airlock blocked responses carrying our reason code and
  our fix hint, audited as blocked. Replays go through agent_airlock's output path and are
  audited with ``"effect": "replayed"``.
- An escalation (``escalate_tools``) on a guarded policy is asked once, by the guard, after the
  arguments are validated, so the approver sees the idempotency key; sync and async approvers
  both work. An escalation the approver does not grant is answered as agent_airlock answers it
  (``escalation_denied`` or ``escalation_timeout``, with the approver's ``detail``): the guard
  only relays it. ``require_approval_for_irreversible`` asks the policy's approver the same way;
  its refusal is the guard's own (``approval_denied``).
- :class:`SecurityPolicy` adds the ``effect_guard`` field, keeps it through ``freeze()`` and
  covers its configuration in the frozen digest. A guarded policy used by a plain
  ``agent_airlock.Airlock`` refuses every call instead of running it unguarded; a call
  agent_airlock's own checks refuse keeps agent_airlock's reason.
- Without an ``effect_guard`` both classes behave as agent_airlock's: the same results, refusals,
  digests, ``__wrapped__`` and audit lines (``tests/test_airlock_parity.py``).

This relies on private parts of agent_airlock, checked when this module is imported.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
import functools
import importlib.util
import inspect
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal, ParamSpec, TypeVar, cast

SUPPORTED_AGENT_AIRLOCK = ">=0.10.26,<0.10.27"
_MIN_VERSION = (0, 10, 26)
_MAX_VERSION = (0, 10, 27)  # exclusive: only what the adapter tests ran against (see docs/agent-airlock.md)


def _version_tuple(text: str) -> tuple[int, ...] | None:
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else None


def _unsupported(found: str, problem: str) -> ImportError:
    return ImportError(
        f"airlock_redis.airlock supports agent-airlock {SUPPORTED_AGENT_AIRLOCK} (tested with 0.10.26); "
        f"the installed agent-airlock {found} {problem}. Install a supported version "
        f'(pip install "agent-airlock{SUPPORTED_AGENT_AIRLOCK}"), or use EffectGuard.wrap without @Airlock.'
    )


try:
    import agent_airlock
    from agent_airlock import Airlock as _BaseAirlock
    from agent_airlock import AirlockConfig, AirlockContext, get_current_context, self_heal
    from agent_airlock import SecurityPolicy as _BasePolicy
    from agent_airlock.audit import AuditLogger, AuditRecord
    from agent_airlock.oversight import OversightRequest, OversightResponse, OversightVerdict
    from agent_airlock.policy import PolicyEscalation, PolicyViolation
    from agent_airlock.self_heal import AirlockResponse, BlockReason, handle_escalation
except ImportError as _exc:  # pragma: no cover - depends on the installed agent-airlock
    raise _unsupported("(not importable)", f"cannot be imported ({_exc})") from _exc


def _check_agent_airlock() -> None:
    """Refuse to load against an agent-airlock whose private hooks may differ from 0.10.26's."""
    found = str(getattr(agent_airlock, "__version__", "unknown"))
    version = _version_tuple(found)
    if version is None or not _MIN_VERSION <= version < _MAX_VERSION:
        raise _unsupported(found, "is outside that range")
    hooks: list[tuple[Any, str, tuple[str, ...]]] = [
        (_BaseAirlock, "_decorator", ("self", "func")),
        (_BaseAirlock, "_resolve_and_check_policy", ("self", "func_name", "context", "run_context")),
        (_BaseAirlock, "_resolve_escalation", ("self", "policy", "func_name", "escalation")),
        (_BaseAirlock, "_log_blocked", ("self", "func_name", "response", "start_time")),
        (_BaseAirlock, "_safe_invoke_callback", ()),
        (_BaseAirlock, "_execute_in_sandbox", ()),
        (AuditLogger, "_write_record", ("self", "record")),
        (_BasePolicy, "_canonical_bytes", ("self",)),
        (_BasePolicy, "_compute_policy_digest", ("self",)),
        (_BasePolicy, "freeze", ("self",)),
        (_BasePolicy, "check", ("self", "tool_name", "agent", "dt")),
        (self_heal, "handle_escalation", ("func_name", "reason", "rule", "outcome", "detail", "approver")),
    ]
    for owner, name, parameters in hooks:
        hook = getattr(owner, name, None)
        if not callable(hook):
            raise _unsupported(found, f"has no {owner.__name__}.{name}")
        if parameters and tuple(inspect.signature(hook).parameters)[: len(parameters)] != parameters:
            raise _unsupported(found, f"has a different {owner.__name__}.{name} signature")
    run_context = inspect.signature(_BaseAirlock._resolve_and_check_policy).parameters["run_context"]
    if run_context.kind is not inspect.Parameter.KEYWORD_ONLY:
        raise _unsupported(found, "has a different Airlock._resolve_and_check_policy signature")
    if "effect_guard" in {f.name for f in dataclasses.fields(_BasePolicy)}:
        raise _unsupported(found, "already has SecurityPolicy.effect_guard")
    if importlib.util.find_spec("agent_airlock.effect_guard") is not None:
        raise _unsupported(found, "ships its own agent_airlock.effect_guard")


_check_agent_airlock()

from .approval import ApprovalRequest, approval_request, approve, approve_blocking  # noqa: E402
from .context import current_idempotency_key  # noqa: E402
from .core.call_machine import Execution  # noqa: E402
from .core.canonical import ArgumentBinder  # noqa: E402
from .core.codec import return_annotation  # noqa: E402
from .core.errors import ApprovalDenied, CanonicalizationError, EffectRefused, ToolCallIdRequired  # noqa: E402
from .core.gates import GuardedCall, Plan, plan  # noqa: E402
from .core.outcome import settlement_for_error  # noqa: E402
from .core.records import Settlement  # noqa: E402
from .core.reversibility import reversibility_of  # noqa: E402
from .guard import EffectGuard  # noqa: E402

__all__ = ["SUPPORTED_AGENT_AIRLOCK", "Airlock", "SecurityPolicy"]

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger("airlock_redis")

_GUARDED_SANDBOX = (
    "sandbox=True cannot be combined with an effect_guard: agent-airlock's sandbox reports a tool's "
    "error only as text and a lost sandbox result like a sandbox that never started, so the guard "
    "could not tell an effect in doubt from one that never happened. Run the tool without "
    "sandbox=True, or under a policy without effect_guard."
)


# -- per-call state shared between the gates and the guard ---------------------------------------
@dataclass
class _CallState:
    """Written at agent_airlock's policy step, read by the guard below it."""

    tool: str
    policy: _BasePolicy | None
    escalation: PolicyEscalation | None = None
    ambient_agent: str | None = None
    ambient_id: Any = None
    checking: bool = False  # True while agent_airlock's policy step runs


@dataclass
class _Note:
    """What the guard tells agent_airlock's audit writer and return_dict about this call."""

    audit: dict[str, Any] | None = None
    refused: bool = False


_STATE: contextvars.ContextVar[_CallState | None] = contextvars.ContextVar(
    "airlock_redis_airlock_call", default=None
)
_NOTE: contextvars.ContextVar[_Note | None] = contextvars.ContextVar(
    "airlock_redis_airlock_note", default=None
)


def _guard_of(policy: Any) -> EffectGuard | None:
    guard = getattr(policy, "effect_guard", None)
    return guard if isinstance(guard, EffectGuard) else None


def _checking(tool: str) -> bool:
    """Whether airlock_redis.Airlock's policy step for ``tool`` is running in this context."""
    state = _STATE.get()
    return state is not None and state.tool == tool and state.checking


class _ReasonCode(str):
    """A block_reason outside agent_airlock's closed BlockReason enum (only ``.value`` is read)."""

    @property
    def value(self) -> str:
        return str(self)


# -- the policy -----------------------------------------------------------------------------------
@dataclass
class SecurityPolicy(_BasePolicy):
    """agent_airlock's SecurityPolicy with an ``effect_guard`` field.

    Only :class:`Airlock` from this package applies the guard. A call under ``agent_airlock.Airlock``
    (or a framework integration that builds it) is refused rather than run without the guard.
    """

    effect_guard: EffectGuard | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.effect_guard is not None and not isinstance(self.effect_guard, EffectGuard):
            raise TypeError(f"effect_guard must be an airlock_redis.EffectGuard, not {self.effect_guard!r}")

    def check(self, tool_name: str, agent: Any = None, dt: datetime | None = None) -> None:
        """agent_airlock's checks, unchanged: a call they refuse keeps agent_airlock's reason.

        With an ``effect_guard``, a call those checks let through (or escalate) is refused unless
        ``airlock_redis.Airlock`` is checking it: anywhere else it would run without the guard.
        An escalation is refused too, because agent_airlock would run the call unguarded once
        its approver granted it.
        """
        if self.effect_guard is None or _checking(tool_name):
            super().check(tool_name, agent=agent, dt=dt)
            return
        escalation: PolicyEscalation | None = None
        try:
            super().check(tool_name, agent=agent, dt=dt)
        except PolicyEscalation as escalated:
            escalation = escalated
        log.error(
            "airlock_redis: %r has an effect_guard but is checked outside airlock_redis.Airlock; "
            "the call is refused",
            tool_name,
        )
        details: dict[str, Any] = {"tool": tool_name}
        if escalation is not None:
            details.update(escalation_rule=escalation.rule, escalation_reason=escalation.reason)
        raise PolicyViolation(
            f"Tool '{tool_name}' is under a policy with an effect_guard but was not decorated "
            "with airlock_redis.Airlock, so it cannot run at most once. Import Airlock from "
            "airlock_redis instead of agent_airlock.",
            violation_type="effect_guard_unsupported",
            details=details,
        ) from escalation

    def freeze(self) -> SecurityPolicy:
        """A frozen copy that keeps this class and the guard (shared, not copied)."""
        kwargs: dict[str, Any] = {}
        for spec in dataclasses.fields(self):
            if spec.name.startswith("_"):
                continue
            value = getattr(self, spec.name)
            kwargs[spec.name] = copy.deepcopy(value) if isinstance(value, dict | list | set) else value
        frozen = type(self)(**kwargs)
        frozen._frozen_digest = frozen._compute_policy_digest()
        return frozen

    def _canonical_bytes(self) -> bytes:
        # Without a guard: agent_airlock's bytes, so the digest is agent_airlock's. With one, its
        # description follows a NUL byte, which agent_airlock's JSON never contains.
        guard = self.effect_guard
        if guard is None:
            return super()._canonical_bytes()
        described = {
            "store": type(guard.store).__qualname__,
            "require_tool_call_id": guard.require_tool_call_id,
            "require_approval_for_irreversible": guard.require_approval_for_irreversible,
            "target_args": list(guard.target_args),
            "ambiguous_errors": sorted(f"{e.__module__}.{e.__qualname__}" for e in guard.ambiguous_errors),
            "has_approver": guard.approver is not None,
            "max_result_bytes": guard.max_result_bytes,
        }
        extra = json.dumps({"effect_guard": described}, sort_keys=True, separators=(",", ":"))
        return super()._canonical_bytes() + b"\x00" + extra.encode("utf-8")


# -- approvals ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Answer:
    """Why the policy's approver did not grant: agent_airlock's escalation outcome and detail."""

    outcome: Literal["denied", "timeout"]
    detail: str
    approver: str | None
    verdict: bool  # the approver answered DENY or TIMEOUT (not a fault of the approver)


class _PolicyApprover:
    """The policy's agent_airlock approver (OversightRequest -> OversightResponse, sync or async)
    asked as the guard's ApprovalRequest -> bool. ``answer`` keeps why it did not grant."""

    def __init__(self, policy: _BasePolicy, escalation: PolicyEscalation | None) -> None:
        self.policy = policy
        self.escalation = escalation
        self.answer: _Answer | None = None

    @classmethod
    def of(cls, policy: _BasePolicy | None, escalation: PolicyEscalation | None) -> _PolicyApprover | None:
        if policy is None or policy.approver is None:
            return None
        return cls(policy, escalation)

    def __call__(self, request: ApprovalRequest) -> bool | Awaitable[bool]:
        self.answer = None
        oversight = self._request(request)
        ask: Callable[[OversightRequest], Any] = self.policy.approver  # type: ignore[assignment]
        try:
            answer = ask(oversight)
        except Exception as exc:
            raise self._failed(exc) from exc
        if inspect.isawaitable(answer):
            pending = answer

            async def finish() -> bool:
                try:
                    reply = await pending
                except Exception as exc:
                    raise self._failed(exc) from exc
                return self._granted(reply, oversight)

            return finish()
        return self._granted(answer, oversight)

    def _request(self, request: ApprovalRequest) -> OversightRequest:
        why = request.why
        details: dict[str, Any] = {}
        escalation = self.escalation
        if escalation is not None:
            details = {"escalation_reason": escalation.reason, "escalation_rule": escalation.rule}
            if escalation.reason not in why:
                why = f"{why}; escalate_tools rule {escalation.rule!r}: {escalation.reason}"
        return OversightRequest(
            request_id=str(uuid.uuid4()),
            tool_name=request.tool,
            args={
                "why": why,
                "idempotency_key": request.idempotency_key,
                "tool_call_id": request.tool_call_id,
                "reversibility": request.reversibility.value,
                "arguments": dict(request.arguments),
                **details,
            },
            channel=self.policy.escalation_channel,
            timeout_seconds=float(self.policy.escalation_timeout_seconds),
            requested_at=datetime.now(timezone.utc).isoformat(),
        )

    def _failed(self, error: Exception) -> Exception:
        self.answer = _Answer("denied", f"the approver raised {type(error).__name__}: {error}", None, False)
        return error

    def _granted(self, reply: Any, request: OversightRequest) -> bool:
        if not isinstance(reply, OversightResponse):
            detail = f"the approver returned {type(reply).__name__}, not an OversightResponse"
            self.answer = _Answer("denied", detail, None, False)
            raise TypeError(detail)
        if reply.request_id != request.request_id:
            detail = (
                f"the approver answered request {reply.request_id!r}, not this call's request "
                f"{request.request_id!r}"
            )
            self.answer = _Answer("denied", detail, reply.approver, False)
            raise ValueError(detail)
        if reply.verdict is OversightVerdict.GRANT:
            return True
        outcome: Literal["denied", "timeout"] = (
            "timeout" if reply.verdict is OversightVerdict.TIMEOUT else "denied"
        )
        self.answer = _Answer(outcome, reply.detail, reply.approver, True)
        return False


def _escalation_request(call: GuardedCall, planned: Plan, escalation: PolicyEscalation) -> ApprovalRequest:
    return approval_request(call, planned, f"escalate_tools rule {escalation.rule!r}: {escalation.reason}")


# -- the decorator --------------------------------------------------------------------------------
class Airlock(_BaseAirlock):
    """agent_airlock's ``@Airlock`` that applies the policy's ``effect_guard`` to each call.

    The tool it returns is agent_airlock's wrapper, with the decorated function as ``__wrapped__``.
    Under a policy without a guard, calls behave exactly as under agent_airlock's ``Airlock``.
    """

    @property
    def return_dict(self) -> bool:
        """agent_airlock's ``return_dict`` option (True: every result comes back as a response dict),
        read as False for a call the guard refused (its refusal is already a blocked response)."""
        # agent_airlock reads this after the tool returned: a guard refusal is already a
        # blocked response and must not be wrapped as a success. The value lives where
        # agent_airlock keeps it (the instance's __dict__), as it was given.
        note = _NOTE.get()
        if note is not None and note.refused:
            note.refused = False
            return False
        return cast(bool, self.__dict__.get("return_dict", False))

    @return_dict.setter
    def return_dict(self, value: bool) -> None:
        self.__dict__["return_dict"] = value

    @property
    def config(self) -> AirlockConfig:
        """agent_airlock's ``AirlockConfig`` for this tool; for a call the guard refused, a copy with
        ``sanitize_output`` off (the refusal is not a tool output to sanitise)."""
        # agent_airlock passes what the tool returned through its output sanitizer, but never
        # its own blocked responses: a guard refusal, returned in the tool's place, is one.
        config: AirlockConfig = self.__dict__["config"]
        note = _NOTE.get()
        if note is None or not note.refused or not config.sanitize_output:
            return config
        unsanitized = copy.copy(config)
        unsanitized.sanitize_output = False
        return unsanitized

    @config.setter
    def config(self, value: AirlockConfig) -> None:
        self.__dict__["config"] = value

    # agent_airlock's hooks ------------------------------------------------------------------------
    def _decorator(self, func: Callable[P, R]) -> Callable[P, R | dict[str, Any]]:
        if self.sandbox and _guard_of(self.policy) is not None:
            raise TypeError(f"@Airlock on {getattr(func, '__name__', func)!r}: {_GUARDED_SANDBOX}")
        if not hasattr(func, "__name__"):
            # agent_airlock names a tool by its __name__ and cannot run one without it (a partial
            # fails on every call, a callable object when decorated). Its own decorator answers,
            # on this instance's settings; a guarded policy then refuses every call (check()).
            plain = object.__new__(_BaseAirlock)
            plain.__dict__ = self.__dict__
            return plain._decorator(func)
        outer: list[Callable[..., Any]] = []
        wrapped = super()._decorator(self._guarded(func, outer))
        # agent_airlock's wrapper points at the function it was given, which is ours: point it
        # at the user's function, as agent_airlock's own decorator does.
        wrapped.__wrapped__ = func  # type: ignore[attr-defined]
        outer.append(wrapped)
        return wrapped

    def _resolve_and_check_policy(
        self, func_name: str, context: AirlockContext[Any], *, run_context: AirlockContext[Any] | None
    ) -> tuple[_BasePolicy | None, AirlockResponse | None]:
        ambient = get_current_context()
        state = _CallState(
            tool=func_name,
            policy=None,
            ambient_agent=ambient.agent_id if ambient is not None else None,
            ambient_id=ambient.metadata.get("tool_call_id") if ambient is not None else None,
        )
        _STATE.set(state)
        _NOTE.set(None)  # nothing an earlier call noted applies to this one
        state.checking = True
        try:
            resolved, refusal = super()._resolve_and_check_policy(func_name, context, run_context=run_context)
        finally:
            state.checking = False
        state.policy = resolved
        if refusal is None and self.sandbox and _guard_of(resolved) is not None:
            refusal = AirlockResponse.blocked_response(
                reason=BlockReason.SANDBOX_ERROR,
                error=f"AIRLOCK_BLOCK: '{func_name}' {_GUARDED_SANDBOX}",
                fix_hints=["Nothing ran. Ask the operator to remove sandbox=True or the effect_guard."],
                metadata={"function": func_name},
            )
        return resolved, refusal

    def _resolve_escalation(
        self, policy: _BasePolicy, func_name: str, escalation: PolicyEscalation
    ) -> AirlockResponse | None:
        state = _STATE.get()
        if _guard_of(policy) is None or policy.approver is None or state is None or state.tool != func_name:
            return super()._resolve_escalation(policy, func_name, escalation)
        # Asked by the guard once the arguments are validated, so the approver sees the
        # idempotency key (and an async approver works).
        state.escalation = escalation
        return None

    # the guard ------------------------------------------------------------------------------------
    def _guarded(self, func: Callable[..., Any], outer: list[Callable[..., Any]]) -> Callable[..., Any]:
        """The wrapper agent_airlock treats as the tool: it runs after every gate and validation.
        Without a guard on the call's policy it only calls ``func``."""
        config = self.config
        tool = _Tool(
            func,
            outer,
            AuditLogger(config.audit_log_path if config.enable_audit_log else None, config.enable_audit_log),
        )
        # agent_airlock picks its async wrapper with this test on what it wraps: the same answer.
        if asyncio.iscoroutinefunction(func):

            @functools.wraps(func)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                call = _GuardedRun.open(self, tool, func, args, kwargs)
                if call is None:
                    return await func(*args, **kwargs)
                try:
                    described, escalation = call.prepare()
                    if escalation is not None:
                        await approve(call.approver, escalation)
                    done = await call.guard.aexecute(
                        described, call.invoke, approver=call.approver, annotation=tool.returns
                    )
                except Exception as error:
                    return call.failed(error)
                except BaseException as error:
                    _note_error(call.guard, error)
                    raise
                return call.done(done)

            return guarded_async

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            call = _GuardedRun.open(self, tool, func, args, kwargs)
            if call is None:
                return func(*args, **kwargs)
            try:
                described, escalation = call.prepare()
                if escalation is not None:
                    approve_blocking(call.approver, escalation)
                done = call.guard.execute(
                    described, call.invoke, approver=call.approver, annotation=tool.returns
                )
            except Exception as error:
                return call.failed(error)
            except BaseException as error:
                _note_error(call.guard, error)
                raise
            return call.done(done)

        return guarded

    def _failed(
        self,
        tool: str,
        guard: EffectGuard,
        state: _CallState,
        approver: _PolicyApprover | None,
        error: Exception,
        *,
        ran: bool,
        started: float,
    ) -> dict[str, Any]:
        """A guard refusal becomes a blocked response; a tool's own error goes on to agent_airlock."""
        answer = approver.answer if approver is not None else None
        if isinstance(error, ApprovalDenied) and not ran and answer is not None:
            if state.escalation is not None:
                return self._relayed_escalation(tool, state.escalation, answer, started)
            kept = {"approval_outcome": answer.outcome, "detail": answer.detail, "approver": answer.approver}
            return self._refused(tool, error, started, extra=kept)
        if isinstance(error, EffectRefused) and not ran:
            return self._refused(tool, _explained(error, state), started)
        if isinstance(error, CanonicalizationError) and not ran:
            return self._block(
                tool,
                BlockReason.VALIDATION_ERROR.value,
                f"'{tool}' cannot be guarded: {error}",
                "Nothing ran. Call the tool with plain-data arguments.",
                metadata={},
                started=started,
            )
        _note_error(guard, error)
        raise error

    # refusals -------------------------------------------------------------------------------------
    def _relayed_escalation(
        self, tool: str, escalation: PolicyEscalation, answer: _Answer, started: float
    ) -> dict[str, Any]:
        """An escalation the approver did not grant: agent_airlock's own response and callback."""
        response = handle_escalation(
            tool,
            reason=escalation.reason,
            rule=escalation.rule,
            outcome=answer.outcome,
            detail=answer.detail,
            approver=answer.approver,
        )
        if answer.verdict:  # agent_airlock calls on_blocked for a DENY or TIMEOUT verdict only
            self._safe_invoke_callback(
                self.config.on_blocked,
                "on_blocked",
                tool,
                escalation.message,
                {"violation_type": escalation.violation_type, **escalation.details},
            )
        return self._answer(tool, response, started)

    def _block(
        self, tool: str, reason: str, error: str, hint: str, *, metadata: dict[str, Any], started: float
    ) -> dict[str, Any]:
        response = AirlockResponse.blocked_response(
            reason=cast(BlockReason, _ReasonCode(reason)),
            error=f"AIRLOCK_BLOCK: {error}",
            fix_hints=[hint],
            metadata={"function": tool, **metadata},
        )
        self._safe_invoke_callback(
            self.config.on_blocked, "on_blocked", tool, error, {"violation_type": reason}
        )
        return self._answer(tool, response, started)

    def _answer(self, tool: str, response: AirlockResponse, started: float) -> dict[str, Any]:
        """Log the blocked response, note it for the audit line and return_dict, and return it."""
        self._log_blocked(tool, response, started)
        reason = response.block_reason.value if response.block_reason is not None else "unknown"
        _NOTE.set(
            _Note(
                audit={
                    "blocked": True,
                    "block_reason": reason,
                    "error": response.error,
                    "result_preview": "BLOCKED",
                    "effect": "refused",
                },
                refused=True,
            )
        )
        return response.to_dict()

    def _refused(
        self, tool: str, refusal: EffectRefused, started: float, *, extra: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        metadata = {"tool_call_id": refusal.tool_call_id, "idempotency_key": refusal.idempotency_key}
        hint = refusal.fix_hint or "Do not retry this call."
        kept: dict[str, Any] = {k: v for k, v in metadata.items() if v}
        kept.update(extra or {})
        return self._block(tool, refusal.reason, refusal.message, hint, metadata=kept, started=started)


class _GuardedRun:
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
        tool: _Tool,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        state: _CallState,
        guard: EffectGuard,
    ) -> None:
        self.airlock, self.tool, self.func, self.args, self.kwargs = airlock, tool, func, args, kwargs
        self.state, self.guard = state, guard
        self.approver = _PolicyApprover.of(state.policy, state.escalation)
        self.started, self.ran = time.time(), False

    @classmethod
    def open(
        cls,
        airlock: Airlock,
        tool: _Tool,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> _GuardedRun | None:
        """The call, or None when its policy has no guard (then the tool just runs)."""
        state = _take_state(tool.name)
        guard = _guard_of(state.policy) if state is not None else None
        if guard is None or state is None:
            return None
        _install_audit_hook(tool.audit)
        return cls(airlock, tool, func, args, kwargs, state, guard)

    def prepare(self) -> tuple[GuardedCall, ApprovalRequest | None]:
        """The call as the guard sees it, and the escalation to ask the approver about first, if
        any (one the guard does not ask itself)."""
        call, planned = self.tool.prepare(self.guard, self.args, self.kwargs)
        escalation = self.state.escalation
        if escalation is not None and planned.approval_why is None:
            return call, _escalation_request(call, planned, escalation)
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
        _NOTE.set(_Note(audit={"effect": done.effect}))
        return done.value


class _Tool:
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

    def describe(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> GuardedCall:
        context = get_current_context()
        arguments, passed = self.binder.bind(args, kwargs)
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
        self, guard: EffectGuard, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[GuardedCall, Plan]:
        call = self.describe(args, kwargs)
        return call, plan(call, guard.options)


def _expose_key() -> None:
    context = get_current_context()
    if context is not None:
        context.idempotency_key = current_idempotency_key()  # type: ignore[attr-defined]


def _take_state(tool: str) -> _CallState | None:
    state = _STATE.get()
    _STATE.set(None)
    _NOTE.set(None)
    return state if state is not None and state.tool == tool else None


def _note_error(guard: EffectGuard, error: BaseException) -> None:
    settlement = settlement_for_error(error, guard.ambiguity)
    _NOTE.set(_Note(audit={"effect": "unknown" if settlement is Settlement.UNKNOWN else "released"}))


def _explained(refusal: EffectRefused, state: _CallState) -> EffectRefused:
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


# -- the audit log --------------------------------------------------------------------------------
_HOOKING = threading.Lock()


def _install_audit_hook(audit: AuditLogger) -> None:
    """Let the guard add fields (``effect``, and ``blocked`` for its refusals) to the one JSON line
    agent_airlock writes for the call. Installed on a tool's first guarded call, so a logger only
    unguarded tools use is left alone; lines of calls the guard did not see are unchanged."""
    if not audit.enabled or audit.__dict__.get("_airlock_redis_hooked", False):
        return
    with _HOOKING:
        if audit.__dict__.get("_airlock_redis_hooked", False):
            return
        original: Callable[[AuditRecord], None] = audit._write_record

        def write_record(record: AuditRecord) -> None:
            note = _NOTE.get()
            extra = note.audit if note is not None else None
            if extra is None or audit.path is None:
                original(record)
                return
            note.audit = None  # type: ignore[union-attr]
            line = {**record.to_dict(), **extra}
            try:
                with audit._file_lock, open(audit.path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(line, default=str, ensure_ascii=False) + "\n")
            except OSError as exc:
                log.error("airlock_redis: audit log write failed (%s): %s", audit.path, exc)

        audit._write_record = write_record  # type: ignore[method-assign]
        audit._airlock_redis_hooked = True  # type: ignore[attr-defined]
