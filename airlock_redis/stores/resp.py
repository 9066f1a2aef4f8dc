"""The store's commands packed into RESP requests, for the wires that write them on a redis-py
connection themselves (:mod:`.exchange` for asyncio, :mod:`.blocking_wire` for blocking calls).

The store's commands carry only bytes, str and int arguments; those are packed here, byte for byte
as redis-py packs them (the tests compare the two), in about half the client CPU of redis-py's
general packer. A command with any other argument, or a client whose encoding is not UTF-8, is left
to the connection's own packer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Packer = Callable[[list[tuple[Any, ...]]], "bytes | None"]


def pack(commands: list[tuple[Any, ...]]) -> bytes | None:
    """The RESP requests for ``commands`` as one buffer, when every argument is bytes, str (as UTF-8)
    or int (not bool), as redis-py packs them; None for any other argument (redis-py's
    ``pack_commands`` then packs the batch, and raises for what it refuses)."""
    parts: list[bytes] = []
    for args in commands:
        parts.append(b"*%d\r\n" % len(args))
        for arg in args:
            kind = type(arg)
            if kind is bytes:
                data = arg
            elif kind is str:
                data = arg.encode()
            elif kind is int:
                data = b"%d" % arg
            else:
                return None
            parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def _not_packed(commands: list[tuple[Any, ...]]) -> None:
    return None


def packer_for(client: Any) -> Packer:
    """:func:`pack` for a client that encodes str as UTF-8 (redis-py's default); for any other
    encoding a packer that packs nothing, so that the connection's own packer encodes as the client
    was told to."""
    encoding = str(getattr(client.get_encoder(), "encoding", "")).lower().replace("_", "-")
    return pack if encoding in ("utf-8", "utf8") else _not_packed
