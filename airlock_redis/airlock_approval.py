"""How the agent_airlock adapter asks a policy's agent_airlock approver: :class:`PolicyApprover` turns
the guard's ApprovalRequest into an OversightRequest (sync or async approver) and keeps why it did
not grant (:class:`Answer`); :func:`escalation_request` is the request for an ``escalate_tools`` rule.
Loaded by ``airlock_redis.airlock`` once it has checked the installed agent-airlock."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from agent_airlock import SecurityPolicy as _BasePolicy
from agent_airlock.oversight import OversightRequest, OversightResponse, OversightVerdict
from agent_airlock.policy import PolicyEscalation

from .approval import ApprovalRequest, approval_request
from .core.gates import GuardedCall, Plan


@dataclass(frozen=True)
class Answer:
    """Why the policy's approver did not grant: agent_airlock's escalation outcome and detail."""

    outcome: Literal["denied", "timeout"]
    detail: str
    approver: str | None
    verdict: bool  # the approver answered DENY or TIMEOUT (not a fault of the approver)


class PolicyApprover:
    """The policy's agent_airlock approver (OversightRequest -> OversightResponse, sync or async)
    asked as the guard's ApprovalRequest -> bool. ``answer`` keeps why it did not grant."""

    def __init__(self, policy: _BasePolicy, escalation: PolicyEscalation | None) -> None:
        self.policy = policy
        self.escalation = escalation
        self.answer: Answer | None = None

    @classmethod
    def of(cls, policy: _BasePolicy | None, escalation: PolicyEscalation | None) -> PolicyApprover | None:
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
        self.answer = Answer("denied", f"the approver raised {type(error).__name__}: {error}", None, False)
        return error

    def _granted(self, reply: Any, request: OversightRequest) -> bool:
        if not isinstance(reply, OversightResponse):
            detail = f"the approver returned {type(reply).__name__}, not an OversightResponse"
            self.answer = Answer("denied", detail, None, False)
            raise TypeError(detail)
        if reply.request_id != request.request_id:
            detail = (
                f"the approver answered request {reply.request_id!r}, not this call's request "
                f"{request.request_id!r}"
            )
            self.answer = Answer("denied", detail, reply.approver, False)
            raise ValueError(detail)
        if reply.verdict is OversightVerdict.GRANT:
            return True
        outcome: Literal["denied", "timeout"] = (
            "timeout" if reply.verdict is OversightVerdict.TIMEOUT else "denied"
        )
        self.answer = Answer(outcome, reply.detail, reply.approver, True)
        return False


def escalation_request(call: GuardedCall, planned: Plan, escalation: PolicyEscalation) -> ApprovalRequest:
    return approval_request(call, planned, f"escalate_tools rule {escalation.rule!r}: {escalation.reason}")
