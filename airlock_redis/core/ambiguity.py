"""Whether a tool's error leaves the tool's effect in doubt ("ambiguous"). Pure: no I/O, no imports.

A tool that raised may still have taken effect: the request went out and only its answer was lost.
The guard records such a call ``unknown`` (a retry of an irreversible tool is refused); any other
error releases the record (the call may run again). This module makes that call.

What it looks at
    The raised error, and everything reachable from it: ``__cause__``, ``__context__``, the members
    of exception groups (recursively; on Python 3.10 groups are recognised by shape, without
    importing the ``exceptiongroup`` backport), and the ``reason`` of a urllib3 ``MaxRetryError``.
    Cycles are cut; more than :data:`MAX_ERRORS` errors and the call is treated as in doubt. For an
    error that a client raised after retrying on its own, also the client's record of its earlier
    tries (below, "After retries").

How each error is classified (the first matching line wins)
    1. ``strong``: an instance of a class listed in ``ambiguous_errors`` other than the four builtin
       socket-level ones (so every class a user adds, and :class:`EffectOutcomeUnknown`).
    2. With client recognition on, the most specific class of its MRO found in the name tables below
       (matched by ``module.qualname`` of the module that DEFINES the class, so no client library is
       ever imported): a read-side timeout or lost connection is ``strong``; a proof that the request
       never left is ``not-sent``; a transport wrapper (requests ``ConnectionError``, the OpenAI and
       Anthropic SDKs' ``APIConnectionError`` / ``APITimeoutError``) is ``wrapper``. A gRPC error
       whose ``code()`` is ``DEADLINE_EXCEEDED`` or ``UNAVAILABLE`` is ``strong``.
    3. ``weak``: an instance of one of the four builtin socket-level classes of the list
       (TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError; with client
       recognition on, a listed TimeoutError also covers asyncio's and concurrent.futures' own
       TimeoutError classes of Python 3.10),
       or a BaseException that is not an Exception (cancellation, interrupt, exit).

The rule (the precedence)
    The call is in doubt when the tree holds
      * a ``strong`` error, wherever it is; or
      * a ``wrapper`` whose own chain holds no ``not-sent`` proof; or
      * a ``weak`` error with no ``not-sent`` proof above it (between it and the raised error).
    Otherwise the record is released. So a proof only vouches for what sits below it, and only for
    the builtin socket-level errors there (a connect timeout carries a ``socket.timeout``): a read
    timeout or a lost connection of a known client further down belongs to an EARLIER request, which
    was sent, and still leaves the call in doubt. An exception group is in doubt when any member is.
    The outcome does not depend on the order of the walk; :func:`explain` names the first deciding
    error, outermost first (the error, its group members, its cause, its context).

After retries (with client recognition on)
    A client that retries on its own raises the error of its LAST try: the earlier tries leave no
    error in the chain, so a proof that the last try never left says nothing about them (a read
    timeout, then connection refused, reaches the guard as ``requests.ConnectionError <- MaxRetryError
    <- NewConnectionError``). So, wherever it sits in the tree (a proof above or below it does not
    vouch for it):
      * an error raised when a client's retries gave up (:data:`CLIENT_RETRY_ERRORS`: urllib3's
        ``MaxRetryError``, tenacity's ``RetryError``, the OpenAI and Anthropic SDKs'
        ``APIConnectionError`` / ``APITimeoutError``) is in doubt unless the client's record proves
        that no earlier try was sent;
      * a never-left proof that urllib3's ``Retry.increment`` re-raised (``connect=False``), and an
        answer after retries (:data:`CLIENT_ANSWERS_AFTER_RETRIES`: requests' ``HTTPError``, the
        SDKs' ``APIStatusError``) are in doubt when that record shows an earlier try that may have
        been sent.
    The records, read without calling into the client: urllib3 keeps ``Retry.history`` on the
    ``Retry``, not on the error; it is the ``self`` of the ``Retry.increment`` frame in the error's
    traceback (``response.raw.retries`` for an answer); an earlier try counts as never sent only
    when its error is a never-left proof (an answered try was sent). tenacity: the last attempt is
    the first (``last_attempt.attempt_number == 1``) and it raised. The SDKs: ``retries_taken == 0``
    in the frame that raised. An error raised after retries with no record (made by hand, a cleared
    frame, a client version that keeps it elsewhere) is in doubt; a proof or an answer with no
    record is judged as above. A record that cannot be read (more than :data:`MAX_FRAMES`
    traceback and history entries, an attribute that raises) leaves the call in doubt. The cost:
    with client retries on, a call is in doubt whenever an earlier try may have been sent, so a
    backend outage leaves more ``unknown`` records. Retries that leave neither such an error nor a
    record (tenacity's ``reraise=True``, backoff, botocore, aiohttp's retry of an idempotent
    request) are not seen.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import FrameType, TracebackType
from typing import Final, NamedTuple, TypeAlias

from .errors import EffectOutcomeUnknown

__all__ = [
    "CLIENT_ANSWERS_AFTER_RETRIES",
    "CLIENT_IN_DOUBT_ERRORS",
    "CLIENT_NOT_SENT_ERRORS",
    "CLIENT_RETRY_ERRORS",
    "CLIENT_TRANSPORT_WRAPPERS",
    "DEFAULT_AMBIGUOUS_ERRORS",
    "DEFAULT_RULE",
    "MAX_ERRORS",
    "MAX_FRAMES",
    "RPC_IN_DOUBT_STATUSES",
    "AmbiguityRule",
    "AmbiguousErrors",
    "explain",
    "is_ambiguous",
]

DEFAULT_AMBIGUOUS_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    EffectOutcomeUnknown,
)

# The builtin socket-level errors of the default list. A not-sent proof vouches for these below it.
_SOCKET_LEVEL: Final = frozenset(
    {TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError}
)

MAX_ERRORS: Final = 1000
"""More errors than this reachable from the raised one: the rest is not inspected, the call is in doubt."""

MAX_FRAMES: Final = 10_000
"""More traceback entries (and retry-history entries) than this to read for the clients' retry records:
the records count as unreadable, the call is in doubt."""


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
_BY_URLLIB3, _BY_TENACITY, _BY_SDK, _BY_RESPONSE = range(1, 5)
_SDK_STATUS = ("APIStatusError",)

_RETRY_ERRORS: Final[dict[str, int]] = {
    "urllib3.exceptions.MaxRetryError": _BY_URLLIB3,
    "tenacity.RetryError": _BY_TENACITY,
    **dict.fromkeys(_names("openai", *_SDK_WRAPPERS), _BY_SDK),
    **dict.fromkeys(_names("openai._exceptions", *_SDK_WRAPPERS), _BY_SDK),
    **dict.fromkeys(_names("anthropic", *_SDK_WRAPPERS), _BY_SDK),
    **dict.fromkeys(_names("anthropic._exceptions", *_SDK_WRAPPERS), _BY_SDK),
}
_ANSWERS_AFTER_RETRIES: Final[dict[str, int]] = {
    "requests.exceptions.HTTPError": _BY_RESPONSE,
    **dict.fromkeys(_names("openai", *_SDK_STATUS), _BY_SDK),
    **dict.fromkeys(_names("openai._exceptions", *_SDK_STATUS), _BY_SDK),
    **dict.fromkeys(_names("anthropic", *_SDK_STATUS), _BY_SDK),
    **dict.fromkeys(_names("anthropic._exceptions", *_SDK_STATUS), _BY_SDK),
}

CLIENT_RETRY_ERRORS: Final[frozenset[str]] = frozenset(_RETRY_ERRORS)
"""Errors raised when a client's own retries gave up: in doubt unless the client's record proves that no
earlier try was sent (requests wraps every connection failure in a ``MaxRetryError``, retries or not)."""

CLIENT_ANSWERS_AFTER_RETRIES: Final[frozenset[str]] = frozenset(_ANSWERS_AFTER_RETRIES)
"""Answers that may come after retries: in doubt when the client's record shows an earlier try that may
have been sent."""

_URLLIB3_RETRY: Final = "urllib3.util.retry.Retry"
_URLLIB3_INCREMENT: Final = ("urllib3.util.retry", "increment")  # the frame that raises after retries
_SDK_CLIENTS: Final = frozenset({"openai._base_client", "anthropic._base_client"})
_SDK_REQUEST: Final = frozenset({"request", "_request"})  # the frames that retry (newer, older SDKs)

RPC_IN_DOUBT_STATUSES: Final[frozenset[str]] = frozenset({"DEADLINE_EXCEEDED", "UNAVAILABLE"})
"""gRPC status names (``error.code().name``) that leave a call's effect in doubt."""

