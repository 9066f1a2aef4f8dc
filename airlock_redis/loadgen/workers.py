"""Worker processes that drive guarded calls against one Redis, and the run that gathers them.

Each of N processes (started with ``spawn``) makes C lanes of guarded calls, each lane one call after
another. In the ``threads`` mode (the default) a lane is a thread making blocking calls: the sync
driver is what most agent hosts run, and a thread pool is how they get concurrency from it. In the
``asyncio`` mode the process runs one event loop and a lane is a coroutine awaiting an ``async def``
tool: concurrent calls on that loop share their round trips to Redis when the store auto-pipelines
(``auto_pipeline``, on by default; blocking calls are always sent one by one). Both modes make their
calls through one :class:`_Lane` (what to call next, and the tally of what the call did): they differ
only in whether the tool is called or awaited.

A share ``duplicate_rate`` of the calls re-use the tool_call_id (with the same tool and arguments) of
an earlier call of any process: those are the retries. The tool bodies count their real executions by
tool_call_id in the process; the run merges the counts, so a call that ran twice shows up whichever
processes ran it.

The URL is any URL ``RedisEffectStore`` takes (``redis://``, ``rediss://``, ``unix://``,
``redis+cluster://`` with one seed node or several, ``rediss+cluster://``, ``redis+sentinel://``);
its scheme decides the topology, and the run's own bookkeeping (memory sampling, clean-up) goes
through the same URL handling (:mod:`airlock_redis.stores.url`). On a Cluster the run also reports
how the load spread over the primaries: each lane counts its calls by the slot of their record,
and the slot map read at the end of the run assigns the slots to primaries (a failover during the
run moves slots after the fact).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import logging
import multiprocessing
import random
import secrets
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from ..context import current_call_context, tool_call_context
from ..core.errors import EffectRefused
from ..core.reversibility import ReversibilityName, reversibility
from ..redaction import redact
from ..stores.keys import record_key
from ..stores.url import CONNECT_ERRORS, parse_url, primary_clients, slot_primaries, sync_client
from .interrupts import sigint_deferred
from .server_cpu import ServerCpu, per_call, snapshot
from .stats import MODES, TIMELINE_STEP, BenchSummary, PrimaryLoad, WorkerReport

if TYPE_CHECKING:
    from ..guard import EffectGuard
    from ..stores.redis_store import RedisEffectStore

# (tool, weight, reversibility): mixed tools, most of them not reversible
TOOLS: tuple[tuple[str, int, ReversibilityName], ...] = (
    ("charge", 5, "irreversible"),
    ("send_email", 3, "costly"),
    ("read_balance", 2, "reversible"),
)
_WEIGHTED = [name for name, weight, _ in TOOLS for _ in range(weight)]
REVERSIBLE_TOOLS = frozenset(name for name, _, tag in TOOLS if tag == "reversible")
# set by a lane around each call: the tool body marks it, so a call that returned tells an execution
# from a replay (a holder in a context variable: each thread and each coroutine's task has its own)
_EXECUTED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "airlock_bench_executed", default=None
)


@dataclass(frozen=True)
class BenchConfig:
    url: str
    cluster: bool = False  # informational: the URL's scheme decides the topology (kept for old callers)
    processes: int = 2
    concurrency: int = 8  # lanes per process: threads, or coroutines on the process's event loop
    duration: float | None = 6.0  # seconds; None when ``calls`` bounds the run
    calls: int | None = None  # total guarded calls over all lanes
    duplicate_rate: float = 0.1
    value_bytes: int = 256
    namespace: str = "airlock:bench"
    run_id: str = ""
    mode: str = "threads"  # "threads": blocking calls; "asyncio": coroutines on one event loop
    auto_pipeline: bool = True  # asyncio: RedisEffectStore(auto_pipeline=); threads: must stay True

    def __post_init__(self) -> None:
        if self.processes < 1 or self.concurrency < 1:
            raise ValueError("processes and concurrency must be at least 1")
        if (self.duration is None) == (self.calls is None):
            raise ValueError("give exactly one of duration and calls")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration must be positive")
        if self.calls is not None and self.calls < 1:
            raise ValueError("calls must be at least 1")
        if not 0.0 <= self.duplicate_rate < 1.0:
            raise ValueError("duplicate_rate must be in [0, 1)")
        if self.value_bytes < 0:
            raise ValueError("value_bytes must be >= 0")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.mode == "threads" and not self.auto_pipeline:
            raise ValueError(
                "auto-pipelining applies to the asyncio mode only: blocking calls are always sent one by one"
            )

    def shown(self) -> dict[str, Any]:
        """The configuration as the report shows it: the URL redacted, and ``auto_pipeline`` None
        (not applicable) in the threads mode."""
        shown = asdict(self)
        shown["url"] = redact(self.url)
        if self.mode == "threads":
            shown["auto_pipeline"] = None
        return shown


def call_for(process: int, seq: int) -> tuple[str, dict[str, Any]]:
    """The tool and arguments of call ``seq`` of ``process``: any process can rebuild a retry."""
    rng = random.Random(process * 1_000_003 + seq)
    tool = rng.choice(_WEIGHTED)
    account = f"acct_{rng.randrange(1000)}"
    if tool == "charge":
        return tool, {"account": account, "cents": rng.randrange(1, 100_000)}
    if tool == "send_email":
        return tool, {"to": f"user{rng.randrange(1000)}@example.com", "subject": f"order {seq}"}
    return tool, {"account": account}


def tool_of(tool_call_id: str) -> str:
    """The tool of a bench tool_call_id (``<run>-<process>-<seq>``)."""
    _, process, seq = tool_call_id.rsplit("-", 2)
    return call_for(int(process), int(seq))[0]


def _awaitable(body: Callable[..., Any]) -> Callable[..., Any]:
    """``body`` as an ``async def`` tool with its signature and annotations (it returns at once)."""

    @functools.wraps(body)
    async def tool(*args: Any, **kwargs: Any) -> Any:
        return body(*args, **kwargs)

    return tool


def _tools(
    guard: EffectGuard,
    value_bytes: int,
    runs: dict[str, int],
    lock: threading.Lock,
    *,
    asynchronous: bool = False,
) -> dict[str, Callable[..., Any]]:
    """The guarded tools by name: blocking, or (``asynchronous``) ``async def`` with the same bodies."""
    payload = "x" * value_bytes

    def ran() -> str:
        host = current_call_context()
        tool_call_id = str(host.tool_call_id) if host is not None else ""
        with lock:
            runs[tool_call_id] = runs.get(tool_call_id, 0) + 1
        executed = _EXECUTED.get()
        if executed is not None:
            executed[0] = True
        return tool_call_id

    def charge(account: str, cents: int) -> dict[str, Any]:
        return {"receipt": ran(), "account": account, "cents": cents, "payload": payload}

    def send_email(to: str, subject: str) -> dict[str, Any]:
        return {"message_id": ran(), "to": to, "payload": payload}

    def read_balance(account: str) -> dict[str, Any]:
        return {"account": account, "balance": 4200, "read": ran(), "payload": payload}

    bodies: dict[str, Callable[..., Any]] = {
        "charge": charge,
        "send_email": send_email,
        "read_balance": read_balance,
    }
    tools: dict[str, Callable[..., Any]] = {}
    for name, _, tag in TOOLS:  # an untagged tool is irreversible: the tag changes nothing for charge
        body = _awaitable(bodies[name]) if asynchronous else bodies[name]
        tools[name] = reversibility(tag)(guard.wrap(body, name=name))
    return tools


@dataclass(frozen=True)
class _Call:
    tool: str
    kwargs: dict[str, Any]
    tool_call_id: str


class _Load:
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

    def __init__(self, load: _Load, lane: int) -> None:
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
        if load.issued > 0 and self.rng.random() < config.duplicate_rate:
            owner = self.rng.randrange(config.processes)  # a retry, maybe of another process's call
            seq = self.rng.randrange(load.issued)
        else:
            seq = next(load.seqs)
            load.issued = max(load.issued, seq + 1)
        tool, kwargs = call_for(owner, seq)
        return _Call(tool, kwargs, f"{config.run_id}-{owner}-{seq}")

    @contextlib.contextmanager
    def measured(self, call: _Call) -> Iterator[Callable[..., Any]]:
        """Around one call of ``call.tool`` (the tool is what it yields): its tool_call_id set, its
        latency recorded, and whether it ran, replayed, was refused or failed counted."""
        mine = self.report
        mine.ids.add(call.tool_call_id)
        if self.load.count_slots:
            mine.slots[key_slot(record_key(self.load.config.namespace, call.tool_call_id))] += 1
        executed = [False]
        token = _EXECUTED.set(executed)
        started = time.perf_counter()
        try:
            with tool_call_context(call.tool_call_id):
                yield self.load.tools[call.tool]
        except EffectRefused as refused:
            mine.refusals[refused.reason] += 1
        except Exception as error:
            mine.errors[type(error).__name__] += 1
        else:
            if executed[0]:
                mine.executed += 1
            else:
                mine.replayed += 1
        finally:
            _EXECUTED.reset(token)
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


def _run_threads(load: _Load) -> list[WorkerReport]:
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


async def _run_coroutines(load: _Load, store: RedisEffectStore) -> list[WorkerReport]:
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


def _worker(
    config: BenchConfig,
    process: int,
    barrier: Any,
    progress: Any,
    results: Any,
    *,
    stop: Any = None,
) -> None:
    """One load process: C lanes making guarded calls; puts one merged WorkerReport on ``results``."""
    report = WorkerReport()
    try:
        from ..guard import EffectGuard
        from ..stores.redis_store import RedisEffectStore

        # retries of reversible calls supersede each other by design; keep their warnings off the bar
        logging.getLogger("airlock_redis").setLevel(logging.ERROR)
        asynchronous = config.mode == "asyncio"
        store = RedisEffectStore(config.url, namespace=config.namespace, auto_pipeline=config.auto_pipeline)
        runs: dict[str, int] = {}
        tools = _tools(
            EffectGuard(store=store), config.value_bytes, runs, threading.Lock(), asynchronous=asynchronous
        )
        load = _Load(config, process, tools, progress, stop)
        barrier.wait(timeout=120)
        load.start()
        parts = asyncio.run(_run_coroutines(load, store)) if asynchronous else _run_threads(load)
        for part in parts:
            report.merge(part)
        report.runs.update(runs)
        store.close()
    except Exception:
        report.failure = f"process {process}: {traceback.format_exc()}"
        with contextlib.suppress(Exception):
            barrier.abort()
    results.put(report)


def run_pattern(config: BenchConfig) -> str:
    """A SCAN pattern for the records of this run only (tool_call_ids ``<run_id>-<process>-<seq>``):
    another run on the same namespace is neither counted nor removed."""
    from ..stores.keys import record_pattern

    return record_pattern(config.namespace)[:-1] + f"{config.run_id}-*"


def _sample_memory(node: Any, pattern: str, sample: int = 200) -> tuple[float | None, int, int]:
    """On one server (a primary of a Cluster, or the only one): (mean MEMORY USAGE ... SAMPLES 0 of up
    to ``sample`` of the records ``pattern`` matches, how many were sampled, records counted)."""
    sizes: list[int] = []
    records = 0
    for key in node.scan_iter(match=pattern, count=1000):
        records += 1
        if len(sizes) < sample:
            usage = node.memory_usage(key, samples=0)
            if usage is not None:
                sizes.append(int(usage))
    return (sum(sizes) / len(sizes) if sizes else None), len(sizes), records


def _clean(node: Any, pattern: str) -> None:
    """Unlink the run's records on one server: one key per command (the keys a Cluster primary holds
    live in many slots), sent in pipelined batches."""
    batch: list[Any] = []
    for key in node.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            _unlink(node, batch)
            batch.clear()
    _unlink(node, batch)


def _unlink(node: Any, keys: list[Any]) -> None:
    if keys:
        with node.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.unlink(key)
            pipe.execute()


def _server_cpu(config: BenchConfig) -> ServerCpu:
    """The primaries' CPU counters now (see :mod:`.server_cpu`)."""
    client = sync_client(config.url, socket_timeout=30.0, socket_connect_timeout=10.0)
    try:
        return snapshot(node for _, node in primary_clients(client))
    finally:
        client.close()


