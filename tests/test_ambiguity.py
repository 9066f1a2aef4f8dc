"""Is an error ambiguous? The rule of airlock_redis.core.ambiguity, as one table.

The client libraries are NOT needed: each client error is a stand-in class with the module, qualname
and MRO of the real one (``test_stand_ins_match_the_real_classes`` checks them against the real
packages where those are installed). A few rows use the real classes, skipped when absent.

| the error (or something in its chain)                                  | outcome  |
|------------------------------------------------------------------------|----------|
| a read-side timeout / lost connection of a known client                | in doubt |
| a transport wrapper (requests ConnectionError, SDK APIConnectionError)  | in doubt |
|   ... whose own chain proves the request never left                    | released |
| a proof that the request never left (connect refused/timeout, DNS)     | released |
|   ... with a builtin TimeoutError below it                             | released |
|   ... with a known client's read-side error or EffectOutcomeUnknown    | in doubt |
|       below it (an earlier request)                                    |          |
| a listed builtin (TimeoutError, ...) with no proof above it            | in doubt |
| a class the user listed, anywhere                                      | in doubt |
| an exception group with any member in doubt                            | in doubt |
| not an Exception (cancellation, interrupt, exit), anywhere             | in doubt |
| an error raised after a client's retries (urllib3 MaxRetryError,       | in doubt |
|   tenacity RetryError, SDK APIConnectionError), anywhere, whatever      |          |
|   proof sits above or below it                                         |          |
|   ... whose record (urllib3's Retry.history, tenacity's attempt        | released |
|       number, the SDK's retries_taken) proves no earlier try was sent  |          |
| a proof or an answer whose record shows an earlier try that was sent   | in doubt |
| anything else                                                          | released |

The records are read from the errors' tracebacks: stand-in frames (``frame_in``: a function whose
module and name are those of the client code) hold them as locals, as the real code does.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import enum
import importlib
import importlib.util
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, cast

import pytest

from airlock_redis import DEFAULT_AMBIGUOUS_ERRORS, EffectOutcomeUnknown, Settlement
from airlock_redis.core import ambiguity
from airlock_redis.core.ambiguity import (
    DEFAULT_RULE,
    MAX_ERRORS,
    AmbiguityRule,
    AmbiguousErrors,
    explain,
    is_ambiguous,
)
from airlock_redis.core.outcome import settlement_for_error

Exc = type[BaseException]


def standin(module: str, qualname: str, *bases: Exc, **attrs: Any) -> Exc:
    """A class that looks, by name and MRO, like the real ``module.qualname``."""
    namespace = {"__module__": module, "__qualname__": qualname, **attrs}
    return cast(Exc, type(qualname.rsplit(".", 1)[-1], bases or (Exception,), namespace))


def chained(
    error: BaseException,
    *,
    cause: BaseException | None = None,
    context: BaseException | None = None,
) -> BaseException:
    """``error`` as Python leaves it after ``raise error from cause`` inside ``except context``."""
    if cause is not None:
        error.__cause__ = cause
        error.__suppress_context__ = True
    if context is not None:
        error.__context__ = context
    return error


# -- stand-ins ---------------------------------------------------------------------------------


class U:  # urllib3.exceptions
    M = "urllib3.exceptions"
    HTTPError = standin(M, "HTTPError")
    PoolError = standin(M, "PoolError", HTTPError)
    RequestError = standin(M, "RequestError", PoolError)
    TimeoutError = standin(M, "TimeoutError", HTTPError)
    ReadTimeoutError = standin(M, "ReadTimeoutError", TimeoutError, RequestError)
    ConnectTimeoutError = standin(M, "ConnectTimeoutError", TimeoutError)
    NewConnectionError = standin(M, "NewConnectionError", ConnectTimeoutError, HTTPError)
    NameResolutionError = standin(M, "NameResolutionError", NewConnectionError)
    MaxRetryError = standin(M, "MaxRetryError", RequestError)
    ProtocolError = standin(M, "ProtocolError", HTTPError)


class Retry:
    """urllib3.util.retry.Retry: ``history`` records the earlier tries (kept here, not on the error)."""

    def __init__(self, history: tuple[Any, ...] = ()) -> None:
        self.history = history


Retry.__module__, Retry.__qualname__ = "urllib3.util.retry", "Retry"


class RequestHistory(NamedTuple):  # urllib3.util.retry.RequestHistory: one earlier try
    method: str | None
    url: str | None
    error: Exception | None
    status: int | None
    redirect_location: str | None


def frame_in(module: str, function: str, params: str) -> Callable[..., Any]:
    """A function named ``function`` of the module ``module`` (its frame says so) that raises ``error``:
    the stand-in of the client code that raised, with ``params`` as its locals."""
    namespace: dict[str, Any] = {"__name__": module}
    source = f"def {function}({params}):\n    raise error\n"
    exec(compile(source, f"<stand-in {module}>", "exec"), namespace)
    return cast(Callable[..., Any], namespace[function])


def raised(function: Callable[..., Any], *args: Any) -> BaseException:
    """The error ``function(*args)`` raises, with its traceback."""
    try:
        function(*args)
    except BaseException as error:
        return error
    raise AssertionError(f"{function} did not raise")


URLLIB3_INCREMENT = frame_in("urllib3.util.retry", "increment", "self, error")
OPENAI_REQUEST = frame_in("openai._base_client", "request", "self, error, retries_taken")
ANTHROPIC_REQUEST = frame_in("anthropic._base_client", "request", "self, error, retries_taken")
OLD_OPENAI_REQUEST = frame_in("openai._base_client", "_request", "self, error, remaining_retries")

Earlier = Sequence["BaseException | int"]  # earlier tries: the error each ended with, or an answered status


def history(earlier: Earlier) -> tuple[RequestHistory, ...]:
    return tuple(
        RequestHistory("POST", "/charge", None, e, None)
        if isinstance(e, int)
        else RequestHistory("POST", "/charge", cast(Exception, e), None, None)
        for e in earlier
    )


def urllib3_gave_up(error: BaseException, earlier: Earlier | None = ()) -> BaseException:
    """``error`` as urllib3 raises it when its Retry gives up: from ``Retry.increment``, whose ``self``
    holds the history of the ``earlier`` tries. ``earlier=None``: made by hand, with no record."""
    return error if earlier is None else raised(URLLIB3_INCREMENT, Retry(history(earlier)), error)


class T:  # tenacity
    RetryError = standin("tenacity", "RetryError")


class Attempt:  # tenacity.Future: the outcome of the last attempt
    def __init__(self, attempt_number: Any) -> None:
        self.attempt_number = attempt_number


def tenacity_gave_up(attempts: Any, last: BaseException | None) -> BaseException:
    """``raise RetryError(last_attempt) from last_attempt.exception()``, the last attempt numbered
    ``attempts`` (``last=None``: that attempt returned a value)."""
    error = T.RetryError("RetryError")
    error.last_attempt = Attempt(attempts)  # type: ignore[attr-defined]
    return error if last is None else chained(error, cause=last)


class R:  # requests.exceptions
    M = "requests.exceptions"
    RequestException = standin(M, "RequestException", OSError)
    Timeout = standin(M, "Timeout", RequestException)
    ConnectionError = standin(M, "ConnectionError", RequestException)
    ReadTimeout = standin(M, "ReadTimeout", Timeout)
    ConnectTimeout = standin(M, "ConnectTimeout", ConnectionError, Timeout)
    ChunkedEncodingError = standin(M, "ChunkedEncodingError", RequestException)
    SSLError = standin(M, "SSLError", ConnectionError)
    HTTPError = standin(M, "HTTPError", RequestException)


def _http_core(module: str, *, httpx: bool) -> dict[str, Exc]:
    """httpx and httpcore: same names, httpx has a deeper base."""
    c: dict[str, Exc] = {}
    if httpx:
        c["HTTPError"] = standin(module, "HTTPError")
        c["RequestError"] = standin(module, "RequestError", c["HTTPError"])
        c["TransportError"] = standin(module, "TransportError", c["RequestError"])
        base: tuple[Exc, ...] = (c["TransportError"],)
    else:
        base = ()
    c["TimeoutException"] = standin(module, "TimeoutException", *base)
    c["NetworkError"] = standin(module, "NetworkError", *base)
    c["ProtocolError"] = standin(module, "ProtocolError", *base)
    for name in ("ReadTimeout", "WriteTimeout", "ConnectTimeout", "PoolTimeout"):
        c[name] = standin(module, name, c["TimeoutException"])
    for name in ("ReadError", "WriteError", "ConnectError"):
        c[name] = standin(module, name, c["NetworkError"])
    for name in ("RemoteProtocolError", "LocalProtocolError"):
        c[name] = standin(module, name, c["ProtocolError"])
    return c


HX = _http_core("httpx", httpx=True)  # httpx sets __module__ = "httpx" on what it exports
HC = _http_core("httpcore", httpx=False)


class A:  # aiohttp.client_exceptions
    M = "aiohttp.client_exceptions"
    ClientError = standin(M, "ClientError")
    ClientConnectionError = standin(M, "ClientConnectionError", ClientError)
    ClientOSError = standin(M, "ClientOSError", ClientConnectionError, OSError)
    ClientConnectorError = standin(M, "ClientConnectorError", ClientOSError)
    ClientConnectorDNSError = standin(M, "ClientConnectorDNSError", ClientConnectorError)
    ServerConnectionError = standin(M, "ServerConnectionError", ClientConnectionError)
    ServerTimeoutError = standin(M, "ServerTimeoutError", ServerConnectionError, asyncio.TimeoutError)
    ConnectionTimeoutError = standin(M, "ConnectionTimeoutError", ServerTimeoutError)
    SocketTimeoutError = standin(M, "SocketTimeoutError", ServerTimeoutError)
    ServerDisconnectedError = standin(M, "ServerDisconnectedError", ServerConnectionError)
    ClientPayloadError = standin(M, "ClientPayloadError", ClientError)
    ClientResponseError = standin(M, "ClientResponseError", ClientError)


class StatusCode(enum.Enum):
    OK = 0
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    UNAVAILABLE = 14


def _code(self: Any) -> Any:
    return self.status


def _code_raises(self: Any) -> Any:
    raise RuntimeError("channel closed")


class G:  # grpc
    RpcError = standin("grpc", "RpcError")
    Call = standin("grpc", "Call")  # not an exception in grpc; enough here
    InactiveRpcError = standin("grpc._channel", "_InactiveRpcError", RpcError, code=_code)
    AioRpcError = standin("grpc.aio._call", "AioRpcError", RpcError, code=_code)
    Broken = standin("grpc._channel", "_InactiveRpcError", RpcError, code=_code_raises)


def rpc(cls: Exc, status: Any) -> BaseException:
    error = cls("rpc failed")
    error.status = status  # type: ignore[attr-defined]
    return error


def _sdk(module: str) -> dict[str, Exc]:
    c: dict[str, Exc] = {"APIError": standin(module, "APIError")}
    c["APIConnectionError"] = standin(module, "APIConnectionError", c["APIError"])
    c["APITimeoutError"] = standin(module, "APITimeoutError", c["APIConnectionError"])
    c["APIStatusError"] = standin(module, "APIStatusError", c["APIError"])
    return c


OPENAI = _sdk("openai")  # the Stainless SDKs set __module__ to the package name
ANTHROPIC = _sdk("anthropic")


class B:  # botocore.exceptions (requests there is botocore's vendored copy)
    M = "botocore.exceptions"
    V = "botocore.vendored.requests.exceptions"
    VRequestException = standin(V, "RequestException", OSError)
    VTimeout = standin(V, "Timeout", VRequestException)
    VConnectionError = standin(V, "ConnectionError", VRequestException)
    VReadTimeout = standin(V, "ReadTimeout", VTimeout)
    VConnectTimeout = standin(V, "ConnectTimeout", VConnectionError, VTimeout)
    BotoCoreError = standin(M, "BotoCoreError")
    HTTPClientError = standin(M, "HTTPClientError", BotoCoreError)
    ConnectionError = standin(M, "ConnectionError", BotoCoreError)
    EndpointConnectionError = standin(M, "EndpointConnectionError", ConnectionError)
    ConnectionClosedError = standin(M, "ConnectionClosedError", HTTPClientError)
    ReadTimeoutError = standin(M, "ReadTimeoutError", HTTPClientError, VReadTimeout, U.ReadTimeoutError)
    ConnectTimeoutError = standin(M, "ConnectTimeoutError", ConnectionError, VConnectTimeout)
    NoCredentialsError = standin(M, "NoCredentialsError", BotoCoreError)


class MyError(Exception):
    """A user's own error, listed in ambiguous_errors."""


