"""``python -m airlock_redis demo`` tells the lost-response story and exits 0, on a redis-server it
starts itself and on one given with ``--url``."""

from __future__ import annotations

import re
import subprocess
import sys

from airlock_redis.embedded import EmbeddedRedis
from tests.conftest import require_redis_server
from tests.procs import PROJECT_ROOT, child_env

TIMEOUT = 300
# replica, tool_call_id, what happened, how many times the tool body ran
EXPECTED_ROWS = [
    ("A", "call_1", "lost", "1"),
    ("B", "call_1", "refused:effect_status_unknown", "0"),
    ("A", "call_2", "executed", "1"),
    ("B", "call_2", "replayed", "0"),
    ("A", "call_3", "lost", "1"),
    ("B", "call_3", "executed", "1"),
    ("B", "call_2", "refused:policy_violation", "0"),
]


def run_demo(*extra: str, url_env: str | None = None) -> str:
    env = child_env()
    env.pop("AIRLOCK_REDIS_URL", None)
    if url_env is not None:
        env["AIRLOCK_REDIS_URL"] = url_env
    done = subprocess.run(
        [sys.executable, "-m", "airlock_redis", "demo", *extra],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=PROJECT_ROOT,
        env=env,
    )
    assert done.returncode == 0, f"demo exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def assert_story(output: str) -> None:
    for outcome in ("refused:effect_status_unknown", "replayed", "refused:policy_violation"):
        assert outcome in output
    rows = [line.split() for line in output.splitlines() if re.match(r"^\d+\s+[AB]\s", line)]
    assert [(r[1], r[2], r[-3], r[-2]) for r in rows] == EXPECTED_ROWS, output
    assert all(r[-1] == "yes" for r in rows), output
    assert "every irreversible call ran at most once" in output
    assert "executions: charge 2" in output and "read_balance 2" in output
    assert "Do not retry" in output  # the refusal's hint is shown


def test_demo_on_its_own_redis_server() -> None:
    require_redis_server()
    output = run_demo()
    assert "a private redis-server" in output
    assert "the URL above, are gone once it ends" in output  # its hint's socket does not outlive it
    assert_story(output)


def test_demo_with_url_on_a_given_server(redis_server: EmbeddedRedis, namespace: str) -> None:
    output = run_demo("--url", redis_server.url, "--namespace", namespace)
    assert f"Redis: {redis_server.url}" in output and "gone once it ends" not in output
    assert_story(output)
    with redis_server.client() as client:
        assert list(client.scan_iter(match=f"{namespace}*")) == []  # the demo cleaned up after itself


def test_demo_uses_the_url_in_the_environment_as_every_command_does(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    """$AIRLOCK_REDIS_URL, when set and no --url is given, is the Redis the demo uses (a private
    server is started only when neither is given)."""
    output = run_demo("--namespace", namespace, url_env=redis_server.url)
    assert f"Redis: {redis_server.url}" in output and "a private redis-server" not in output
    assert_story(output)
