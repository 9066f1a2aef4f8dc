"""The Lua sent to the server is the source without comments, indentation or unused helpers
(airlock_redis/stores/scripts.py): what it keeps and drops, and that the server runs it the same."""

from __future__ import annotations

import pytest
import redis

from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.scripts import (
    HELPERS_HERE,
    SCRIPT_NAMES,
    assemble,
    compact,
    helpers_for,
    script_source,
)


def test_comments_go_and_strings_that_hold_dashes_or_quotes_stay() -> None:
    lua = "\n".join(
        [
            "-- a whole-line comment",
            "   local a = 'x -- not a comment'  -- a comment",
            '  local b = "it\'s -- still text"',
            "  local c = 'esc\\'aped -- text' -- gone",
            "",
            "return a .. b .. c",
        ]
    )
    assert compact(lua) == (
        "local a = 'x -- not a comment'\n"
        'local b = "it\'s -- still text"\n'
        "local c = 'esc\\'aped -- text'\n"
        "return a .. b .. c\n"
    )


@pytest.mark.parametrize("line", ["local s = [[long]]", "--[[ block", "local t = 'open"])
def test_what_it_cannot_read_safely_is_refused(line: str) -> None:
    with pytest.raises(ValueError):
        compact(line)


def test_only_the_helpers_a_script_uses_are_sent_with_it() -> None:
    common = "local A = 1\nlocal function f()\n  return A\nend\nlocal function g()\n  return 2\nend\n"
    assert helpers_for(common, "return f()\n") == "local A = 1\nlocal function f()\nreturn A\nend\n"
    assert helpers_for(common, "return 3\n") == ""
    with pytest.raises(ValueError):
        helpers_for("x = 1\nlocal A = 1\n", "return A\n")


def test_a_block_before_the_marker_runs_before_the_helpers_and_may_not_use_them() -> None:
    common = "local A = 1\nlocal function f()\n  return A\nend\n"
    text = f"-- the header\nif ARGV[1] then\n  return 0\nend\n{HELPERS_HERE}\nreturn f()\n"
    assert assemble("s", text, common) == (
        "if ARGV[1] then\nreturn 0\nend\nlocal A = 1\nlocal function f()\nreturn A\nend\nreturn f()\n"
    )
    assert assemble("s", "return f()\n", common).startswith("local A = 1\n")  # no marker: helpers first
    with pytest.raises(ValueError, match=r"s.lua uses shared helpers before they are defined: \['f'\]"):
        assemble("s", f"if f() then\n  return 0\nend\n{HELPERS_HERE}\nreturn 1\n", common)


def test_the_commits_common_case_runs_before_the_helpers() -> None:
    source = script_source("commit")
    assert source.index("redis.call('GET', KEYS[1]) == ARGV[10]") < source.index("local function parse")


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_compiles_on_the_server_under_test(redis_server: EmbeddedRedis, name: str) -> None:
    """SCRIPT LOAD compiles without running; every name a script uses is defined before it."""
    client = redis_server.client()
    source = script_source(name)
    assert "--" not in "".join(line.split("'")[0] for line in source.splitlines())
    sha = client.script_load(source)
    assert client.script_exists(sha) == [True]
    if name in ("renew", "wait"):  # take no argument they could check: they run, and find no record
        assert client.eval(source, 1, "compaction-probe", *(["x"] * 10)) in (b"missing", [b"changed"])
    else:
        with pytest.raises(redis.ResponseError, match="airlock"):  # runs: its argument checks answer
            client.eval(source, 1, "compaction-probe", *(["x"] * 10))
    client.close()
