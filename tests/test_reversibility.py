"""@reversibility: static metadata read through the ``__wrapped__`` chain; the strictest tag wins and an
untagged tool is irreversible."""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    EffectStore,
    Reversibility,
    idempotency_key,
    reversibility,
    reversibility_of,
    tool_call_context,
)
from airlock_redis.effect_guard import reversibility as reversibility_from_mirror
from airlock_redis.stores import BeginRequest

F = TypeVar("F", bound=Callable[..., Any])


def layer(fn: F) -> F:
    """A decorator that wraps with functools.wraps, like @Airlock or a logging decorator."""
    if asyncio.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

        return awrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def bare_layer(fn: F) -> F:
    """A wrapper that sets ``__wrapped__`` but copies nothing else (no ``__dict__``, so no tag)."""
    if asyncio.iscoroutinefunction(fn):

        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

        return functools.update_wrapper(awrapper, fn, updated=())  # type: ignore[return-value]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return functools.update_wrapper(wrapper, fn, updated=())  # type: ignore[return-value]


LAYERS = {"functools.wraps": layer, "bare __wrapped__": bare_layer}


def plain(x: int) -> int:
    return x


def fresh() -> Callable[[int], int]:
    def tool(x: int) -> int:
        return x

    return tool


# -- the tag itself ----------------------------------------------------------------------------


def test_an_untagged_tool_is_irreversible() -> None:
    assert reversibility_of(plain) is Reversibility.IRREVERSIBLE
    assert reversibility_of(layer(layer(plain))) is Reversibility.IRREVERSIBLE


@pytest.mark.parametrize("level", ["reversible", "costly", "irreversible"])
def test_the_tag_is_read_back_and_the_function_is_returned_unchanged(level: Any) -> None:
    tool = fresh()
    tagged = reversibility(level)(tool)
    assert tagged is tool
    assert reversibility_of(tagged) is Reversibility(level)
    assert tagged(3) == 3


def test_the_enum_is_accepted_as_a_level() -> None:
    assert reversibility_of(reversibility(Reversibility.COSTLY)(fresh())) is Reversibility.COSTLY


@pytest.mark.parametrize("level", ["Reversible", "safe", "", None, 1])
def test_an_invalid_level_is_a_value_error(level: Any) -> None:
    with pytest.raises(ValueError, match="reversible"):
        reversibility(level)


def test_the_mirror_module_exports_the_same_decorator() -> None:
    assert reversibility_from_mirror is reversibility


def test_reversibility_is_ordered_by_strictness() -> None:
    r, c, i = Reversibility.REVERSIBLE, Reversibility.COSTLY, Reversibility.IRREVERSIBLE
    assert r.strictness < c.strictness < i.strictness
    assert r < c < i
    assert i > c > r
    assert r >= Reversibility.REVERSIBLE and i <= Reversibility.IRREVERSIBLE and c <= i and c >= r
    assert max(r, i, c) is i
    assert min(i, c) is c
    assert sorted([i, r, c]) == [r, c, i]
    assert [t.may_run_again for t in (r, c, i)] == [True, False, False]


# -- the __wrapped__ chain ---------------------------------------------------------------------


@pytest.mark.parametrize("wrap", list(LAYERS))
@pytest.mark.parametrize("depth", [1, 2, 5])
def test_a_tag_below_wrapping_decorators_is_found(wrap: str, depth: int) -> None:
    tool: Callable[[int], int] = reversibility("reversible")(fresh())
    for _ in range(depth):
        tool = LAYERS[wrap](tool)
    assert reversibility_of(tool) is Reversibility.REVERSIBLE


@pytest.mark.parametrize("wrap", list(LAYERS))
def test_a_tag_put_on_the_inner_function_after_wrapping_is_found(wrap: str) -> None:
    inner = fresh()
    outer = LAYERS[wrap](LAYERS[wrap](inner))
    reversibility("reversible")(inner)
    assert reversibility_of(outer) is Reversibility.REVERSIBLE


@pytest.mark.parametrize("wrap", list(LAYERS))
def test_a_tag_above_wrapping_decorators_is_found(wrap: str) -> None:
    tool = reversibility("costly")(LAYERS[wrap](LAYERS[wrap](fresh())))
    assert reversibility_of(tool) is Reversibility.COSTLY


STRICTEST = [
    (("reversible", "irreversible"), Reversibility.IRREVERSIBLE),
    (("irreversible", "reversible"), Reversibility.IRREVERSIBLE),
    (("costly", "reversible"), Reversibility.COSTLY),
    (("reversible", "costly"), Reversibility.COSTLY),
    (("costly", "irreversible"), Reversibility.IRREVERSIBLE),
    (("reversible", "reversible"), Reversibility.REVERSIBLE),
]


