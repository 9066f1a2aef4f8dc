"""Results across processes: msgpack with a fixed set of extension types, never a class name.

Models and dataclasses are stored as plain data and rebuilt on replay through the tool's return
annotation. A result that cannot be stored leaves a committed record that is never released and
whose replay is refused; damaged stored bytes are refused, never replayed and never re-run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import functools
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgpack
import pydantic
import pytest

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    EffectStore,
    InMemoryEffectStore,
    RedisEffectStore,
    Status,
    tool_call_context,
)
from airlock_redis.core.codec import DEFAULT_MAX_RESULT_BYTES, FORMAT_VERSION, decode_result, encode_result
from airlock_redis.core.errors import ResultDecodingError, ResultEncodingError
from airlock_redis.stores import layout

KINDS = ("sync", "async")
UTC_PLUS_2 = dt.timezone(dt.timedelta(hours=2))


class Receipt(pydantic.BaseModel):
    charge_id: str
    cents: int
    at: dt.datetime
    tags: list[str] = []


@dataclasses.dataclass
class Shipment:
    tracking: str
    weight: Decimal
    ids: tuple[int, ...]


class Colour(enum.Enum):
    RED = "red"


# -- round trips -------------------------------------------------------------------------------

ROUND_TRIPS: dict[str, Any] = {
    "none": None,
    "bool": True,
    "int": -7,
    "float": 2.5,
    "str": "héllo ✓",
    "empty str": "",
    "bytes": b"\x00\xffraw",
    "empty bytes": b"",
    "list": [1, "a", None, 2.0],
    "tuple": (1, "a", (2, 3)),
    "empty tuple": (),
    "dict": {"a": 1, "b": [1, 2], "c": {"d": None}},
    "non-str keys": {1: "one", (1, 2): "pair", b"k": "bytes key"},
    "naive datetime": dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
    "aware datetime": dt.datetime(2024, 2, 29, 23, 59, 59, 1, tzinfo=UTC_PLUS_2),
    "utc datetime": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    "date": dt.date(1999, 12, 31),
    "time": dt.time(13, 14, 15, 16),
    "aware time": dt.time(13, 14, tzinfo=UTC_PLUS_2),
    "timedelta": dt.timedelta(days=-3, seconds=5, microseconds=7),
    "decimal": Decimal("-12345678901234567890.000000001"),
    "decimal exponent": Decimal("1E+30"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "set": {1, 2, 3},
    "frozenset": frozenset({"a", "b"}),
    "empty set": set(),
    "big int": 2**64 + 5,
    "big negative int": -(2**63) - 1,
    "uint64 max": 2**64 - 1,
    "int64 min": -(2**63),
    "huge int": 10**100,
    "nested": {
        "when": [dt.date(2020, 1, 1), (dt.time(1), {Decimal("1.5")})],
        "who": {uuid.UUID(int=5): frozenset({(1, b"x")})},
        "how_long": [dt.timedelta(hours=1), None],
    },
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_a_value_round_trips_with_its_type(name: str) -> None:
    value = ROUND_TRIPS[name]
    back = decode_result(encode_result(value))
    assert back == value
    assert type(back) is type(value)
    if isinstance(value, (dt.datetime, dt.time)):
        assert back.tzinfo == value.tzinfo or back.utcoffset() == value.utcoffset()
        assert (back.tzinfo is None) == (value.tzinfo is None)


def test_container_members_keep_their_types() -> None:
    value = {"t": (1, [2, (3,)]), "s": [frozenset({1}), {2}], "b": [b"1", "1", 1, 1.0, True]}
    back = decode_result(encode_result(value))
    assert type(back["t"]) is tuple and type(back["t"][1]) is list and type(back["t"][1][1]) is tuple
    assert type(back["s"][0]) is frozenset and type(back["s"][1]) is set
    assert [type(x) for x in back["b"]] == [bytes, str, int, float, bool]


def test_bytearray_and_memoryview_come_back_as_bytes() -> None:
    assert decode_result(encode_result(bytearray(b"ab"))) == b"ab"
    assert decode_result(encode_result(memoryview(b"cd"))) == b"cd"


def test_an_enum_is_stored_as_its_value() -> None:
    assert decode_result(encode_result(Colour.RED)) == "red"


def test_models_and_dataclasses_are_stored_as_plain_dicts() -> None:
    at = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
    assert decode_result(encode_result(Receipt(charge_id="ch_1", cents=5, at=at))) == {
        "charge_id": "ch_1",
        "cents": 5,
        "at": at,
        "tags": [],
    }
    assert decode_result(encode_result(Shipment("T1", Decimal("2.5"), (1, 2)))) == {
        "tracking": "T1",
        "weight": Decimal("2.5"),
        "ids": (1, 2),
    }


# -- what cannot be stored ---------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    "value",
    [Opaque(), [1, Opaque()], {"k": Opaque()}, len, {Opaque()}, (x for x in [1]), Colour],
    ids=["object", "in a list", "in a dict", "function", "in a set", "generator", "a class"],
)
def test_an_unsupported_value_is_a_result_encoding_error(value: Any) -> None:
    with pytest.raises(ResultEncodingError):
        encode_result(value)


def test_a_value_over_the_size_limit_is_a_result_encoding_error() -> None:
    assert len(encode_result(b"x" * 100, max_bytes=200)) > 100
    with pytest.raises(ResultEncodingError, match="limit"):
        encode_result(b"x" * 100, max_bytes=50)
    with pytest.raises(ResultEncodingError):
        encode_result("y" * (DEFAULT_MAX_RESULT_BYTES + 1))


def test_a_self_referencing_value_is_a_result_encoding_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ResultEncodingError):
        encode_result(loop)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        bytes([FORMAT_VERSION + 1]) + msgpack.packb(1),
        bytes([FORMAT_VERSION]) + b"\xc1",
        bytes([FORMAT_VERSION]) + msgpack.packb([1, 2, 3])[:-1],
        bytes([FORMAT_VERSION]) + msgpack.packb(msgpack.ExtType(99, b"x")),
        bytes([FORMAT_VERSION]) + msgpack.packb(msgpack.ExtType(5, b"short")),
    ],
    ids=["empty", "other version", "never-used byte", "truncated", "unknown ext", "bad uuid"],
)
def test_damaged_bytes_are_a_result_decoding_error(data: bytes) -> None:
    with pytest.raises(ResultDecodingError):
        decode_result(data)


# -- no class names in stored data -------------------------------------------------------------


def test_stored_bytes_never_name_a_class_or_module() -> None:
    at = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    values = [
        Receipt(charge_id="ch_1", cents=5, at=at),
        Shipment("T1", Decimal("2.5"), (1,)),
        [Receipt(charge_id="ch_2", cents=6, at=at)],
        {"nested": Shipment("T2", Decimal(1), ())},
        Colour.RED,
    ]
    for value in values:
        data = encode_result(value)
        for name in ("Receipt", "Shipment", "Colour", "test_codec", "tests", "pydantic", "builtins", "__"):
            assert name.encode() not in data, (value, name)


# -- through the guard -------------------------------------------------------------------------

AT = dt.datetime(2024, 5, 1, 9, 30, tzinfo=dt.timezone.utc)


def charge_receipt(account: str) -> Receipt:
    return Receipt(charge_id=f"ch_{account}", cents=500, at=AT, tags=["x"])


def ship(account: str) -> Shipment:
    return Shipment(f"T_{account}", Decimal("1.25"), (1, 2))


def receipts(account: str) -> list[Receipt]:
    return [charge_receipt(account), Receipt(charge_id="ch_2", cents=1, at=AT)]


def shipments_by_id(account: str) -> dict[str, Shipment]:
    return {"a": ship(account)}


async def acharge_receipt(account: str) -> Receipt:
    return charge_receipt(account)


async def aship(account: str) -> Shipment:
    return ship(account)


async def areceipts(account: str) -> list[Receipt]:
    return receipts(account)


async def ashipments_by_id(account: str) -> dict[str, Shipment]:
    return shipments_by_id(account)


TYPED_TOOLS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "-> Model": (charge_receipt, acharge_receipt),
    "-> dataclass": (ship, aship),
    "-> list[Model]": (receipts, areceipts),
    "-> dict[str, dataclass]": (shipments_by_id, ashipments_by_id),
}


def counted_guarded(
    guard: EffectGuard, fn: Callable[..., Any], kind: str
) -> tuple[Callable[..., Any], list[int]]:
    """Guard ``fn`` (keeping its name and annotations) and count how often its body runs."""
    runs: list[int] = []

    if kind == "sync":

        @functools.wraps(fn)
        def body(*args: Any, **kwargs: Any) -> Any:
            runs.append(1)
            return fn(*args, **kwargs)

        return guard.wrap(body), runs

    @functools.wraps(fn)
    async def abody(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return await fn(*args, **kwargs)

    guarded: Callable[..., Any] = guard.wrap(abody)
    return (lambda *a, **k: asyncio.run(guarded(*a, **k))), runs


def call(tool: Callable[..., Any], tool_call_id: str, *args: Any) -> Any:
    with tool_call_context(tool_call_id):
        return tool(*args)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(TYPED_TOOLS))
def test_a_replay_rebuilds_models_and_dataclasses_from_the_return_annotation(
    store: EffectStore, kind: str, name: str
) -> None:
    fn = TYPED_TOOLS[name][0 if kind == "sync" else 1]
    tool, runs = counted_guarded(EffectGuard(store=store), fn, kind)
    first = call(tool, "typed-1", "acct")
    replayed = call(tool, "typed-1", "acct")
    assert runs == [1]
    assert replayed == first
    assert replayed is not first
    if isinstance(first, list):
        assert [type(x) for x in replayed] == [Receipt, Receipt]
    elif isinstance(first, dict):
        assert type(replayed["a"]) is Shipment
        assert type(replayed["a"].ids) is tuple
    else:
        assert type(replayed) is type(first)
    record = store.get("typed-1")
    assert record is not None and record.value is not None
    for class_name in (b"Receipt", b"Shipment", b"test_codec"):
        assert class_name not in record.value


def test_a_replay_without_an_annotation_returns_the_plain_data(store: EffectStore) -> None:
    def untyped(account):  # type: ignore[no-untyped-def]
        return charge_receipt(account)

    tool = EffectGuard(store=store).wrap(untyped)
    call(tool, "untyped-1", "acct")
    assert call(tool, "untyped-1", "acct") == {
        "charge_id": "ch_acct",
        "cents": 500,
        "at": AT,
        "tags": ["x"],
    }


UNSTORABLE: dict[str, tuple[Callable[[], Any], int]] = {
    "not serialisable": (Opaque, DEFAULT_MAX_RESULT_BYTES),
    "over the size limit": (lambda: "z" * 500, 100),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(UNSTORABLE))
def test_an_unstorable_result_is_committed_not_stored_and_its_replay_refused(
    store: EffectStore, kind: str, name: str
) -> None:
    make, limit = UNSTORABLE[name]
    produced: list[Any] = []

    def produce(account: str) -> Any:
        produced.append(make())
        return produced[-1]

    async def aproduce(account: str) -> Any:
        return produce(account)

    target: Callable[..., Any] = produce if kind == "sync" else aproduce
    guarded: Callable[..., Any] = EffectGuard(store=store, max_result_bytes=limit).wrap(target)

    def run() -> Any:
        with tool_call_context("unstorable"):
            result = guarded("acct")
            return asyncio.run(result) if kind == "async" else result

    assert run() is produced[0]  # the caller still gets what the tool returned
    for _ in range(2):
        with pytest.raises(EffectRefused) as refused:
            run()
        assert refused.value.reason == "result_not_stored"
        assert "already ran" in str(refused.value)
        record = store.get("unstorable")
        assert record is not None
        assert (record.status, record.stored, record.value) == (Status.COMMITTED, False, None)
    assert len(produced) == 1


# -- damaged records ---------------------------------------------------------------------------


def damage(store: EffectStore, tool_call_id: str, junk: bytes) -> None:
    """Overwrite the committed record's stored bytes, as a bad write or a hand edit would."""
    if isinstance(store, RedisEffectStore):
        key = store.key(tool_call_id)
        data = store.client.get(key)
        assert isinstance(data, bytes) and layout.parse(data).status == "committed"
        store.client.set(key, layout.edit(data, value=junk), keepttl=True)
    else:
        assert isinstance(store, InMemoryEffectStore)
        record = store.get(tool_call_id)
        assert record is not None
        store.resolve(tool_call_id, Status.COMMITTED, expect_key=record.idempotency_key, value=junk)


JUNK = {
    "garbage": b"\x01\xc1\xc1garbage",
    "other version": b"\x09" + msgpack.packb({"a": 1}),
    "unknown ext": bytes([FORMAT_VERSION]) + msgpack.packb(msgpack.ExtType(99, b"?")),
    "empty": b"",
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("junk", list(JUNK))
def test_a_damaged_stored_result_is_refused_as_record_corrupt_and_not_run(
    store: EffectStore, kind: str, junk: str
) -> None:
    fn = charge_receipt if kind == "sync" else acharge_receipt
    tool, runs = counted_guarded(EffectGuard(store=store), fn, kind)
    call(tool, "corrupt-1", "acct")
    damage(store, "corrupt-1", JUNK[junk])
    with pytest.raises(EffectRefused) as refused:
        call(tool, "corrupt-1", "acct")
    assert refused.value.reason == "record_corrupt"
    assert "Do not retry" in str(refused.value)
    assert runs == [1]
    record = store.get("corrupt-1")
    assert record is not None and record.status is Status.COMMITTED  # left for an operator
