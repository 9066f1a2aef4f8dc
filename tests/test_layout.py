"""The record's layout: one string, read and written by the Lua scripts and by stores/layout.py alike.

Round trips (hypothesis) of the Python mirror; records written by each script parsed in Python and
records packed in Python read by the scripts, on a real redis-server; both sides agreeing on what is
not a record; a key of another Redis type refused and never overwritten; and the memory a record
costs beyond its stored result. (Records of a newer layout version: test_record_format_version.py.)
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airlock_redis import EffectGuard, EffectRefused, RedisEffectStore, Status, tool_call_context
from airlock_redis.core.canonical import idempotency_key
from airlock_redis.core.errors import CorruptRecordError
from airlock_redis.core.records import BeginKind, BeginRequest, Settlement, TransitionResult
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.operator import list_records, read_record
from airlock_redis.stores import layout
from airlock_redis.stores.acl import required_commands
from airlock_redis.stores.layout import KEY_HEX, TOKEN_HEX, StoredRecord, pack, pack_id, parse, unpack_id
from airlock_redis.stores.script_args import REMEMBERED_FIRSTS
from airlock_redis.stores.scripts import script_source

TOOL = "charge"
KEY = idempotency_key(TOOL, {"cents": 5})
STATUSES = ("pending", "committed", "unknown", "released")

ids = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    st.text(alphabet="0123456789abcdefABCDEF", min_size=30, max_size=66),
)
small = st.binary(max_size=300)


@st.composite
def stored_records(draw: st.DrawFn) -> StoredRecord:
    return StoredRecord(
        status=draw(st.sampled_from(STATUSES)),
        attempt=draw(st.integers(0, 999_999_999)),
        begun_ms=draw(st.none() | st.integers(0, 10**15 - 1)),
        committed_ms=draw(st.none() | st.integers(0, 10**15 - 1)),
        stored=draw(st.booleans()),
        owner=pack_id(draw(ids), TOKEN_HEX),
        key=pack_id(draw(ids), KEY_HEX),
        tool=draw(small),
        mac=draw(small),
        released=tuple(draw(st.lists(small, max_size=4))),
        value=draw(st.binary(max_size=5000)),
    )


# -- the Python mirror alone ---------------------------------------------------------------------------
@given(stored_records())
def test_pack_and_parse_round_trip_any_bytes(record: StoredRecord) -> None:
    data = pack(record)
    assert parse(data) == record
    assert layout.fields_end(data) == len(data) - len(record.value)
    assert parse(data[: layout.fields_end(data)]) == dataclasses.replace(record, value=b"")


@given(st.text(max_size=80), st.text(max_size=80), st.sampled_from((TOKEN_HEX, KEY_HEX)))
def test_packed_ids_are_one_to_one_and_unpack_to_their_text(a: str, b: str, hex_digits: int) -> None:
    assert unpack_id(pack_id(a, hex_digits), hex_digits) == a
    assert (pack_id(a, hex_digits) == pack_id(b, hex_digits)) == (a == b)


@given(st.sampled_from((TOKEN_HEX, KEY_HEX)), st.data())
def test_hex_ids_pack_to_their_raw_bytes(hex_digits: int, data: st.DataObject) -> None:
    raw = data.draw(st.binary(min_size=hex_digits // 2, max_size=hex_digits // 2))
    assert pack_id(raw.hex(), hex_digits) == raw
    assert pack_id(raw.hex().upper(), hex_digits) != raw or raw.hex() == raw.hex().upper()


@pytest.mark.parametrize(
    "text", ["ab" * 31 + "  ", " " + "ab" * 31 + " ", "AB" * 32, "ab" * 31 + "é", "ab" * 32 + "a"]
)
def test_near_hex_is_packed_as_text(text: str) -> None:
    assert pack_id(text, KEY_HEX) == text.encode() + b"\x00"
    assert unpack_id(pack_id(text, KEY_HEX), KEY_HEX) == text


@given(small, small, small, st.integers(0, 10**15 - 1))
def test_the_first_pending_record_packs_as_pack_would(owner: bytes, key: bytes, tool: bytes, ms: int) -> None:
    """pack_pending, the begin's one-step builder, writes what pack writes for the same record."""
    record = StoredRecord("pending", attempt=1, begun_ms=ms, owner=owner, key=key, tool=tool)
    assert layout.pack_pending(owner, key, tool, ms) == pack(record)
    assert parse(layout.pack_pending(owner, key, tool, ms)) == record