@pytest.mark.parametrize("wrap", list(LAYERS))
@pytest.mark.parametrize(("levels", "expected"), STRICTEST)
def test_the_strictest_tag_on_the_chain_wins(
    wrap: str, levels: tuple[Any, Any], expected: Reversibility
) -> None:
    inner, outer = levels
    tool = reversibility(outer)(LAYERS[wrap](reversibility(inner)(fresh())))
    assert reversibility_of(tool) is expected


@pytest.mark.parametrize(("levels", "expected"), STRICTEST)
def test_the_strictest_tag_on_one_function_wins(levels: tuple[Any, Any], expected: Reversibility) -> None:
    first, second = levels
    tool = reversibility(second)(reversibility(first)(fresh()))
    assert reversibility_of(tool) is expected


def test_a_cyclic_wrapped_chain_ends() -> None:
    tool: Any = fresh()
    other: Any = layer(tool)
    tool.__wrapped__ = other
    assert reversibility_of(other) is Reversibility.IRREVERSIBLE


def test_a_tag_on_a_callable_object_is_read() -> None:
    class Tool:
        def __call__(self, x: int) -> int:
            return x

    tool = reversibility("reversible")(Tool())
    assert reversibility_of(layer(tool)) is Reversibility.REVERSIBLE


# -- what the guard does with it ---------------------------------------------------------------


def strand_pending(store: EffectStore, tool_call_id: str, tool: str, arguments: dict[str, Any]) -> None:
    token = secrets.token_hex(8)
    request = BeginRequest(tool_call_id, idempotency_key(tool, arguments), tool, token, False)
    assert store.begin(request).kind.value == "started"


Build = Callable[[EffectGuard, Callable[..., Any]], Callable[..., Any]]

PLACEMENTS: dict[str, tuple[str, Build]] = {
    "below guard.wrap": ("reversible", lambda g, f: g.wrap(reversibility("reversible")(f))),
    "above guard.wrap": ("reversible", lambda g, f: reversibility("reversible")(g.wrap(f))),
    "below guard.wrap and a wraps layer": (
        "reversible",
        lambda g, f: g.wrap(layer(reversibility("reversible")(f))),
    ),
    "below guard.wrap and a bare layer": (
        "reversible",
        lambda g, f: g.wrap(bare_layer(reversibility("reversible")(f))),
    ),
    "irreversible below a bare layer, reversible above guard.wrap": (
        "irreversible",
        lambda g, f: reversibility("reversible")(g.wrap(bare_layer(reversibility("irreversible")(f)))),
    ),
    "untagged": ("irreversible", lambda g, f: g.wrap(f)),
    "reversible below, irreversible above": (
        "irreversible",
        lambda g, f: reversibility("irreversible")(g.wrap(reversibility("reversible")(f))),
    ),
    "irreversible below, reversible above": (
        "irreversible",
        lambda g, f: reversibility("reversible")(g.wrap(reversibility("irreversible")(f))),
    ),
    "reversible below, costly above": (
        "costly",
        lambda g, f: reversibility("costly")(g.wrap(reversibility("reversible")(f))),
    ),
}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_the_guard_acts_on_the_tag_wherever_it_sits(store: EffectStore, kind: str, placement: str) -> None:
    """A stranded pending record: a reversible tool runs again, any other is refused."""
    expected, build = PLACEMENTS[placement]
    runs: list[str] = []
    guard = EffectGuard(store=store)

    def lookup(account: str) -> str:
        runs.append(account)
        return account.upper()

    async def alookup(account: str) -> str:
        runs.append(account)
        return account.upper()

    tool = build(guard, lookup if kind == "sync" else alookup)

    def call(tool_call_id: str) -> Any:
        with tool_call_context(tool_call_id):
            result = tool("acct")
            return asyncio.run(result) if kind == "async" else result

    strand_pending(store, "rv-1", "lookup" if kind == "sync" else "alookup", {"account": "acct"})
    if expected == "reversible":
        assert call("rv-1") == "ACCT"
        assert runs == ["acct"]
        record = store.get("rv-1")
        assert record is not None and record.status.value == "committed" and record.attempt == 2
    else:
        with pytest.raises(EffectRefused) as refused:
            call("rv-1")
        assert refused.value.reason == "effect_status_unknown"
        assert runs == []
    assert reversibility_of(tool) is Reversibility(expected)
