"""The commands in RESP request bytes, as a client wrote them: for tests that watch a connection's
``send_packed_command`` (what the store's auto-pipeline writes, see airlock_redis.stores.exchange)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def requests_in(packed: bytes | Iterable[Any]) -> list[tuple[bytes, ...]]:
    """Each command of ``packed`` (one buffer, or the chunks redis-py writes), its arguments as bytes."""
    data = packed if isinstance(packed, bytes) else b"".join(bytes(chunk) for chunk in packed)
    commands: list[tuple[bytes, ...]] = []
    at = 0
    while at < len(data):
        assert data[at : at + 1] == b"*", f"not a RESP array at byte {at}: {data[at : at + 20]!r}"
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2
        args: list[bytes] = []
        for _ in range(count):
            assert data[at : at + 1] == b"$", f"not a bulk string at byte {at}: {data[at : at + 20]!r}"
            end = data.index(b"\r\n", at)
            size, at = int(data[at + 1 : end]), end + 2
            args.append(data[at : at + size])
            at += size + 2
        commands.append(tuple(args))
    return commands


def names_in(commands: Iterable[tuple[bytes, ...]]) -> list[str]:
    return [command[0].decode().upper() for command in commands]
