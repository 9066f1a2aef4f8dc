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
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

from .approval import Approver, approve, approve_blocking
from .attempts import Attempt, AttemptRules, Commit, Execution, Reporter
from .context import read_call_context, tool_call_context
from .core.ambiguity import AmbiguityRule
from .core.callables import is_async_callable
from .core.canonical import ArgumentBinder
from .core.codec import DEFAULT_MAX_RESULT_BYTES, encode_result, return_annotation
from .core.errors import (
    CorruptRecordError,
    EffectRefused,
    StoreError,
)
from .core.gates import GuardedCall, GuardOptions
from .core.outcome import DEFAULT_AMBIGUOUS_ERRORS, stream_items
from .core.records import BeginRequest, Record, Settlement, Status, TransitionResult
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


def _any_annotation() -> Any:
    """The return annotation of a tool that gives none: a replayed value is taken as it is."""
    return Any


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
        self._rules = AttemptRules(self.options, ambiguity, max_result_bytes, self._signer, self._report)
        # what call()/acall() wrapped, so a function is wrapped (and its signature read) once
        self._wrappers: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def require_tool_call_id(self) -> bool:
        """Whether a call to a tool that is not reversible, made without a usable tool_call_id, is
        refused (``tool_call_id_required``); when False it runs without a record."""
        return self.options.require_tool_call_id

    @property
    def require_approval_for_irreversible(self) -> bool:
        """Whether every call to an irreversible tool (replays included) goes to the ``approver``
        first; with no approver such a call is refused (``approval_denied``)."""
        return self.options.require_approval_for_irreversible

    @property
    def target_args(self) -> tuple[str, ...]:
        """The argument names of which a call to an irreversible tool must pass at least one with a
        value (``target_args_required`` otherwise); empty: no such check."""
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
            host = read_call_context()
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
                    for item in stream_items(done.value):
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

    # -- the writes both drivers send ------------------------------------------------------------
    def _refused(self, call: GuardedCall, refusal: EffectRefused) -> None:
        if self._observer is not None:
            self._observer.call_event("refused", call.tool, refusal.tool_call_id, reason=refusal.reason)

    def _write(self, attempt: Attempt, step: Commit | Settlement) -> TransitionResult:
        request = attempt.request
        assert request is not None
        if isinstance(step, Settlement):
            return self.store.settle(request, attempt.attempt, step)
        return self.store.commit(request, attempt.attempt, step.data, step.mac)

    async def _awrite(self, attempt: Attempt, step: Commit | Settlement) -> TransitionResult:
        request = attempt.request
        assert request is not None
        if isinstance(step, Settlement):
            return await self.store.asettle(request, attempt.attempt, step)
        return await self.store.acommit(request, attempt.attempt, step.data, step.mac)

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

    # -- blocking driver -------------------------------------------------------------------------
    def execute(
        self,
        call: GuardedCall,
        invoke: Callable[[], T],
        *,
        approver: Approver | None = None,
        annotation: Callable[[], Any] = _any_annotation,
    ) -> Execution[T]:
        """Run one call of a blocking tool through the gates, the store and the replay table.

        ``invoke`` runs the tool body. ``approver`` overrides the guard's own for this call.
        Raises an :class:`EffectRefused` when the call is refused; whatever the tool raises otherwise.
        The decisions are the :class:`~airlock_redis.attempts.Attempt`'s; this only does the I/O.
        """
        try:
            attempt = Attempt(self._rules, call, annotation)
            if attempt.approval is not None:
                approve_blocking(approver or self.approver, attempt.approval)
        except EffectRefused as refusal:
            self._refused(call, refusal)
            raise
        request = attempt.begin_request()
        if request is None:
            with attempt.running():
                return attempt.without_record(invoke())
        try:
            outcome = self.store.begin(request)
        except StoreError as exc:
            release, refused = attempt.on_begin_failed(exc)
            if release:
                self._release_lost_begin(request)
            raise refused from exc
        except BaseException:  # interrupted while begin ran: it may have landed; the tool never runs
            self._release_lost_begin(request)
            raise
        replay = attempt.on_begun(outcome)
        if replay is not None:
            return replay
        if self._durable is not None:
            self._make_durable(attempt, request)
        try:
            with attempt.running():
                value = invoke()
        except BaseException as error:
            self._finish(attempt, attempt.on_raised(error))
            raise
        self._finish(attempt, attempt.on_returned(value))
        return attempt.executed(value)

    def _make_durable(self, attempt: Attempt, request: BeginRequest) -> None:
        """wait_replicas: the tool runs only once enough replicas hold its pending record."""
        assert self._durable is not None
        try:
            self._durable.ensure_durable(request)
        except StoreError as exc:
            self._finish(attempt, attempt.give_back())
            raise attempt.on_begin_failed(exc)[1] from exc

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

    def _finish(self, attempt: Attempt, step: Commit | Settlement) -> None:
        """Send the attempt's last write. Never raises: the tool has run (or will not), and the
        caller gets its value or its own error whatever the store does."""
        t_sent = time.perf_counter() if self._observer is not None else 0.0
        try:
            result: TransitionResult | StoreError = self._write(attempt, step)
        except Exception as exc:  # whatever the store raised
            result = as_store_error(exc)
        attempt.ended(step, result, t_sent)

    # -- coroutine driver ------------------------------------------------------------------------
    async def aexecute(
        self,
        call: GuardedCall,
        invoke: Callable[[], Awaitable[T]],
        *,
        approver: Approver | None = None,
        annotation: Callable[[], Any] = _any_annotation,
    ) -> Execution[T]:
        """Coroutine form of :meth:`execute` for async tools; ``invoke`` returns the awaitable body.

        A cancellation while the store is reached never leaves a record behind for a tool that did
        not run: the begin is given back (a tombstone keeps a begin that lands later out), and a
        commit or settle in flight is sent again to completion before the cancellation goes on.
        """
        try:
            attempt = Attempt(self._rules, call, annotation)
            if attempt.approval is not None:
                await approve(approver or self.approver, attempt.approval)
        except EffectRefused as refusal:
            self._refused(call, refusal)
            raise
        request = attempt.begin_request()
        if request is None:
            with attempt.running():
                return attempt.without_record(await invoke())
        try:
            outcome = await self.store.abegin(request)
        except StoreError as exc:
            release, refused = attempt.on_begin_failed(exc)
            if release:
                await _shielded(lambda: self._arelease_lost_begin(request))
            raise refused from exc
        except BaseException:  # cancelled (or interrupted) while begin ran
            await _shielded(lambda: self._arelease_lost_begin(request))
            raise
        replay = attempt.on_begun(outcome)
        if replay is not None:
            return replay
        if self._durable is not None:
            await self._amake_durable(attempt, request)
        try:
            with attempt.running():
                value = await invoke()
        except BaseException as error:
            await self._afinish(attempt, attempt.on_raised(error))
            raise
        await self._afinish(attempt, attempt.on_returned(value))
        return attempt.executed(value)

    async def _amake_durable(self, attempt: Attempt, request: BeginRequest) -> None:
        assert self._durable is not None
        try:
            await self._durable.aensure_durable(request)
        except StoreError as exc:
            await self._afinish(attempt, attempt.give_back())
            raise attempt.on_begin_failed(exc)[1] from exc

    async def _arelease_lost_begin(self, request: BeginRequest) -> None:
        try:
            await self.store.asettle(request, 1, Settlement.RELEASE)
        except StoreError as exc:
            self._report.unreleased(request, exc)

    async def _afinish(self, attempt: Attempt, step: Commit | Settlement) -> None:
        """:meth:`_finish`, sent again to completion if the caller is cancelled meanwhile."""
        t_sent = time.perf_counter() if self._observer is not None else 0.0
        try:
            result: TransitionResult | StoreError = await _to_completion(lambda: self._awrite(attempt, step))
        except Exception as exc:  # whatever the store raised
            result = as_store_error(exc)
        attempt.ended(step, result, t_sent)


def as_store_error(error: Exception) -> StoreError:
    """A store failure as a StoreError (a third-party store may raise anything)."""
    return error if isinstance(error, StoreError) else StoreError(f"{type(error).__name__}: {error}")


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