_REASON_CARRIERS: Final = frozenset({"urllib3.exceptions.MaxRetryError"})

# Python 3.10: asyncio's and concurrent.futures' TimeoutError are classes of their own (3.11 made them the
# builtin). A rule that lists TimeoutError, with client recognition on, counts them as TimeoutError.
_OLD_TIMEOUTS: Final = frozenset({"asyncio.exceptions.TimeoutError", "concurrent.futures._base.TimeoutError"})

# What one error says on its own.
_NONE, _WEAK, _STRONG, _NOT_SENT, _WRAPPER, _RPC = range(6)
_IN_DOUBT_ALONE: Final = frozenset({_WEAK, _STRONG, _WRAPPER})  # an error with nothing linked to it

_KNOWN: Final[dict[str, int]] = {
    **dict.fromkeys(CLIENT_IN_DOUBT_ERRORS, _STRONG),
    **dict.fromkeys(CLIENT_NOT_SENT_ERRORS, _NOT_SENT),
    **dict.fromkeys(CLIENT_TRANSPORT_WRAPPERS, _WRAPPER),
}

_BASE_GROUP: type[BaseException] | None = getattr(builtins, "BaseExceptionGroup", None)


@dataclass(frozen=True)
class AmbiguityRule:
    """Which errors leave a tool call's effect in doubt.

    ``classes``: the error classes that do (``EffectGuard(ambiguous_errors=...)``); by default the
    spec's five. Replace them with your own tuple, or add to them:
    ``AmbiguityRule((*DEFAULT_AMBIGUOUS_ERRORS, MyError))`` or ``DEFAULT_RULE.adding(MyError)``.
    ``known_clients``: also recognise the common HTTP and SDK clients' errors by name (read-side
    timeouts and lost connections are in doubt; errors proving the request never left are not).
    ``follow_chains``: look through causes, contexts and exception groups, not only at the raised
    error. ``AmbiguityRule(classes, known_clients=False, follow_chains=False)`` is the guard's former
    test: ``isinstance(error, classes)``, or not an Exception at all.
    """

    classes: tuple[type[BaseException], ...] = DEFAULT_AMBIGUOUS_ERRORS
    known_clients: bool = True
    follow_chains: bool = True
    _strong: tuple[type[BaseException], ...] = field(init=False, repr=False, compare=False)
    _weak: tuple[type[BaseException], ...] = field(init=False, repr=False, compare=False)
    _exact: frozenset[type[BaseException]] = field(init=False, repr=False, compare=False)
    _timeouts: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.classes, (str, bytes)) or not isinstance(self.classes, Iterable):
            raise TypeError("ambiguous_errors must be exception classes")
        classes = tuple(self.classes)
        if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
            raise TypeError("ambiguous_errors must be exception classes")
        object.__setattr__(self, "classes", classes)
        object.__setattr__(self, "known_clients", bool(self.known_clients))
        object.__setattr__(self, "follow_chains", bool(self.follow_chains))
        object.__setattr__(self, "_strong", tuple(c for c in classes if c not in _SOCKET_LEVEL))
        object.__setattr__(self, "_weak", tuple(c for c in classes if c in _SOCKET_LEVEL))
        object.__setattr__(self, "_exact", frozenset(classes))
        object.__setattr__(self, "_timeouts", TimeoutError in classes)

    @classmethod
    def of(cls, spec: AmbiguousErrors) -> AmbiguityRule:
        """The rule for ``spec``: a rule as it is, or a sequence of classes (client recognition on)."""
        if isinstance(spec, AmbiguityRule):
            return spec
        if isinstance(spec, tuple):
            try:
                return _rule_for_tuple(spec)
            except TypeError:  # an unhashable member, or not classes: refused below with the message
                pass
        if isinstance(spec, (str, bytes)) or not isinstance(spec, Iterable):
            raise TypeError("ambiguous_errors must be exception classes")
        return cls(tuple(spec))

    def adding(self, *classes: type[BaseException]) -> AmbiguityRule:
        """This rule with more classes in doubt (kept in order, without repeats)."""
        merged = tuple(dict.fromkeys((*self.classes, *classes)))
        return replace(self, classes=merged)


