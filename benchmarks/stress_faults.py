"""Stress loop for the load-through-a-failover tests (tests/test_faults_load.py): not part of the suite.

Runs the Sentinel and the Cluster load test N times each, one pytest subprocess per run, against the
redis-server (or valkey-server) binary given with ``--server`` (several ``--server`` run one after the
other), optionally with extra CPU contention (``--contention K``: K busy-loop processes, each bounded
in time, alive only while the loop runs). It stops at the first run in which an irreversible or costly
call ran twice (unless ``--keep-going``), when every run is done, or when ``--stop-launching-at``
(HH:MM, UTC) is reached. Each run's summary and, for a failing run, the history of every id that ran
twice (tests/load_history.py) and the pytest output are saved under ``--out``.

    python benchmarks/stress_faults.py --runs 50 --server /usr/bin/redis-server --out /tmp/stress
    python benchmarks/stress_faults.py --runs 10 --contention 1 --topology sentinel --server "$VALKEY"
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = {
    "sentinel": "tests/test_faults_load.py::test_load_through_a_sentinel_failover",
    "cluster": "tests/test_faults_load.py::test_load_through_a_cluster_failover",
}
RUN_TIMEOUT = 400.0  # seconds: a run that takes longer is killed and counted as a failure
CONTENTION_MAX_SECONDS = 6 * 3600.0  # a busy-loop process ends by itself after this, whatever happens


@dataclass
class Tally:
    topology: str
    server: str
    runs: int = 0
    passes: int = 0
    failures: int = 0  # any failing run (once-only ids run twice, or anything else)
    twice: dict[str, int] = field(default_factory=dict)  # "<run>/<id>": executions, once-only ids only
    failed_runs: list[str] = field(default_factory=list)
    seconds: float = 0.0


def server_label(binary: str) -> str:
    """The server's name and version from its --version, e.g. redis-7.0.15 or valkey-8.0.1."""
    try:
        text = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return Path(binary).name
    version = re.search(r"v=(\S+)", text)
    name = "valkey" if "valkey" in text.lower() else "redis"
    return f"{name}-{version.group(1) if version else '?'}"


def busy(deadline: float, parent: int) -> None:
    """Spin until ``deadline`` (monotonic) or until the parent process is gone."""
    while time.monotonic() < deadline and os.getppid() == parent:
        for _ in range(100_000):
            pass


def start_contention(count: int) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    deadline = time.monotonic() + CONTENTION_MAX_SECONDS
    procs = [ctx.Process(target=busy, args=(deadline, os.getpid()), daemon=True) for _ in range(count)]
    for p in procs:
        p.start()
    return procs


