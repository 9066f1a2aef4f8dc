"""Shared helpers of the fault tests: a chaos TCP proxy, a history of real executions, a load worker.

- :class:`ChaosProxy`: a relay on 127.0.0.1 in front of a redis-server (unix socket or host:port) that
  applies :class:`Fault` rules to the Nth request matching a predicate: drop its reply, drop the request
  itself, or cut the connection before or after the server ran it. ``cut_all()`` cuts every live
  connection at once (a link that dies while the tool runs).
- :class:`History`: every real execution of a tool body per tool_call_id, and every call's outcome
  (executed, replayed, refused with a reason, error). ``summary()``/``report()`` print what was measured.
- :class:`Tools`: guarded tools (irreversible ``transfer``, costly ``send_sms``, reversible ``refresh``),
  sync and async, whose bodies write to a History.
- :func:`load_worker`: one process of the load test (module level, so ``spawn`` can import it).
- Cluster and Sentinel helpers for failovers: ids whose records live on one node, waits for a take-over.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import json
import os
import random
import secrets
import socket
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from redis.crc import key_slot

from airlock_redis import (
    EffectGuard,
    EffectRefused,
    RedisEffectStore,
    current_call_context,
    reversibility,
    tool_call_context,
)
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


@dataclass
class Fault:
    """Apply ``action`` to matching requests number ``nth`` .. ``nth + times - 1`` (counted from 1)."""

    match: Callable[[list[bytes]], bool]
    action: Action
    nth: int = 1
    times: int = 1
    seen: int = 0
    applied: int = 0


@dataclass
class _Link:
    client: socket.socket
    upstream: socket.socket
    silent: threading.Event = field(default_factory=threading.Event)  # replies are swallowed
    blackhole: bool = False  # requests are swallowed too
    cut_on_reply: bool = False


class ChaosProxy:
    """A TCP relay to one redis-server that loses, drops or cuts chosen requests (see :class:`Fault`)."""

    def __init__(self, upstream: str | Path | tuple[str, int], faults: Iterable[Fault] = ()) -> None:
        self.upstream = upstream
        self.faults = list(faults)
        self.events: list[tuple[str, str]] = []  # (action, command) of every fault applied
        self.forwarded: Counter[str] = Counter()  # requests that reached the server, by command
        self._lock = threading.Lock()
        self._links: list[_Link] = []
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
        with self._lock:
            for fault in self.faults:
                if not fault.match(args):
                    continue
                fault.seen += 1
                if fault.nth <= fault.seen < fault.nth + fault.times:
                    fault.applied += 1
                    self.events.append((fault.action.value, args[0].decode(errors="replace").upper()))
                    return fault.action
        return None

    def _requests(self, link: _Link) -> None:
        buffer = b""
        while True:
            try:
                chunk = link.client.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                _close(link.upstream)
                return
            buffer += chunk
            while (parsed := parse_request(buffer)) is not None:
                args, size = parsed
                raw, buffer = buffer[:size], buffer[size:]
                if link.blackhole:
                    continue
                action = self._verdict(args)
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
                return
            if link.silent.is_set():
                continue
            try:
                link.client.sendall(chunk)
            except OSError:
                return

    def start(self) -> ChaosProxy:
        self._spawn(self._accept)
        return self

    def close(self) -> None:
        self._closing.set()
        _close(self._listener)
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
        self.guard = EffectGuard(store=store)
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
    """Restart the killed old primary as a replica of the new one (what the sentinels would tell it,
    seconds later: they convert a returning old primary only after their next checks).

    The sentinels may still reconfigure the returning node while it syncs (their view of it is stale
    for a moment), so the REPLICAOF is repeated, a bounded number of times, until the link holds."""
    old.start()
    for attempt in range(1, 4):
        with old.client() as c:
            c.replicaof(HOST, new.port)
        try:
            wait_synced_replica(old, new, timeout=30.0, on_fail=topology.logs())
            return
        except TopologyError:
            if attempt == 3:
                raise


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

    A duplicate retry reuses an id this or another worker made (same tool, same arguments). Every real
    execution and every outcome is written to ``out`` (JSON) for the parent to check.
    """
    rng = random.Random(seed)
    store = RedisEffectStore(
        url,
        namespace=namespace,
        wait_replicas=1,
        wait_timeout=1.0,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
    )
    history = History()
    executions: list[tuple[str, str, float]] = []

    def during(tool_call_id: str) -> None:
        executions.append((tool_call_id, history.tool_of[tool_call_id], time.time()))

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
            if loop is not None:
                loop.run_until_complete(tools.acall(tool_call_id, tool=tool, phase=phase))
            else:
                tools.call(tool_call_id, tool=tool, phase=phase)
    finally:
        if loop is not None:
            loop.run_until_complete(store.aclose())
            loop.close()
        store.close()
    outcomes = [[o.tool_call_id, o.tool, o.phase, o.result, o.detail] for o in history.outcomes]
    Path(out).write_text(json.dumps({"pid": os.getpid(), "executions": executions, "outcomes": outcomes}))
