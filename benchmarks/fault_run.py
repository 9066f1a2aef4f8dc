"""The fault run, long form: a randomized run with a seeded nemesis and a checker (tests/fault_run.py).

    python -m benchmarks.fault_run --topology sentinel --minutes 5
    python -m benchmarks.fault_run --topology cluster --minutes 3 --seed 12345 --results /tmp/fault-runs
    python -m benchmarks.fault_run --check /tmp/fault-runs/cluster-seed12345-20261204-120000

Workers make guarded calls (sync and async; irreversible, costly and reversible tools; with and
without ``wait_replicas``) while the nemesis draws faults from the topology's menu, each one healed
with the harness's safe restore before the next; the checker then reads the whole history and the
final records (docs/faults.md#the-fault-run says what it checks). ``--runs N`` repeats with seeds
``S, S+1, ...``. A failing run prints its seed, violations and timelines, and its history (JSON lines),
records, verdict and server logs are saved under ``--results`` (default: a new temporary folder). The
server binary is ``$AIRLOCK_REDIS_SERVER`` (as for the tests). Exit status 1 when any run found a
violation or could not heal its deployment.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root is what imports resolve against
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import history_checker
from tests.fault_run import MENUS, TOPOLOGIES, RunConfig, RunResult, fault_schedule, run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topology", choices=TOPOLOGIES)
    parser.add_argument("--check", type=Path, metavar="DIR", help="check a saved run again (no servers)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="minutes of faults per run (default 1)")
    length.add_argument("--seconds", type=float, help="seconds of faults per run")
    parser.add_argument("--seed", type=int, help="the run's seed (default: a fresh one, printed)")
    parser.add_argument("--runs", type=int, default=1, help="runs one after the other, seeds S, S+1, ...")
    parser.add_argument("--workers", type=int, default=3, help="workload processes (default 3)")
    parser.add_argument("--results", type=Path, help="folder for failing runs (default: a temporary one)")
    parser.add_argument("--save-always", action="store_true", help="save every run, not only failing ones")
    parser.add_argument("--faults", default="", help="comma-separated faults to draw from (default: all)")
    parser.add_argument("--json", type=Path, help="append each run's counts to this file (JSON lines)")
    args = parser.parse_args(argv)
    if args.check is None and args.topology is None:
        parser.error("--topology is required (or --check DIR)")
    seconds = args.seconds if args.seconds is not None else 60.0 * (args.minutes or 1.0)
    if not 5 <= seconds <= 4 * 3600 or not 1 <= args.runs <= 1000 or not 1 <= args.workers <= 8:
        parser.error("a run lasts 5 s to 4 h; --runs takes 1..1000 and --workers 1..8")
    args.fault_seconds = seconds
    return args


def counts(result: RunResult) -> dict[str, Any]:
    verdict = result.verdict
    return {
        "topology": result.config.topology,
        "server": result.server,
        "seed": result.seed,
        "seconds": round(result.seconds),
        **verdict.counts,
        "violations": verdict.by_rule(),
        "documented": verdict.by_rule(documented=True),
        "documented_why": dict(
            Counter(f"{v.rule}: {v.excuse.split(':')[1].strip()}" for v in verdict.documented)
        ),
        "harness_error": result.harness_error,
        "saved": str(result.saved) if result.saved else "",
    }


def check_saved(folder: Path) -> int:
    """The checker again on a saved run's history.jsonl and records.json."""
    events = history_checker.read_history(folder / "history.jsonl")
    records = json.loads((folder / "records.json").read_text())
    verdict = history_checker.check(events, records)
    print(verdict.report(limit=1000))
    return 0 if verdict.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check is not None:
        return check_saved(args.check)
    results = args.results  # None: a failing run is saved in a new temporary folder (tests/fault_run.py)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    only = tuple(f for f in args.faults.split(",") if f)
    unknown = set(only) - set(MENUS[args.topology])
    if unknown:
        print(
            f"no such faults for {args.topology}: {sorted(unknown)}; "
            f"its menu: {', '.join(MENUS[args.topology])}"
        )
        return 2
    failed = 0
    for i in range(args.runs):
        config = RunConfig(
            topology=args.topology,
            seconds=args.fault_seconds,
            seed=seed + i,
            workers=args.workers,
            results=results,
            save_always=args.save_always,
            faults=only,
        )
        print(
            f"[{time.strftime('%H:%M:%S')}] fault run {i + 1}/{args.runs}: {args.topology} seed {seed + i}",
            flush=True,
        )
        print(
            f"  its fault schedule begins: {', '.join(fault_schedule(args.topology, seed + i, 12, only))}",
            flush=True,
        )
        result = run(config)
        print(result.summary(), flush=True)
        if args.json is not None:
            with args.json.open("a") as out:
                out.write(json.dumps(counts(result)) + "\n")
        failed += not result.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
