"""``airlock-redis demo --framework langchain|openai-agents``: a real agent of the framework, with a
scripted model, guarded by its integration, tells the story end to end.

Run as real ``python -m airlock_redis`` subprocesses on the redis-server the demo starts itself: the
irreversible tools run once each, the retry of a finished call is a replay, the retry of a call in
doubt reaches the model as the refusal and the run finishes, the reversible tool runs again. Every
key the run writes expires and is gone when it ends, also when its reader goes away; without the
framework the command names the extra to install and does not connect to Redis.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence

import pytest
import redis

from airlock_redis.cli import demo_cmd, main
from airlock_redis.core.errors import MODEL_MESSAGES
from airlock_redis.embedded import EmbeddedRedis
from tests.conftest import require_redis_server
from tests.procs import PROJECT_ROOT, child_env, cli_into_head

pytestmark = pytest.mark.redis_server

TIMEOUT = 300
FRAMEWORKS = ("langchain", "openai-agents")
IN_DOUBT = MODEL_MESSAGES["effect_status_unknown"]
# what --framework needs to import, per framework: the module a missing install takes away
FRAMEWORK_MODULES = {"langchain": "langchain", "openai-agents": "agents"}


def demo(*args: str, wrapper: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m airlock_redis demo ...``, or the CLI run under ``wrapper`` (code run first)."""
    if wrapper is None:
        command = [sys.executable, "-m", "airlock_redis", "demo", *args]
    else:
        run_cli = f"from airlock_redis.cli import main\nraise SystemExit(main(['demo', *{list(args)!r}]))\n"
        code = f"{wrapper}\n{run_cli}"
        command = [sys.executable, "-c", code]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=PROJECT_ROOT,
        env=child_env(),  # a copy of this environment: AIRLOCK_REDIS_SERVER too, when it is set
    )


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


def step(output: str, prefix: str) -> str:
    """The one line of the story that starts with ``prefix``."""
    found = [line for line in output.splitlines() if line.strip().startswith(prefix)]
    assert len(found) == 1, (prefix, output)
    return found[0]


def assert_story(output: str) -> None:
    assert "NOT as the spec says" not in output, output
    assert "the tool ran, its result is stored" in step(output, "1. charge_card (irreversible), id call_1")
    replay = step(output, "2. the host retries call_1 (same id)")
    assert "replayed, the tool did not run again: 'charged 500 cents to card_4242'" in replay
    assert "recorded in doubt" in step(output, "3. send_email, id call_2")
    refusal = step(output, "the host retries call_2")
    assert refusal.endswith(f"refused, the model receives: Tool 'send_email' was not run. {IN_DOUBT}")
    assert "try again" not in refusal.lower()
    assert step(output, "the agent run finishes normally") == "   the agent run finishes normally: 'Done.'"
    assert "the retry runs it again: 'order 1042: shipped'" in step(
        output, "4. lookup (reversible), id call_3"
    )
    # each tool's real executions: the irreversible ones exactly once, the reversible one twice
    counts = re.search(r"^executions: charge_card (\d+), send_email (\d+), lookup (\d+)$", output, re.M)
    assert counts is not None, output
    assert counts.groups() == ("1", "1", "2")
    assert output.rstrip().endswith("every irreversible call ran at most once.")


def namespace_keys(server: EmbeddedRedis, namespace: str) -> list[bytes]:
    with server.client() as client:
        return sorted(client.scan_iter(match=f"{namespace}:*", count=1000))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_framework_demo_on_its_own_redis_server(framework: str) -> None:
    require_redis_server()
    done = demo("--framework", framework)
    assert done.returncode == 0, explain(done)
    assert done.stderr == "", explain(done)
    assert done.stdout.startswith("Redis: a private redis-server at "), done.stdout
    assert_story(done.stdout)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_key_the_framework_demo_writes_expires_and_is_gone_at_the_end(
    framework: str,
    redis_server: EmbeddedRedis,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run in this process on a given server, so that the keys can be seen just before the run removes
    them: the records and the execution counters are all there, and each has a TTL."""
    seen: dict[bytes, int] = {}
    clean: Callable[[str, str, Sequence[str]], dict[str, int]] = demo_cmd._clean

    def look_then_clean(
        url: str, run_namespace: str, tools: Sequence[str] = demo_cmd.TOOLS
    ) -> dict[str, int]:
        with redis.Redis.from_url(url) as client:
            seen.update({key: client.ttl(key) for key in client.scan_iter(match=f"{run_namespace}:*")})
        return clean(url, run_namespace, tools)

    monkeypatch.setattr(demo_cmd, "_clean", look_then_clean)
    code = main(["demo", "--framework", framework, "--url", redis_server.url, "--namespace", namespace])
    output = capsys.readouterr().out
    assert code == 0, output
    assert_story(output)
    counters = [key for key in seen if b":executions:" in key]
    assert len(counters) == 3 and len(seen) > len(counters), seen  # the counters and the records
    assert all(0 < ttl <= demo_cmd.DEMO_TTL for ttl in seen.values()), seen
    assert namespace_keys(redis_server, namespace) == []


def test_a_reader_that_goes_away_ends_the_framework_demo_quietly(
    redis_server: EmbeddedRedis, namespace: str
) -> None:
    framework = ("--framework", "langchain")
    argv = ["demo", *framework, "--url", redis_server.url, "--namespace", namespace]
    lines, errors, code = cli_into_head(argv, 4, TIMEOUT)
    assert len(lines) == 4 and lines[3].startswith("1. charge_card"), lines
    assert errors == "", errors
    assert code == 141
    assert namespace_keys(redis_server, namespace) == []  # removed before it ended


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_without_the_framework_one_line_names_the_extra_and_nothing_is_written(
    framework: str, redis_server: EmbeddedRedis, namespace: str
) -> None:
    hidden = FRAMEWORK_MODULES[framework]
    with redis_server.client() as client:
        connections = client.info("stats")["total_connections_received"]
        done = demo(
            "--framework",
            framework,
            "--url",
            redis_server.url,
            "--namespace",
            namespace,
            wrapper=f"import sys\nsys.modules[{hidden!r}] = None  # as if it were not installed",
        )
        # it said so before it touched Redis: not one connection came in (this client's is reused)
        assert client.info("stats")["total_connections_received"] == connections
    assert done.returncode == 2, explain(done)
    assert done.stdout == "", explain(done)
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"airlock-redis demo: --framework {framework} needs "), line
    assert line.endswith(f"pip install 'airlock-redis[{framework}]'"), line
