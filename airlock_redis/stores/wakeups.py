"""Waking the calls that wait for a running attempt: one pub/sub connection per store and process.

A call that finds its record held by a running attempt (its lease is live) may wait for that
attempt to end instead of being refused (``EffectGuard(wait_for_running=...)``). It first flags the
record as waited for (``lua/wait.lua``); the attempt's end (commit, settle, an operator's resolve)
then publishes on the channel named as the record's key (``lua/common.lua``, ``wake``). A channel is
not a key, so this needs no second key in any script (a Cluster refuses a script with two keys while
their slot migrates). This module listens:

- One :class:`Listener` per store: one daemon thread owns the store's one pub/sub connection and does
  all its I/O (redis-py's ``PubSub`` is not thread-safe). Waiters join and leave a channel under a
  lock; the thread subscribes and unsubscribes to match (at most one poll, 20 ms, later), and hands
  each message to every waiter of its channel: a blocking waiter's ``threading.Event``, an asyncio
  waiter's future through its loop's ``call_soon_threadsafe``. One mechanism for both.
- A channel is subscribed once however many calls of the process wait on it; a waiter costs no
  connection of its own (never a pooled connection blocked in BLPOP or the like).
- A dropped connection (a failover, ``CLIENT KILL``, a Cluster node going away): the thread connects
  again, subscribes every channel again, and wakes every waiter once, so each looks at its record
  again: a message lost with the connection costs one extra begin, never a missed end.
- On a Cluster a classic ``PUBLISH`` reaches every node, so the connection may be to any node.
- ``fork``: the child drops the inherited connection without closing it (closing would shut the
  parent's socket down) and starts with no waiter and no thread. Interpreter exit: every waiter is
  woken once and the thread stops (a second at most is waited for).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import redis

log = logging.getLogger("airlock_redis")

_POLL = 0.02  # seconds the thread waits for a message before it looks at joins and leaves
_RECONNECT_PAUSE = 0.2  # seconds before the first attempt to connect again; doubled up to _LONGEST_PAUSE
_LONGEST_PAUSE = 5.0
_STOP_WAIT = 1.0
# how long after its lease would lapse a waiter looks again at a record whose attempt sent no end
AFTER_LEASE = 0.1


class Signal:
    """Set once, from any thread; waited for by a thread (:meth:`wait`) or a coroutine (:meth:`await_`)."""

    __slots__ = ("_event", "_future", "_loop", "value")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._event = threading.Event() if loop is None else None
        self._future: asyncio.Future[None] | None = loop.create_future() if loop is not None else None
        self.value: bytes | None = None

    def set(self, value: bytes | None = None) -> None:
        if self.value is None:
            self.value = value
        if self._event is not None:
            self._event.set()
        elif self._loop is not None and self._future is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits it any more
                self._loop.call_soon_threadsafe(_resolve, self._future)

    def is_set(self) -> bool:
        if self._event is not None:
            return self._event.is_set()
        return self._future is not None and self._future.done()

    def wait(self, timeout: float) -> bool:
        assert self._event is not None
        return self._event.wait(max(0.0, timeout))

    async def await_(self, timeout: float) -> bool:
        assert self._future is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._future), max(0.0, timeout))
        except TimeoutError:
            return False
        return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Waiter:
    """One call waiting on one channel: ``listening`` is set once the channel is subscribed,
    ``woken`` when a message (its value: the status published) or a reconnection comes."""

    __slots__ = ("channel", "listening", "woken")

    def __init__(self, channel: bytes, loop: asyncio.AbstractEventLoop | None) -> None:
        self.channel = channel
        self.listening = Signal(loop)
        self.woken = Signal(loop)


class Listener:
    """The store's pub/sub connection and the waiters on its channels. ``pubsub`` makes a redis-py
    ``PubSub`` (the store's blocking client's)."""

    def __init__(self, pubsub: Callable[[], Any]) -> None:
        self._make = pubsub
        self._reset()
        _LISTENERS.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[bytes, set[Waiter]] = {}
        self._subscribed: set[bytes] = set()  # channels SUBSCRIBE was sent for
        self._confirmed: set[bytes] = set()  # ... and the server confirmed
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._pubsub: Any = None
        self.reconnections = 0
        self._failures = 0  # connection failures in a row (the pause before the next try grows)

    # -- what the waiting calls do ---------------------------------------------------------------
    def join(self, channel: bytes, loop: asyncio.AbstractEventLoop | None = None) -> Waiter:
        """A new waiter on ``channel`` (``loop``: an asyncio waiter's loop; None: a blocking one)."""
        waiter = Waiter(channel, loop)
        with self._lock:
            self._waiters.setdefault(channel, set()).add(waiter)
            if channel in self._confirmed:
                waiter.listening.set()
            if self._stopped:
                waiter.listening.set()
                waiter.woken.set()
            elif self._thread is None:
                self._thread = threading.Thread(target=self._run, name="airlock-redis-wakeups", daemon=True)
                self._thread.start()
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """The waiter is done (woken, timed out or cancelled): the channel is unsubscribed once it has
        no waiter left."""
        with self._lock:
            waiters = self._waiters.get(waiter.channel)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[waiter.channel]

    @property
    def channels(self) -> frozenset[bytes]:
        """The channels subscribed now (confirmed by the server)."""
        with self._lock:
            return frozenset(self._confirmed)

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped:
            try:
                self._turn()
            except (redis.RedisError, OSError) as exc:
                self._lost(exc)
            except Exception:  # a bug: keep the waiters from waiting for nothing, and go on
                log.exception("airlock_redis: the wake-up listener failed")
                self._lost(None)
        self._close()

    def _turn(self) -> None:
        if self._pubsub is None:
            self._pubsub = self._make()
        pubsub = self._pubsub
        with self._lock:
            wanted = set(self._waiters)
            join = wanted - self._subscribed
            leave = self._subscribed - wanted
            self._subscribed = wanted
        if join:
            pubsub.subscribe(*join)
        if leave:
            pubsub.unsubscribe(*leave)
        message = pubsub.get_message(timeout=_POLL)
        self._failures = 0
        while message is not None:
            self._handle(message)
            message = pubsub.get_message(timeout=0)

    def _handle(self, message: dict[str, Any]) -> None:
        kind, channel = message.get("type"), message.get("channel")
        if not isinstance(channel, bytes):
            return
        with self._lock:
            waiters = list(self._waiters.get(channel, ()))
            if kind == "subscribe":
                self._confirmed.add(channel)
            elif kind == "unsubscribe":
                self._confirmed.discard(channel)
                return
        if kind == "subscribe":
            for waiter in waiters:
                waiter.listening.set()
        elif kind == "message":
            data = message.get("data")
            for waiter in waiters:
                waiter.woken.set(data if isinstance(data, bytes) else None)

    def _lost(self, error: BaseException | None) -> None:
        """The connection failed: drop it, wake every waiter (each looks at its record again), and
        subscribe again on the next turn."""
        self._failures += 1
        if error is not None and self._failures == 1:  # said once, until it works again
            log.warning(
                "airlock_redis: the wake-up connection failed (%s); calls waiting for a running attempt "
                "look at their record again, and it is tried again (a user needs SUBSCRIBE and the "
                "channel permission: docs/security.md)",
                error,
            )
        self._close()
        with self._lock:
            self._subscribed = set()
            self._confirmed = set()
            waiters = [w for ws in self._waiters.values() for w in ws]
            self.reconnections += 1
        for waiter in waiters:
            waiter.listening.set()
            waiter.woken.set()
        threading.Event().wait(min(_LONGEST_PAUSE, _RECONNECT_PAUSE * 2 ** (self._failures - 1)))

    def _close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception as exc:  # closing a connection that failed already
                log.debug("airlock_redis: closing the wake-up connection: %s", exc)

    # -- process events --------------------------------------------------------------------------
    def stop(self, timeout: float = _STOP_WAIT) -> None:
        """Wake every waiter once and stop the thread (interpreter exit, or the store is closed)."""
        with self._lock:
            self._stopped = True
            waiters = [w for ws in self._waiters.values() for w in ws]
            thread = self._thread
        for waiter in waiters:
            waiter.listening.set()
            waiter.woken.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def after_fork_in_child(self) -> None:
        self._reset()  # the inherited pub/sub connection is dropped, not closed: it is the parent's


_LISTENERS: weakref.WeakSet[Listener] = weakref.WeakSet()


def _stop_all() -> None:
    for listener in list(_LISTENERS):
        listener.stop()


def _reset_all_in_child() -> None:
    for listener in list(_LISTENERS):
        listener.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_all_in_child)
atexit.register(_stop_all)
