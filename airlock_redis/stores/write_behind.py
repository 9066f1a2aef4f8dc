"""Write-behind commits (``RedisEffectStore(..., write_behind=True)``): the caller gets the tool's value
as soon as the tool returns, and the commit (or the settle to unknown) is handed to a background sender
of the store, which sends it without the caller waiting for its reply.

What goes write-behind: commits, and settles to unknown. Not releases: a release tells the caller that
the call may run again at once, on any replica, so it must have landed when the caller hears it (a
queued release would leave a pending record that refuses the retry it allowed). A write that never
lands leaves the record pending, which refuses retries as in doubt, exactly as unknown does: so
deferring a commit or an unknown can cost a replay (the retry is refused, never re-run), never a second
run of the tool.

The senders:

- blocking calls: one daemon thread per store, started on the first write, sending through the
  store's blocking client;
- asyncio calls: one sender per event loop, a task of that loop started when a write is queued and
  ended when the queue is empty, sending through that loop's client. When ``asyncio.run`` ends it
  cancels the task; the task sends what is queued first (at most ``CLOSE_TIMEOUT`` seconds) and only
  then lets the cancellation go on (the loop's client is closed after that, with the loop's async
  generators). Writes of a loop closed some other way are given up (logged) the next time a loop
  needs a sender.

Each sender takes what is queued, in order, at most ``BATCH_LIMIT`` writes, and sends them as one
``pipeline(transaction=False)`` round trip (redis-py's public API). A batch never holds two writes of
the same record, so a later write of a record never overtakes an earlier one, even when a batch is
partly sent again. A write is first re-sent as the store's synchronous path re-sends it (:mod:`.tries`:
a dropped connection or a timeout is sent again, with the script's source; a NOSCRIPT answer is sent
again with the source at once), and then for longer: a write that fails with an error of ``RESEND``
(a dropped connection, a timeout, or what a failover answers while it lasts) is sent again, with a
capped exponential backoff, until ``RETRY_WINDOW`` seconds have passed since its first send (nobody
waits for it, and a failover takes seconds). Any other error reply is final. Writes queued before a
``close`` that gave up waiting for them go back to the synchronous path's tries only. A write that
still fails is given up: logged at ERROR with the tool and the tool_call_id; the record stays
pending: retries are refused as in doubt and the tool is never run again (until ``pending_ttl`` ends,
as after a failed synchronous commit). The guard has already reported the call as committed (its
observer lives above the store); to learn what became of each write, register a listener with
:meth:`airlock_redis.RedisEffectStore.add_write_behind_listener`: it is called with a
:class:`WriteBehindOutcome` once the write landed (the server's answer) or was given up (the error).

Reads by this process: every operation of the store on a record (begin, get, resolve, release) first
waits until the writes this process queued for that record have landed (or were given up), so a begin
of a tool_call_id whose commit is still queued sees the committed value. Another process sees the
record pending until the write lands: that is the cost of write-behind.

``flush(timeout)`` waits until every write queued before it has landed; ``store.close()`` flushes (at
most ``CLOSE_TIMEOUT`` seconds in all: a write still being re-sent then gets no more than the
synchronous path's tries, and is given up and logged after them), and so does interpreter exit (an
``atexit`` hook, at most ``EXIT_TIMEOUT`` seconds per store). After ``os.fork`` the child starts with
empty queues and no sender: it never sends the parent's writes (the parent still does), and its own
writes start a sender of its own (the store's listeners stay).

When ``QUEUE_LIMIT`` writes wait (Redis is slow or unreachable), a further commit is sent synchronously
(the caller waits for it, as without write-behind): the queue's memory stays bounded.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple

import redis
from redis.exceptions import (
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisClusterUnreachableError,
    SlotNotCoveredError,
    TryAgainError,
)

from ..core.errors import StoreError
from ..core.records import BeginRequest, TransitionResult
from ..core.stepping import Plan, adrive, drive
from .blocking_wire import BlockingWire
from .redis_io import REDIS_FAILURES, Command, Op, Pause, Read, Waited
from .replies import parse_transition
from .script_args import ScriptCommand
from .tries import RETRYABLE, Tries, backoff

log = logging.getLogger("airlock_redis")

# At most this many writes in one pipeline. Nobody waits for a batch's replies, so the bound only
# keeps one round trip's request and replies small (a few socket buffers with results of a few
# hundred bytes) and lets the first writes of a burst land without waiting for the whole burst; the
# auto-pipeline's bound (see .autopipe), where past about a hundred the saved round trips stop paying.
BATCH_LIMIT = 128
# At most this many writes wait in a store's queues; past it a commit is sent synchronously.
QUEUE_LIMIT = 10_000
CLOSE_TIMEOUT = 5.0  # seconds store.close() (and the end of asyncio.run) waits for queued writes
EXIT_TIMEOUT = 3.0  # seconds interpreter exit waits for each store's queued writes
KEY_WAIT_TIMEOUT = 10.0  # seconds an operation on a record waits for that record's queued writes
# The blocking sender waits this long before it takes a batch that is not full, so that the writes of
# the next few calls go with it: nobody waits for them, and a batch of one write costs the process
# more than the commit it takes off the caller (the sender's pipeline and the thread switches share the
# GIL with the callers), which on loopback made write-behind slower than without it.
LINGER = 0.002
IDLE_EXIT = 5.0  # seconds the blocking sender waits idle before it ends (the next write starts one)
# A write that keeps failing with an error of RESEND is sent again until this many seconds have passed
# since its first send. The synchronous path's few tries (.tries: about half a second) suit a caller
# who waits; nobody waits for a queued write, and one given up leaves its call in doubt for no reason
# (the record stays pending). A failover takes seconds: a Cluster promotes a replica after
# cluster-node-timeout (15 s by default) and an election, a Sentinel after down-after-milliseconds and
# an election (issue 27: during Cluster primary kills about 1% of queued commits were given up after
# the few tries). Bounded all the same, so that a Redis that stays down ends in a logged give-up:
# meanwhile later writes wait behind the one being re-sent (per-record order), and past QUEUE_LIMIT a
# commit is sent synchronously. The backoff's cap bounds how long a write waits once Redis is back.
RETRY_WINDOW: Final = 30.0
RETRY_BACKOFF: Final = (0.05, 1.0)  # seconds: base and cap of those re-sends' backoff (full jitter)
RESEND: Final = (
    *RETRYABLE,  # a dropped connection or a timeout, as in .tries; LOADING is a ConnectionError too
    ClusterDownError,  # CLUSTERDOWN, MASTERDOWN: the slot's primary failed, no replica promoted yet
    TryAgainError,  # TRYAGAIN: a slot moving or failing over
    ReadOnlyError,  # READONLY: a primary just demoted to a replica
    SlotNotCoveredError,  # the cluster client's map has no node for the slot yet
    RedisClusterUnreachableError,  # the cluster client reached no node when it read the map again
)
"""The errors after which the sender sends a write again for up to ``RETRY_WINDOW`` seconds: none of
them was applied on the server, or it may have been and every transition is safe to send again (the
attempt's owner token: see lua/*.lua)."""
# what a pipeline's round trip may raise (a Cluster client's own errors are not RedisErrors)
SEND_FAILURES: Final = (*REDIS_FAILURES, RedisClusterException)


class WriteBehindOutcome(NamedTuple):
    """What became of one write-behind write, as a listener registered with
    :meth:`airlock_redis.RedisEffectStore.add_write_behind_listener` gets it: it landed (``error`` is
    None; ``result`` is the server's answer: ``OK``, or why it did not apply), or it was given up
    (``error`` says why; ``result`` is None; the record stays pending)."""

    request: BeginRequest  # the call: its tool_call_id, tool and attempt's owner token
    what: str  # "commit" or "settle to unknown"
    result: TransitionResult | None
    error: BaseException | None

    @property
    def tool_call_id(self) -> str:
        """The call's tool_call_id."""
        return self.request.tool_call_id

    @property
    def landed(self) -> bool:
        """True when the server answered the write (``result``), False when it was given up."""
        return self.error is None


WriteBehindListener = Callable[[WriteBehindOutcome], None]


class Write(NamedTuple):
    """One queued transition: which call, what it does (``commit`` or ``settle unknown``), the command."""

    request: BeginRequest
    what: str
    key: bytes
    command: ScriptCommand
    tries: Tries
    seq: int


class Pipe(NamedTuple):
    """Send these commands in one ``pipeline(transaction=False)``: their replies, errors in place."""

    commands: tuple[tuple[Any, ...], ...]


class _Landing:
    """Which writes are queued and not yet landed (or given up), for the whole store: by record key
    (for the reads that must wait) and by sequence number (for flush)."""

    def __init__(self, listeners: list[WriteBehindListener]) -> None:
        self.cond = threading.Condition()
        self.by_key: dict[bytes, int] = {}
        self.unfinished: dict[int, bytes] = {}  # in queueing order
        self.issued = 0
        self.cut = 0  # writes numbered this or lower get the synchronous path's tries only (close)
        self.listeners = listeners  # the store's (kept across a fork)

    def add(self, key: bytes) -> int:
        with self.cond:
            self.issued += 1
            self.unfinished[self.issued] = key
            self.by_key[key] = self.by_key.get(key, 0) + 1
            return self.issued

    def finish(self, write: Write, result: TransitionResult | None, error: BaseException | None) -> None:
        """The write landed (``result``) or was given up (``error``): tell the listeners, then whoever
        waits for it (so that a flush that returned has had every listener called)."""
        if self.listeners and write.seq in self.unfinished:
            outcome = WriteBehindOutcome(write.request, write.what, result, error)
            for listener in tuple(self.listeners):
                try:
                    listener(outcome)
                except Exception:  # a listener's bug must not stop the sender, nor the other listeners
                    log.exception(
                        "airlock_redis: a write-behind listener raised on the %s of tool_call_id=%r "
                        "(ignored)",
                        write.what,
                        write.request.tool_call_id,
                    )
        self.done(write)

    def cut_until(self, mark: int) -> None:
        """Writes numbered ``mark`` or lower are re-sent only as the synchronous path re-sends."""
        with self.cond:
            self.cut = max(self.cut, mark)

    def done(self, write: Write) -> None:
        with self.cond:
            if self.unfinished.pop(write.seq, None) is None:
                return
            left = self.by_key[write.key] - 1
            if left:
                self.by_key[write.key] = left
            else:
                del self.by_key[write.key]
            self.cond.notify_all()

    def wait_key(self, key: bytes, timeout: float | None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: key not in self.by_key, timeout)

    def wait_until(self, mark: int, timeout: float | None) -> bool:
        """Wait until every write numbered ``mark`` or lower is finished."""

        def finished() -> bool:
            oldest = next(iter(self.unfinished), None)
            return oldest is None or oldest > mark

        with self.cond:
            return self.cond.wait_for(finished, timeout)


def _key_of(op: Op) -> bytes | None:
    """The record key an operation touches (None: no record)."""
    if type(op) is Command:
        args = op.args
        if args and args[0] in ("EVALSHA", "EVAL"):
            return args[3] if len(args) > 3 else None
        return args[1] if len(args) > 1 and args[0] == "SET" else None
    if type(op) is Read or type(op) is Waited:
        return op.key
    return None


class WriteBehind:
    """The write-behind senders of one store (see the module docstring)."""

    def __init__(
        self,
        blocking_client: Callable[[], Any],
        async_client: Callable[[], Any],
        blocking_wire: Callable[[], BlockingWire | None] = lambda: None,
    ) -> None:
        self._blocking_client = blocking_client
        # the store's own wire for its blocking client (see .blocking_wire), or None: the blocking
        # sender's batches then go through the client's pipeline
        self._blocking_wire = blocking_wire
        self._async_client = async_client
        self.listeners: list[WriteBehindListener] = []  # see RedisEffectStore.add_write_behind_listener
        self.start_afresh()
        _LIVE.add(self)

    def start_afresh(self) -> None:
        """Empty queues and no sender (at creation, and in the child after a fork: the parent's
        writes are the parent's to send)."""
        self._landing = _Landing(self.listeners)
        self._lock = threading.Lock()
        # held while a blocking sender sends a batch: a sender started after a close that stopped the
        # last one waits until that one's batch is done (a later write of a record never overtakes)
        self._sending = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[Write] = deque()
        self._thread: threading.Thread | None = None
        self._loops: dict[asyncio.AbstractEventLoop, _LoopSender] = {}

    # -- queueing --------------------------------------------------------------------------------
    def queued(self) -> int:
        """How many writes wait to land (all senders of the store)."""
        return len(self._landing.unfinished)

    def _write(
        self, request: BeginRequest, what: str, key: bytes, command: ScriptCommand, tries: Tries
    ) -> Write:
        return Write(request, what, key, command, tries, self._landing.add(key))

    def put(self, request: BeginRequest, what: str, key: bytes, command: ScriptCommand, tries: Tries) -> bool:
        """Queue a write for the blocking sender; False when the queues are full (send it yourself)."""
        if len(self._landing.unfinished) >= QUEUE_LIMIT:
            return False
        write = self._write(request, what, key, command, tries)
        with self._lock:
            self._queue.append(write)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="airlock_redis write-behind", daemon=True
                )
                self._thread.start()
            else:
                self._wake.notify()
        return True

    def aput(
        self, request: BeginRequest, what: str, key: bytes, command: ScriptCommand, tries: Tries
    ) -> bool:
        """Queue a write for the running loop's sender; False when the queues are full."""
        if len(self._landing.unfinished) >= QUEUE_LIMIT:
            return False
        loop = asyncio.get_running_loop()
        sender = self._loops.get(loop)
        if sender is None:
            self._forget_closed_loops()
            sender = self._loops[loop] = _LoopSender(self._async_client, self._landing)
        sender.put(self._write(request, what, key, command, tries))
        return True

    # -- waiting ---------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every write queued before this call has landed or was given up (at most
        ``timeout`` seconds; None: no bound). True when they all have. In a coroutine use
        :meth:`aflush`: this one blocks the loop whose sender it may be waiting for."""
        landing = self._landing
        with landing.cond:
            mark = landing.issued
        return landing.wait_until(mark, timeout)

    async def aflush(self, timeout: float | None = None) -> bool:
        """Coroutine form of :meth:`flush` (the loop keeps running, its own sender included)."""
        landing = self._landing
        with landing.cond:
            mark = landing.issued
            if not landing.unfinished:
                return True
        return await asyncio.to_thread(self._landing.wait_until, mark, timeout)

    def guard_blocking(self, perform: Callable[[Op], Any]) -> Callable[[Op], Any]:
        """``perform`` that first waits for this process's queued writes of the record it touches."""
        by_key = self._by_key

        def waiting(op: Op) -> Any:
            if by_key():
                key = _key_of(op)
                if key is not None and key in by_key():
                    self._landing.wait_key(key, KEY_WAIT_TIMEOUT)
            return perform(op)

        return waiting

    def guard_async(self, perform: Callable[[Op], Awaitable[Any]]) -> Callable[[Op], Awaitable[Any]]:
        """The coroutine form of :meth:`guard_blocking` (waits without blocking the loop)."""
        by_key = self._by_key

        async def waiting(op: Op) -> Any:
            if by_key():
                key = _key_of(op)
                if key is not None and key in by_key():
                    await asyncio.to_thread(self._landing.wait_key, key, KEY_WAIT_TIMEOUT)
            return await perform(op)

        return waiting

    def _by_key(self) -> dict[bytes, int]:
        return self._landing.by_key

    # -- closing ---------------------------------------------------------------------------------
    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Flush, then stop the blocking sender if nothing is queued (a later write starts it again),
        all in at most ``timeout`` seconds. True when every queued write landed or was given up. When
        the flush gives up waiting, the writes queued so far get the synchronous path's tries only
        (not ``RETRY_WINDOW``): one still failing after them is given up and logged."""
        deadline = time.monotonic() + timeout
        landing = self._landing
        with landing.cond:
            mark = landing.issued
        flushed = landing.wait_until(mark, timeout)
        if not flushed:
            landing.cut_until(mark)
        with self._lock:
            thread = self._thread
            if thread is None or self._queue:
                return flushed
            self._thread = None
            self._wake.notify_all()
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
        return flushed

    # -- the blocking sender -----------------------------------------------------------------------
    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while not self._queue and self._thread is me:
                    if not self._wake.wait(IDLE_EXIT) and not self._queue and self._thread is me:
                        self._thread = None  # idle: let an unused store be collected
                        return
                if self._thread is not me:  # closed with nothing queued: a later write starts another
                    return
                short = len(self._queue) < BATCH_LIMIT
            if short and LINGER:
                time.sleep(LINGER)  # let more writes join this batch (see LINGER)
            with self._sending:
                with self._lock:
                    batch = _take(self._queue)
                try:
                    drive(_sending(batch, self._landing), self._perform)
                except Exception as exc:  # never seen: the sender must outlive it, the writes are lost
                    _give_up_all(batch, exc, self._landing)

    def _perform(self, op: Pipe | Pause) -> Any:
        if type(op) is Pause:
            time.sleep(op.seconds)
            return None
        assert type(op) is Pipe
        wire = self._blocking_wire()
        if wire is not None:
            return wire.send(list(op.commands))
        pipe = self._blocking_client().pipeline(transaction=False)
        for args in op.commands:
            pipe.execute_command(*args)
        return pipe.execute(raise_on_error=False)

    def _forget_closed_loops(self) -> None:
        for loop, sender in list(self._loops.items()):
            if loop.is_closed():
                del self._loops[loop]
                sender.abandon()


class _LoopSender:
    """One event loop's write-behind sender: a task that runs while writes are queued."""

    def __init__(self, client: Callable[[], Any], landing: _Landing) -> None:
        self._client = client  # the running loop's client, asked for each batch
        self._landing = landing
        self._queue: deque[Write] = deque()
        self._task: asyncio.Task[None] | None = None

    def put(self, write: Write) -> None:
        self._queue.append(write)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def abandon(self) -> None:
        """The loop closed with writes queued: they can no longer be sent."""
        queued, self._queue = list(self._queue), deque()
        _give_up_all(queued, RuntimeError("its event loop was closed before it was sent"), self._landing)

    async def _run(self) -> None:
        cancelled = False
        deadline = None
        try:
            while self._queue:
                if deadline is not None and time.monotonic() > deadline:
                    self.abandon()
                    break
                batch = _take(self._queue)
                while batch:
                    try:
                        # once the loop shuts down, re-sends stop at the deadline (not RETRY_WINDOW)
                        await adrive(_sending(batch, self._landing, deadline), self._perform)
                        break
                    except asyncio.CancelledError:
                        # the loop is shutting down (asyncio.run cancels every task): the batch may
                        # have landed or not; it is safe to send again (what is not finished of it),
                        # and so is the rest of the queue
                        cancelled = True
                        batch = [write for write in batch if write.seq in self._landing.unfinished]
                        if deadline is None:
                            deadline = time.monotonic() + CLOSE_TIMEOUT
                        if time.monotonic() > deadline:
                            _give_up_all(batch, TimeoutError("the loop shut down"), self._landing)
                            break
                    except Exception as exc:  # never seen: the writes are lost, the sender goes on
                        _give_up_all(batch, exc, self._landing)
                        break
        finally:
            self._task = None
        if cancelled:
            raise asyncio.CancelledError

    async def _perform(self, op: Pipe | Pause) -> Any:
        if type(op) is Pause:
            await asyncio.sleep(op.seconds)
            return None
        assert type(op) is Pipe
        pipe = self._client().pipeline(transaction=False)
        for args in op.commands:
            pipe.execute_command(*args)
        return await pipe.execute(raise_on_error=False)


