"""The operator's views (stores/operator_view.py's OperatorStore): the same checks against the in-memory
store and a real Redis store (a redis-server the suite starts; never fakeredis here)."""

from __future__ import annotations

import dataclasses
import io
import json
import secrets
from collections.abc import Iterator

import pytest

from airlock_redis import EffectGuard, InMemoryEffectStore, RedisEffectStore, idempotency_key
from airlock_redis.core.codec import decode_result, encode_result
from airlock_redis.core.records import BeginKind, BeginRequest, Settlement, Status, TransitionResult
from airlock_redis.core.verdicts import Fence
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.operator import AuditLog, AuditWriteError, audit_stream_key
from airlock_redis.stores.memory import InMemoryOperatorView
from airlock_redis.stores.operator_view import (
    ListFilter,
    ListQuery,
    OperatorStore,
    RecordView,
    views_of,
)
from airlock_redis.stores.redis_operator import RedisOperatorView

ARGS = {"cents": 5}
KEY = idempotency_key("charge", ARGS)


@pytest.fixture(params=["memory", "redis"])
def views(request: pytest.FixtureRequest, namespace: str) -> Iterator[OperatorStore]:
    if request.param == "memory":
        yield views_of(InMemoryEffectStore())
        return
    server: EmbeddedRedis = request.getfixturevalue("redis_server")
    store = RedisEffectStore(server.url, namespace=namespace)
    try:
        yield views_of(store)
    finally:
        store.close()


def _begin(
    views: OperatorStore, tool_call_id: str, *, tool: str = "charge", reversible: bool = False
) -> BeginRequest:
    key = KEY if tool == "charge" else idempotency_key(tool, ARGS)
    request = BeginRequest(tool_call_id, key, tool, secrets.token_hex(16), reversible)
    assert views.store.begin(request).kind is BeginKind.STARTED
    return request


def _committed(
    views: OperatorStore, tool_call_id: str, value: object = "paid", *, tool: str = "charge"
) -> None:
    request = _begin(views, tool_call_id, tool=tool)
    assert views.store.commit(request, 1, encode_result(value), None) is TransitionResult.OK


def _unknown(views: OperatorStore, tool_call_id: str) -> None:
    request = _begin(views, tool_call_id)
    assert views.store.settle(request, 1, Settlement.UNKNOWN) is TransitionResult.OK


def _shown(view: RecordView) -> Fence:
    """The fence of what the operator was shown (as resolve_cmd.shown_fence builds it)."""
    assert view.status is not None
    return Fence(key=view.idempotency_key, status=Status(view.status), owner=view.owner)


# -- which implementation a store gets ---------------------------------------------------------------
def test_each_store_gets_its_own_views(redis_server: EmbeddedRedis, namespace: str) -> None:
    memory = InMemoryEffectStore()
    assert isinstance(views_of(memory), InMemoryOperatorView)
    assert views_of(memory).store is memory
    with RedisEffectStore(redis_server.url, namespace=namespace) as redis_store:
        redis_views = views_of(redis_store)
        assert isinstance(redis_views, RedisOperatorView)
        assert (redis_views.store, redis_views.namespace) == (redis_store, namespace)
    for made in (views_of(memory), redis_views):
        assert isinstance(made, OperatorStore)
        assert views_of(made) is made  # views are their own views
    with pytest.raises(TypeError, match="offers no operator views"):
        views_of(object())  # type: ignore[arg-type]


# -- inspect: one record -----------------------------------------------------------------------------
def test_a_committed_record_shows_its_fields_and_value(views: OperatorStore) -> None:
    _committed(views, "c-1", {"paid": 5})
    view = views.read_record("c-1")
    assert view is not None
    assert (view.tool_call_id, view.status, view.tool, view.idempotency_key, view.attempt) == (
        "c-1",
        "committed",
        "charge",
        KEY,
        1,
    )
    assert view.stored and view.value is not None and decode_result(view.value) == {"paid": 5}
    assert view.value_bytes == len(encode_result({"paid": 5}))
    assert view.committed_ms is not None and view.begun_ms is not None and view.ttl_ms is not None
    assert view.ttl_ms > 0 and view.problems == ()
    assert view.preview() == '{"paid": 5}'


def test_a_pending_and_an_unknown_record_show_their_status_and_owner(views: OperatorStore) -> None:
    pending = _begin(views, "p-1")
    _unknown(views, "u-1")
    shown_pending, shown_unknown = views.read_record("p-1"), views.read_record("u-1")
    assert shown_pending is not None and shown_unknown is not None
    assert (shown_pending.status, shown_pending.owner, shown_pending.committed_ms) == (
        "pending",
        pending.token,
        None,
    )
    assert not shown_pending.stored and shown_pending.value is None
    assert shown_unknown.status == "unknown"