@given(small, small, small, st.integers(0, 10**15 - 1), st.integers(0, 10**15 - 1), st.booleans(), small)
def test_the_first_committed_record_packs_as_pack_would(  # noqa: PLR0917
    owner: bytes, key: bytes, tool: bytes, begun: int, committed: int, stored: bool, mac: bytes
) -> None:
    """pack_committed_head, the commit's one-step builder, followed by the value, writes what pack
    writes for the committed record of the first attempt."""
    value = b"v\x00;" * 7 if stored else b""
    record = StoredRecord(
        "committed",
        attempt=1,
        begun_ms=begun,
        committed_ms=committed,
        stored=stored,
        owner=owner,
        key=key,
        tool=tool,
        mac=mac,
        value=value,
    )
    assert layout.pack_committed_head(owner, key, tool, begun, committed, stored, mac) + value == pack(record)


def test_a_guard_record_is_small() -> None:
    record = StoredRecord(
        "committed",
        1,
        1_700_000_000_000,
        1_700_000_000_250,
        True,
        pack_id(secrets.token_hex(16), TOKEN_HEX),
        pack_id(KEY, KEY_HEX),
        TOOL.encode(),
        value=b"v",
    )
    assert len(pack(record)) - 1 <= 47 + 16 + 32 + len(TOOL)  # header, raw token and key, tool


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "header does not parse"),
        (
            b"Zc,1,,,0,0,0,0,0,0;",
            "header does not parse",
        ),  # z...: a newer layout (test_record_format_version)
        (b"ax,1,,,0,0,0,0,0,0;", "unknown status 'x'"),
        (b"ac,1234567890,,,0,0,0,0,0,0;", "malformed attempt"),
        (b"ac,1,1234567890123456,,0,0,0,0,0,0;", "malformed timestamp"),
        (b"ac,1,,,0,1,0,0,0,0;", "cut short"),
        (b"ac,1,,,0,0,0,0,0,2;1x", "released tokens"),
        (b"ac,1,,,0,0,0,0,0,3;5:x", "released tokens"),
    ],
)
def test_what_is_not_a_record_says_why(data: bytes, why: str) -> None:
    with pytest.raises(layout.LayoutError, match=why):
        parse(data)


# -- the scripts and the mirror, on a real redis-server ------------------------------------------------
@pytest.fixture
def rstore(redis_server: EmbeddedRedis, namespace: str) -> Iterator[RedisEffectStore]:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    yield store
    store.close()


def _raw(store: RedisEffectStore, tool_call_id: str) -> StoredRecord:
    return parse(_bytes_at(store, tool_call_id))


def _bytes_at(store: RedisEffectStore, tool_call_id: str) -> bytes:
    data = store.client.get(store.key(tool_call_id))
    assert isinstance(data, bytes)
    return data


def _request(tool_call_id: str, token: str | None = None, reversible: bool = False) -> BeginRequest:
    return BeginRequest(tool_call_id, KEY, TOOL, token or secrets.token_hex(16), reversible)


