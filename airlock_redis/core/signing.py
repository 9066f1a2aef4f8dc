"""HMAC over stored results, so a record edited or forged in Redis is refused, never replayed.

The MAC binds the value to its tool_call_id and idempotency key: a value copied from another
record does not verify either. Several keys may be given for rotation: the first signs, any
verifies.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

_DOMAIN = b"airlock-effect-mac/v1"
SigningKeys = bytes | str | Sequence[bytes | str]


def _as_bytes(key: bytes | str) -> bytes:
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if len(raw) < 16:
        raise ValueError("a signing key must be at least 16 bytes long")
    return raw


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


class Signer:
    """Signs with the first key; verifies with any of them."""

    __slots__ = ("_keys",)

    def __init__(self, keys: SigningKeys) -> None:
        listed = [keys] if isinstance(keys, (bytes, str)) else list(keys)
        if not listed:
            raise ValueError("give at least one signing key")
        self._keys = tuple(_as_bytes(k) for k in listed)

    def _mac(self, secret: bytes, tool_call_id: str, idempotency_key: str, value: bytes) -> bytes:
        message = (
            _DOMAIN
            + _field(tool_call_id.encode("utf-8"))
            + _field(idempotency_key.encode("ascii"))
            + _field(value)
        )
        return hmac.new(secret, message, hashlib.sha256).digest()

    def sign(self, tool_call_id: str, idempotency_key: str, value: bytes) -> bytes:
        return self._mac(self._keys[0], tool_call_id, idempotency_key, value)

    def verify(self, tool_call_id: str, idempotency_key: str, value: bytes, mac: bytes | None) -> bool:
        if not mac:
            return False
        return any(
            hmac.compare_digest(self._mac(secret, tool_call_id, idempotency_key, value), mac)
            for secret in self._keys
        )