def test_a_released_or_absent_record_is_no_record(views: OperatorStore) -> None:
    request = _begin(views, "r-1")
    assert views.store.settle(request, 1, Settlement.RELEASE) is TransitionResult.OK
    assert views.read_record("r-1") is None  # the tombstone left behind is not a record
    assert views.read_record("never-1") is None
    assert views.list_records().records == []


def test_a_committed_value_that_does_not_decode_is_a_problem_not_an_error(views: OperatorStore) -> None:
    request = _begin(views, "bad-1")
    assert views.store.commit(request, 1, b"\xc1 not a codec value", None) is TransitionResult.OK
    view = views.read_record("bad-1")
    assert view is not None and [p.partition(" (")[0] for p in view.problems] == ["value does not decode"]


# -- list: filters and paging ------------------------------------------------------------------------
def test_a_listing_filters_by_status_tool_and_age(views: OperatorStore) -> None:
    _committed(views, "c-1")
    _committed(views, "c-2", tool="refund")
    _begin(views, "p-1")
    _unknown(views, "u-1")

    def ids(where: ListFilter) -> set[str]:
        page = views.list_records(ListQuery(where))
        assert page.next_cursor is None
        return {v.tool_call_id for v in page.records}

    assert ids(ListFilter()) == {"c-1", "c-2", "p-1", "u-1"}
    assert ids(ListFilter(status="committed")) == {"c-1", "c-2"}
    assert ids(ListFilter(status="pending")) == {"p-1"}
    assert ids(ListFilter(tool="refund")) == {"c-2"}
    assert ids(ListFilter(status="committed", tool="charge")) == {"c-1"}
    assert ids(ListFilter(older_than_s=3600)) == set()  # all begun just now
    assert ids(ListFilter(older_than_s=0)) == {"c-1", "c-2", "p-1", "u-1"}


def test_a_listing_reads_no_value(views: OperatorStore) -> None:
    _committed(views, "c-1", "x" * 100)
    [listed] = views.list_records().records
    assert listed.value is None and listed.stored and listed.value_bytes == len(encode_result("x" * 100))


def test_pages_cover_every_record_once_at_most_limit_at_a_time(views: OperatorStore) -> None:
    made = {f"page-{i}" for i in range(12)}
    for tool_call_id in sorted(made):
        _committed(views, tool_call_id)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = views.list_records(ListQuery(limit=5, scan_count=3, cursor=cursor))
        assert len(page.records) <= 5
        seen += [v.tool_call_id for v in page.records]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
        assert pages < 20, "the cursor does not move on"
    assert set(seen) == made and len(seen) == len(made)  # no record left out, none twice here
    assert pages >= 3  # 12 records, 5 a page


def test_a_listing_stops_after_max_scanned_and_its_cursor_goes_on(views: OperatorStore) -> None:
    made = {f"scan-{i}" for i in range(12)}
    for tool_call_id in sorted(made):
        _committed(views, tool_call_id)
    first = views.list_records(ListQuery(limit=100, scan_count=1, max_scanned=1))
    assert first.next_cursor is not None and 1 <= first.scanned < len(made)
    seen = {v.tool_call_id for v in first.records}
    cursor: str | None = first.next_cursor
    while cursor is not None:
        page = views.list_records(ListQuery(limit=100, cursor=cursor))
        seen |= {v.tool_call_id for v in page.records}
        cursor = page.next_cursor
    assert seen == made


@pytest.mark.parametrize("cursor", ["9:0:0", "x", "1:2"])
def test_a_cursor_no_listing_printed_is_refused(views: OperatorStore, cursor: str) -> None:
    with pytest.raises(ValueError, match="not a cursor from a previous list"):
        views.list_records(ListQuery(cursor=cursor))


def test_bounds_that_are_not_positive_are_refused() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        ListQuery(limit=0)


# -- resolve: fenced on what the operator was shown ---------------------------------------------------
def test_a_verdict_on_a_record_that_committed_since_it_was_shown_is_refused(views: OperatorStore) -> None:
    request = _begin(views, "f-1")
    shown = views.read_record("f-1")
    assert shown is not None and shown.status == "pending"
    assert views.store.commit(request, 1, encode_result("paid"), None) is TransitionResult.OK  # meanwhile
    result = views.resolve("f-1", Settlement.RELEASE, fence=_shown(shown))
    assert result is TransitionResult.CHANGED
    after = views.read_record("f-1")
    assert after is not None and after.status == "committed"  # not released: the call took effect


