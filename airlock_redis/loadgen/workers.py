"""Worker processes that drive guarded calls against one Redis, and the run that gathers them.

Each of N processes (started with ``spawn``) makes C lanes of guarded calls, each lane one call after
another: threads making blocking calls, or coroutines on one event loop (:mod:`.lanes`). What they
call, and how a share of the calls retry earlier ones, is :mod:`.workload`'s.

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
import logging
import multiprocessing
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ..stores.url import CONNECT_ERRORS, primary_clients, slot_primaries, sync_client
from .interrupts import sigint_deferred
from .lanes import Load, run_coroutines, run_threads
from .server_cpu import ServerCpu, per_call, snapshot
from .stats import TIMELINE_STEP, BenchSummary, PrimaryLoad, WorkerReport
from .workload import REVERSIBLE_TOOLS, BenchConfig, WaitWatcher, guarded_tools, tool_of

__all__ = ["BenchConfig", "remove_run", "run_bench", "run_pattern"]


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
        store = RedisEffectStore(
            config.url,
            namespace=config.namespace,
            auto_pipeline=config.auto_pipeline,
            write_behind=config.write_behind,
        )
        runs: dict[str, int] = {}
        # the observer only notes which calls waited for a running attempt (WaitWatcher)
        guard = (
            EffectGuard(store=store, observer=WaitWatcher())
            if config.lease
            else EffectGuard(store=store, observer=WaitWatcher(), lease=None)
        )
        tools = guarded_tools(guard, config.value_bytes, runs, threading.Lock(), asynchronous=asynchronous)
        load = Load(config, process, tools, progress, stop)
        barrier.wait(timeout=120)
        load.start()
        parts = asyncio.run(run_coroutines(load, store)) if asynchronous else run_threads(load)
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
