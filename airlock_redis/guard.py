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
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

from .approval import ApprovalRequest, Approver, approve, approve_blocking
from .attempts import Execution, Reporter, Started
from .context import (
    current_call_context,
    current_idempotency_key,
    running_key,
    running_tool_call_id,
    tool_call_context,
)
from .core import refusals
from .core.ambiguity import AmbiguityRule
from .core.callables import is_async_callable
from .core.canonical import ArgumentBinder
from .core.codec import DEFAULT_MAX_RESULT_BYTES, decode_result, encode_result, return_annotation, revalidate
from .core.decision import Refuse, Replay, Run, decide
from .core.errors import (
    CorruptRecordError,
    EffectRefused,
    ResultDecodingError,
    ResultEncodingError,
    StoreError,
)
from .core.gates import GuardedCall, GuardOptions, Plan, plan
from .core.outcome import (
    DEFAULT_AMBIGUOUS_ERRORS,
    gives_back_after_failed_begin,
    settlement_for_error,
    settlement_for_return,
)
from .core.records import BeginOutcome, BeginRequest, Record, Settlement, Status, TransitionResult
from .core.reversibility import reversibility_of
from .core.signing import Signer, SigningKeys
from .core.verdicts import Fence, fence_on_current, parse_verdict, resolve_fence
from .observability import GuardObserver
from .stores.base import DurableEffectStore, EffectStore, RemoteEffectStore
from .stores.memory import InMemoryEffectStore

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("airlock_redis")


_NO_VALUE: Any = object()
# set on every wrapper guard.wrap returns: the guard that owns it
_GUARDED_BY = "__effect_guard__"


