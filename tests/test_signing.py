"""Signed results on a real redis-server: a record edited in Redis is refused, never replayed."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from airlock_redis import EffectGuard, RecordCorrupt, RedisEffectStore, tool_call_context
from airlock_redis.core.signing import Signer
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import layout

KEY_OLD = b"old-signing-key-0123456789abcdef"
KEY_NEW = b"new-signing-key-0123456789abcdef"

pytestmark = pytest.mark.redis_server


class Charge:
    """A guarded tool that counts its runs."""

    def __init__(self, guard: EffectGuard) -> None:
        self.runs = 0

        def charge(account: str, cents: int) -> dict[str, Any]:
            self.runs += 1
            return {"account": account, "cents": cents, "receipt": f"r-{self.runs}"}

        self.call = guard.wrap(charge)

    def __call__(self, tool_call_id: str, account: str = "acct_1", cents: int = 500) -> Any:
        with tool_call_context(tool_call_id):
            return self.call(account=account, cents=cents)


def _store(server: EmbeddedRedis, namespace: str) -> RedisEffectStore:
    return RedisEffectStore(server.url, namespace=namespace)


def _raw(store: RedisEffectStore) -> redis.Redis:
    client = store.client
    assert isinstance(client, redis.Redis)
    return client


def _field(store: RedisEffectStore, key: bytes, field: str) -> bytes:
    """One field (value or mac) of the record's string."""
    data = _raw(store).get(key)
    assert isinstance(data, bytes)
    value: bytes = getattr(layout.parse(data), field)
    return value


def _set_fields(store: RedisEffectStore, key: bytes, **fields: bytes) -> None:
    """Write some fields of the record, as someone with write access to Redis could."""
    data = _raw(store).get(key)
    assert isinstance(data, bytes)
    _raw(store).set(key, layout.edit(data, **fields), keepttl=True)


def test_signed_result_replays(redis_server: EmbeddedRedis, namespace: str) -> None:
    store = _store(redis_server, namespace)
    charge = Charge(EffectGuard(store, signing_key=KEY_OLD))
    first = charge("call-1")
    assert charge("call-1") == first
    assert charge.runs == 1
    record = store.get("call-1")
    assert record is not None and record.mac is not None and len(record.mac) == 32