class GatewayError(Exception):
    """A tool's own wrapper: says nothing by itself."""


class SlowLink(TimeoutError):
    pass


# Three-level group shape of Python 3.10's exceptiongroup backport, without the backport.
BackportGroup = standin("exceptiongroup._exceptions", "ExceptionGroup", Exception)
NotAGroup = standin("mylib", "NotAGroup", Exception)


def backport_group(*members: BaseException) -> BaseException:
    group = BackportGroup("backport group")
    group.exceptions = members  # type: ignore[attr-defined]
    return group


def not_a_group(*members: BaseException) -> BaseException:
    error = NotAGroup("has .exceptions but is not a group")
    error.exceptions = members  # type: ignore[attr-defined]
    return error


# -- chains the real libraries build -----------------------------------------------------------


def requests_connect_refused(earlier: Earlier | None = ()) -> BaseException:
    """requests.get to a closed port: ConnectionError <- MaxRetryError <- NewConnectionError <- refused.
    The MaxRetryError comes from urllib3's Retry with the ``earlier`` tries in its history (requests'
    default adapter: none); see :func:`urllib3_gave_up`."""
    refused = ConnectionRefusedError(111, "Connection refused")
    new = chained(U.NewConnectionError("Failed to establish a new connection"), context=refused)
    new.__cause__ = refused
    retry = urllib3_gave_up(chained(U.MaxRetryError("Max retries exceeded"), cause=new, context=new), earlier)
    return chained(R.ConnectionError(retry), context=retry)


def requests_connect_timeout(earlier: Earlier | None = ()) -> BaseException:
    """requests.get(timeout=(0.1, 5)) to a blackhole: the connect timeout carries a socket.timeout."""
    low = TimeoutError("timed out")
    connect = chained(U.ConnectTimeoutError("Connection timed out"), cause=low, context=low)
    retry = chained(U.MaxRetryError("Max retries exceeded"), cause=connect, context=connect)
    retry = urllib3_gave_up(retry, earlier)
    return chained(R.ConnectTimeout(retry), context=retry)


def requests_connection_aborted() -> BaseException:
    """The server hung up after reading the request: ConnectionError <- ProtocolError <- reset."""
    reset = ConnectionResetError(104, "Connection reset by peer")
    protocol = chained(U.ProtocolError("Connection aborted.", reset), cause=reset, context=reset)
    return chained(R.ConnectionError(protocol), context=protocol)


def httpx_connect_error() -> BaseException:
    low = ConnectionRefusedError(111, "Connection refused")
    core = chained(HC["ConnectError"]("All connection attempts failed"), cause=low, context=low)
    return chained(HX["ConnectError"]("All connection attempts failed"), cause=core, context=core)


def httpx_connect_timeout() -> BaseException:
    low = TimeoutError()
    core = chained(HC["ConnectTimeout"](""), cause=low, context=low)
    return chained(HX["ConnectTimeout"](""), cause=core, context=core)


def httpx_read_error() -> BaseException:
    low = ConnectionResetError(104, "Connection reset by peer")
    core = chained(HC["ReadError"](low), cause=low, context=low)
    return chained(HX["ReadError"](low), cause=core, context=core)


