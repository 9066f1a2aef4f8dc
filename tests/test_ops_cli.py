"""The operator commands (inspect, list, resolve) against real redis-servers, through the CLI's main()."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    RedisEffectStore,
    Status,
    reversibility,
    tool_call_context,
)
from airlock_redis.cli import main
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores import layout
from airlock_redis.stores.keys import slot_tag

pytestmark = pytest.mark.redis_server
SIGNING_KEY = "operator-test-signing-key-0123456789"


def rewrite(store: RedisEffectStore, tool_call_id: str, change: Callable[[bytes], bytes]) -> None:
    """Write a record's string back changed (its TTL kept), as someone with access to Redis could."""
    key = store.key(tool_call_id)
    data = store.client.get(key)
    assert isinstance(data, bytes)
    store.client.set(key, change(data), keepttl=True)


class Host:
    """A guard on a namespace, with a tool whose answer can be lost."""

    def __init__(self, url: str, namespace: str, **guard_options: Any) -> None:
        self.store = RedisEffectStore(url, namespace=namespace)
        self.guard = EffectGuard(self.store, **guard_options)
        self.runs: list[str] = []

        def charge(account: str, lose: bool = False) -> dict[str, Any]:
            self.runs.append(account)
            if lose:
                raise TimeoutError("the answer was lost")
            return {"account": account, "link": "redis://alice:hunter2@db.example/0"}

        @reversibility("reversible")
        def lookup(account: str) -> str:
            return account

        self.charge = self.guard.wrap(charge)
        self.lookup = self.guard.wrap(lookup)

    def call(self, tool_call_id: str, account: str = "acct", lose: bool = False) -> Any:
        with tool_call_context(tool_call_id):
            return self.charge(account, lose=lose)

    def retry(self, tool_call_id: str, account: str = "acct") -> Any:
        """The host's retry of a call whose answer was lost (same arguments)."""
        return self.call(tool_call_id, account, lose=True)

    def lost(self, tool_call_id: str, account: str = "acct") -> None:
        with pytest.raises(TimeoutError):
            self.call(tool_call_id, account, lose=True)


def run_cli(
    argv: list[str], capsys: pytest.CaptureFixture[str], stdin: str | None = ""
) -> tuple[int, str, str]:
    if stdin is not None:
        import sys

        old = sys.stdin
        sys.stdin = io.StringIO(stdin)
        try:
            code = main(argv)
        finally:
            sys.stdin = old
    else:
        code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def target(redis_server: EmbeddedRedis, namespace: str) -> list[str]:
    return ["--url", redis_server.url, "--namespace", namespace]


@pytest.fixture
def host(redis_server: EmbeddedRedis, namespace: str) -> Host:
    return Host(redis_server.url, namespace)


