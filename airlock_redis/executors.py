"""The two executors of a guarded call: one blocking, one asyncio. Each carries out the operations
the call machine (:mod:`airlock_redis.core.call_machine`) returns and feeds the answers back; neither
decides anything. What both do alike (how a call ends, what is reported) is shared, not mirrored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from .approval import Approver, approval_request, approve, approve_blocking
from .context import read_running, refuses_in_doubt, running_key
from .core.call_machine import (
    Ask,
    Begin,
    CallMachine,
    Claim,
    Execution,
    Finish,
    GiveBack,
    Operation,
    Probe,
    ReadHolder,
    Refuse,
    Running,
    RunTool,
    Secure,
    Unclaim,
    Wait,
    WaitHolder,
    Write,
)
from .core.errors import EffectRefused, StoreError
from .core.records import Settlement, TransitionResult
from .lease import LeaseKeeper, Ticket
from .probing import ask, ask_blocking, clock
from .reporting import Reporter
from .stores.base import (
    DedupingEffectStore,
    DurableEffectStore,
    EffectStore,
    LeasingEffectStore,
    WaitingEffectStore,
)

log = logging.getLogger("airlock_redis")


def running_now() -> Running:
    """The guarded call whose body runs in this context (all None when there is none)."""
    return Running(*read_running())


def conclude(report: Reporter, machine: CallMachine, op: Operation) -> Execution[Any]:
    """End the call as the machine said: return the execution, raise the refusal (reported here,
    whichever step refused), or raise what the tool or an interruption raised."""
    if type(op) is Finish:
        return op.execution
    if type(op) is Refuse:
        report.refused(machine, op)
        raise op.refusal from op.cause
    raise op.error  # type: ignore[union-attr]  # Reraise: the only other outcome


def as_store_error(error: Exception) -> StoreError:
    """A store failure as a StoreError (a third-party store may raise anything)."""
    return error if isinstance(error, StoreError) else StoreError(f"{type(error).__name__}: {error}")


# the operation -> the name of the executor's method that carries it out (both executors have each)
_STEPS = {
    Begin: "_begin",
    RunTool: "_run",
    Write: "_write",
    Secure: "_secure",
    Wait: "_wait",
    Probe: "_probe",
    GiveBack: "_give_back",
    Ask: "_ask",
    Claim: "_claim",
    ReadHolder: "_read_holder",
    WaitHolder: "_wait_holder",
    Unclaim: "_unclaim",
}


class _Executor:
    __slots__ = ("_steps", "durable", "index", "leases", "renew_every", "report", "store", "waits")

    def __init__(
        self,
        store: EffectStore,
        durable: DurableEffectStore | None,
        report: Reporter,
        leases: LeaseKeeper | None = None,
        renew_every: float = 0.0,
    ) -> None:
        self.store = store
        self.durable = durable  # set: the tool runs only once enough replicas hold its record
        self.report = report
        # set (with a lease on the guard): renews each running call's lease every renew_every seconds
        self.leases = leases
        self.renew_every = renew_every
        # the store as one a call can wait in for a running attempt (the guard's wait_for_running
        # is 0 when it cannot, so the machine never asks then)
        self.waits = cast(WaitingEffectStore, store)
        # the store as one that keeps the dedupe index (the guard refuses dedupe= on any other)
        self.index = cast(DedupingEffectStore, store)
        # the bound methods, looked up once: the loop dispatches on the operation's type
        self._steps: dict[type, Any] = {op: getattr(self, name) for op, name in _STEPS.items()}

    def _hold(self, machine: CallMachine, op: RunTool) -> None:
        """Keep the attempt's lease renewed while its tool runs, until its last write is answered."""
        leases = self.leases
        if op.lease is not None and leases is not None:
            machine.ticket = leases.hold(cast(LeasingEffectStore, self.store), op.lease, self.renew_every)

    def _let_go(self, machine: CallMachine) -> None:
        """The call is over (its last write answered, or the executor was interrupted): stop renewing."""
        ticket = machine.ticket
        if ticket is not None and self.leases is not None:
            machine.ticket = None
            self.leases.drop(cast(Ticket, ticket))