def sdk_error(
    sdk: dict[str, Exc], name: str, below: BaseException | None, retries_taken: int | None = 0
) -> BaseException:
    """openai/anthropic: ``raise APIConnectionError(request=...) from err`` inside ``except``, in the SDK's
    request loop after ``retries_taken`` retries (0: ``max_retries=0``; None: made by hand, no record)."""
    error = sdk[name]("Connection error.")
    if below is not None:
        error = chained(error, cause=below, context=below)
    if retries_taken is None:
        return error
    frame = OPENAI_REQUEST if error.__module__.startswith("openai") else ANTHROPIC_REQUEST
    return raised(frame, None, error, retries_taken)


def botocore_connect_timeout() -> BaseException:
    low = TimeoutError("timed out")
    connect = chained(U.ConnectTimeoutError("timed out"), cause=low, context=low)
    return chained(B.ConnectTimeoutError("Connect timeout on endpoint URL"), context=connect)


def aiohttp_connection_timeout() -> BaseException:
    """aiohttp>=3.10: ConnectionTimeoutError from the connector's asyncio timeout (itself a TimeoutError)."""
    cancelled = asyncio.CancelledError()
    timeout = chained(TimeoutError(), cause=cancelled, context=cancelled)
    return chained(A.ConnectionTimeoutError("Connection timeout to host"), cause=timeout, context=timeout)


def max_retry_with_reason(reason: BaseException, earlier: Earlier | None = ()) -> BaseException:
    """A MaxRetryError that only carries its reason as an attribute (no cause, no context)."""
    error = U.MaxRetryError("Max retries exceeded")
    error.reason = reason  # type: ignore[attr-defined]
    return urllib3_gave_up(error, earlier)


def as_raised_by(retry: object, error: BaseException) -> BaseException:
    """``error`` raised from a ``Retry.increment`` whose ``self`` is ``retry``, under a requests wrapper."""
    gave_up = raised(URLLIB3_INCREMENT, retry, chained(error, cause=U.NewConnectionError()))
    return chained(R.ConnectionError(), context=gave_up)


def history_cycle() -> BaseException:
    error = chained(U.MaxRetryError("Max retries exceeded"), cause=U.NewConnectionError())
    retry = Retry()
    retry.history = history([error])
    return raised(URLLIB3_INCREMENT, retry, error)


def requests_http_error(earlier: Earlier | None) -> BaseException:
    """``response.raise_for_status()``: the response urllib3 made after the ``earlier`` tries
    (``response.raw.retries``); None: a response urllib3 did not make (no ``raw``)."""
    raw = None if earlier is None else SimpleNamespace(retries=Retry(history(earlier)))
    error = R.HTTPError("500 Server Error")
    error.response = SimpleNamespace(status_code=500, raw=raw)  # type: ignore[attr-defined]
    return error


def long_chain(length: int, bottom: BaseException | None = None) -> BaseException:
    error: BaseException = bottom if bottom is not None else ValueError("bottom")
    for i in range(length - 1):
        error = chained(ValueError(i), context=error)
    return error


def cycle(bottom: BaseException | None) -> BaseException:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__context__ = b, a
    if bottom is not None:
        b.__cause__ = bottom
    return a


def self_cycle() -> BaseException:
    error = ValueError("me")
    error.__context__ = error
    return error


# Python 3.11+: the builtin groups; 3.10: the backport's shape (which exercises the duck typing).
_GROUP: Any = getattr(builtins, "ExceptionGroup", None)
_BASE_GROUP: Any = getattr(builtins, "BaseExceptionGroup", None)
BackportBaseGroup = standin("exceptiongroup._exceptions", "BaseExceptionGroup", BaseException)


def group(*members: BaseException) -> BaseException:
    if _GROUP is None:
        return backport_group(*members)
    return cast(BaseException, _GROUP("group", list(members)))


def base_group(*members: BaseException) -> BaseException:
    if _BASE_GROUP is None:
        error = BackportBaseGroup("backport base group")
        error.exceptions = members  # type: ignore[attr-defined]
        return error
    return cast(BaseException, _BASE_GROUP("group", list(members)))


# -- the table ---------------------------------------------------------------------------------

WITH_MINE = (*DEFAULT_AMBIGUOUS_ERRORS, MyError)
ONLY_MINE = (MyError,)
NO_CLIENTS = AmbiguityRule(known_clients=False)
SURFACE_ONLY = AmbiguityRule(follow_chains=False)
OLD = AmbiguityRule(known_clients=False, follow_chains=False)

Factory = Callable[[], BaseException]
ROWS: list[Any] = []


def row(name: str, factory: Factory, in_doubt: bool, rule: AmbiguousErrors = DEFAULT_RULE) -> None:
    ROWS.append(pytest.param(factory, in_doubt, rule, id=name))


# the spec's five, and what is not an Exception
for cls in DEFAULT_AMBIGUOUS_ERRORS:
    row(f"default:{cls.__name__}", cls, True)
row("subclass of a default: SlowLink(TimeoutError)", SlowLink, True)
row("socket.timeout", lambda: socket.timeout("timed out"), True)  # noqa: UP041 (the alias, on purpose)
row("asyncio.TimeoutError (a separate class on 3.10)", asyncio.TimeoutError, True)
OldAsyncioTimeout = standin("asyncio.exceptions", "TimeoutError")  # what 3.10's asyncio.TimeoutError is
OldFuturesTimeout = standin("concurrent.futures._base", "TimeoutError")
row("3.10's asyncio TimeoutError (stand-in)", OldAsyncioTimeout, True)
row("3.10's concurrent.futures TimeoutError (stand-in)", OldFuturesTimeout, True)
row("3.10's asyncio TimeoutError, TimeoutError not listed", OldAsyncioTimeout, False, (EffectOutcomeUnknown,))
for cls in (KeyboardInterrupt, SystemExit, asyncio.CancelledError, GeneratorExit):
    row(f"not an Exception: {cls.__name__}", cls, True)
for cls in (ValueError, RuntimeError, OSError, KeyError, GatewayError):
    row(f"ordinary: {cls.__name__}", cls, False)

# requests / urllib3
row("requests ReadTimeout (an OSError, not a TimeoutError)", lambda: R.ReadTimeout("read timed out"), True)
row("requests ChunkedEncodingError", lambda: R.ChunkedEncodingError("broken"), True)
row("urllib3 ProtocolError", lambda: U.ProtocolError("Connection aborted."), True)
row("urllib3 ReadTimeoutError", lambda: U.ReadTimeoutError("Read timed out."), True)
row("requests ConnectionError, bare: in doubt", lambda: R.ConnectionError("?"), True)
row("requests ConnectionError <- connection aborted", requests_connection_aborted, True)
row("requests ConnectionError <- NewConnectionError: released", requests_connect_refused, False)
row("requests ConnectTimeout <- TimeoutError below: released", requests_connect_timeout, False)
row("requests SSLError (a ConnectionError), bare", lambda: R.SSLError("bad handshake"), True)
row("requests HTTPError (an answer)", lambda: R.HTTPError("500"), False)
row("urllib3 NewConnectionError", lambda: U.NewConnectionError("refused"), False)
row("urllib3 NameResolutionError", lambda: U.NameResolutionError("no such host"), False)
row(
    "urllib3 ConnectTimeoutError <- TimeoutError",
    lambda: chained(U.ConnectTimeoutError(), cause=TimeoutError()),
    False,
)
row("MaxRetryError.reason = ProtocolError (no chain)", lambda: max_retry_with_reason(U.ProtocolError()), True)
row("MaxRetryError.reason = NewConnectionError", lambda: max_retry_with_reason(U.NewConnectionError()), False)
row(
    "requests ConnectionError <- MaxRetryError.reason = NewConnectionError",
    lambda: chained(R.ConnectionError(), context=max_retry_with_reason(U.NewConnectionError())),
    False,
)

# httpx / httpcore
for name in ("ReadTimeout", "WriteTimeout", "RemoteProtocolError", "ReadError", "WriteError"):
    row(f"httpx {name}", HX[name], True)
    row(f"httpcore {name}", HC[name], True)
for name in ("ConnectError", "ConnectTimeout", "PoolTimeout"):
    row(f"httpx {name}", HX[name], False)
    row(f"httpcore {name}", HC[name], False)
