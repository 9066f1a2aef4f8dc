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
      * an error raised when a client's retries gave up
        (:data:`~.client_errors.CLIENT_RETRY_ERRORS`: urllib3's
        ``MaxRetryError``, tenacity's ``RetryError``, the OpenAI and Anthropic SDKs'
        ``APIConnectionError`` / ``APITimeoutError``) is in doubt unless the client's record proves
        that no earlier try was sent;
      * a never-left proof that urllib3's ``Retry.increment`` re-raised (``connect=False``), and an
        answer after retries (:data:`~.client_errors.CLIENT_ANSWERS_AFTER_RETRIES`: requests'
        ``HTTPError``, the
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
from typing import Final, TypeAlias

from .client_errors import (
    IN_DOUBT_ALONE,
    NONE,
    NOT_SENT,
    RPC,
    RPC_IN_DOUBT_STATUSES,
    STRONG,
    WEAK,
    WRAPPER,
    facts,
    qualified,
    rpc_status,
)
from .errors import EffectOutcomeUnknown
from .retry_records import Budget, after_retries

__all__ = [
    "DEFAULT_AMBIGUOUS_ERRORS",
    "DEFAULT_RULE",
    "MAX_ERRORS",
    "MAX_FRAMES",
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


def _classify(error: BaseException, rule: AmbiguityRule) -> tuple[int, str]:
    """What ``error`` says on its own, and why (for :func:`explain`)."""
    if rule._strong and isinstance(error, rule._strong):
        return STRONG, "its class is listed in ambiguous_errors"
    if rule.known_clients:
        kind = facts(type(error)).kind
        if kind == STRONG:
            return STRONG, "a known client's read-side timeout or lost connection: the request was sent"
        if kind == NOT_SENT:
            return NOT_SENT, "proves the request never left"
        if kind == WRAPPER:
            return WRAPPER, "a client's connection failure, and nothing in its chain proves it never left"
        if kind == RPC:
            status = rpc_status(error)
            if status in RPC_IN_DOUBT_STATUSES:
                return STRONG, f"a gRPC call that ended {status}"
    if rule._weak and isinstance(error, rule._weak):
        return WEAK, "its class is listed in ambiguous_errors"
    if rule._timeouts and rule.known_clients and facts(type(error)).old_timeout:
        return WEAK, "a TimeoutError (of asyncio or concurrent.futures), listed in ambiguous_errors"
    if not isinstance(error, Exception):
        return WEAK, "not an Exception: the tool was interrupted or cancelled"
    return NONE, ""


def _never_left(rule: AmbiguityRule) -> Callable[[BaseException], bool]:
    """Whether an error proves, under ``rule``, that its request never left (for the retry records)."""
    return lambda error: _classify(error, rule)[0] == NOT_SENT


# -- the tree of errors ------------------------------------------------------------------------


def _group_members(error: BaseException) -> tuple[BaseException, ...]:
    if _BASE_GROUP is not None and isinstance(error, _BASE_GROUP):
        members = getattr(error, "exceptions", ())
    elif facts(type(error)).group_shaped:
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
    if facts(type(error)).carries_reason:
        reason = getattr(error, "reason", None)
        if isinstance(reason, BaseException) and reason is not cause and reason is not context:
            below.append((reason, ".reason"))
    return below


@dataclass(frozen=True)
class _Finding:
    ambiguous: bool
    error: BaseException | None  # the error that decided (None: nothing did)
    path: str
    why: str
    inspected: int


def _holds_proof(error: BaseException, rule: AmbiguityRule, budget: Budget) -> bool:
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
        if _classify(current, rule)[0] == NOT_SENT:
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
    budget = Budget(MAX_ERRORS)
    proof_budget = Budget(MAX_ERRORS)  # shared by every wrapper's search; spent: the wrapper finds no proof
    frame_budget = Budget(MAX_FRAMES)  # shared by the reads of the clients' retry records
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
        decided = kind == STRONG or (kind == WEAK and not covered)
        if kind == WRAPPER:
            decided = not (rule.follow_chains and _holds_proof(current, rule, proof_budget))
            if not rule.follow_chains:
                why = "a client's connection failure, and its chain is not looked at (follow_chains=False)"
        if not decided and rule.known_clients:
            # after retries: no proof vouches for the earlier tries, above or below
            retried = after_retries(current, kind, _never_left(rule), frame_budget)
            if retried is not None:
                decided, why = True, retried
        if decided:
            if kind == WEAK and index > 0:
                why += ", and no error above it proves the request never left"
            return _Finding(True, current, _render(labels, parents, index), why, len(labels))
        if kind == NOT_SENT and first_proof is None:
            first_proof = (current, index)
        if rule.follow_chains:
            below_covered = covered or kind == NOT_SENT
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
        if kind in IN_DOUBT_ALONE:
            return True
        if not resolved.known_clients:
            return False
        return after_retries(error, kind, _never_left(resolved), Budget(MAX_FRAMES)) is not None
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
    name = qualified(type(finding.error))
    if finding.ambiguous:
        return f"in doubt: {name} at {finding.path}: {finding.why}"
    return f"released: {name} at {finding.path} {finding.why}; nothing else leaves the effect in doubt"
