"""``airlock-redis resolve`` on a running record (issue 25, design section 6).

A pending record whose lease is renewed within the lease belongs to an attempt that is alive and
inside its tool. Any verdict on it fences that attempt off (its commit is refused as superseded while
its tool may still take effect): ``resolve`` refuses it (exit 2) unless ``--even-if-running`` is
given, and then warns. Abandoned records (the lease lapsed) and pending records without a lease are
resolved as before.
"""

from __future__ import annotations

import io
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from airlock_redis import EffectGuard, RedisEffectStore, Status
from airlock_redis.cli import main
from airlock_redis.core.records import BeginRequest
from airlock_redis.embedded import EmbeddedRedis

from .topo_helpers import fresh_id
from .topologies import wait_until

pytestmark = pytest.mark.redis_server

LEASE_MS = 60_000


@pytest.fixture
def store(redis_server: EmbeddedRedis) -> Any:
    store = RedisEffectStore(redis_server.url, namespace=f"resolve-running:{fresh_id()}")
    yield store
    store.close()


def begin(store: RedisEffectStore, tool_call_id: str, lease_ms: int | None = LEASE_MS) -> BeginRequest:
    request = BeginRequest(tool_call_id, "k" * 64, "charge", "a" * 32, False, lease_ms)
    store.begin(request)
    return request


def cli(
    store: RedisEffectStore, args: list[str], capsys: pytest.CaptureFixture[str], stdin: str = ""
) -> tuple[int, str, str]:
    target = ["--url", store.url or "", "--namespace", store.namespace]
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        code = main([*args[:2], *target, *args[2:]])
    finally:
        sys.stdin = old
    out, err = capsys.readouterr()
    return code, out, err


def test_a_running_record_is_refused_without_even_if_running(
    store: RedisEffectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tool_call_id = fresh_id("running")
    begin(store, tool_call_id)
    audit = tmp_path / "audit.jsonl"
    for verdict in ("--unknown", "--release", "--committed"):
        code, out, err = cli(
            store, ["resolve", tool_call_id, verdict, "--yes", "--audit-log", str(audit)], capsys
        )
        assert code == 2 and out == "", (code, out, err)
        assert "RUNNING" in err and "fences off an attempt that is working" in err
        assert "--even-if-running" in err and f"airlock-redis inspect {tool_call_id}" in err
    record = store.get(tool_call_id)
    assert record is not None and record.status is Status.PENDING and record.owner == "a" * 32
    assert record.liveness == "running"
    assert not audit.exists()  # nothing was done, so nothing was audited


def test_even_if_running_resolves_it_with_a_warning_and_audits_it(
    store: RedisEffectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tool_call_id = fresh_id("forced")
    begin(store, tool_call_id)
    audit = tmp_path / "audit.jsonl"
    code, out, err = cli(
        store,
        ["resolve", tool_call_id, "--unknown", "--yes", "--even-if-running", "--audit-log", str(audit)],
        capsys,
    )
    assert code == 0 and "unknown -> ok" in out
    assert err.startswith("warning: ") and "RUNNING" in err and "fences off" in err
    record = store.get(tool_call_id)
    assert record is not None and record.status is Status.UNKNOWN
    (entry,) = [json.loads(line) for line in audit.read_text().splitlines()]
    assert entry["before"]["status"] == "pending" and entry["before"]["liveness"] == "running"


def test_the_question_says_it_is_running(
    store: RedisEffectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tool_call_id = fresh_id("asked")
    begin(store, tool_call_id)
    log = ["--audit-log", str(tmp_path / "a.jsonl")]
    code, _, err = cli(
        store, ["resolve", tool_call_id, "--release", "--even-if-running", *log], capsys, "n\n"
    )
    assert code == 4 and "It is RUNNING: this fences off an attempt that is working. [y/N]" in err
    assert store.get(tool_call_id) is not None
    code, _, err = cli(
        store, ["resolve", tool_call_id, "--release", "--even-if-running", *log], capsys, "y\n"
    )
    assert code == 0 and store.get(tool_call_id) is None


def test_abandoned_and_unleased_records_resolve_as_before(
    store: RedisEffectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    abandoned, unleased = fresh_id("abandoned"), fresh_id("unleased")
    begin(store, abandoned)
    key = store.key(abandoned)
    store.client.pexpire(key, store.client.pttl(key) - LEASE_MS - 5_000)  # not renewed for 65 s
    assert store.get(abandoned).liveness == "abandoned"  # type: ignore[union-attr]
    begin(store, unleased, lease_ms=None)
    log = ["--audit-log", str(tmp_path / "a.jsonl"), "--yes"]
    for tool_call_id in (abandoned, unleased):
        code, _, err = cli(store, ["resolve", tool_call_id, "--unknown", *log], capsys)
        assert (code, err) == (0, ""), err
        assert store.get(tool_call_id).status is Status.UNKNOWN  # type: ignore[union-attr]


def test_resolving_a_guarded_call_that_runs_fences_it_off(
    store: RedisEffectStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real attempt under a lease the keeper renews: refused; with --even-if-running the verdict
    lands, the attempt's lease is lost and its commit fenced off when its tool ends."""
    tool_call_id = fresh_id("guarded")
    guard = EffectGuard(store=store, lease=1.5, renew_every=0.5, wait_for_running=0)
    started, go, result = threading.Event(), threading.Event(), []

    def charge(cents: int) -> str:
        started.set()
        assert go.wait(30)
        return "charged"

    worker = threading.Thread(target=lambda: result.append(guard.call(tool_call_id, charge, 5)))
    worker.start()
    try:
        assert started.wait(10)
        log = ["--audit-log", str(tmp_path / "a.jsonl"), "--yes"]
        assert cli(store, ["resolve", tool_call_id, "--unknown", *log], capsys)[0] == 2
        code, _, err = cli(store, ["resolve", tool_call_id, "--unknown", "--even-if-running", *log], capsys)
        assert code == 0 and "warning" in err
        record = store.get(tool_call_id)
        assert record is not None and record.status is Status.UNKNOWN
        # the keeper's next renewal finds the record no longer the attempt's
        wait_until("the lease lost", lambda: "lost its lease" in caplog.text, 10)
    finally:
        go.set()
        worker.join(30)
    assert result == ["charged"]  # the attempt's caller gets its own value...
    record = store.get(tool_call_id)
    assert record is not None and record.status is Status.UNKNOWN  # ...and its commit was fenced off
