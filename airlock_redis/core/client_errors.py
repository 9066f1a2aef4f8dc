"""The common clients' errors, by name: what each class says on its own about a request (a read-side
timeout or lost connection, a proof that it never left, a transport wrapper, an error raised when the
client's retries gave up). Classes are matched by ``module.qualname`` of the module that defines
them, so no client library is ever imported. Pure data, and the facts of one class; the rule that
combines them is :mod:`.ambiguity` (its module doc says how)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Final, NamedTuple

__all__ = [
    "CLIENT_ANSWERS_AFTER_RETRIES",
    "CLIENT_IN_DOUBT_ERRORS",
    "CLIENT_NOT_SENT_ERRORS",
    "CLIENT_RETRY_ERRORS",
    "CLIENT_TRANSPORT_WRAPPERS",
    "RPC_IN_DOUBT_STATUSES",
]


def _names(module: str, *classes: str) -> frozenset[str]:
    return frozenset(f"{module}.{name}" for name in classes)


# httpx, httpcore and the Stainless SDKs (openai, anthropic) rewrite __module__ of what they export to
# the package name; their private defining module is listed too, for versions that do not.
_HTTPX_IN_DOUBT = ("ReadTimeout", "WriteTimeout", "RemoteProtocolError", "ReadError", "WriteError")
_HTTPX_NOT_SENT = ("ConnectError", "ConnectTimeout", "PoolTimeout")
_SDK_WRAPPERS = ("APIConnectionError", "APITimeoutError")

CLIENT_IN_DOUBT_ERRORS: Final[frozenset[str]] = (
    _names("requests.exceptions", "ReadTimeout", "ChunkedEncodingError")
    | _names("urllib3.exceptions", "ProtocolError", "ReadTimeoutError")
    | _names("httpx", *_HTTPX_IN_DOUBT)
    | _names("httpx._exceptions", *_HTTPX_IN_DOUBT)
    | _names("httpcore", *_HTTPX_IN_DOUBT)
    | _names("httpcore._exceptions", *_HTTPX_IN_DOUBT)
    | _names(
        "aiohttp.client_exceptions",
        "ServerTimeoutError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "SocketTimeoutError",
        "ClientOSError",  # a socket error on an open connection (its subclass ClientConnectorError: a proof)
    )
    | _names("botocore.exceptions", "ReadTimeoutError", "ConnectionClosedError", "ResponseStreamingError")
)
"""Read-side timeouts and lost connections of the common clients: the request was (or may have been) sent."""

CLIENT_NOT_SENT_ERRORS: Final[frozenset[str]] = (
    _names("requests.exceptions", "ConnectTimeout")
    | _names("urllib3.exceptions", "NewConnectionError", "ConnectTimeoutError", "NameResolutionError")
    | _names("httpx", *_HTTPX_NOT_SENT)
    | _names("httpx._exceptions", *_HTTPX_NOT_SENT)
    | _names("httpcore", *_HTTPX_NOT_SENT)
    | _names("httpcore._exceptions", *_HTTPX_NOT_SENT)
    | _names(
        "aiohttp.client_exceptions",
        "ClientConnectorError",  # and its subclasses: DNS, SSL and certificate failures at connect
        "ConnectionTimeoutError",  # aiohttp>=3.10; a subclass of ServerTimeoutError
        "ServerFingerprintMismatch",
    )
    | _names("botocore.exceptions", "ConnectTimeoutError", "EndpointConnectionError")
    | frozenset({"builtins.ConnectionRefusedError", "socket.gaierror", "ssl.SSLCertVerificationError"})
)
"""Errors that prove the request never left the client: no connection, no name, no TLS, no pooled slot."""

CLIENT_TRANSPORT_WRAPPERS: Final[frozenset[str]] = (
    _names("requests.exceptions", "ConnectionError")
    | _names("openai", *_SDK_WRAPPERS)
    | _names("openai._exceptions", *_SDK_WRAPPERS)
    | _names("anthropic", *_SDK_WRAPPERS)
    | _names("anthropic._exceptions", *_SDK_WRAPPERS)
)
"""Errors that wrap whatever went wrong in transit: in doubt unless their own chain holds a proof."""

# How a client's record of its earlier tries is read (see "After retries" in the module doc).
BY_URLLIB3, BY_TENACITY, BY_SDK, BY_RESPONSE = range(1, 5)
_SDK_STATUS = ("APIStatusError",)

_RETRY_ERRORS: Final[dict[str, int]] = {
    "urllib3.exceptions.MaxRetryError": BY_URLLIB3,
    "tenacity.RetryError": BY_TENACITY,
    **dict.fromkeys(_names("openai", *_SDK_WRAPPERS), BY_SDK),
    **dict.fromkeys(_names("openai._exceptions", *_SDK_WRAPPERS), BY_SDK),
    **dict.fromkeys(_names("anthropic", *_SDK_WRAPPERS), BY_SDK),
    **dict.fromkeys(_names("anthropic._exceptions", *_SDK_WRAPPERS), BY_SDK),
}
_ANSWERS_AFTER_RETRIES: Final[dict[str, int]] = {
    "requests.exceptions.HTTPError": BY_RESPONSE,
    **dict.fromkeys(_names("openai", *_SDK_STATUS), BY_SDK),
    **dict.fromkeys(_names("openai._exceptions", *_SDK_STATUS), BY_SDK),
    **dict.fromkeys(_names("anthropic", *_SDK_STATUS), BY_SDK),
    **dict.fromkeys(_names("anthropic._exceptions", *_SDK_STATUS), BY_SDK),
}

CLIENT_RETRY_ERRORS: Final[frozenset[str]] = frozenset(_RETRY_ERRORS)
"""Errors raised when a client's own retries gave up: in doubt unless the client's record proves that no
earlier try was sent (requests wraps every connection failure in a ``MaxRetryError``, retries or not)."""

CLIENT_ANSWERS_AFTER_RETRIES: Final[frozenset[str]] = frozenset(_ANSWERS_AFTER_RETRIES)
"""Answers that may come after retries: in doubt when the client's record shows an earlier try that may
have been sent."""

URLLIB3_RETRY: Final = "urllib3.util.retry.Retry"
URLLIB3_INCREMENT: Final = ("urllib3.util.retry", "increment")  # the frame that raises after retries
SDK_CLIENTS: Final = frozenset({"openai._base_client", "anthropic._base_client"})
SDK_REQUEST: Final = frozenset({"request", "_request"})  # the frames that retry (newer, older SDKs)

RPC_IN_DOUBT_STATUSES: Final[frozenset[str]] = frozenset({"DEADLINE_EXCEEDED", "UNAVAILABLE"})
"""gRPC status names (``error.code().name``) that leave a call's effect in doubt."""

