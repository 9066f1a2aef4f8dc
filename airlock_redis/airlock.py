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
import copy
import dataclasses
import functools
import importlib.util
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar, cast

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
    from agent_airlock.audit import AuditLogger
    from agent_airlock.policy import PolicyEscalation
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
        (
            _BaseAirlock,
            "_check_sequence_guard",
            ("self", "func_name", "resolved_policy", "args", "kwargs", "context"),
        ),
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

# The adapter's other modules subclass and call agent_airlock's private parts: imported only once
# the check above has passed.
from .airlock_approval import Answer, PolicyApprover  # noqa: E402
from .airlock_calls import GuardedRun, Tool, explained, note_error  # noqa: E402
from .airlock_policy import SecurityPolicy  # noqa: E402
from .airlock_state import CALL_NOTE, CALL_STATE, CallState, Note, guard_of  # noqa: E402
from .approval import approve, approve_blocking  # noqa: E402
from .context import refusing_in_doubt  # noqa: E402
from .core.errors import ApprovalDenied, CanonicalizationError, EffectRefused  # noqa: E402
from .core.refusals import InDoubtAfterError  # noqa: E402
from .guard import EffectGuard  # noqa: E402

__all__ = ["SUPPORTED_AGENT_AIRLOCK", "Airlock", "SecurityPolicy"]

P = ParamSpec("P")
R = TypeVar("R")

_GUARDED_SANDBOX = (
    "sandbox=True cannot be combined with an effect_guard: agent-airlock's sandbox reports a tool's "
    "error only as text and a lost sandbox result like a sandbox that never started, so the guard "
    "could not tell an effect in doubt from one that never happened. Run the tool without "
    "sandbox=True, or under a policy without effect_guard."
)


class _ReasonCode(str):
    """A block_reason outside agent_airlock's closed BlockReason enum (only ``.value`` is read)."""

    @property
    def value(self) -> str:
        return str(self)


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
        note = CALL_NOTE.get()
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
        note = CALL_NOTE.get()
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
        if self.sandbox and guard_of(self.policy) is not None:
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
        state = CallState(
            tool=func_name,
            policy=None,
            ambient_agent=ambient.agent_id if ambient is not None else None,
            ambient_id=ambient.metadata.get("tool_call_id") if ambient is not None else None,
        )
        CALL_STATE.set(state)
        CALL_NOTE.set(None)  # nothing an earlier call noted applies to this one
        state.checking = True
        try:
            resolved, refusal = super()._resolve_and_check_policy(func_name, context, run_context=run_context)
        finally:
            state.checking = False
        state.policy = resolved
        if refusal is None and self.sandbox and guard_of(resolved) is not None:
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
        state = CALL_STATE.get()
        if guard_of(policy) is None or policy.approver is None or state is None or state.tool != func_name:
            return super()._resolve_escalation(policy, func_name, escalation)
        # Asked by the guard once the arguments are validated, so the approver sees the
        # idempotency key (and an async approver works).
        state.escalation = escalation
        return None

    def _check_sequence_guard(
        self,
        *,
        func_name: str,
        resolved_policy: _BasePolicy | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        context: AirlockContext[Any],
    ) -> AirlockResponse | None:
        # The one step that sees the call's arguments as the caller passed them (ghosts
        # stripped), after the policy step and before validation fills in the defaults: kept for
        # the guard, whose target_args counts only the arguments the caller passed.
        state = CALL_STATE.get()
        if state is not None and state.tool == func_name:
            state.given = (args, kwargs)
        return super()._check_sequence_guard(
            func_name=func_name, resolved_policy=resolved_policy, args=args, kwargs=kwargs, context=context
        )

    # the guard ------------------------------------------------------------------------------------
    def _guarded(self, func: Callable[..., Any], outer: list[Callable[..., Any]]) -> Callable[..., Any]:
        """The wrapper agent_airlock treats as the tool: it runs after every gate and validation.
        Without a guard on the call's policy it only calls ``func``."""
        config = self.config
        tool = Tool(
            func,
            outer,
            AuditLogger(config.audit_log_path if config.enable_audit_log else None, config.enable_audit_log),
        )
        # agent_airlock picks its async wrapper with this test on what it wraps: the same answer.
        if asyncio.iscoroutinefunction(func):

            @functools.wraps(func)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                call = GuardedRun.open(self, tool, func, args, kwargs)
                if call is None:
                    return await func(*args, **kwargs)
                try:
                    described, escalation = call.prepare()
                    if escalation is not None:
                        await approve(call.approver, escalation)
                    with refusing_in_doubt(described.raw_tool_call_id):
                        done = await call.guard.aexecute(
                            described, call.invoke, approver=call.approver, annotation=tool.returns
                        )
                except Exception as error:
                    return call.failed(error)
                except BaseException as error:
                    note_error(call.guard, error)
                    raise
                return call.done(done)

            return guarded_async

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            call = GuardedRun.open(self, tool, func, args, kwargs)
            if call is None:
                return func(*args, **kwargs)
            try:
                described, escalation = call.prepare()
                if escalation is not None:
                    approve_blocking(call.approver, escalation)
                with refusing_in_doubt(described.raw_tool_call_id):
                    done = call.guard.execute(
                        described, call.invoke, approver=call.approver, annotation=tool.returns
                    )
            except Exception as error:
                return call.failed(error)
            except BaseException as error:
                note_error(call.guard, error)
                raise
            return call.done(done)

        return guarded

    def _failed(
        self,
        tool: str,
        guard: EffectGuard,
        state: CallState,
        approver: PolicyApprover | None,
        error: Exception,
        *,
        ran: bool,
        started: float,
    ) -> dict[str, Any]:
        """A guard refusal becomes a blocked response; a tool's own error goes on to agent_airlock,
        except one that left a tool that is not reversible in doubt: the guard refused it (from the
        error), so the model reads "do not retry" rather than agent_airlock's "please try again"."""
        if isinstance(error, InDoubtAfterError):
            response = self._refused(tool, error, started)
            note = CALL_NOTE.get()
            if note is not None and note.audit is not None:
                note.audit["effect"] = "unknown"  # the tool ran; its record is unknown
            return response
        answer = approver.answer if approver is not None else None
        if isinstance(error, ApprovalDenied) and not ran and answer is not None:
            if state.escalation is not None:
                return self._relayed_escalation(tool, state.escalation, answer, started)
            kept = {"approval_outcome": answer.outcome, "detail": answer.detail, "approver": answer.approver}
            return self._refused(tool, error, started, extra=kept)
        if isinstance(error, EffectRefused) and not ran:
            return self._refused(tool, explained(error, state), started)
        if isinstance(error, CanonicalizationError) and not ran:
            return self._block(
                tool,
                BlockReason.VALIDATION_ERROR.value,
                f"'{tool}' cannot be guarded: {error}",
                "Nothing ran. Call the tool with plain-data arguments.",
                metadata={},
                started=started,
            )
        note_error(guard, error)
        raise error

    # refusals -------------------------------------------------------------------------------------
    def _relayed_escalation(
        self, tool: str, escalation: PolicyEscalation, answer: Answer, started: float
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
        CALL_NOTE.set(
            Note(
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