def _name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


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
        ambiguous_errors: Sequence[type[BaseException]] | AmbiguityRule = DEFAULT_AMBIGUOUS_ERRORS,
        approver: Approver | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        signing_key: SigningKeys | None = None,
        observer: GuardObserver | None = None,
    ) -> None:
        if isinstance(target_args, str):
            target_args = (target_args,)
        ambiguity = AmbiguityRule.of(ambiguous_errors)  # TypeError unless exception classes or a rule
        if max_result_bytes <= 0:
            raise ValueError("max_result_bytes must be positive")
        self.store: EffectStore = store if store is not None else InMemoryEffectStore()
        self.options = GuardOptions(
            require_tool_call_id=bool(require_tool_call_id),
            require_approval_for_irreversible=bool(require_approval_for_irreversible),
            target_args=tuple(target_args),
        )
        # what decides "in doubt": these classes anywhere in the error's chain, plus the common
        # clients' read timeouts (see core.ambiguity)
        self.ambiguity = ambiguity
        self.ambiguous_errors: tuple[type[BaseException], ...] = ambiguity.classes
        self.approver = approver
        self.max_result_bytes = max_result_bytes
        self._signer = Signer(signing_key) if signing_key is not None else None
        # wait_replicas (RedisEffectStore): checked once here, so a store without it costs nothing per call.
        store_ = self.store
        self._durable = (
            store_ if isinstance(store_, DurableEffectStore) and store_.wait_replicas > 0 else None
        )
        # None: no metrics or events, and no work for them on any call (checked once per event)
        self._observer = observer
        # how an operator reaches this store from the command line (None: it lives in this process)
        self._target: str | None = store_.operator_target if isinstance(store_, RemoteEffectStore) else None
        self._report = Reporter(observer, self._target)
        # what call()/acall() wrapped, so a function is wrapped (and its signature read) once
        self._wrappers: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = (
            weakref.WeakKeyDictionary()
        )

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
    def wrap(self, fn: Callable[P, R], *, name: str | None = None) -> Callable[P, R]:
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

        if is_async_callable(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                call = describe(args, kwargs)
                body = cast(Callable[[], Awaitable[Any]], lambda: fn(*args, **kwargs))
                done = await self.aexecute(call, body, annotation=annotation.get)
                return done.value

            wrapper: Callable[P, Any] = async_wrapper
        elif inspect.isasyncgenfunction(fn):
            # Kept an async generator function. The body takes effect as it is consumed, so the
            # call is recorded unknown; the store is reached (without blocking) at the first
            # iteration, which is also when the host's tool_call_id is read.
            @functools.wraps(fn)
            async def stream_wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Any]:
                call = describe(args, kwargs)

                async def start() -> Any:
                    return fn(*args, **kwargs)

                done = await self.aexecute(call, start, annotation=annotation.get)
                if done.effect == "replayed":
                    # only an operator's "committed" verdict gives a stream a stored value: its items
                    for item in _as_items(done.value):
                        yield item
                    return
                stream = done.value
                try:
                    async for item in stream:
                        yield item
                finally:
                    await stream.aclose()

            wrapper = stream_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                call = describe(args, kwargs)
                return self.execute(call, lambda: fn(*args, **kwargs), annotation=annotation.get).value

            wrapper = sync_wrapper
        setattr(wrapper, _GUARDED_BY, self)
        return wrapper

    __call__ = wrap

    def call(self, tool_call_id: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` guarded under ``tool_call_id``: no context variable needed,
        so a hand-written tool loop or a worker thread (where context variables are not copied)
        passes the id it holds. ``fn`` is a blocking callable, guarded or not (a tool already
        wrapped by a guard keeps its own wrapper: one record, one execution). For a coroutine
        function use :meth:`acall`."""
        if is_async_callable(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(f"{_name_of(fn)} is async: use `await guard.acall(...)`")
        with tool_call_context(tool_call_id):
            return self._guarded(fn)(*args, **kwargs)

    async def acall(
        self, tool_call_id: str, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Coroutine form of :meth:`call` for an ``async def`` tool."""
        if not is_async_callable(fn):
            raise TypeError(
                f"{_name_of(fn)} is not a coroutine function: use guard.call (in a thread, "
                "`await asyncio.to_thread(guard.call, tool_call_id, fn, ...)`)"
            )
        with tool_call_context(tool_call_id):
            return await self._guarded(fn)(*args, **kwargs)

    def _guarded(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``fn`` wrapped by this guard, once per function (a wrapper of any guard is kept)."""
        if getattr(fn, _GUARDED_BY, None) is not None:
            return fn
        try:
            return cast(Callable[P, R], self._wrappers[fn])
        except KeyError:
            wrapper = self.wrap(fn)
            self._wrappers[fn] = wrapper
            return wrapper
        except TypeError:  # not hashable, or no weak reference to it: wrap it for this call
            return self.wrap(fn)

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

    def _begin_failed(self, call: GuardedCall, planned: Plan, error: StoreError) -> Exception:
        assert planned.tool_call_id is not None and planned.idempotency_key is not None
        return self._report.begin_failed(call.tool, planned.tool_call_id, planned.idempotency_key, error)

    def _decide(
        self,
        call: GuardedCall,
        planned: Plan,
        request: BeginRequest,
        outcome: BeginOutcome,
        annotation: Callable[[], Any],
    ) -> Started | Execution[Any]:
        """Run, replay, or raise the refusal; the table itself is :func:`decide`."""
        assert planned.tool_call_id is not None and planned.idempotency_key is not None
        tool_call_id, key = planned.tool_call_id, planned.idempotency_key
        decision = decide(outcome)
        if isinstance(decision, Run):
            return Started(planned, request, decision.attempt)
        if isinstance(decision, Replay):
            if self._signer is not None and not self._signer.verify(
                tool_call_id, key, decision.value, decision.mac
            ):
                log.error(
                    "airlock_redis: the stored result of %s tool_call_id=%r fails its signature check "
                    "(edited or forged in Redis); refusing it",
                    call.tool,
                    tool_call_id,
                )
                raise refusals.record_corrupt(
                    call.tool,
                    tool_call_id,
                    key,
                    "its signature does not verify (edited or forged in the store)",
                )
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
        raise refusals.status_unknown(call.tool, tool_call_id, key, outcome, self._target)

    def _step(
        self,
        call: GuardedCall,
        planned: Plan,
        request: BeginRequest,
        outcome: BeginOutcome,
        annotation: Callable[[], Any],
        *,
        t0: float,
    ) -> Started | Execution[Any]:
        """:meth:`_decide`, and with an observer, the begin latency and what was decided reported to it."""
        observer = self._observer
        if observer is None:
            return self._decide(call, planned, request, outcome, annotation)
        now = time.perf_counter()
        observer.store_operation("begin", now - t0, None)
        try:
            step = self._decide(call, planned, request, outcome, annotation)
        except EffectRefused as refusal:
            observer.call_event(
                "refused", call.tool, request.tool_call_id, reason=refusal.reason, attempt=outcome.attempt
            )
            raise
        if isinstance(step, Execution):
            observer.call_event("replayed", call.tool, request.tool_call_id, attempt=step.attempt)
            return step
        observer.call_event("started", call.tool, request.tool_call_id, attempt=step.attempt)
        return Started(step.plan, step.request, step.attempt, time.perf_counter())

    # -- the operator's verdict ------------------------------------------------------------------
    def _resolve_args(
        self,
        verdict: Status | Settlement | str,
        seen: Record | Fence | None,
        force: bool,
        expect_key: str | None,
        value: Any,
    ) -> tuple[Status | Settlement, Fence, bytes | None]:
        verdict = parse_verdict(verdict)
        fence = resolve_fence(seen, force=force, expect_key=expect_key)
        if value is _NO_VALUE:
            return verdict, fence, None
        if verdict is not Status.COMMITTED:
            raise ValueError("a value can only be given with the committed verdict")
        return verdict, fence, encode_result(value, self.max_result_bytes)

    def _resolve_mac(self, tool_call_id: str, key: str | None, data: bytes | None) -> bytes | None:
        if data is None or self._signer is None:
            return None
        if key is None:
            raise ValueError("signing a resolved value needs the record's idempotency key")
        return self._signer.sign(tool_call_id, key, data)

    def resolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement | str,
        *,
        seen: Record | Fence | None = None,
        force: bool = False,
        expect_key: str | None = None,
        value: Any = _NO_VALUE,
    ) -> TransitionResult:
        """Record an operator's verdict on a call, after asking the backend about its idempotency key.

        ``verdict``: ``"committed"`` (the effect took place; ``value`` is what replays return, and
        without one replays are refused as result_not_stored), ``"unknown"`` (still in doubt) or
        ``"release"`` (it did not take place: the call may run again).

        ``seen`` is the record the verdict is about, as read before deciding (``guard.store.get(id)``):
        the verdict applies only if the record is still that one (same idempotency key, status and
        owner), else nothing changes and the result is CHANGED (or MISMATCH / MISSING). A tool that
        committed while the operator looked is never released. ``force=True`` applies the verdict to
        whatever is there now (still only to a record whose key is ``expect_key``, when given): it
        reads the record and fences on that, so a verdict sent again after a lost reply cannot land on
        a record that a retry started since. One of the two is required. A value is stored through
        the result codec and signed when the guard has a signing key.

        Returns OK, MISSING, MISMATCH or CHANGED. Raises ValueError for a bad verdict or fence, and
        StoreError when the store cannot answer.
        """
        verdict, fence, data = self._resolve_args(verdict, seen, force, expect_key, value)
        if force:
            try:
                current = fence_on_current(fence, self.store.get(tool_call_id))
            except CorruptRecordError:
                current = fence  # a damaged record: forced as it is (its key still checked when given)
            if current is None:
                return TransitionResult.MISSING
            fence = current
        mac = self._resolve_mac(tool_call_id, fence.key, data)
        result = self.store.resolve(
            tool_call_id,
            verdict,
            expect_key=fence.key,
            expect_status=fence.status,
            expect_owner=fence.owner,
            value=data,
            mac=mac,
        )
        self._report.resolved(tool_call_id, verdict, result)
        return result

    async def aresolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement | str,
        *,
        seen: Record | Fence | None = None,
        force: bool = False,
        expect_key: str | None = None,
        value: Any = _NO_VALUE,
    ) -> TransitionResult:
        """Coroutine form of :meth:`resolve`."""
        verdict, fence, data = self._resolve_args(verdict, seen, force, expect_key, value)
        if force:
            try:
                current = fence_on_current(fence, await self.store.aget(tool_call_id))
            except CorruptRecordError:
                current = fence
            if current is None:
                return TransitionResult.MISSING
            fence = current
        mac = self._resolve_mac(tool_call_id, fence.key, data)
        result = await self.store.aresolve(
            tool_call_id,
            verdict,
            expect_key=fence.key,
            expect_status=fence.status,
            expect_owner=fence.owner,
            value=data,
            mac=mac,
        )
        self._report.resolved(tool_call_id, verdict, result)
        return result

    def _sealed(self, started: Started, value: Any) -> tuple[bytes | None, bytes | None]:
        """The bytes to store for a result and their MAC, or (None, None) when the result cannot be
        stored. Never raises: the tool has run, so whatever goes wrong here (an encoder that meets an
        attribute that raises, a signer error) ends as "committed, not stored", never as a record
        left pending or an exception for a call that took effect."""
        request = started.request
        try:
            data = encode_result(value, self.max_result_bytes)
            if self._signer is None:
                return data, None
            return data, self._signer.sign(request.tool_call_id, request.idempotency_key, data)
        except Exception as exc:
            why = str(exc) if isinstance(exc, ResultEncodingError) else f"{type(exc).__name__}: {exc}"
            log.warning(
                "airlock_redis: %s ran under tool_call_id=%r but its result cannot be stored (%s); "
                "replays will be refused",
                request.tool,
                request.tool_call_id,
                why,
            )
            return None, None

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
        Raises an :class:`EffectRefused` when the call is refused; whatever the tool raises otherwise.
        """
        try:
            planned = plan(call, self.options)
            if planned.approval_why is not None:
                approve_blocking(approver or self.approver, self._approval_request(call, planned))
        except EffectRefused as refusal:
            if self._observer is not None:
                self._observer.call_event("refused", call.tool, refusal.tool_call_id, reason=refusal.reason)
            raise
        if planned.tool_call_id is None:
            with running_key(planned.idempotency_key):
                return Execution(invoke(), "unguarded", None, planned.idempotency_key)
        if planned.tool_call_id == running_tool_call_id():  # inside the body of this very call
            return Execution(invoke(), "nested", planned.tool_call_id, current_idempotency_key())
        request = self._begin_request(call, planned)
        t0 = time.perf_counter() if self._observer is not None else 0.0
        try:
            outcome = self.store.begin(request)
        except StoreError as exc:
            if gives_back_after_failed_begin(exc):
                self._release_lost_begin(request)
            raise self._begin_failed(call, planned, exc) from exc
        except BaseException:  # interrupted while begin ran: it may have landed; the tool never runs
            self._release_lost_begin(request)
            raise
        step = self._step(call, planned, request, outcome, annotation, t0=t0)
        if isinstance(step, Execution):
            return cast(Execution[T], step)
        if self._durable is not None:
            self._make_durable(call, planned, step)
        try:
            with running_key(planned.idempotency_key, planned.tool_call_id):
                value = invoke()
        except BaseException as error:
            self._settle_blocking(step, settlement_for_error(error, self.ambiguity))
            raise
        settlement = settlement_for_return(value)
        if settlement is not None:
            self._settle_blocking(step, settlement)
        else:
            self._commit_blocking(step, value)
        return Execution(value, "executed", planned.tool_call_id, planned.idempotency_key, step.attempt)

    def _make_durable(self, call: GuardedCall, planned: Plan, started: Started) -> None:
        """wait_replicas: the tool runs only once enough replicas hold its pending record."""
        assert self._durable is not None
        try:
            self._durable.ensure_durable(started.request)
        except StoreError as exc:
            self._settle_blocking(started, _give_back(started))
            raise self._begin_failed(call, planned, exc) from exc

    def _release_lost_begin(self, request: BeginRequest) -> None:
        """The begin may have been applied though its reply was lost: take back what this attempt
        may hold, so a retry of a call that never ran is not refused. Fenced by the attempt's token:
        it never touches a record another attempt owns, and it leaves a tombstone of the token, so a
        begin of this attempt that lands later (delayed in the network) records nothing. Only a
        reversible tool takes a record over, so releasing a record this attempt took over erases no
        doubt that matters: a reversible call may run again anyway."""
        try:
            self.store.settle(request, 1, Settlement.RELEASE)
        except StoreError as exc:
            self._report.unreleased(request, exc)

    async def _arelease_lost_begin(self, request: BeginRequest) -> None:
        try:
            await self.store.asettle(request, 1, Settlement.RELEASE)
        except StoreError as exc:
            self._report.unreleased(request, exc)

    def _commit_blocking(self, started: Started, value: Any) -> None:
        request = started.request
        data, mac = self._sealed(started, value)
        t0 = time.perf_counter() if self._observer is not None else 0.0
        try:
            result: TransitionResult | StoreError = self.store.commit(request, started.attempt, data, mac)
        except Exception as exc:  # whatever the store raised: the tool ran, the caller gets its value
            result = as_store_error(exc)
        self._report.committed(started, result, t0)

    def _settle_blocking(self, started: Started, settlement: Settlement) -> None:
        request = started.request
        t0 = time.perf_counter() if self._observer is not None else 0.0
        try:
            result: TransitionResult | StoreError = self.store.settle(request, started.attempt, settlement)
        except Exception as exc:  # whatever the store raised: the tool ran, the caller gets its value
            result = as_store_error(exc)
        self._report.settled(started, settlement, result, t0)

    # -- coroutine driver ------------------------------------------------------------------------
    async def aexecute(
        self,
        call: GuardedCall,
        invoke: Callable[[], Awaitable[T]],
        *,
        approver: Approver | None = None,
        annotation: Callable[[], Any] = lambda: Any,
    ) -> Execution[T]:
        """Coroutine form of :meth:`execute` for async tools; ``invoke`` returns the awaitable body.

        A cancellation while the store is reached never leaves a record behind for a tool that did
        not run: the begin is given back (a tombstone keeps a begin that lands later out), and a
        commit or settle in flight is sent again to completion before the cancellation goes on.
        """
        try:
            planned = plan(call, self.options)
            if planned.approval_why is not None:
                await approve(approver or self.approver, self._approval_request(call, planned))
        except EffectRefused as refusal:
            if self._observer is not None:
                self._observer.call_event("refused", call.tool, refusal.tool_call_id, reason=refusal.reason)
            raise
        if planned.tool_call_id is None:
            with running_key(planned.idempotency_key):
                return Execution(await invoke(), "unguarded", None, planned.idempotency_key)
        if planned.tool_call_id == running_tool_call_id():  # inside the body of this very call
            return Execution(await invoke(), "nested", planned.tool_call_id, current_idempotency_key())
        request = self._begin_request(call, planned)
        t0 = time.perf_counter() if self._observer is not None else 0.0
        try:
            outcome = await self.store.abegin(request)
        except StoreError as exc:
            if gives_back_after_failed_begin(exc):
                await _shielded(lambda: self._arelease_lost_begin(request))
            raise self._begin_failed(call, planned, exc) from exc
        except BaseException:  # cancelled (or interrupted) while begin ran
            await _shielded(lambda: self._arelease_lost_begin(request))
            raise
        step = self._step(call, planned, request, outcome, annotation, t0=t0)
        if isinstance(step, Execution):
            return cast(Execution[T], step)
        if self._durable is not None:
            await self._amake_durable(call, planned, step)
        try:
            with running_key(planned.idempotency_key, planned.tool_call_id):
                value = await invoke()
        except BaseException as error:
            await self._asettle(step, settlement_for_error(error, self.ambiguity))
            raise
        settlement = settlement_for_return(value)
        if settlement is not None:
            await self._asettle(step, settlement)
        else:
            await self._acommit(step, value)
        return Execution(value, "executed", planned.tool_call_id, planned.idempotency_key, step.attempt)

    async def _amake_durable(self, call: GuardedCall, planned: Plan, started: Started) -> None:
        assert self._durable is not None
        try:
            await self._durable.aensure_durable(started.request)
        except StoreError as exc:
            await self._asettle(started, _give_back(started))
            raise self._begin_failed(call, planned, exc) from exc

    async def _acommit(self, started: Started, value: Any) -> None:
        request = started.request
        data, mac = self._sealed(started, value)
        t0 = time.perf_counter() if self._observer is not None else 0.0
        try:
            result: TransitionResult | StoreError = await _to_completion(
                lambda: self.store.acommit(request, started.attempt, data, mac)
            )
        except Exception as exc:  # whatever the store raised: the tool ran, the caller gets its value
            result = as_store_error(exc)
        self._report.committed(started, result, t0)

    async def _asettle(self, started: Started, settlement: Settlement) -> None:
        request = started.request
        t0 = time.perf_counter() if self._observer is not None else 0.0
        try:
            result: TransitionResult | StoreError = await _to_completion(
                lambda: self.store.asettle(request, started.attempt, settlement)
            )
        except Exception as exc:  # whatever the store raised: the tool ran, the caller gets its value
            result = as_store_error(exc)
        self._report.settled(started, settlement, result, t0)


def as_store_error(error: Exception) -> StoreError:
    """A store failure as a StoreError (a third-party store may raise anything)."""
    return error if isinstance(error, StoreError) else StoreError(f"{type(error).__name__}: {error}")


def _as_items(value: Any) -> list[Any]:
    """The items a replayed stream yields: a stored list (or other collection) item by item, a
    lone value as one item."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    return [value]


def _give_back(started: Started) -> Settlement:
    """How an attempt leaves a record it took when its tool will NOT run: the record did not reach
    enough replicas, or the caller was cancelled while ``begin`` ran.

    A first attempt is released (owner-fenced): nothing took effect, so deleting it restores exactly
    the state before the call. Releasing cannot cause a duplicate even if the record did reach a
    replica: the delete follows it down the same replication stream, and if a failover promotes that
    replica before the delete arrives, the new primary holds a pending record and retries are
    refused (conservative), never run twice. Keeping it pending instead would refuse every retry of a
    call that never ran, until an operator resolves it.
    A reversible take-over (attempt > 1) is marked unknown instead: an earlier attempt may have run,
    and that doubt must not be erased.
    """
    return Settlement.RELEASE if started.attempt <= 1 else Settlement.UNKNOWN


async def _shielded(send: Callable[[], Awaitable[Any]]) -> None:
    """Run a store write to the end in a task of its own, however often the caller or the task is
    cancelled meanwhile, then let the caller's cancellation go on.

    The write is safe to send again (every transition is), so a cancellation that interrupts it
    sends it again rather than giving up. That is what keeps ``asyncio.run`` from leaving a record
    behind when it shuts down: it cancels every task that exists at that moment, this one included,
    once, and then waits for them all to finish. Each write is bounded by the store's timeouts."""
    task = asyncio.ensure_future(_to_the_end(send))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


_RESENDS_AFTER_CANCEL = 5


async def _to_the_end(send: Callable[[], Awaitable[Any]]) -> None:
    """Send until the write completes; each cancellation interrupts one send and the write is sent
    again, at most _RESENDS_AFTER_CANCEL times. A failure is logged (the caller's own outcome, usually
    its cancellation, is what propagates)."""
    for _ in range(_RESENDS_AFTER_CANCEL + 1):
        try:
            await send()
            return
        except asyncio.CancelledError:
            continue  # interrupted: it may not have landed, so send it again
        except Exception as exc:
            log.error("airlock_redis: a store write that had to finish failed: %s", exc)
            return
    log.error(
        "airlock_redis: a store write that had to finish was cancelled %d times; giving up on it",
        _RESENDS_AFTER_CANCEL + 1,
    )


async def _to_completion(send: Callable[[], Awaitable[TransitionResult]]) -> TransitionResult:
    """Await a commit or settle. Cancelled while it was in flight, it may or may not have landed: send
    it again to the end (see :func:`_shielded`) before the cancellation goes on. The common path
    spawns no task."""
    try:
        return await send()
    except asyncio.CancelledError:
        await _shielded(send)
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