row("httpx LocalProtocolError (never sent, not listed)", HX["LocalProtocolError"], False)
row("httpx ConnectError <- httpcore <- refused", httpx_connect_error, False)
row("httpx ConnectTimeout <- httpcore <- TimeoutError: released", httpx_connect_timeout, False)
row("httpx ReadError <- httpcore <- reset", httpx_read_error, True)

# aiohttp
for name in ("ServerTimeoutError", "ServerDisconnectedError", "ClientPayloadError", "SocketTimeoutError"):
    row(f"aiohttp {name}", getattr(A, name), True)
row(
    "aiohttp ClientOSError (write failed on an open connection)",
    lambda: A.ClientOSError(32, "Broken pipe"),
    True,
)
row("aiohttp ClientConnectorError", lambda: A.ClientConnectorError(111, "refused"), False)
row("aiohttp ClientConnectorDNSError (a subclass)", lambda: A.ClientConnectorDNSError(-2, "no name"), False)
row(
    "aiohttp ConnectionTimeoutError (a TimeoutError!) <- TimeoutError <- Cancelled",
    aiohttp_connection_timeout,
    False,
)
row("aiohttp ClientResponseError (an answer)", A.ClientResponseError, False)

# grpc
row(
    "grpc _InactiveRpcError DEADLINE_EXCEEDED",
    lambda: rpc(G.InactiveRpcError, StatusCode.DEADLINE_EXCEEDED),
    True,
)
row("grpc _InactiveRpcError UNAVAILABLE", lambda: rpc(G.InactiveRpcError, StatusCode.UNAVAILABLE), True)
row("grpc.aio AioRpcError DEADLINE_EXCEEDED", lambda: rpc(G.AioRpcError, StatusCode.DEADLINE_EXCEEDED), True)
row("grpc status given as a string", lambda: rpc(G.InactiveRpcError, "UNAVAILABLE"), True)
row("grpc INVALID_ARGUMENT (an answer)", lambda: rpc(G.InactiveRpcError, StatusCode.INVALID_ARGUMENT), False)
row("grpc code() raises", lambda: G.Broken("x"), False)
row("grpc.RpcError without code()", lambda: G.RpcError("x"), False)
row("grpc code() returns None", lambda: rpc(G.AioRpcError, None), False)
row(
    "tool error from grpc DEADLINE_EXCEEDED",
    lambda: chained(GatewayError(), cause=rpc(G.AioRpcError, StatusCode.DEADLINE_EXCEEDED)),
    True,
)


# openai / anthropic
def sdk_rows(sdk_name: str, sdk: dict[str, Exc]) -> None:
    row(f"{sdk_name} APITimeoutError, bare", lambda: sdk_error(sdk, "APITimeoutError", None), True)
    row(
        f"{sdk_name} APIConnectionError, bare",
        lambda: sdk_error(sdk, "APIConnectionError", None),
        True,
    )
    row(
        f"{sdk_name} APIConnectionError <- httpx ConnectError: released",
        lambda: sdk_error(sdk, "APIConnectionError", httpx_connect_error()),
        False,
    )
    row(
        f"{sdk_name} APITimeoutError <- httpx ConnectTimeout: released",
        lambda: sdk_error(sdk, "APITimeoutError", httpx_connect_timeout()),
        False,
    )
    row(
        f"{sdk_name} APIConnectionError <- httpx ReadError",
        lambda: sdk_error(sdk, "APIConnectionError", httpx_read_error()),
        True,
    )
    row(
        f"{sdk_name} APIConnectionError <- something unknown",
        lambda: sdk_error(sdk, "APIConnectionError", RuntimeError("?")),
        True,
    )
    row(f"{sdk_name} APIStatusError (an answer)", lambda: sdk["APIStatusError"]("429"), False)
    row(
        f"{sdk_name} APIConnectionError <- httpx ConnectError, made by hand (no record of retries)",
        lambda: sdk_error(sdk, "APIConnectionError", httpx_connect_error(), None),
        True,
    )
    row(
        f"{sdk_name} APIConnectionError <- httpx ConnectError after 2 retries",
        lambda: sdk_error(sdk, "APIConnectionError", httpx_connect_error(), 2),
        True,
    )
    row(
        f"{sdk_name} APITimeoutError <- httpx ConnectTimeout after 1 retry",
        lambda: sdk_error(sdk, "APITimeoutError", httpx_connect_timeout(), 1),
        True,
    )
    row(f"{sdk_name} APIStatusError after 1 retry", lambda: sdk_error(sdk, "APIStatusError", None, 1), True)
    row(
        f"{sdk_name} APIStatusError at the first try",
        lambda: sdk_error(sdk, "APIStatusError", None, 0),
        False,
    )


for _sdk_name, _sdk_table in (("openai", OPENAI), ("anthropic", ANTHROPIC)):
    sdk_rows(_sdk_name, _sdk_table)

# botocore
row("botocore ReadTimeoutError", lambda: B.ReadTimeoutError("Read timeout"), True)
row("botocore ConnectionClosedError", lambda: B.ConnectionClosedError("closed"), True)
row("botocore ConnectTimeoutError <- urllib3 <- TimeoutError", botocore_connect_timeout, False)
row("botocore EndpointConnectionError", lambda: B.EndpointConnectionError("no endpoint"), False)
row("botocore NoCredentialsError", lambda: B.NoCredentialsError("none"), False)

# builtin proofs
row("ConnectionRefusedError", lambda: ConnectionRefusedError(111, "refused"), False)
row("socket.gaierror", lambda: socket.gaierror(-2, "Name or service not known"), False)
row("ssl.SSLCertVerificationError", lambda: ssl.SSLCertVerificationError("certificate verify failed"), False)

# cause and context chains
row("tool error from TimeoutError", lambda: chained(GatewayError("upstream"), cause=TimeoutError()), True)
row(
    "tool error while handling ConnectionResetError",
    lambda: chained(GatewayError(), context=ConnectionResetError()),
    True,
)
row("tool error from ValueError", lambda: chained(GatewayError(), cause=ValueError()), False)
row(
    "'from None' hides the context from tracebacks, not from the guard",
    lambda: chained(GatewayError(), context=R.ReadTimeout()),
    True,
)
row(
    "three deep: tool error <- tool error <- requests ReadTimeout",
    lambda: chained(GatewayError(), cause=chained(RuntimeError(), cause=R.ReadTimeout())),
    True,
)
row(
    "tool error from EffectOutcomeUnknown",
    lambda: chained(GatewayError(), cause=EffectOutcomeUnknown()),
    True,
)
row(
    "tool error from requests ConnectTimeout chain",
    lambda: chained(GatewayError(), cause=requests_connect_timeout()),
    False,
)
row(
    "tool error while handling a cancellation",
    lambda: chained(RuntimeError(), context=asyncio.CancelledError()),
    True,
)
row(
    "TimeoutError raised from httpx ConnectError: the outer timeout decides",
    lambda: chained(TimeoutError(), cause=httpx_connect_error()),
    True,
)
row(
    "httpx ConnectError while handling an earlier requests ReadTimeout (an earlier request)",
    lambda: chained(HX["ConnectError"](), context=R.ReadTimeout()),
    True,
)
row(
    "httpx ConnectError while handling EffectOutcomeUnknown",
    lambda: chained(HX["ConnectError"](), context=EffectOutcomeUnknown()),
    True,
)
row(
    "proof, then a requests ConnectionError without proof below it (an earlier request)",
    lambda: chained(U.NewConnectionError(), context=R.ConnectionError()),
    True,
)
row("cycle of ordinary errors", lambda: cycle(None), False)
row("cycle with a TimeoutError hanging off it", lambda: cycle(TimeoutError()), True)
row("an error that is its own context", self_cycle, False)
row("500 ordinary errors", lambda: long_chain(500), False)
row("500 errors with a TimeoutError at the bottom", lambda: long_chain(500, TimeoutError()), True)
row(
    "more than MAX_ERRORS errors: not inspected to the end, in doubt",
    lambda: long_chain(MAX_ERRORS + 5),
    True,
)
row(
    "a wrapper over 600 errors and then a proof: released",
    lambda: chained(R.ConnectionError(), context=long_chain(600, U.NewConnectionError())),
    False,
)