def _take(queue: deque[Write]) -> list[Write]:
    """The next batch: queued writes in order, at most BATCH_LIMIT, no record twice."""
    batch: list[Write] = []
    keys: set[bytes] = set()
    while queue and len(batch) < BATCH_LIMIT and queue[0].key not in keys:
        write = queue.popleft()
        keys.add(write.key)
        batch.append(write)
    return batch


def _sending(batch: list[Write], landing: _Landing, until: float | None = None) -> Plan[None]:
    """Send a batch until every write landed or was given up, re-sending as :func:`_resend_after`
    allows (its writes were first sent together, now: ``RETRY_WINDOW`` counts from here, or ends at
    ``until`` when that comes first)."""
    window = time.monotonic() + RETRY_WINDOW
    if until is not None:
        window = min(window, until)
    todo = batch
    rounds = 0  # round trips that failed, for the backoff
    while todo:
        failed: list[tuple[Write, BaseException]] = []
        try:
            replies = yield Pipe(tuple(write.command.next_try() for write in todo))
            if len(replies) != len(todo):  # never seen; no reply may go to the wrong write
                raise redis.ConnectionError(f"the pipeline answered {len(replies)} replies for {len(todo)}")
        except SEND_FAILURES as exc:  # the round trip failed: every write's failure
            failed, todo = [(write, exc) for write in todo], []
        else:
            todo_next: list[Write] = []
            for write, reply in zip(todo, replies, strict=True):
                if isinstance(reply, NoScriptError):  # the cache was emptied: next_try sends the source
                    todo_next.append(write)
                elif isinstance(reply, Exception):  # an error reply (or a Cluster client's error)
                    failed.append((write, reply))
                else:
                    _landed(write, reply, landing)
            todo = todo_next
        if not failed:
            continue
        rounds += 1
        pause = 0.0
        for write, error in failed:
            wait = _resend_after(write, error, window, rounds, landing)
            if wait is None:
                _given_up(write, error, landing)
            else:
                todo.append(write)
                pause = max(pause, wait)
        if todo and pause:
            yield Pause(pause)


