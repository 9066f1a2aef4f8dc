"""Records carry their layout version (the first byte, ``a`` today; stores/layout.py, lua/common.lua).

A record of a version this airlock-redis does not know (a newer one wrote it) is refused at begin with
RecordVersionError, whose message says to upgrade (sync, asyncio, and with wait_replicas), and the tool
never runs; commit and settle answer "superseded" and resolve raises RecordVersionError, none of them
writing over it; the store's get raises it; inspect and list show it as written by a newer
airlock-redis. The Python parser and the Lua scripts apply the same rule to the same bytes.

On the code before the version rule, a ``b...`` record was "corrupt: the record's header does not
parse" everywhere (no RecordVersionError, no "upgrade"), and resolve wrote its verdict over it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    RedisEffectStore,
    Reversibility,
    Status,
    reversibility,
    tool_call_context,
)
from airlock_redis.cli import main
from airlock_redis.core.canonical import idempotency_key
from airlock_redis.core.errors import CorruptRecordError
from airlock_redis.core.records import (
    BeginRequest,
    RecordVersionError,
    Settlement,
    TransitionResult,
)
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.operator import list_records, read_record
from airlock_redis.stores import layout
from airlock_redis.stores.scripts import script_source

pytestmark = pytest.mark.redis_server

TOOL = "charge"
KEY = idempotency_key(TOOL, {"account": "acct"})
# what a later layout might write: its letter, a header of lowercase letters, digits and commas, ";",
# then anything (here, binary)
NEWER = b"cc,7,1700000000000,q,0;\x00\xff;,:binary fields of a layout this one cannot read"
THIS = layout.pack(
    layout.StoredRecord("committed", 1, 5, 6, True, b"o", layout.pack_key(KEY), b"t", value=b"v")
)

# bytes -> the version letter of a newer layout, None for a record of this layout, "" for no record
VERSION_RULE: list[tuple[bytes, str | None]] = [
    (THIS, None),
    (NEWER, "c"),
    (b"zz;", "z"),
    (b"cq;", "c"),
    (b"cc,,,,;", "c"),
    (b"zzzz9,a1;\x00", "z"),
    (b"cp,1,,,0,0,0,0,0,0;", "c"),  # this layout's header under another letter
    (b"a;", ""),  # version a is known: what does not parse as a is corrupt, never "newer"
    (b"ab,1,,,0,0,0,0,0,0;", ""),
    (THIS[:-3], ""),
    (THIS[1:], ""),  # a record that lost its version byte: "c,1,...;", not a newer layout
    (b"c;", ""),
    (b"c,,,,;", ""),
    (b"c1;", ""),
    (b"", ""),
    (b";", ""),
    (b"c", ""),  # no header end
    (b"cc,1", ""),
    (b"cC,1;", ""),  # upper case in the header
    (b"c c;", ""),
    (b"c-1;", ""),
    (b"c\x00;", ""),
    (b"B;", ""),
    (b"1c,1;", ""),
    (b"\x00b;", ""),
    (b"foo", ""),
    (b"{b;", ""),
    (b"\xe1;", ""),
]


def python_reads(data: bytes) -> str | None:
    try:
        layout.parse(data)
    except layout.LayoutVersionError as exc:
        assert (
            str(exc)
            == f"the record was written by a newer airlock-redis (record layout version {exc.version})"
        )
        return exc.version
    except layout.LayoutError:
        return ""
    return None


@pytest.fixture
def rstore(redis_server: EmbeddedRedis, namespace: str) -> Iterator[RedisEffectStore]:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    yield store
    store.close()


def _put(store: RedisEffectStore, tool_call_id: str, data: bytes = NEWER) -> bytes:
    key = store.key(tool_call_id)
    store.client.set(key, data, px=600_000)
    return key


def _unchanged(store: RedisEffectStore, tool_call_id: str, data: bytes = NEWER) -> None:
    key = store.key(tool_call_id)
    assert store.client.get(key) == data
    assert 0 < store.client.pttl(key) <= 600_000


@pytest.mark.parametrize(("data", "expected"), VERSION_RULE, ids=[repr(d[:12]) for d, _ in VERSION_RULE])
def test_python_and_the_scripts_agree_on_the_version_rule(
    rstore: RedisEffectStore, data: bytes, expected: str | None
) -> None:
    """The same bytes through layout.parse and through each script's parse (begin's reply, resolve's
    reply): a newer layout (and its letter), this layout, or corrupt."""
    assert python_reads(data) == expected
    key = _put(rstore, "rule-1", data)
    begin = (layout.pack_key(KEY), TOOL, b"token", "1", 60_000, 1)
    reply = rstore.client.eval(script_source("begin"), 1, key, *begin)
    if expected is None:
        assert reply[0] != b"corrupt", reply
    elif expected:
        assert reply == [
            b"corrupt",
            0,
            None,
            None,
            str(layout.LayoutVersionError(expected)).encode(),
            expected.encode(),
        ]
    else:
        assert reply[0] == b"corrupt" and len(reply) == 5, reply
    if expected is not None:
        resolve = (b"release", b"", b"operator:x", b"0", b"", b"", 60_000, 1, b"", b"")
        answer = rstore.client.eval(script_source("resolve"), 1, key, *resolve)
        assert answer == ([b"newer", expected.encode()] if expected else b"ok"), answer


@pytest.mark.parametrize("first", [True, False], ids=["first-begin-of-a-store", "later-begin"])
@pytest.mark.parametrize("reversible", [False, True], ids=["irreversible", "reversible"])
@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_newer_record_is_refused_at_begin_and_the_tool_never_runs(
    redis_server: EmbeddedRedis, namespace: str, mode: str, reversible: bool, first: bool
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    guard = EffectGuard(store)
    runs: list[str] = []

    kind = Reversibility.REVERSIBLE if reversible else Reversibility.IRREVERSIBLE

    @reversibility(kind)
    def charge(account: str) -> str:
        runs.append(account)
        return account

    @reversibility(kind)
    async def acharge(account: str) -> str:
        runs.append(account)
        return account

    tool: Callable[[str], Any] = guard.wrap(charge)
    atool = guard.wrap(acharge, name="charge")

    def call(tool_call_id: str) -> Any:
        with tool_call_context(tool_call_id):
            if mode == "sync":
                return tool("acct")
            return asyncio.run(atool("acct"))

    if not first:  # the store has run a script: a begin is SET NX first, then the begin script
        assert call("warm-1") == "acct"
        runs.clear()
    _put(store, "new-1")
    for _ in range(2):
        with pytest.raises(EffectRefused) as refused:
            call("new-1")
        assert refused.value.reason == "record_corrupt"
        message = str(refused.value)
        assert "written by a newer airlock-redis (record layout version 'c'" in message, message
        assert "upgrade airlock-redis on this host" in message, message
        # the hint says upgrade and does not send anyone to resolve it (resolving it here is refused)
        hint = refused.value.fix_hint
        assert "upgrade airlock-redis on this host" in hint and "resolve" not in hint, hint
    assert runs == []
    _unchanged(store, "new-1")
    store.close()


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_the_store_raises_record_version_error_at_begin_and_get(rstore: RedisEffectStore, mode: str) -> None:
    _put(rstore, "new-2")
    request = BeginRequest("new-2", KEY, TOOL, secrets.token_hex(16), True)
    with pytest.raises(RecordVersionError) as info:
        if mode == "sync":
            rstore.begin(request)
        else:
            asyncio.run(rstore.abegin(request))
    assert isinstance(info.value, CorruptRecordError) and info.value.version == "c"
    assert "upgrade airlock-redis" in str(info.value) and "refused too" in str(info.value)
    with pytest.raises(
        RecordVersionError, match="the record of 'new-2' was written by a newer airlock-redis"
    ):
        if mode == "sync":
            rstore.get("new-2")
        else:
            asyncio.run(rstore.aget("new-2"))
    _unchanged(rstore, "new-2")


def test_a_begin_with_wait_replicas_raises_record_version_error(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    """The begin sent with WAIT (wait_replicas) reads the same reply: refused before any wait counts."""
    store = RedisEffectStore(redis_server.url, namespace=namespace, wait_replicas=1, wait_timeout=0.05)
    _put(store, "new-3")
    request = BeginRequest("new-3", KEY, TOOL, secrets.token_hex(16), False)
    with pytest.raises(RecordVersionError):
        store.begin(request)
    with pytest.raises(RecordVersionError):
        asyncio.run(store.abegin(request))
    _unchanged(store, "new-3")
    store.close()


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_commit_settle_and_resolve_leave_a_newer_record_as_it_is(rstore: RedisEffectStore, mode: str) -> None:
    """commit and settle answer as for any string they cannot read ("superseded"); resolve, which
    writes over a damaged record of this layout, refuses a newer one (RecordVersionError)."""
    _put(rstore, "new-4")
    request = BeginRequest("new-4", KEY, TOOL, secrets.token_hex(16), False)

    guard = EffectGuard(rstore)

    def run(method: str, *args: Any, **kwargs: Any) -> Any:
        """``rstore.<method>`` (or the guard's, for resolve with force) in the mode under test."""
        owner: Any = guard if kwargs.get("force") else rstore
        if mode == "sync":
            return getattr(owner, method)(*args, **kwargs)
        return asyncio.run(getattr(owner, "a" + method)(*args, **kwargs))

    assert run("commit", request, 1, b"v", None) is TransitionResult.SUPERSEDED
    for settlement in Settlement:
        assert run("settle", request, 1, settlement) is TransitionResult.SUPERSEDED
    for verdict in (Status.COMMITTED, Status.UNKNOWN, Settlement.RELEASE):
        with pytest.raises(RecordVersionError, match="upgrade airlock-redis"):
            run("resolve", "new-4", verdict)
        with pytest.raises(RecordVersionError):  # forced: the guard reads it, then the script refuses
            run("resolve", "new-4", verdict, force=True)
    _unchanged(rstore, "new-4")


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_and_list_show_a_newer_record(
    rstore: RedisEffectStore, redis_server: EmbeddedRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    _put(rstore, "new-5")
    shown = "written by a newer airlock-redis (layout c)"
    view = read_record(rstore.client, rstore.namespace, "new-5")
    assert view is not None and view.layout_version == "c" and view.status is None
    assert len(view.problems) == 1 and view.problems[0].startswith(shown), view.problems
    [listed] = list_records(rstore.client, rstore.namespace).records
    assert (listed.tool_call_id, listed.layout_version, listed.problems) == ("new-5", "c", view.problems)

    target = ["--url", redis_server.url, "--namespace", rstore.namespace]
    code, out, err = _cli(["inspect", "new-5", *target], capsys)
    assert code == 0 and shown in out and "upgrade airlock-redis" in out, (out, err)
    code, out, err = _cli(["inspect", "new-5", *target, "--json"], capsys)
    assert code == 0 and json.loads(out)["layout_version"] == "c", (out, err)
    code, out, err = _cli(["list", *target], capsys)
    assert code == 0 and "newer!" in out and "'new-5'" in out, (out, err)
    code, out, err = _cli(["list", *target, "--json"], capsys)
    [row] = json.loads(out)["records"]
    assert code == 0 and row["layout_version"] == "c" and row["problems"][0].startswith(shown), out
    # the CLI's resolve of it is refused by the script, and says to upgrade
    code, out, err = _cli(["resolve", "new-5", *target, "--release", "--yes"], capsys)
    assert code != 0 and "upgrade airlock-redis" in err, (code, out, err)
    _unchanged(rstore, "new-5")


def test_a_newer_record_with_a_long_header_is_still_shown_as_newer(rstore: RedisEffectStore) -> None:
    """A listing reads the first 512 bytes of each record (a header of 403 here, fields of 5,000 after
    it): a newer header is recognised within them."""
    long_header = b"cc" + b"1," * 200 + b";" + b"x" * 5000
    _put(rstore, "new-6", long_header)
    [listed] = list_records(rstore.client, rstore.namespace).records
    assert listed.layout_version == "c"