def stop_contention(procs: list[Any]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(timeout=10)


def past(stop_at: str | None) -> bool:
    if not stop_at:
        return False
    hour, minute = (int(x) for x in stop_at.split(":"))
    now = datetime.datetime.now(datetime.UTC)
    return (now.hour, now.minute) >= (hour, minute)


def one_run(topology: str, binary: str, folder: Path) -> tuple[bool, dict[str, int], float]:
    """Run one load test; returns (passed, once-only ids run twice, seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "AIRLOCK_REDIS_SERVER": binary,
        "CI": "1",
        "AIRLOCK_LOAD_HISTORY_DIR": str(folder),
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TESTS[topology]]
    output = folder / "pytest-output.txt"  # a file, not a pipe: the run finishes even if this script dies
    t0 = time.monotonic()
    with output.open("w") as sink:
        # its own session: a Ctrl-C here stops the loop after this run instead of killing the run
        # half-way (which would leave its redis-server processes behind)
        child = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            passed = child.wait(timeout=RUN_TIMEOUT) == 0
        except subprocess.TimeoutExpired:
            child.terminate()  # pytest's own teardown stops the topology
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            passed = False
            sink.write(f"\n[stress] timed out after {RUN_TIMEOUT}s\n")
    seconds = time.monotonic() - t0
    twice: dict[str, int] = {}
    for summary in folder.glob("*.summary.json"):
        twice.update(json.loads(summary.read_text()).get("once_only_twice", {}))
    if passed:
        output.unlink()
    return passed, twice, seconds


_STOPPING: list[str] = []


def _stop_after_this_run(signum: int, _frame: object) -> None:
    _STOPPING.append(signal.Signals(signum).name)
    print(f"[stress] {_STOPPING[-1]}: stopping after the run in progress", flush=True)


def table(tallies: list[Tally]) -> str:
    head = (
        f"{'topology':<9} {'server':<15} {'runs':>5} {'passes':>6} {'failures':>8}  once-only ids run twice"
    )
    lines = [head, "-" * len(head)]
    for t in tallies:
        ids = f"{len(t.twice)}" + (f" ({', '.join(sorted(t.twice))})" if t.twice else "")
        lines.append(f"{t.topology:<9} {t.server:<15} {t.runs:>5} {t.passes:>6} {t.failures:>8}  {ids}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="runs per topology and server (default 10)")
    parser.add_argument("--server", action="append", default=[], help="redis-server/valkey-server binary")
    parser.add_argument("--topology", choices=("sentinel", "cluster", "both"), default="both")
    parser.add_argument("--contention", type=int, default=0, help="extra busy-loop processes (default 0)")
    parser.add_argument("--out", type=Path, default=Path("stress-faults-out"), help="folder for results")
    parser.add_argument("--keep-going", action="store_true", help="do not stop at the first failure")
    parser.add_argument("--stop-launching-at", metavar="HH:MM", help="UTC time after which no run starts")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.runs > 1000 or not 0 <= args.contention <= 16:
        parser.error("--runs takes 1..1000 and --contention 0..16")
    return args


def note(tally: Tally, folder: Path, passed: bool, twice: dict[str, int], seconds: float) -> None:
    tally.runs += 1
    tally.seconds += seconds
    tally.passes += passed
    if not passed:
        tally.failures += 1
        tally.failed_runs.append(str(folder))
    for tool_call_id, runs in twice.items():
        tally.twice[f"{folder.name}/{tool_call_id}"] = runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    servers = args.server or [os.environ.get("AIRLOCK_REDIS_SERVER", "/usr/bin/redis-server")]
    topologies = ["sentinel", "cluster"] if args.topology == "both" else [args.topology]
    tallies = [Tally(t, server_label(s)) for s in servers for t in topologies]
    binaries = {(t.topology, t.server): s for s in servers for t in tallies if t.server == server_label(s)}
    args.out.mkdir(parents=True, exist_ok=True)
    contention = start_contention(args.contention) if args.contention else []
    stopped = ""
    signal.signal(signal.SIGINT, _stop_after_this_run)
    signal.signal(signal.SIGTERM, _stop_after_this_run)
    try:
        for n in range(1, args.runs + 1):
            if stopped:
                break
            for tally in tallies:  # interleaved: each topology and server gets its share of the time
                if past(args.stop_launching_at):
                    stopped = f"stopped launching at {args.stop_launching_at} UTC"
                    break
                if _STOPPING:
                    stopped = f"stopped by {_STOPPING[0]}"
                    break
                folder = args.out / tally.server / f"{tally.topology}-{n:03d}"
                passed, twice, seconds = one_run(
                    tally.topology, binaries[tally.topology, tally.server], folder
                )
                note(tally, folder, passed, twice, seconds)
                verdict = "pass" if passed else f"FAIL (once-only run twice: {twice or 'none'}; see {folder})"
                print(
                    f"[{time.strftime('%H:%M:%S')}] {tally.server} {tally.topology} #{n}: {verdict} "
                    f"({seconds:.0f}s)",
                    flush=True,
                )
                if twice and not args.keep_going:
                    stopped = f"stopped at the first once-only id run twice ({folder})"
                    break
    finally:
        stop_contention(contention)
    report = table(tallies)
    print("\n" + report + ("\n" + stopped if stopped else ""), flush=True)
    result: dict[str, Any] = {
        "contention": args.contention,
        "stopped": stopped,
        "tallies": [t.__dict__ for t in tallies],
    }
    (args.out / "summary.json").write_text(json.dumps(result, indent=1))
    (args.out / "summary.txt").write_text(report + "\n")
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
