"""The command a refusal prints is the one that works: it names the store's URL (without its
password) and namespace, so an operator who pastes it acts on these records, not on localhost's."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    InMemoryEffectStore,
    RedisEffectStore,
    Status,
    tool_call_context,
)
from airlock_redis.embedded import EmbeddedRedis


def _refusal(store: object, tool_call_id: str) -> EffectRefused:
    @EffectGuard(store).wrap  # type: ignore[arg-type]
    def charge(cents: int) -> int:
        raise TimeoutError("the gateway did not answer")

    with tool_call_context(tool_call_id), pytest.raises(TimeoutError):
        charge(5)
    with tool_call_context(tool_call_id), pytest.raises(EffectRefused) as refused:
        charge(5)
    return refused.value


@pytest.mark.redis_server
def test_the_printed_resolve_command_acts_on_the_guards_records(
    redis_server: EmbeddedRedis, namespace: str, tmp_path: Path
) -> None:
    store = RedisEffectStore(redis_server.url, namespace=namespace)
    refusal = _refusal(store, "call 1")
    assert refusal.reason == "effect_status_unknown"
    hint = refusal.fix_hint
    assert " | " not in hint  # each verdict its own command: nothing pastes as a shell pipe
    command = hint[hint.index("airlock-redis resolve") :].rstrip(".")
    argv = shlex.split(command.replace("--committed | --release", "--release"))
    assert argv[:3] == ["airlock-redis", "resolve", "call 1"]
    assert argv[argv.index("--namespace") + 1] == namespace
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "airlock_redis",
            *argv[1:],
            "--yes",
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert store.get("call 1") is None  # released: the command reached this store's record


def test_a_password_never_appears_in_the_printed_command() -> None:
    store = RedisEffectStore("redis://app:s3cret@127.0.0.1:1/0?socket_timeout=1", namespace="ns x")
    target = store.operator_target
    assert "s3cret" not in target
    assert shlex.split(target) == [
        "--url",
        "redis://app@127.0.0.1:1/0?socket_timeout=1",
        "--namespace",
        "ns x",
    ]


def test_an_in_process_store_points_at_guard_resolve() -> None:
    refusal = _refusal(InMemoryEffectStore(), "call-2")
    assert "airlock-redis" not in refusal.fix_hint
    assert "guard.resolve('call-2'" in refusal.fix_hint
    assert Status.UNKNOWN.value in str(refusal)
