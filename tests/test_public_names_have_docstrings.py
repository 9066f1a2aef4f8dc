"""``help()`` says something for every public name: each name in ``airlock_redis.__all__`` (and in
``airlock_redis.stores.__all__``, the types a store of your own needs) and each public method and
property of the exported classes has a docstring of its own (not one a dataclass
generates from its fields, nor ``Protocol``'s), and the values (constants, type aliases) are
described in the package's docstring."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest

import airlock_redis
import airlock_redis.stores

# Names whose docstring belongs in a file another change owns; each is checked to be still missing, so
# that this list shrinks as they are written (then delete the entry).
OWNED_ELSEWHERE: frozenset[str] = frozenset()  # names another module's owner has yet to document

EFFECT_REFUSED_ATTRIBUTES = (
    "reason",
    "message",
    "fix_hint",
    "model_message",
    "tool",
    "tool_call_id",
    "idempotency_key",
)


def _exported() -> Iterator[tuple[str, Any]]:
    for name in airlock_redis.__all__:
        if name in ("Airlock", "SecurityPolicy"):
            pytest.importorskip("agent_airlock")
        yield name, getattr(airlock_redis, name)
    for name in airlock_redis.stores.__all__:
        if name not in airlock_redis.__all__:
            yield name, getattr(airlock_redis.stores, name)


def _own_doc(obj: Any) -> str:
    return (obj.__doc__ or "").strip()


def _is_generated(name: str, doc: str) -> bool:
    """A dataclass's ``Name(field: type, ...)`` or a docstring inherited from typing/builtins."""
    return doc.startswith(f"{name}(") or doc.startswith("Base class for protocol classes")


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods and properties of ``cls`` that this package defines."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith("airlock_redis"):
            continue
        raw = vars(owner)[name]
        if isinstance(raw, property):
            yield name, raw.fget
        elif isinstance(raw, staticmethod | classmethod):
            yield name, raw.__func__
        elif inspect.isfunction(raw):
            yield name, raw


def undocumented() -> list[str]:
    missing = []
    package_doc = _own_doc(airlock_redis)
    for name, obj in _exported():
        if inspect.isclass(obj) or inspect.isfunction(obj):
            doc = _own_doc(obj)
            if not doc or _is_generated(name, doc):
                missing.append(name)
            if inspect.isclass(obj):
                missing += [f"{name}.{m}" for m, fn in _members(obj) if not _own_doc(fn)]
        elif f"``{name}``" not in package_doc:
            missing.append(name)  # a value: help(airlock_redis) must describe it
    return sorted(missing)


def test_every_public_name_has_a_docstring() -> None:
    missing = set(undocumented())
    assert missing - OWNED_ELSEWHERE == set(), "no docstring: " + ", ".join(sorted(missing - OWNED_ELSEWHERE))
    written = OWNED_ELSEWHERE - missing
    assert not written, "documented now, remove from OWNED_ELSEWHERE: " + ", ".join(sorted(written))


def test_the_walk_sees_methods_properties_and_values() -> None:
    """The check covers what it claims to: methods, properties and coroutine methods of the exported
    classes, and the values in ``__all__``."""
    seen = {f"RedisEffectStore.{m}" for m, _ in _members(airlock_redis.RedisEffectStore)}
    assert {"RedisEffectStore.begin", "RedisEffectStore.abegin", "RedisEffectStore.client"} <= seen
    assert {"RedisEffectStore.from_url", "RedisEffectStore.operator_target"} <= seen
    assert {m for m, _ in _members(airlock_redis.EffectGuard)} >= {"call", "acall", "wrap", "target_args"}

    class Bare:
        def act(self) -> None:
            pass

    assert not _own_doc(Bare.act) and _is_generated("Record", "Record(tool_call_id: str)")
    values = {name for name, obj in _exported() if not (inspect.isclass(obj) or inspect.isfunction(obj))}
    assert {"DEFAULT_AMBIGUOUS_ERRORS", "REFUSAL_REASONS", "RefusalReason", "Approver"} <= values


def test_effect_refused_documents_its_attributes() -> None:
    doc = _own_doc(airlock_redis.EffectRefused)
    for attribute in EFFECT_REFUSED_ATTRIBUTES:
        assert f"``{attribute}``" in doc, attribute
    for reason in airlock_redis.REFUSAL_REASONS:
        assert f"``{reason}``" in doc, reason
    refused = airlock_redis.ToolCallIdRequired("m", tool="t", tool_call_id=None, fix_hint="h")
    for attribute in EFFECT_REFUSED_ATTRIBUTES:  # and each one it documents is there
        assert hasattr(refused, attribute), attribute


def test_help_shows_the_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    help(airlock_redis.InMemoryEffectStore.begin)
    help(airlock_redis.EffectGuard)
    shown = capsys.readouterr().out
    assert "Record the call pending" in shown
    assert "target_args" in shown and "at least one with a" in shown
