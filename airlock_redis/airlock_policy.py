"""The agent_airlock adapter's :class:`SecurityPolicy`: agent_airlock's policy with an
``effect_guard`` field, kept through ``freeze()`` and covered by the frozen digest; checked outside
``airlock_redis.Airlock``, a guarded policy refuses the call. Loaded by ``airlock_redis.airlock`` once it
has checked the installed agent-airlock."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_airlock import SecurityPolicy as _BasePolicy
from agent_airlock.policy import PolicyEscalation, PolicyViolation

from .airlock_state import is_checking
from .guard import EffectGuard

log = logging.getLogger("airlock_redis")


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
        if self.effect_guard is None or is_checking(tool_name):
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