def test_each_script_writes_a_record_python_parses(rstore: RedisEffectStore) -> None:
    a = _request("w-1")
    assert rstore.begin(a).kind is BeginKind.STARTED
    pending = _raw(rstore, "w-1")
    assert (pending.status, pending.attempt, pending.owner_text, pending.key_text) == (
        "pending",
        1,
        a.token,
        KEY,
    )
    assert (pending.tool, pending.stored, pending.value, pending.committed_ms) == (
        b"charge",
        False,
        b"",
        None,
    )
    assert len(pending.owner) == 16 and len(pending.key) == 32  # hex travels and stays as raw bytes
    assert pending.begun_ms is not None

    value, mac = bytes(range(256)) + b";,:\x00", b"\x00;" * 16
    assert rstore.commit(a, 1, value, mac) is TransitionResult.OK
    committed = _raw(rstore, "w-1")
    assert (committed.status, committed.stored, committed.value, committed.mac) == (
        "committed",
        True,
        value,
        mac,
    )
    assert committed.begun_ms == pending.begun_ms and committed.committed_ms is not None

    b = _request("w-2", "tok-b")  # not hex: stored as its text
    rstore.begin(b)
    assert rstore.settle(b, 1, Settlement.UNKNOWN) is TransitionResult.OK
    unknown = _raw(rstore, "w-2")
    assert (unknown.status, unknown.owner, unknown.owner_text) == ("unknown", b"tok-b", "tok-b")

    c = _request("w-3")
    rstore.begin(c)
    assert rstore.settle(c, 1, Settlement.RELEASE) is TransitionResult.OK
    tomb = _raw(rstore, "w-3")
    assert (tomb.status, tomb.owner_text, tomb.released) == (
        "released",
        c.token,
        (layout.pack_token(c.token),),
    )
    d = _request("w-3")
    assert rstore.begin(d).kind is BeginKind.STARTED
    assert _raw(rstore, "w-3").released == tomb.released  # kept under the next record
    assert rstore.settle(d, 1, Settlement.RELEASE) is TransitionResult.OK
    assert _raw(rstore, "w-3").released == (layout.pack_token(c.token), layout.pack_token(d.token))

    e = _request("w-4")
    assert rstore.commit(e, 3, None, None) is TransitionResult.RECREATED
    recreated = _raw(rstore, "w-4")
    assert (recreated.status, recreated.attempt, recreated.stored, recreated.begun_ms) == (
        "committed",
        3,
        False,
        None,
    )
    assert rstore.settle(_request("w-5"), 2, Settlement.UNKNOWN) is TransitionResult.RECREATED
    assert (_raw(rstore, "w-5").status, _raw(rstore, "w-5").attempt) == ("unknown", 2)

    result = rstore.resolve(
        "w-2", Status.COMMITTED, expect_key=KEY, expect_owner="tok-b", value=b"v", mac=b"m"
    )
    assert result is TransitionResult.OK
    resolved = _raw(rstore, "w-2")
    assert (resolved.status, resolved.value, resolved.mac, resolved.attempt) == ("committed", b"v", b"m", 1)
    assert resolved.owner_text.startswith("operator:") and resolved.owner.endswith(b"\x00")
    assert rstore.resolve("w-1", Settlement.RELEASE, expect_status=Status.COMMITTED) is TransitionResult.OK
    assert _raw(rstore, "w-1").status == "released"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tool=small, value=st.binary(max_size=5000), mac=small, token=ids)
def test_what_commit_writes_parses_and_what_python_packs_begin_reads(
    rstore: RedisEffectStore, tool: bytes, value: bytes, mac: bytes, token: str
) -> None:
    client = rstore.client
    key = rstore.key(f"x-{secrets.token_hex(4)}")
    packed_key, packed_token = layout.pack_key(KEY), layout.pack_token(token)
    commit = (packed_token, "1", value, mac, 60_000, 1_700_000_000_000, packed_key, tool, 4)
    assert client.eval(script_source("commit"), 1, key, *commit) == b"recreated"
    record = parse(client.get(key))  # type: ignore[arg-type]
    assert (record.tool, record.value, record.mac, record.owner_text, record.attempt) == (
        tool,
        value,
        mac,
        token,
        4,
    )

    packed = pack(dataclasses.replace(record, attempt=7, released=(b"x", packed_token + b"!")))
    client.set(key, packed)
    begin = (packed_key, tool, b"other", "0", 60_000, 1)
    assert client.eval(script_source("begin"), 1, key, *begin) == [b"committed", 7, value, mac]
    other = (packed_key, tool + b"?", b"other", "0", 60_000, 1)
    assert client.eval(script_source("begin"), 1, key, *other) == [
        b"mismatch",
        7,
        None,
        None,
        tool,
        packed_key,
    ]
    late = (packed_key, tool, b"x", "0", 60_000, 1)
    assert client.eval(script_source("begin"), 1, key, *late) == [b"released", 0]
    assert client.get(key) == packed  # nothing written by any of them


