"""The async benchmark runs end to end with tiny counts and writes its figures (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_redis_server

pytestmark = pytest.mark.redis_server

ROOT = Path(__file__).resolve().parent.parent


def test_bench_async_produces_figures_for_each_level(tmp_path: Path) -> None:
    require_redis_server()
    out = tmp_path / "figures.json"
    command = [sys.executable, "-m", "benchmarks.bench_async", "--calls", "20", "--rounds", "1"]
    command += ["--warmup", "5", "--levels", "1", "4", "--json", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "guarded/floor" in done.stdout
    figures = json.loads(out.read_text())
    assert [level["concurrency"] for level in figures["levels"]] == [1, 4]
    assert figures["redis_server"][:1].isdigit()  # the version of the server it measured
    machine = figures["machine"]  # where it ran: ratios differ between machines
    assert machine["redis_server"] == figures["redis_server"] and machine["transport"] == "unix socket"
    assert machine["cores"] >= 1 and machine["cpu"] and machine["kernel"] and machine["redis_py"]
    for level in figures["levels"]:
        assert level["calls"] == 20
        assert level["floor_calls_per_s"] > 0 and level["guarded_calls_per_s"] > 0
        assert level["ratio"] == pytest.approx(level["guarded_calls_per_s"] / level["floor_calls_per_s"])
        assert level["unpipelined_calls_per_s"] > 0  # the store with auto_pipeline=False, beside it
        ratio = level["unpipelined_calls_per_s"] / level["floor_calls_per_s"]
        assert level["unpipelined_ratio"] == pytest.approx(ratio)
        assert level["floor_cpu_us"] > 0 and level["guarded_cpu_us"] > 0  # this process's CPU per call
    assert done.stdout.count("client CPU per call at") == 2  # a line per level


def test_bench_async_rejects_a_non_positive_count() -> None:
    command = [sys.executable, "-m", "benchmarks.bench_async", "--calls", "0"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "must be positive" in done.stderr
