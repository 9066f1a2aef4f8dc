"""A command line that cannot run is refused before anything starts: one line on stderr, exit 2, and
nothing written to Redis (or to disk), as real ``python -m airlock_redis`` subprocesses.

- ``doctor --timeout``: not a finite number of seconds in (0, 3600] (``-1`` was a ValueError, ``1e308``
  an OverflowError, both a traceback and exit 1, which reads as "warnings");
- ``bench``: a --plot file that is no image, a --json or --plot in a folder that does not exist,
  a --duration or --calls that would never end, bounds on processes, threads and values (each of
  these ran the whole bench, or ran until killed);
- ``--namespace`` that the store does not take, in every command (``demo --namespace 'x*'`` was a
  traceback from a worker process).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from airlock_redis.embedded import EmbeddedRedis

from .conftest import require_redis_server
from .procs import PROJECT_ROOT, child_env, explain, one_line

pytestmark = pytest.mark.redis_server

TIMEOUT = 60


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedRedis]:
    require_redis_server()
    with EmbeddedRedis(unix_socket=False) as started:
        yield started


@pytest.fixture
def client(server: EmbeddedRedis) -> Iterator[redis.Redis]:
    with server.client() as opened:
        opened.flushall()
        yield opened


def cli(*args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airlock_redis", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=cwd,
        env=child_env(),
    )


def refused(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 2, explain(done)
    assert says in one_line(done.stderr), explain(done)
    assert done.stdout == "", explain(done)


@pytest.mark.parametrize(
    ("timeout", "says"),
    [
        ("-1", "must be more than 0"),
        ("0", "must be more than 0"),
        ("1e308", "at most 3600 seconds, not 1e308"),
        ("inf", "not inf"),
        ("nan", "not nan"),
        ("soon", "not a number of seconds: 'soon'"),
    ],
)
def test_doctor_timeout_out_of_bounds(
    server: EmbeddedRedis, client: redis.Redis, timeout: str, says: str
) -> None:
    done = cli("doctor", "--url", server.url, "--timeout", timeout)
    refused(done, "argument --timeout: ")
    assert says in done.stderr
    assert client.dbsize() == 0


def test_doctor_timeout_in_bounds_still_checks(server: EmbeddedRedis, client: redis.Redis) -> None:
    done = cli("doctor", "--url", server.url, "--timeout", "2.5")
    assert done.returncode in (0, 1), explain(done)  # healthy, or warnings (no persistence)
    assert "result:" in done.stdout and done.stderr == "", explain(done)
    assert client.dbsize() == 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--plot", "x.txt"], "--plot x.txt: the file name must end with an image format"),
        (["--plot", "/nonexistent/dir/x.png"], "--plot /nonexistent/dir/x.png: no folder '/nonexistent/dir'"),
        (
            ["--json", "/nonexistent/dir/x.json"],
            "--json /nonexistent/dir/x.json: no folder '/nonexistent/dir'",
        ),
        (["--json", "/"], "--json /: is a folder"),
        (
            ["--duration", "inf"],
            "argument --duration: must be more than 0 and at most 86400 seconds, not inf",
        ),
        (
            ["--duration", "nan"],
            "argument --duration: must be more than 0 and at most 86400 seconds, not nan",
        ),
        (["--duration", "1e300"], "not 1e300"),
        (["--duration", "0"], "not 0"),
        (["--calls", "99999999999999999999"], "argument --calls: must be 1,000,000,000 or less"),
        (["--calls", "0"], "argument --calls: must be 1 or more, not 0"),
        (["--processes", "100000"], "argument --processes: must be 256 or less"),
        (["--concurrency", "100000"], "argument --concurrency: must be 1,024 or less"),
        (["--value-bytes", "99999999999"], "argument --value-bytes: must be 67,108,864 or less"),
        (["--sweep", "1,9999"], "--sweep: at most 256 processes, not 9999"),
        (["--duplicate-rate", "nan"], "duplicate_rate must be in [0, 1)"),
    ],
)
def test_bench_refuses_before_it_starts(
    server: EmbeddedRedis, client: redis.Redis, tmp_path: Path, argv: list[str], says: str
) -> None:
    done = cli("bench", "--url", server.url, "--quiet", *argv, cwd=tmp_path)
    refused(done, says)
    assert client.dbsize() == 0
    assert list(tmp_path.iterdir()) == []  # no file written


@pytest.mark.parametrize("command", ["demo", "bench", "list", "inspect", "resolve", "audit", "doctor"])
@pytest.mark.parametrize("namespace", ["x*", "a?b", "{x}", ""])
def test_a_namespace_the_store_does_not_take(
    server: EmbeddedRedis, client: redis.Redis, command: str, namespace: str
) -> None:
    argv = {
        "inspect": ["inspect", "call-1"],
        "resolve": ["resolve", "call-1", "--release", "--yes"],
        "bench": ["bench", "--calls", "1", "--quiet"],
    }.get(command, [command])
    done = cli(*argv, "--url", server.url, "--namespace", namespace)
    refused(done, "argument --namespace: the namespace")
    assert client.dbsize() == 0