def _variants(data: bytes) -> Iterator[bytes]:
    """``data`` cut at every length, and each header byte replaced by a few others."""
    for end in range(len(data) + 1):
        yield data[:end]
    header = data.index(b";") + 1
    for at in range(header + 1):
        for byte in b"a,;x90\x00":
            yield data[:at] + bytes([byte]) + data[at + 1 :]


def test_the_scripts_and_python_agree_on_what_is_a_record(rstore: RedisEffectStore) -> None:
    client = rstore.client
    record = StoredRecord(
        "committed",
        12,
        1_700_000_000_000,
        1_700_000_000_001,
        True,
        b"o" * 16,
        layout.pack_key(KEY),
        TOOL.encode(),
        b"mac",
        (b"t1", b"t22"),
        b"val",
    )
    begin = (layout.pack_key(KEY), TOOL, b"token", "0", 60_000, 1)
    source = script_source("begin")
    seen = 0
    for i, variant in enumerate(_variants(pack(record))):
        key = rstore.key(f"v-{i}")
        client.set(key, variant)
        reply = client.eval(source, 1, key, *begin)
        try:
            parse(variant)
        except layout.LayoutError as exc:
            assert reply[0] == b"corrupt", (variant, reply)
            assert reply[4].decode() in str(exc), (variant, reply, exc)
            assert client.get(key) == variant  # left as it is
            seen += 1
        else:
            assert reply[0] != b"corrupt", (variant, reply)
    assert seen > 50


# -- a key of another Redis type -------------------------------------------------------------------
def test_another_type_is_reported_and_never_overwritten(rstore: RedisEffectStore) -> None:
    key = rstore.key("list-1")
    rstore.client.rpush(key, b"x")
    not_a_string = "the key holds another Redis type, not a string: not a record"
    reply = rstore.client.eval(script_source("begin"), 1, key, b"k", TOOL, b"t", "1", 60_000, 1)
    assert reply == [b"corrupt", 0, None, None, not_a_string.encode()]
    with pytest.raises(CorruptRecordError, match="another Redis type, not a string"):
        rstore.get("list-1")
    a = _request("list-1", reversible=True)
    with pytest.raises(CorruptRecordError):
        rstore.begin(a)
    with pytest.raises(CorruptRecordError):
        rstore.commit(a, 1, b"v", None)
    with pytest.raises(CorruptRecordError):
        rstore.settle(a, 1, Settlement.RELEASE)
    with pytest.raises(CorruptRecordError):
        rstore.resolve("list-1", Settlement.RELEASE)
    view = read_record(rstore.client, rstore.namespace, "list-1")
    assert view is not None and view.problems == (not_a_string,)
    assert [v.problems for v in list_records(rstore.client, rstore.namespace).records] == [(not_a_string,)]
    assert rstore.client.lrange(key, 0, -1) == [b"x"]


# -- operators' views ------------------------------------------------------------------------------------
def test_a_listing_reads_heads_only_and_reads_long_fields_again(rstore: RedisEffectStore) -> None:
    tool = "t" * 700  # the fields run past the first bytes a listing reads
    request = BeginRequest("long-1", KEY, tool, secrets.token_hex(16), False)
    rstore.begin(request)
    rstore.commit(request, 1, b"v" * 3000, None)
    [view] = list_records(rstore.client, rstore.namespace).records
    assert (view.tool, view.idempotency_key, view.value_bytes, view.value) == (tool, KEY, 3000, None)
    full = read_record(rstore.client, rstore.namespace, "long-1")
    assert full is not None and (full.tool, full.value, full.value_bytes) == (tool, b"v" * 3000, 3000)
    assert [p.partition(" (")[0] for p in full.problems] == ["value does not decode"]  # not a codec value


