"""``airlock-redis bench``: load a Redis with guarded calls from several processes and report.

The run fails (exit 1) if any call of a tool that may not run again ran twice.

``--url`` takes every URL ``RedisEffectStore`` takes, and the scheme decides the topology:
``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h1:p1[,h2:p2...]``, ``rediss+cluster://``,
``redis+sentinel://s1:p1,.../<service>``. On a Cluster the report adds one line per primary: the
calls whose record lives in its slots, the records it holds and their memory (MEMORY USAGE ...
SAMPLES 0 on a sample of its keys). ``--cluster`` is kept so that old command lines still work: it
changes nothing, and is refused (exit 2) only with a URL whose scheme names no Cluster.

By default it runs 4 worker processes (or as many as the machine has CPUs, if that is fewer) of 8
threads each for 6 seconds. ``--help`` shows every default. The progress bar and the table of figures
are drawn (with rich) only on a terminal: stderr to a file or a pipe gets no progress, and stdout to a
file or a pipe gets the figures as plain ``name  value`` lines.

Exit codes: 0 ok; 1 a duplicate execution, or errors during the run; 2 bad arguments, a URL the
store does not take, or a Redis that does not answer; 141 the reader of its output went away.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..loadgen.plot import PlotUnavailable, write_plot, write_sweep_plot
from ..loadgen.progress import print_summary, progress_for
from ..loadgen.sweep import SweepPoint, parse_counts, sweep, sweep_table
from ..loadgen.workers import BenchConfig, run_bench
from ..redaction import redact
from ..stores.url import CLUSTER_SCHEMES, parse_url
from .common import (
    add_target_arguments,
    check_given_url,
    embedded_or_given,
    non_negative_int,
    positive_int,
)

HELP = "load-test the guard against a Redis (embedded by default) and report throughput and latency"


MAX_DEFAULT_PROCESSES = 4
DEFAULT_CONCURRENCY = 8
DEFAULT_DURATION_S = 6.0
DEFAULT_DUPLICATE_RATE = 0.1
DEFAULT_VALUE_BYTES = 256
DEFAULT_NAMESPACE = "airlock:bench"


def default_processes() -> int:
    """4, or the CPU count if smaller: more processes than cores measure the scheduler, not Redis."""
    return min(MAX_DEFAULT_PROCESSES, os.cpu_count() or 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, embedded_default=True)
    parser.set_defaults(namespace=DEFAULT_NAMESPACE)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="kept for old command lines, changes nothing: the --url scheme decides the topology "
        "(redis+cluster://h1:p1,h2:p2 is a Cluster) (default: off)",
    )
    parser.add_argument(
        "--processes",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"worker processes, spawned (default: {MAX_DEFAULT_PROCESSES}, or the CPU count if smaller; "
        f"{default_processes()} here)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help="concurrent calls (threads) per process (default: %(default)s)",
    )
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seconds to run (default: {DEFAULT_DURATION_S:g}, unless --calls is given)",
    )
    bound.add_argument(
        "--calls",
        type=positive_int,
        default=None,
        metavar="N",
        help="total guarded calls to make, instead of a duration (default: none, --duration bounds the run)",
    )
    parser.add_argument(
        "--duplicate-rate",
        type=float,
        default=DEFAULT_DUPLICATE_RATE,
        metavar="SHARE",
        help="share of calls that retry an earlier tool_call_id, in [0, 1) (default: %(default)s)",
    )
    parser.add_argument(
        "--value-bytes",
        type=non_negative_int,
        default=DEFAULT_VALUE_BYTES,
        metavar="N",
        help="size of the payload each tool returns (default: %(default)s)",
    )
    parser.add_argument(
        "--json", metavar="FILE", default=None, help="write every figure as JSON (default: no file)"
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help="write latency and throughput plots; needs matplotlib (default: no plot)",
    )
    parser.add_argument(
        "--sweep",
        metavar="N,N,...",
        default=None,
        help="run once per process count (e.g. 1,2,4,8) and report throughput, p50/p99 latency and "
        "Redis CPU per call for each, as a table (--json: every point; --plot: throughput and "
        "latency against processes) (default: one run)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar, even on a terminal (default: off; stderr that is not a terminal "
        "never gets one)",
    )
    parser.epilog = (
        "exit codes: 0 ok, 1 a duplicate execution or errors during the run, 2 bad arguments, a URL "
        "the store does not take or a Redis that does not answer, 141 the reader of its output went away"
    )


def _checked_config(args: argparse.Namespace) -> BenchConfig | str:
    """The run's configuration from the command line, or what is wrong with it."""
    try:
        cluster = bool(args.url) and parse_url(args.url).kind == "cluster"
    except ValueError as exc:
        return redact(str(exc))
    if args.cluster and not cluster:
        schemes = " or ".join(f"{scheme}://" for scheme in CLUSTER_SCHEMES)
        return f"--cluster, but the URL names no Cluster: the scheme decides (use {schemes}host:port,...)"
    problem = check_given_url(args.url)
    if problem is not None:
        return problem
    duration = args.duration if args.duration is not None else DEFAULT_DURATION_S
    try:
        return BenchConfig(
            url="",
            cluster=cluster,
            processes=args.processes if args.processes is not None else default_processes(),
            concurrency=args.concurrency,
            duration=None if args.calls is not None else duration,
            calls=args.calls,
            duplicate_rate=args.duplicate_rate,
            value_bytes=args.value_bytes,
            namespace=args.namespace,
        )
    except ValueError as exc:
        return str(exc)


