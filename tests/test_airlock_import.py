"""Importing the adapter against an agent-airlock whose private hooks may differ fails clearly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import agent_airlock
import pytest

import airlock_redis
from airlock_redis import airlock as adapter

ADAPTER = Path(adapter.__file__)


def load_fresh() -> ModuleType:
    """Execute the adapter's source as a new module, leaving the imported one untouched."""
    spec = importlib.util.spec_from_file_location("airlock_redis._airlock_reloaded", ADAPTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "airlock_redis"
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_supported_version_loads() -> None:
    module = load_fresh()
    assert module.SUPPORTED_AGENT_AIRLOCK == ">=0.10.26,<0.10.27"
    assert issubclass(module.Airlock, agent_airlock.Airlock)


@pytest.mark.parametrize("version", ["0.10.25", "0.10.27", "0.10.29", "0.11.0", "1.0.0", "dev"])
def test_another_version_fails_naming_the_supported_range(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setattr(agent_airlock, "__version__", version)
    with pytest.raises(ImportError, match=r"supports agent-airlock >=0\.10\.26,<0\.10\.27") as caught:
        load_fresh()
    assert version in str(caught.value)


@pytest.mark.parametrize("hook", ["_decorator", "_resolve_and_check_policy", "_resolve_escalation"])
def test_a_missing_hook_fails_naming_it(monkeypatch: pytest.MonkeyPatch, hook: str) -> None:
    monkeypatch.delattr(agent_airlock.Airlock, hook)
    with pytest.raises(ImportError, match=rf"Airlock\.{hook}.*|supports agent-airlock >=0\.10\.26") as caught:
        load_fresh()
    assert f"Airlock.{hook}" in str(caught.value)


def test_a_changed_hook_signature_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(self: object, name: str) -> None: ...

    monkeypatch.setattr(agent_airlock.Airlock, "_resolve_escalation", changed)
    with pytest.raises(ImportError, match=r"different Airlock\._resolve_escalation signature"):
        load_fresh()


def test_a_native_effect_guard_field_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name == "agent_airlock.effect_guard":
            return real_find_spec("json")
        return real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ImportError, match=r"ships its own agent_airlock\.effect_guard"):
        load_fresh()


def test_the_package_imports_without_agent_airlock() -> None:
    code = (
        "import sys; sys.modules['agent_airlock'] = None\n"
        "import airlock_redis\n"
        "assert 'Airlock' in airlock_redis.__all__\n"
        "try:\n"
        "    airlock_redis.Airlock\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    root = Path(airlock_redis.__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "supports agent-airlock >=0.10.26,<0.10.27" in done.stdout
