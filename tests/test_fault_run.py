"""A short seeded fault run per topology (single server, Sentinel, Cluster): the CI form of
``python -m benchmarks.fault_run`` (tests/fault_run.py; docs/faults.md, "The fault run").

Two spawned workers make guarded calls while the seeded nemesis draws faults from the topology's menu;
then the checker (tests/history_checker.py) reads the whole history and the final records and must
find no violation. The seed is ``$AIRLOCK_FAULT_SEED`` when set, else a fresh one; it is printed, and
a failure's message holds it, the violations with their timelines, where the history and the server
logs were saved (under pytest's temporary folder), and the command that replays the fault schedule.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from .fault_run import TOPOLOGIES, RunConfig, run, seed_from_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

SECONDS = {"single": 18.0, "sentinel": 18.0, "cluster": 16.0}  # of faults; each run takes 25-40 s


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_fault_run(topology: str, tmp_path: Path) -> None:
    seed = seed_from_env()
    if seed is None:
        seed = random.SystemRandom().randrange(1, 2**31)
    print(f"\n[fault-run] {topology}: seed {seed} (AIRLOCK_FAULT_SEED={seed} replays its fault schedule)")
    result = run(RunConfig(topology=topology, seconds=SECONDS[topology], seed=seed, results=tmp_path))
    print(result.summary(), flush=True)
    assert result.ok, f"seed {seed}: {result.summary()}"
    assert result.faults, f"seed {seed}: the nemesis drew no fault"
    assert result.verdict.counts["executions"] > 0, f"seed {seed}: no tool ran"