AmbiguousErrors: TypeAlias = AmbiguityRule | Iterable[type[BaseException]]
"""What ``settlement_for_error`` and ``is_ambiguous`` accept: a rule, or the classes (a tuple)."""

DEFAULT_RULE: Final = AmbiguityRule()


@lru_cache(maxsize=64)
def _rule_for_tuple(classes: tuple[type[BaseException], ...]) -> AmbiguityRule:
    return AmbiguityRule(classes)


# -- one error on its own ----------------------------------------------------------------------


def _qualified(cls: type) -> str:
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "?")
    return f"{module}.{qualname}" if isinstance(module, str) else str(qualname)


def _is_rpc_module(cls: type) -> bool:
    module = getattr(cls, "__module__", None)
    return isinstance(module, str) and (module == "grpc" or module.startswith("grpc."))


class _Facts(NamedTuple):
    """What the names in a class's MRO say, whatever the rule."""

    kind: int  # of the most specific class found in the name tables (_NONE, _STRONG, ... _RPC)
    old_timeout: bool  # Python 3.10's asyncio / concurrent.futures TimeoutError
    group_shaped: bool  # a class named *ExceptionGroup (groups without the builtin, e.g. on 3.10)
    carries_reason: bool  # urllib3's MaxRetryError: ``reason`` holds the error that decided
    record: int  # how the client's record of earlier tries is read (0: it is not looked for)
    after_retries: bool  # raised when retries gave up: with no record to read, the call is in doubt


