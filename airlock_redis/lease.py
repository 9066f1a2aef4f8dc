"""The lease keeper: one thread per process that renews the leases of every running guarded call.

A guard with ``lease=`` begins each call's record under a lease (see ``lua/common.lua``, layout b):
the record's own expiry, counted by the Redis server, tells a running attempt (renewed within its
lease) from an abandoned one. While the tool body runs, the executor holds a :class:`Ticket` here;
the keeper renews it every ``renew_every`` seconds, in one round trip per store for all the leases
due at once (:meth:`~airlock_redis.stores.base.LeasingEffectStore.renew_leases`), until the call's
last write is answered and the ticket is dropped.

- A call that ends within ``renew_every`` costs no command: holding and dropping a ticket is a dict
  insert and delete under a lock. The thread starts on the first hold, and is woken only when a
  ticket falls due before the time it already sleeps to, so quick calls do not wake it either.
- A renewal that fails (the store is unreachable) is tried again after a quarter of the interval,
  at most a second;
  one answered SUPERSEDED or MISSING means the record is no longer the attempt's (taken over after
  the lease lapsed, or resolved by an operator): the ticket is marked lost, logged, and not renewed
  again. The tool is not interrupted; its commit will be fenced off as it is today.
- Renewals of one store are sent one store at a time from the one thread: a store that hangs delays
  the other stores' renewals by its socket timeout.
- ``fork``: the child starts with no tickets and no thread (it runs none of its parent's calls).
- Interpreter exit: the thread stops (at most a second is waited for it); leases of calls still
  running then lapse, which is the truth.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .core.errors import StoreError
from .core.records import BeginRequest, TransitionResult
from .stores.base import LeasingEffectStore, WaitingEffectStore

log = logging.getLogger("airlock_redis")

_STOP_WAIT = 1.0  # seconds the exit hook waits for the thread
_RETRY_AFTER_FAILURE = 1.0  # seconds at most before a renewal that failed is tried again


# A guard's lease by default (seconds): above a failover (Sentinel's default down-after-milliseconds is
# 30 s, plus the election) plus a renewal interval, so a call running through an ordinary failover is
# not taken for abandoned. Renewed every third of it: tools shorter than 20 s send no renewal.
class _DefaultLease(float):
    """The default lease: a float, told apart from the same number given by hand (a store that keeps
    no leases is then used without one, where a lease asked for by hand is an error)."""


DEFAULT_LEASE: float = _DefaultLease(60.0)


class Ticket:
    """One running attempt's lease, held while its tool runs. ``lost``: its record was found no
    longer the attempt's; ``renewals``: how many renewals were answered OK."""

    __slots__ = ("dropped", "due", "every", "failures", "lost", "number", "renewals", "request", "store")

    def __init__(
        self, number: int, store: LeasingEffectStore, request: BeginRequest, every: float, due: float
    ) -> None:
        self.number = number
        self.store = store
        self.request = request
        self.every = every
        self.due = due
        self.dropped = False
        self.lost = False
        self.renewals = 0
        self.failures = 0  # renewals that failed in a row


