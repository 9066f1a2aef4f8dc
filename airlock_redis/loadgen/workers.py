"""Worker processes that drive guarded calls against one Redis, and the run that gathers them.

Each of N processes (started with ``spawn``) runs C threads; each thread makes blocking guarded
calls one after another. Threads rather than asyncio: the sync driver is what most agent hosts
run, and a thread pool is how they get concurrency from it. A share ``duplicate_rate`` of the
calls re-use the tool_call_id (with the same tool and arguments) of an earlier call of any
process: those are the retries. The tool bodies count their real executions by tool_call_id in
the process; the run merges the counts, so a call that ran twice shows up whichever processes
ran it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import random
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..redaction import redact
from .stats import TIMELINE_STEP, BenchSummary, WorkerReport

if TYPE_CHECKING:
    from ..guard import EffectGuard

CLUSTER_SCHEME = "redis+cluster://"
# (tool, weight, reversibility): mixed tools, most of them not reversible
TOOLS: tuple[tuple[str, int, str], ...] = (
    ("charge", 5, "irreversible"),
    ("send_email", 3, "costly"),
    ("read_balance", 2, "reversible"),
)
_WEIGHTED = [name for name, weight, _ in TOOLS for _ in range(weight)]
REVERSIBLE_TOOLS = frozenset(name for name, _, tag in TOOLS if tag == "reversible")


@dataclass(frozen=True)
class BenchConfig:
    url: str
    cluster: bool = False
    processes: int = 2
    concurrency: int = 8
    duration: float | None = 6.0  # seconds; None when ``calls`` bounds the run
    calls: int | None = None  # total guarded calls over all threads
    duplicate_rate: float = 0.1
    value_bytes: int = 256
    namespace: str = "airlock:bench"
    run_id: str = ""

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


def redis_admin_client(url: str, cluster: bool) -> Any:
    """A plain redis-py client for the run's own bookkeeping (memory sampling, clean-up)."""
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url("redis://" + url[len(CLUSTER_SCHEME) :])
    import redis

    return redis.Redis.from_url(url)


def _tools(
    guard: EffectGuard, value_bytes: int, runs: dict[str, int], lock: threading.Lock
) -> dict[str, Any]:
    from ..context import current_call_context
    from ..core.reversibility import reversibility

    payload = "x" * value_bytes
    local = threading.local()

    def ran() -> str:
        host = current_call_context()
        tool_call_id = str(host.tool_call_id) if host is not None else ""
        with lock:
            runs[tool_call_id] = runs.get(tool_call_id, 0) + 1
        local.ran = True
        return tool_call_id

    @guard.wrap
    def charge(account: str, cents: int) -> dict[str, Any]:
        return {"receipt": ran(), "account": account, "cents": cents, "payload": payload}

    @reversibility("costly")
    @guard.wrap
    def send_email(to: str, subject: str) -> dict[str, Any]:
        return {"message_id": ran(), "to": to, "payload": payload}

    @reversibility("reversible")
    @guard.wrap
    def read_balance(account: str) -> dict[str, Any]:
        return {"account": account, "balance": 4200, "read": ran(), "payload": payload}

    return {"charge": charge, "send_email": send_email, "read_balance": read_balance, "_local": local}


