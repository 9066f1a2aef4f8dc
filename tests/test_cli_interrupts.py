"""Ctrl-C at a terminal, as real ``python -m airlock_redis`` subprocesses: each command runs in a
session of its own, and the test sends SIGINT to its whole process group (``os.killpg``), as a
terminal does, once the run has visibly begun (a line printed, a key written). Then:

- the command exits 130 and prints one line, ``interrupted``, on stderr (no traceback of its own or of
  its worker processes);
- nothing is left: no redis-server of its own, no temporary folder, no semaphore, no key.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
import redis

from airlock_redis.embedded import EmbeddedRedis

from .conftest import require_redis_server
from .procs import PROJECT_ROOT, child_env

pytestmark = pytest.mark.redis_server

TIMEOUT = 120.0
SHM = Path("/dev/shm")


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


class Running:
    """A command in a session of its own; its stdout and stderr read line by line as they come."""

    def __init__(self, argv: list[str], tmp: Path) -> None:
        self.tmp = tmp
        self.process = subprocess.Popen(
            [sys.executable, "-m", "airlock_redis", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=PROJECT_ROOT,
            env=child_env(TMPDIR=str(tmp)),
            start_new_session=True,
        )
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.semaphores: set[str] = set()
        self.arrived: queue.Queue[None] = queue.Queue()
        assert self.process.stdout is not None and self.process.stderr is not None
        self.readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("stdout", self.process.stdout), ("stderr", self.process.stderr))
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, name: str, stream: IO[str]) -> None:
        for line in stream:
            self.lines[name].append(line.rstrip("\n"))
            self.arrived.put(None)
        self.arrived.put(None)

    def wait_for(self, fact: Callable[[], bool], what: str) -> None:
        """Until ``fact()`` holds (checked at each line printed, or every 50 ms for a fact in Redis)."""
        deadline = time.monotonic() + TIMEOUT
        while not fact():
            assert self.process.poll() is None, f"the command ended before {what}: {self.lines}"
            assert time.monotonic() < deadline, f"no {what} within {TIMEOUT} s: {self.lines}"
            with contextlib.suppress(queue.Empty):
                self.arrived.get(timeout=0.05)

    def printed(self, stream: str, start: str) -> Callable[[], bool]:
        return lambda: any(line.startswith(start) for line in self.lines[stream])

    def interrupt(self) -> tuple[int, list[str]]:
        """SIGINT to the whole process group, as a terminal's Ctrl-C: the exit code and the lines
        written on stderr from then on."""
        already = len(self.lines["stderr"])
        self.semaphores = semaphores_of(self.process.pid)  # its session id is its pid
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            code = self.process.wait(timeout=TIMEOUT)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=TIMEOUT)
        for reader in self.readers:  # what the command's children wrote, up to their exit too
            reader.join(timeout=TIMEOUT)
            assert not reader.is_alive(), "a process of the command still holds its output open"
        return code, self.lines["stderr"][already:]

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=TIMEOUT)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[[list[str]], Running]]:
    started: list[Running] = []

    def start(argv: list[str]) -> Running:
        tmp = tmp_path / "tmp"
        tmp.mkdir(exist_ok=True)
        started.append(Running(argv, tmp))
        return started[-1]

    yield start
    for running in started:
        running.kill()


def semaphores_of(session: int) -> set[str]:
    """The multiprocessing semaphores (``/dev/shm/sem.mp-*``) the processes of ``session`` map: the
    command's own, whoever else runs tests on the machine."""
    names = {p.name for p in SHM.glob("sem.mp-*")} if SHM.is_dir() else set()
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[3]) != session:  # field 6: the session id
                continue
            maps = (proc / "maps").read_text(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        used |= {name for name in names if name in maps}
    return used


def servers_under(folder: Path) -> list[str]:
    """Command lines of the processes whose command line names ``folder`` (a private redis-server's
    --dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmdline:
            found.append(cmdline)
    return found


def assert_nothing_left(running: Running) -> None:
    assert list(running.tmp.iterdir()) == [], "the temporary folder was left"
    assert servers_under(running.tmp) == [], "the private redis-server was left running"
    left = {name for name in running.semaphores if (SHM / name).exists()}
    assert left == set(), "semaphores were left in /dev/shm"


def test_ctrl_c_during_demo_with_its_own_server(run: Callable[[list[str]], Running]) -> None:
    require_redis_server()
    demo = run(["demo"])
    demo.wait_for(demo.printed("stdout", "1. [A]"), "first step of the story")
    assert servers_under(demo.tmp), "the demo's private redis-server is not under TMPDIR"
    code, errors = demo.interrupt()
    assert demo.semaphores, "the replicas' semaphores were not seen: the check below would prove nothing"
    assert code == 130, demo.lines
    assert errors == ["interrupted"], demo.lines
    assert_nothing_left(demo)


def test_ctrl_c_while_demo_starts_its_server(run: Callable[[list[str]], Running]) -> None:
    require_redis_server()
    demo = run(["demo"])
    demo.wait_for(demo.printed("stdout", "Redis: a private redis-server"), "the server's line")
    code, errors = demo.interrupt()
    assert code == 130, demo.lines
    assert errors == ["interrupted"], demo.lines
    assert_nothing_left(demo)


def test_ctrl_c_during_demo_with_a_url(
    server: EmbeddedRedis, client: redis.Redis, run: Callable[[list[str]], Running]
) -> None:
    demo = run(["demo", "--url", server.url])
    demo.wait_for(demo.printed("stdout", "1. [A]"), "first step of the story")
    code, errors = demo.interrupt()
    assert demo.semaphores, "the replicas' semaphores were not seen: the check below would prove nothing"
    assert code == 130, demo.lines
    assert errors == ["interrupted"], demo.lines
    assert client.dbsize() == 0, sorted(client.scan_iter())
    assert_nothing_left(demo)


def test_ctrl_c_during_bench_with_a_url_removes_its_records(
    server: EmbeddedRedis, client: redis.Redis, run: Callable[[list[str]], Running]
) -> None:
    bench = run(["bench", "--url", server.url, "--duration", "20", "--processes", "2", "--quiet"])
    bench.wait_for(lambda: client.dbsize() > 100, "records of the run in Redis")
    code, errors = bench.interrupt()
    assert bench.semaphores, "the workers' semaphores were not seen: the check below would prove nothing"
    assert code == 130, bench.lines
    assert errors == ["interrupted"], bench.lines
    assert bench.lines["stdout"] == []
    assert client.dbsize() == 0, f"{client.dbsize()} keys left"
    assert_nothing_left(bench)


def test_ctrl_c_during_bench_with_its_own_server(run: Callable[[list[str]], Running]) -> None:
    require_redis_server()
    bench = run(["bench", "--duration", "20", "--processes", "2", "--quiet"])
    bench.wait_for(bench.printed("stderr", "2 processes x"), "the run's line")
    code, errors = bench.interrupt()
    assert code == 130, bench.lines
    assert errors == ["interrupted"], bench.lines
    assert bench.lines["stdout"] == []
    assert_nothing_left(bench)
