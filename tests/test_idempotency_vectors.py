"""The idempotency key's test vectors (tests/data/idempotency_vectors.json, described in
docs/idempotency-key.md) hold: the library computes every vector's canonical text and key, refuses
the inputs that have none, and a second implementation written here from the document alone (a
hand-written JSON writer and hashlib, no airlock_redis code) gets the same text and key for every
plain-JSON vector. A backend in another language can check itself against the same file.

To write the file again after a deliberate change of the rules: ``python -m tests.test_idempotency_vectors``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import json
import math
import pathlib
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from airlock_redis import CanonicalizationError, canonical_arguments, idempotency_key

VECTORS = pathlib.Path(__file__).parent / "data" / "idempotency_vectors.json"
DOMAIN = b"airlock-effect/v1\x00"


# -- what the Python-only vectors may name -----------------------------------------------------------
class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: int
    y: int


NAMESPACE: dict[str, Any] = {
    "dt": dt,
    "Decimal": decimal.Decimal,
    "uuid": uuid,
    "PurePosixPath": pathlib.PurePosixPath,
    "Color": Color,
    "Level": Level,
    "Point": Point,
}

# -- the inputs: (name, tool, JSON arguments) and (name, tool, Python expression) ----------------------
JSON_INPUTS: list[tuple[str, str, Any]] = [
    ("the README's charge", "charge", {"account": "acct_1", "cents": 500}),
    ("no arguments", "ping", {}),
    ("null, booleans", "flags", {"a": None, "b": True, "c": False}),
    (
        "keys sorted by code point, not UTF-16",
        "sort",
        {"b": 1, "a": 2, "A": 3, "_": 4, "\u00e9": 5, "\U0001f600": 6, "\uff5e": 7, "": 8},
    ),
    ("keys starting with $ get one more", "escape", {"$ref": 1, "$$x": 2, "a$": 3, "$": 4}),
    ("$ keys in nested objects too", "nested", {"outer": {"$id": {"$$": [{"$k": None}]}}}),
    (
        "string escapes",
        "strings",
        {"s": 'q" b\\ n\n t\t r\r b\b f\f nul\u0000 us\u001f del\u007f ls\u2028 /slash \u00e9 \U0001f600'},
    ),
    ("integers of any size", "ints", {"zero": 0, "neg": -1, "big": 2**70, "small": -(2**70)}),
    ("an integer", "number", {"n": 1}),
    ("the same value as a float", "number", {"n": 1.0}),
    (
        "floats in fixed notation",
        "floats",
        {"a": 0.1, "b": -0.0, "c": 1e15, "d": 1e-4, "e": 123456789.123, "f": -2.5, "g": 9007199254740992.0},
    ),
    (
        "floats in exponent notation",
        "floats",
        {"a": 1e16, "b": 1.5e16, "c": 1e-5, "d": 5e-324, "e": 1.7976931348623157e308, "f": -2.5e-7},
    ),
    ("arrays and objects, empty and nested", "shapes", {"l": [], "o": {}, "m": [[1, [2]], {"k": [True]}]}),
    ("a lone surrogate in a value and a key", "surrogates", {"s": "a\ud800b", "\udfff": 1}),
    ("a tool name outside ASCII", "envoyer_\u20ac", {"to": "b\u00e9a@example.com"}),
]

PYTHON_INPUTS: list[tuple[str, str, str]] = [
    ("bytes", "upload", "{'data': b'\\x00\\xffhi', 'empty': bytearray()}"),
    (
        "dates and times",
        "schedule",
        "{'at': dt.datetime(2026, 1, 2, 3, 4, 5, 600), 'utc': dt.datetime(2026, 1, 2, 3, 4, 5, "
        "tzinfo=dt.timezone.utc), 'day': dt.date(2026, 1, 2), 'time': dt.time(1, 2), "
        "'back': dt.timedelta(seconds=-1)}",
    ),
    ("Decimal keeps its digits", "pay", "{'a': Decimal('1.50'), 'b': Decimal('1E+2'), 'c': Decimal('-0')}"),
    (
        "uuid and path",
        "fetch",
        "{'id': uuid.UUID('12345678-1234-5678-1234-567812345678'), 'p': PurePosixPath('/tmp/x')}",
    ),
    ("sets sorted by canonical text", "tag", "{'s': {3, 1, 20}, 'f': frozenset({'b', 'a'}), 'e': set()}"),
    ("a tuple is an array", "move", "{'to': (1, 2)}"),
    ("a mapping with keys that are not strings", "lookup", "{'m': {2: 'b', 'a': 1, 10: None}}"),
    ("enum members", "paint", "{'c': Color.RED, 'l': Level.HIGH}"),
    ("a dataclass is the object of its fields", "plot", "{'p': Point(x=1, y=2)}"),
    ("the same as a plain object", "plot", "{'p': {'x': 1, 'y': 2}}"),
]

ERROR_INPUTS: list[tuple[str, str, str]] = [
    ("NaN", "t", "{'x': float('nan')}"),
    ("infinity", "t", "{'x': [float('-inf')]}"),
    ("a Decimal NaN", "t", "{'x': Decimal('NaN')}"),
    ("a set of mixed types", "t", "{'x': {1, 'a'}}"),
    ("an arbitrary object", "t", "{'x': object()}"),
    ("an empty tool name", "", "{}"),
]


BUILTINS = {"float": float, "set": set, "frozenset": frozenset, "bytearray": bytearray, "object": object}


def _evaluate(expression: str) -> Any:
    """A vector's Python expression (the test's own literals), with only the names above."""
    return eval(expression, {"__builtins__": BUILTINS, **NAMESPACE})


def build() -> dict[str, Any]:
    """The vectors, computed by the library from the inputs above."""
    vectors: list[dict[str, Any]] = []
    for name, tool, arguments in JSON_INPUTS:
        canonical = canonical_arguments(arguments)
        vectors.append(
            {
                "name": name,
                "tool": tool,
                "arguments": arguments,
                "canonical": canonical,
                "key": idempotency_key(tool, arguments),
            }
        )
    for name, tool, expression in PYTHON_INPUTS:
        arguments = _evaluate(expression)
        vectors.append(
            {
                "name": name,
                "tool": tool,
                "python": expression,
                "canonical": canonical_arguments(arguments),
                "key": idempotency_key(tool, arguments),
            }
        )
    for name, tool, expression in ERROR_INPUTS:
        vectors.append({"name": name, "tool": tool, "python": expression, "error": "CanonicalizationError"})
    return {
        "about": (
            "Test vectors of airlock_redis's idempotency key (docs/idempotency-key.md). key = "
            "sha256(b'airlock-effect/v1\\x00' + utf8(tool) + b'\\x00' + utf8(canonical)), hex. "
            "'arguments' is the JSON of a call's arguments; 'python' is a Python expression for values "
            "JSON cannot hold (tests/test_idempotency_vectors.py defines Color, Level, Point); 'error' "
            "marks input that has no canonical form."
        ),
        "vectors": vectors,
    }


# -- the second implementation, from docs/idempotency-key.md alone -------------------------------------
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(text: str) -> str:
    out = []
    for char in text:
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif ord(char) < 0x20:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _float(number: float) -> str:
    if not math.isfinite(number):
        raise ValueError("no canonical form")
    # the shortest digits that read back as the number (every language has them), laid out by rule 6
    sign, digits_tuple, exponent = decimal.Decimal(repr(number)).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digits_tuple))
    if digits == "0":
        return "-0.0" if math.copysign(1, number) < 0 else "0.0"
    e = exponent + len(digits) - 1  # number = d.ddd x 10^e
    minus = "-" if sign else ""
    if -4 <= e < 16:
        if e >= 0:
            whole, fraction = (digits + "0" * (e + 1))[: e + 1], digits[e + 1 :]
        else:
            whole, fraction = "0", "0" * (-e - 1) + digits
        return f"{minus}{whole}.{fraction or '0'}"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{minus}{mantissa}e{'-' if e < 0 else '+'}{abs(e):02d}"


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ",".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        members = {("$" + k if k.startswith("$") else k): v for k, v in value.items()}
        order = sorted(members, key=lambda k: k.encode("utf-8", "surrogatepass"))
        return "{" + ",".join(f"{_string(k)}:{_value(members[k])}" for k in order) + "}"
    raise TypeError(f"not JSON: {type(value).__name__}")


def second_implementation(tool: str, arguments: dict[str, Any]) -> tuple[str, str]:
    canonical = _value(arguments)
    data = (
        DOMAIN + tool.encode("utf-8", "surrogatepass") + b"\x00" + canonical.encode("utf-8", "surrogatepass")
    )
    return canonical, hashlib.sha256(data).hexdigest()


# -- the tests ------------------------------------------------------------------------------------------
def _vectors() -> list[dict[str, Any]]:
    if not VECTORS.exists():  # (while it is written; the coverage test below fails without it)
        return []
    loaded: list[dict[str, Any]] = json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]
    return loaded


@pytest.mark.parametrize("vector", _vectors(), ids=lambda v: v["name"])
def test_the_library_computes_every_vector(vector: dict[str, Any]) -> None:
    arguments = vector["arguments"] if "arguments" in vector else _evaluate(vector["python"])
    if "error" in vector:
        with pytest.raises(CanonicalizationError):
            idempotency_key(vector["tool"], arguments)
        return
    assert canonical_arguments(arguments) == vector["canonical"]
    assert idempotency_key(vector["tool"], arguments) == vector["key"]
    assert len(vector["key"]) == 64 and vector["key"] == vector["key"].lower()


@pytest.mark.parametrize("vector", [v for v in _vectors() if "arguments" in v], ids=lambda v: v["name"])
def test_a_second_implementation_agrees_on_every_json_vector(vector: dict[str, Any]) -> None:
    assert second_implementation(vector["tool"], vector["arguments"]) == (vector["canonical"], vector["key"])


def test_the_file_is_what_the_inputs_give_and_covers_each_rule() -> None:
    on_disk = json.loads(VECTORS.read_text(encoding="utf-8"))
    assert on_disk == build(), "the vectors changed: run python -m tests.test_idempotency_vectors"
    by_name = {v["name"]: v for v in on_disk["vectors"]}
    assert by_name["an integer"]["key"] != by_name["the same value as a float"]["key"]
    assert (
        by_name["a dataclass is the object of its fields"]["key"]
        == by_name["the same as a plain object"]["key"]
    )
    assert '"\uff5e":7,"\U0001f600":6' in by_name["keys sorted by code point, not UTF-16"]["canonical"]
    assert by_name["keys starting with $ get one more"]["canonical"] == '{"$$":4,"$$$x":2,"$$ref":1,"a$":3}'
    assert by_name["floats in exponent notation"]["canonical"] == (
        '{"a":1e+16,"b":1.5e+16,"c":1e-05,"d":5e-324,"e":1.7976931348623157e+308,"f":-2.5e-07}'
    )
    json_vectors = [v for v in on_disk["vectors"] if "arguments" in v]
    assert len(json_vectors) >= 15 and len(on_disk["vectors"]) >= 30


def test_the_second_implementation_is_not_a_copy_of_json_dumps() -> None:
    """Where Python's json would differ from the document (a float subclass, key order), the second
    implementation follows the document; and it refuses what JSON cannot hold."""
    assert _float(1e22) == "1e+22" and _float(123.0) == "123.0" and _float(0.00012) == "0.00012"
    assert _float(-1e-7) == "-1e-07" and _float(1234567890123456.7) == "1234567890123456.8"
    for number in (0.1, 1e15, 1e16, 2.5e-5, 5e-324, 1.7976931348623157e308, -0.0, 100.0):
        assert _float(number) == repr(number)
    with pytest.raises(ValueError, match="no canonical form"):
        _float(math.nan)
    with pytest.raises(TypeError):
        _value({"b": b"x"})


def main(write: Callable[[str], object] = VECTORS.write_text) -> None:
    write(json.dumps(build(), indent=2, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
