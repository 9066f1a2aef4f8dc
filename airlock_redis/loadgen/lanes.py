"""The lanes of one worker process: each lane makes guarded calls one after another.

In the ``threads`` mode (the default) a lane is a thread making blocking calls: the sync driver is
what most agent hosts run, and a thread pool is how they get concurrency from it. In the ``asyncio``
mode the process runs one event loop and a lane is a coroutine awaiting an ``async def`` tool:
concurrent calls on that loop share their round trips to Redis when the store auto-pipelines
(``auto_pipeline``, on by default; blocking calls are always sent one by one). Both modes make their
calls through one :class:`_Lane` (what to call next, and the tally of what the call did): they differ
only in whether the tool is called or awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from ..context import tool_call_context
from ..core.errors import EffectRefused
from ..stores.keys import record_key
from ..stores.url import parse_url
from .stats import TIMELINE_STEP, WorkerReport
from .workload import EXECUTED, WAITED, BenchConfig, call_for

if TYPE_CHECKING:
    from ..stores.redis_store import RedisEffectStore


@dataclass(frozen=True)
class _Call:
    tool: str
    kwargs: dict[str, Any]
    tool_call_id: str
    duplicate: bool = False  # a retry of an earlier call's tool_call_id


class Load:
    """What the lanes of one process share: the tools, the call numbers handed out so far, when to
    stop, and the progress counter of the run."""

    def __init__(
        self,
        config: BenchConfig,
        process: int,
        tools: dict[str, Callable[..., Any]],
        progress: Any,
        stop: Any,
    ) -> None:
        self.config = config
        self.process = process
        self.tools = tools
        self.progress = progress
        self.stop = stop
        self.count_slots = parse_url(config.url).kind == "cluster"
        self.seqs = itertools.count()
        self.issued = 0  # call numbers handed out so far in this process (about the same in the others)
        self.deadline: float | None = None
        self.share: list[int] | None = None
        if config.calls is not None:
            total_lanes = config.processes * config.concurrency
            index = process * config.concurrency
            self.share = [
                config.calls // total_lanes + (1 if index + lane < config.calls % total_lanes else 0)
                for lane in range(config.concurrency)
            ]

    def start(self) -> None:
        """The run starts now (every process has passed the barrier)."""
        if self.config.duration is not None:
            self.deadline = time.monotonic() + self.config.duration

    def lanes(self) -> list[_Lane]:
        return [_Lane(self, lane) for lane in range(self.config.concurrency)]


class _Lane:
    """One thread's (threads mode) or one coroutine's (asyncio mode) calls, one after another:
    :meth:`next_call` says what to call, and :meth:`measured` times the call and tallies what it did.
    The two modes share every step but the call itself (blocking, or awaited)."""

    def __init__(self, load: Load, lane: int) -> None:
        self.load = load
        self.report = WorkerReport()
        self.rng = random.Random(f"{load.config.run_id}:{load.process}:{lane}")
        self.quota = load.share[lane] if load.share is not None else None
        self.pending_progress = 0

    def next_call(self) -> _Call | None:
        """The next call to make, or None when the lane is done (its quota made, the duration over,
        or the run interrupted)."""
        load, config = self.load, self.load.config
        if self.quota is not None and self.report.calls >= self.quota:
            return None
        if load.deadline is not None and time.monotonic() >= load.deadline:
            return None
        if load.stop is not None and load.stop.is_set():  # the run was interrupted (Ctrl-C)
            return None
        owner = load.process
        duplicate = load.issued > 0 and self.rng.random() < config.duplicate_rate
        if duplicate:
            owner = self.rng.randrange(config.processes)  # a retry, maybe of another process's call
            seq = self.rng.randrange(load.issued)
        else:
            seq = next(load.seqs)
            load.issued = max(load.issued, seq + 1)
        tool, kwargs = call_for(owner, seq)
        return _Call(tool, kwargs, f"{config.run_id}-{owner}-{seq}", duplicate)

    @contextlib.contextmanager
    def measured(self, call: _Call) -> Iterator[Callable[..., Any]]:
        """Around one call of ``call.tool`` (the tool is what it yields): its tool_call_id set, its
        latency recorded, and whether it ran, replayed, was refused or failed counted (and, for a
        call that waited for a running attempt of its id, what it got)."""
        mine = self.report
        mine.ids.add(call.tool_call_id)
        mine.duplicates += call.duplicate
        if self.load.count_slots:
            mine.slots[key_slot(record_key(self.load.config.namespace, call.tool_call_id))] += 1
        executed, waited = [False], [False]
        token, waited_token = EXECUTED.set(executed), WAITED.set(waited)
        started = time.perf_counter()
        try:
            with tool_call_context(call.tool_call_id):
                yield self.load.tools[call.tool]
        except EffectRefused as refused:
            mine.refusals[refused.reason] += 1
            outcome = f"refused:{refused.reason}"
        except Exception as error:
            mine.errors[type(error).__name__] += 1
            outcome = f"error:{type(error).__name__}"
        else:
            if executed[0]:
                mine.executed += 1
                outcome = "executed"
            else:
                mine.replayed += 1
                outcome = "replayed"
        finally:
            EXECUTED.reset(token)
            WAITED.reset(waited_token)
        if waited[0]:
            mine.waits[outcome] += 1
        finished = time.perf_counter()
        mine.calls += 1
        mine.histogram.record(finished - started)
        mine.timeline[int(time.time() / TIMELINE_STEP)] += 1
        self.pending_progress += 1
        if self.pending_progress >= 8:
            self.flush()

    def flush(self) -> None:
        """Add the calls made since the last flush to the run's progress counter."""
        with self.load.progress.get_lock():
            self.load.progress.value += self.pending_progress
        self.pending_progress = 0


def run_threads(load: Load) -> list[WorkerReport]:
    """The threads mode: one thread per lane, each making blocking calls."""

    def drive(lane: _Lane) -> None:
        while (call := lane.next_call()) is not None:
            with lane.measured(call) as tool:
                tool(**call.kwargs)
        lane.flush()

    lanes = load.lanes()
    threads = [threading.Thread(target=drive, args=(lane,), daemon=True) for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [lane.report for lane in lanes]


async def run_coroutines(load: Load, store: RedisEffectStore) -> list[WorkerReport]:
    """The asyncio mode: one coroutine per lane on this process's event loop, each awaiting its calls."""

    async def drive(lane: _Lane) -> None:
        while (call := lane.next_call()) is not None:
            with lane.measured(call) as tool:
                await tool(**call.kwargs)
        lane.flush()

    lanes = load.lanes()
    try:
        await asyncio.gather(*(drive(lane) for lane in lanes))
    finally:
        await store.aclose()
    return [lane.report for lane in lanes]