# -- memory -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [8, 200, 1024, 4096])
def test_a_committed_record_costs_at_most_200_bytes_beyond_its_result(
    rstore: RedisEffectStore, size: int
) -> None:
    """MEMORY USAGE (SAMPLES 0) of a committed record, less that of a plain string of the same result
    under the same key: the header, the packed token and key, the tool name, allocator rounding."""
    client = rstore.client
    value = secrets.token_bytes(size)
    request = _request("mem-1")
    rstore.begin(request)
    rstore.commit(request, 1, value, None)
    key = rstore.key("mem-1")
    record_bytes = client.memory_usage(key, samples=0)
    client.set(key, value)
    plain_bytes = client.memory_usage(key, samples=0)
    assert isinstance(record_bytes, int) and isinstance(plain_bytes, int)
    assert record_bytes - plain_bytes <= 200, (size, record_bytes, plain_bytes)


def test_a_tenant_with_the_store_commands_refuses_a_key_of_another_type(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    """A key that holds no string (here a hash) is refused as corrupt with the store's commands only
    (no TYPE, no hash command), and the tool does not run."""
    admin = redis_server.client()
    user = f"u{secrets.token_hex(4)}"
    commands = ["-@all"] + [f"+{c}" for c in required_commands()]
    admin.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=[f"{namespace}:*"], commands=commands, reset=True
    )
    try:
        scheme, _, rest = redis_server.url.partition("://")
        store = RedisEffectStore(f"{scheme}://{user}:pw@{rest}", namespace=namespace)
        guard = EffectGuard(store)
        with tool_call_context("ok-1"):
            assert guard.wrap(lambda: 1, name="charge")() == 1
        admin.hset(store.key("old-9"), "status", "committed")
        runs: list[int] = []
        with tool_call_context("old-9"), pytest.raises(EffectRefused) as refused:
            guard.wrap(lambda: runs.append(2), name="charge")()
        assert refused.value.reason == "record_corrupt" and runs == []
        assert admin.hgetall(store.key("old-9")) == {b"status": b"committed"}
        store.close()
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_no_script_calls_a_hash_command_on_the_common_path(
    redis_server: EmbeddedRedis, rstore: RedisEffectStore
) -> None:
    """A guarded call on a new id costs one plain SET NX (the begin, no script) and one script that
    does one GET and one SET (the commit, an EVALSHA on its first try: the script is cached since the
    first call's commit loaded it). The store's first begin is the script instead (it proves the user
    may run scripts before any tool runs)."""
    client = redis_server.client()
    with tool_call_context("path-0"):
        assert EffectGuard(rstore).wrap(lambda: 0, name="charge")() == 0
    client.config_resetstat()
    with tool_call_context("path-1"):
        assert EffectGuard(rstore).wrap(lambda: 1, name="charge")() == 1
    stats: dict[str, Any] = client.info("commandstats")
    called = {name.removeprefix("cmdstat_"): row["calls"] for name, row in stats.items()}
    assert called.get("evalsha") == 1 and called.get("get") == 1 and called.get("set") == 2, called
    assert "eval" not in called, called
    assert not {"type", "hmget", "hset", "pexpire", "del", "exists"} & set(called), called
    client.close()