def _resend_after(
    write: Write, error: BaseException, window: float, rounds: int, landing: _Landing
) -> float | None:
    """The pause before ``write`` is sent again after ``error``, or None: give it up. First the
    synchronous path's tries (:mod:`.tries`); then, for an error of ``RESEND``, capped exponential
    backoff with full jitter until ``window`` (a monotonic time) has passed, unless ``close`` gave up
    waiting for the write meanwhile (then its tries alone, as before the window existed)."""
    pause = write.tries.failed(error)
    if pause is not None or not isinstance(error, RESEND) or write.seq <= landing.cut:
        return pause
    if time.monotonic() >= window:
        return None
    return backoff(rounds, RETRY_BACKOFF)


def _landed(write: Write, reply: Any, landing: _Landing) -> None:
    try:
        result = parse_transition(reply)
    except StoreError as exc:
        _given_up(write, exc, landing)
        return
    request = write.request
    if result is TransitionResult.RECREATED:
        log.warning(
            "airlock_redis: %s tool_call_id=%r ran past its record's pending TTL; the record was written "
            "again by its write-behind %s",
            request.tool,
            request.tool_call_id,
            write.what,
        )
    elif result is not TransitionResult.OK:
        log.warning(
            "airlock_redis: the write-behind %s of %s tool_call_id=%r was %s (the record was resolved or "
            "taken over)",
            write.what,
            request.tool,
            request.tool_call_id,
            result.value,
        )
    landing.finish(write, result, None)


def _given_up(write: Write, error: BaseException, landing: _Landing) -> None:
    request = write.request
    log.error(
        "airlock_redis: %s ran under tool_call_id=%r and its caller has its value, but the write-behind "
        "%s failed (%s: %s); the record stays pending: retries will be refused as in doubt, never run",
        request.tool,
        request.tool_call_id,
        write.what,
        type(error).__name__,
        error,
    )
    landing.finish(write, None, error)


def _give_up_all(writes: list[Write], error: BaseException, landing: _Landing) -> None:
    for write in writes:
        _given_up(write, error, landing)


# -- every store's senders: interpreter exit and fork ---------------------------------------------
_LIVE: weakref.WeakSet[WriteBehind] = weakref.WeakSet()


def _flush_at_exit() -> None:
    for behind in list(_LIVE):
        if behind.queued() and not behind.flush(EXIT_TIMEOUT):
            log.error(
                "airlock_redis: %d write-behind writes had not landed after %.0f s at interpreter exit; "
                "their records stay pending (retries are refused, never run)",
                behind.queued(),
                EXIT_TIMEOUT,
            )


def _after_fork_in_child() -> None:
    for behind in list(_LIVE):
        behind.start_afresh()


atexit.register(_flush_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