# exception groups
row("group of ValueError and TimeoutError", lambda: group(ValueError(), TimeoutError()), True)
row("group of ordinary errors", lambda: group(ValueError(), KeyError()), False)
row(
    "nested groups with an httpx ReadTimeout at the bottom",
    lambda: group(group(ValueError(), group(HX["ReadTimeout"]()))),
    True,
)
row("nested groups of ordinary errors", lambda: group(group(ValueError()), group(KeyError())), False)
row(
    "group of a proof (with a timeout below) and a ValueError",
    lambda: group(httpx_connect_timeout(), ValueError()),
    False,
)
row(
    "group of a proof and a requests ReadTimeout", lambda: group(httpx_connect_error(), R.ReadTimeout()), True
)
row("group member from a TimeoutError", lambda: group(chained(GatewayError(), cause=TimeoutError())), True)
row(
    "tool error from a group holding a TimeoutError",
    lambda: chained(GatewayError(), cause=group(TimeoutError())),
    True,
)
row("BaseExceptionGroup of KeyboardInterrupt", lambda: base_group(KeyboardInterrupt()), True)
row("backport-shaped group (3.10) holding a TimeoutError", lambda: backport_group(TimeoutError()), True)
row("backport-shaped group (3.10) of ordinary errors", lambda: backport_group(ValueError()), False)
row("backport-shaped group with a broken .exceptions", lambda: backport_group(cast(Any, 42)), False)
row("not a group, though it has .exceptions", lambda: not_a_group(TimeoutError()), False)

# after retries: the last try's error says nothing of the earlier tries (issue 22, scenario 2)
READ = U.ReadTimeoutError
row(
    "requests ConnectionError <- MaxRetryError made by hand (no record) <- NewConnectionError",
    lambda: requests_connect_refused(None),
    True,
)
row(
    "requests refused after an earlier read timeout (the Retry's history)",
    lambda: requests_connect_refused([READ("Read timed out.")]),
    True,
)
row(
    "requests refused after earlier tries that never connected",
    lambda: requests_connect_refused(
        [U.NewConnectionError(), U.ConnectTimeoutError(), U.NameResolutionError()]
    ),
    False,
)
row("requests refused after an earlier try answered 503", lambda: requests_connect_refused([503]), True)
row(
    "requests refused after an earlier connection aborted",
    lambda: requests_connect_refused([U.ProtocolError("Connection aborted.")]),
    True,
)
row(
    "requests refused after an earlier try that ended some other way",
    lambda: requests_connect_refused([ValueError("?")]),
    True,
)
row(
    "requests refused after an earlier connect proof the user listed as in doubt",
    lambda: chained(GatewayError(), context=requests_connect_refused([HX["ConnectError"]()])),
    True,
    (*DEFAULT_AMBIGUOUS_ERRORS, HX["ConnectError"]),
)
row(
    "proof above the retry: requests ConnectTimeout <- MaxRetryError after a read timeout",
    lambda: requests_connect_timeout([READ()]),
    True,
)
row(
    "proof above the retry, from the tool: ConnectionRefusedError from a chain after a read timeout",
    lambda: chained(ConnectionRefusedError(), cause=requests_connect_refused([READ()])),
    True,
)
row(
    "proof above the retry, from the tool, no earlier try",
    lambda: chained(ConnectionRefusedError(), cause=requests_connect_refused()),
    False,
)
row(
    "MaxRetryError.reason = NewConnectionError, after a read timeout",
    lambda: max_retry_with_reason(U.NewConnectionError(), [READ()]),
    True,
)
row("MaxRetryError made by hand, alone", lambda: U.MaxRetryError("Max retries exceeded"), True)
row(
    "a proof urllib3's Retry re-raised (connect=False) after a read timeout",
    lambda: raised(
        URLLIB3_INCREMENT,
        Retry(history([READ()])),
        chained(U.NewConnectionError(), cause=ConnectionRefusedError()),
    ),
    True,
)
row(
    "a proof urllib3's Retry re-raised (connect=False) at the first try",
    lambda: raised(
        URLLIB3_INCREMENT, Retry(), chained(U.NewConnectionError(), cause=ConnectionRefusedError())
    ),
    False,
)
row(
    "the Retry.increment frame holds no Retry",
    lambda: as_raised_by(object(), U.MaxRetryError()),
    True,
)
row(
    "the Retry's history is not a tuple",
    lambda: as_raised_by(Retry(cast(Any, list(history([U.NewConnectionError()])))), U.MaxRetryError()),
    True,
)
row("the history holds the MaxRetryError itself (a cycle through the record)", history_cycle, True)
row(
    "group: a clean retried chain and one after a read timeout",
    lambda: group(requests_connect_refused(), requests_connect_refused([READ()])),
    True,
)
row(
    "group of two clean retried chains",
    lambda: group(requests_connect_refused(), requests_connect_refused()),
    False,
)
row(
    "cycle holding a chain retried after a read timeout",
    lambda: cycle(requests_connect_refused([READ()])),
    True,
)
row("cycle holding a clean retried chain", lambda: cycle(requests_connect_refused()), False)
row("requests HTTPError after an earlier read timeout", lambda: requests_http_error([READ()]), True)
row(
    "requests HTTPError after an earlier refusal",
    lambda: requests_http_error([U.NewConnectionError()]),
    False,
)
row("requests HTTPError at the first try", lambda: requests_http_error([]), False)
row("requests HTTPError, a response urllib3 did not make", lambda: requests_http_error(None), False)
row(
    "tenacity RetryError, one attempt, refused",
    lambda: tenacity_gave_up(1, requests_connect_refused()),
    False,
)
row(
    "tenacity RetryError after three attempts, the last refused",
    lambda: tenacity_gave_up(3, requests_connect_refused()),
    True,
)
row("tenacity RetryError on an attempt that returned", lambda: tenacity_gave_up(1, None), True)
row(
    "tenacity RetryError without an attempt number",
    lambda: tenacity_gave_up(None, requests_connect_refused()),
    True,
)
row(
    "wrapper order: tenacity RetryError (1) <- requests chain retried after a read timeout",
    lambda: tenacity_gave_up(1, requests_connect_refused([READ()])),
    True,
)
row(
    "wrapper order: tool error <- tenacity RetryError (3) <- clean requests chain",
    lambda: chained(GatewayError(), cause=tenacity_gave_up(3, requests_connect_refused())),
    True,
)
row(
    "an older SDK: its request frame has no retries_taken",
    lambda: raised(
        OLD_OPENAI_REQUEST, None, sdk_error(OPENAI, "APIConnectionError", httpx_connect_error(), None), 0
    ),
    True,
)