@pytest.mark.parametrize("field", ["value", "mac"])
def test_edited_record_is_refused_reported_and_not_run(
    redis_server: EmbeddedRedis, namespace: str, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store(redis_server, namespace)
    guard = EffectGuard(store, signing_key=KEY_OLD)
    charge = Charge(guard)
    charge("call-1")
    key = store.key("call-1")
    original = _field(store, key, field)
    assert original
    # flip one byte of the stored field, as someone with write access to Redis could
    edited = original[:-1] + bytes([original[-1] ^ 0x01])
    _set_fields(store, key, **{field: edited})
    with caplog.at_level(logging.ERROR, logger="airlock_redis"), pytest.raises(RecordCorrupt) as info:
        charge("call-1")
    assert info.value.reason == "record_corrupt"
    assert charge.runs == 1  # the tool did not run again
    assert any("signature" in r.getMessage() and "call-1" in r.getMessage() for r in caplog.records)
    # the record is left as it is for the operator: refused again, never replayed nor deleted
    with pytest.raises(RecordCorrupt):
        charge("call-1")
    assert _field(store, key, field) == edited


def test_forged_value_with_a_valid_codec_is_refused(redis_server: EmbeddedRedis, namespace: str) -> None:
    """A value that decodes fine but was written by someone without the key does not verify."""
    from airlock_redis.core.codec import encode_result

    store = _store(redis_server, namespace)
    charge = Charge(EffectGuard(store, signing_key=KEY_OLD))
    charge("call-1")
    _set_fields(store, store.key("call-1"), value=encode_result({"account": "acct_1", "cents": 1}))
    with pytest.raises(RecordCorrupt):
        charge("call-1")
    assert charge.runs == 1


def test_value_and_mac_copied_from_another_record_do_not_verify(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    store = _store(redis_server, namespace)
    charge = Charge(EffectGuard(store, signing_key=KEY_OLD))
    charge("call-a", account="acct_1", cents=500)
    charge("call-b", account="acct_1", cents=500)  # same arguments, so same idempotency key
    value_a, mac_a = _field(store, store.key("call-a"), "value"), _field(store, store.key("call-a"), "mac")
    _set_fields(store, store.key("call-b"), value=value_a, mac=mac_a)
    with pytest.raises(RecordCorrupt):
        charge("call-b")
    assert charge.runs == 2


def test_unsigned_record_is_refused_when_signing_is_on(redis_server: EmbeddedRedis, namespace: str) -> None:
    store = _store(redis_server, namespace)
    Charge(EffectGuard(store))("call-1")  # written by a guard without a key
    signed = Charge(EffectGuard(store, signing_key=KEY_OLD))
    with pytest.raises(RecordCorrupt):
        signed("call-1")
    assert signed.runs == 0


def test_rotation_new_key_first_verifies_old_records(redis_server: EmbeddedRedis, namespace: str) -> None:
    store = _store(redis_server, namespace)
    old = Charge(EffectGuard(store, signing_key=KEY_OLD))
    first = old("call-old")
    rotated = Charge(EffectGuard(store, signing_key=[KEY_NEW, KEY_OLD]))
    assert rotated("call-old") == first  # an old record still verifies
    fresh = rotated("call-new")  # new records are signed with the new key
    record = store.get("call-new")
    assert record is not None and record.value is not None
    assert record.mac == Signer(KEY_NEW).sign("call-new", record.idempotency_key, record.value)
    new_only = Charge(EffectGuard(store, signing_key=KEY_NEW))
    assert new_only("call-new") == fresh
    with pytest.raises(RecordCorrupt):  # once the old key is dropped, its records no longer verify
        new_only("call-old")
    assert old.runs == 1 and rotated.runs == 1 and new_only.runs == 0


def test_without_a_signing_key_replays_work(redis_server: EmbeddedRedis, namespace: str) -> None:
    store = _store(redis_server, namespace)
    charge = Charge(EffectGuard(store))
    first = charge("call-1")
    assert charge("call-1") == first
    assert charge.runs == 1
    record = store.get("call-1")
    assert record is not None and record.mac is None


def test_resolved_value_is_signed(redis_server: EmbeddedRedis, namespace: str) -> None:
    store = _store(redis_server, namespace)
    guard = EffectGuard(store, signing_key=KEY_OLD)

    def charge(account: str, cents: int) -> dict[str, Any]:
        raise TimeoutError("the answer was lost")

    tool = guard.wrap(charge)
    with tool_call_context("call-1"), pytest.raises(TimeoutError):
        tool(account="acct_1", cents=5)
    assert guard.resolve("call-1", "committed", force=True, value={"receipt": "from-backend"}).value == "ok"
    with tool_call_context("call-1"):
        assert tool(account="acct_1", cents=5) == {"receipt": "from-backend"}
    # another guard with a different key refuses what this one signed
    other = EffectGuard(store, signing_key=KEY_NEW).wrap(charge)
    with tool_call_context("call-1"), pytest.raises(RecordCorrupt):
        other(account="acct_1", cents=5)


def test_signing_key_rules() -> None:
    with pytest.raises(ValueError):
        Signer(b"short")
    with pytest.raises(ValueError):
        Signer([])
    signer = Signer([KEY_NEW, KEY_OLD])
    mac = Signer(KEY_OLD).sign("id", "k" * 64, b"v")
    assert signer.verify("id", "k" * 64, b"v", mac)
    assert not signer.verify("id2", "k" * 64, b"v", mac)
    assert not signer.verify("id", "k" * 64, b"v", None)
    # the fields are length-prefixed: moving a byte from the id into the value changes the MAC
    assert Signer(KEY_OLD).sign("ab", "k", b"c") != Signer(KEY_OLD).sign("a", "k", b"bc")