@pytest.mark.parametrize("tool", ["charge", "tøøl"])
def test_a_begin_on_a_new_key_writes_what_the_script_writes(
    redis_server: EmbeddedRedis, rstore: RedisEffectStore, tool: str
) -> None:
    """The begin's SET NX (any tool name, as UTF-8) writes the record the begin script writes where
    the key holds nothing, byte for byte but for the time it began. (A store's first begin is the
    script: it proves the user may run scripts before any tool runs.)"""
    client = redis_server.client()
    token, key = secrets.token_hex(16), secrets.token_hex(32)
    assert rstore.begin(BeginRequest("first", key, tool, token, False)).kind is BeginKind.STARTED
    client.config_resetstat()
    assert rstore.begin(BeginRequest("fast-1", key, tool, token, False)).kind is BeginKind.STARTED
    stats = client.info("commandstats")
    scripts = sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("eval", "evalsha"))
    assert scripts == 0
    args = (layout.pack_key(key), tool, layout.pack_token(token), "0", 60_000, 1_700_000_000_000)
    assert client.eval(script_source("begin"), 1, rstore.key("script-1"), *args) == [b"started", 1]
    fast_raw, scripted_raw = client.get(rstore.key("fast-1")), client.get(rstore.key("script-1"))
    assert isinstance(fast_raw, bytes) and isinstance(scripted_raw, bytes)
    fast, scripted = layout.parse(fast_raw), layout.parse(scripted_raw)
    assert dataclasses.replace(fast, begun_ms=0) == dataclasses.replace(scripted, begun_ms=0)
    assert fast.begun_ms is not None and fast.begun_ms > 1_700_000_000_000
    # the same attempt again (a re-send) and another attempt go through the script, as before
    assert rstore.begin(BeginRequest("fast-1", key, tool, token, False)).kind is BeginKind.STARTED
    other = rstore.begin(BeginRequest("fast-1", key, tool, secrets.token_hex(16), False))
    assert (other.kind, other.attempt) == (BeginKind.PENDING, 1)
    client.close()


@pytest.mark.parametrize("released", [(), (b"an-earlier-token",)])
@pytest.mark.parametrize("value, mac", [(b"", b""), (b"\x00v" * 50, b"m" * 32)])
def test_a_commit_writes_what_python_packs_in_place_or_not(
    rstore: RedisEffectStore, released: tuple[bytes, ...], value: bytes, mac: bytes
) -> None:
    """commit rewrites its own pending record in place when it holds no MAC, released list or value
    (what a begin writes on an empty key) and parses it otherwise: either way the record is the one
    layout.pack makes, byte for byte."""
    client = rstore.client
    key = rstore.key(f"in-place-{secrets.token_hex(4)}")
    token = layout.pack_token(secrets.token_hex(16))
    pending = StoredRecord(
        "pending",
        attempt=3,
        begun_ms=1_700_000_000_000,
        owner=token,
        key=layout.pack_key(KEY),
        tool=b"charge",
        released=released,
    )
    client.set(key, pack(pending))
    stored = "1" if value else "0"
    commit = (token, stored, value, mac, 60_000, 1_700_000_000_123, b"ignored", "ignored", 9)
    assert client.eval(script_source("commit"), 1, key, *commit) == b"ok"
    expected = dataclasses.replace(
        pending,
        status="committed",
        committed_ms=1_700_000_000_123,
        stored=bool(value),
        value=value,
        mac=mac,
    )
    assert client.get(key) == pack(expected)
    assert 0 < client.pttl(key) <= 60_000
    # another owner's commit finds it superseded, in place or not, and writes nothing
    other = (layout.pack_token(secrets.token_hex(16)), *commit[1:])
    client.set(key, pack(pending))
    assert client.eval(script_source("commit"), 1, key, *other) == b"superseded"
    assert client.get(key) == pack(pending)


@pytest.mark.parametrize("lease_ms", [None, 60_000])
@pytest.mark.parametrize("value, mac", [(b"", b""), (b"\x00v" * 50, b"m" * 32), (None, None)])
def test_a_commit_after_a_plain_begin_writes_what_the_scripts_writer_writes(
    rstore: RedisEffectStore, lease_ms: int | None, value: bytes | None, mac: bytes | None
) -> None:
    """The commit of an attempt whose begin was a plain SET NX sends the bytes that begin wrote and
    the committed record made of them (lua/commit.lua's common case): what it writes is the record
    the script's own writer writes for the same commit (sent without them), byte for byte but for
    the time of the commit, and what layout.pack makes of it."""
    client = rstore.client
    rstore.begin(BeginRequest("proof", KEY, TOOL, secrets.token_hex(16), False))  # proves scripts run
    written: dict[str, bytes] = {}
    for how in ("common case", "general path"):
        request = BeginRequest(
            f"cas-{how}-{secrets.token_hex(3)}", KEY, TOOL, secrets.token_hex(16), False, lease_ms
        )
        assert rstore.begin(request).kind is BeginKind.STARTED
        args = rstore._args.commit(request, 1, value, mac)
        assert len(args) == 11  # the begin was a plain SET NX: its bytes travel with the commit
        if how == "general path":
            args = args[:9]  # as an earlier release sends it, or after a begin that ran the script
        assert client.eval(script_source("commit"), 1, rstore.key(request.tool_call_id), *args) == b"ok"
        written[how] = _bytes_at(rstore, request.tool_call_id)
    common, general = parse(written["common case"]), parse(written["general path"])
    assert common.status == "committed" and common.lease_ms is None and common.value == (value or b"")
    assert (common.stored, common.mac) == (value is not None, mac or b"")
    same_times = dataclasses.replace(common, begun_ms=0, committed_ms=0, owner=b"")
    assert same_times == dataclasses.replace(general, begun_ms=0, committed_ms=0, owner=b"")
    assert pack(common) == written["common case"]


