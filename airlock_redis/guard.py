"""EffectGuard: run each side-effecting tool call at most once.

Each call is a :class:`~airlock_redis.core.call_machine.CallMachine` (pure: it decides every step);
the executors (:mod:`.executors`, one blocking, one asyncio) carry its operations out. This module
wraps tools, holds the guard's options, and records an operator's verdicts.
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple, ParamSpec, TypeVar, cast

from .approval import Approver
from .context import read_call_context, tool_call_context
from .core.ambiguity import AmbiguityRule
from .core.call_machine import CallMachine, CallRules, Execution
from .core.callables import is_async_callable
from .core.canonical import ArgumentBinder
from .core.codec import DEFAULT_MAX_RESULT_BYTES, encode_result, return_annotation
from .core.errors import CorruptRecordError
from .core.gates import DEDUPE_MODES, Dedupe, GuardedCall, GuardOptions
from .core.outcome import DEFAULT_AMBIGUOUS_ERRORS, stream_items
from .core.probes import Probe, probe_of
from .core.records import Record, Settlement, Status, TransitionResult
from .core.reversibility import reversibility_of
from .core.signing import Signer, SigningKeys
from .core.stepping import Plan, adrive, drive
from .core.verdicts import Fence, fence_on_current, parse_verdict, resolve_fence
from .executors import AsyncExecutor, BlockingExecutor
from .lease import DEFAULT_LEASE, KEEPER, lease_settings, wait_setting
from .observability import GuardObserver
from .reporting import Reporter
from .stores.base import DedupingEffectStore, DurableEffectStore, EffectStore, RemoteEffectStore
from .stores.memory import InMemoryEffectStore
from .stores.registry import store_from_url

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("airlock_redis")


_NO_VALUE: Any = object()
# an async tool's body as the executor awaits it (named once: subscripting it per call costs a microsecond)
_AsyncBody = Callable[[], Awaitable[Any]]
# set on every wrapper guard.wrap returns: the guard that owns it
_GUARDED_BY = "__effect_guard__"


def _any_annotation() -> Any:
    """The return annotation of a tool that gives none: a replayed value is taken as it is."""
    return Any


def _positive(name: str, seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 86_400:
        raise ValueError(f"{name}= must be a number of seconds above 0 and at most a day, not {seconds!r}")
    return float(seconds)


# wrap(dedupe=...) not given: the guard's own
_GUARD_DEFAULT: Any = object()


def _dedupe_setting(store: EffectStore, dedupe: Any) -> Dedupe | None:
    """``dedupe=`` checked: None, "in_doubt" or "always", on a store that keeps the index."""
    if dedupe is None:
        return None
    if dedupe not in DEDUPE_MODES:
        raise ValueError(f"dedupe= takes None, 'in_doubt' or 'always', not {dedupe!r}")
    if not isinstance(store, DedupingEffectStore):
        raise TypeError(
            f"dedupe={dedupe!r} needs a store that keeps the dedupe index (claim/unclaim/wait_ended), "
            f"such as InMemoryEffectStore or RedisEffectStore; {type(store).__name__} does not"
        )
    return cast(Dedupe, dedupe)


def _name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class EffectGuard:
    """Runs each side-effecting tool call at most once, keyed on the host's tool_call_id.

    ``store`` holds the records: a store, or a store URL (``"redis://localhost:6379/0"``,
    ``"memory://"``; see :func:`~airlock_redis.stores.registry.store_from_url`); a new
    :class:`InMemoryEffectStore` when None (one process only).
    """

    def __init__(
        self,
        store: EffectStore | str | None = None,
        *,
        require_tool_call_id: bool = True,
        require_approval_for_irreversible: bool = False,
        target_args: Sequence[str] = (),
        ambiguous_errors: Sequence[type[BaseException]] | AmbiguityRule = DEFAULT_AMBIGUOUS_ERRORS,
        approver: Approver | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        signing_key: SigningKeys | None = None,
        observer: GuardObserver | None = None,
        lease: float | None = DEFAULT_LEASE,
        renew_every: float | None = None,
        wait_for_running: float = 5.0,
        probe_timeout: float = 10.0,
        dedupe: Dedupe | None = None,
    ) -> None:
        if isinstance(target_args, str):
            target_args = (target_args,)
        ambiguity = AmbiguityRule.of(ambiguous_errors)  # TypeError unless exception classes or a rule
        if max_result_bytes <= 0:
            raise ValueError("max_result_bytes must be positive")
        if isinstance(store, str):
            store = store_from_url(store)
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
        self._report = Reporter(observer)
        self.lease, self.renew_every = lease_settings(store_, lease, renew_every)
        lease_ms = None if self.lease is None else round(self.lease * 1000)
        self.wait_for_running = wait_setting(store_, wait_for_running)
        self._rules = CallRules(
            self.options,
            ambiguity,
            max_result_bytes,
            self._signer,
            self._target,
            lease_ms,
            self.wait_for_running,
            _positive("probe_timeout", probe_timeout),
        )
        self.probe_timeout = float(probe_timeout)
        # the same idempotency key under a new tool_call_id: None (another call), "in_doubt" (that
        # call while the first runs or is in doubt) or "always" (and its value once committed)
        self.dedupe = _dedupe_setting(store_, dedupe)
        keeper = KEEPER if lease is not None else None
        self._blocking = BlockingExecutor(store_, self._durable, self._report, keeper, self.renew_every)
        self._async = AsyncExecutor(store_, self._durable, self._report, keeper, self.renew_every)
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
    def wrap(
        self,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        reconcile: Probe | None = None,
        dedupe: Dedupe | None = _GUARD_DEFAULT,
    ) -> Callable[P, R]:
        """Guard ``fn``. The call's id comes from :func:`~airlock_redis.tool_call_context`.

        ``reconcile``: the tool's probe (or the one ``fn`` was tagged with by
        :func:`~airlock_redis.reconcile_with`): when the call is in doubt it is asked whether the
        call took effect (see :mod:`airlock_redis.core.probes`). ``dedupe``: this tool's own
        ``EffectGuard(dedupe=...)`` (None turns it off for this tool; not given: the guard's)."""
        tool = name or getattr(fn, "__name__", None) or type(fn).__name__
        mode = self.dedupe if dedupe is _GUARD_DEFAULT else _dedupe_setting(self.store, dedupe)
        if reconcile is not None and not callable(reconcile):
            raise TypeError(f"reconcile= takes a probe function, not {reconcile!r}")
        probe = reconcile if reconcile is not None else probe_of(fn)
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
                probe=probe,
                dedupe=mode,
            )

        if is_async_callable(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                call = describe(args, kwargs)
                body = cast(_AsyncBody, lambda: fn(*args, **kwargs))
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
        plan = self._resolving(tool_call_id, verdict, seen, force, expect_key, value)
        return drive(
            plan, lambda op: self.store.get(tool_call_id) if op is None else op.to(self.store.resolve)
        )

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
        plan = self._resolving(tool_call_id, verdict, seen, force, expect_key, value)
        return await adrive(
            plan, lambda op: self.store.aget(tool_call_id) if op is None else op.to(self.store.aresolve)
        )

    def _resolving(  # noqa: PLR0917
        self,
        tool_call_id: str,
        verdict: Status | Settlement | str,
        seen: Record | Fence | None,
        force: bool,
        expect_key: str | None,
        value: Any,
    ) -> Plan[TransitionResult]:
        """The verdict's steps, for either driver: yields None to read the record (sent the record),
        then the store's ``resolve`` arguments (sent its answer)."""
        verdict, fence, data = self._resolve_args(verdict, seen, force, expect_key, value)
        if force:
            try:
                current = fence_on_current(fence, (yield None))
            except CorruptRecordError:
                current = fence  # a damaged record: forced as it is (its key still checked when given)
            if current is None:
                return TransitionResult.MISSING
            fence = current
        mac = self._resolve_mac(tool_call_id, fence.key, data)
        result: TransitionResult = yield _ResolveArgs(
            tool_call_id, verdict, fence.key, fence.status, fence.owner, data, mac
        )
        self._report.resolved(tool_call_id, verdict, result)
        return result

    # -- running a call ------------------------------------------------------------------------
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
        The decisions are the :class:`~airlock_redis.core.call_machine.CallMachine`'s; the
        executor only does the I/O.
        """
        machine = CallMachine(self._rules, call, annotation)
        return self._blocking.run(machine, invoke, approver or self.approver)

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
        machine = CallMachine(self._rules, call, annotation)
        return await self._async.run(machine, invoke, approver or self.approver)


class _ResolveArgs(NamedTuple):
    """The arguments of a store's ``resolve``, in its order (the last five by keyword there)."""

    tool_call_id: str
    verdict: Status | Settlement
    expect_key: str | None
    expect_status: Status | None
    expect_owner: str | None
    value: bytes | None
    mac: bytes | None

    def to(self, resolve: Callable[..., R]) -> R:
        """Call a store's ``resolve`` (or ``aresolve``) with these arguments."""
        return resolve(
            self.tool_call_id,
            self.verdict,
            expect_key=self.expect_key,
            expect_status=self.expect_status,
            expect_owner=self.expect_owner,
            value=self.value,
            mac=self.mac,
        )


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
