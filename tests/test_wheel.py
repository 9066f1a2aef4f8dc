"""The wheel carries everything a guarded call needs: build it, install it into a clean virtual
environment (no system site-packages, dependencies from the package index), and run a guarded call
against a real redis-server from that environment's python."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from airlock_redis.embedded import EmbeddedRedis
from tests.procs import PROJECT_ROOT

BUILD_TIMEOUT = 600
INSTALL_TIMEOUT = 900
RUN_TIMEOUT = 120
SCRIPTS = ("begin", "commit", "settle", "resolve")

GUARDED_CALL = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import redis
    import airlock_redis
    from airlock_redis import EffectGuard, RedisEffectStore, EffectStatusUnknown, tool_call_context
    from airlock_redis.effect_guard import EffectGuard as Mirrored, reversibility
    from airlock_redis.stores.scripts import _lua_folder

    url, namespace = sys.argv[1], sys.argv[2]
    backend = redis.Redis.from_url(url)
    guard = EffectGuard(store=RedisEffectStore(url, namespace=namespace))

    @guard.wrap
    def charge(account: str, cents: int) -> dict:
        backend.incr(namespace + ":runs")
        return {"charged": cents, "account": account}

    @guard.wrap
    def lose(account: str) -> None:
        backend.incr(namespace + ":runs")
        raise TimeoutError("lost")

    with tool_call_context("wheel-1"):
        first = charge("acct_1", 500)
        second = charge("acct_1", 500)
    with tool_call_context("wheel-2"):
        try:
            lose("acct_1")
        except TimeoutError:
            pass
        try:
            lose("acct_1")
            refused = None
        except EffectStatusUnknown as exc:
            refused = exc.reason
    print(json.dumps({
        "package": str(Path(airlock_redis.__file__).resolve()),
        "lua": str(_lua_folder().resolve()),
        "mirrored": Mirrored is EffectGuard and callable(reversibility),
        "first": first, "second": second, "refused": refused,
        "runs": int(backend.get(namespace + ":runs")),
    }))
    """
)


def build_wheel(out: Path) -> Path:
    if importlib.util.find_spec("build") is not None:
        command = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(PROJECT_ROOT)]
    else:
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(PROJECT_ROOT)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    assert done.returncode == 0, f"wheel build failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = sorted(out.glob("airlock_redis-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.slow
def test_the_wheel_installs_into_a_clean_venv_and_guards_a_call(
    redis_server: EmbeddedRedis, namespace: str, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "airlock-redis" in archive.read(entry_points).decode()
    for script in SCRIPTS:
        assert f"airlock_redis/lua/{script}.lua" in names
    assert "airlock_redis/py.typed" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)

    home = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(home)
    python = home / "bin" / "python"
    pyvenv = (home / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in pyvenv
    env = clean_env()
    install = subprocess.run(
        [str(python), "-m", "pip", "install", str(wheel)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, f"pip install failed:\n{install.stdout[-3000:]}\n{install.stderr[-3000:]}"

    run = subprocess.run(
        [str(python), "-c", GUARDED_CALL, redis_server.url, namespace],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    site = (home / "lib").resolve()
    assert Path(report["package"]).is_relative_to(site), report["package"]  # not the source tree
    assert Path(report["lua"]).is_relative_to(site), report["lua"]
    assert report["mirrored"] is True
    assert report["first"] == report["second"] == {"charged": 500, "account": "acct_1"}
    assert report["refused"] == "effect_status_unknown"
    assert report["runs"] == 2  # charge once (then replayed), lose once (then refused)

    cli = subprocess.run(
        [str(home / "bin" / "airlock-redis"), "--help"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert cli.returncode == 0 and "demo" in cli.stdout, cli.stderr