def _facts_of(cls: type) -> _Facts:
    names = [_qualified(klass) for klass in cls.__mro__]
    kind = next((_KNOWN[name] for name in names if name in _KNOWN), _NONE)
    if kind == _NONE and any(_is_rpc_module(klass) for klass in cls.__mro__):
        kind = _RPC
    retried = next((name for name in names if name in _RETRY_ERRORS or name in _ANSWERS_AFTER_RETRIES), None)
    return _Facts(
        kind=kind,
        old_timeout=any(name in _OLD_TIMEOUTS for name in names),
        group_shaped=any(getattr(klass, "__name__", "").endswith("ExceptionGroup") for klass in cls.__mro__),
        carries_reason=any(name in _REASON_CARRIERS for name in names),
        record=0 if retried is None else _RETRY_ERRORS.get(retried) or _ANSWERS_AFTER_RETRIES[retried],
        after_retries=retried in _RETRY_ERRORS,
    )


# These depend only on the class: cached, and bounded (a class made on the fly is held until evicted).
_facts: Callable[[type], _Facts] = lru_cache(maxsize=1024)(_facts_of)


def _rpc_status(error: BaseException) -> str | None:
    """The name of a gRPC error's status, asked defensively: ``code`` may be missing or raise."""
    try:
        code = getattr(error, "code", None)
        status = code() if callable(code) else None
    except Exception:
        return None
    name = getattr(status, "name", status)
    return name.upper() if isinstance(name, str) else None


def _classify(error: BaseException, rule: AmbiguityRule) -> tuple[int, str]:
    """What ``error`` says on its own, and why (for :func:`explain`)."""
    if rule._strong and isinstance(error, rule._strong):
        return _STRONG, "its class is listed in ambiguous_errors"
    if rule.known_clients:
        kind = _facts(type(error)).kind
        if kind == _STRONG:
            return _STRONG, "a known client's read-side timeout or lost connection: the request was sent"
        if kind == _NOT_SENT:
            return _NOT_SENT, "proves the request never left"
        if kind == _WRAPPER:
            return _WRAPPER, "a client's connection failure, and nothing in its chain proves it never left"
        if kind == _RPC:
            status = _rpc_status(error)
            if status in RPC_IN_DOUBT_STATUSES:
                return _STRONG, f"a gRPC call that ended {status}"
    if rule._weak and isinstance(error, rule._weak):
        return _WEAK, "its class is listed in ambiguous_errors"
    if rule._timeouts and rule.known_clients and _facts(type(error)).old_timeout:
        return _WEAK, "a TimeoutError (of asyncio or concurrent.futures), listed in ambiguous_errors"
    if not isinstance(error, Exception):
        return _WEAK, "not an Exception: the tool was interrupted or cancelled"
    return _NONE, ""


