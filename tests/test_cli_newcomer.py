"""A newcomer's first hour with ``airlock-redis``, as real ``python -m airlock_redis`` subprocesses
against a real redis-server of this module's own (emptied before each test, so "nothing was left"
means an empty server):

- a command that cannot serve its input says so in one line, exits with its documented code (2 for
  bad input and for a Redis that does not answer, in every command; 1 for a missing record) and
  writes nothing;
- ``demo | head -2`` ends quietly, and every key the demo writes expires;
- ``bench --help`` shows every default; bench draws progress only on a terminal;
- every command's ``--help`` ends with its exit codes.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator

import pytest
import redis

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context
from airlock_redis.cli import COMMANDS, bench_cmd
from airlock_redis.cli.demo_cmd import _clean, _replica_step, _scenario
from airlock_redis.embedded import EmbeddedRedis, free_port

from .conftest import require_redis_server
from .procs import PROJECT_ROOT, child_env, cli_into_head, explain, one_line

pytestmark = pytest.mark.redis_server

TIMEOUT = 240
NS = "newcomer"


# -- one redis-server for the module, empty at the start of every test ----------------------------
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


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "airlock_redis", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=PROJECT_ROOT,
        env=child_env(COLUMNS="120"),
    )
    for stream in (done.stdout, done.stderr):
        assert "Traceback" not in stream and "Exception ignored" not in stream, explain(done)
    return done


def keys(client: redis.Redis) -> list[bytes]:
    return sorted(client.scan_iter(count=1000))


def contents(client: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key and its value, serialized (DUMP), whatever its type."""
    return {key: client.dump(key) for key in keys(client)}


def lose_a_call(url: str, tool_call_id: str) -> None:
    """A charge whose answer was lost: its record is left unknown in NS."""
    guard = EffectGuard(store=RedisEffectStore(url, namespace=NS))

    @guard.wrap
    def charge(account: str, cents: int) -> None:
        raise TimeoutError("the answer was lost")

    with tool_call_context(tool_call_id), pytest.raises(TimeoutError):
        charge("acct_1", 500)


# every command, with arguments that would otherwise run it
ARGV: dict[str, list[str]] = {
    "demo": ["demo"],
    "bench": ["bench", "--calls", "1", "--processes", "1", "--quiet"],
    "inspect": ["inspect", "call-1"],
    "list": ["list"],
    "resolve": ["resolve", "call-1", "--release", "--yes"],
    "audit": ["audit"],
}


def test_every_command_is_covered() -> None:
    assert set(ARGV) | {"doctor"} == set(COMMANDS)


# -- a URL no store takes, a Redis that does not answer ---------------------------------------------
@pytest.mark.parametrize("command", list(ARGV))
def test_a_url_scheme_no_store_takes_is_one_line_and_exit_2(
    server: EmbeddedRedis, client: redis.Redis, command: str
) -> None:
    done = cli(*ARGV[command], "--namespace", NS, "--url", f"http://127.0.0.1:{server.port}/0")
    assert done.returncode == 2, explain(done)
    assert "unsupported Redis URL scheme 'http://'" in one_line(done.stderr)
    assert done.stdout == ""
    assert keys(client) == []


def test_doctor_on_a_url_scheme_no_store_takes_is_unsafe(server: EmbeddedRedis, client: redis.Redis) -> None:
    done = cli("doctor", "--url", f"http://127.0.0.1:{server.port}/0")
    assert done.returncode == 2, explain(done)
    assert "bad URL: unsupported Redis URL scheme" in done.stdout
    assert keys(client) == []


