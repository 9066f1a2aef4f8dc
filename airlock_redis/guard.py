"""EffectGuard: run each side-effecting tool call at most once.

The decisions live in the pure core (:mod:`.core.gates`, :mod:`.core.decision`,
:mod:`.core.outcome`); this module is the I/O around them, once for blocking tools and once for
coroutines.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, ParamSpec, TypeVar, cast, overload

from .approval import ApprovalRequest, Approver, approve, approve_blocking
from .context import current_call_context, running_key
from .core import refusals
from .core.canonical import ArgumentBinder
from .core.codec import DEFAULT_MAX_RESULT_BYTES, decode_result, encode_result, return_annotation, revalidate
from .core.decision import Refuse, Replay, Run, decide
from .core.errors import ResultDecodingError, ResultEncodingError, StoreError
from .core.gates import GuardedCall, GuardOptions, Plan, plan
from .core.outcome import DEFAULT_AMBIGUOUS_ERRORS, settlement_for_error, settlement_for_return
from .core.records import BeginOutcome, BeginRequest, Settlement, TransitionResult
from .core.reversibility import reversibility_of
from .stores.base import EffectStore
from .stores.memory import InMemoryEffectStore

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("airlock_redis")

Effect = Literal["executed", "replayed", "unguarded"]


@dataclass(frozen=True, slots=True)
class Execution(Generic[T]):
    """What a guarded call produced, and how."""

    value: T
    effect: Effect  # executed: the tool ran; replayed: the stored value; unguarded: ran without a record
    tool_call_id: str | None
    idempotency_key: str | None
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class _Started:
    plan: Plan
    request: BeginRequest
    attempt: int


class EffectGuard:
    """Runs each side-effecting tool call at most once, keyed on the host's tool_call_id.

    ``store`` holds the records (a new :class:`InMemoryEffectStore` when None: one process only).
    """

    def __init__(
        self,
        store: EffectStore | None = None,
        *,
        require_tool_call_id: bool = True,
        require_approval_for_irreversible: bool = False,
        target_args: Sequence[str] = (),
        ambiguous_errors: Sequence[type[BaseException]] = DEFAULT_AMBIGUOUS_ERRORS,
        approver: Approver | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        if isinstance(target_args, str):
            target_args = (target_args,)
        errors = tuple(ambiguous_errors)
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in errors):
            raise TypeError("ambiguous_errors must be exception classes")
        if max_result_bytes <= 0:
            raise ValueError("max_result_bytes must be positive")
        self.store: EffectStore = store if store is not None else InMemoryEffectStore()
        self.options = GuardOptions(
            require_tool_call_id=bool(require_tool_call_id),
            require_approval_for_irreversible=bool(require_approval_for_irreversible),
            target_args=tuple(target_args),
        )
        self.ambiguous_errors: tuple[type[BaseException], ...] = errors
        self.approver = approver
        self.max_result_bytes = max_result_bytes

    @property
    def require_tool_call_id(self) -> bool:
        return self.options.require_tool_call_id

    @property
    def require_approval_for_irreversible(self) -> bool:
        return self.options.require_approval_for_irreversible

    @property
    def target_args(self) -> tuple[str, ...]:
        return tuple(self.options.target_args)

    def __repr__(self) -> str:
        return f"EffectGuard(store={self.store!r})"

    # -- decorating ------------------------------------------------------------------------------
    @overload
    def wrap(
        self, fn: Callable[P, Awaitable[R]], *, name: str | None = None
    ) -> Callable[P, Awaitable[R]]: ...

    @overload
    def wrap(self, fn: Callable[P, R], *, name: str | None = None) -> Callable[P, R]: ...

    def wrap(self, fn: Callable[P, Any], *, name: str | None = None) -> Callable[P, Any]:
        """Guard ``fn``. The call's id comes from :func:`~airlock_redis.tool_call_context`."""
        tool = name or getattr(fn, "__name__", None) or type(fn).__name__
        binder = ArgumentBinder(fn)
        annotation = _LazyAnnotation(fn)

        def describe(args: tuple[Any, ...], kwargs: dict[str, Any]) -> GuardedCall:
            arguments, passed = binder.bind(args, kwargs)
            host = current_call_context()
            return GuardedCall(
                tool=tool,
                raw_tool_call_id=host.tool_call_id if host is not None else None,
                arguments=arguments,
                reversibility=reversibility_of(wrapper),
                passed=passed,
            )

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                call = describe(args, kwargs)
                done = await self.aexecute(call, lambda: fn(*args, **kwargs), annotation=annotation.get)
                return done.value

            wrapper: Callable[P, Any] = async_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                call = describe(args, kwargs)
                return self.execute(call, lambda: fn(*args, **kwargs), annotation=annotation.get).value

            wrapper = sync_wrapper
        return wrapper

    __call__ = wrap

    # -- the steps both drivers share ------------------------------------------------------------
    def _approval_request(self, call: GuardedCall, planned: Plan) -> ApprovalRequest:
        assert planned.approval_why is not None
        return ApprovalRequest(
            tool=call.tool,
            tool_call_id=planned.tool_call_id,
            idempotency_key=planned.idempotency_key,
            arguments=call.arguments,
            reversibility=call.reversibility,
            why=planned.approval_why,
        )

    def _begin_request(self, call: GuardedCall, planned: Plan) -> BeginRequest:
        assert planned.tool_call_id is not None and planned.idempotency_key is not None
        return BeginRequest(
            tool_call_id=planned.tool_call_id,
            idempotency_key=planned.idempotency_key,
            tool=call.tool,
            token=secrets.token_hex(16),
            reversible=call.reversibility.may_run_again,
        )

    def _store_down(self, call: GuardedCall, planned: Plan, error: StoreError) -> Exception:
        assert planned.tool_call_id is not None and planned.idempotency_key is not None
        log.warning("airlock_redis: store unavailable at begin for %s: %s", call.tool, error)
        return refusals.store_unavailable(
            call.tool, planned.tool_call_id, planned.idempotency_key, str(error)
        )

    def _decide(
        self,
        call: GuardedCall,
        planned: Plan,
        request: BeginRequest,
        outcome: BeginOutcome,
        annotation: Callable[[], Any],
    ) -> _Started | Execution[Any]:
        """Run, replay, or raise the refusal; the table itself is :func:`decide`."""
        assert planned.tool_call_id is not None and planned.idempotency_key is not None
        tool_call_id, key = planned.tool_call_id, planned.idempotency_key
        decision = decide(outcome)
        if isinstance(decision, Run):
            return _Started(planned, request, decision.attempt)
        if isinstance(decision, Replay):
            try:
                value = revalidate(decode_result(decision.value), annotation())
            except ResultDecodingError as exc:
                raise refusals.record_corrupt(call.tool, tool_call_id, key, str(exc)) from None
            log.info("airlock_redis: replayed %s tool_call_id=%r", call.tool, tool_call_id)
            return Execution(value, "replayed", tool_call_id, key, outcome.attempt)
        assert isinstance(decision, Refuse)
        if decision.reason == "policy_violation":
            raise refusals.policy_violation(call.tool, tool_call_id, key, outcome)
        if decision.reason == "result_not_stored":
            raise refusals.result_not_stored(call.tool, tool_call_id, key)
        raise refusals.status_unknown(call.tool, tool_call_id, key, outcome)

    def _encode(self, started: _Started, value: Any) -> bytes | None:
        try:
            return encode_result(value, self.max_result_bytes)
        except ResultEncodingError as exc:
            log.warning(
                "airlock_redis: %s ran under tool_call_id=%r but its result cannot be stored (%s); "
                "replays will be refused",
                started.request.tool,
                started.request.tool_call_id,
                exc,
            )
            return None

    @staticmethod
    def _after_commit(started: _Started, result: TransitionResult | StoreError) -> None:
        request = started.request
        if isinstance(result, StoreError):
            log.error(
                "airlock_redis: %s ran under tool_call_id=%r but the commit failed (%s); the record stays "
                "pending and retries will be refused",
                request.tool,
                request.tool_call_id,
                result,
            )
        elif result is not TransitionResult.OK:
            log.warning(
                "airlock_redis: commit of %s tool_call_id=%r was %s "
                "(the record was resolved, expired or taken over)",
                request.tool,
                request.tool_call_id,
                result.value,
            )

    @staticmethod
    def _after_settle(
        started: _Started, settlement: Settlement, result: TransitionResult | StoreError
    ) -> None:
        request = started.request
        if isinstance(result, StoreError):
            log.error(
                "airlock_redis: could not mark %s tool_call_id=%r %s (%s); the record stays pending",
                request.tool,
                request.tool_call_id,
                settlement.value,
                result,
            )
        elif result is not TransitionResult.OK:
            log.warning(
                "airlock_redis: settling %s tool_call_id=%r as %s was %s",
                request.tool,
                request.tool_call_id,
                settlement.value,
                result.value,
            )

    # -- blocking driver -------------------------------------------------------------------------
    def execute(
        self,
        call: GuardedCall,
        invoke: Callable[[], T],
        *,
        approver: Approver | None = None,
        annotation: Callable[[], Any] = lambda: Any,
    ) -> Execution[T]:
        """Run one call of a blocking tool through the gates, the store and the replay table.

        ``invoke`` runs the tool body. ``approver`` overrides the guard's own for this call.
        """
        planned = plan(call, self.options)
        if planned.approval_why is not None:
            approve_blocking(approver or self.approver, self._approval_request(call, planned))
        if planned.tool_call_id is None:
            with running_key(planned.idempotency_key):
                return Execution(invoke(), "unguarded", None, planned.idempotency_key)
        request = self._begin_request(call, planned)
        try:
            outcome = self.store.begin(request)
        except StoreError as exc:
            raise self._store_down(call, planned, exc) from exc
        step = self._decide(call, planned, request, outcome, annotation)
        if isinstance(step, Execution):
            return cast(Execution[T], step)
        try:
            with running_key(planned.idempotency_key):
                value = invoke()
        except BaseException as error:
            self._settle_blocking(step, settlement_for_error(error, self.ambiguous_errors))
            raise
        settlement = settlement_for_return(value)
        if settlement is not None:
            self._settle_blocking(step, settlement)
        else:
            self._commit_blocking(step, value)
        return Execution(value, "executed", planned.tool_call_id, planned.idempotency_key, step.attempt)

    def _commit_blocking(self, started: _Started, value: Any) -> None:
        request = started.request
        data = self._encode(started, value)
        try:
            result: TransitionResult | StoreError = self.store.commit(
                request.tool_call_id, request.token, data, None
            )
        except StoreError as exc:
            result = exc
        self._after_commit(started, result)

    def _settle_blocking(self, started: _Started, settlement: Settlement) -> None:
        request = started.request
        try:
            result: TransitionResult | StoreError = self.store.settle(
                request.tool_call_id, request.token, settlement
            )
        except StoreError as exc:
            result = exc
        self._after_settle(started, settlement, result)

    # -- coroutine driver ------------------------------------------------------------------------
    async def aexecute(
        self,
        call: GuardedCall,
        invoke: Callable[[], Awaitable[T]],
        *,
        approver: Approver | None = None,
        annotation: Callable[[], Any] = lambda: Any,
    ) -> Execution[T]:
        """Coroutine form of :meth:`execute` for async tools; ``invoke`` returns the awaitable body."""
        planned = plan(call, self.options)
        if planned.approval_why is not None:
            await approve(approver or self.approver, self._approval_request(call, planned))
        if planned.tool_call_id is None:
            with running_key(planned.idempotency_key):
                return Execution(await invoke(), "unguarded", None, planned.idempotency_key)
        request = self._begin_request(call, planned)
        try:
            outcome = await self.store.abegin(request)
        except StoreError as exc:
            raise self._store_down(call, planned, exc) from exc
        step = self._decide(call, planned, request, outcome, annotation)
        if isinstance(step, Execution):
            return cast(Execution[T], step)
        try:
            with running_key(planned.idempotency_key):
                value = await invoke()
        except BaseException as error:
            await _shielded(self._asettle(step, settlement_for_error(error, self.ambiguous_errors)))
            raise
        settlement = settlement_for_return(value)
        if settlement is not None:
            await _shielded(self._asettle(step, settlement))
        else:
            await _shielded(self._acommit(step, value))
        return Execution(value, "executed", planned.tool_call_id, planned.idempotency_key, step.attempt)

    async def _acommit(self, started: _Started, value: Any) -> None:
        request = started.request
        data = self._encode(started, value)
        try:
            result: TransitionResult | StoreError = await self.store.acommit(
                request.tool_call_id, request.token, data, None
            )
        except StoreError as exc:
            result = exc
        self._after_commit(started, result)

    async def _asettle(self, started: _Started, settlement: Settlement) -> None:
        request = started.request
        try:
            result: TransitionResult | StoreError = await self.store.asettle(
                request.tool_call_id, request.token, settlement
            )
        except StoreError as exc:
            result = exc
        self._after_settle(started, settlement, result)


async def _shielded(step: Awaitable[None]) -> None:
    """Finish a store write even if the task is cancelled again while it runs."""
    task = asyncio.ensure_future(step)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


class _LazyAnnotation:
    """The tool's return annotation, resolved on first replay (forward references may need the
    module to finish loading)."""

    __slots__ = ("_done", "_fn", "_value")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._value: Any = Any
        self._done = False

    def get(self) -> Any:
        if not self._done:
            self._value = return_annotation(self._fn)
            self._done = True
        return self._value