# -- the tree of errors ------------------------------------------------------------------------


def _group_members(error: BaseException) -> tuple[BaseException, ...]:
    if _BASE_GROUP is not None and isinstance(error, _BASE_GROUP):
        members = getattr(error, "exceptions", ())
    elif _facts(type(error)).group_shaped:
        # Python 3.10, the exceptiongroup backport, and older anyio: recognised by shape, not imported
        try:
            members = getattr(error, "exceptions", ())
        except Exception:
            return ()
    else:
        return ()
    if not isinstance(members, (tuple, list)):
        return ()
    return tuple(m for m in members if isinstance(m, BaseException))


def _children(error: BaseException) -> list[tuple[BaseException, str]]:
    """The errors one step below ``error``, outermost first, with the attribute that leads there."""
    below = [(member, f".exceptions[{i}]") for i, member in enumerate(_group_members(error))]
    cause, context = error.__cause__, error.__context__
    if cause is not None:
        below.append((cause, ".__cause__"))
    if context is not None and context is not cause:
        below.append((context, ".__context__"))
    if _facts(type(error)).carries_reason:
        reason = getattr(error, "reason", None)
        if isinstance(reason, BaseException) and reason is not cause and reason is not context:
            below.append((reason, ".reason"))
    return below


@dataclass
class _Budget:
    left: int = MAX_ERRORS

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


# -- a client's record of its earlier tries ----------------------------------------------------------
# Each reader returns None when it finds no record, "" when the record proves that no earlier try was
# sent, and otherwise why one may have been. Reading never calls into the client: attributes and the
# locals of finished frames in the error's traceback only, each read guarded.

_CLEAN: Final = ""
_TOO_LONG: Final = "too many traceback entries to read for the client's record of its earlier tries"


def _has_class(value: object, qualified: str) -> bool:
    return any(_qualified(klass) == qualified for klass in type(value).__mro__)


def _trace(error: BaseException, budget: _Budget) -> list[FrameType] | None:
    """The frames of ``error``'s traceback, outermost first; None when the budget ran out."""
    frames: list[FrameType] = []
    tb = error.__traceback__
    while isinstance(tb, TracebackType):
        if not budget.take():
            return None
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _where(frame: FrameType) -> tuple[object, str]:
    return frame.f_globals.get("__name__"), frame.f_code.co_name


def _local(frame: FrameType, name: str) -> object:
    try:
        return frame.f_locals.get(name)
    except Exception:  # a frame whose locals cannot be read: no record
        return None


def _urllib3_history(retry: object, rule: AmbiguityRule, budget: _Budget) -> str:
    """What a urllib3 ``Retry``'s history says of the tries before it ("": all of them never left)."""
    if not _has_class(retry, _URLLIB3_RETRY):
        return "urllib3 retried, and its Retry (the record of the earlier tries) cannot be read"
    try:
        history = getattr(retry, "history", None)
    except Exception:
        history = None
    if not isinstance(history, tuple):
        return "urllib3 retried, and its Retry.history (the record of the earlier tries) cannot be read"
    for entry in history:
        if not budget.take():
            return _TOO_LONG
        try:
            error, status = getattr(entry, "error", None), getattr(entry, "status", None)
        except Exception:
            return "urllib3 retried, and an entry of its Retry.history cannot be read"
        if not isinstance(error, BaseException):
            answered = f" (HTTP {status})" if isinstance(status, int) else ""
            return f"urllib3 retried after an earlier try that was sent and answered{answered}"
        if _classify(error, rule)[0] != _NOT_SENT:
            name = _qualified(type(error))
            return f"urllib3 retried after an earlier try that ended {name}: that request may have been sent"
    return _CLEAN


