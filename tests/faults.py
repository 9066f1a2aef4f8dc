"""Shared helpers of the fault tests: a chaos TCP proxy, a history of real executions, a load worker.

- :class:`ChaosProxy`: a relay on 127.0.0.1 in front of a redis-server (unix socket or host:port) that
  applies :class:`Fault` rules to the Nth request matching a predicate: drop its reply, drop the request
  itself, cut the connection before or after the server ran it, or hold it on its way (``DELAY``: it
  lands late, even after its client gave up; ``delay=math.inf`` holds it until ``release_held()``).
  ``cut_all()`` cuts every live connection at once (a link that dies while the tool runs);
  ``wait_delivered()`` waits until the server has run every held request.
- :class:`History`: every real execution of a tool body per tool_call_id, and every call's outcome
  (executed, replayed, refused with a reason, error). ``summary()``/``report()`` print what was measured.
- :class:`Tools`: guarded tools (irreversible ``transfer``, costly ``send_sms``, reversible ``refresh``),
  sync and async, whose bodies write to a History.
- :func:`load_worker`: one process of the load test (module level, so ``spawn`` can import it).
- Cluster and Sentinel helpers for failovers: ids whose records live on one node, waits for a take-over.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import json
import math
import os
import random
import secrets
import socket
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.crc import key_slot
from redis.retry import Retry

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    RedisEffectStore,
    current_call_context,
    current_idempotency_key,
    reversibility,
    tool_call_context,
)
from airlock_redis.core.records import BeginKind, BeginOutcome, BeginRequest, Settlement, TransitionResult
from airlock_redis.core.reversibility import ReversibilityName
from tests.procs import close_socket as _close
from tests.procs import connect_upstream, parse_request
from tests.topologies import ClusterTopology, RedisProcess, SentinelTopology, TopologyError, wait_until

HOST = "127.0.0.1"
TOOLS = ("transfer", "send_sms", "refresh")  # irreversible, costly, reversible
ONCE_ONLY = ("transfer", "send_sms")  # not reversible: at most one execution per tool_call_id


# -- the chaos proxy -------------------------------------------------------------------------------
class Action(enum.Enum):
    DROP_REPLY = "drop_reply"  # the server runs it; the reply (and every later one) never comes back
    DROP_REQUEST = "drop_request"  # the request never reaches the server; the connection goes silent
    CUT_BEFORE = "cut_before"  # the connection is cut before the request is forwarded
    CUT_AFTER = "cut_after"  # the server runs it; the connection is cut when its reply arrives
    # the request reaches the server Fault.delay seconds late, and every later request of its connection
    # after it (a slow network keeps a connection's order); what the client sent still arrives if it has
    # closed the connection meanwhile (the server's replies to it are then read and discarded);
    # Fault.delay = math.inf holds it until ChaosProxy.release_held() (a gate, not a clock)
    DELAY = "delay"


@dataclass
class Fault:
    """Apply ``action`` to matching requests number ``nth`` .. ``nth + times - 1`` (counted from 1)."""

    match: Callable[[list[bytes]], bool]
    action: Action
    nth: int = 1
    times: int = 1
    seen: int = 0
    applied: int = 0
    delay: float = 0.0  # seconds, for Action.DELAY (math.inf: until ChaosProxy.release_held())


@dataclass
class _Link:
    client: socket.socket
    upstream: socket.socket
    silent: threading.Event = field(default_factory=threading.Event)  # replies are swallowed
    blackhole: bool = False  # requests are swallowed too
    cut_on_reply: bool = False
    # Action.DELAY: requests held on their way (when each is due, the request, its arguments), in order
    held: deque[tuple[float, bytes, list[bytes]]] = field(default_factory=deque)
    delaying: bool = False  # a request of this connection was held: its deliverer thread runs
    client_gone: bool = False  # the client closed the connection (what it sent still goes through)
    finished: threading.Event = field(default_factory=threading.Event)  # the server closed it after all
    wake: threading.Condition = field(default_factory=threading.Condition)


class ChaosProxy:
    """A TCP relay to one redis-server that loses, drops or cuts chosen requests (see :class:`Fault`)."""

    def __init__(self, upstream: str | Path | tuple[str, int], faults: Iterable[Fault] = ()) -> None:
        self.upstream = upstream
        self.faults = list(faults)
        self.events: list[tuple[str, str]] = []  # (action, command) of every fault applied
        self.forwarded: Counter[str] = Counter()  # requests that reached the server, by command
        self.delivered_late: list[list[bytes]] = []  # the held requests (arguments), in the order they landed
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._delaying_links: list[_Link] = []
        self._holding = 0  # requests held right now (Action.DELAY)
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def applied(self, action: Action) -> int:
        with self._lock:
            return sum(1 for a, _ in self.events if a == action.value)

    def holding(self) -> int:
        """How many requests are held on their way right now (Action.DELAY)."""
        with self._lock:
            return self._holding

    def delivered(self) -> bool:
        """True when no request is held any more and every connection that held one was closed by the
        server after its last request: the server has run everything those connections carried (a
        server reads and runs what it was sent before it sees the end of the connection). A connection
        whose client is still open counts once its held requests were forwarded."""
        with self._lock:
            if self._holding:
                return False
            links = list(self._delaying_links)
        return all(link.finished.is_set() or not link.client_gone for link in links)

    def wait_delivered(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until :meth:`delivered`."""
        wait_until("the held requests to reach the server and run", self.delivered, timeout)

    def release_held(self) -> int:
        """Let every request held so far go on to the server now, in its connection's order (the
        gate of ``Fault.delay = math.inf``); returns how many were released. Requests held later are
        held as their fault says."""
        with self._lock:
            links = list(self._delaying_links)
        released = 0
        now = time.monotonic()
        for link in links:
            with link.wake:
                released += len(link.held)
                link.held = deque((min(due, now), raw, args) for due, raw, args in link.held)
                link.wake.notify_all()
        return released

    def cut_all(self) -> int:
        """Cut every open connection now; returns how many were cut."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            _close(link.client)
            _close(link.upstream)
        return len(links)

    def _connect_upstream(self) -> socket.socket:
        return connect_upstream(self.upstream)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect_upstream()
            except OSError:
                _close(client)
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            link = _Link(client, upstream)
            with self._lock:
                self._links.append(link)
            self._spawn(self._requests, link)
            self._spawn(self._replies, link)

    def _verdict(self, args: list[bytes]) -> Action | None:
        fault = self._fault_for(args)
        return fault.action if fault is not None else None

    def _fault_for(self, args: list[bytes]) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if not fault.match(args):
                    continue
                fault.seen += 1
                if fault.nth <= fault.seen < fault.nth + fault.times:
                    fault.applied += 1
                    self.events.append((fault.action.value, args[0].decode(errors="replace").upper()))
                    return fault
        return None

    def _hold(self, link: _Link, raw: bytes, args: list[bytes], delay: float) -> None:
        """Action.DELAY: queue a request for the server, due ``delay`` seconds from now (and never
        before the requests held ahead of it on its connection)."""
        with link.wake:
            due = time.monotonic() + delay
            if link.held:
                due = max(due, link.held[-1][0])
            link.held.append((due, raw, args))
            start = not link.delaying
            link.delaying = True
            link.wake.notify_all()
        with self._lock:
            self._holding += 1
            if start:
                self._delaying_links.append(link)
        if start:
            self._spawn(self._deliver, link)

    def _deliver(self, link: _Link) -> None:
        """Forward a connection's held requests when due, in order; once its client has gone and nothing
        is left, end the connection towards the server (which then runs what it got and closes it)."""
        while True:
            with link.wake:
                while not link.held and not link.client_gone:
                    link.wake.wait()
                if not link.held:
                    break
                due, raw, args = link.held[0]
                left = due - time.monotonic()
                if left > 0:
                    # a proxy's own clock: the request is due then (never, until release_held())
                    link.wake.wait(None if left == math.inf else left)
                    continue
                link.held.popleft()
            with contextlib.suppress(OSError):  # a server gone meanwhile: the request is lost
                link.upstream.sendall(raw)
            with self._lock:
                self._holding -= 1
                self.forwarded[args[0].decode(errors="replace").upper()] += 1
                self.delivered_late.append(args)
        with contextlib.suppress(OSError):
            link.upstream.shutdown(socket.SHUT_WR)

    def _requests(self, link: _Link) -> None:
        buffer = b""
        while True:
            try:
                chunk = link.client.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                with link.wake:
                    if link.delaying:  # what it sent still goes through (see _deliver)
                        link.client_gone = True
                        link.wake.notify_all()
                        return
                _close(link.upstream)
                return
            buffer += chunk
            while (parsed := parse_request(buffer)) is not None:
                args, size = parsed
                raw, buffer = buffer[:size], buffer[size:]
                if link.blackhole:
                    continue
                fault = self._fault_for(args)
                action = fault.action if fault is not None else None
                if action is Action.DELAY or link.delaying:
                    delay = fault.delay if fault is not None and action is Action.DELAY else 0.0
                    self._hold(link, raw, args, delay)
                    continue
                if action is Action.CUT_BEFORE:
                    _close(link.client)
                    _close(link.upstream)
                    return
                if action is Action.DROP_REQUEST:
                    link.blackhole = True
                    link.silent.set()
                    continue
                if action is Action.DROP_REPLY:
                    link.silent.set()
                elif action is Action.CUT_AFTER:
                    link.cut_on_reply = True
                with self._lock:
                    self.forwarded[args[0].decode(errors="replace").upper()] += 1
                try:
                    link.upstream.sendall(raw)
                except OSError:
                    return

    @staticmethod
    def _replies(link: _Link) -> None:
        while True:
            try:
                chunk = link.upstream.recv(65536)
            except OSError:
                chunk = b""
            if not chunk or link.cut_on_reply:
                _close(link.client)
                _close(link.upstream)
                link.finished.set()
                return
            if link.silent.is_set():
                continue
            try:
                link.client.sendall(chunk)
            except OSError:
                if link.delaying:
                    continue  # its client is gone: read what the server still answers, to the end
                return

    def start(self) -> ChaosProxy:
        self._spawn(self._accept)
        return self

    def close(self) -> None:
        self._closing.set()
        _close(self._listener)
        with self._lock:
            delaying = list(self._delaying_links)
        for link in delaying:  # requests still held are dropped
            with link.wake:
                dropped = len(link.held)
                link.held.clear()
                link.client_gone = True
                link.wake.notify_all()
            with self._lock:
                self._holding -= dropped
        self.cut_all()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)

    def __enter__(self) -> ChaosProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def is_command(name: str) -> Callable[[list[bytes]], bool]:
    wanted = name.upper().encode()
    return lambda args: bool(args) and args[0].upper() == wanted


# -- the history of real executions ----------------------------------------------------------------
_CALL: contextvars.ContextVar[str] = contextvars.ContextVar("airlock_fault_call", default="")


@dataclass(frozen=True)
class Outcome:
    tool_call_id: str
    tool: str
    phase: str
    result: str  # executed | replayed | refused:<reason> | error:<type>
    detail: str = ""


class History:
    """Every real execution per tool_call_id, and every call's outcome (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: Counter[str] = Counter()
        self.tool_of: dict[str, str] = {}
        self.outcomes: list[Outcome] = []

    def ran(self, tool_call_id: str, tool: str) -> str:
        """Called by a tool body: one more real execution. Returns the calling attempt's nonce."""
        with self._lock:
            self.runs[tool_call_id] += 1
            self.tool_of[tool_call_id] = tool
        return _CALL.get()

    def note(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def of(self, tool_call_id: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.tool_call_id == tool_call_id]

    def duplicates(self, tools: Iterable[str] = ONCE_ONLY) -> dict[str, int]:
        wanted = set(tools)
        return {i: n for i, n in self.runs.items() if n > 1 and self.tool_of.get(i) in wanted}

    def summary(self, phase: str | None = None, ids: Iterable[str] | None = None) -> dict[str, Any]:
        chosen = set(ids) if ids is not None else None
        picked = [
            o
            for o in self.outcomes
            if (phase is None or o.phase == phase) and (chosen is None or o.tool_call_id in chosen)
        ]
        results = Counter(o.result for o in picked)
        runs = {i: n for i, n in self.runs.items() if chosen is None or i in chosen}
        return {
            "calls": len(picked),
            "executed": results["executed"],
            "replayed": results["replayed"],
            "refused": sum(n for r, n in results.items() if r.startswith("refused")),
            "errors": sum(n for r, n in results.items() if r.startswith("error")),
            "by_result": dict(sorted(results.items())),
            "executions": sum(runs.values()),
            "ids_run_twice": sum(1 for n in runs.values() if n > 1),
        }

    def report(
        self, title: str, phase: str | None = None, ids: Iterable[str] | None = None
    ) -> dict[str, Any]:
        measured = self.summary(phase, ids)
        print(f"\n[fault-measure] {title}: {json.dumps(measured, sort_keys=True)}", flush=True)
        return measured


def args_for(tool_call_id: str) -> dict[str, Any]:
    """The same arguments for every attempt of one id (a retry with other ones is a policy violation)."""
    return {"account": f"acct-{zlib.crc32(tool_call_id.encode()) % 9973}", "cents": len(tool_call_id) * 7}


class Tools:
    """``transfer`` (irreversible), ``send_sms`` (costly), ``refresh`` (reversible), sync and async.

    Each body records a real execution in ``history`` and then calls ``during(tool_call_id)`` (a hook:
    wait for a signal, kill a server, cut a link...). ``call()`` runs one call and notes its outcome.
    """

    def __init__(
        self, store: RedisEffectStore, history: History, during: Callable[[str], None] = lambda _: None
    ) -> None:
        self.store = store
        self.history = history
        # the default lease, without waiting: a retry that finds an attempt's record still leased
        # (its commit never got through) is refused effect_in_progress at once
        self.guard = EffectGuard(store=store, wait_for_running=0)
        self.sync: dict[str, Callable[..., Any]] = {}
        self.asynchronous: dict[str, Callable[..., Any]] = {}
        tags: dict[str, ReversibilityName] = {
            "transfer": "irreversible",
            "send_sms": "costly",
            "refresh": "reversible",
        }
        for name, tag in tags.items():
            self.sync[name], self.asynchronous[name] = self._make(name, tag, during)

    def _make(
        self, name: str, tag: ReversibilityName, during: Callable[[str], None]
    ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        history = self.history

        def body(account: str, cents: int) -> dict[str, Any]:
            context = current_call_context()
            assert context is not None
            tool_call_id = str(context.tool_call_id)
            nonce = history.ran(tool_call_id, name)
            during(tool_call_id)
            return {"id": tool_call_id, "call": nonce, "account": account, "cents": cents}

        async def abody(account: str, cents: int) -> dict[str, Any]:
            await asyncio.sleep(0)
            return body(account, cents)

        sync_tool = reversibility(tag)(body)
        async_tool = reversibility(tag)(abody)
        return self.guard.wrap(sync_tool, name=name), self.guard.wrap(async_tool, name=name)

    def call(
        self, tool_call_id: str, *, tool: str = "transfer", kind: str = "sync", phase: str = "first"
    ) -> Outcome:
        outcome = self._outcome(tool_call_id, tool, kind, phase)
        self.history.note(outcome)
        return outcome

    async def acall(self, tool_call_id: str, *, tool: str = "transfer", phase: str = "first") -> Outcome:
        nonce = secrets.token_hex(8)
        token = _CALL.set(nonce)
        try:
            with tool_call_context(tool_call_id):
                value = await self.asynchronous[tool](**args_for(tool_call_id))
        except EffectRefused as refused:
            outcome = Outcome(tool_call_id, tool, phase, f"refused:{refused.reason}", str(refused)[:200])
        except Exception as exc:
            outcome = Outcome(tool_call_id, tool, phase, f"error:{type(exc).__name__}", str(exc)[:200])
        else:
            outcome = Outcome(tool_call_id, tool, phase, "executed" if value["call"] == nonce else "replayed")
        finally:
            _CALL.reset(token)
        self.history.note(outcome)
        return outcome

    def _outcome(self, tool_call_id: str, tool: str, kind: str, phase: str) -> Outcome:
        if kind == "async":

            async def one() -> Outcome:
                nonce = secrets.token_hex(8)
                token = _CALL.set(nonce)
                try:
                    with tool_call_context(tool_call_id):
                        value = await self.asynchronous[tool](**args_for(tool_call_id))
                    return _classified(tool_call_id, tool, phase, value, nonce)
                finally:
                    _CALL.reset(token)

            try:
                return asyncio.run(one())
            except EffectRefused as refused:
                return Outcome(tool_call_id, tool, phase, f"refused:{refused.reason}", str(refused)[:200])
            except Exception as exc:
                return Outcome(tool_call_id, tool, phase, f"error:{type(exc).__name__}", str(exc)[:200])
        nonce = secrets.token_hex(8)
        token = _CALL.set(nonce)
        try:
            with tool_call_context(tool_call_id):
                value = self.sync[tool](**args_for(tool_call_id))
            return _classified(tool_call_id, tool, phase, value, nonce)
        except EffectRefused as refused:
            return Outcome(tool_call_id, tool, phase, f"refused:{refused.reason}", str(refused)[:200])
        except Exception as exc:
            return Outcome(tool_call_id, tool, phase, f"error:{type(exc).__name__}", str(exc)[:200])
        finally:
            _CALL.reset(token)


def _classified(tool_call_id: str, tool: str, phase: str, value: Any, nonce: str) -> Outcome:
    result = "executed" if value["call"] == nonce else "replayed"
    return Outcome(tool_call_id, tool, phase, result)


# -- Cluster and Sentinel helpers ------------------------------------------------------------------
def slots_served_by(cluster: ClusterTopology, node: RedisProcess) -> list[tuple[int, int]]:
    return cluster._slots_of(node)  # the topology's reading of CLUSTER SLOTS


def ids_on_node(
    cluster: ClusterTopology, node: RedisProcess, store: RedisEffectStore, count: int, prefix: str
) -> list[str]:
    """``count`` fresh tool_call_ids whose records live on ``node`` (a primary)."""
    ranges = slots_served_by(cluster, node)
    found: list[str] = []
    for _ in range(count * 200):
        candidate = f"{prefix}-{secrets.token_hex(5)}"
        slot = key_slot(store.key(candidate))
        if any(first <= slot <= last for first, last in ranges):
            found.append(candidate)
            if len(found) == count:
                return found
    raise AssertionError(f"could not find {count} ids on {node.name}")


def wait_cluster_takeover(
    cluster: ClusterTopology,
    old: RedisProcess,
    candidates: list[RedisProcess],
    slot: int,
    timeout: float = 60.0,
) -> RedisProcess:
    """After ``old`` died: wait until one of ``candidates`` (its replicas) serves ``slot`` as a primary."""

    def promoted() -> RedisProcess | None:
        for node in candidates:
            if (
                node.alive
                and cluster.role(node) == "master"
                and any(first <= slot <= last for first, last in slots_served_by(cluster, node))
            ):
                return node
        return None

    return wait_until(
        f"a replica of {old.name} to take over slot {slot}", promoted, timeout, on_fail=cluster.logs()
    )


def wait_synced_replica(
    node: RedisProcess, primary: RedisProcess, timeout: float = 60.0, *, on_fail: str = ""
) -> None:
    """Wait until ``node`` replicates from ``primary`` with its link up (after a restart)."""
    seen: dict[str, Any] = {}

    def synced() -> bool:
        with node.client(socket_timeout=2) as c:
            info = c.info("replication")
        seen.update(info)
        return (
            info.get("role") == "slave"
            and int(info.get("master_port", 0)) == primary.port
            and info.get("master_link_status") == "up"
            and int(info.get("master_sync_in_progress", 1)) == 0
        )

    wait_until(
        f"{node.name} to replicate from {primary.name}",
        synced,
        timeout,
        on_fail=f"last replication info of {node.name}: {seen}\n{on_fail}",
    )


def restore_sentinel_replica(topology: SentinelTopology, old: RedisProcess, new: RedisProcess) -> None:
    """Restart the killed old primary as a replica of the new one, and wait until it has synced: what
    an operator should do with a primary that restarts without persistence (docs/durability.md).

    Two hazards are kept out, each of which empties the deployment and lets retries run once-only
    tools again (tests/test_faults_lagging_sentinel.py and test_faults_unsynced_promotion.py show
    them):

    - it starts as a replica (``--replicaof`` on its command line), never as a master: an empty node
      that answers as a master is one a sentinel whose view lags can make the promoted node follow
      (seen in a CI run of test_sentinel_primary_killed_between_begin_and_commit: every record gone
      after the restore);
    - it starts with ``replica-priority 0`` and gets its priority back only once its first sync has
      landed: until then it is empty, and Sentinel would promote it if the new primary stalled."""
    start_returning_replica(old, new)
    finish_returning_replica(topology, old, new)


def start_returning_replica(old: RedisProcess, new: RedisProcess) -> None:
    """The first half of :func:`restore_sentinel_replica`: start ``old`` as a replica of ``new`` that
    no sentinel may promote."""
    _set_arg(old.args, "--replicaof", HOST, str(new.port))
    _set_arg(old.args, "--replica-priority", "0")
    old.start()


def finish_returning_replica(topology: SentinelTopology, old: RedisProcess, new: RedisProcess) -> None:
    """The second half: wait until ``old`` has synced from ``new``, then make it promotable again.

    The sentinels may still reconfigure the returning node while it syncs (their view of it is stale
    for a moment), so the REPLICAOF is repeated, a bounded number of times, until the link holds."""
    for attempt in range(1, 4):
        with old.client() as c:
            c.replicaof(HOST, new.port)
        try:
            wait_synced_replica(old, new, timeout=30.0, on_fail=topology.logs())
            break
        except TopologyError:
            if attempt == 3:
                raise
    _set_arg(old.args, "--replica-priority", "100")  # a later restart keeps the default
    with old.client() as c:
        c.config_set("replica-priority", "100")


def _set_arg(args: list[str], flag: str, *values: str) -> None:
    """Set ``flag values...`` on a server's command line, replacing the one it may have had."""
    if flag in args:
        at = args.index(flag)
        del args[at : at + 1 + len(values)]
    args += [flag, *values]


# -- a store that notes what it sends (the load test's per-id histories) ---------------------------
_ATTEMPT: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "airlock_fault_attempt", default=None
)
_TRACE_CALL: contextvars.ContextVar[int] = contextvars.ContextVar("airlock_fault_trace_call", default=-1)
_TRACE_OP: contextvars.ContextVar[str] = contextvars.ContextVar("airlock_fault_trace_op", default="")
RESENDS: list[dict[str, Any]] = []  # connection-level failures the client's retry policy saw (this process)


def current_attempt() -> tuple[str, int] | None:
    """(owner token, attempt number) of the attempt whose tool body runs now, as its TracedStore's begin
    saw them. The guard shows the body only the idempotency key (``current_idempotency_key()``); the
    token and attempt live in its BeginRequest and Started, so the harness reads them at the store."""
    return _ATTEMPT.get()


class TracedStore(RedisEffectStore):
    """A RedisEffectStore that notes each begin, durability check, commit and settle: the attempt's owner
    token, what came back (or the error), when it was sent and answered, and the primary it last
    reached (``trace``, one dict per step; ``call`` is the caller's number from :func:`traced_call`)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.trace: list[dict[str, Any]] = []

    def _where(self, tool_call_id: str) -> str:
        try:
            client: Any = self._client
            with contextlib.suppress(RuntimeError):
                if asyncio.get_running_loop() in self.async_client_loops:
                    client = self.async_client()
            pool = getattr(client, "connection_pool", None)
            address = getattr(pool, "master_address", None)
            if address is None and client is not None and hasattr(client, "get_node_from_key"):
                node = client.get_node_from_key(self.key(tool_call_id))
                address = node.name if node is not None else None
            return str(address) if address is not None else ""
        except Exception:
            return ""

    def _note(  # noqa: PLR0917
        self,
        op: str,
        request: BeginRequest,
        sent: float,
        result: str,
        attempt: int | None = None,
        detail: str = "",
    ) -> None:
        self.trace.append(
            {
                "call": _TRACE_CALL.get(),
                "id": request.tool_call_id,
                "op": op,
                "token": request.token,
                "attempt": attempt,
                "result": result,
                "detail": detail[:300],
                "sent": sent,
                "done": time.time(),
                "where": self._where(request.tool_call_id),
            }
        )

    def _noted_begin(self, request: BeginRequest, sent: float, outcome: BeginOutcome) -> BeginOutcome:
        self._note("begin", request, sent, outcome.kind.value, outcome.attempt)
        if outcome.kind is BeginKind.STARTED:
            _ATTEMPT.set((request.token, outcome.attempt))
        return outcome

    def _failed(self, op: str, request: BeginRequest, sent: float, exc: BaseException) -> None:
        applied = getattr(exc, "maybe_applied", None)
        why = f"{exc} (maybe_applied={applied})"
        self._note(op, request, sent, f"error:{type(exc).__name__}", detail=why)

    def _acks(self, request: BeginRequest) -> str:
        wait = self._replica_wait
        acks = wait._acks.get(request.token) if wait is not None else None
        return "" if acks is None else f"replicas={acks.replicas} aof_local={acks.aof_local}"

    def begin(self, request: BeginRequest) -> BeginOutcome:
        sent, token = time.time(), _TRACE_OP.set("begin")
        try:
            return self._noted_begin(request, sent, super().begin(request))
        except BaseException as exc:
            self._failed("begin", request, sent, exc)
            raise
        finally:
            _TRACE_OP.reset(token)

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        sent, token = time.time(), _TRACE_OP.set("begin")
        try:
            return self._noted_begin(request, sent, await super().abegin(request))
        except BaseException as exc:
            self._failed("begin", request, sent, exc)
            raise
        finally:
            _TRACE_OP.reset(token)

    def ensure_durable(self, request: BeginRequest) -> None:
        sent, acks = time.time(), self._acks(request)
        try:
            super().ensure_durable(request)
        except BaseException as exc:
            self._failed("durable", request, sent, exc)
            raise
        self._note("durable", request, sent, "ok", detail=acks)

    async def aensure_durable(self, request: BeginRequest) -> None:
        sent, acks = time.time(), self._acks(request)
        try:
            await super().aensure_durable(request)
        except BaseException as exc:
            self._failed("durable", request, sent, exc)
            raise
        self._note("durable", request, sent, "ok", detail=acks)

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        sent, token = time.time(), _TRACE_OP.set("commit")
        try:
            result = super().commit(request, attempt, value, mac)
        except BaseException as exc:
            self._failed("commit", request, sent, exc)
            raise
        finally:
            _TRACE_OP.reset(token)
        self._note("commit", request, sent, result.value, attempt)
        return result

    async def acommit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        sent, token = time.time(), _TRACE_OP.set("commit")
        try:
            result = await super().acommit(request, attempt, value, mac)
        except BaseException as exc:
            self._failed("commit", request, sent, exc)
            raise
        finally:
            _TRACE_OP.reset(token)
        self._note("commit", request, sent, result.value, attempt)
        return result

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        op = f"settle:{settlement.value}"
        sent, token = time.time(), _TRACE_OP.set(op)
        try:
            result = super().settle(request, attempt, settlement)
        except BaseException as exc:
            self._failed(op, request, sent, exc)
            raise
        finally:
            _TRACE_OP.reset(token)
        self._note(op, request, sent, result.value, attempt)
        return result

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        op = f"settle:{settlement.value}"
        sent, token = time.time(), _TRACE_OP.set(op)
        try:
            result = await super().asettle(request, attempt, settlement)
        except BaseException as exc:
            self._failed(op, request, sent, exc)
            raise
        finally:
            _TRACE_OP.reset(token)
        self._note(op, request, sent, result.value, attempt)
        return result


def _note_resend(error: Exception, failures: int, retries: int) -> None:
    RESENDS.append(
        {
            "call": _TRACE_CALL.get(),
            "op": _TRACE_OP.get(),
            "at": time.time(),
            "failures": failures,
            "resent": failures <= retries,
            "error": f"{type(error).__name__}: {error}"[:200],
        }
    )


class _TracedRetry(Retry):
    """redis-py's Retry, noting each failure it handles (and so each re-send it makes) in RESENDS."""

    def call_with_retry(
        self,
        do: Callable[[], Any],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> Any:
        def noted(error: Exception, failures: int = 0) -> Any:
            _note_resend(error, failures, self._retries)
            return fail(error, failures) if with_failure_count else fail(error)

        return super().call_with_retry(do, noted, is_retryable, with_failure_count=True)


class _TracedAsyncRetry(AsyncRetry):
    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[Any]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> Any:
        async def noted(error: Exception, failures: int = 0) -> Any:
            _note_resend(error, failures, self._retries)
            return await (fail(error, failures) if with_failure_count else fail(error))

        return await super().call_with_retry(do, noted, is_retryable, with_failure_count=True)


def trace_client_retries() -> None:
    """In this process, make the store's URL-built clients use the noting Retry classes (same policy)."""
    from redis.backoff import ExponentialWithJitterBackoff

    from airlock_redis.stores import tries, url

    base, cap = tries.RETRY_BACKOFF
    errors = [redis.ConnectionError, redis.TimeoutError]

    def sync_options(retries: int = tries.RETRIES) -> dict[str, Any]:
        retry = _TracedRetry(ExponentialWithJitterBackoff(base=base, cap=cap), retries)
        return {"retry": retry, "retry_on_error": errors}

    def async_options(retries: int = tries.RETRIES) -> dict[str, Any]:
        retry = _TracedAsyncRetry(ExponentialWithJitterBackoff(base=base, cap=cap), retries)
        return {"retry": retry, "retry_on_error": errors}

    url.retry_options = sync_options
    url.async_retry_options = async_options


# -- the load worker (runs in a spawned process) ---------------------------------------------------
def load_worker(  # noqa: PLR0917 - multiprocessing passes positional arguments
    url: str,
    namespace: str,
    worker: int,
    workers: int,
    go: Any,
    stop: Any,
    max_seconds: float,
    seed: int,
    out: str,
) -> None:
    """Call mixed tools until ``stop`` is set (or ``max_seconds`` passed); 20% are duplicate retries.

    A duplicate retry reuses an id this or another worker made or will make (same tool, same arguments).
    Written to ``out`` (JSON) for the parent to check (see tests/load_history.py): every real execution
    (its call, sync or async, first or duplicate, owner token and attempt), every call's outcome, every
    store step (TracedStore.trace) and every connection failure the client's retry policy handled.
    """
    rng = random.Random(seed)
    trace_client_retries()
    store = TracedStore(
        url,
        namespace=namespace,
        wait_replicas=1,
        wait_timeout=1.0,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
    )
    history = History()
    executions: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    current: dict[str, Any] = {}

    def during(tool_call_id: str) -> None:
        token, attempt = current_attempt() or ("", 0)
        executions.append(
            {
                **current,
                "id": tool_call_id,
                "tool": history.tool_of[tool_call_id],
                "at": time.time(),
                "token": token,
                "attempt": attempt,
                "key": current_idempotency_key() or "",
            }
        )

    tools = Tools(store, history, during)
    asynchronous = worker % 2 == 1
    made = 0
    go.wait(timeout=120)
    deadline = time.monotonic() + max_seconds
    loop = asyncio.new_event_loop() if asynchronous else None
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            if made and rng.random() < 0.2:
                other = rng.randrange(workers)
                seq = rng.randrange(max(1, made))
                tool = TOOLS[(other + seq) % 3]
                tool_call_id, phase = f"{tool}:{other}:{seq}", "duplicate"
            else:
                tool = TOOLS[(worker + made) % 3]
                tool_call_id, phase = f"{tool}:{worker}:{made}", "first"
                made += 1
            kind = "async" if loop is not None else "sync"
            current.update(call=len(calls), worker=worker, pid=os.getpid(), kind=kind, phase=phase)
            numbered = _TRACE_CALL.set(len(calls))
            _ATTEMPT.set(None)
            started = time.time()
            try:
                if loop is not None:
                    outcome = loop.run_until_complete(tools.acall(tool_call_id, tool=tool, phase=phase))
                else:
                    outcome = tools.call(tool_call_id, tool=tool, phase=phase)
            finally:
                _TRACE_CALL.reset(numbered)
            calls.append(
                {
                    **current,
                    "id": tool_call_id,
                    "tool": tool,
                    "result": outcome.result,
                    "detail": outcome.detail,
                    "started": started,
                    "ended": time.time(),
                }
            )
    finally:
        if loop is not None:
            loop.run_until_complete(store.aclose())
            loop.close()
        store.close()
    report = {
        "worker": worker,
        "pid": os.getpid(),
        "executions": executions,
        "outcomes": calls,
        "store": store.trace,
        "resends": RESENDS,
    }
    Path(out).write_text(json.dumps(report))