# the user's classes: override, add to the default, client recognition off
row("added: MyError", MyError, True, WITH_MINE)
row("added: TimeoutError still in doubt", TimeoutError, True, WITH_MINE)
row("added via DEFAULT_RULE.adding", MyError, True, DEFAULT_RULE.adding(MyError))
row(
    "added: MyError deep in the chain",
    lambda: chained(GatewayError(), cause=chained(ValueError(), context=MyError())),
    True,
    WITH_MINE,
)
row(
    "added: MyError below a proof still counts",
    lambda: chained(HX["ConnectError"](), context=MyError()),
    True,
    WITH_MINE,
)
row("added: MyError in a group", lambda: group(ValueError(), MyError()), True, WITH_MINE)
row("replaced: MyError", MyError, True, ONLY_MINE)
row("replaced: a TimeoutError is released", TimeoutError, False, ONLY_MINE)
row("replaced: clients still recognised", R.ReadTimeout, True, ONLY_MINE)
row("replaced: KeyboardInterrupt still in doubt", KeyboardInterrupt, True, ONLY_MINE)
row(
    "listed proof class: the user's list wins",
    HX["ConnectError"],
    True,
    (*DEFAULT_AMBIGUOUS_ERRORS, HX["ConnectError"]),
)
row(
    "listed ConnectionRefusedError: the user's list wins",
    ConnectionRefusedError,
    True,
    (ConnectionRefusedError,),
)
row("clients off: requests ReadTimeout released", R.ReadTimeout, False, NO_CLIENTS)
row(
    "clients off: grpc DEADLINE_EXCEEDED released",
    lambda: rpc(G.InactiveRpcError, StatusCode.DEADLINE_EXCEEDED),
    False,
    NO_CLIENTS,
)
row(
    "clients off: no proofs, the TimeoutError below a connect timeout counts",
    httpx_connect_timeout,
    True,
    NO_CLIENTS,
)
row(
    "clients off: aiohttp ConnectionTimeoutError is a TimeoutError",
    A.ConnectionTimeoutError,
    True,
    NO_CLIENTS,
)
row(
    "clients off: chains still followed",
    lambda: chained(GatewayError(), cause=TimeoutError()),
    True,
    NO_CLIENTS,
)
row(
    "clients off, only mine",
    lambda: chained(GatewayError(), cause=MyError()),
    True,
    AmbiguityRule(ONLY_MINE, known_clients=False),
)
row(
    "surface only: tool error from TimeoutError released",
    lambda: chained(GatewayError(), cause=TimeoutError()),
    False,
    SURFACE_ONLY,
)
row("surface only: a wrapper cannot see its proof", requests_connect_refused, True, SURFACE_ONLY)
row("surface only: requests ReadTimeout", R.ReadTimeout, True, SURFACE_ONLY)
row("surface only: a group is not opened", lambda: group(TimeoutError()), False, SURFACE_ONLY)
row(
    "surface only: a MaxRetryError after a read timeout",
    lambda: max_retry_with_reason(U.NewConnectionError(), [READ()]),
    True,
    SURFACE_ONLY,
)
row("clients off: no retry record is read", lambda: requests_connect_refused([READ()]), False, NO_CLIENTS)


@pytest.mark.parametrize(("factory", "in_doubt", "rule"), ROWS)
def test_the_table(factory: Factory, in_doubt: bool, rule: AmbiguousErrors) -> None:
    error = factory()
    assert is_ambiguous(error, rule) is in_doubt
    assert settlement_for_error(error, rule) is (Settlement.UNKNOWN if in_doubt else Settlement.RELEASE)
    line = explain(error, rule)
    assert "\n" not in line
    assert line.startswith("in doubt" if in_doubt else "released"), line


# -- real classes, where installed ---------------------------------------------------------------


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def real(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def needs(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not installed(package), reason=f"{package} is not installed")


def requests_default_retry() -> Any:
    """What requests' HTTPAdapter retries with when it is given nothing: ``Retry(0, read=False)``."""
    return real("requests.adapters.HTTPAdapter")().max_retries


def real_retry_gives_up(retry: Any, *tries: BaseException, method: str = "POST") -> BaseException:
    """Each try's error handed to urllib3's own ``Retry.increment``, as ``urlopen`` does (inside the
    ``except`` that caught it), until the Retry gives up: what it raises then."""
    for error in tries:
        try:
            raise error
        except BaseException as handled:
            try:
                retry = retry.increment(method, "/charge", error=handled, _stacktrace=handled.__traceback__)
            except BaseException as gave_up:
                return gave_up
    raise AssertionError(f"{retry!r} did not give up")


def real_refused() -> BaseException:
    refused = ConnectionRefusedError(111, "Connection refused")
    return chained(
        real("urllib3.exceptions.NewConnectionError")(None, "refused"), cause=refused, context=refused
    )


def real_read_timeout() -> BaseException:
    low = TimeoutError("timed out")
    return chained(real("urllib3.exceptions.ReadTimeoutError")(None, "/", "Read timed out."), context=low)


def as_requests_raises(error: BaseException) -> BaseException:
    """requests' HTTPAdapter.send: a MaxRetryError (or a re-raised error) becomes a ConnectionError."""
    return chained(real("requests.exceptions.ConnectionError")(error), context=error)


def _real_requests_connect_timeout() -> BaseException:
    low = TimeoutError("timed out")
    connect = chained(
        real("urllib3.exceptions.ConnectTimeoutError")(None, "timed out"), cause=low, context=low
    )
    retry = real_retry_gives_up(requests_default_retry(), connect)
    return chained(real("requests.exceptions.ConnectTimeout")(retry), context=retry)


def _real_requests_refused() -> BaseException:
    return as_requests_raises(real_retry_gives_up(requests_default_retry(), real_refused()))


def _real_urllib3(*tries: str, method: str = "POST", **retry: Any) -> Callable[[], BaseException]:
    """``Retry(**retry)`` fed the ``tries`` ("read": a read timeout, "refused"), as requests sees it."""

    def make() -> BaseException:
        errors = [real_read_timeout() if t == "read" else real_refused() for t in tries]
        policy = real("urllib3.util.retry.Retry")(**retry) if retry else requests_default_retry()
        return as_requests_raises(real_retry_gives_up(policy, *errors, method=method))

    return make


def _real_tenacity(attempts: int, *, returns: bool = False) -> Callable[[], BaseException]:
    """A real tenacity ``Retrying`` that gave up after ``attempts`` attempts, each refused (requests'
    default adapter: a record that proves that attempt never left), or each returning a value."""

    def make() -> BaseException:
        tenacity = importlib.import_module("tenacity")

        def attempt() -> int:
            if returns:
                return 0
            raise _real_requests_refused()

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts), retry=tenacity.retry_if_result(lambda _: returns)
        )
        if not returns:
            retrying = retrying.copy(retry=tenacity.retry_if_exception_type(OSError))
        return raised(retrying, attempt)

    return make