class BlockingExecutor(_Executor):
    """Carries a call of a blocking tool out."""

    __slots__ = ()

    def run(
        self, machine: CallMachine, invoke: Callable[[], Any], approver: Approver | None
    ) -> Execution[Any]:
        op = machine.start(Running(*read_running()))
        steps = self._steps
        try:
            while (step := steps.get(type(op))) is not None:
                op = step(machine, op, invoke, approver)
        finally:
            self._let_go(machine)
        return conclude(self.report, machine, op)

    def _begin(self, machine: CallMachine, op: Begin, invoke: object, approver: object) -> Operation:
        t_sent = self.report.clock()
        try:
            outcome = self.store.begin(op.request)
        except StoreError as exc:
            return self.report.begin_failed(machine.begin_failed(exc), exc)
        except BaseException as exc:  # interrupted while begin ran: it may have landed
            return machine.begin_interrupted(exc)
        return self.report.begun(machine, machine.begun(outcome, self.durable is not None), t_sent)

    def _wait(self, machine: CallMachine, op: Wait, invoke: object, approver: object) -> Operation:
        started = time.monotonic()
        try:
            outcome = self.waits.wait_running(op.request, op.seconds)
        except StoreError as exc:
            return self.report.begin_failed(machine.begin_failed(exc), exc)
        except BaseException as exc:  # interrupted while waiting: the begin after the wait may have landed
            return machine.begin_interrupted(exc)
        return self.report.woken(machine, machine.woken(outcome, time.monotonic() - started))

    def _probe(self, machine: CallMachine, op: Probe, invoke: object, approver: object) -> Operation:
        started = clock()
        verdict = ask_blocking(op.probe, op.call, op.timeout)
        self.report.probed(self.store, op, verdict, clock() - started)
        return machine.probed(verdict)

    def _secure(self, machine: CallMachine, op: Secure, invoke: object, approver: object) -> Operation:
        assert self.durable is not None
        try:
            self.durable.ensure_durable(op.request)
        except StoreError as exc:
            return self.report.begin_failed(machine.secure_failed(exc), exc)
        return machine.secured()

    def _run(
        self, machine: CallMachine, op: RunTool, invoke: Callable[[], Any], approver: object
    ) -> Operation:
        machine.t_run = self.report.clock()
        self._hold(machine, op)
        try:
            with running_key(*op.running):
                value = invoke()
        except BaseException as error:
            return machine.raised(error, refuse_in_doubt=refuses_in_doubt(machine.call.raw_tool_call_id))
        return machine.returned(value)

    def _write(self, machine: CallMachine, op: Write, invoke: object, approver: object) -> Operation:
        t_sent = self.report.clock()
        try:
            step = op.step
            if isinstance(step, Settlement):
                result: TransitionResult | StoreError = self.store.settle(op.request, op.attempt, step)
            else:
                result = self.store.commit(op.request, op.attempt, step.data, step.mac)
        except Exception as exc:  # whatever the store raised: the tool has run (or will not)
            result = as_store_error(exc)
        self.report.ended(machine, op, result, machine.t_run, t_sent)
        return machine.written()

    def _give_back(self, machine: CallMachine, op: GiveBack, invoke: object, approver: object) -> Operation:
        try:
            self.store.settle(op.request, 1, Settlement.RELEASE)
        except StoreError as exc:
            self.report.unreleased(op.request, exc)
        return machine.given_back()

    def _ask(self, machine: CallMachine, op: Ask, invoke: object, approver: Approver | None) -> Operation:
        assert machine.plan is not None
        try:
            approve_blocking(approver, approval_request(machine.call, machine.plan, op.why))
        except EffectRefused as refusal:
            return machine.denied(refusal)
        return machine.approved(running_now())

    def _claim(self, machine: CallMachine, op: Claim, invoke: object, approver: object) -> Operation:
        try:
            holder = self.index.claim(op.request, op.expected)
        except Exception as exc:
            error = as_store_error(exc)
            return self.report.begin_failed(machine.claim_failed(error), error)
        except BaseException as exc:  # interrupted while the claim ran: it may have landed
            return machine.interrupted(exc)
        return machine.claimed() if holder is None else machine.held(holder)

    def _read_holder(
        self, machine: CallMachine, op: ReadHolder, invoke: object, approver: object
    ) -> Operation:
        try:
            record = self.store.get(op.holder.tool_call_id)
        except Exception as exc:
            error = as_store_error(exc)
            return self.report.begin_failed(machine.check_failed(error), error)
        except BaseException as exc:
            return machine.interrupted(exc)
        return machine.holder_seen(record)

    def _wait_holder(
        self, machine: CallMachine, op: WaitHolder, invoke: object, approver: object
    ) -> Operation:
        started = time.monotonic()
        try:
            self.index.wait_ended(op.holder.tool_call_id, op.seconds)
        except Exception as exc:
            error = as_store_error(exc)
            return self.report.begin_failed(machine.check_failed(error), error)
        except BaseException as exc:
            return machine.interrupted(exc)
        return machine.holder_ended(time.monotonic() - started)

    def _unclaim(self, machine: CallMachine, op: Unclaim, invoke: object, approver: object) -> Operation:
        try:
            self.index.unclaim(op.request, op.keep)
        except Exception as exc:  # the entry lapses with its TTL; its record is the authority meanwhile
            self.report.unclaimed_failed(op.request, as_store_error(exc))
        return machine.unclaimed()