def test_the_commits_common_case_writes_only_over_the_exact_bytes_its_begin_wrote(
    rstore: RedisEffectStore,
) -> None:
    """lua/commit.lua writes the client's committed record (ARGV[11] and the value) only where the key
    holds exactly ARGV[10]; a record that differs in one byte (a waiter's flag, an operator's or
    another attempt's write) goes through the general path, which reads it."""
    client = rstore.client
    token = layout.pack_token(secrets.token_hex(16))
    pending = layout.pack_pending(
        token, layout.pack_key(KEY), TOOL.encode(), 1_700_000_000_000, 60_000, 60_000
    )
    marker = layout.pack_committed_head(token, layout.pack_key(KEY), TOOL.encode(), 1, 2, True, b"")
    args = (token, "1", b"value", b"", 60_000, 1_700_000_000_123, layout.pack_key(KEY), TOOL, 1)
    key = rstore.key(f"cas-{secrets.token_hex(4)}")
    client.set(key, pending)
    assert client.eval(script_source("commit"), 1, key, *args, pending, marker) == b"ok"
    assert client.get(key) == marker + b"value"  # written unread: begun 1, committed 2, as sent
    waited = pending.replace(b",60000,60000,0,", b",60000,60000,1,")  # a call waits for this attempt
    assert waited != pending
    client.set(key, waited)
    assert client.eval(script_source("commit"), 1, key, *args, pending, marker) == b"ok"
    committed = parse(client.get(key))  # type: ignore[arg-type]
    assert (committed.begun_ms, committed.committed_ms) == (1_700_000_000_000, 1_700_000_000_123)
    other = layout.pack_pending(b"x" * 16, layout.pack_key(KEY), TOOL.encode(), 1_700_000_000_000)
    client.set(key, other)
    assert client.eval(script_source("commit"), 1, key, *args, pending, marker) == b"superseded"
    assert client.get(key) == other


def test_the_first_records_kept_for_commits_are_bounded_and_let_go(rstore: RedisEffectStore) -> None:
    """What a plain begin wrote is kept for its commit only: dropped at the commit or the settle, and
    never more than REMEMBERED_FIRSTS at once (the oldest go: their commits take the general path)."""
    args = rstore._args
    requests = [BeginRequest(f"kept-{i}", KEY, TOOL, secrets.token_hex(16), False) for i in range(3)]
    for request in requests:
        args.first_record(request)
    assert len(args.commit(requests[0], 1, b"v", None)) == 11
    assert len(args.commit(requests[0], 1, b"v", None)) == 9  # its commit took it
    args.settle(requests[1], 1, Settlement.RELEASE)
    assert len(args.commit(requests[1], 1, b"v", None)) == 9  # its settle let it go
    assert len(args.commit(requests[2], 2, b"v", None)) == 9  # another attempt than the first
    many = [
        BeginRequest(f"many-{i}", KEY, TOOL, secrets.token_hex(16), False)
        for i in range(REMEMBERED_FIRSTS + 5)
    ]
    for request in many:
        args.first_record(request)
    assert len(args._firsts) == REMEMBERED_FIRSTS
    assert len(args.commit(many[0], 1, b"v", None)) == 9 and len(args.commit(many[-1], 1, b"v", None)) == 11