def _measure(config: BenchConfig, merged: WorkerReport) -> tuple[float | None, int, int, list[PrimaryLoad]]:
    """Memory per record and records over the whole deployment, and (on a Cluster) per primary; then
    remove the run's keys from every primary."""
    client = sync_client(config.url, socket_timeout=30.0, socket_connect_timeout=10.0)
    try:
        nodes = primary_clients(client)
        owners = slot_primaries(client) if merged.slots else {}
        calls: dict[str, int] = {}
        for slot, count in merged.slots.items():
            owner = owners.get(slot, "slot not served")
            calls[owner] = calls.get(owner, 0) + count
        loads: list[PrimaryLoad] = []
        pattern = run_pattern(config)
        for name, node in nodes:
            memory, sampled, records = _sample_memory(node, pattern)
            loads.append(PrimaryLoad(name, calls.pop(name, 0), records, memory, sampled))
            _clean(node, pattern)
        for name, count in sorted(calls.items()):  # slots whose primary the final map does not name
            loads.append(PrimaryLoad(name, count, 0, None, 0))
    finally:
        client.close()
    sampled_total = sum(load.memory_sampled_records for load in loads)
    memory_total = sum((load.memory_per_record_bytes or 0.0) * load.memory_sampled_records for load in loads)
    mean = memory_total / sampled_total if sampled_total else None
    records_total = sum(load.records for load in loads)
    return mean, sampled_total, records_total, (loads if merged.slots else [])


