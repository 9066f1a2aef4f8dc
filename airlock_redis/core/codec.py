"""How results cross processes: msgpack with a small fixed set of extension types.

Stored bytes never name a class to import. Pydantic models and dataclasses are stored as plain
dicts and rebuilt on replay by validating against the tool's return annotation
(:func:`revalidate`); Redis content is data, not code.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from typing import Any

import msgpack
from pydantic import TypeAdapter, ValidationError

from .errors import ResultDecodingError, ResultEncodingError

FORMAT_VERSION = 1
_FORMAT_PREFIX = bytes([FORMAT_VERSION])
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024

_EXT_DATETIME = 1
_EXT_DATE = 2
_EXT_TIME = 3
_EXT_DECIMAL = 4
_EXT_UUID = 5
_EXT_TUPLE = 6
_EXT_SET = 7
_EXT_FROZENSET = 8
_EXT_TIMEDELTA = 9
_EXT_BIGINT = 10


def _pack(value: Any) -> bytes:
    packed: bytes = _new_packer().pack(value)
    return packed


def _default(value: Any) -> Any:
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, int):
        if type(value) is int:  # outside msgpack's 64-bit range
            return msgpack.ExtType(_EXT_BIGINT, str(value).encode("ascii"))
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dt.datetime):
        return msgpack.ExtType(_EXT_DATETIME, value.isoformat().encode("ascii"))
    if isinstance(value, dt.date):
        return msgpack.ExtType(_EXT_DATE, value.isoformat().encode("ascii"))
    if isinstance(value, dt.time):
        return msgpack.ExtType(_EXT_TIME, value.isoformat().encode("ascii"))
    if isinstance(value, dt.timedelta):
        return msgpack.ExtType(_EXT_TIMEDELTA, _pack([value.days, value.seconds, value.microseconds]))
    if isinstance(value, Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(value).encode("ascii"))
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_EXT_UUID, value.bytes)
    if isinstance(value, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _pack(list(value)))
    if isinstance(value, frozenset):
        return msgpack.ExtType(_EXT_FROZENSET, _pack(list(value)))
    if isinstance(value, set):
        return msgpack.ExtType(_EXT_SET, _pack(list(value)))
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and hasattr(type(value), "model_fields"):
        return model_dump(mode="python")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise ResultEncodingError(f"a {type(value).__qualname__} cannot be stored")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_DATETIME:
        return dt.datetime.fromisoformat(data.decode("ascii"))
    if code == _EXT_DATE:
        return dt.date.fromisoformat(data.decode("ascii"))
    if code == _EXT_TIME:
        return dt.time.fromisoformat(data.decode("ascii"))
    if code == _EXT_TIMEDELTA:
        days, seconds, micros = _unpack(data)
        return dt.timedelta(days=days, seconds=seconds, microseconds=micros)
    if code == _EXT_DECIMAL:
        return Decimal(data.decode("ascii"))
    if code == _EXT_UUID:
        return uuid.UUID(bytes=data)
    if code == _EXT_TUPLE:
        return tuple(_unpack(data))
    if code == _EXT_SET:
        return set(_unpack(data))
    if code == _EXT_FROZENSET:
        return frozenset(_unpack(data))
    if code == _EXT_BIGINT:
        return int(data.decode("ascii"))
    raise ResultDecodingError(f"unknown extension type {code} in a stored result")


# A Packer of its own for each value packed (_default re-enters for nested values). Built through a
# partial: msgpack.packb's keyword forwarding costs more than packing a small result does.
_new_packer = functools.partial(
    msgpack.Packer, default=_default, use_bin_type=True, strict_types=True, datetime=False
)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(
        data, ext_hook=_ext_hook, raw=False, strict_map_key=False, use_list=True, timestamp=0
    )


def encode_result(value: Any, max_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> bytes:
    """Serialise a tool's result. Raises :class:`ResultEncodingError` if it cannot be stored."""
    try:
        body = _pack(value)
    except ResultEncodingError:
        raise
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise ResultEncodingError(f"the result cannot be stored: {exc}") from exc
    data = _FORMAT_PREFIX + body
    if len(data) > max_bytes:
        raise ResultEncodingError(
            f"the result is {len(data)} bytes once encoded, over the limit of {max_bytes}"
        )
    return data


def decode_result(data: bytes) -> Any:
    """Rebuild a stored result. Raises :class:`ResultDecodingError` for damaged data."""
    if not data or data[0] != FORMAT_VERSION:
        raise ResultDecodingError("the stored result has an unknown format version")
    try:
        return _unpack(data[1:])
    except ResultDecodingError:
        raise
    except Exception as exc:
        raise ResultDecodingError(f"the stored result cannot be decoded: {exc}") from exc


@lru_cache(maxsize=1024)
def _adapter_for(annotation: Any) -> TypeAdapter[Any] | None:
    if annotation in (Any, None, type(None), object):
        return None
    try:
        return TypeAdapter(annotation)
    except Exception:
        return None


def return_annotation(fn: Callable[..., Any]) -> Any:
    """The tool's resolved return annotation, or ``Any`` when it has none or cannot be resolved."""
    target = typing.cast(Callable[..., Any], _innermost(fn))
    try:
        hints = typing.get_type_hints(target)
    except Exception:
        return Any
    return hints.get("return", Any)


def _innermost(fn: Any) -> Any:
    seen = 0
    while hasattr(fn, "__wrapped__") and seen < 64:
        fn = fn.__wrapped__
        seen += 1
    return fn


def revalidate(value: Any, annotation: Any) -> Any:
    """Rebuild models and dataclasses from stored plain data through the return annotation.

    A value the annotation does not accept is returned as decoded: the stored data is what the tool
    returned, so a failure here means the annotation does not describe it.
    """
    if isinstance(annotation, type) and annotation.__module__ == "builtins":
        return value
    try:
        adapter = _adapter_for(annotation)
    except TypeError:  # unhashable annotation
        adapter = None
    if adapter is None:
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError:
        return value
