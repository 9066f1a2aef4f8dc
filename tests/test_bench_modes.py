"""``airlock-redis bench --mode``: the asyncio mode (coroutines on one event loop per process, with or
without the store's auto-pipelining) runs the same guarded calls and checks as the threads mode, the
report says which modes ran (write-behind and lease too) and what the duplicates that waited for a
running attempt got, and ``--sweep-concurrency`` runs once per concurrency level. Each run is
a ``python -m airlock_redis bench`` against its own private redis-server, with tiny counts; nothing
here asserts on speed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airlock_redis.loadgen.stats import BenchSummary, WorkerReport

from .conftest import require_redis_server
from .test_cli_bad_input import cli


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m airlock_redis bench --quiet ...`` from the source tree."""
    done = cli("bench", "--quiet", *args)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def asyncio_run(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], str]:
    """A 200-call asyncio run of 16 coroutines in one process: its JSON figures and its stdout."""
    require_redis_server()
    out = tmp_path / "bench.json"
    argv = ["--mode", "asyncio", "--calls", "200", "--processes", "1", "--concurrency", "16"]
    done = bench(*argv, *extra, "--json", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stdout


@pytest.mark.redis_server
@pytest.mark.slow  # worker processes, as the bench smoke tests
@pytest.mark.parametrize(("extra", "pipelined"), [((), True), (("--no-auto-pipeline",), False)])
def test_asyncio_mode_makes_every_call_and_says_so(
    tmp_path: Path, extra: tuple[str, ...], pipelined: bool
) -> None:
    figures, printed = asyncio_run(tmp_path, *extra)
    assert figures["mode"] == "asyncio" and figures["auto_pipeline"] is pipelined
    assert figures["config"]["mode"] == "asyncio" and figures["config"]["auto_pipeline"] is pipelined
    assert figures["calls"] == 200 and figures["duplicate_executions"] == 0
    assert figures["verdict"] == "ok" and figures["error_count"] == 0
    # the same tallies as the threads mode: every call ran, replayed or was refused; retries happened
    assert figures["executed"] + figures["replayed"] + figures["refused"] == 200
    assert 0 < figures["unique_calls"] < 200 and figures["executions"] == figures["executed"]
    assert sum(count for _, count in figures["histogram"]["buckets"]) == 200
    lines = dict(line.split(None, 1) for line in printed.splitlines() if line.startswith(("mode", "auto_")))
    assert lines == {"mode": "asyncio", "auto_pipeline": str(pipelined).lower()}


@pytest.mark.redis_server
@pytest.mark.slow
def test_threads_mode_reports_auto_pipelining_as_not_applicable(tmp_path: Path) -> None:
    require_redis_server()
    out = tmp_path / "bench.json"
    done = bench("--calls", "20", "--processes", "1", "--concurrency", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["mode"] == "threads" and figures["auto_pipeline"] is None
    assert figures["calls"] == 20 and figures["duplicate_executions"] == 0
    assert "auto_pipeline                 not applicable" in done.stdout


def test_no_auto_pipeline_is_refused_in_threads_mode() -> None:
    """Blocking calls are always sent one by one: the option would change nothing, so it is refused
    before anything starts (no server needed)."""
    done = bench("--no-auto-pipeline", "--calls", "1", "--processes", "1")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--no-auto-pipeline applies to --mode asyncio only" in done.stderr


def test_sweep_concurrency_and_sweep_exclude_each_other() -> None:
    done = bench("--sweep", "1,2", "--sweep-concurrency", "1,8", "--calls", "1")
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


@pytest.mark.parametrize(
    ("levels", "says"),
    [
        ("1,x", "--sweep-concurrency takes concurrency levels"),
        ("0,4", "takes positive"),
        ("1,5000", "at most"),
    ],
)
def test_sweep_concurrency_refuses_what_is_not_a_list_of_levels(levels: str, says: str) -> None:
    done = bench("--sweep-concurrency", levels, "--calls", "1")
    assert done.returncode == 2 and says in done.stderr, done.stderr


@pytest.mark.redis_server
@pytest.mark.slow
def test_sweep_concurrency_runs_once_per_level(tmp_path: Path) -> None:
    """--sweep-concurrency 1,8: two runs, the process count fixed; the JSON has both points and says
    what was swept and in which mode; the plot is drawn against concurrency."""
    require_redis_server()
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    argv = ["--mode", "asyncio", "--sweep-concurrency", "1,8", "--processes", "1", "--calls", "80"]
    done = bench(*argv, "--value-bytes", "16", "--json", str(out), "--plot", str(png))
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["sweep"] == "concurrency"
    assert figures["mode"] == "asyncio" and figures["auto_pipeline"] is True
    points = figures["points"]
    assert [(p["processes"], p["concurrency"]) for p in points] == [(1, 1), (1, 8)]
    for point in points:
        assert point["calls"] == 80 and point["duplicate_executions"] == 0
        assert point["calls_per_s"] > 0 and 0 < point["p50_ms"] <= point["p99_ms"]
        assert point["mode"] == "asyncio" and point["auto_pipeline"] is True
    assert "processes x coroutines" in done.stdout and "p99 ms" in done.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_without_a_mode_is_the_threads_mode() -> None:
    """A summary whose configuration names no mode (an older caller's) reads as threads."""
    summary = BenchSummary({}, "t", 1.0, WorkerReport(), set(), None, 0, 0)
    assert summary.mode == "threads" and summary.auto_pipeline is None
    assert summary.to_json()["auto_pipeline"] is None
    assert dict(summary.rows())["auto_pipeline"].startswith("not applicable")


@pytest.mark.redis_server
@pytest.mark.slow
def test_write_behind_and_waits_are_reported(tmp_path: Path) -> None:
    """--write-behind with many duplicates: the report names every mode that ran, counts the duplicate
    calls, and says what the ones that waited for a running attempt got (how many wait depends on
    timing: only the arithmetic is checked)."""
    figures, printed = asyncio_run(tmp_path, "--write-behind", "--duplicate-rate", "0.5")
    assert figures["write_behind"] is True and figures["lease"] is True
    assert figures["config"]["write_behind"] is True
    assert figures["calls"] == 200 and figures["duplicate_executions"] == 0
    assert 0 < figures["duplicates"] < 200
    assert figures["executed"] + figures["replayed"] + figures["refused"] == 200
    waited = figures["waited"]
    assert waited["total"] == waited["replayed"] + waited["refused_in_progress"] + waited["other"]
    assert waited["total"] == sum(waited["by_outcome"].values()) <= figures["duplicates"]
    lines = dict(line.split(None, 1) for line in printed.splitlines() if line.startswith(("write_", "lease")))
    assert lines == {"write_behind": "on", "lease": "on"}
    assert "duplicate calls" in printed and "waited for a running attempt" in printed


@pytest.mark.redis_server
@pytest.mark.slow
def test_no_lease_is_reported_and_nothing_waits(tmp_path: Path) -> None:
    require_redis_server()
    out = tmp_path / "bench.json"
    argv = ["--calls", "40", "--processes", "1", "--concurrency", "2", "--no-lease", "--json", str(out)]
    done = bench(*argv)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["lease"] is False and figures["write_behind"] is False
    assert figures["waited"]["total"] == 0  # without a lease a duplicate never waits
    assert "(threads, write-behind off, lease off)" in done.stderr


def test_waits_are_tallied_by_what_the_call_got() -> None:
    """What the report makes of the lanes' tallies (no server)."""
    report = WorkerReport(calls=10, duplicates=4)
    report.waits.update({"replayed": 2, "refused:effect_in_progress": 1, "error:TimeoutError": 1})
    summary = BenchSummary({"write_behind": True}, "t", 1.0, report, set(), None, 0, 0)
    assert summary.waited() == {"total": 4, "replayed": 2, "refused_in_progress": 1, "other": 1}
    rows = dict(summary.rows())
    assert rows["write_behind"] == "on" and rows["lease"] == "on"  # lease: the guard's default
    assert rows["waited for a running attempt"] == (
        "4 (replayed 2, refused effect_in_progress 1, other 1: error:TimeoutError 1)"
    )
    assert summary.to_json()["waited"]["by_outcome"]["replayed"] == 2
