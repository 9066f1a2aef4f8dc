"""A record key names its namespace and tool_call_id exactly: read back from the left, whatever the id
holds (``:{<16 hex digits>}:``, braces), and never as a record of a namespace that merely begins the
same way (issue 22, scenarios 9 and 10). No server: the key functions alone."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from airlock_redis.stores.keys import (
    acl_key_pattern,
    check_namespace,
    record_key,
    record_pattern,
    slot_tag,
    tool_call_id_of,
)

# namespaces as check_namespace admits them: no braces, no glob characters
namespaces = st.text(
    alphabet=st.characters(exclude_characters="{}*?[]\\", exclude_categories=["Cs"]), min_size=1
).filter(lambda ns: check_namespace(ns) == ns)
tag_like = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16).map(lambda t: ":{" + t + "}:")
ids = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    st.lists(st.one_of(st.text(max_size=4), tag_like, st.sampled_from(["{", "}", "}{", ":"]))).map("".join),
)


def redis_glob(pattern: str) -> re.Pattern[str]:
    """The patterns used here hold only ``*`` and ``?`` as special characters (a namespace holds no
    glob character): each is Redis' glob, as a regular expression."""
    parts = {"*": ".*", "?": "."}
    return re.compile("".join(parts.get(c, re.escape(c)) for c in pattern), re.DOTALL)


@settings(max_examples=300, deadline=None)
@given(namespaces, ids)
def test_the_id_is_read_back_exactly(namespace: str, tool_call_id: str) -> None:
    key = record_key(namespace, tool_call_id)
    assert tool_call_id_of(namespace, key) == tool_call_id
    assert tool_call_id_of(namespace, key.decode()) == tool_call_id
    assert redis_glob(record_pattern(namespace)).fullmatch(key.decode())
    assert redis_glob(acl_key_pattern(namespace)).fullmatch(key.decode())


@settings(max_examples=300, deadline=None)
@given(namespaces, st.text(min_size=1).filter(lambda s: "{" not in s and "}" not in s), ids)
def test_a_longer_namespace_is_never_read_as_the_shorter_one(
    namespace: str, more: str, tool_call_id: str
) -> None:
    longer = f"{namespace}:{more}"  # "acme" and "acme:eu"
    key = record_key(longer, tool_call_id).decode()
    assert tool_call_id_of(namespace, key) is None
    assert not redis_glob(record_pattern(namespace)).fullmatch(key)
    assert not redis_glob(acl_key_pattern(namespace)).fullmatch(key)


def test_the_examples_of_the_issue() -> None:
    inner = ":{" + slot_tag("inner") + "}:inner"  # the middle of the record key of the id "inner"
    for tool_call_id in ("x:{0123456789abcdef}:y", "}{", inner):
        key = record_key("acme", tool_call_id)
        assert tool_call_id_of("acme", key) == tool_call_id
        assert tool_call_id_of("acme:eu", key) is None
    assert tool_call_id_of("acme", record_key("acme:eu", "x")) is None
    assert acl_key_pattern("acme") == "acme:{*"


def test_keys_that_are_not_records_are_not_read_as_records() -> None:
    good = record_key("acme", "call-1")
    assert tool_call_id_of("acme", good.replace(slot_tag("call-1").encode(), b"0" * 16)) is None  # wrong tag
    assert tool_call_id_of("acme", b"acme:{" + slot_tag("x").encode() + b"}x") is None  # no ":" after "}"
    assert tool_call_id_of("acme", b"acme:{short}:x") is None
    assert tool_call_id_of("acme", b"acme:audit") is None  # the namespace's audit stream
    assert tool_call_id_of("acme", b"acme:{" + b"\xff" * 20) is None  # not UTF-8: not a record key