REAL_ROWS = [
    pytest.param(
        lambda: real("requests.exceptions.ReadTimeout")("x"),
        True,
        id="requests ReadTimeout",
        marks=needs("requests"),
    ),
    pytest.param(
        lambda: real("requests.exceptions.ChunkedEncodingError")("x"),
        True,
        id="requests ChunkedEncodingError",
        marks=needs("requests"),
    ),
    pytest.param(
        lambda: real("requests.exceptions.ConnectionError")("x"),
        True,
        id="requests ConnectionError bare",
        marks=needs("requests"),
    ),
    pytest.param(
        _real_requests_connect_timeout, False, id="requests ConnectTimeout chain", marks=needs("requests")
    ),
    pytest.param(_real_requests_refused, False, id="requests refused chain", marks=needs("requests")),
    # urllib3's own Retry, as requests' HTTPAdapter(max_retries=...) uses it
    pytest.param(
        _real_urllib3("refused"), False, id="default adapter: refused, no retries", marks=needs("requests")
    ),
    pytest.param(
        _real_urllib3("read", "refused", "refused", total=2, allowed_methods=None),
        True,
        id="Retry(total=2, allowed_methods=None): a read timeout, then refused twice",
        marks=needs("requests"),
    ),
    pytest.param(
        _real_urllib3("read", "refused", "refused", method="PUT", total=2),
        True,
        id="Retry(total=2), PUT: a read timeout, then refused twice",
        marks=needs("requests"),
    ),
    pytest.param(
        _real_urllib3("read", method="POST", total=2),
        True,
        id="Retry(total=2), POST: the read timeout is not retried, raised as it is",
        marks=needs("requests"),
    ),
    pytest.param(
        _real_urllib3("refused", "refused", "refused", total=2, allowed_methods=None),
        False,
        id="Retry(total=2): refused three times (no try left)",
        marks=needs("requests"),
    ),
    pytest.param(
        _real_urllib3("read", "refused", total=2, connect=False, allowed_methods=None),
        True,
        id="Retry(connect=False): a read timeout, then refused, re-raised by Retry.increment",
        marks=needs("requests"),
    ),
    pytest.param(
        _real_urllib3("refused", total=2, connect=False),
        False,
        id="Retry(connect=False): refused at once, re-raised by Retry.increment",
        marks=needs("requests"),
    ),
    pytest.param(
        lambda: as_requests_raises(real("urllib3.exceptions.MaxRetryError")(None, "/", real_refused())),
        True,
        id="a MaxRetryError made by hand: no record of the earlier tries",
        marks=needs("requests"),
    ),
    pytest.param(
        _real_tenacity(1), False, id="tenacity gave up after one attempt, refused", marks=needs("tenacity")
    ),
    pytest.param(
        _real_tenacity(3), True, id="tenacity gave up after three attempts", marks=needs("tenacity")
    ),
    pytest.param(
        _real_tenacity(1, returns=True),
        True,
        id="tenacity gave up on an attempt that returned",
        marks=needs("tenacity"),
    ),
    pytest.param(
        lambda: real("urllib3.exceptions.ReadTimeoutError")(None, "/", "x"),
        True,
        id="urllib3 ReadTimeoutError",
        marks=needs("urllib3"),
    ),
    pytest.param(
        lambda: real("urllib3.exceptions.ProtocolError")("x"),
        True,
        id="urllib3 ProtocolError",
        marks=needs("urllib3"),
    ),
    pytest.param(lambda: real("httpx.ReadTimeout")("x"), True, id="httpx ReadTimeout", marks=needs("httpx")),
    pytest.param(
        lambda: real("httpx.RemoteProtocolError")("x"),
        True,
        id="httpx RemoteProtocolError",
        marks=needs("httpx"),
    ),
    pytest.param(lambda: real("httpx.WriteError")("x"), True, id="httpx WriteError", marks=needs("httpx")),
    pytest.param(
        lambda: real("httpx.ConnectError")("x"), False, id="httpx ConnectError", marks=needs("httpx")
    ),
    pytest.param(
        lambda: chained(real("httpx.ConnectTimeout")("x"), cause=TimeoutError()),
        False,
        id="httpx ConnectTimeout",
        marks=needs("httpx"),
    ),
    pytest.param(lambda: real("httpx.PoolTimeout")("x"), False, id="httpx PoolTimeout", marks=needs("httpx")),
    pytest.param(
        lambda: real("aiohttp.ServerTimeoutError")("x"),
        True,
        id="aiohttp ServerTimeoutError",
        marks=needs("aiohttp"),
    ),
    pytest.param(
        lambda: real("aiohttp.ServerDisconnectedError")("server gone"),
        True,
        id="aiohttp ServerDisconnectedError",
        marks=needs("aiohttp"),
    ),
    pytest.param(
        lambda: real("aiohttp.ClientPayloadError")("x"),
        True,
        id="aiohttp ClientPayloadError",
        marks=needs("aiohttp"),
    ),
    pytest.param(
        lambda: real("aiohttp.ConnectionTimeoutError")("x"),
        False,
        id="aiohttp ConnectionTimeoutError",
        marks=needs("aiohttp"),
    ),
]


@pytest.mark.parametrize(("factory", "in_doubt"), REAL_ROWS)
def test_real_client_classes(factory: Factory, in_doubt: bool) -> None:
    assert is_ambiguous(factory()) is in_doubt


STAND_INS = [
    (R.ReadTimeout, "requests.exceptions.ReadTimeout"),
    (R.ConnectTimeout, "requests.exceptions.ConnectTimeout"),
    (R.ChunkedEncodingError, "requests.exceptions.ChunkedEncodingError"),
    (R.SSLError, "requests.exceptions.SSLError"),
    (U.ReadTimeoutError, "urllib3.exceptions.ReadTimeoutError"),
    (U.NameResolutionError, "urllib3.exceptions.NameResolutionError"),
    (U.MaxRetryError, "urllib3.exceptions.MaxRetryError"),
    (U.ProtocolError, "urllib3.exceptions.ProtocolError"),
    *((HX[n], f"httpx.{n}") for n in HX),
    *((HC[n], f"httpcore.{n}") for n in HC),
    *((getattr(A, n), f"aiohttp.{n}") for n in vars(A) if not n.startswith("_") and n != "M"),
]


@pytest.mark.parametrize(("stand_in", "dotted"), STAND_INS, ids=[d for _, d in STAND_INS])
def test_stand_ins_match_the_real_classes(stand_in: Exc, dotted: str) -> None:
    """Each stand-in has the defining module, qualname and MRO of the installed real class."""
    package = dotted.split(".", 1)[0]
    if not installed(package):
        pytest.skip(f"{package} is not installed")

    def names(cls: type) -> list[str]:
        return [f"{k.__module__}.{k.__qualname__}" for k in cls.__mro__]

    assert names(stand_in) == names(real(dotted))


# -- the API -----------------------------------------------------------------------------------


def test_the_default_list_is_the_spec_five_and_outcome_still_exports_it() -> None:
    from airlock_redis.core import outcome

    assert outcome.DEFAULT_AMBIGUOUS_ERRORS is ambiguity.DEFAULT_AMBIGUOUS_ERRORS is DEFAULT_AMBIGUOUS_ERRORS
    assert AmbiguityRule(DEFAULT_AMBIGUOUS_ERRORS, known_clients=True, follow_chains=True) == DEFAULT_RULE


def test_a_rule_is_frozen_hashable_and_built_from_any_sequence() -> None:
    rule = AmbiguityRule([TimeoutError, MyError])  # type: ignore[arg-type]
    assert rule.classes == (TimeoutError, MyError)
    assert hash(rule) == hash(AmbiguityRule((TimeoutError, MyError)))
    with pytest.raises(AttributeError):
        rule.known_clients = False  # type: ignore[misc]
    assert AmbiguityRule.of(rule) is rule
    assert AmbiguityRule.of([MyError]) == AmbiguityRule((MyError,))
    assert AmbiguityRule.of((MyError,)) is AmbiguityRule.of((MyError,))  # a tuple's rule is cached
    assert DEFAULT_RULE.adding(MyError, TimeoutError).classes == WITH_MINE


@pytest.mark.parametrize(
    "bad",
    [("TimeoutError",), "TimeoutError", MyError, (MyError, 3), [int], ([],)],
    ids=repr,
)
def test_a_rule_takes_exception_classes_only(bad: Any) -> None:
    with pytest.raises(TypeError, match="exception classes"):
        AmbiguityRule.of(bad)
    with pytest.raises(TypeError, match="exception classes"):
        is_ambiguous(ValueError(), bad)


def test_the_old_behaviour_is_a_rule_away() -> None:
    """known_clients=False, follow_chains=False: the isinstance test the guard used to make."""
    errors = [factory() for factory, _, _ in (p.values for p in ROWS)]
    for error in errors:
        old = isinstance(error, DEFAULT_AMBIGUOUS_ERRORS) or not isinstance(error, Exception)
        assert is_ambiguous(error, OLD) is old, explain(error, OLD)


def test_the_cheap_cases_do_not_walk_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    def walked(*args: Any) -> Any:
        raise AssertionError("walked the chain")

    monkeypatch.setattr(ambiguity, "_analyse", walked)
    assert is_ambiguous(TimeoutError())
    assert is_ambiguous(KeyboardInterrupt())
    assert is_ambiguous(MyError(), (MyError,))
    assert is_ambiguous(chained(MyError(), cause=ValueError()), WITH_MINE)
    # a lone error (nothing linked to it) is classified without a walk
    assert not is_ambiguous(ValueError())
    assert is_ambiguous(R.ReadTimeout())
    assert is_ambiguous(R.ConnectionError())
    assert not is_ambiguous(HX["ConnectError"]())
    # a lone error raised after retries: its record is read, still without a walk
    assert is_ambiguous(U.MaxRetryError("made by hand"))
    assert is_ambiguous(tenacity_gave_up(2, None))
    assert not is_ambiguous(raised(URLLIB3_INCREMENT, Retry(), U.NewConnectionError()))
    assert is_ambiguous(raised(URLLIB3_INCREMENT, Retry(history([READ()])), U.NewConnectionError()))


def test_a_retry_record_too_long_to_read_is_in_doubt(monkeypatch: pytest.MonkeyPatch) -> None:
    clean = requests_connect_refused()  # its MaxRetryError's traceback: 2 entries
    assert not is_ambiguous(clean)
    monkeypatch.setattr(ambiguity, "MAX_FRAMES", 1)
    assert is_ambiguous(clean)
    assert "too many traceback entries" in explain(clean)
    proof = raised(URLLIB3_INCREMENT, Retry(), U.NewConnectionError())
    assert is_ambiguous(proof)  # the lone proof too: its traceback could not be read to the end
    monkeypatch.setattr(ambiguity, "MAX_FRAMES", 2)
    long_history = requests_connect_refused([U.NewConnectionError(), U.NewConnectionError()])
    assert is_ambiguous(long_history)  # the history's entries count against the same budget


