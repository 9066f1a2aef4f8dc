"""Canonical form of tool arguments and the idempotency key derived from it.

The canonical form is compact JSON with sorted keys. JSON-native values (str, int, float, bool,
None, lists and str-keyed dicts) appear as themselves; other values appear as a one-key object
whose key starts with ``$`` (``{"$bytes": "..."}``), and a user dict key that starts with ``$``
is escaped with one more ``$``, so two different inputs never share a form.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import hashlib
import inspect
import json
import math
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import PurePath
from typing import Any

from .errors import CanonicalizationError

_KEY_DOMAIN = b"airlock-effect/v1\x00"
_SCALARS = (str, int, bool, type(None))


def _escape_key(key: str) -> str:
    return "$" + key if key.startswith("$") else key


def _tagged(tag: str, payload: Any) -> dict[str, Any]:
    return {"$" + tag: payload}


def _canon(value: Any, path: str, active: set[int]) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise CanonicalizationError(
                f"argument {path} is {value!r}: NaN and infinities have no canonical form"
            )
        return value
    if isinstance(value, enum.Enum):
        return _tagged("enum", _canon(value.value, path, active))
    if isinstance(value, str):  # subclasses of the scalars
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _canon(float(value), path, active)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _tagged("bytes", base64.b64encode(bytes(value)).decode("ascii"))
    if isinstance(value, dt.datetime):
        return _tagged("datetime", value.isoformat())
    if isinstance(value, dt.date):
        return _tagged("date", value.isoformat())
    if isinstance(value, dt.time):
        return _tagged("time", value.isoformat())
    if isinstance(value, dt.timedelta):
        return _tagged("timedelta", [value.days, value.seconds, value.microseconds])
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise CanonicalizationError(
                f"argument {path} is Decimal({str(value)!r}): it has no canonical form"
            )
        return _tagged("decimal", str(value))
    if isinstance(value, uuid.UUID):
        return _tagged("uuid", str(value))
    if isinstance(value, PurePath):
        return _tagged("path", str(value))
    marker = id(value)
    if marker in active:
        raise CanonicalizationError(f"argument {path} contains itself (a cycle): it has no canonical form")
    active.add(marker)
    try:
        return _canon_container(value, path, active)
    finally:
        active.discard(marker)


def _canon_container(value: Any, path: str, active: set[int]) -> Any:
    if isinstance(value, Mapping):
        if all(type(k) is str for k in value):
            return {_escape_key(k): _canon(v, f"{path}[{k!r}]", active) for k, v in value.items()}
        pairs = [
            (_canon(k, f"{path} key", active), _canon(v, f"{path}[{k!r}]", active)) for k, v in value.items()
        ]
        pairs.sort(key=lambda kv: _dump(kv[0]))
        return _tagged("map", [list(kv) for kv in pairs])
    if isinstance(value, (list, tuple)):
        return [_canon(item, f"{path}[{i}]", active) for i, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        kinds = {_kind_of_member(item) for item in value}
        if len(kinds) > 1:
            names = ", ".join(sorted(kinds))
            raise CanonicalizationError(
                f"argument {path} is a set of mixed types ({names}): it has no canonical order"
            )
        members = sorted((_canon(item, f"{path} member", active) for item in value), key=_dump)
        return _tagged("set", members)
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and hasattr(type(value), "model_fields"):
        return _canon(model_dump(mode="python"), path, active)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _canon(fields, path, active)
    raise CanonicalizationError(
        f"argument {path} is a {type(value).__qualname__}, which has no canonical form; pass plain data "
        "(str, numbers, bool, None, lists, dicts, bytes, dates, Decimal, UUID, pydantic models, dataclasses)"
    )


def _kind_of_member(item: Any) -> str:
    if isinstance(item, bool):
        return "bool"
    if isinstance(item, (int, float, Decimal)):
        return "number"
    return type(item).__qualname__


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dump(value: Any) -> str:
    return _ENCODER.encode(value)


def _no_default(value: Any) -> Any:
    raise TypeError(f"{type(value).__qualname__} is not JSON serializable")


# The same encoding for flat str/int/bool/None arguments, without building an encoder per call (what
# JSONEncoder.encode does). No check for cycles, which flat scalars cannot have. None where the
# interpreter has no C encoder.
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_FLAT = (
    _c_make_encoder(None, _no_default, json.encoder.encode_basestring, None, ":", ",", True, False, False)
    if _c_make_encoder is not None
    else None
)


def canonical_arguments(arguments: Mapping[str, Any]) -> str:
    """Return the canonical JSON text of a call's arguments (by name)."""
    plain = True
    for name, value in arguments.items():
        if type(name) is not str:
            raise CanonicalizationError("argument names must be strings")
        if type(value) not in _SCALARS or name[:1] == "$":
            plain = False
    if plain:  # the common case: flat str/int/bool/None arguments are their own canonical form
        return "".join(_FLAT(arguments, 0)) if _FLAT is not None else _dump(arguments)
    return _dump({_escape_key(k): _canon(v, k, set()) for k, v in arguments.items()})