def run(args: argparse.Namespace) -> int:
    config = _checked_config(args)
    if isinstance(config, str):
        print(f"airlock-redis bench: {config}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("--plot needs matplotlib: pip install 'airlock-redis[plot]'", file=sys.stderr)
            return 2
    try:
        counts = parse_counts(args.sweep) if args.sweep is not None else None
    except ValueError as exc:
        print(f"airlock-redis bench: {exc}", file=sys.stderr)
        return 2
    if counts is not None:
        return _run_sweep(args, config, counts)
    with embedded_or_given(args.url) as target:
        config = BenchConfig(**{**config.__dict__, "url": target.url})
        bound = f"{config.calls} calls" if config.calls is not None else f"{config.duration:g} s"
        print(
            f"Redis: {target.description}\n"
            f"{config.processes} processes x {config.concurrency} threads, {bound}, "
            f"duplicate rate {config.duplicate_rate}, {config.value_bytes} B values",
            file=sys.stderr,
        )
        bar = None if args.quiet else progress_for(sys.stderr)
        try:
            summary = run_bench(config, target.description, bar.update if bar else None)
            if bar:
                bar.update(1.0, f"{summary.report.calls} calls  {summary.elapsed_s:.1f} s")
        except RuntimeError as exc:
            print(f"airlock-redis bench: {exc}", file=sys.stderr)
            return 2
        finally:
            if bar:
                bar.close()
    print_summary(summary, sys.stdout)
    if args.json:
        Path(args.json).write_text(json.dumps(summary.to_json(), indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")
    if args.plot:
        try:
            write_plot(summary, args.plot)
        except PlotUnavailable as exc:
            print(str(exc), file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}")
    if summary.failed:
        print(
            f"FAILURE: {summary.duplicate_executions} duplicate execution(s) of calls that may run only once",
            file=sys.stderr,
        )
        return 1
    if summary.report.errors:
        print("the run finished with errors (see the table)", file=sys.stderr)
        return 1
    return 0


def _run_sweep(args: argparse.Namespace, config: BenchConfig, counts: list[int]) -> int:
    """``--sweep``: one run per process count, each point printed as it is measured."""
    with embedded_or_given(args.url) as target:
        config = BenchConfig(**{**config.__dict__, "url": target.url})
        bound = f"{config.calls} calls" if config.calls is not None else f"{config.duration:g} s"
        print(
            f"Redis: {target.description}\nsweep over {', '.join(map(str, counts))} processes x "
            f"{config.concurrency} threads, {bound} each, {config.value_bytes} B values",
            file=sys.stderr,
        )

        def measured(point: SweepPoint) -> None:
            print(f"  {point.processes} processes: {point.calls_per_s:,.0f} calls/s", file=sys.stderr)

        try:
            points = sweep(config, counts, target.description, measured)
        except RuntimeError as exc:
            print(f"airlock-redis bench: {exc}", file=sys.stderr)
            return 2
    print(sweep_table(points))
    if args.json:
        figures = {"target": redact(target.description), "points": [p.to_json() for p in points]}
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")
    if args.plot:
        title = (
            f"airlock-redis bench: {config.concurrency} threads per process, {config.value_bytes} B values"
        )
        try:
            write_sweep_plot(points, title, args.plot)
        except PlotUnavailable as exc:
            print(str(exc), file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}")
    duplicates = sum(p.duplicate_executions for p in points)
    if duplicates:
        print(
            f"FAILURE: {duplicates} duplicate execution(s) of calls that may run only once", file=sys.stderr
        )
        return 1
    return 0
