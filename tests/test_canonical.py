"""The idempotency key: the sha256 of the tool's name and its canonical arguments.

Same business input -> same key (keyword order, positional or keyword, defaults applied or passed);
different input -> different key (tool name, values, and values that are equal in Python but not the
same data: 1, 1.0, True, "1"). Arguments with no canonical form are an error naming the argument.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import hashlib
import uuid
from decimal import Decimal
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airlock_redis import (
    CanonicalizationError,
    EffectGuard,
    EffectStore,
    canonical_arguments,
    current_idempotency_key,
    idempotency_key,
    reversibility,
    tool_call_context,
)


class Order(pydantic.BaseModel):
    sku: str
    qty: int


@dataclasses.dataclass
class Address:
    street: str
    number: int


# -- same input, same key ----------------------------------------------------------------------


def test_the_key_is_a_sha256_hex_digest() -> None:
    key = idempotency_key("charge", {"account": "a", "cents": 5})
    assert len(key) == 64
    assert int(key, 16) >= 0
    assert key == idempotency_key("charge", {"account": "a", "cents": 5})


def test_the_key_ignores_keyword_order() -> None:
    assert idempotency_key("charge", {"account": "a", "cents": 5}) == idempotency_key(
        "charge", {"cents": 5, "account": "a"}
    )
    nested_a = {"meta": {"x": 1, "y": [1, {"p": 1, "q": 2}]}}
    nested_b = {"meta": {"y": [1, {"q": 2, "p": 1}], "x": 1}}
    assert idempotency_key("t", nested_a) == idempotency_key("t", nested_b)


def test_set_members_have_one_order() -> None:
    assert idempotency_key("t", {"tags": {"b", "a", "c"}}) == idempotency_key("t", {"tags": {"c", "b", "a"}})
    assert idempotency_key("t", {"ids": frozenset({3, 1, 2})}) == idempotency_key("t", {"ids": {1, 2, 3}})


def test_the_guard_keys_a_call_the_same_whether_positional_keyword_or_defaulted(store: EffectStore) -> None:
    guard = EffectGuard(store=store)
    seen: list[str | None] = []

    def transfer(source: str, target: str, cents: int = 100, memo: str | None = None) -> str:
        seen.append(current_idempotency_key())
        return "done"

    guarded = guard.wrap(transfer)
    expected = idempotency_key("transfer", {"source": "a", "target": "b", "cents": 100, "memo": None})
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("a", "b"), {}),
        (("a", "b", 100), {}),
        (("a",), {"target": "b"}),
        ((), {"target": "b", "source": "a", "memo": None}),
        ((), {"cents": 100, "memo": None, "target": "b", "source": "a"}),
    ]
    for i, (args, kwargs) in enumerate(calls):
        with tool_call_context(f"key-{i}"):
            assert guarded(*args, **kwargs) == "done"
        record = store.get(f"key-{i}")
        assert record is not None and record.idempotency_key == expected
    assert seen == [expected] * len(calls)
    # and so every spelling of the call is a replay of the first, not a mismatch
    for args, kwargs in calls:
        with tool_call_context("key-0"):
            assert guarded(*args, **kwargs) == "done"
    assert len(seen) == len(calls)


def test_var_keyword_arguments_keep_their_own_names() -> None:
    guard = EffectGuard(require_tool_call_id=False)
    seen: list[str | None] = []

    def notify(channel: str, **fields: Any) -> None:
        seen.append(current_idempotency_key())

    guarded = guard.wrap(notify)
    guarded("ops", b=2, a=1)
    guarded(a=1, channel="ops", b=2)
    assert seen == [idempotency_key("notify", {"channel": "ops", "a": 1, "b": 2})] * 2


# -- different input, different key ------------------------------------------------------------


def test_the_key_differs_by_tool_name_and_by_value() -> None:
    base = idempotency_key("charge", {"account": "a", "cents": 5})
    assert idempotency_key("refund", {"account": "a", "cents": 5}) != base
    assert idempotency_key("charge", {"account": "a", "cents": 6}) != base
    assert idempotency_key("charge", {"account": "b", "cents": 5}) != base
    assert idempotency_key("charge", {"account": "a", "amount": 5}) != base
    assert idempotency_key("charge", {"account": "a"}) != base


def test_the_tool_name_and_arguments_cannot_be_shifted_into_each_other() -> None:
    assert idempotency_key("ab", {"c": 1}) != idempotency_key("a", {"bc": 1})


@pytest.mark.parametrize(
    "values",
    [
        [1, 1.0, True, "1", Decimal("1"), b"1", [1], {"1": 1}],
        [0, 0.0, False, "", None, "0", b"", [], {}],
        [dt.date(2024, 1, 2), "2024-01-02", dt.datetime(2024, 1, 2)],
        [uuid.UUID(int=1), str(uuid.UUID(int=1))],
        [dt.timedelta(seconds=1), 1, [0, 1, 0]],
    ],
    ids=["one", "zero", "dates", "uuid", "timedelta"],
)
def test_values_equal_in_python_but_not_the_same_data_give_different_keys(values: list[Any]) -> None:
    keys = [idempotency_key("t", {"v": value}) for value in values]
    assert len(set(keys)) == len(values)


def test_a_user_dict_key_never_collides_with_a_tagged_value() -> None:
    tagged = canonical_arguments({"v": b"1"})
    lookalike = {"v": {"$bytes": "MQ=="}}
    assert idempotency_key("t", {"v": b"1"}) != idempotency_key("t", lookalike)
    assert canonical_arguments(lookalike) != tagged
    # escaping is itself escaped: "$x" and "$$x" stay apart, at any depth and as argument names
    assert idempotency_key("t", {"v": {"$x": 1}}) != idempotency_key("t", {"v": {"$$x": 1}})
    assert idempotency_key("t", {"$x": 1}) != idempotency_key("t", {"$$x": 1})
    assert idempotency_key("t", {"v": {"$set": [1]}}) != idempotency_key("t", {"v": {1}})


def test_non_string_dict_keys_do_not_collide_with_string_keys() -> None:
    assert idempotency_key("t", {"v": {1: "a"}}) != idempotency_key("t", {"v": {"1": "a"}})
    assert idempotency_key("t", {"v": {1: "a", 2: "b"}}) == idempotency_key("t", {"v": {2: "b", 1: "a"}})


# -- no canonical form -------------------------------------------------------------------------


def _cycle() -> list[Any]:
    items: list[Any] = []
    items.append(items)
    return items


def _dict_cycle() -> dict[str, Any]:
    node: dict[str, Any] = {}
    node["self"] = node
    return node


NO_CANONICAL_FORM: dict[str, Any] = {
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "nested inf": {"lines": [1, float("inf")]},
    "decimal nan": Decimal("NaN"),
    "list cycle": _cycle(),
    "dict cycle": _dict_cycle(),
    "mixed set": {1, "a"},
    "object": object(),
    "object in a list": [1, object()],
    "function": len,
}


@pytest.mark.parametrize("name", list(NO_CANONICAL_FORM))
def test_arguments_without_a_canonical_form_raise_naming_the_argument(name: str) -> None:
    with pytest.raises(CanonicalizationError, match=r"argument order\b"):
        idempotency_key("ship", {"order": NO_CANONICAL_FORM[name], "fine": 1})


def test_a_cycle_is_reported_as_a_cycle_and_a_shared_object_is_not() -> None:
    with pytest.raises(CanonicalizationError, match="cycle"):
        idempotency_key("t", {"v": _cycle()})
    shared = [1, 2]
    assert idempotency_key("t", {"v": [shared, shared]}) == idempotency_key("t", {"v": [[1, 2], [1, 2]]})


@pytest.mark.parametrize("name", ["nan", "object", "list cycle"])
def test_the_guard_does_not_run_or_record_a_call_without_a_key(store: EffectStore, name: str) -> None:
    runs: list[Any] = []

    def ship(order: Any) -> str:
        runs.append(order)
        return "shipped"

    guarded = EffectGuard(store=store).wrap(ship)
    with tool_call_context("no-key"), pytest.raises(CanonicalizationError, match="order"):
        guarded(NO_CANONICAL_FORM[name])
    assert runs == []
    assert store.get("no-key") is None


def test_an_unguarded_reversible_call_runs_even_without_a_key() -> None:
    seen: list[str | None] = []

    @reversibility("reversible")
    def look(order: Any) -> str:
        seen.append(current_idempotency_key())
        return "ok"

    assert EffectGuard().wrap(look)(object()) == "ok"
    assert seen == [None]


# -- models and dataclasses --------------------------------------------------------------------


def test_a_pydantic_model_is_keyed_by_its_fields() -> None:
    assert idempotency_key("t", {"o": Order(sku="x", qty=2)}) == idempotency_key(
        "t", {"o": Order(qty=2, sku="x")}
    )
    assert idempotency_key("t", {"o": Order(sku="x", qty=2)}) == idempotency_key(
        "t", {"o": {"sku": "x", "qty": 2}}
    )
    assert idempotency_key("t", {"o": Order(sku="x", qty=2)}) != idempotency_key(
        "t", {"o": Order(sku="x", qty=3)}
    )


def test_a_dataclass_is_keyed_by_its_fields() -> None:
    assert idempotency_key("t", {"a": Address("Main", 1)}) == idempotency_key(
        "t", {"a": Address(number=1, street="Main")}
    )
    assert idempotency_key("t", {"a": Address("Main", 1)}) == idempotency_key(
        "t", {"a": {"street": "Main", "number": 1}}
    )
    assert idempotency_key("t", {"a": Address("Main", 1)}) != idempotency_key("t", {"a": Address("Main", 2)})


def test_a_dataclass_holding_a_value_without_a_canonical_form_is_an_error() -> None:
    with pytest.raises(CanonicalizationError, match="argument a"):
        idempotency_key("t", {"a": Address("Main", float("nan"))})  # type: ignore[arg-type]


def test_invalid_tool_names_and_argument_names_are_errors() -> None:
    with pytest.raises(CanonicalizationError):
        idempotency_key("", {"a": 1})
    with pytest.raises(CanonicalizationError):
        idempotency_key("t", {1: "a"})  # type: ignore[dict-item]


def test_the_key_is_stable_across_releases() -> None:
    """A change of the canonical form re-keys every stored record: it must be deliberate."""
    canonical = canonical_arguments({"cents": 5, "account": "a"})
    assert canonical == '{"account":"a","cents":5}'
    expected = hashlib.sha256(b"airlock-effect/v1\x00charge\x00" + canonical.encode()).hexdigest()
    assert idempotency_key("charge", {"account": "a", "cents": 5}) == expected


# -- current_idempotency_key -------------------------------------------------------------------


def test_current_idempotency_key_is_none_outside_a_guarded_call() -> None:
    assert current_idempotency_key() is None
    with tool_call_context("outside"):
        assert current_idempotency_key() is None


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_current_idempotency_key_is_the_calls_key_during_the_call(store: EffectStore, kind: str) -> None:
    seen: list[str | None] = []
    guard = EffectGuard(store=store)

    def charge(account: str, cents: int = 5) -> None:
        seen.append(current_idempotency_key())

    async def acharge(account: str, cents: int = 5) -> None:
        await asyncio.sleep(0)
        seen.append(current_idempotency_key())

    with tool_call_context("cur-1"):
        if kind == "sync":
            guard.wrap(charge)("acct")
            name = "charge"
        else:
            asyncio.run(guard.wrap(acharge)("acct"))
            name = "acharge"
    assert seen == [idempotency_key(name, {"account": "acct", "cents": 5})]
    assert current_idempotency_key() is None


def test_a_nested_guarded_call_restores_the_outer_key(store: EffectStore) -> None:
    guard = EffectGuard(store=store)
    seen: list[tuple[str, str | None]] = []

    @reversibility("reversible")
    def inner(x: int) -> int:
        seen.append(("inner", current_idempotency_key()))
        return x

    guarded_inner = guard.wrap(inner)

    def outer(x: int) -> int:
        seen.append(("outer-before", current_idempotency_key()))
        with tool_call_context("nested-inner"):  # its own call, its own id
            guarded_inner(x + 1)
        seen.append(("outer-after", current_idempotency_key()))
        return x

    with tool_call_context("nested"):
        guard.wrap(outer)(1)
    outer_key = idempotency_key("outer", {"x": 1})
    assert seen == [
        ("outer-before", outer_key),
        ("inner", idempotency_key("inner", {"x": 2})),
        ("outer-after", outer_key),
    ]


def test_the_key_is_cleared_after_a_failing_call(store: EffectStore) -> None:
    def fail() -> None:
        raise ValueError("no")

    with tool_call_context("fails"), pytest.raises(ValueError):
        EffectGuard(store=store).wrap(fail)()
    assert current_idempotency_key() is None


# -- properties --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


def _reinsert(value: Any, rotate: int) -> Any:
    """The same data with every dict's keys inserted in another order."""
    if isinstance(value, dict):
        items = [(k, _reinsert(v, rotate)) for k, v in value.items()]
        if items:
            shift = rotate % len(items)
            items = items[shift:][::-1] + items[:shift]
        return dict(items)
    if isinstance(value, list):
        return [_reinsert(v, rotate) for v in value]
    return value


