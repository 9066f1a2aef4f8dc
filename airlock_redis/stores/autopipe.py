"""Auto-pipelining for one event loop's asyncio client: the commands that concurrent calls issue while
an earlier command is on its way go to Redis together, in one round trip. On the asyncio client the
store builds itself they are written by :mod:`.exchange` on one pooled connection; on a client passed
in (which may re-send by its own retry policy) or a Cluster, through redis-py's public
``pipeline(transaction=False)`` (on Cluster its pipeline groups them by the node that owns each slot).

How a command travels:

- nothing is on its way (always so for one call at a time): the command is sent at once, on its own,
  so a lone call pays nothing for it;
- otherwise it waits in the queue, and a sender (a task of the pipeline's own, at most ``LANES`` sends
  on their way at once) takes everything queued (at most ``BATCH_LIMIT`` commands) in the next turn
  of the loop: the commands of one turn leave together. When a batch is answered, its callers run in
  the next turn and most send their next command at once, so the sender waits that turn before it
  looks at the queue again: their commands leave together too, rather than the first one alone.
  A caller that is cancelled while it waits cancels neither the batch nor anybody else's command.

Each call still gets its own reply and its own error: an error reply fails only the command it
answers (the batch's replies come back with the errors in place), while a failure of the round trip
itself (a dropped connection, a timeout) is every command's failure, as it would have been for each
sent alone, and each caller's plan decides what that means (see :mod:`.tries`). A command whose
caller was cancelled before its batch left is not sent at all. A command still queued when the
pipeline's sender is cancelled (the loop shuts down) fails with :class:`NotSent`, which says it never
left (so its caller knows it cannot have landed).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import redis

from .exchange import exchange_for

# At most this many commands in one pipeline. A batch's replies come back together, so a bigger batch
# holds its first callers longer; past about a hundred the round trips saved no longer pay for that
# (measured with benchmarks/bench_async.py, see docs/performance.md "Auto-pipelining").
BATCH_LIMIT = 128
# At most this many sends on their way at once (single commands or batches), each on a pooled
# connection of the client: one keeps the client's CPU and the server's busy in turn; a second lets
# the next batch be packed while the first is on the wire. Measured again with the exchange
# (2026-12-05, 64 concurrent calls): 2 lanes about 15,000 calls/s, 4 and 8 lanes 12,000-13,500.
LANES = 2

_Waiting = tuple[tuple[Any, ...], "asyncio.Future[Any]"]


class NotSent(redis.ConnectionError):
    """The command never left: the auto-pipeline's sender stopped (its loop shut down) first."""


class AutoPipeline:
    """Sends the commands of one asyncio client, batching those that queue up behind a send."""

    __slots__ = ("_client", "_lanes", "_limit", "_queue", "_senders", "_sending", "_wire")

    def __init__(
        self, client: Any, *, limit: int = BATCH_LIMIT, lanes: int = LANES, direct: bool = True
    ) -> None:
        if limit < 1 or lanes < 1:
            raise ValueError("an auto-pipeline needs limit >= 1 and lanes >= 1")
        self._client = client
        self._limit = limit
        self._lanes = lanes
        self._queue: list[_Waiting] = []
        self._sending = 0
        self._senders: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references
        self._wire = exchange_for(client, keep=lanes) if direct else None

    @property
    def queued(self) -> int:
        """How many commands wait for a sender (none while nothing is on its way)."""
        return len(self._queue)

    async def execute(self, args: tuple[Any, ...]) -> Any:
        """The reply to ``args`` (an error reply raised), sent alone or in a batch."""
        if not self._sending and not self._queue:
            self._sending += 1
            try:
                (reply,) = await self._round_trip([args])
            finally:
                self._sending -= 1
                self._start_sender()
            if isinstance(reply, Exception):
                raise reply
            return reply
        waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((args, waiting))
        self._start_sender()
        return await waiting

    async def aclose(self) -> None:
        """Give back the connections kept between sends (see :mod:`.exchange`)."""
        if self._wire is not None:
            await self._wire.aclose()

    def _start_sender(self) -> None:
        if self._queue and self._sending < self._lanes:
            self._sending += 1
            sender = asyncio.get_running_loop().create_task(self._send_queued())
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)

    async def _send_queued(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self._limit]
                del self._queue[: self._limit]
                await self._send([(args, waiting) for args, waiting in batch if not waiting.done()])
                if not self._queue:
                    # the callers this batch answered run in the next turn of the loop, and most send
                    # their next command at once: wait for that turn, so those leave together too
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            self._fail_queued()
            raise
        finally:
            self._sending -= 1

    async def _send(self, batch: list[_Waiting]) -> None:
        if not batch:
            return
        try:
            replies = await self._round_trip([args for args, _ in batch])
            if len(replies) != len(batch):  # never seen; no reply may go to the wrong caller
                raise redis.ConnectionError(
                    f"the pipeline answered {len(replies)} replies for {len(batch)} commands"
                )
        except asyncio.CancelledError:  # the loop shuts down: the batch may have landed
            interrupted = redis.ConnectionError("the batch was interrupted on its way: it may have landed")
            for _, waiting in batch:
                _settle(waiting, None, _own_copy(interrupted))
            raise
        except Exception as exc:  # the round trip failed (or redis-py did): every command's failure
            for _, waiting in batch:
                _settle(waiting, None, _own_copy(exc))
            return
        for (_, waiting), reply in zip(batch, replies, strict=True):
            _settle(waiting, reply, reply if isinstance(reply, Exception) else None)

    async def _round_trip(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The replies to ``commands`` in one round trip, each error reply in its command's place:
        written by :mod:`.exchange`, or through redis-py (one command alone, several as a pipeline)."""
        if self._wire is not None:
            return await self._wire.send(commands)
        if len(commands) == 1:
            try:
                return [await self._client.execute_command(*commands[0])]
            except redis.ResponseError as exc:  # an error reply: this command's own
                return [exc]
        pipe = self._client.pipeline(transaction=False)
        for args in commands:
            pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    def _fail_queued(self) -> None:
        queued, self._queue = self._queue, []
        for _, waiting in queued:
            _settle(waiting, None, NotSent("the auto-pipeline stopped before the command was sent"))


def _settle(waiting: asyncio.Future[Any], reply: Any, error: BaseException | None) -> None:
    if waiting.done():  # its caller was cancelled meanwhile
        return
    if error is None:
        waiting.set_result(reply)
    else:
        waiting.set_exception(error)


def _own_copy(error: BaseException) -> BaseException:
    """Each caller raises an exception object of its own (a traceback is written into it)."""
    try:
        return copy.copy(error)
    except Exception:
        return error