def _worker(  # noqa: PLR0915  (one process's whole life, read top to bottom)
    config: BenchConfig,
    process: int,
    barrier: Any,
    progress: Any,
    results: Any,
) -> None:
    """One load process: C threads making guarded calls; puts one merged WorkerReport on ``results``."""
    report = WorkerReport()
    try:
        from ..context import tool_call_context
        from ..core.errors import EffectRefused
        from ..guard import EffectGuard
        from ..stores.redis_store import RedisEffectStore

        # retries of reversible calls supersede each other by design; keep their warnings off the bar
        logging.getLogger("airlock_redis").setLevel(logging.ERROR)
        store = RedisEffectStore(config.url, namespace=config.namespace)
        guard = EffectGuard(store=store)
        runs: dict[str, int] = {}
        runs_lock = threading.Lock()
        tools = _tools(guard, config.value_bytes, runs, runs_lock)
        local = tools.pop("_local")
        seqs = itertools.count()
        issued = [0]  # call numbers handed out so far in this process (about the same in the others)
        share = None
        if config.calls is not None:
            total_threads = config.processes * config.concurrency
            index = process * config.concurrency
            share = [
                config.calls // total_threads + (1 if index + t < config.calls % total_threads else 0)
                for t in range(config.concurrency)
            ]
        reports = [WorkerReport() for _ in range(config.concurrency)]
        barrier.wait(timeout=120)
        deadline = time.monotonic() + config.duration if config.duration is not None else None

        def drive(thread: int) -> None:
            mine = reports[thread]
            rng = random.Random(f"{config.run_id}:{process}:{thread}")
            quota = share[thread] if share is not None else None
            pending_progress = 0
            while True:
                if quota is not None and mine.calls >= quota:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                owner = process
                if issued[0] > 0 and rng.random() < config.duplicate_rate:
                    owner = rng.randrange(config.processes)  # a retry, maybe of another process's call
                    seq = rng.randrange(issued[0])
                else:
                    seq = next(seqs)
                    issued[0] = max(issued[0], seq + 1)
                tool, kwargs = call_for(owner, seq)
                tool_call_id = f"{config.run_id}-{owner}-{seq}"
                mine.ids.add(tool_call_id)
                local.ran = False
                started = time.perf_counter()
                try:
                    with tool_call_context(tool_call_id):
                        tools[tool](**kwargs)
                    if local.ran:
                        mine.executed += 1
                    else:
                        mine.replayed += 1
                except EffectRefused as refused:
                    mine.refusals[refused.reason] += 1
                except Exception as error:
                    mine.errors[type(error).__name__] += 1
                finished = time.perf_counter()
                mine.calls += 1
                mine.histogram.record(finished - started)
                mine.timeline[int(time.time() / TIMELINE_STEP)] += 1
                pending_progress += 1
                if pending_progress >= 8:
                    with progress.get_lock():
                        progress.value += pending_progress
                    pending_progress = 0
            with progress.get_lock():
                progress.value += pending_progress

        threads = [threading.Thread(target=drive, args=(t,), daemon=True) for t in range(config.concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for part in reports:
            report.merge(part)
        report.runs.update(runs)
        store.close()
    except Exception:
        report.failure = f"process {process}: {traceback.format_exc()}"
        with contextlib.suppress(Exception):
            barrier.abort()
    results.put(report)


def _sample_memory(client: Any, namespace: str, sample: int = 200) -> tuple[float | None, int, int]:
    """(mean MEMORY USAGE of up to ``sample`` record keys, how many were sampled, records counted)."""
    from ..stores.keys import record_pattern

    sizes: list[int] = []
    records = 0
    for key in client.scan_iter(match=record_pattern(namespace), count=1000):
        records += 1
        if len(sizes) < sample:
            usage = client.memory_usage(key, samples=0)
            if usage is not None:
                sizes.append(int(usage))
    return (sum(sizes) / len(sizes) if sizes else None), len(sizes), records


def _clean(client: Any, namespace: str) -> None:
    batch: list[Any] = []
    for key in client.scan_iter(match=f"{namespace}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            for one in batch:  # one key per command: keys of one batch may live on different slots
                client.unlink(one)
            batch.clear()
    for one in batch:
        client.unlink(one)


def run_bench(  # noqa: PLR0915
    config: BenchConfig,
    target: str,
    on_progress: Callable[[float, str], None] | None = None,
) -> BenchSummary:
    """Start the worker processes, wait for them (reporting progress), and gather the figures."""
    if not config.run_id:
        config = BenchConfig(**{**asdict(config), "run_id": secrets.token_hex(4)})
    namespace = config.namespace
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(config.processes + 1)
    progress = context.Value("q", 0)
    results = context.Queue()
    processes = [
        context.Process(target=_worker, args=(config, p, barrier, progress, results), daemon=True)
        for p in range(config.processes)
    ]
    for proc in processes:
        proc.start()
    reports: list[WorkerReport] = []
    try:
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
    finally:
        for proc in processes:
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
    client = redis_admin_client(config.url, config.cluster)
    try:
        memory, sampled, records = _sample_memory(client, namespace)
        _clean(client, namespace)
    finally:
        client.close()
    reversible = {i for i in merged.ids if tool_of(i) in REVERSIBLE_TOOLS}
    shown = asdict(config)
    shown["url"] = redact(config.url)
    return BenchSummary(
        config=shown,
        target=target,
        elapsed_s=elapsed,
        report=merged,
        reversible_ids=reversible,
        memory_per_record_bytes=memory,
        memory_sampled_records=sampled,
        records=records,
    )