def _urllib3_record(error: BaseException, rule: AmbiguityRule, budget: _Budget) -> str | None:
    """The ``Retry`` of each ``Retry.increment`` frame ``error`` was raised (or re-raised) through."""
    frames = _trace(error, budget)
    if frames is None:
        return _TOO_LONG
    found: str | None = None
    for frame in frames:
        if _where(frame) == _URLLIB3_INCREMENT:
            verdict = _urllib3_history(_local(frame, "self"), rule, budget)
            if verdict:
                return verdict
            found = _CLEAN
    return found


def _response_record(error: BaseException, rule: AmbiguityRule, budget: _Budget) -> str | None:
    """requests' ``HTTPError``: the ``Retry`` urllib3 gave the response (``response.raw.retries``)."""
    try:
        retry = getattr(getattr(getattr(error, "response", None), "raw", None), "retries", None)
    except Exception:
        return "the response's record of urllib3's retries cannot be read"
    if retry is None or not _has_class(retry, _URLLIB3_RETRY):
        return None  # not a response urllib3 made: nothing says it retried
    return _urllib3_history(retry, rule, budget)


def _tenacity_record(error: BaseException) -> str:
    """tenacity keeps the last attempt only: the record is clean when that attempt was the first one
    and it raised (its error, the ``__cause__``, is judged with the rest of the chain)."""
    try:
        number = getattr(getattr(error, "last_attempt", None), "attempt_number", None)
    except Exception:
        number = None
    if type(number) is not int:
        return "tenacity gave up retrying, and its RetryError says nothing of the earlier attempts"
    if number > 1:
        return f"tenacity gave up after {number} attempts and keeps the last one's error only"
    if error.__cause__ is None:
        return "tenacity gave up on an attempt that returned: it ran to the end"
    return _CLEAN


def _sdk_record(error: BaseException, budget: _Budget) -> str | None:
    """The OpenAI and Anthropic SDKs: ``retries_taken`` in the request frame that raised ``error``."""
    frames = _trace(error, budget)
    if frames is None:
        return _TOO_LONG
    if not frames:
        return None
    module, function = _where(frames[-1])
    if module not in _SDK_CLIENTS or function not in _SDK_REQUEST:
        return None
    taken = _local(frames[-1], "retries_taken")
    if type(taken) is not int:
        return "the SDK retries, and its count of retries taken cannot be read"
    if taken > 0:
        return f"the SDK retried {taken} time(s) before raising: an earlier try may have been sent"
    return _CLEAN


def _after_retries(error: BaseException, kind: int, rule: AmbiguityRule, budget: _Budget) -> str | None:
    """Why ``error`` may come after a retry whose earlier try was sent (None: nothing says so)."""
    facts = _facts(type(error))
    record: str | None
    if facts.record == _BY_URLLIB3 or (kind == _NOT_SENT and error.__traceback__ is not None):
        record = _urllib3_record(error, rule, budget)
    elif facts.record == _BY_TENACITY:
        record = _tenacity_record(error)
    elif facts.record == _BY_SDK:
        record = _sdk_record(error, budget)
    elif facts.record == _BY_RESPONSE:
        record = _response_record(error, rule, budget)
    else:
        return None
    if record:
        return record
    if record is None and facts.after_retries:
        return "raised when a client's retries gave up, and no record of its earlier tries can be read"
    return None


@dataclass(frozen=True)
class _Finding:
    ambiguous: bool
    error: BaseException | None  # the error that decided (None: nothing did)
    path: str
    why: str
    inspected: int


def _holds_proof(error: BaseException, rule: AmbiguityRule, budget: _Budget) -> bool:
    """Whether the chain below ``error`` holds an error proving the request never left."""
    stack = [child for child, _ in _children(error)]
    seen = {id(error)}
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if not budget.take():
            return False  # not inspected to the end: no proof
        if _classify(current, rule)[0] == _NOT_SENT:
            return True
        stack.extend(child for child, _ in reversed(_children(current)))
    return False


def _render(labels: list[str], parents: list[int], index: int) -> str:
    parts: list[str] = []
    while index >= 0:
        parts.append(labels[index])
        index = parents[index]
    parts.reverse()
    if len(parts) > 7:
        return f"{''.join(parts[:3])} ... {''.join(parts[-3:])} (depth {len(parts) - 1})"
    return "".join(parts)