class LeaseKeeper:
    """Renews the leases of the running calls of this process (one keeper for every store and
    guard: :data:`KEEPER`). ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # interval -> its tickets in the order they fall due (all of one interval are held for the same
        # time, so insertion order is due order): every hold, drop and renewal is O(1)
        self._due: dict[float, dict[int, Ticket]] = {}
        self._numbers = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")  # when the thread will look next (inf: it waits to be told)
        self._stopped = False

    # -- what the executors call -----------------------------------------------------------------
    def hold(self, store: LeasingEffectStore, request: BeginRequest, every: float) -> Ticket:
        """Keep ``request``'s lease renewed every ``every`` seconds from now, until :meth:`drop`."""
        with self._lock:
            due = self._clock() + every
            ticket = Ticket(next(self._numbers), store, request, every, due)
            self._due.setdefault(every, {})[ticket.number] = ticket
            if self._thread is None and not self._stopped:
                self._start()
            if due < self._wake_at:
                self._changed.notify()
            return ticket

    def drop(self, ticket: Ticket) -> None:
        """Stop renewing ``ticket`` (its call's last write was answered)."""
        with self._lock:
            ticket.dropped = True
            tickets = self._due.get(ticket.every)
            if tickets is not None:
                tickets.pop(ticket.number, None)

    @property
    def held(self) -> int:
        """How many leases are held now."""
        with self._lock:
            return sum(len(tickets) for tickets in self._due.values())

    @property
    def thread(self) -> threading.Thread | None:
        """The renewing thread, once started."""
        return self._thread

    # -- the thread ------------------------------------------------------------------------------
    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="airlock-redis-lease-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self._take_due()
                while not due and not self._stopped:
                    now = self._clock()
                    self._changed.wait(
                        None if self._wake_at == float("inf") else max(0.0, self._wake_at - now)
                    )
                    due = self._take_due()
                if self._stopped:
                    return
            self._renew(due)

    def _take_due(self) -> list[Ticket]:
        """The tickets due now, taken out of their queues; sets when to look next. Lock held."""
        now = self._clock()
        due: list[Ticket] = []
        wake_at = float("inf")
        for tickets in self._due.values():
            while tickets:
                ticket = next(iter(tickets.values()))
                if ticket.due > now:
                    wake_at = min(wake_at, ticket.due)
                    break
                del tickets[ticket.number]
                due.append(ticket)
        self._wake_at = now if due else wake_at
        return due

    def _renew(self, due: list[Ticket]) -> None:
        by_store: dict[int, list[Ticket]] = {}
        for ticket in due:
            by_store.setdefault(id(ticket.store), []).append(ticket)
        for tickets in by_store.values():
            store = tickets[0].store
            try:
                results: list[Any] = store.renew_leases([t.request for t in tickets])
            except Exception as exc:  # a store of our own raises StoreError; a third party's anything
                results = [StoreError(f"{type(exc).__name__}: {exc}")] * len(tickets)
            self._answered(tickets, results)

    def _answered(self, tickets: list[Ticket], results: list[Any]) -> None:
        with self._lock:
            now = self._clock()
            for ticket, result in zip(tickets, results, strict=False):
                if ticket.dropped:
                    continue
                if result is TransitionResult.OK:
                    ticket.renewals += 1
                    ticket.failures = 0
                    ticket.due = now + ticket.every
                elif isinstance(result, StoreError):
                    ticket.failures += 1
                    # soon: after a failover the window in which a running call looks abandoned lasts
                    # until its first renewal reaches the new primary
                    ticket.due = now + min(ticket.every / 4, _RETRY_AFTER_FAILURE)
                    if ticket.failures > 1:  # said once until a renewal succeeds again
                        self._due.setdefault(ticket.every, {})[ticket.number] = ticket
                        continue
                    log.warning(
                        "airlock_redis: the lease of %s under tool_call_id=%r was not renewed (%s); "
                        "trying again",
                        ticket.request.tool,
                        ticket.request.tool_call_id,
                        result,
                    )
                else:
                    ticket.lost = True
                    log.error(
                        "airlock_redis: %s under tool_call_id=%r lost its lease (%s): its record is no "
                        "longer this attempt's (it lapsed and was taken over, or an operator resolved "
                        "it); the tool runs on, and its commit will be refused as superseded",
                        ticket.request.tool,
                        ticket.request.tool_call_id,
                        getattr(result, "value", result),
                    )
                    continue
                self._due.setdefault(ticket.every, {})[ticket.number] = ticket

    # -- process events --------------------------------------------------------------------------
    def stop(self, timeout: float = _STOP_WAIT) -> None:
        """Stop renewing (at interpreter exit): leases still held lapse."""
        with self._lock:
            self._stopped = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _before_fork(self) -> None:
        self._lock.acquire()

    def _after_fork_in_parent(self) -> None:
        self._lock.release()

    def _after_fork_in_child(self) -> None:
        self._reset()  # no tickets, no thread: the parent's calls are not the child's to renew


def lease_settings(
    store: object, lease: float | None, renew_every: float | None
) -> tuple[float | None, float]:
    """A guard's ``lease`` and ``renew_every`` (seconds), checked: the lease and the interval
    (default: a third of the lease, so two renewals may be lost or late before it lapses). Raises
    ValueError for values that cannot work, and for a lease given by hand to a store that keeps no
    leases (the default lease is then dropped: the store's records hold none)."""
    if lease is None:
        if renew_every is not None:
            raise ValueError("renew_every= needs lease= (seconds): without a lease there is nothing to renew")
        return None, 0.0
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0.001 <= lease <= 86_400 * 365:
        raise ValueError(f"lease= must be a number of seconds from 0.001 to a year, not {lease!r}")
    every = lease / 3 if renew_every is None else renew_every
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0 < every < lease:
        raise ValueError(
            f"renew_every= must be a number of seconds above 0 and below lease= ({lease}), "
            f"not {renew_every!r}"
        )
    if not isinstance(store, LeasingEffectStore) or not store.keeps_leases:
        if lease is DEFAULT_LEASE:
            return None, 0.0  # the default, on a store that cannot keep leases: none
        raise ValueError(
            f"lease= needs a store that keeps leases ({type(store).__name__} does not): "
            "InMemoryEffectStore, or a RedisEffectStore with a url or a blocking client= (renewals are "
            "sent from a thread, which an asyncio client cannot serve)"
        )
    return float(lease), float(every)


def wait_setting(store: object, wait_for_running: float) -> float:
    """A guard's ``wait_for_running`` (seconds), checked; 0 where the store cannot wait (a call
    that finds a running attempt is then refused ``effect_in_progress`` at once)."""
    if (
        isinstance(wait_for_running, bool)
        or not isinstance(wait_for_running, (int, float))
        or not 0 <= wait_for_running <= 86_400
    ):
        raise ValueError(
            f"wait_for_running= must be a number of seconds from 0 to a day, not {wait_for_running!r}"
        )
    if not isinstance(store, WaitingEffectStore) or not store.can_wait:
        return 0.0
    return float(wait_for_running)


KEEPER = LeaseKeeper()
"""The keeper of this process."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=KEEPER._before_fork,
        after_in_parent=KEEPER._after_fork_in_parent,
        after_in_child=KEEPER._after_fork_in_child,
    )
atexit.register(KEEPER.stop)