# -- inspect ---------------------------------------------------------------------------------------
def test_inspect_shows_the_record_and_no_secret(host: Host, target: list[str], capsys: Any) -> None:
    host.call("call-1")
    code, out, _ = run_cli(["inspect", "call-1", *target], capsys)
    assert code == 0
    record = host.store.get("call-1")
    assert record is not None
    for expected in (
        "committed",
        "charge",
        record.idempotency_key,
        "attempt          1",
        "expires in",
        "24.0h",
    ):
        assert expected in out
    assert '"account": "acct"' in out  # the decoded value preview
    assert "hunter2" not in out and "redis://***@db.example" in out

    code, out, _ = run_cli(["inspect", "call-1", *target, "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["status"] == "committed" and data["idempotency_key"] == record.idempotency_key
    assert data["attempt"] == 1 and 0 < data["ttl_ms"] <= 86_400_000 and data["age_ms"] >= 0
    assert "hunter2" not in out


def test_inspect_truncates_the_preview(host: Host, target: list[str], capsys: Any) -> None:
    host.call("call-1", account="x" * 500)
    code, out, _ = run_cli(["inspect", "call-1", *target, "--json", "--preview-chars", "40"], capsys)
    assert code == 0 and len(json.loads(out)["value_preview"]) == 40


def test_inspect_of_a_missing_record_exits_1(target: list[str], capsys: Any) -> None:
    code, _, err = run_cli(["inspect", "nope", *target], capsys)
    assert code == 1 and "no record" in err


def test_inspect_shows_what_is_wrong_with_a_damaged_record(
    host: Host, target: list[str], capsys: Any
) -> None:
    host.call("call-1")
    rewrite(host.store, "call-1", lambda data: data[:1] + b"x" + data[2:])  # the status letter
    code, out, _ = run_cli(["inspect", "call-1", *target], capsys)
    assert code == 0 and "PROBLEM" in out and "unknown status 'x'" in out


def test_a_password_in_the_url_never_shows(redis_server: EmbeddedRedis, namespace: str, capsys: Any) -> None:
    # the default user has no password, so Redis accepts any: the URL carries one all the same
    scheme, _, rest = redis_server.url.partition("://")
    url = f"{scheme}://default:hunter2@{rest}"
    host = Host(url, namespace)
    host.lost("call-1")
    for argv in (["inspect", "call-1"], ["list"], ["inspect", "nope"]):
        code, out, err = run_cli([*argv, "--url", url, "--namespace", namespace], capsys)
        assert "hunter2" not in out + err
    code, out, err = run_cli(["inspect", "x", "--url", "redis://bob:hunter2@127.0.0.1:1/0"], capsys)
    assert code == 2 and "hunter2" not in out + err and "error" in err
    assert "hunter2" not in repr(host.store)


def test_the_url_comes_from_the_environment(
    host: Host, redis_server: EmbeddedRedis, namespace: str, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.call("call-1")
    monkeypatch.setenv("AIRLOCK_REDIS_URL", redis_server.url)
    code, out, _ = run_cli(["inspect", "call-1", "--namespace", namespace], capsys)
    assert code == 0 and "committed" in out


# -- list ------------------------------------------------------------------------------------------
def test_list_filters_by_status_tool_and_age(host: Host, target: list[str], capsys: Any) -> None:
    host.call("done-1")
    host.lost("lost-1")
    host.lost("lost-old")
    with tool_call_context("look-1"):
        host.lookup("acct")
    an_hour_ago = time.time_ns() // 1_000_000 - 3_600_000
    rewrite(host.store, "lost-old", lambda data: layout.edit(data, begun_ms=an_hour_ago))

    def ids(*extra: str) -> set[str]:
        code, out, _ = run_cli(["list", *target, "--json", *extra], capsys)
        assert code == 0
        return {r["tool_call_id"] for r in json.loads(out)["records"]}

    assert ids() == {"done-1", "lost-1", "lost-old", "look-1"}
    assert ids("--status", "unknown") == {"lost-1", "lost-old"}
    assert ids("--status", "committed") == {"done-1", "look-1"}
    assert ids("--tool", "lookup") == {"look-1"}
    assert ids("--status", "unknown", "--older-than", "10m") == {"lost-old"}
    assert ids("--older-than", "2h") == set()

    code, out, err = run_cli(["list", *target], capsys)
    assert code == 0 and "lost-old" in out and "unknown" in out and "4 record(s)" in err


def test_list_pages_through_everything_without_losing_records(
    host: Host, target: list[str], capsys: Any
) -> None:
    expected = {f"call-{i}" for i in range(23)}
    for tool_call_id in expected:
        host.call(tool_call_id)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        extra = ["--cursor", cursor] if cursor else []
        code, out, _ = run_cli(
            ["list", *target, "--json", "--limit", "5", "--scan-count", "7", *extra], capsys
        )
        assert code == 0
        page = json.loads(out)
        assert len(page["records"]) <= 5
        seen.extend(r["tool_call_id"] for r in page["records"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert pages < 50
    assert set(seen) == expected
    assert pages >= 5


# ids a model or an MCP client may pick that hold what a record key's middle looks like
# (":{<16 hex digits>}:", braces): issue 22, scenario 10
AWKWARD_IDS = (
    "x:{0123456789abcdef}:y",
    ":{0123456789abcdef}:",
    "}{",
    "a}{b:{0123456789abcdef}:c}{",
    ":{" + slot_tag("inner") + "}:inner",  # the middle of a real record key of the id "inner"
)


def test_list_shows_every_record_once_with_its_true_id_and_no_other_namespaces(
    redis_server: EmbeddedRedis, namespace: str, tmp_path: Path, capsys: Any
) -> None:
    mine = Host(redis_server.url, namespace)
    neighbour = Host(redis_server.url, f"{namespace}:eu")  # a namespace that begins with this one
    for tool_call_id in ("plain", *AWKWARD_IDS):
        mine.lost(tool_call_id)  # stuck in unknown: every retry refused until someone resolves it
    for tool_call_id in ("plain", "eu-only", AWKWARD_IDS[0]):
        neighbour.lost(tool_call_id)
    with pytest.raises(EffectRefused):
        mine.retry(AWKWARD_IDS[0])

    def listed(ns: str, *extra: str) -> list[str]:
        code, out, err = run_cli(
            ["list", "--url", redis_server.url, "--namespace", ns, "--json", *extra], capsys
        )
        assert code == 0, err
        page = json.loads(out)
        assert page["next_cursor"] is None
        assert {r["status"] for r in page["records"]} <= {"unknown"}
        return sorted(r["tool_call_id"] for r in page["records"])

    assert listed(namespace) == sorted(("plain", *AWKWARD_IDS))  # each once, none under another name
    assert listed(namespace, "--status", "unknown") == sorted(("plain", *AWKWARD_IDS))
    assert listed(f"{namespace}:eu") == sorted(("plain", "eu-only", AWKWARD_IDS[0]))

    # the id listed is the one the other commands take: the stuck call is resolved and runs again
    code, out, _ = run_cli(
        ["inspect", AWKWARD_IDS[0], "--url", redis_server.url, "--namespace", namespace], capsys
    )
    assert code == 0 and "unknown" in out
    code, _, err = run_cli(
        ["resolve", AWKWARD_IDS[0], "--url", redis_server.url, "--namespace", namespace, "--release", "--yes",
         "--audit-log", str(tmp_path / "audit.jsonl")],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    mine.call(AWKWARD_IDS[0])
    assert mine.runs.count("acct") == len(AWKWARD_IDS) + 2  # each lost call once, and this one again
    assert neighbour.store.get(AWKWARD_IDS[0]) is not None  # the neighbour's record of that id untouched
    assert listed(namespace, "--status", "unknown") == sorted(("plain", *AWKWARD_IDS[1:]))


@pytest.mark.parametrize(("age", "says"), [("soon", "not a duration"), ("10", "give it a unit")])
def test_list_bad_duration_is_a_usage_error(target: list[str], capsys: Any, age: str, says: str) -> None:
    """A bare number is refused: is "10" ten seconds or ten minutes?"""
    with pytest.raises(SystemExit) as exit_info:
        main(["list", *target, "--older-than", age])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def test_list_works_where_keys_is_disabled(namespace: str, capsys: Any) -> None:
    """list uses SCAN only: on a server where KEYS does not exist it still lists everything."""
    with EmbeddedRedis(extra_args=["--rename-command", "KEYS", ""]) as server:
        with pytest.raises(redis.ResponseError):
            redis.Redis.from_url(server.url).keys("*")
        host = Host(server.url, namespace)
        host.call("call-1")
        host.lost("call-2")
        code, out, _ = run_cli(["list", "--url", server.url, "--namespace", namespace, "--json"], capsys)
    assert code == 0
    assert {r["tool_call_id"] for r in json.loads(out)["records"]} == {"call-1", "call-2"}


def test_list_scans_every_primary_of_a_cluster(
    request: pytest.FixtureRequest, namespace: str, capsys: Any
) -> None:
    from .topologies import shared_cluster

    cluster = shared_cluster(request.config)
    host = Host(cluster.url, namespace)
    expected = {f"call-{i}" for i in range(30)}
    for tool_call_id in expected:
        host.call(tool_call_id)
    holders = {cluster.node_for_key(host.store.key(i)).port for i in expected}
    assert len(holders) >= 2  # the records really are spread over several primaries
    code, out, _ = run_cli(["list", "--url", cluster.url, "--namespace", namespace, "--json"], capsys)
    assert code == 0
    page = json.loads(out)
    assert {r["tool_call_id"] for r in page["records"]} == expected and page["next_cursor"] is None
    # paged across the nodes too
    seen: set[str] = set()
    cursor: str | None = None
    for _ in range(100):
        extra = ["--cursor", cursor] if cursor else []
        code, out, _ = run_cli(
            ["list", "--url", cluster.url, "--namespace", namespace, "--json", "--limit", "4", *extra], capsys
        )
        page = json.loads(out)
        seen |= {r["tool_call_id"] for r in page["records"]}
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected
    # inspect and resolve reach the record's node too
    host.lost("lost-1")
    code, out, _ = run_cli(["inspect", "lost-1", "--url", cluster.url, "--namespace", namespace], capsys)
    assert code == 0 and "unknown" in out


# -- resolve ---------------------------------------------------------------------------------------
def _audit_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resolve_committed_with_a_value_is_replayed_and_audited(
    host: Host, target: list[str], tmp_path: Path, capsys: Any
) -> None:
    host.lost("call-1")
    audit = tmp_path / "audit.jsonl"
    code, out, err = run_cli(
        ["resolve", "call-1", *target, "--committed", "--value", '{"receipt": "r-9"}', "--yes",
         "--audit-log", str(audit)],
        capsys,
    )  # fmt: skip
    assert code == 0 and "ok" in out
    assert host.retry("call-1") == {"receipt": "r-9"}  # replayed, not run
    assert host.runs == ["acct"]
    (line,) = _audit_lines(audit)
    record = host.store.get("call-1")
    assert record is not None
    assert line["tool_call_id"] == "call-1" and line["verdict"] == "committed" and line["result"] == "ok"
    assert line["before"]["status"] == "unknown" and line["expect_key"] == record.idempotency_key
    assert line["operator"] and line["ts"] and line["value_sha256"]
    assert err == ""  # one line on stdout, nothing on stderr: the entry is in the file and the stream


def test_resolve_release_lets_the_call_run_again(
    host: Host, target: list[str], tmp_path: Path, capsys: Any
) -> None:
    host.lost("call-1")
    code, _, _ = run_cli(
        ["resolve", "call-1", *target, "--release", "--yes", "--audit-log", str(tmp_path / "a.jsonl")], capsys
    )
    assert code == 0 and host.store.get("call-1") is None
    host.call("call-1")
    assert host.runs == ["acct", "acct"]


def test_resolve_unknown_and_committed_without_value(
    host: Host, target: list[str], tmp_path: Path, capsys: Any
) -> None:
    host.call("call-1")
    log = ["--audit-log", str(tmp_path / "a.jsonl"), "--yes"]
    assert run_cli(["resolve", "call-1", *target, "--unknown", *log], capsys)[0] == 0
    with pytest.raises(EffectRefused) as refused:
        host.call("call-1")
    assert refused.value.reason == "effect_status_unknown"
    code, out, err = run_cli(["resolve", "call-1", *target, "--committed", *log], capsys)
    assert code == 0 and "result_not_stored" in out and err == ""
    with pytest.raises(EffectRefused) as refused:
        host.call("call-1")
    assert refused.value.reason == "result_not_stored"
    assert host.runs == ["acct"]


@pytest.mark.parametrize("answer", ["", "n\n", "maybe\n"])
def test_resolve_without_yes_needs_a_yes_on_stdin(
    host: Host, target: list[str], tmp_path: Path, capsys: Any, answer: str
) -> None:
    host.lost("call-1")
    audit = tmp_path / "a.jsonl"
    code, _, err = run_cli(
        ["resolve", "call-1", *target, "--release", "--audit-log", str(audit)], capsys, answer
    )
    assert code == 4 and "not confirmed" in err
    if not answer:
        assert "--yes" in err  # non-interactive: says how to proceed
    record = host.store.get("call-1")
    assert record is not None and record.status is Status.UNKNOWN
    assert _audit_lines(audit) == []


def test_resolve_confirmed_on_stdin(host: Host, target: list[str], tmp_path: Path, capsys: Any) -> None:
    host.lost("call-1")
    code, _, err = run_cli(
        ["resolve", "call-1", *target, "--release", "--audit-log", str(tmp_path / "a.jsonl")], capsys, "yes\n"
    )
    assert code == 0 and "[y/N]" in err and host.store.get("call-1") is None


def test_resolve_refuses_another_idempotency_key(
    host: Host, target: list[str], tmp_path: Path, capsys: Any
) -> None:
    host.lost("call-1")
    code, _, err = run_cli(
        ["resolve", "call-1", *target, "--release", "--yes", "--expect-key", "f" * 64,
         "--audit-log", str(tmp_path / "a.jsonl")],
        capsys,
    )  # fmt: skip
    assert code == 3 and "refused" in err
    record = host.store.get("call-1")
    assert record is not None and record.status is Status.UNKNOWN
    code, _, _ = run_cli(
        ["resolve", "call-1", *target, "--release", "--yes", "--expect-key", record.idempotency_key,
         "--audit-log", str(tmp_path / "a.jsonl")],
        capsys,
    )  # fmt: skip
    assert code == 0 and host.store.get("call-1") is None


def test_resolve_of_a_missing_record_exits_1(target: list[str], tmp_path: Path, capsys: Any) -> None:
    code, _, _ = run_cli(
        ["resolve", "nope", *target, "--release", "--yes", "--audit-log", str(tmp_path / "a.jsonl")], capsys
    )
    assert code == 1


def test_resolve_without_a_writable_audit_log_does_nothing(
    host: Host, target: list[str], tmp_path: Path, capsys: Any
) -> None:
    host.lost("call-1")
    code, _, err = run_cli(
        [
            "resolve",
            "call-1",
            *target,
            "--release",
            "--yes",
            "--audit-log",
            str(tmp_path / "no" / "dir.jsonl"),
        ],
        capsys,
    )
    assert code == 6 and "audit" in err
    assert host.store.get("call-1") is not None


def test_resolve_audit_log_from_the_environment(
    host: Host, target: list[str], tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.lost("call-1")
    audit = tmp_path / "env.jsonl"
    monkeypatch.setenv("AIRLOCK_REDIS_AUDIT_LOG", str(audit))
    assert run_cli(["resolve", "call-1", *target, "--release", "--yes"], capsys)[0] == 0
    assert [line["verdict"] for line in _audit_lines(audit)] == ["release"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--release", "--value", "1"], "--committed only"),
        (["--committed", "--value", "{not json"], "not valid JSON"),
        (["--committed", "--value", "1", "--signing-key-env", "AIRLOCK_TEST_NO_SUCH_VAR"], "no signing key"),
    ],
)
def test_resolve_bad_arguments_exit_2(
    *, host: Host, target: list[str], tmp_path: Path, capsys: Any, extra: list[str], needle: str
) -> None:
    host.lost("call-1")
    code, _, err = run_cli(
        ["resolve", "call-1", *target, *extra, "--yes", "--audit-log", str(tmp_path / "a.jsonl")], capsys
    )
    assert code == 2 and needle in err
    record = host.store.get("call-1")
    assert record is not None and record.status is Status.UNKNOWN


def test_resolve_signs_the_value_with_the_key_from_the_environment(
    *,
    redis_server: EmbeddedRedis,
    namespace: str,
    target: list[str],
    tmp_path: Path,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = Host(redis_server.url, namespace, signing_key=SIGNING_KEY)
    host.lost("signed")
    host.lost("unsigned")
    monkeypatch.setenv("AIRLOCK_TEST_SIGNING_KEY", SIGNING_KEY)
    log = ["--yes", "--audit-log", str(tmp_path / "a.jsonl")]
    value = ["--committed", "--value", '"done"']
    code, out, err = run_cli(
        ["resolve", "signed", *target, *value, "--signing-key-env", "AIRLOCK_TEST_SIGNING_KEY", *log], capsys
    )
    assert code == 0 and SIGNING_KEY not in out + err
    assert host.retry("signed") == "done"
    assert run_cli(["resolve", "unsigned", *target, *value, *log], capsys)[0] == 0
    with pytest.raises(EffectRefused) as refused:  # the guards sign, so an unsigned value is refused
        host.retry("unsigned")
    assert refused.value.reason == "record_corrupt"
    assert host.runs == ["acct", "acct"]


def test_resolve_releases_a_damaged_record(
    host: Host, target: list[str], tmp_path: Path, capsys: Any
) -> None:
    host.call("call-1")
    rewrite(host.store, "call-1", lambda data: data[1:])  # no version byte: the header does not parse
    with pytest.raises(EffectRefused):
        host.call("call-1")
    code, _, _ = run_cli(
        ["resolve", "call-1", *target, "--release", "--yes", "--audit-log", str(tmp_path / "a.jsonl")], capsys
    )
    assert code == 0
    host.call("call-1")
    assert host.runs == ["acct", "acct"]


# -- EffectGuard.resolve / aresolve --------------------------------------------------------------
def test_guard_resolve_api(host: Host) -> None:
    import asyncio

    host.lost("call-1")
    record = host.store.get("call-1")
    assert record is not None
    assert host.guard.resolve("call-1", "release", force=True, expect_key="0" * 64).value == "mismatch"
    assert host.guard.resolve("nope", "release", force=True).value == "missing"
    with pytest.raises(ValueError):
        host.guard.resolve("call-1", "pending", seen=record)
    with pytest.raises(ValueError):
        host.guard.resolve("call-1", "release", seen=record, value=1)
    result = asyncio.run(host.guard.aresolve("call-1", Status.COMMITTED, seen=record, value=[1, 2]))
    assert result.value == "ok"
    assert host.retry("call-1") == [1, 2]


@pytest.mark.parametrize("verdict", ["release", "committed", "unknown"])
def test_store_resolve_takes_plain_strings(host: Host, verdict: str) -> None:
    """A verdict given as a plain string means what it says (it used to fall through to unknown)."""
    host.lost("call-1")
    call: Callable[..., Any] = host.store.resolve
    assert call("call-1", verdict).value == "ok"
    record = host.store.get("call-1")
    if verdict == "release":
        assert record is None
    else:
        assert record is not None and record.status.value == verdict


def test_every_verdict_goes_to_the_namespaces_audit_stream(
    host: Host, target: list[str], capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No --audit-log and no $AIRLOCK_REDIS_AUDIT_LOG: no file is written, and the entry is in the
    namespace's capped stream, which `airlock-redis audit` shows to every operator."""
    monkeypatch.delenv("AIRLOCK_REDIS_AUDIT_LOG", raising=False)
    monkeypatch.chdir(tmp_path)
    host.lost("call-a1")
    assert main(["resolve", "call-a1", *target, "--release", "--yes"]) == 0
    assert list(tmp_path.iterdir()) == []
    capsys.readouterr()
    assert main(["audit", *target, "--json"]) == 0
    (entry,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (entry["tool_call_id"], entry["verdict"], entry["result"]) == ("call-a1", "release", "ok")
    assert entry["before"]["status"] == "unknown" and entry["operator"]
    assert main(["audit", *target]) == 0
    assert "'call-a1'  unknown -> release  ok" in capsys.readouterr().out
    stream = f"{host.store.namespace}:audit"
    assert host.store.client.xlen(stream) == 1
    assert host.store.client.type(stream) == b"stream"


def test_audit_of_an_empty_namespace_says_so(target: list[str], capsys: Any) -> None:
    assert main(["audit", *target]) == 0
    assert "no verdicts recorded" in capsys.readouterr().out
