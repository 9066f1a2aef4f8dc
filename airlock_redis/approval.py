"""Asking an approver, sync or async, for one call. A fresh request every call, replays included."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from .core import refusals
from .core.callables import is_async_callable
from .core.gates import GuardedCall, Plan
from .core.reversibility import Reversibility


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What the approver is asked about."""

    tool: str
    tool_call_id: str | None
    idempotency_key: str | None
    arguments: Mapping[str, Any]
    reversibility: Reversibility
    why: str


def approval_request(call: GuardedCall, planned: Plan, why: str) -> ApprovalRequest:
    """The request for ``call``, once it passed the gates (``planned``), asked for ``why``."""
    return ApprovalRequest(
        tool=call.tool,
        tool_call_id=planned.tool_call_id,
        idempotency_key=planned.idempotency_key,
        arguments=call.arguments,
        reversibility=call.reversibility,
        why=why,
    )


Approver: TypeAlias = Callable[[ApprovalRequest], "bool | Awaitable[bool]"]


def _granted(answer: Any) -> bool:
    approved = getattr(answer, "approved", answer)
    return approved is True


def _run_coroutine_blocking(awaitable: Awaitable[Any]) -> Any:
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    # A sync tool called from inside an event loop: run the approver's coroutine on its own loop.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(wait())
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=target, name="airlock-redis-approver")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _deny(request: ApprovalRequest, why: str) -> Exception:
    return refusals.approval_denied(request.tool, request.tool_call_id, request.idempotency_key, why)


def approve_blocking(approver: Approver | None, request: ApprovalRequest) -> None:
    """Raise ApprovalDenied unless the approver grants the request."""
    if approver is None:
        raise _deny(request, "no approver is configured")
    try:
        answer: Any = approver(request)
        if inspect.isawaitable(answer):
            answer = _run_coroutine_blocking(answer)
    except Exception as exc:
        raise _deny(request, f"the approver failed: {type(exc).__name__}: {exc}") from exc
    if not _granted(answer):
        raise _deny(request, "the approver said no")


async def approve(approver: Approver | None, request: ApprovalRequest) -> None:
    """Coroutine form of :func:`approve_blocking`; a sync approver runs in a worker thread."""
    if approver is None:
        raise _deny(request, "no approver is configured")
    try:
        if is_async_callable(approver):
            answer: Any = await approver(request)  # type: ignore[misc]
        else:
            answer = await asyncio.to_thread(approver, request)
            if inspect.isawaitable(answer):
                answer = await answer
    except Exception as exc:
        raise _deny(request, f"the approver failed: {type(exc).__name__}: {exc}") from exc
    if not _granted(answer):
        raise _deny(request, "the approver said no")