@pytest.mark.parametrize("command", list(ARGV))
def test_a_redis_that_does_not_answer_is_one_line(client: redis.Redis, command: str) -> None:
    done = cli(*ARGV[command], "--namespace", NS, "--url", f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 2, explain(done)  # one table: a Redis it cannot use is 2 everywhere
    assert "Connection refused" in one_line(done.stderr)
    assert done.stdout == ""
    assert keys(client) == []


def test_doctor_on_a_redis_that_does_not_answer_is_unsafe() -> None:
    done = cli("doctor", "--url", f"redis://127.0.0.1:{free_port()}/0", "--timeout", "2")
    assert done.returncode == 2, explain(done)
    assert "no answer from Redis" in done.stdout


# -- bad input is 2, a missing record is 1 ----------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["list", "--older-than", "10"], "give it a unit"),
        (["list", "--older-than", "soon"], "not a duration"),
        (["list", "--limit", "0"], "must be 1 or more"),
        (["list", "--cursor", "nonsense"], "not a cursor from a previous list"),
        (["list", "--cursor", "9:0:0"], "not a cursor from a previous list of this deployment"),
        (["list", "--cursor", "0:-1:0"], "not a cursor from a previous list"),
        (["inspect", "   "], "the tool_call_id is blank"),
        (["inspect", ""], "the tool_call_id is empty"),
        (["inspect", "call-1", "--preview-chars", "-1"], "must be 0 or more"),
        (["resolve", "\t", "--release", "--yes"], "the tool_call_id is blank"),
        (["resolve", "call-1", "--yes"], "one of the arguments --committed --release --unknown is required"),
        (["audit", "--limit", "many"], "not a whole number"),
        (["bench", "--processes", "0"], "must be 1 or more"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    server: EmbeddedRedis, client: redis.Redis, argv: list[str], says: str
) -> None:
    lose_a_call(server.url, "call-1")
    before = keys(client)
    done = cli(*argv, "--namespace", NS, "--url", server.url)
    assert done.returncode == 2, explain(done)
    line = one_line(done.stderr)
    assert says in line and "--help" in line, line
    assert done.stdout == ""
    assert keys(client) == before  # the record, and no audit stream


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--release", "--value", "1"], "--committed only"),
        (["--committed", "--value", "{not json"], "not valid JSON"),
    ],
)
def test_resolve_with_bad_input_changes_nothing_and_audits_nothing(
    server: EmbeddedRedis, client: redis.Redis, extra: list[str], says: str
) -> None:
    lose_a_call(server.url, "call-1")
    before = contents(client)
    done = cli("resolve", "call-1", *extra, "--yes", "--namespace", NS, "--url", server.url)
    assert done.returncode == 2, explain(done)
    assert says in one_line(done.stderr)
    assert contents(client) == before


@pytest.mark.parametrize("argv", [["inspect", "call-2"], ["resolve", "call-2", "--release", "--yes"]])
def test_a_missing_record_is_one_line_and_exit_1(
    server: EmbeddedRedis, client: redis.Redis, argv: list[str]
) -> None:
    lose_a_call(server.url, "call-1")
    before = keys(client)
    done = cli(*argv, "--namespace", NS, "--url", server.url)
    assert done.returncode == 1, explain(done)
    assert "no record for tool_call_id 'call-2'" in one_line(done.stderr)
    assert keys(client) == before


def test_a_verdict_goes_to_the_audit_stream_and_audit_shows_it(
    server: EmbeddedRedis, client: redis.Redis
) -> None:
    lose_a_call(server.url, "call-1")
    done = cli("resolve", "call-1", "--release", "--yes", "--namespace", NS, "--url", server.url)
    assert done.returncode == 0, explain(done)
    shown = cli("audit", "--json", "--namespace", NS, "--url", server.url)
    assert shown.returncode == 0, explain(shown)
    entries = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(e["tool_call_id"], e["verdict"], e["result"]) for e in entries] == [("call-1", "release", "ok")]
    assert client.xlen(f"{NS}:audit") == 1


# -- every --help ends with the exit codes --------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_lists_the_exit_codes(command: str) -> None:
    done = cli(command, "--help")
    assert done.returncode == 0, explain(done)
    epilog = " ".join(done.stdout.split("exit codes:", 1)[1].split())
    assert re.search(r"\b0 \w", epilog) and re.search(r"\b2 \w", epilog), epilog
    if command in ("inspect", "resolve"):  # a script can tell bad input from a missing record
        assert "1 no such record" in epilog and "2 bad arguments" in epilog, epilog