def test_a_verdict_on_a_record_a_retry_took_over_is_refused(views: OperatorStore) -> None:
    _begin(views, "f-2", reversible=True)
    shown = views.read_record("f-2")
    assert shown is not None
    retry = BeginRequest("f-2", KEY, "charge", secrets.token_hex(16), True)
    assert views.store.begin(retry).attempt == 2  # a reversible retry took the record over
    assert views.resolve("f-2", Status.UNKNOWN, fence=_shown(shown)) is TransitionResult.CHANGED
    after = views.read_record("f-2")
    assert after is not None and (after.status, after.owner, after.attempt) == ("pending", retry.token, 2)


def test_a_verdict_on_what_was_shown_applies(views: OperatorStore) -> None:
    _unknown(views, "f-3")
    shown = views.read_record("f-3")
    assert shown is not None
    value = encode_result({"refund": "r-9"})
    assert views.resolve("f-3", Status.COMMITTED, fence=_shown(shown), value=value) is TransitionResult.OK
    after = views.read_record("f-3")
    assert after is not None and after.status == "committed" and after.value == value
    assert after.owner != shown.owner  # the operator's verdict holds the record now


def test_a_verdict_for_another_key_or_no_record_changes_nothing(views: OperatorStore) -> None:
    _unknown(views, "f-4")
    shown = views.read_record("f-4")
    assert shown is not None
    other = Fence(key=idempotency_key("charge", {"cents": 6}), status=Status.UNKNOWN, owner=shown.owner)
    assert views.resolve("f-4", Settlement.RELEASE, fence=other) is TransitionResult.MISMATCH
    after = views.read_record("f-4")
    assert after is not None and dataclasses.replace(after, ttl_ms=None) == dataclasses.replace(
        shown, ttl_ms=None
    )
    assert views.resolve("absent", Settlement.RELEASE, fence=Fence()) is TransitionResult.MISSING


def test_the_guard_resolves_through_the_views_store(views: OperatorStore) -> None:
    """What resolve_cmd does: EffectGuard(views.store).resolve(..., seen=<fence shown>)."""
    request = _begin(views, "g-1")
    shown = views.read_record("g-1")
    assert shown is not None
    assert views.store.settle(request, 1, Settlement.UNKNOWN) is TransitionResult.OK  # meanwhile
    guard = EffectGuard(views.store)
    assert guard.resolve("g-1", "release", seen=_shown(shown)) is TransitionResult.CHANGED
    again = views.read_record("g-1")
    assert again is not None and again.status == "unknown"
    assert guard.resolve("g-1", "release", seen=_shown(again)) is TransitionResult.OK
    assert views.read_record("g-1") is None


# -- audit: written, read back newest first ----------------------------------------------------------
def test_audit_entries_are_read_back_newest_first(views: OperatorStore) -> None:
    assert views.read_audit() == []
    echo = io.StringIO()
    with AuditLog(None, trail=views, echo=echo) as audit:
        audit.write({"action": "resolve", "tool_call_id": "a-1", "verdict": "release", "result": "ok"})
        audit.write({"action": "resolve", "tool_call_id": "a-2", "verdict": "unknown", "result": "changed"})
    entries = views.read_audit()
    assert [(e["tool_call_id"], e["result"]) for e in entries] == [("a-2", "changed"), ("a-1", "ok")]
    assert all(e["stream_id"] and e["operator"] and e["ts"] for e in entries)
    assert entries[0]["stream_id"] != entries[1]["stream_id"]
    assert [e["tool_call_id"] for e in views.read_audit(limit=1)] == ["a-2"]
    assert echo.getvalue().count("audit: ") == 2  # echoed as well


def test_an_audit_entry_that_is_not_json_is_shown_unreadable(views: OperatorStore) -> None:
    views.append_audit("not json")
    [entry] = views.read_audit()
    assert entry["unreadable"] == "not json" and entry["stream_id"]


def test_the_audit_trail_holds_the_redacted_entry(views: OperatorStore) -> None:
    with AuditLog(None, trail=views, echo=io.StringIO()) as audit:
        audit.write({"url": "redis://user:s3cret-pass@host:6379/0"})
    [entry] = views.read_audit()
    assert "s3cret-pass" not in json.dumps(entry)


def test_a_refused_audit_entry_raises_after_the_echo(redis_server: EmbeddedRedis, namespace: str) -> None:
    with RedisEffectStore(redis_server.url, namespace=namespace) as store:
        store.client.set(audit_stream_key(namespace), b"not a stream")  # XADD answers WRONGTYPE
        echo = io.StringIO()
        with AuditLog(None, trail=views_of(store), echo=echo) as audit, pytest.raises(AuditWriteError):
            audit.write({"action": "resolve", "tool_call_id": "a-9"})
        assert '"tool_call_id": "a-9"' in echo.getvalue()
        store.client.delete(audit_stream_key(namespace))
