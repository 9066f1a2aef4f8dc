"""``airlock-redis bench``: load a Redis with guarded calls from several processes and report.

The run fails (exit 1) if any call of a tool that may not run again ran twice.

``--url`` takes every URL ``RedisEffectStore`` takes, and the scheme decides the topology:
``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h1:p1[,h2:p2...]``, ``rediss+cluster://``,
``redis+sentinel://s1:p1,.../<service>``. On a Cluster the report adds one line per primary: the
calls whose record lives in its slots, the records it holds and their memory (MEMORY USAGE ...
SAMPLES 0 on a sample of its keys). ``--cluster`` is kept so that old command lines still work: it
changes nothing, and is refused (exit 2) only with a URL whose scheme names no Cluster.

By default it runs 4 worker processes (or as many as the machine has CPUs, if that is fewer) of 8
threads each for 6 seconds, making blocking calls. ``--mode asyncio`` runs one event loop per
process instead, with ``--concurrency`` coroutines awaiting an ``async def`` tool (the same tools,
retries and checks): their calls share round trips to Redis through the store's auto-pipelining,
which ``--no-auto-pipeline`` turns off (asyncio mode only: blocking calls are always sent one by one,
so with threads it is refused, exit 2). ``--write-behind`` makes the store send its commits
write-behind (``RedisEffectStore(write_behind=True)``: the caller does not wait for the commit), in
either mode; ``--no-lease`` gives the guard no lease (``EffectGuard(lease=None)``: a duplicate of a
running call is refused at once instead of waiting for it). The report says which modes ran
(``mode``, ``auto_pipeline``, ``write_behind``, ``lease``), how many calls were duplicates (retries of
an earlier id), and how many of those waited for a running attempt of their id and what they got
(replayed, refused ``effect_in_progress``, other), as the guard's observer reports its ``waited`` event.
``--help`` shows every default.

``--sweep 1,2,4,8`` runs once per process count; ``--sweep-concurrency 1,8,64`` runs once per
concurrency level (calls per process), the other options fixed. Either prints a line per run
(throughput, p50/p99 latency, Redis CPU per call), and with --json/--plot writes every point and
draws throughput and latency against what it varied. The progress bar and the table of figures
are drawn (with rich) only on a terminal: stderr to a file or a pipe gets no progress, and stdout to a
file or a pipe gets the figures as plain ``name  value`` lines.

The command line is checked before the run starts (exit 2): --duration and --calls must bound a
run that ends (at most a day, at most 10^9 calls), --json and --plot must name files in folders that
exist (--plot's with an image format's suffix). Ctrl-C stops the workers, removes the run's records
(as the end of a run does) and the private server, and exits 130 with one line.

Exit codes: 0 ok; 1 a duplicate execution, or errors during the run; 2 bad arguments, a URL the
store does not take, or a Redis it cannot use (no answer, authentication failed, not allowed, a
Cluster node behind a plain redis:// URL, no redis-server to start); 130 interrupted; 141 the reader
of its output went away.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..loadgen.plot import PlotUnavailable, write_plot, write_sweep_plot
from ..loadgen.progress import print_summary, progress_for
from ..loadgen.stats import MODES, auto_pipeline_of, lanes_word, lease_of, mode_text, write_behind_of
from ..loadgen.sweep import SweepPoint, parse_counts, sweep, sweep_table
from ..loadgen.workers import BenchConfig, run_bench
from ..redaction import redact
from ..stores.url import CLUSTER_SCHEMES, parse_url
from .common import (
    add_target_arguments,
    bounded_int,
    check_given_url,
    embedded_or_given,
    seconds_argument,
)

HELP = "load-test the guard against a Redis (embedded by default) and report throughput and latency"


MAX_DEFAULT_PROCESSES = 4
DEFAULT_CONCURRENCY = 8
DEFAULT_DURATION_S = 6.0
DEFAULT_DUPLICATE_RATE = 0.1
DEFAULT_VALUE_BYTES = 256
DEFAULT_NAMESPACE = "airlock:bench"
DEFAULT_MODE = "threads"
# bounds of the command line: a run that could not end, or would take the machine down, is refused
MAX_PROCESSES = 256
MAX_CONCURRENCY = 1024
MAX_DURATION_S = 86_400.0  # a day
MAX_CALLS = 1_000_000_000
MAX_VALUE_BYTES = 64 << 20  # 64 MiB
# what matplotlib writes (its default backends): --plot's file must end with one of these
PLOT_FORMATS = (
    "eps",
    "jpeg",
    "jpg",
    "pdf",
    "pgf",
    "png",
    "ps",
    "raw",
    "rgba",
    "svg",
    "svgz",
    "tif",
    "tiff",
    "webp",
)


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
        type=bounded_int(1, MAX_PROCESSES),
        default=None,
        metavar="N",
        help=f"worker processes, spawned (default: {MAX_DEFAULT_PROCESSES}, or the CPU count if smaller; "
        f"{default_processes()} here)",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=DEFAULT_MODE,
        help="threads: each process runs --concurrency threads making blocking calls; asyncio: each "
        "process runs one event loop with --concurrency coroutines awaiting an async tool, whose "
        "calls share round trips to Redis (auto-pipelining) (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        type=bounded_int(1, MAX_CONCURRENCY),
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help="concurrent calls per process: threads, or coroutines with --mode asyncio "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--no-auto-pipeline",
        dest="auto_pipeline",
        action="store_false",
        help="--mode asyncio only: send every command alone, RedisEffectStore(auto_pipeline=False), "
        "to compare (default: auto-pipelining on; blocking calls are always sent one by one)",
    )
    parser.add_argument(
        "--write-behind",
        action="store_true",
        help="send commits write-behind, RedisEffectStore(write_behind=True): the caller gets the "
        "value without waiting for its commit (default: off)",
    )
    parser.add_argument(
        "--no-lease",
        dest="lease",
        action="store_false",
        help="no lease on the records, EffectGuard(lease=None): a duplicate of a running call is "
        "refused at once instead of waiting for it (default: the guard's lease, 60 s)",
    )
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument(
        "--duration",
        type=seconds_argument(MAX_DURATION_S),
        default=None,
        metavar="SECONDS",
        help=f"seconds to run, at most {MAX_DURATION_S:g} (default: {DEFAULT_DURATION_S:g}, unless --calls "
        "is given)",
    )
    bound.add_argument(
        "--calls",
        type=bounded_int(1, MAX_CALLS),
        default=None,
        metavar="N",
        help=f"total guarded calls to make, at most {MAX_CALLS:,}, instead of a duration (default: none, "
        "--duration bounds the run)",
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
        type=bounded_int(0, MAX_VALUE_BYTES),
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
    sweeps = parser.add_mutually_exclusive_group()
    sweeps.add_argument(
        "--sweep",
        metavar="N,N,...",
        default=None,
        help="run once per process count (e.g. 1,2,4,8) and report throughput, p50/p99 latency and "
        "Redis CPU per call for each, as a table (--json: every point; --plot: throughput and "
        "latency against processes) (default: one run)",
    )
    sweeps.add_argument(
        "--sweep-concurrency",
        metavar="N,N,...",
        default=None,
        help="run once per --concurrency level (e.g. 1,8,64,256), the other options fixed, and "
        "report as --sweep does, against concurrency (default: one run)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar, even on a terminal (default: off; stderr that is not a terminal "
        "never gets one)",
    )
    parser.epilog = (
        "exit codes: 0 ok, 1 a duplicate execution or errors during the run, 2 bad arguments, a URL "
        "the store does not take or a Redis it cannot use (no answer, authentication failed, not "
        "allowed, a Cluster node behind a plain redis:// URL, no redis-server to start), 130 "
        "interrupted (Ctrl-C: the run's records are removed), 141 the reader of its output went away"
    )


def _output_problem(option: str, path: str) -> str | None:
    """What keeps the run from writing its --json or --plot file at the end, or None."""
    target = Path(path)
    if target.is_dir():
        return f"{option} {path}: is a folder"
    folder = target.parent
    if not folder.is_dir():
        return f"{option} {path}: no folder {str(folder)!r}"
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{option} {path}: not writable"
    return None


def _outputs_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the files the run writes at its end, checked before it starts."""
    if args.plot:
        suffix = Path(args.plot).suffix.lower().lstrip(".")
        if suffix not in PLOT_FORMATS:
            return f"--plot {args.plot}: the file name must end with an image format: .png, .svg, .pdf, ..."
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            problem = _output_problem(option, path)
            if problem is not None:
                return problem
    return None