DIFFERS = [("tool_call_id", "idempotency_key"), ("tool_call_id", "tool"), ("idempotency_key",), ("tool",)]


@pytest.mark.parametrize("differs", DIFFERS)
def test_a_commit_uses_only_the_bytes_its_own_call_began_with(
    rstore: RedisEffectStore, differs: tuple[str, ...]
) -> None:
    """What a plain begin wrote is kept under the attempt's owner token; a commit under the same token
    for another call (a caller that reuses a token) writes exactly what the general path writes,
    never a record made of the other call's bytes. Found by the model check
    (tests/test_model_check.py): a begin of call-b, then a commit of call-a with the same token and
    another idempotency key, wrote call-b's idempotency key into call-a's record."""

    rstore.begin(BeginRequest("proof", KEY, TOOL, secrets.token_hex(16), False))  # then plain begins

    def scenario(general_path: bool) -> tuple[Any, ...]:
        token, suffix = secrets.token_hex(16), secrets.token_hex(3)
        began = BeginRequest(f"began-{suffix}", KEY, TOOL, token, False)
        assert rstore.begin(began).kind is BeginKind.STARTED
        other = {
            "tool_call_id": f"other-{suffix}",
            "idempotency_key": idempotency_key(TOOL, {"cents": 6}),
            "tool": "refund",
        }
        fields = {"tool_call_id": began.tool_call_id, "idempotency_key": KEY, "tool": TOOL}
        fields.update({name: other[name] for name in differs})
        commit = BeginRequest(fields["tool_call_id"], fields["idempotency_key"], fields["tool"], token, False)
        assert token in rstore._args._firsts  # the begin was a plain SET NX: its bytes are kept
        if general_path:
            rstore._args._firsts.clear()  # as after too many begins: the commit sends nine arguments
        seen: list[Any] = [rstore.commit(commit, 1, b"v", None)]  # RECREATED where no record was
        for tool_call_id in dict.fromkeys((began.tool_call_id, commit.tool_call_id)):
            record = rstore.get(tool_call_id)
            assert record is not None
            seen.append((record.status, record.idempotency_key, record.tool, record.attempt, record.value))
        return tuple(seen)

    ours, general = scenario(general_path=False), scenario(general_path=True)
    assert ours == general
    if "tool_call_id" in differs:  # the committed record is the commit's own call's
        status, key, tool, _, value = ours[2]
        assert status is Status.COMMITTED and value == b"v"
        assert key == (idempotency_key(TOOL, {"cents": 6}) if "idempotency_key" in differs else KEY)
        assert tool == ("refund" if "tool" in differs else TOOL)


def test_binary_fields_round_trip_through_the_store(rstore: RedisEffectStore) -> None:
    request = BeginRequest("bin-1", KEY, "tøøl\x00;,", secrets.token_hex(16), False)
    rstore.begin(request)
    assert rstore.commit(request, 1, b"\xff\x00;", b"\x00") is TransitionResult.OK
    record = rstore.get("bin-1")
    assert record is not None and (record.tool, record.value, record.mac) == (
        "tøøl\x00;,",
        b"\xff\x00;",
        b"\x00",
    )
    assert rstore.begin(request).kind is BeginKind.COMMITTED


@pytest.mark.parametrize("result", list(TransitionResult))
def test_a_transition_reply_parses_as_bytes_or_text(result: TransitionResult) -> None:
    """A script's reply reaches parse_transition as bytes (the store's clients) or as text (a client
    that decodes replies); both name the same result, and anything else is a StoreError."""
    from airlock_redis.core.errors import StoreError
    from airlock_redis.stores.replies import parse_transition

    assert parse_transition(result.value.encode()) is result
    assert parse_transition(result.value) is result
    for junk in (result.value.upper().encode() + b"!", None, 1, [result.value.encode()]):
        with pytest.raises(StoreError, match="unexpected reply from a transition script"):
            parse_transition(junk)