def test_a_retry_record_that_raises_when_read_is_in_doubt() -> None:
    class Unreadable(Retry):
        @property
        def history(self) -> Any:
            raise RuntimeError("boom")

        @history.setter
        def history(self, value: Any) -> None:
            pass

    class NoAttempt:
        @property
        def attempt_number(self) -> int:
            raise RuntimeError("boom")

    assert is_ambiguous(as_raised_by(Unreadable(), U.MaxRetryError()))
    stuck = tenacity_gave_up(1, requests_connect_refused())
    stuck.last_attempt = NoAttempt()  # type: ignore[attr-defined]
    assert is_ambiguous(stuck)
    answer = requests_http_error([])
    answer.response = SimpleNamespace(raw=SimpleNamespace(retries=Unreadable()))  # type: ignore[attr-defined]
    assert is_ambiguous(answer)

    class NoRaw:
        @property
        def raw(self) -> Any:
            raise RuntimeError("boom")

    answer.response = NoRaw()  # type: ignore[attr-defined]
    assert is_ambiguous(answer)

    class BrokenEntry:
        @property
        def error(self) -> Any:
            raise RuntimeError("boom")

    assert is_ambiguous(as_raised_by(Retry((BrokenEntry(),)), U.MaxRetryError()))


def test_the_retry_records_are_read_from_frames_named_by_module_and_function() -> None:
    """A frame of another module, or another function of urllib3's, is not urllib3's record."""
    elsewhere = frame_in("mylib.retry", "increment", "self, error")
    other = frame_in("urllib3.util.retry", "sleep", "self, error")
    for frame in (elsewhere, other):
        error = raised(frame, Retry(), chained(U.MaxRetryError(), cause=U.NewConnectionError()))
        assert is_ambiguous(error), "no record: in doubt"
        proof = raised(frame, Retry(history([READ()])), U.NewConnectionError())
        assert not is_ambiguous(proof), "a record that is not urllib3's says nothing"
    not_a_count = raised(
        OPENAI_REQUEST, None, chained(OPENAI["APIConnectionError"](), cause=httpx_connect_error()), "0"
    )
    assert is_ambiguous(not_a_count), "retries_taken that is not an int: no record"


@pytest.mark.parametrize(
    ("factory", "rule", "expected"),
    [
        (
            lambda: chained(GatewayError(), cause=TimeoutError()),
            DEFAULT_RULE,
            "in doubt: builtins.TimeoutError at error.__cause__: its class is listed in ambiguous_errors,"
            " and no error above it proves the request never left",
        ),
        (
            requests_connect_refused,
            DEFAULT_RULE,
            "released: urllib3.exceptions.NewConnectionError at error.__context__.__cause__"
            " proves the request never left; nothing else leaves the effect in doubt",
        ),
        (
            lambda: group(ValueError(), HX["ReadTimeout"]()),
            DEFAULT_RULE,
            "in doubt: httpx.ReadTimeout at error.exceptions[1]: a known client's read-side timeout or lost"
            " connection: the request was sent",
        ),
        (
            R.ConnectionError,
            DEFAULT_RULE,
            "in doubt: requests.exceptions.ConnectionError at error: a client's connection failure,"
            " and nothing in its chain proves it never left",
        ),
        (lambda: chained(GatewayError(), cause=ValueError()), DEFAULT_RULE, "released: none of the 2 errors"),
        (
            lambda: rpc(G.AioRpcError, StatusCode.UNAVAILABLE),
            DEFAULT_RULE,
            "in doubt: grpc.aio._call.AioRpcError at error: a gRPC call that ended UNAVAILABLE",
        ),
        (lambda: long_chain(MAX_ERRORS + 5), DEFAULT_RULE, f"in doubt: more than {MAX_ERRORS} errors"),
        (
            lambda: long_chain(20, TimeoutError()),
            DEFAULT_RULE,
            "in doubt: builtins.TimeoutError at error.__context__.__context__"
            " ... .__context__.__context__.__context__ (depth 19): its class",
        ),
        (
            KeyboardInterrupt,
            DEFAULT_RULE,
            "in doubt: builtins.KeyboardInterrupt at error: not an Exception",
        ),
        (
            lambda: chained(GatewayError(), cause=MyError()),
            WITH_MINE,
            "in doubt: tests.test_ambiguity.MyError at error.__cause__: its class is listed",
        ),
        (
            lambda: requests_connect_refused([READ()]),
            DEFAULT_RULE,
            "in doubt: urllib3.exceptions.MaxRetryError at error.__context__: urllib3 retried after an"
            " earlier try that ended urllib3.exceptions.ReadTimeoutError: that request may have been sent",
        ),
        (
            lambda: requests_connect_refused(None),
            DEFAULT_RULE,
            "in doubt: urllib3.exceptions.MaxRetryError at error.__context__: raised when a client's retries"
            " gave up, and no record of its earlier tries can be read",
        ),
        (
            lambda: tenacity_gave_up(3, requests_connect_refused()),
            DEFAULT_RULE,
            "in doubt: tenacity.RetryError at error: tenacity gave up after 3 attempts",
        ),
    ],
)
def test_explain_names_the_deciding_error_and_why(
    factory: Factory, rule: AmbiguousErrors, expected: str
) -> None:
    assert explain(factory(), rule).startswith(expected)


def test_a_never_left_proof_closer_to_the_surface_beats_the_timeout_below_it() -> None:
    error = requests_connect_timeout()
    deep = error.__context__.__cause__.__cause__  # type: ignore[union-attr]
    assert type(deep) is TimeoutError
    assert not is_ambiguous(error)
    assert "urllib3.exceptions.ConnectTimeoutError" not in explain(error)  # requests' proof is outermost
    assert explain(error).startswith("released: requests.exceptions.ConnectTimeout at error ")


def test_a_chain_deeper_than_the_recursion_limit_is_walked_without_recursion() -> None:
    error = long_chain(MAX_ERRORS - 1, TimeoutError())
    assert is_ambiguous(error)
    assert not is_ambiguous(long_chain(MAX_ERRORS - 1))


def test_a_misbehaving_group_or_code_does_not_break_the_decision() -> None:
    class Exploding(Exception):
        @property
        def exceptions(self) -> Any:
            raise RuntimeError("boom")

    Exploding.__name__ = "ExplodingExceptionGroup"
    assert is_ambiguous(chained(Exploding(), cause=TimeoutError()))
    assert not is_ambiguous(Exploding())


# -- purity --------------------------------------------------------------------------------------

CLIENTS = (
    "requests",
    "httpx",
    "httpcore",
    "aiohttp",
    "grpc",
    "openai",
    "anthropic",
    "botocore",
    "urllib3",
    "exceptiongroup",
)


# the modules the rule is split into: each imports only the standard library and these
CORE_NEIGHBOURS = ("errors", "client_errors", "retry_records")


@pytest.mark.parametrize("module", ["ambiguity", "client_errors", "retry_records"])
def test_the_module_imports_only_the_standard_library_and_the_core(module: str) -> None:
    source = (Path(ambiguity.__file__).parent / f"{module}.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in sys.stdlib_module_names, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                assert (node.module or "").split(".")[0] in sys.stdlib_module_names, node.module
            else:
                assert node.level == 1 and node.module in CORE_NEIGHBOURS, node.module
    for name in ("__import__", "import_module"):
        assert name not in source


def test_deciding_imports_no_client_library_even_when_installed() -> None:
    script = (
        "import sys\n"
        "from airlock_redis.core.ambiguity import explain, is_ambiguous\n"
        "e = ValueError(); e.__cause__ = TimeoutError()\n"
        "assert is_ambiguous(e) and explain(e)\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {CLIENTS!r})\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""
