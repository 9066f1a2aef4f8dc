"""One exit-code table for every command, and a line that says the truth, as real ``python -m
airlock_redis`` subprocesses:

- a Redis the command cannot use is exit 2 in every command (doctor: unsafe, 2 as well), one line that
  names the URL without its password: no answer, "authentication failed", "not allowed" (NOPERM),
  and a Cluster node behind a plain ``redis://`` URL ("use redis+cluster://"), which served only the
  calls whose slot it holds;
- ``resolve --release`` of a committed record (the call took effect) is refused without
  ``--force-release-committed`` (exit 2, one line, nothing changed); with it, the question says so;
- ``resolve`` that went through is one line on stdout and nothing on stderr;
- ``--version`` prints the version and exits 0; ``--help`` shows the table.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context
from airlock_redis.embedded import EmbeddedRedis, free_port

from .conftest import require_redis_server
from .procs import PROJECT_ROOT, child_env, explain, one_line

pytestmark = pytest.mark.redis_server

TIMEOUT = 120
NS = "codes"
PASSWORD = "s3cret-pw"  # the default user's, on the module's server
READER_PASSWORD = "r3ader-pw"  # a user that may scan the namespace but read none of its keys

ARGV: dict[str, list[str]] = {
    "demo": ["demo"],
    "bench": ["bench", "--calls", "1", "--processes", "1", "--quiet"],
    "inspect": ["inspect", "call-1"],
    "list": ["list"],
    "resolve": ["resolve", "call-1", "--release", "--yes"],
    "audit": ["audit"],
    "doctor": ["doctor", "--timeout", "2"],
}
OPERATOR = ("inspect", "list", "resolve", "audit")


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedRedis]:
    require_redis_server()
    with EmbeddedRedis(unix_socket=False) as started:
        with started.client() as admin:
            admin.config_set("requirepass", PASSWORD)  # after start: EmbeddedRedis waits for a PING
        yield started


def url_of(server: EmbeddedRedis, userinfo: str = f":{PASSWORD}") -> str:
    return f"redis://{userinfo}@127.0.0.1:{server.port}/0"


@pytest.fixture
def client(server: EmbeddedRedis) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(url_of(server), socket_timeout=10) as opened:
        opened.flushall()
        opened.acl_setuser(
            "reader",
            enabled=True,
            passwords=[f"+{READER_PASSWORD}"],
            commands=["+@all"],
            keys=["other:*"],
            reset=True,
        )
        yield opened
        opened.acl_deluser("reader")


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "airlock_redis", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=PROJECT_ROOT,
        env=child_env(),
    )
    for stream in (done.stdout, done.stderr):
        assert "Traceback" not in stream, explain(done)
    return done


def contents(client: redis.Redis) -> dict[bytes, bytes | None]:
    return {key: client.dump(key) for key in sorted(client.scan_iter(count=1000))}


def committed_call(url: str, tool_call_id: str, runs: list[int]) -> None:
    """A charge that ran and took effect: its record is committed in NS."""
    store = RedisEffectStore(url, namespace=NS)
    guard = EffectGuard(store=store)

    @guard.wrap
    def charge(account: str, cents: int) -> dict[str, int]:
        runs.append(cents)
        return {"cents": cents}

    with tool_call_context(tool_call_id):
        charge("acct_1", 500)
    store.close()


def lost_call(url: str, tool_call_id: str) -> None:
    """A charge whose answer was lost: its record is left unknown in NS."""
    store = RedisEffectStore(url, namespace=NS)
    guard = EffectGuard(store=store)

    @guard.wrap
    def charge(account: str, cents: int) -> None:
        raise TimeoutError("the answer was lost")

    with tool_call_context(tool_call_id), pytest.raises(TimeoutError):
        charge("acct_1", 500)
    store.close()


# -- a Redis the command cannot use: exit 2, one line naming the URL without its password ---------------
@pytest.mark.parametrize("command", list(ARGV))
def test_authentication_failed(server: EmbeddedRedis, client: redis.Redis, command: str) -> None:
    done = cli(*ARGV[command], "--namespace", NS, "--url", url_of(server, ":wrong-pw"))
    assert done.returncode == 2, explain(done)
    where = f"redis://127.0.0.1:{server.port}/0"
    text = done.stdout if command == "doctor" else one_line(done.stderr)
    assert f"authentication failed at {where}" in text, explain(done)
    assert "did not answer" not in text and "wrong-pw" not in done.stdout + done.stderr
    if command != "doctor":
        assert done.stdout == ""
    assert contents(client) == {}


@pytest.mark.parametrize("command", list(ARGV))
def test_no_password_at_all(server: EmbeddedRedis, client: redis.Redis, command: str) -> None:
    done = cli(*ARGV[command], "--namespace", NS, "--url", f"redis://127.0.0.1:{server.port}/0")
    assert done.returncode == 2, explain(done)
    text = done.stdout if command == "doctor" else one_line(done.stderr)
    assert f"authentication failed at redis://127.0.0.1:{server.port}/0" in text, explain(done)
    assert contents(client) == {}


@pytest.mark.parametrize("command", OPERATOR)
def test_not_allowed(server: EmbeddedRedis, client: redis.Redis, command: str) -> None:
    lost_call(url_of(server), "call-1")
    before = contents(client)
    done = cli(*ARGV[command], "--namespace", NS, "--url", url_of(server, f"reader:{READER_PASSWORD}"))
    assert done.returncode == 2, explain(done)
    line = one_line(done.stderr)
    assert f"not allowed at redis://reader@127.0.0.1:{server.port}/0" in line, line
    assert "NoPermissionError" in line and READER_PASSWORD not in line
    assert done.stdout == ""
    assert contents(client) == before


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_not_allowed_to_write_the_records(server: EmbeddedRedis, client: redis.Redis, command: str) -> None:
    """Found before the run starts (doctor's probes, which write nothing): not a worker's traceback
    (demo), nor a run whose every call is refused as store_unavailable, exit 0 (bench)."""
    done = cli(*ARGV[command], "--url", url_of(server, f"reader:{READER_PASSWORD}"))
    assert done.returncode == 2, explain(done)
    line = one_line(done.stderr)
    assert f"not allowed at redis://reader@127.0.0.1:{server.port}/0: the Redis user may not use" in line
    assert READER_PASSWORD not in line and done.stdout == ""
    assert contents(client) == {}


@pytest.mark.parametrize("command", list(ARGV))
def test_no_answer(client: redis.Redis, command: str) -> None:
    port = free_port()
    done = cli(*ARGV[command], "--namespace", NS, "--url", f"redis://u:pw-{port}@127.0.0.1:{port}/0")
    assert done.returncode == 2, explain(done)
    text = done.stdout if command == "doctor" else one_line(done.stderr)
    assert f"redis://u@127.0.0.1:{port}/0 does not answer" in text, explain(done)
    assert "Connection refused" in text and f"pw-{port}" not in done.stdout + done.stderr
    assert contents(client) == {}


@pytest.mark.parametrize("command", list(ARGV))
def test_an_unreachable_sentinel_is_one_short_line(client: redis.Redis, command: str) -> None:
    port = free_port()
    done = cli(*ARGV[command], "--namespace", NS, "--url", f"redis+sentinel://u:pw@127.0.0.1:{port}/mymaster")
    assert done.returncode == 2, explain(done)
    text = done.stdout if command == "doctor" else one_line(done.stderr)
    assert f"redis+sentinel://u@127.0.0.1:{port}/mymaster does not answer" in text, explain(done)
    assert "ConnectionPool" not in text and len(text) < 400, text
    assert contents(client) == {}


# -- a Cluster node behind a plain redis:// URL ------------------------------------------------------------
def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is a port, and free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 <= 65535:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise AssertionError("no free port pair for a cluster node")


@pytest.fixture(scope="module")
def cluster_node() -> Iterator[EmbeddedRedis]:
    """One node with --cluster-enabled yes: a plain URL to it serves only the slots it holds."""
    require_redis_server()
    with EmbeddedRedis(
        port=cluster_port(), unix_socket=False, extra_args=["--cluster-enabled", "yes"]
    ) as node:
        with node.client() as admin:
            admin.execute_command("CLUSTER", "ADDSLOTS", *range(0, 100))
        yield node


@pytest.mark.parametrize("command", [c for c in ARGV if c != "doctor"])
def test_a_cluster_node_behind_a_plain_url(cluster_node: EmbeddedRedis, command: str) -> None:
    done = cli(*ARGV[command], "--namespace", NS, "--url", cluster_node.url)
    assert done.returncode == 2, explain(done)
    line = one_line(done.stderr)
    assert f"{cluster_node.url} is a node of a Redis Cluster" in line, line
    assert "use redis+cluster://" in line
    assert done.stdout == ""
    with cluster_node.client() as node:
        assert node.dbsize() == 0


def test_doctor_on_a_cluster_node_behind_a_plain_url(cluster_node: EmbeddedRedis) -> None:
    done = cli("doctor", "--url", cluster_node.url, "--timeout", "2")
    assert done.returncode == 2, explain(done)
    assert "the server is a Cluster node but the URL is not redis+cluster://" in done.stdout
    with cluster_node.client() as node:
        assert node.dbsize() == 0


# -- resolve --release of a committed record ---------------------------------------------------------------
def test_release_of_a_committed_record_is_refused_without_the_flag(
    server: EmbeddedRedis, client: redis.Redis
) -> None:
    runs: list[int] = []
    committed_call(url_of(server), "call_abc123", runs)
    before = contents(client)
    for stdin in (None, "y\n"):  # --yes, and an operator who answers y: both refused
        extra = ["--yes"] if stdin is None else []
        done = cli(
            "resolve",
            "call_abc123",
            "--release",
            *extra,
            "--namespace",
            NS,
            "--url",
            url_of(server),
            stdin=stdin,
        )
        assert done.returncode == 2, explain(done)
        line = one_line(done.stderr)
        assert "'call_abc123' is committed: the call took effect" in line, line
        assert "--force-release-committed" in line
        assert done.stdout == ""
        assert contents(client) == before  # the record, and no audit entry
    committed_call(url_of(server), "call_abc123", runs)
    assert runs == [500]  # the retry replays: the tool did not run again


def test_release_of_a_committed_record_with_the_flag_says_the_call_took_effect(
    server: EmbeddedRedis, client: redis.Redis
) -> None:
    runs: list[int] = []
    committed_call(url_of(server), "call_abc123", runs)
    argv = ["resolve", "call_abc123", "--release", "--force-release-committed", "--namespace", NS]
    declined = cli(*argv, "--url", url_of(server), stdin="n\n")
    assert declined.returncode == 4, explain(declined)
    question = declined.stderr.split("[y/N]", 1)[0].splitlines()[-1]
    assert "It is COMMITTED: the call took effect" in question, question
    assert client.exists(*client.scan_iter(match=f"{NS}:{{*")) == 1
    done = cli(*argv, "--url", url_of(server), stdin="y\n")
    assert done.returncode == 0, explain(done)
    assert done.stdout == "'call_abc123': release -> ok\n"
    committed_call(url_of(server), "call_abc123", runs)
    assert runs == [500, 500]  # released: the call ran (and took effect) again, as the question said
    assert client.xlen(f"{NS}:audit") == 1


# -- resolve is quiet on success --------------------------------------------------------------------
@pytest.mark.parametrize("verdict", ["--release", "--unknown", "--committed"])
def test_resolve_is_one_line_on_stdout_and_nothing_on_stderr(
    server: EmbeddedRedis, client: redis.Redis, verdict: str
) -> None:
    lost_call(url_of(server), "call-1")
    done = cli("resolve", "call-1", verdict, "--yes", "--namespace", NS, "--url", url_of(server))
    assert done.returncode == 0, explain(done)
    note = ""
    if verdict == "--committed":
        note = " (no --value: replays of this call are refused as result_not_stored)"
    assert done.stdout == f"'call-1': {verdict[2:]} -> ok{note}\n"
    assert done.stderr == ""
    assert client.xlen(f"{NS}:audit") == 1  # the verdict is audited all the same


# -- --version and --help ---------------------------------------------------------------------------
def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0, explain(done)
    assert done.stdout == f"airlock-redis {importlib.metadata.version('airlock-redis')}\n"
    assert done.stderr == ""


def test_help_shows_one_table() -> None:
    done = cli("--help")
    assert done.returncode == 0, explain(done)
    table = " ".join(done.stdout.split("exit codes (every command):", 1)[1].split())
    for part in ("0 ok", "1 the command ran and found a problem", "2 it could not run", "130 interrupted"):
        assert part in table, table
    assert "141 the reader of its output went away" in table


# -- no redis-server to start ------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["demo", "bench"])
def test_no_redis_server_and_no_fakeredis(tmp_path: Path, command: str) -> None:
    hidden = tmp_path / "fakeredis"  # an import of fakeredis fails, as on a machine without it
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('fakeredis is not installed')\n")
    done = subprocess.run(
        [sys.executable, "-m", "airlock_redis", *ARGV[command]],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=PROJECT_ROOT,
        env=child_env(
            AIRLOCK_REDIS_SERVER=str(tmp_path / "no-such-redis-server"),
            PYTHONPATH=os.pathsep.join((str(tmp_path), str(PROJECT_ROOT))),
        ),
    )
    assert done.returncode == 2, explain(done)
    assert "no redis-server on this machine" in one_line(done.stderr), explain(done)
    assert done.stdout == ""


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_a_redis_server_that_does_not_start(tmp_path: Path, command: str) -> None:
    broken = tmp_path / "redis-server"
    broken.write_text("#!/bin/sh\necho 'this is no redis-server' >&2\nexit 3\n")
    broken.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "airlock_redis", *ARGV[command]],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=PROJECT_ROOT,
        env=child_env(AIRLOCK_REDIS_SERVER=str(broken), TMPDIR=str(tmp_path)),
    )
    assert done.returncode == 2, explain(done)
    assert "the private redis-server did not start" in one_line(done.stderr), explain(done)
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["redis-server"]  # its folder was removed