def idempotency_key(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """The sha256 (hex) of the tool's name and its canonical arguments.

    It depends only on the business input: the same tool with the same arguments gives the same
    key whatever the tool_call_id and whatever the order the arguments were passed in.
    """
    if not isinstance(tool_name, str) or not tool_name:
        raise CanonicalizationError("the tool name must be a non-empty string")
    # the domain, the name, a NUL, the canonical arguments (one encode of the joined text is the
    # same bytes as encoding each part)
    text = f"{tool_name}\x00{canonical_arguments(arguments)}"
    return hashlib.sha256(_KEY_DOMAIN + text.encode("utf-8", "surrogatepass")).hexdigest()


class ArgumentBinder:
    """Maps a call's arguments to parameter names, defaults applied; the signature is read once.

    ``**kwargs`` items keep their own names; a call that does not fit the signature falls back to
    the keywords plus positional slots named ``$0``, ``$1``, ...
    A signature of plain parameters (no ``*args``, ``**kwargs`` or positional-only ones) is bound
    by a direct path; any other, or a call the direct path cannot place, goes through
    ``inspect.Signature.bind``.
    """

    __slots__ = ("_defaults", "_names", "_positional", "_signature")

    def __init__(self, fn: Callable[..., Any]) -> None:
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self._signature = None
        self._positional: tuple[str, ...] | None = None
        self._names: frozenset[str] = frozenset()
        self._defaults: tuple[tuple[str, Any], ...] = ()
        if self._signature is not None:
            parameters = self._signature.parameters.values()
            simple = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            if all(p.kind in simple for p in parameters):
                self._positional = tuple(
                    p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
                )
                self._names = frozenset(p.name for p in parameters)
                self._defaults = tuple((p.name, p.default) for p in parameters if p.default is not p.empty)

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
        """Return (arguments by name with defaults, names the caller passed)."""
        positional = self._positional
        if not args and positional is not None and kwargs.keys() == self._names:
            return dict(kwargs), self._names  # the common call: every parameter by name
        if positional is not None and len(args) <= len(positional):
            result = dict(zip(positional, args, strict=False))
            for name, value in kwargs.items():
                if name in result or name not in self._names:
                    return self._bind_slowly(args, kwargs)
                result[name] = value
            passed = frozenset(result)
            for name, default in self._defaults:
                if name not in result:
                    result[name] = default
            if len(result) == len(self._names):
                return result, passed
        return self._bind_slowly(args, kwargs)

    def _bind_slowly(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[dict[str, Any], frozenset[str]]:
        if self._signature is None:
            return _unbound(args, kwargs)
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            return _unbound(args, kwargs)
        passed = set(bound.arguments)
        bound.apply_defaults()
        result: dict[str, Any] = {}
        parameters = self._signature.parameters
        for name, value in bound.arguments.items():
            if parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                result.update(value)
                passed.discard(name)
                passed.update(value)
            else:
                result[name] = value
        return result, frozenset(passed)


def _unbound(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    result = {f"${i}": value for i, value in enumerate(args)}
    result.update(kwargs)
    return result, frozenset(result)