def _tell(text: str) -> None:
    """Lines on stderr, with their newline in the same write: a Ctrl-C between two writes would leave
    the last line without its end, and ``interrupted`` glued to it."""
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def _checked_config(args: argparse.Namespace) -> BenchConfig | str:
    """The run's configuration from the command line, or what is wrong with it."""
    problem = _outputs_problem(args)
    if problem is not None:
        return problem
    try:
        cluster = bool(args.url) and parse_url(args.url).kind == "cluster"
    except ValueError as exc:
        return redact(str(exc))
    if args.cluster and not cluster:
        schemes = " or ".join(f"{scheme}://" for scheme in CLUSTER_SCHEMES)
        return f"--cluster, but the URL names no Cluster: the scheme decides (use {schemes}host:port,...)"
    if args.mode != "asyncio" and not args.auto_pipeline:
        return (
            f"--no-auto-pipeline applies to --mode asyncio only: with --mode {args.mode} the calls "
            "are blocking, and blocking calls are always sent one by one"
        )
    problem = check_given_url(args.url, namespace=args.namespace)
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
            mode=args.mode,
            auto_pipeline=args.auto_pipeline,
            write_behind=args.write_behind,
            lease=args.lease,
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
    swept = _swept(args)
    if isinstance(swept, str):
        print(f"airlock-redis bench: {swept}", file=sys.stderr)
        return 2
    if swept is not None:
        return _run_sweep(args, config, *swept)
    with embedded_or_given(args.url) as target:
        config = BenchConfig(**{**config.__dict__, "url": target.url})
        bound = f"{config.calls} calls" if config.calls is not None else f"{config.duration:g} s"
        _tell(
            f"Redis: {target.description}\n"
            f"{config.processes} processes x {config.concurrency} {lanes_word(config.mode)} "
            f"({mode_text(config.shown())}), {bound}, "
            f"duplicate rate {config.duplicate_rate}, {config.value_bytes} B values"
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


def _swept(args: argparse.Namespace) -> tuple[str, list[int]] | str | None:
    """What --sweep or --sweep-concurrency varies and its values, None for one run, or what is wrong."""
    for option, over, most, unit in (
        ("--sweep", "processes", MAX_PROCESSES, "processes"),
        ("--sweep-concurrency", "concurrency", MAX_CONCURRENCY, "concurrent calls per process"),
    ):
        text = getattr(args, option[2:].replace("-", "_"))
        if text is None:
            continue
        try:
            counts = parse_counts(text, option, over)
        except ValueError as exc:
            return str(exc)
        if max(counts) > most:
            return f"{option}: at most {most} {unit}, not {max(counts)}"
        return over, counts
    return None


def _run_sweep(args: argparse.Namespace, config: BenchConfig, over: str, counts: list[int]) -> int:
    """``--sweep`` or ``--sweep-concurrency``: one run per value of ``over``, each point printed as it
    is measured."""
    lanes = lanes_word(config.mode)
    varied, fixed = {
        "processes": ("processes", f"{config.concurrency} {lanes} per process"),
        "concurrency": (f"{lanes} per process", f"{config.processes} processes"),
    }[over]
    with embedded_or_given(args.url) as target:
        config = BenchConfig(**{**config.__dict__, "url": target.url})
        bound = f"{config.calls} calls" if config.calls is not None else f"{config.duration:g} s"
        _tell(
            f"Redis: {target.description}\nsweep over {', '.join(map(str, counts))} {varied}, {fixed} "
            f"({mode_text(config.shown())}), {bound} each, {config.value_bytes} B values"
        )

        def measured(point: SweepPoint) -> None:
            print(f"  {getattr(point, over)} {varied}: {point.calls_per_s:,.0f} calls/s", file=sys.stderr)

        try:
            points = sweep(config, counts, target.description, measured, over=over)
        except RuntimeError as exc:
            print(f"airlock-redis bench: {exc}", file=sys.stderr)
            return 2
    print(sweep_table(points))
    shown = config.shown()
    if args.json:
        figures = {
            "target": redact(target.description),
            "sweep": over,
            "mode": config.mode,
            "auto_pipeline": auto_pipeline_of(shown),  # null: not applicable (threads mode)
            "write_behind": write_behind_of(shown),
            "lease": lease_of(shown),
            "points": [p.to_json() for p in points],
        }
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")
    if args.plot:
        title = f"airlock-redis bench ({mode_text(shown)}): {fixed}, {config.value_bytes} B values"
        try:
            write_sweep_plot(points, title, args.plot, over=over)
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