def _interrupted(config: BenchConfig, processes: list[Any], barrier: Any, stop: Any, results: Any) -> None:
    """Ctrl-C: stop the workers (their calls in flight finish), then remove every record of the run,
    as the end of a run does: none is left to wait for its TTL."""
    if stop is not None:
        stop.set()
    with contextlib.suppress(Exception):
        barrier.abort()  # workers still waiting at the barrier go on to their (empty) report
    deadline = time.monotonic() + 30
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # drain: a worker exits once its report is read
            results.get(timeout=0.1)
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
        proc.join(timeout=5)
    remove_run(config)


def remove_run(config: BenchConfig) -> None:
    """Unlink every record of this run on every primary (a run's keys live in many slots)."""
    client = sync_client(config.url, socket_timeout=30.0, socket_connect_timeout=10.0)
    try:
        pattern = run_pattern(config)
        for _, node in primary_clients(client):
            _clean(node, pattern)
    finally:
        client.close()


def run_bench(  # noqa: PLR0915
    config: BenchConfig,
    target: str,
    on_progress: Callable[[float, str], None] | None = None,
) -> BenchSummary:
    """Start the worker processes, wait for them (reporting progress), and gather the figures."""
    if not config.run_id:
        config = BenchConfig(**{**asdict(config), "run_id": secrets.token_hex(4)})
    context = multiprocessing.get_context("spawn")
    reports: list[WorkerReport] = []
    processes: list[Any] = []
    barrier: Any = None
    results: Any = None
    stop: Any = None
    try:
        with sigint_deferred():  # the workers never see SIGINT: a Ctrl-C is this process's to handle
            barrier = context.Barrier(config.processes + 1)
            progress = context.Value("q", 0)
            results = context.Queue()
            stop = context.Event()
            processes = [
                context.Process(
                    target=_worker,
                    args=(config, p, barrier, progress, results),
                    kwargs={"stop": stop},
                    daemon=True,
                )
                for p in range(config.processes)
            ]
            for proc in processes:
                proc.start()
        cpu_before = _server_cpu(config)  # the workers wait at the barrier: none of their calls counted
        with contextlib.suppress(Exception):  # a worker failed to start: its report says why
            barrier.wait(timeout=120)
        started = time.monotonic()
        while len(reports) < config.processes:
            try:
                reports.append(results.get(timeout=0.1))
            except Exception:
                if not any(p.is_alive() for p in processes) and results.empty():
                    break
            if on_progress is not None:
                done = int(progress.value)
                elapsed = time.monotonic() - started
                if config.calls is not None:
                    fraction = done / config.calls
                else:
                    assert config.duration is not None
                    fraction = elapsed / config.duration
                on_progress(fraction, f"{done} calls  {elapsed:.1f} s")
        elapsed = time.monotonic() - started
    except KeyboardInterrupt:
        _interrupted(config, processes, barrier, stop, results)
        raise
    finally:
        for proc in processes:
            if proc.is_alive():  # already stopped if the run was interrupted
                proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    merged = WorkerReport()
    for part in reports:
        merged.merge(part)
    if len(reports) < config.processes and not merged.failure:
        merged.failure = f"{config.processes - len(reports)} worker process(es) died without a report"
    if merged.failure:
        raise RuntimeError(f"the benchmark could not run: {merged.failure}")
    if merged.timeline:
        span = (max(merged.timeline) - min(merged.timeline) + 1) * TIMELINE_STEP
        elapsed = min(elapsed, span) if span > 0 else elapsed
    try:
        server_us, server_cpu_us = per_call(_server_cpu(config) - cpu_before, merged.calls)
        memory, sampled, records, primaries = _measure(config, merged)
    except CONNECT_ERRORS as exc:
        raise RuntimeError(
            f"the run finished, but its records could not be measured: {type(exc).__name__}: {exc}"
        ) from exc
    reversible = {i for i in merged.ids if tool_of(i) in REVERSIBLE_TOOLS}
    return BenchSummary(
        config=config.shown(),
        target=target,
        elapsed_s=elapsed,
        report=merged,
        reversible_ids=reversible,
        memory_per_record_bytes=memory,
        memory_sampled_records=sampled,
        records=records,
        primaries=primaries,
        server_us_per_call=server_us,
        server_cpu_us_per_call=server_cpu_us,
    )
