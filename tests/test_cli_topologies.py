"""Every command of ``airlock-redis`` takes every URL the store takes: each one runs here as a real
``python -m airlock_redis`` subprocess against the shared 3-primary Cluster (through one seed node and
through several) and the shared Sentinel setup (through the sentinel URL). Where a command cannot serve
a URL (a scheme nobody takes, ``bench --cluster`` with a URL that names no Cluster, a Redis that does
not answer) it says so in one line and exits with its documented code; never with a traceback."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context
from airlock_redis.redaction import redact
from airlock_redis.stores.url import primary_clients, sync_client

from .procs import PROJECT_ROOT, child_env, explain, one_line
from .topologies import HOST, free_ports, shared_cluster, shared_sentinel

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

TIMEOUT = 240
FORMS = ("cluster-one-host", "cluster-several-hosts", "sentinel")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "airlock_redis", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=PROJECT_ROOT,
        env=child_env(),
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert "Traceback" not in done.stdout, done.stdout
    return done


@pytest.fixture(params=FORMS)
def url(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> str:
    if request.param == "sentinel":
        return shared_sentinel(pytestconfig).url
    cluster = shared_cluster(pytestconfig)
    if request.param == "cluster-one-host":
        return f"redis+cluster://{HOST}:{cluster.nodes[0].port}"
    assert cluster.url.count(",") == 2  # several seed nodes
    return cluster.url


@pytest.fixture
def ns(url: str) -> Iterator[str]:
    """A fresh namespace; whatever is left under it is removed from every primary afterwards."""
    name = f"cli-topo:{secrets.token_hex(4)}"
    yield name
    leftovers(url, name, remove=True)


def leftovers(url: str, ns: str, *, remove: bool = False) -> list[bytes]:
    client = sync_client(url)
    found: list[bytes] = []
    try:
        for _, node in primary_clients(client):
            for key in node.scan_iter(match=f"{ns}:*"):
                found.append(key)
                if remove:
                    node.unlink(key)
    finally:
        client.close()
    return found


def test_demo(url: str, ns: str) -> None:
    done = cli("demo", "--url", url, "--namespace", ns)
    assert done.returncode == 0, explain(done)
    assert f"Redis: {redact(url)}" in done.stdout
    topology = "a Redis Cluster" if url.startswith("redis+cluster") else "Redis Sentinel"
    assert topology in done.stdout
    assert "every irreversible call ran at most once" in done.stdout, explain(done)
    assert "executions: charge 2" in done.stdout and "read_balance 2" in done.stdout
    assert leftovers(url, ns) == []  # the demo removed its records and counters


def test_bench(url: str, ns: str, tmp_path: Path) -> None:
    calls = 45
    out = tmp_path / "bench.json"
    # the several-hosts form with --cluster (the old command line), the others without it
    old_flag = ["--cluster"] if url.count(",") and url.startswith("redis+cluster") else []
    done = cli(
        "bench", "--url", url, *old_flag, "--namespace", ns, "--calls", str(calls),
        "--processes", "1", "--concurrency", "2", "--value-bytes", "64", "--quiet", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, explain(done)
    figures = json.loads(out.read_text())
    assert figures["calls"] == calls and figures["error_count"] == 0, explain(done)
    assert figures["duplicate_executions"] == 0 and figures["verdict"] == "ok"
    assert figures["records"] > 0 and figures["memory_per_record_bytes"] > 0
    primaries = figures["primaries"]
    if url.startswith("redis+cluster"):
        assert figures["config"]["cluster"] is True
        assert len(primaries) == 3, primaries
        assert sum(p["calls"] for p in primaries) == calls
        assert sum(p["records"] for p in primaries) == figures["records"]
        for load in primaries:  # 45 calls over 16384 slots: every primary gets some
            assert load["calls"] > 0 and load["records"] > 0, primaries
            assert load["memory_per_record_bytes"] > 0
            assert 0 < load["memory_sampled_records"] <= load["records"]
            assert f"primary {load['node']}" in done.stdout
    else:
        assert primaries == [] and "primary " not in done.stdout
    assert leftovers(url, ns) == []  # the run removed its records


def test_doctor(url: str) -> None:
    done = cli("doctor", "--url", url, "--timeout", "5")
    assert done.returncode in (0, 1), explain(done)  # 1: warnings (no persistence on the test servers)
    assert "[unsafe]" not in done.stdout and "result:" in done.stdout, explain(done)
    if url.startswith("redis+cluster"):
        assert "cluster: state ok, 16384 slots served by 3 primaries" in done.stdout, explain(done)
    else:
        assert "(named by the sentinels)" in done.stdout, explain(done)


def make_unknown_record(url: str, ns: str, tool_call_id: str) -> None:
    """A charge whose answer was lost: its record stays ``unknown`` until an operator resolves it."""
    store = RedisEffectStore(url, namespace=ns)
    guard = EffectGuard(store=store)

    @guard.wrap
    def charge(account: str) -> str:
        raise TimeoutError("the payment API's answer was lost")

    with tool_call_context(tool_call_id), pytest.raises(TimeoutError):
        charge("acct_1")
    store.close()


def test_list_inspect_resolve_audit(url: str, ns: str, tmp_path: Path) -> None:
    tool_call_id = f"call-{secrets.token_hex(3)}"
    make_unknown_record(url, ns, tool_call_id)
    target = ["--url", url, "--namespace", ns]

    listed = cli("list", *target, "--status", "unknown", "--json")
    assert listed.returncode == 0, explain(listed)
    (record,) = json.loads(listed.stdout)["records"]
    assert record["tool_call_id"] == tool_call_id and record["tool"] == "charge"

    shown = cli("inspect", tool_call_id, *target)
    assert shown.returncode == 0, explain(shown)
    assert "status           unknown" in shown.stdout and "charge" in shown.stdout

    resolved = cli(
        "resolve", tool_call_id, *target, "--release", "--yes", "--audit-log", str(tmp_path / "a.jsonl")
    )
    assert resolved.returncode == 0, explain(resolved)
    assert f"{tool_call_id!r}: release -> ok" in resolved.stdout

    gone = cli("inspect", tool_call_id, *target)
    assert gone.returncode == 1 and "no record" in one_line(gone.stderr), explain(gone)

    trail = cli("audit", *target)
    assert trail.returncode == 0 and tool_call_id in trail.stdout, explain(trail)


# -- what a command cannot serve: one line, a documented exit code, no traceback ------------------
def test_bench_cluster_flag_with_a_url_that_names_no_cluster(pytestconfig: pytest.Config) -> None:
    sentinel_url = shared_sentinel(pytestconfig).url
    done = cli("bench", "--cluster", "--url", sentinel_url, "--calls", "1", "--quiet")
    assert done.returncode == 2, explain(done)
    assert "the scheme decides" in one_line(done.stderr)


OPERATOR_COMMANDS: dict[str, list[str]] = {
    "list": ["list"],
    "inspect": ["inspect", "call-1"],
    "resolve": ["resolve", "call-1", "--release", "--yes"],
    "audit": ["audit"],
}
LOAD_COMMANDS: dict[str, list[str]] = {
    "bench": ["bench", "--calls", "1", "--processes", "1", "--quiet"],
    "demo": ["demo"],
}


@pytest.mark.parametrize("command", [*OPERATOR_COMMANDS, *LOAD_COMMANDS])
def test_a_scheme_no_store_takes(command: str) -> None:
    argv = {**OPERATOR_COMMANDS, **LOAD_COMMANDS}[command]
    done = cli(*argv, "--url", "redis+nope://127.0.0.1:1")
    assert done.returncode == 2, explain(done)
    assert "unsupported Redis URL scheme" in one_line(done.stderr)


def test_doctor_on_a_scheme_no_store_takes() -> None:
    done = cli("doctor", "--url", "redis+nope://127.0.0.1:1")
    assert done.returncode == 2, explain(done)
    assert "bad URL: unsupported Redis URL scheme" in done.stdout


@pytest.mark.parametrize("command", [*OPERATOR_COMMANDS, *LOAD_COMMANDS])
def test_a_cluster_that_does_not_answer(command: str) -> None:
    (port,) = free_ports(1)
    argv = {**OPERATOR_COMMANDS, **LOAD_COMMANDS}[command]
    done = cli(*argv, "--url", f"redis+cluster://{HOST}:{port}")
    assert done.returncode == 2, explain(done)  # 2: a Redis the command cannot use
    assert "Redis Cluster cannot be connected" in one_line(done.stderr)


def test_doctor_on_a_cluster_that_does_not_answer() -> None:
    (port,) = free_ports(1)
    done = cli("doctor", "--url", f"redis+cluster://{HOST}:{port}", "--timeout", "2")
    assert done.returncode == 2, explain(done)
    assert "Traceback" not in done.stderr + done.stdout