_REASON_CARRIERS: Final = frozenset({"urllib3.exceptions.MaxRetryError"})

# Python 3.10: asyncio's and concurrent.futures' TimeoutError are classes of their own (3.11 made them the
# builtin). A rule that lists TimeoutError, with client recognition on, counts them as TimeoutError.
_OLD_TIMEOUTS: Final = frozenset({"asyncio.exceptions.TimeoutError", "concurrent.futures._base.TimeoutError"})

# What one error says on its own.
NONE, WEAK, STRONG, NOT_SENT, WRAPPER, RPC = range(6)
IN_DOUBT_ALONE: Final = frozenset({WEAK, STRONG, WRAPPER})  # an error with nothing linked to it

_KNOWN: Final[dict[str, int]] = {
    **dict.fromkeys(CLIENT_IN_DOUBT_ERRORS, STRONG),
    **dict.fromkeys(CLIENT_NOT_SENT_ERRORS, NOT_SENT),
    **dict.fromkeys(CLIENT_TRANSPORT_WRAPPERS, WRAPPER),
}


def qualified(cls: type) -> str:
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "?")
    return f"{module}.{qualname}" if isinstance(module, str) else str(qualname)


def _is_rpc_module(cls: type) -> bool:
    module = getattr(cls, "__module__", None)
    return isinstance(module, str) and (module == "grpc" or module.startswith("grpc."))


class Facts(NamedTuple):
    """What the names in a class's MRO say, whatever the rule."""

    kind: int  # of the most specific class found in the name tables (NONE, STRONG, ... RPC)
    old_timeout: bool  # Python 3.10's asyncio / concurrent.futures TimeoutError
    group_shaped: bool  # a class named *ExceptionGroup (groups without the builtin, e.g. on 3.10)
    carries_reason: bool  # urllib3's MaxRetryError: ``reason`` holds the error that decided
    record: int  # how the client's record of earlier tries is read (0: it is not looked for)
    after_retries: bool  # raised when retries gave up: with no record to read, the call is in doubt


def facts_of(cls: type) -> Facts:
    names = [qualified(klass) for klass in cls.__mro__]
    kind = next((_KNOWN[name] for name in names if name in _KNOWN), NONE)
    if kind == NONE and any(_is_rpc_module(klass) for klass in cls.__mro__):
        kind = RPC
    retried = next((name for name in names if name in _RETRY_ERRORS or name in _ANSWERS_AFTER_RETRIES), None)
    return Facts(
        kind=kind,
        old_timeout=any(name in _OLD_TIMEOUTS for name in names),
        group_shaped=any(getattr(klass, "__name__", "").endswith("ExceptionGroup") for klass in cls.__mro__),
        carries_reason=any(name in _REASON_CARRIERS for name in names),
        record=0 if retried is None else _RETRY_ERRORS.get(retried) or _ANSWERS_AFTER_RETRIES[retried],
        after_retries=retried in _RETRY_ERRORS,
    )


# These depend only on the class: cached, and bounded (a class made on the fly is held until evicted).
facts: Callable[[type], Facts] = lru_cache(maxsize=1024)(facts_of)


def rpc_status(error: BaseException) -> str | None:
    """The name of a gRPC error's status, asked defensively: ``code`` may be missing or raise."""
    try:
        code = getattr(error, "code", None)
        status = code() if callable(code) else None
    except Exception:
        return None
    name = getattr(status, "name", status)
    return name.upper() if isinstance(name, str) else None