# -- bench: --help shows every default; progress only on a terminal -------------------------------------
def test_bench_help_shows_every_default() -> None:
    done = cli("bench", "--help")
    assert done.returncode == 0, explain(done)
    options = done.stdout.split("options:", 1)[1].split("exit codes:", 1)[0]
    blocks: dict[str, str] = {}  # option -> its help text
    name = ""
    for line in options.splitlines():
        if not line.strip():
            continue
        starts = re.match(r"^  (?:-\w, )?(--[\w-]+)", line)
        if starts:
            name = starts.group(1)
        blocks[name] = blocks.get(name, "") + " " + line.strip()
    parser = argparse.ArgumentParser()
    bench_cmd.add_arguments(parser)
    expected = {a.option_strings[-1] for a in parser._actions if a.option_strings} - {"--help"}
    assert set(blocks) - {"--help"} == expected
    for option in expected:
        assert "(default" in blocks[option], f"{option} shows no default: {blocks[option]}"
    shown = " ".join(options.split())
    assert "(default: 4, or the CPU count if smaller" in shown
    assert "(default: 8)" in shown and "(default: 6, unless --calls is given)" in shown


def bench_argv(server: EmbeddedRedis) -> list[str]:
    return ["-m", "airlock_redis", "bench", "--url", server.url, "--calls", "200", "--processes", "1"]


def test_bench_draws_no_progress_into_a_pipe(server: EmbeddedRedis, client: redis.Redis) -> None:
    done = cli(*bench_argv(server)[2:])
    assert done.returncode == 0, explain(done)
    assert "\r" not in done.stderr and "\x1b" not in done.stderr, repr(done.stderr)
    assert "\x1b" not in done.stdout
    # the figures stay plain "name  value" lines a script can read
    figures = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in done.stdout.splitlines())
    assert figures["guarded calls"].startswith("200 in ")
    assert figures["duplicate executions"] == "0  (ok)"


def test_bench_draws_progress_and_a_table_on_a_terminal(server: EmbeddedRedis, client: redis.Redis) -> None:
    primary, secondary = os.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    drawn = bytearray()

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(
            [sys.executable, *bench_argv(server)],
            stdin=subprocess.DEVNULL,
            stdout=secondary,
            stderr=secondary,
            cwd=PROJECT_ROOT,
            env=child_env(),
        )
        os.close(secondary)
        assert proc.wait(timeout=TIMEOUT) == 0
        reader.join(timeout=30)
    finally:
        os.close(primary)
    text = drawn.decode("utf-8", errors="replace")
    assert "Traceback" not in text, text
    assert "\r" in text and "100%" in text, text  # the bar, redrawn in place
    assert "airlock-redis bench" in text and "│" in text and "duplicate executions" in text, text


# -- demo: quiet when its reader goes away, and every key it writes expires ----------------------------
def test_demo_into_head_ends_quietly_and_leaves_no_key_without_a_ttl(
    server: EmbeddedRedis, client: redis.Redis
) -> None:
    shown, errors, code = cli_into_head(["demo", "--url", server.url, "--namespace", NS], 2, TIMEOUT)
    assert shown[0].startswith(f"Redis: {server.url}")
    assert len(shown) == 2
    assert errors == "", errors
    assert code == 141  # the reader went away, as a shell reports it for a Unix tool
    without_ttl = [key for key in keys(client) if client.ttl(key) <= 0]
    assert without_ttl == []
    assert keys(client) == []  # the run removed its keys before it ended


def test_every_key_the_demo_writes_expires(server: EmbeddedRedis, client: redis.Redis) -> None:
    """A run killed after any step leaves only keys that expire: the records and the counters."""
    namespace = f"{NS}:demo:steps"
    for step in _scenario():
        _replica_step(server.url, namespace, step)
        written = keys(client)
        assert written, step
        ttls = {key: client.ttl(key) for key in written}
        assert all(ttl > 0 for ttl in ttls.values()), (step, ttls)
    assert any(b":executions:" in key for key in keys(client))  # the counters were among them
    _clean(server.url, namespace)
    assert keys(client) == []