class AsyncExecutor(_Executor):
    """Carries a call of an async tool out. A cancellation while the store is reached never leaves
    a record behind for a tool that did not run: the begin is given back (a tombstone keeps a begin
    that lands later out), and a commit or settle in flight is sent again to completion before the
    cancellation goes on."""

    __slots__ = ()

    async def run(
        self, machine: CallMachine, invoke: Callable[[], Awaitable[Any]], approver: Approver | None
    ) -> Execution[Any]:
        op = machine.start(Running(*read_running()))
        steps = self._steps
        try:
            while (step := steps.get(type(op))) is not None:
                op = await step(machine, op, invoke, approver)
        finally:
            self._let_go(machine)
        return conclude(self.report, machine, op)

    async def _begin(self, machine: CallMachine, op: Begin, invoke: object, approver: object) -> Operation:
        t_sent = self.report.clock()
        try:
            outcome = await self.store.abegin(op.request)
        except StoreError as exc:
            return self.report.begin_failed(machine.begin_failed(exc), exc)
        except BaseException as exc:  # cancelled (or interrupted) while begin ran: it may have landed
            return machine.begin_interrupted(exc)
        return self.report.begun(machine, machine.begun(outcome, self.durable is not None), t_sent)

    async def _wait(self, machine: CallMachine, op: Wait, invoke: object, approver: object) -> Operation:
        started = time.monotonic()
        try:
            outcome = await self.waits.await_running(op.request, op.seconds)
        except StoreError as exc:
            return self.report.begin_failed(machine.begin_failed(exc), exc)
        except BaseException as exc:  # cancelled while waiting: the begin after the wait may have landed
            return machine.begin_interrupted(exc)
        return self.report.woken(machine, machine.woken(outcome, time.monotonic() - started))

    async def _probe(self, machine: CallMachine, op: Probe, invoke: object, approver: object) -> Operation:
        started = clock()
        verdict = await ask(op.probe, op.call, op.timeout)
        self.report.probed(self.store, op, verdict, clock() - started)
        return machine.probed(verdict)

    async def _secure(self, machine: CallMachine, op: Secure, invoke: object, approver: object) -> Operation:
        assert self.durable is not None
        try:
            await self.durable.aensure_durable(op.request)
        except StoreError as exc:
            return self.report.begin_failed(machine.secure_failed(exc), exc)
        return machine.secured()

    async def _run(
        self, machine: CallMachine, op: RunTool, invoke: Callable[[], Awaitable[Any]], approver: object
    ) -> Operation:
        machine.t_run = self.report.clock()
        self._hold(machine, op)
        try:
            with running_key(*op.running):
                value = await invoke()
        except BaseException as error:
            return machine.raised(error, refuse_in_doubt=refuses_in_doubt(machine.call.raw_tool_call_id))
        return machine.returned(value)

    async def _write(self, machine: CallMachine, op: Write, invoke: object, approver: object) -> Operation:
        t_sent = self.report.clock()
        result: TransitionResult | StoreError
        try:
            result = await self._send(op)
        except asyncio.CancelledError:  # in flight, it may or may not have landed: sent again to the end
            await _shielded(lambda: self._send(op))
            raise
        except Exception as exc:  # whatever the store raised: the tool has run (or will not)
            result = as_store_error(exc)
        self.report.ended(machine, op, result, machine.t_run, t_sent)
        return machine.written()

    def _send(self, op: Write) -> Awaitable[TransitionResult]:
        step = op.step
        if isinstance(step, Settlement):
            return self.store.asettle(op.request, op.attempt, step)
        return self.store.acommit(op.request, op.attempt, step.data, step.mac)

    async def _give_back(
        self, machine: CallMachine, op: GiveBack, invoke: object, approver: object
    ) -> Operation:
        async def release() -> None:
            try:
                await self.store.asettle(op.request, 1, Settlement.RELEASE)
            except StoreError as exc:
                self.report.unreleased(op.request, exc)

        await _shielded(release)
        return machine.given_back()

    async def _ask(
        self, machine: CallMachine, op: Ask, invoke: object, approver: Approver | None
    ) -> Operation:
        assert machine.plan is not None
        try:
            await approve(approver, approval_request(machine.call, machine.plan, op.why))
        except EffectRefused as refusal:
            return machine.denied(refusal)
        return machine.approved(running_now())

    async def _claim(self, machine: CallMachine, op: Claim, invoke: object, approver: object) -> Operation:
        try:
            holder = await self.index.aclaim(op.request, op.expected)
        except Exception as exc:
            error = as_store_error(exc)
            return self.report.begin_failed(machine.claim_failed(error), error)
        except BaseException as exc:  # cancelled while the claim ran: it may have landed
            return machine.interrupted(exc)
        return machine.claimed() if holder is None else machine.held(holder)

    async def _read_holder(
        self, machine: CallMachine, op: ReadHolder, invoke: object, approver: object
    ) -> Operation:
        try:
            record = await self.store.aget(op.holder.tool_call_id)
        except Exception as exc:
            error = as_store_error(exc)
            return self.report.begin_failed(machine.check_failed(error), error)
        except BaseException as exc:
            return machine.interrupted(exc)
        return machine.holder_seen(record)

    async def _wait_holder(
        self, machine: CallMachine, op: WaitHolder, invoke: object, approver: object
    ) -> Operation:
        started = time.monotonic()
        try:
            await self.index.await_ended(op.holder.tool_call_id, op.seconds)
        except Exception as exc:
            error = as_store_error(exc)
            return self.report.begin_failed(machine.check_failed(error), error)
        except BaseException as exc:
            return machine.interrupted(exc)
        return machine.holder_ended(time.monotonic() - started)

    async def _unclaim(
        self, machine: CallMachine, op: Unclaim, invoke: object, approver: object
    ) -> Operation:
        async def unclaim() -> None:
            try:
                await self.index.aunclaim(op.request, op.keep)
            except Exception as exc:  # the entry lapses with its TTL; its record is the authority
                self.report.unclaimed_failed(op.request, as_store_error(exc))

        await _shielded(unclaim)
        return machine.unclaimed()


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