@given(arguments=st.dictionaries(st.text(min_size=1), json_values, max_size=6), rotate=st.integers(0, 7))
def test_the_key_is_invariant_under_dict_insertion_order(arguments: dict[str, Any], rotate: int) -> None:
    shuffled = _reinsert(arguments, rotate)
    assert shuffled == arguments
    assert idempotency_key("tool", shuffled) == idempotency_key("tool", arguments)


@given(first=json_values, second=json_values)
def test_different_json_data_gives_different_keys(first: Any, second: Any) -> None:
    def same_data(a: Any, b: Any) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same_data(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(same_data(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, float):
            return repr(a) == repr(b)
        return bool(a == b)

    keys_equal = idempotency_key("t", {"v": first}) == idempotency_key("t", {"v": second})
    assert keys_equal == same_data(first, second)


_FLAT_VALUES = st.none() | st.booleans() | st.integers() | st.text()


@given(st.dictionaries(st.text(), _FLAT_VALUES, max_size=6))
def test_flat_arguments_take_a_shortcut_to_the_same_text(arguments: dict[str, Any]) -> None:
    """Flat str/int/bool/None arguments skip the general encoder; the text must not change."""
    from airlock_redis.core import canonical

    general = canonical._dump(
        {canonical._escape_key(k): canonical._canon(v, k, set()) for k, v in arguments.items()}
    )
    assert canonical.canonical_arguments(arguments) == general


def _tool(a: int, b: str = "b", *, c: bool = False) -> None:
    """A plain signature: ArgumentBinder binds it without inspect.Signature.bind."""


@given(
    st.integers(min_value=0, max_value=2),
    st.sets(st.sampled_from(["a", "b", "c"])),
    st.dictionaries(st.sampled_from(["d", "e"]), st.integers(), max_size=1),
)
def test_every_binding_shortcut_agrees_with_signature_bind(
    positional: int, named: set[str], stray: dict[str, int]
) -> None:
    """The binder's direct paths (all by name, or positional then by name) give what
    ``inspect.Signature.bind`` with defaults gives, and name what the caller passed; a call the
    signature refuses falls back to the keywords plus positional slots."""
    import inspect

    from airlock_redis.core.canonical import ArgumentBinder

    args = (1, "x")[:positional]
    kwargs: dict[str, Any] = {n: {"a": 2, "b": "y", "c": True}[n] for n in sorted(named)}
    kwargs.update(stray)
    signature = inspect.signature(_tool)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        expected = (
            {**kwargs, **{f"${i}": v for i, v in enumerate(args)}},
            frozenset(kwargs) | {f"${i}" for i in range(len(args))},
        )
    else:
        passed = frozenset(bound.arguments)
        bound.apply_defaults()
        expected = (dict(bound.arguments), passed)
    arguments, passed_names = ArgumentBinder(_tool).bind(args, kwargs)
    assert (arguments, frozenset(passed_names)) == expected
