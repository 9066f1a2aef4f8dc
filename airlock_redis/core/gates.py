"""The checks that run before anything is recorded, and the call they describe. Pure."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from . import refusals
from .canonical import idempotency_key
from .errors import InvalidToolCallId
from .ids import describe_missing_id, usable_tool_call_id
from .probes import Probe
from .reversibility import Reversibility

# how calls under different tool_call_ids with one idempotency key are told apart (None: they are not
# the same call; see docs/in-doubt.md, "Dedupe across ids")
Dedupe = Literal["in_doubt", "always"]
DEDUPE_MODES: tuple[Dedupe, ...] = ("in_doubt", "always")


class GuardedCall(NamedTuple):
    """One call of a tool, as the guard sees it (immutable; a named tuple, built on every call)."""

    tool: str
    raw_tool_call_id: Any  # as the host gave it; checked by plan()
    arguments: Mapping[str, Any]  # by parameter name, defaults applied
    reversibility: Reversibility
    passed: Collection[str] = frozenset()  # names the caller passed explicitly
    probe: Probe | None = None  # asks the backend whether the call took effect, when it is in doubt
    # the same idempotency key under another tool_call_id is the same call: "in_doubt" while that one
    # runs or is in doubt, "always" also once it committed (None: ids are told apart by id only)
    dedupe: Dedupe | None = None


@dataclass(frozen=True, slots=True)
class GuardOptions:
    require_tool_call_id: bool = True
    require_approval_for_irreversible: bool = False
    target_args: Sequence[str] = ()


@dataclass(slots=True)  # internal and short-lived: a plain dataclass is cheaper to build
class Plan:
    """What to do with a call that passed the gates."""

    tool_call_id: str | None  # None: run without a record (no id, and none required)
    idempotency_key: str | None
    approval_why: str | None  # set: ask the approver before recording


def _has_value(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return len(value) > 0
    return True


def plan(call: GuardedCall, options: GuardOptions) -> Plan:
    """Run the gates in order; raise the refusal of the first that fails.

    1. a tool that is not reversible needs a tool_call_id (unless the option is off);
    2. an irreversible tool names one of ``target_args`` with a value;
    3. the idempotency key is computed (arguments without a canonical form are an error when the
       call is recorded);
    4. an irreversible tool needs approval when ``require_approval_for_irreversible`` is set.
    """
    tag = call.reversibility
    try:
        tool_call_id = usable_tool_call_id(call.raw_tool_call_id)
    except InvalidToolCallId as exc:
        raise refusals.tool_call_id_required(call.tool, tag, str(exc)) from None
    if tool_call_id is None and options.require_tool_call_id and not tag.may_run_again:
        raise refusals.tool_call_id_required(call.tool, tag, describe_missing_id(call.raw_tool_call_id))

    irreversible = tag is Reversibility.IRREVERSIBLE
    if irreversible and options.target_args:
        named = [
            name for name in options.target_args if name in call.passed and _has_value(call.arguments[name])
        ]
        if not named:
            raise refusals.target_args_required(call.tool, tool_call_id, options.target_args)

    if tool_call_id is not None:
        key: str | None = idempotency_key(call.tool, call.arguments)
    else:
        try:
            key = idempotency_key(call.tool, call.arguments)
        except TypeError:
            key = None

    why = None
    if irreversible and options.require_approval_for_irreversible:
        why = f"{call.tool!r} is irreversible, and every call to an irreversible tool needs approval"
    return Plan(tool_call_id=tool_call_id, idempotency_key=key, approval_why=why)
