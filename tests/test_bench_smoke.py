"""Smoke tests of the load benchmark and the comparison harness: they run with tiny counts and
produce every figure. Nothing here asserts on speed."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airlock_redis.cli import main as cli_main
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.loadgen.histogram import Histogram
from airlock_redis.loadgen.stats import BenchSummary, PrimaryLoad, WorkerReport
from benchmarks import compare

from .conftest import require_redis_server

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

BENCH_FIGURES = {
    "calls",
    "calls_per_s",
    "latency",
    "executed",
    "replayed",
    "refusals",
    "refused",
    "errors",
    "error_count",
    "unique_calls",
    "executions",
    "duplicate_executions",
    "reversible_reruns",
    "records",
    "memory_per_record_bytes",
    "memory_sampled_records",
    "primaries",
    "histogram",
    "throughput",
    "verdict",
    "config",
    "elapsed_s",
    "target",
    "mode",
    "auto_pipeline",
    "write_behind",
    "lease",
    "duplicates",
    "waited",
}


def test_bench_cli_runs_and_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_redis_server()
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    code = cli_main(
        [
            "bench",
            "--processes",
            "2",
            "--concurrency",
            "2",
            "--calls",
            "200",
            "--duplicate-rate",
            "0.4",
            "--value-bytes",
            "32",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    figures = json.loads(out.read_text())
    assert set(figures) >= BENCH_FIGURES
    assert figures["calls"] == 200
    assert figures["mode"] == "threads" and figures["auto_pipeline"] is None  # threads: not applicable
    assert figures["write_behind"] is False and figures["lease"] is True  # the defaults
    assert 0 < figures["duplicates"] < 200 and figures["waited"]["total"] <= figures["duplicates"]
    assert figures["duplicate_executions"] == 0
    assert figures["verdict"] == "ok"
    assert figures["error_count"] == 0
    # every call either ran, replayed or was refused; retries made unique ids fewer than calls
    assert figures["executed"] + figures["replayed"] + figures["refused"] == 200
    assert 0 < figures["unique_calls"] < 200
    assert figures["executions"] == figures["executed"]
    assert figures["executions"] - figures["reversible_reruns"] <= figures["unique_calls"]
    assert figures["records"] > 0 and figures["memory_per_record_bytes"] > 0
    # the scripts ran on the server: time inside commands and process CPU, per guarded call
    assert figures["server_us_per_call"] > 0 and figures["server_cpu_us_per_call"] > 0
    assert "Redis CPU per call" in printed.out
    for name in ("p50_us", "p95_us", "p99_us", "max_us"):
        assert figures["latency"][name] > 0
    assert figures["latency"]["p50_us"] <= figures["latency"]["p99_us"] <= figures["latency"]["max_us"]
    assert sum(count for _, count in figures["histogram"]["buckets"]) == 200
    assert figures["throughput"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "duplicate executions" in printed.out and "guarded calls/s" in printed.out
    assert "\r" not in printed.err  # not a terminal: no progress bar (a terminal: test_cli_newcomer)


def test_bench_reports_duplicate_executions_as_failure() -> None:
    """The verdict logic: two executions of one irreversible call fail the run; a reversible re-run
    does not."""
    report = WorkerReport(calls=3, executed=3)
    report.ids = {"r-0-1", "r-0-2"}
    report.runs.update({"r-0-1": 2, "r-0-2": 1})
    summary = BenchSummary({}, "t", 1.0, report, set(), None, 0, 2)
    assert summary.duplicate_executions == 1 and summary.failed
    assert summary.to_json()["verdict"].startswith("FAILURE")
    allowed = BenchSummary({}, "t", 1.0, report, {"r-0-1"}, None, 0, 2)
    assert allowed.duplicate_executions == 0 and allowed.reversible_reruns == 1 and not allowed.failed


def test_bench_table_shows_the_load_of_each_primary() -> None:
    """On a Cluster the report has a line per primary: calls (with their share), records, memory."""
    report = WorkerReport(calls=4, executed=4)
    loads = [PrimaryLoad("10.0.0.1:7000", 3, 3, 1290.4, 3), PrimaryLoad("10.0.0.2:7000", 1, 1, None, 0)]
    summary = BenchSummary({}, "t", 1.0, report, set(), 1290.4, 3, 4, loads)
    table = summary.table()
    assert "primary 10.0.0.1:7000" in table and "3 calls (75%), 3 records, 1290 B/record (3 sampled)" in table
    assert "1 calls (25%), 1 records, memory n/a" in table
    assert summary.to_json()["primaries"][0] == {
        "node": "10.0.0.1:7000",
        "calls": 3,
        "records": 3,
        "memory_per_record_bytes": 1290.4,
        "memory_sampled_records": 3,
    }
    assert "primary " not in BenchSummary({}, "t", 1.0, report, set(), None, 0, 0).table()


def test_histogram_percentiles_within_a_bucket() -> None:
    h = Histogram()
    for us in range(1, 1001):
        h.record(us / 1e6)
    assert h.total == 1000 and h.max_us == pytest.approx(1000.0)
    assert h.percentile_us(50) == pytest.approx(500, rel=0.02)
    assert h.percentile_us(99) == pytest.approx(990, rel=0.02)
    other = Histogram()
    other.record(0.005)
    h.merge(other)
    assert h.total == 1001 and h.percentile_us(100) == pytest.approx(5000.0)


def test_bench_cli_refuses_cluster_flag_without_cluster_url(capsys: pytest.CaptureFixture[str]) -> None:
    """--cluster changes nothing (the URL's scheme decides), but a URL that names no Cluster
    contradicts it: refused before anything runs."""
    assert cli_main(["bench", "--cluster", "--url", "redis://127.0.0.1:1/0", "--calls", "1"]) == 2
    err = capsys.readouterr().err
    assert "redis+cluster://" in err and "the scheme decides" in err


def test_compare_harness_runs_and_writes_every_figure(tmp_path: Path) -> None:
    require_redis_server()
    out = tmp_path / "tiny.json"
    code = compare.main(
        [
            "--json",
            str(out),
            "--calls",
            "20",
            "--repeats",
            "2",
            "--warmup",
            "5",
            "--race-attempts",
            "40",
            "--race-processes",
            "2",
        ]
    )
    assert code == 0
    report: dict[str, Any] = json.loads(out.read_text())
    rows = report["measurements"]["rows"]
    assert set(rows) == set(compare.ROWS)
    for row in rows.values():
        assert len(row["rounds_us"]) == 2 and all(v > 0 for v in row["rounds_us"])
    for ratio in report["measurements"]["ratios"].values():
        assert math.isfinite(ratio["median"]) and ratio["median"] > 0
    race = report["race"]
    assert race["executions"] == 1 and race["ok"] and race["errors"] == 0
    assert race["executed"] == 1
    assert race["executed"] + race["replayed"] + race["refused"] == 40
    for key in ("cpu", "cores", "python", "redis_server", "redis_py"):
        assert report["machine"][key]
    summary = out.with_suffix(".md").read_text()
    assert "guard_redis/floor" in summary and "Racing duplicates" in summary


def _recording_tool(runs: list[int]) -> Callable[[int], dict[str, int]]:
    def pay(cents: int) -> dict[str, int]:
        runs.append(cents)
        return {"cents": cents}

    return pay


def test_rival_stores_keep_the_replay_table_on_a_real_server(redis_server: EmbeddedRedis) -> None:
    """The reference rivals must behave like stores, or the comparison is meaningless."""
    from airlock_redis import EffectGuard, tool_call_context
    from benchmarks.rivals import PowertoolsStyleStore, WatchMultiStore

    for store_class in (WatchMultiStore, PowertoolsStyleStore):
        client = redis_server.client()
        guard = EffectGuard(store=store_class(client, f"rival:{store_class.__name__}"))
        runs: list[int] = []
        pay = guard.wrap(_recording_tool(runs), name="pay")

        with tool_call_context("call-1"):
            first = pay(5)
        with tool_call_context("call-1"):
            second = pay(5)
        assert first == second == {"cents": 5}
        assert runs == [5], store_class.__name__
        client.close()


def test_server_cpu_counts_the_calls_commands_and_not_the_bench_s_own() -> None:
    from airlock_redis.loadgen.server_cpu import ServerCpu, command_us, per_call

    stats = {
        "cmdstat_evalsha": {"calls": 10, "usec": 300},
        "cmdstat_script|load": {"calls": 1, "usec": 20},
        "cmdstat_info": {"calls": 4, "usec": 400},
        "cmdstat_scan": {"calls": 2, "usec": 50},
        "cmdstat_memory|usage": {"calls": 9, "usec": 90},
    }
    assert command_us(stats) == 320
    spent = ServerCpu(1320.0, 0.5) - ServerCpu(1000.0, 0.25)
    assert per_call(spent, 10) == (32.0, 25000.0)
    assert per_call(spent, 0) == (None, None)


def test_bench_sweep_runs_once_per_process_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--sweep: one full run per process count, each point with throughput, latency, server CPU and
    memory per record; a table on stdout, every point in the JSON, a PNG against processes."""
    require_redis_server()
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    argv = ["bench", "--sweep", "1,2", "--concurrency", "2", "--calls", "120", "--value-bytes", "16"]
    assert cli_main([*argv, "--json", str(out), "--plot", str(png)]) == 0
    figures = json.loads(out.read_text())
    assert figures["sweep"] == "processes" and figures["mode"] == "threads"
    points = figures["points"]
    assert [p["processes"] for p in points] == [1, 2]
    for point in points:
        assert point["calls"] == 120 and point["duplicate_executions"] == 0
        assert point["calls_per_s"] > 0 and 0 < point["p50_ms"] <= point["p99_ms"]
        assert point["server_us_per_call"] > 0 and point["memory_per_record_bytes"] > 0
    printed = capsys.readouterr()
    assert "calls/s" in printed.out and "p99 ms" in printed.out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("sweep", ["1,x", "0,2", ","])
def test_bench_sweep_refuses_what_is_not_a_list_of_process_counts(
    sweep: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["bench", "--sweep", sweep, "--calls", "1"]) == 2
    assert "--sweep takes" in capsys.readouterr().err


def test_sizing_derives_primaries_and_memory_from_the_measured_figures() -> None:
    """benchmarks/sizing.py: calls/s per primary = 1 / CPU per call at half a core; memory = rate x
    TTL x record size."""
    from benchmarks import sizing

    cpu = [{"result_bytes": 200, "server_cpu_us_per_call": 50.0, "server_us_per_call": 20.0}]
    memory = {"200": {"record": 400.0, "beyond": 96.0}}
    d = sizing.derived(cpu, memory)
    assert d["calls_per_s_per_primary_core"] == 20_000 and d["planned_calls_per_s_per_primary"] == 10_000
    by_rate = {row["calls_per_s"]: row for row in d["rows"]}
    assert by_rate[1_000]["records_kept"] == 1_000 * 24 * 3600
    assert math.isclose(by_rate[1_000]["gb"], 1_000 * 24 * 3600 * 400 / 1e9)
    assert [by_rate[r]["primaries_for_cpu"] for r in (100, 1_000, 10_000)] == [1, 1, 1]
    assert (
        sizing.derived([{**cpu[0], "server_cpu_us_per_call": 500.0}], memory)["rows"][2]["primaries_for_cpu"]
        == 10
    )
