"""The figures a sizing needs, measured on this machine, and the sizing table derived from them.

    python -m benchmarks.sizing --out benchmarks/results/sizing      # about 5 minutes on 2 cores

Measured (each on servers this script starts and stops: $AIRLOCK_REDIS_SERVER, else redis-server on
PATH, loopback only):
- Redis CPU per guarded call (begin + commit) by result size: ``airlock-redis bench`` runs of a fixed
  number of calls on one server, read from ``INFO commandstats`` (time inside the scripts) and ``INFO
  cpu`` (the whole server process: network I/O and event loop too).
- Memory per committed record by result size: ``MEMORY USAGE ... SAMPLES 0``
  (``benchmarks/record_memory.py``).
- Throughput and p50/p99 latency as load grows: ``airlock-redis bench --sweep`` over 1, 2, 4 and 8
  worker processes (8 threads each) on one server and on a 3-primary Redis Cluster (no replicas:
  this machine has 2 cores for everything).
- The same sweep in each mode of :data:`MODES` (``--modes``; default all): blocking calls with and
  without write-behind commits, and asyncio calls (``ASYNC_CONCURRENCY`` coroutines per process)
  with and without auto-pipelining and with write-behind, over ``--mode-processes`` (default 1, 2,
  4), on both topologies; the Redis process CPU per call of each point comes with it.
Derived, and said to be: calls/s one primary core can serve (1 / process CPU per call, with half of
the core kept free), records kept for a TTL, GB and primaries for a given rate; per mode, the peak
and the calls/s per primary core from that mode's own CPU per call.

Writes ``<out>.json``, ``<out>.md`` and the sweep plots ``<out>-single.png`` / ``<out>-cluster.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airlock_redis.embedded import EmbeddedRedis, find_redis_server
from airlock_redis.loadgen.plot import write_sweep_plot
from airlock_redis.loadgen.sweep import SweepPoint, sweep, sweep_rows
from airlock_redis.loadgen.workers import BenchConfig, run_bench
from benchmarks import record_memory

RESULT_SIZES = (8, 200, 1024, 4096)
PROCESS_COUNTS = (1, 2, 4, 8)
HEADROOM = 0.5  # share of a primary's core a sizing plans to use
RATES = (100, 1_000, 10_000)  # guarded calls/s in the derived table
TTL_HOURS = 24  # the committed TTL's default
SIZED_RESULT = 200  # result size the derived table assumes
GB_PER_PRIMARY = 25  # memory a sizing plans per primary (the dataset, not the machine's RAM)
ASYNC_CONCURRENCY = 64  # coroutines per process in the asyncio modes
MODE_PROCESSES = (1, 2, 4)  # process counts of the per-mode sweeps (more than 2 only adds latency here)
# the modes a sizing compares: name -> BenchConfig fields (what `airlock-redis bench` options give);
# asyncio auto-pipelines unless "no-pipeline"
MODES: dict[str, dict[str, Any]] = {
    "threads": {"mode": "threads", "concurrency": 8},
    "threads+write-behind": {"mode": "threads", "concurrency": 8, "write_behind": True},
    "asyncio": {"mode": "asyncio", "concurrency": ASYNC_CONCURRENCY},
    "asyncio-no-pipeline": {
        "mode": "asyncio",
        "concurrency": ASYNC_CONCURRENCY,
        "auto_pipeline": False,
    },
    "asyncio+write-behind": {
        "mode": "asyncio",
        "concurrency": ASYNC_CONCURRENCY,
        "write_behind": True,
    },
}
# the `airlock-redis bench` options of each mode, for the table's commands
MODE_OPTIONS = {
    "threads": "--concurrency 8",
    "threads+write-behind": "--concurrency 8 --write-behind",
    "asyncio": f"--mode asyncio --concurrency {ASYNC_CONCURRENCY}",
    "asyncio-no-pipeline": f"--mode asyncio --concurrency {ASYNC_CONCURRENCY} --no-auto-pipeline",
    "asyncio+write-behind": (f"--mode asyncio --concurrency {ASYNC_CONCURRENCY} --write-behind"),
}


def cpu_by_result_size(url: str, calls: int) -> list[dict[str, Any]]:
    rows = []
    for size in RESULT_SIZES:
        config = BenchConfig(
            url=url, processes=2, concurrency=8, duration=None, calls=calls, value_bytes=size
        )
        summary = run_bench(config, "sizing")
        rows.append(
            {
                "result_bytes": size,
                "calls": summary.report.calls,
                "server_us_per_call": summary.server_us_per_call,
                "server_cpu_us_per_call": summary.server_cpu_us_per_call,
                "calls_per_s": summary.calls_per_s,
            }
        )
        print(f"  cpu, {size} B results: {rows[-1]}", file=sys.stderr)
    return rows


def sweep_on(url: str, seconds: float, title: str, png: Path) -> list[dict[str, Any]]:
    config = BenchConfig(url=url, concurrency=8, duration=seconds, value_bytes=SIZED_RESULT)

    def measured(point: SweepPoint) -> None:
        print(f"  {title}, {point.processes} processes: {point.calls_per_s:,.0f} calls/s", file=sys.stderr)

    points = sweep(config, PROCESS_COUNTS, title, measured)
    write_sweep_plot(points, f"airlock-redis bench --sweep: {title}, 8 threads per process", png)
    return [p.to_json() for p in points]


def sweep_modes(
    url: str, seconds: float, title: str, modes: list[str], counts: tuple[int, ...]
) -> dict[str, list[dict[str, Any]]]:
    """One sweep over ``counts`` processes per mode of :data:`MODES`."""
    found: dict[str, list[dict[str, Any]]] = {}
    for name in modes:
        config = BenchConfig(url=url, duration=seconds, value_bytes=SIZED_RESULT, **MODES[name])

        def measured(point: SweepPoint, name: str = name) -> None:
            print(
                f"  {title}, {name}, {point.processes} processes: {point.calls_per_s:,.0f} calls/s "
                f"(p99 {point.p99_ms:.1f} ms, Redis CPU {point.server_cpu_us_per_call or 0:.1f} us/call)",
                file=sys.stderr,
            )

        found[name] = [p.to_json() for p in sweep(config, counts, title, measured)]
    return found


def by_mode(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per mode: the peak calls/s on each topology (and its p99), and the Redis process CPU per call
    on the single server at that peak, with what one primary core serves at it (arithmetic)."""
    rows = []
    for name, topologies in report.get("modes", {}).items():
        row: dict[str, Any] = {"mode": name, "options": MODE_OPTIONS.get(name, "")}
        for topology in ("single", "cluster"):
            points = topologies.get(topology) or []
            if not points:
                continue
            peak = max(points, key=lambda p: p["calls_per_s"])
            row[topology] = {
                "calls_per_s": peak["calls_per_s"],
                "processes": peak["processes"],
                "p50_ms": peak["p50_ms"],
                "p99_ms": peak["p99_ms"],
                "server_cpu_us_per_call": peak["server_cpu_us_per_call"],
                "server_us_per_call": peak["server_us_per_call"],
            }
        single = row.get("single")
        if single and single["server_cpu_us_per_call"]:
            row["calls_per_s_per_primary_core"] = 1e6 / single["server_cpu_us_per_call"]
            row["primaries_for_10000"] = max(
                1, -(-10_000 // int(row["calls_per_s_per_primary_core"] * HEADROOM))
            )
        rows.append(row)
    return rows


def derived(cpu: list[dict[str, Any]], memory: dict[str, Any]) -> dict[str, Any]:
    """What a sizing reads off the measured figures (each step is arithmetic, said in the table)."""
    at = next(row for row in cpu if row["result_bytes"] == SIZED_RESULT)
    cpu_us = float(at["server_cpu_us_per_call"])
    per_core = 1e6 / cpu_us
    planned_per_primary = per_core * HEADROOM
    record_bytes = float(memory[str(SIZED_RESULT)]["record"])
    rows = []
    for rate in RATES:
        kept = rate * TTL_HOURS * 3600
        gigabytes = kept * record_bytes / 1e9
        rows.append(
            {
                "calls_per_s": rate,
                "records_kept": kept,
                "gb": gigabytes,
                "primaries_for_cpu": max(1, -(-rate // int(planned_per_primary))),
                "primaries_for_memory": max(1, -(-int(gigabytes) // GB_PER_PRIMARY)),
            }
        )
    return {
        "result_bytes": SIZED_RESULT,
        "process_cpu_us_per_call": cpu_us,
        "calls_per_s_per_primary_core": per_core,
        "planned_calls_per_s_per_primary": planned_per_primary,
        "record_bytes": record_bytes,
        "ttl_hours": TTL_HOURS,
        "rows": rows,
    }


def _md_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    if "derived" not in report:  # --only-modes
        head = [
            "# Sizing figures by mode (measured by `python -m benchmarks.sizing --only-modes`)",
            f"Machine: {report['machine']}. Server: {report['server']}. Every server ran on this machine, "
            "loopback, with its default configuration; the load generator shared the same 2 cores.",
        ]
        return "\n\n".join([*head, *_modes_markdown(report)])
    d = report["derived"]
    cpu_rows = [["result", "Redis us/call in commands", "Redis process CPU us/call"]]
    cpu_rows += [
        [f"{r['result_bytes']} B", f"{r['server_us_per_call']:.1f}", f"{r['server_cpu_us_per_call']:.1f}"]
        for r in report["cpu_by_result_size"]
    ]
    mem_rows = [["result", "record (MEMORY USAGE SAMPLES 0)", "beyond the result"]]
    mem_rows += [
        [f"{size} B", f"{v['record']:.0f} B", f"{v['beyond']:.0f} B"]
        for size, v in report["memory_by_result_size"].items()
    ]
    size_rows = [
        [
            "guarded calls/s",
            f"records kept ({d['ttl_hours']} h)",
            "memory",
            "primaries for CPU",
            f"primaries for memory ({GB_PER_PRIMARY} GB each)",
        ]
    ]
    size_rows += [
        [
            f"{r['calls_per_s']:,}",
            f"{r['records_kept']:,}",
            f"{r['gb']:.1f} GB",
            str(r["primaries_for_cpu"]),
            str(r["primaries_for_memory"]),
        ]
        for r in d["rows"]
    ]
    single = [SweepPoint(**p) for p in report["sweep_single"]]
    cluster = [SweepPoint(**p) for p in report["sweep_cluster"]]
    return "\n\n".join(
        [
            "# Sizing figures (measured by `python -m benchmarks.sizing`)",
            f"Machine: {report['machine']}. Server: {report['server']}. Every server ran on this machine, "
            "loopback, with its default configuration; the load generator shared the same 2 cores.",
            "## Redis CPU per guarded call (begin + commit), measured",
            _md_table(cpu_rows),
            "## Memory per committed record, measured",
            _md_table(mem_rows),
            "## Throughput and latency as load grows, one server, measured",
            _md_table(sweep_rows(single)),
            "## The same on a 3-primary Cluster, measured",
            _md_table(sweep_rows(cluster)),
            "## Sizing, derived",
            f"At {d['result_bytes']} B results: {d['process_cpu_us_per_call']:.1f} us of server process "
            f"CPU per call, so one primary core serves about {d['calls_per_s_per_primary_core']:,.0f} "
            "guarded calls/s; "
            f"planning at {HEADROOM:.0%} of a core gives {d['planned_calls_per_s_per_primary']:,.0f} per "
            f"primary. A record takes {d['record_bytes']:.0f} B and is kept {d['ttl_hours']} h "
            "(the committed TTL), so memory = rate x TTL x record size. The primaries needed are the larger "
            "of the two columns; each replica holds a full copy of its primary's records.",
            _md_table(size_rows),
            *_modes_markdown(report),
        ]
    )


def _modes_markdown(report: dict[str, Any]) -> list[str]:
    rows = by_mode(report)
    if not rows:
        return []
    table = [
        [
            "mode (`airlock-redis bench` options)",
            "one server: peak calls/s (processes, p99 ms)",
            "Redis process CPU us/call there",
            "calls/s per primary core (derived)",
            "3-primary Cluster: peak calls/s (processes, p99 ms)",
        ]
    ]
    for row in rows:
        single, cluster = row.get("single"), row.get("cluster")
        table.append(
            [
                f"{row['mode']} (`{row['options']}`)",
                f"{single['calls_per_s']:,.0f} ({single['processes']}, {single['p99_ms']:.1f})"
                if single
                else "-",
                f"{single['server_cpu_us_per_call']:.1f}"
                if single and single["server_cpu_us_per_call"]
                else "-",
                f"{row['calls_per_s_per_primary_core']:,.0f}"
                if "calls_per_s_per_primary_core" in row
                else "-",
                f"{cluster['calls_per_s']:,.0f} ({cluster['processes']}, {cluster['p99_ms']:.1f})"
                if cluster
                else "-",
            ]
        )
    out = ["## By mode, measured (200 B results)", _md_table(table)]
    for name, topologies in report["modes"].items():
        for topology, points in topologies.items():
            out += [f"### {name}, {topology}", _md_table(sweep_rows([SweepPoint(**p) for p in points]))]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sizing"), help="path stem")
    parser.add_argument("--calls", type=int, default=4000, help="calls per CPU measurement (default 4000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per sweep point (default 5)")
    parser.add_argument("--from-json", type=Path, help="only redo the derived table and text from a report")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"modes to sweep, comma-separated, from: {'; '.join(MODES)} (default: all; '' for none)",
    )
    parser.add_argument(
        "--mode-processes",
        default=",".join(map(str, MODE_PROCESSES)),
        help="process counts of the per-mode sweeps (default %(default)s)",
    )
    parser.add_argument(
        "--only-modes", action="store_true", help="measure only the per-mode sweeps (no CPU by size, memory)"
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"no such mode: {unknown}; the modes: {list(MODES)}")
    mode_counts = tuple(int(n) for n in args.mode_processes.split(",") if n.strip())
    if args.from_json is not None:
        saved: dict[str, Any] = json.loads(args.from_json.read_text(encoding="utf-8"))
        if "cpu_by_result_size" in saved:
            saved["derived"] = derived(saved["cpu_by_result_size"], saved["memory_by_result_size"])
        Path(f"{args.out}.json").write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
        Path(f"{args.out}.md").write_text(markdown(saved) + "\n", encoding="utf-8")
        return 0
    from tests.topologies import ClusterTopology  # the harness that starts a local Cluster

    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "server": find_redis_server(),
        "mode_processes": list(mode_counts),
    }
    found: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in modes}
    with EmbeddedRedis(unix_socket=False) as server:
        if not args.only_modes:
            print("measuring CPU per call by result size", file=sys.stderr)
            report["cpu_by_result_size"] = cpu_by_result_size(server.url, args.calls)
            print("sweeping load on one server", file=sys.stderr)
            report["sweep_single"] = sweep_on(
                server.url, args.seconds, "one server", Path(f"{args.out}-single.png")
            )
        for name, points in sweep_modes(server.url, args.seconds, "one server", modes, mode_counts).items():
            found[name]["single"] = points
    if not args.only_modes:
        print("measuring memory per record", file=sys.stderr)
        rows = record_memory.measure(list(RESULT_SIZES), 200, False)["rows"]
        report["memory_by_result_size"] = {
            str(row["size"]): {"record": row["record"], "beyond": row["beyond"]} for row in rows
        }
    with ClusterTopology(primaries=3, replicas=0) as cluster:
        if not args.only_modes:
            print("sweeping load on a 3-primary cluster", file=sys.stderr)
            report["sweep_cluster"] = sweep_on(
                cluster.url, args.seconds, "3-primary Cluster", Path(f"{args.out}-cluster.png")
            )
        for name, points in sweep_modes(
            cluster.url, args.seconds, "3-primary Cluster", modes, mode_counts
        ).items():
            found[name]["cluster"] = points
    report["modes"] = found
    if not args.only_modes:
        report["derived"] = derived(report["cpu_by_result_size"], report["memory_by_result_size"])
    Path(f"{args.out}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    text = markdown(report)
    Path(f"{args.out}.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