def _analyse(error: BaseException, rule: AmbiguityRule) -> _Finding:
    budget = _Budget()
    proof_budget = _Budget()  # shared by every wrapper's search; spent: the wrapper finds no proof
    frame_budget = _Budget(MAX_FRAMES)  # shared by the reads of the clients' retry records
    labels: list[str] = []
    parents: list[int] = []
    seen_open: set[int] = set()  # reached with no proof above
    seen_covered: set[int] = set()  # reached below a proof
    first_proof: tuple[BaseException, int] | None = None
    # (error, parent index, label, covered by a proof above)
    stack: list[tuple[BaseException, int, str, bool]] = [(error, -1, "error", False)]
    while stack:
        current, parent, label, covered = stack.pop()
        key = id(current)
        if key in seen_open or (covered and key in seen_covered):
            continue
        (seen_covered if covered else seen_open).add(key)
        if not budget.take():
            why = f"more than {MAX_ERRORS} errors in the chain; the rest was not inspected"
            return _Finding(True, None, "", why, MAX_ERRORS)
        index = len(labels)
        labels.append(label)
        parents.append(parent)
        kind, why = _classify(current, rule)
        decided = kind == _STRONG or (kind == _WEAK and not covered)
        if kind == _WRAPPER:
            decided = not (rule.follow_chains and _holds_proof(current, rule, proof_budget))
            if not rule.follow_chains:
                why = "a client's connection failure, and its chain is not looked at (follow_chains=False)"
        if not decided and rule.known_clients:
            # after retries: no proof vouches for the earlier tries, above or below
            retried = _after_retries(current, kind, rule, frame_budget)
            if retried is not None:
                decided, why = True, retried
        if decided:
            if kind == _WEAK and index > 0:
                why += ", and no error above it proves the request never left"
            return _Finding(True, current, _render(labels, parents, index), why, len(labels))
        if kind == _NOT_SENT and first_proof is None:
            first_proof = (current, index)
        if rule.follow_chains:
            below_covered = covered or kind == _NOT_SENT
            for child, step in reversed(_children(current)):
                stack.append((child, index, step, below_covered))
    if first_proof is not None:
        proof, index = first_proof
        return _Finding(
            False, proof, _render(labels, parents, index), "proves the request never left", len(labels)
        )
    return _Finding(False, None, "", "", len(labels))


# -- the API -----------------------------------------------------------------------------------


def is_ambiguous(error: BaseException, rule: AmbiguousErrors = DEFAULT_RULE) -> bool:
    """Whether ``error``, raised by a tool, leaves the tool's effect in doubt (see the module doc)."""
    resolved = AmbiguityRule.of(rule)
    if not isinstance(error, Exception) or type(error) in resolved._exact:
        return True  # cheap, common cases: nothing above the raised error can vouch for it
    if resolved._strong and isinstance(error, resolved._strong):
        return True
    if error.__cause__ is None and error.__context__ is None and not _children(error):
        kind = _classify(error, resolved)[0]  # a lone error: no walk
        if kind in _IN_DOUBT_ALONE:
            return True
        if not resolved.known_clients:
            return False
        return _after_retries(error, kind, resolved, _Budget(MAX_FRAMES)) is not None
    return _analyse(error, resolved).ambiguous


def explain(error: BaseException, rule: AmbiguousErrors = DEFAULT_RULE) -> str:
    """One line for logs: the outcome, which error in the chain decided it, and why."""
    resolved = AmbiguityRule.of(rule)
    finding = _analyse(error, resolved)
    if finding.error is None:
        if finding.ambiguous:
            return f"in doubt: {finding.why}"
        count = finding.inspected
        errors = "error" if count == 1 else "errors"
        return f"released: none of the {count} {errors} inspected leaves the effect in doubt"
    name = _qualified(type(finding.error))
    if finding.ambiguous:
        return f"in doubt: {name} at {finding.path}: {finding.why}"
    return f"released: {name} at {finding.path} {finding.why}; nothing else leaves the effect in doubt"
