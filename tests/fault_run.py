"""A randomized fault run, in the manner of Jepsen: a workload, a seeded nemesis, and a checker.

- The workload: ``workers`` spawned processes make guarded calls, sync and async, of an irreversible
  (``transfer``), a costly (``send_sms``) and a reversible (``refresh``) tool, with and without
  ``wait_replicas``, through stores with and without ``write_behind`` (one configuration per
  tool_call_id; a write-behind commit is noted ``queued`` and its landing apart, see
  :class:`RecordingStore`), a quarter of them retries of earlier ids (any
  worker's), and an immediate retry after half the refusals and errors. A tool body sleeps a few
  milliseconds (so that faults land mid-call), and raises a plain error (released) or an ambiguous one
  (unknown) now and then. Every call, execution and store step is written as it happens (JSON lines).
- The nemesis (:class:`SingleNemesis`, :class:`SentinelNemesis`, :class:`ClusterNemesis`): draws faults
  from the topology's menu with ``random.Random(seed)``; each fault's parameters come from its own
  seeded generator, so a seed replays the same fault schedule (the interleaving with the calls differs).
  Every fault is healed with the harness's safe restore before the next one is drawn.
- Afterwards: the deployment is healed, every id is retried once (the final sweep), the records are
  read, and :func:`tests.history_checker.check` names every violation. A failing run's history, records,
  verdict and server logs are saved (:func:`save`).

``run(RunConfig(...))`` does it all and returns a :class:`RunResult`; tests/test_fault_run.py and
``python -m benchmarks.fault_run`` call it. Menu, rules and replay: docs/faults.md ("The fault run").
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import multiprocessing
import os
import random
import shutil
import socket
import tempfile
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from airlock_redis import EffectGuard, EffectRefused, RedisEffectStore, reversibility, tool_call_context
from airlock_redis.context import current_call_context
from airlock_redis.core.codec import decode_result
from airlock_redis.core.records import BeginOutcome, BeginRequest, Settlement, TransitionResult
from airlock_redis.core.reversibility import ReversibilityName
from airlock_redis.stores.write_behind import WriteBehindOutcome
from tests import history_checker
from tests.faults import (
    Action,
    ChaosProxy,
    Fault,
    args_for,
    finish_returning_replica,
    restore_sentinel_replica,
    slots_served_by,
    wait_cluster_takeover,
    wait_synced_replica,
)
from tests.procs import close_socket
from tests.topologies import (
    HOST,
    ClusterTopology,
    RedisProcess,
    SentinelTopology,
    TopologyError,
    free_ports,
    identify_server,
    redis_binary,
    wait_until,
)

TOPOLOGIES = ("single", "sentinel", "cluster")
TAGS: dict[str, ReversibilityName] = {
    "transfer": "irreversible",
    "send_sms": "costly",
    "refresh": "reversible",
}
TOOLS = tuple(TAGS)
SEED_ENV = "AIRLOCK_FAULT_SEED"
T = TypeVar("T")
MAX_CALLS_PER_WORKER = 50_000
# a share of a worker's draws is a burst: async calls made at once on one loop, so that their commands
# share the store's auto-pipeline (some ids twice in one burst)
BURST_SHARE = 0.2
WORKER_GRACE = 60.0  # a worker stops by itself this long after its planned end, whatever happens
SWEEP_IDS = 400  # ids retried once after the run (a sample when there are more)
FLUSH_AFTER_BURST = 5.0  # at most this long the worker's loop runs on for a burst's write-behind writes

_CALL_KEY: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar(
    "fault_run_call", default=(-1, -1)
)
_NONCE: contextvars.ContextVar[str] = contextvars.ContextVar("fault_run_nonce", default="")


# -- a store that writes down each step it takes ---------------------------------------------------
# Leases short enough to lapse within a run (a failover, a paused server), so that abandoned records
# and waits for running attempts happen, and a wait short enough not to stall a worker for long.
GUARD_OPTIONS: dict[str, Any] = {"lease": 1.0, "renew_every": 0.25, "wait_for_running": 0.5}


class RecordingStore(RedisEffectStore):
    """A RedisEffectStore that notes every begin, durability check, commit and settle of the current
    call (``steps``: the checker's ``store`` events), through the store's public operations only.

    With ``write_behind=True`` a commit (and a settle to unknown) answers OK as soon as it is queued:
    it is noted with the result ``queued``, never ``ok`` (the checker must not take it for a confirmed
    commit), and when the store's sender lands it or gives it up, a ``commit:landed`` (or
    ``settle:unknown:landed``) step is noted with the answer the server gave (``ok``, ``superseded``,
    ...) or ``error:<type>``, as the store's public listener
    (``add_write_behind_listener``) reports it."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.steps: list[dict[str, Any]] = []
        self._steps_lock = threading.Lock()  # the write-behind sender notes landings from its thread
        self.add_write_behind_listener(self._write_behind_done)

    def take_steps(self) -> list[dict[str, Any]]:
        """The steps noted so far (and forgotten here)."""
        with self._steps_lock:
            steps, self.steps = self.steps, []
        return steps

    def _add_step(self, step: dict[str, Any]) -> None:
        with self._steps_lock:
            self.steps.append(step)

    def _queued(self, op: str, request: BeginRequest, sent: float) -> None:
        """Before a write-behind write is handed to the store: where to note its landing."""
        w, n = _CALL_KEY.get()
        with _BEHIND_LOCK:
            _BEHIND_WRITES[request.token, op] = (self, w, n, request.tool_call_id, sent)

    def _write_behind_done(self, outcome: WriteBehindOutcome) -> None:
        """The store's listener: a queued write landed or was given up (called before anyone waiting
        for it hears it, so the time noted is no later than what they see)."""
        at = time.time()
        op = _BEHIND_WHAT.get(outcome.what, "")
        if outcome.result is not None:
            self._behind_done(op, outcome.request, outcome.result.value, "", at)
        else:
            error = outcome.error
            name = type(error).__name__
            self._behind_done(op, outcome.request, f"error:{name}", f"{name}: {error}", at)

    def _behind_done(self, op: str, request: BeginRequest, result: str, detail: str, at: float = 0.0) -> None:
        with _BEHIND_LOCK:
            found = _BEHIND_WRITES.pop((request.token, op), None)
        if found is None or not result:  # not queued after all (it raised): nothing will land
            return
        _, w, n, tool_call_id, sent = found
        step: dict[str, Any] = {
            "type": "store",
            "w": w,
            "n": n,
            "id": tool_call_id,
            "op": f"{op}:landed",
            "result": result,
            "sent": sent,
            "done": at,
        }
        if detail:
            step["detail"] = detail[:300]
        self._add_step(step)

    def _note(  # noqa: PLR0917
        self,
        op: str,
        request: BeginRequest,
        sent: float,
        result: str,
        error: BaseException | None,
        answer: Any = None,
    ) -> None:
        w, n = _CALL_KEY.get()
        step: dict[str, Any] = {
            "type": "store",
            "w": w,
            "n": n,
            "id": request.tool_call_id,
            "op": op,
            "result": result,
            "sent": sent,
            "done": time.time(),
        }
        if isinstance(answer, BeginOutcome):
            step["attempt"] = answer.attempt
        if error is not None:
            step["maybe_applied"] = getattr(error, "maybe_applied", None)
            step["detail"] = f"{type(error).__name__}: {error}"[:300]
        elif self.write_behind and op in _BEHIND_OPS and result == "ok":
            step["result"] = "queued"  # OK at once: only queued (its landing is noted apart)
        self._add_step(step)

    def _sync(self, op: str, request: BeginRequest, do: Callable[[], T]) -> T:
        sent = time.time()
        if self.write_behind and op in _BEHIND_OPS:
            self._queued(op, request, sent)
        try:
            answer = do()
        except BaseException as exc:
            self._behind_done(op, request, "", "")  # not queued: nothing will land
            self._note(op, request, sent, f"error:{type(exc).__name__}", exc)
            raise
        self._note(op, request, sent, _answer(answer), None, answer)
        return answer

    async def _async(self, op: str, request: BeginRequest, do: Callable[[], Awaitable[T]]) -> T:
        sent = time.time()
        if self.write_behind and op in _BEHIND_OPS:
            self._queued(op, request, sent)
        try:
            answer = await do()
        except BaseException as exc:
            self._behind_done(op, request, "", "")
            self._note(op, request, sent, f"error:{type(exc).__name__}", exc)
            raise
        self._note(op, request, sent, _answer(answer), None, answer)
        return answer

    def begin(self, request: BeginRequest) -> BeginOutcome:
        return self._sync("begin", request, lambda: super(RecordingStore, self).begin(request))

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        return await self._async("begin", request, lambda: super(RecordingStore, self).abegin(request))

    def ensure_durable(self, request: BeginRequest) -> None:
        self._sync("durable", request, lambda: super(RecordingStore, self).ensure_durable(request))

    async def aensure_durable(self, request: BeginRequest) -> None:
        await self._async("durable", request, lambda: super(RecordingStore, self).aensure_durable(request))

    def commit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        return self._sync(
            "commit", request, lambda: super(RecordingStore, self).commit(request, attempt, value, mac)
        )

    async def acommit(
        self, request: BeginRequest, attempt: int, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        return await self._async(
            "commit", request, lambda: super(RecordingStore, self).acommit(request, attempt, value, mac)
        )

    def settle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        return self._sync(
            f"settle:{settlement.value}",
            request,
            lambda: super(RecordingStore, self).settle(request, attempt, settlement),
        )

    async def asettle(self, request: BeginRequest, attempt: int, settlement: Settlement) -> TransitionResult:
        return await self._async(
            f"settle:{settlement.value}",
            request,
            lambda: super(RecordingStore, self).asettle(request, attempt, settlement),
        )


# what a write-behind store queues (a release is always sent and waited for)
_BEHIND_OPS = ("commit", "settle:unknown")
_BEHIND_WHAT = {"commit": "commit", "settle to unknown": "settle:unknown"}
# write-behind writes queued and not landed yet: (attempt token, op) -> (store, w, n, id, when queued)
_BEHIND_WRITES: dict[tuple[str, str], tuple[RecordingStore, int, int, str, float]] = {}
_BEHIND_LOCK = threading.Lock()


def _answer(answer: Any) -> str:
    if isinstance(answer, BeginOutcome):
        return str(answer.kind.value)
    if isinstance(answer, TransitionResult):
        return str(answer.value)
    return "ok"


# -- the workload --------------------------------------------------------------------------------
Sink = Callable[[dict[str, Any]], None]


def random_ending(rng: random.Random) -> Callable[[str], str]:
    """Most executions return; 6% raise a plain error (released), 4% an ambiguous one (unknown)."""

    def ending(_tool_call_id: str) -> str:
        x = rng.random()
        return "plain" if x < 0.06 else "ambiguous" if x < 0.10 else "ok"

    return ending


Setup = tuple[int, bool]  # a store's (wait_replicas, write_behind)


def _setup(key: int | Setup) -> Setup:
    return (key, False) if isinstance(key, int) else (int(key[0]), bool(key[1]))


class Workload:
    """Guarded calls of the three tools, sync and async, through one store per setup (its
    ``wait_replicas``, and whether it is ``write_behind``: keys ``(wait, write_behind)``, or a bare
    wait for a store without write-behind); every call, execution and store step goes to ``sink``."""

    def __init__(  # noqa: PLR0917
        self,
        worker: int,
        stores: Mapping[int, RecordingStore] | Mapping[Setup, RecordingStore],
        replicas: int,
        sink: Sink,
        ending: Callable[[str], str],
        nap: Callable[[], float] = lambda: 0.0,
        wait_for: Callable[[str], int] | Callable[[str], Setup] | None = None,
    ) -> None:
        self.worker = worker
        self._wait_for = wait_for
        self.stores: dict[Setup, RecordingStore] = {_setup(key): store for key, store in stores.items()}
        self.replicas = replicas  # replicas per primary: a wait of at least this covers every one
        self.sink = sink
        self.ending = ending
        self.nap = nap
        self.calls = 0
        self.tools = {setup: self._tools(store) for setup, store in self.stores.items()}
        self._loop: asyncio.AbstractEventLoop | None = None

    def setup_of(self, tool_call_id: str) -> Setup:
        """The id's own store setup (every attempt of one id uses the same)."""
        if self._wait_for is not None:
            return _setup(self._wait_for(tool_call_id))
        setups = sorted(self.stores)
        return setups[zlib.crc32(tool_call_id.encode()) % len(setups)]

    def wait_of(self, tool_call_id: str) -> int:
        """The id's own ``wait_replicas``."""
        return self.setup_of(tool_call_id)[0]

    def _tools(self, store: RecordingStore) -> dict[tuple[str, str], Callable[..., Any]]:
        guard = EffectGuard(store=store, **GUARD_OPTIONS)
        made: dict[tuple[str, str], Callable[..., Any]] = {}
        for name, tag in TAGS.items():
            sync_body, async_body = self._bodies(name)
            made[name, "sync"] = guard.wrap(reversibility(tag)(sync_body), name=name)
            made[name, "async"] = guard.wrap(reversibility(tag)(async_body), name=name)
        return made

    def _bodies(self, tool: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        def effect(account: str, cents: int) -> tuple[dict[str, Any], str]:
            context = current_call_context()
            tool_call_id = str(context.tool_call_id) if context is not None else "?"
            w, n = _CALL_KEY.get()
            nonce = _NONCE.get()
            ending = self.ending(tool_call_id)
            at = time.time()
            self.sink(
                {
                    "type": "exec",
                    "w": w,
                    "n": n,
                    "id": tool_call_id,
                    "tool": tool,
                    "at": at,
                    "nonce": nonce,
                    "ending": ending,
                }
            )
            return {"call": nonce, "id": tool_call_id, "account": account, "cents": cents}, ending

        def finish(value: dict[str, Any], ending: str) -> dict[str, Any]:
            if ending == "plain":
                raise ValueError("the backend refused the request: no effect")
            if ending == "ambiguous":
                raise TimeoutError("the backend did not answer: the effect is in doubt")
            return value

        def body(account: str, cents: int) -> dict[str, Any]:
            value, ending = effect(account, cents)
            if (pause := self.nap()) > 0:
                time.sleep(pause)
            return finish(value, ending)

        async def abody(account: str, cents: int) -> dict[str, Any]:
            value, ending = effect(account, cents)
            await asyncio.sleep(self.nap())
            return finish(value, ending)

        return body, abody

    def call(self, tool_call_id: str, kind: str = "sync") -> dict[str, Any]:
        """One guarded call; returns (and sinks) its ``call`` event."""
        if kind == "async":
            return self.burst([tool_call_id])[0]
        event, fn, keys = self._starting(tool_call_id, kind)
        try:
            with tool_call_context(tool_call_id):
                self._outcome(event, fn(**args_for(tool_call_id)))
        except BaseException as exc:
            self._outcome(event, exc)
        finally:
            self._ended(event, keys)
        self._sink_steps()
        return event

    def burst(self, tool_call_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Async guarded calls made at once on one event loop (so their commands share the store's
        auto-pipeline); returns (and sinks) their ``call`` events, in order."""

        async def one(tool_call_id: str) -> dict[str, Any]:
            event, fn, keys = self._starting(tool_call_id, "async")
            event["burst"] = len(tool_call_ids)
            try:
                self._outcome(event, await _acall(fn, tool_call_id))
            except BaseException as exc:
                self._outcome(event, exc)
            finally:
                self._ended(event, keys)
            return event

        async def every() -> list[dict[str, Any]]:
            return list(await asyncio.gather(*(one(i) for i in tool_call_ids)))

        loop = self._async_loop()
        events = loop.run_until_complete(every())
        # the loop runs only during these calls here, and its write-behind sender with it: keep it
        # running until what the burst queued has landed, as a host's loop that never stops would
        for setup, store in self.stores.items():
            if setup[1]:
                loop.run_until_complete(store.aflush(FLUSH_AFTER_BURST))
        self._sink_steps()
        return events

    def _starting(self, tool_call_id: str, kind: str) -> tuple[dict[str, Any], Any, tuple[Any, Any]]:
        tool = tool_call_id.split(":", 1)[0]
        setup = self.setup_of(tool_call_id)
        wait, behind = setup
        fn = self.tools[setup][tool, kind]
        n = self.calls
        self.calls += 1
        nonce = os.urandom(8).hex()
        keys = _CALL_KEY.set((self.worker, n)), _NONCE.set(nonce)
        event: dict[str, Any] = {
            "type": "call",
            "w": self.worker,
            "n": n,
            "id": tool_call_id,
            "tool": tool,
            "kind": kind,
            "wait": wait,
            "covers": wait >= self.replicas > 0,
            "behind": behind,
            "nonce": nonce,
            "started": time.time(),
        }
        return event, fn, keys

    @staticmethod
    def _outcome(event: dict[str, Any], value: Any) -> None:
        if isinstance(value, EffectRefused):
            event.update(result=f"refused:{value.reason}", detail=str(value)[:300])
        elif isinstance(value, Exception):
            event.update(result=f"error:{type(value).__name__}", detail=str(value)[:300])
        elif isinstance(value, BaseException):
            raise value
        else:
            event["value_call"] = value["call"]
            event["result"] = "executed" if value["call"] == event["nonce"] else "replayed"

    def _ended(self, event: dict[str, Any], keys: tuple[Any, Any]) -> None:
        _CALL_KEY.reset(keys[0])
        _NONCE.reset(keys[1])
        event["ended"] = time.time()
        self.sink(event)

    def _sink_steps(self) -> None:
        for store in self.stores.values():
            for step in store.take_steps():
                self.sink(step)

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def close(self) -> None:
        for store in self.stores.values():
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.run_until_complete(store.aclose())
            with contextlib.suppress(Exception):
                store.close()
        self._sink_steps()  # the landings of the write-behind writes the closes flushed
        if self._loop is not None:
            self._loop.close()
            self._loop = None


async def _acall(fn: Callable[..., Any], tool_call_id: str) -> Any:
    with tool_call_context(tool_call_id):
        return await fn(**args_for(tool_call_id))


@dataclass(frozen=True)
class WorkerPlan:
    url: str
    namespace: str
    worker: int
    workers: int
    seed: int
    seconds: float
    waits: tuple[int, ...]
    replicas: int
    out: str
    store_class: str = "tests.fault_run:RecordingStore"
    write_behind: tuple[bool, ...] = (False, True)  # one store per wait and per choice here


def store_class(dotted: str) -> type[RecordingStore]:
    module, _, name = dotted.partition(":")
    found = getattr(__import__(module, fromlist=[name]), name)
    assert isinstance(found, type) and issubclass(found, RecordingStore)
    return found


def make_stores(plan: WorkerPlan) -> dict[Setup, RecordingStore]:
    """One store per ``wait_replicas`` and write-behind choice (an id keeps one: Workload.setup_of)."""
    cls = store_class(plan.store_class)
    return {
        (wait, behind): cls(
            plan.url,
            namespace=plan.namespace,
            wait_replicas=wait,
            wait_timeout=0.5,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            write_behind=behind,
        )
        for wait in plan.waits
        for behind in plan.write_behind
    }


def worker_main(plan: WorkerPlan, go: Any, stop: Any) -> None:
    """One workload process (module level, so ``spawn`` can import it). Stops on ``stop``, after its
    seconds plus WORKER_GRACE, or after MAX_CALLS_PER_WORKER calls."""
    rng = random.Random(f"{plan.seed}:worker:{plan.worker}")
    handler = logging.FileHandler(f"{plan.out}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    product_log = logging.getLogger("airlock_redis")
    product_log.addHandler(handler)
    product_log.propagate = False  # the guard's warnings go to worker-N.jsonl.log, not the terminal
    with open(plan.out, "a", buffering=1) as out:

        def sink(event: dict[str, Any]) -> None:
            out.write(json.dumps(event) + "\n")

        workload = Workload(
            plan.worker,
            make_stores(plan),
            plan.replicas,
            sink,
            random_ending(rng),
            lambda: rng.uniform(0.0, 0.015),
        )
        go.wait(timeout=120)
        deadline = time.monotonic() + plan.seconds + WORKER_GRACE
        made = 0
        again: str | None = None
        try:
            while not stop.is_set() and time.monotonic() < deadline and workload.calls < MAX_CALLS_PER_WORKER:
                if again is not None and rng.random() < 0.5:
                    tool_call_id = again
                elif made and rng.random() < 0.25:
                    other, seq = rng.randrange(plan.workers), rng.randrange(made)
                    tool_call_id = f"{TOOLS[(other + seq) % 3]}:{other}:{seq}"
                else:
                    tool_call_id = f"{TOOLS[(plan.worker + made) % 3]}:{plan.worker}:{made}"
                    made += 1
                draw = rng.random()
                if draw < BURST_SHARE:  # this id and others at once, some of them twice
                    others = [
                        f"{TOOLS[(plan.worker + made + k) % 3]}:{plan.worker}:{made + k}" for k in range(3)
                    ]
                    made += len(others)
                    burst = [tool_call_id, *others, *rng.sample([tool_call_id, *others], 2)]
                    events = workload.burst(burst)
                else:
                    events = [workload.call(tool_call_id, "async" if draw < 0.5 else "sync")]
                failed = [e for e in events if str(e["result"]).startswith(("refused:store", "error"))]
                again = str(failed[0]["id"]) if failed else None
                if any(str(e["result"]).startswith("refused:store") for e in events):
                    time.sleep(rng.uniform(0.005, 0.05))  # a client's backoff: no tight loop in an outage
        finally:
            workload.close()


# -- the chaos proxy, with delays and a listener that can refuse connections -----------------------
class FaultProxy(ChaosProxy):
    """:class:`~tests.faults.ChaosProxy` plus :meth:`hold` (every request held on its way,
    ``Action.DELAY``: it still lands if its sender gave up meanwhile) and :meth:`refuse` /
    :meth:`reopen` (the port refuses new connections meanwhile)."""

    def hold(self, delay: float) -> None:
        """From now on, every request reaches the server ``delay`` seconds late (until ``faults`` is
        emptied; a connection that held one keeps its order afterwards)."""
        self.faults = [Fault(bool, Action.DELAY, times=10**9, delay=delay)]

    def refuse(self) -> None:
        close_socket(self._listener)

    def reopen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        self._listener = listener
        self._spawn(self._accept)


LOSSES = (Action.DROP_REPLY, Action.DROP_REQUEST, Action.CUT_BEFORE, Action.CUT_AFTER)


def _any_of(names: tuple[str, ...], rng: random.Random, share: float) -> Callable[[list[bytes]], bool]:
    wanted = {n.encode() for n in names}
    lock = threading.Lock()

    def match(args: list[bytes]) -> bool:
        if not args or (wanted and args[0].upper() not in wanted):
            return False
        with lock:
            return rng.random() < share

    return match


# -- the nemesis ---------------------------------------------------------------------------------
@dataclass
class FaultEvent:
    name: str
    start: float
    end: float = 0.0
    target: str = ""
    detail: str = ""
    loses: bool = False
    error: str = ""

    def as_event(self) -> dict[str, Any]:
        return {"type": "fault", **asdict(self)}


MENUS: dict[str, tuple[str, ...]] = {
    "single": (
        "client_kill",
        "kill9_restart",
        "lost_begin_reply_oom",
        "lost_begin_reply_refused",
        "maxmemory",
        "pause_server",
        "proxy_cut_all",
        "proxy_delay",
        "proxy_lose",
        "restart_while_delayed",
        "script_flush",
        "script_flush_while_delayed",
    ),
    "sentinel": (
        "client_kill",
        "demoted_primary_answers",
        "kill9_primary",
        "kill9_replica",
        "kill9_sentinel",
        "maxmemory",
        "oom_while_replica_paused",
        "pause_primary_short",
        "pause_replica",
        "pause_sentinel",
        "script_flush",
        "sentinel_failover",
    ),
    "cluster": (
        "client_kill",
        "cluster_failover",
        "demoted_primary_answers",
        "kill9_primary_mid_call",
        "kill9_replica",
        "maxmemory",
        "oom_while_replica_paused",
        "pause_replica",
        "script_flush",
        "slot_migration",
    ),
}


def fault_schedule(topology: str, seed: int, count: int, only: tuple[str, ...] = ()) -> list[str]:
    """The first ``count`` faults the seed draws for ``topology`` (what :meth:`Nemesis.schedule`
    yields, without a deployment): a seed always draws the same ones."""
    rng = random.Random(f"{seed}:nemesis")
    names = sorted(n for n in MENUS[topology] if not only or n in only)
    return [rng.choice(names) for _ in range(count)]


class Nemesis:
    """Draws faults with ``random.Random(seed)`` and applies them one at a time, each healed before the
    next. Subclasses give ``menu`` (fault name -> method taking the fault's own generator) and
    ``heal_all`` / ``settle``."""

    menu: dict[str, Callable[[random.Random], FaultEvent]]

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(f"{seed}:nemesis")
        self.faults: list[FaultEvent] = []
        self.paused: set[RedisProcess] = set()
        self.error = ""
        self.only: tuple[str, ...] = ()  # draw from these faults only (all when empty)

    def schedule(self) -> Iterator[tuple[str, random.Random]]:
        """The seed's fault schedule: (name, that fault's generator), forever (see fault_schedule)."""
        names = sorted(n for n in self.menu if not self.only or n in self.only)
        for i in range(1_000_000):
            yield self.rng.choice(names), random.Random(f"{self.seed}:fault:{i}")

    def check_menu(self, topology: str) -> None:
        assert set(self.menu) == set(MENUS[topology]), sorted(set(self.menu) ^ set(MENUS[topology]))

    def run(self, seconds: float, stop: threading.Event | None = None) -> None:
        deadline = time.monotonic() + seconds
        for name, rng in self.schedule():
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                return
            event = FaultEvent(name, time.time())
            try:
                event = self.menu[name](rng)
                self.heal_all()
                self.settle()
            except Exception as exc:  # the harness could not apply or heal it: the run says so
                event.error = f"{type(exc).__name__}: {exc}"[:2000]
                event.loses = True  # whatever it left behind is unknown
                self.error = f"{name}: {event.error}"
            finally:
                event.end = time.time()
                self.faults.append(event)
            if self.error:
                return
            time.sleep(rng.uniform(0.2, 1.2))  # load between faults

    def pause(self, process: RedisProcess) -> None:
        self.paused.add(process)
        process.pause()

    def resume(self, process: RedisProcess) -> None:
        process.resume()
        self.paused.discard(process)

    def heal_all(self) -> None:
        for process in list(self.paused):
            self.resume(process)

    def settle(self) -> None:
        """Wait until the deployment is whole again (every node up, replicas in sync)."""


def _maxmemory(nodes: list[RedisProcess], rng: random.Random) -> str:
    """``maxmemory`` below ``used_memory`` with ``noeviction`` (every write refused with OOM), in 1-6
    pulses of 0.1-0.8 s, so that calls in flight straddle each edge (a begin before, a release or
    commit after)."""
    pulses = rng.randint(1, 6)
    total = 0.0
    for _ in range(pulses):
        on = rng.uniform(0.1, 0.8)
        with _out_of_memory(nodes):
            time.sleep(on)
        total += on
        time.sleep(rng.uniform(0.02, 0.3))
    return f"maxmemory below used_memory (noeviction): {pulses} pulses, {total:.1f}s in all"


RESTARTS: list[str] = []  # starts that failed once and were tried again (this process), for the report


def _start(process: RedisProcess, tries: int = 3) -> None:
    """Start ``process`` again; a start that fails (a port another test run took meanwhile, on a
    shared machine) is tried again, and counted."""
    for attempt in range(1, tries + 1):
        try:
            process.start()
            return
        except TopologyError as exc:
            RESTARTS.append(f"{process.name}: {str(exc).splitlines()[0]}")
            if attempt == tries:
                raise
            time.sleep(1.0)


@contextlib.contextmanager
def _out_of_memory(nodes: list[RedisProcess]) -> Iterator[None]:
    """Every write on ``nodes`` refused with OOM while the block runs."""
    for node in nodes:
        with node.client(socket_timeout=2) as c:
            used = int(c.info("memory")["used_memory"])
            c.config_set("maxmemory-policy", "noeviction")
            c.config_set("maxmemory", str(max(1, used // 2)))
    try:
        yield
    finally:
        for node in nodes:
            with node.client(socket_timeout=2) as c:
                c.config_set("maxmemory", "0")


def _oom_while_replica_paused(
    name: str,
    pair: Callable[[random.Random], tuple[RedisProcess, RedisProcess]],
    nemesis: Nemesis,
    rng: random.Random,
) -> FaultEvent:
    """The replica pauses, so begins with ``wait_replicas`` wait in vain; their primary then refuses
    writes (OOM) just as those waits give up and the guard sends its releases."""
    primary, replica = pair(rng)
    lead, oom = rng.uniform(0.05, 0.4), rng.uniform(0.6, 2.0)
    event = FaultEvent(name, time.time(), target=f"{replica.name} paused, {primary.name} OOM")
    nemesis.pause(replica)
    try:
        time.sleep(lead)
        with _out_of_memory([primary]):
            time.sleep(oom)
    finally:
        nemesis.resume(replica)
    event.detail = f"replica paused; OOM from +{lead:.2f}s for {oom:.1f}s"
    return event


def _client_kill(nodes: list[RedisProcess], rng: random.Random) -> str:
    times = rng.randint(1, 4)
    for _ in range(times):
        for node in nodes:
            with node.client(socket_timeout=2) as c:
                c.execute_command("CLIENT", "KILL", "TYPE", "normal")
        time.sleep(rng.uniform(0.05, 0.4))
    return f"CLIENT KILL TYPE normal x{times}"


def _script_flush(nodes: list[RedisProcess], rng: random.Random) -> str:
    times = rng.randint(1, 3)
    for _ in range(times):
        for node in nodes:
            with node.client(socket_timeout=2) as c:
                c.script_flush()
        time.sleep(rng.uniform(0.05, 0.5))
    return f"SCRIPT FLUSH x{times}"


class SingleNemesis(Nemesis):
    """One server with ``appendfsync always`` (a kill -9 loses nothing), reached through a FaultProxy."""

    def __init__(self, seed: int, server: RedisProcess, proxy: FaultProxy) -> None:
        super().__init__(seed)
        self.server = server
        self.proxy = proxy
        self.menu = {
            "kill9_restart": self.kill9_restart,
            "pause_server": self.pause_server,
            "proxy_lose": self.proxy_lose,
            "proxy_cut_all": self.proxy_cut_all,
            "proxy_delay": self.proxy_delay,
            "restart_while_delayed": self.restart_while_delayed,
            "script_flush_while_delayed": self.script_flush_while_delayed,
            "lost_begin_reply_refused": self.lost_begin_reply_refused,
            "lost_begin_reply_oom": self.lost_begin_reply_oom,
            "client_kill": lambda rng: FaultEvent(
                "client_kill", time.time(), detail=_client_kill([self.server], rng)
            ),
            "script_flush": lambda rng: FaultEvent(
                "script_flush", time.time(), detail=_script_flush([self.server], rng)
            ),
            "maxmemory": lambda rng: FaultEvent(
                "maxmemory", time.time(), detail=_maxmemory([self.server], rng)
            ),
        }

    def kill9_restart(self, rng: random.Random) -> FaultEvent:
        event = FaultEvent("kill9_restart", time.time(), target=self.server.name)
        down = rng.uniform(0.1, 1.5)
        self.server.kill()
        time.sleep(down)
        _start(self.server)
        event.detail = f"down {down:.2f}s (AOF appendfsync always)"
        return event

    def pause_server(self, rng: random.Random) -> FaultEvent:
        event = FaultEvent("pause_server", time.time(), target=self.server.name)
        seconds = rng.uniform(0.3, 2.5)
        self.pause(self.server)
        time.sleep(seconds)
        self.resume(self.server)
        event.detail = f"SIGSTOP {seconds:.2f}s"
        return event

    def proxy_lose(self, rng: random.Random) -> FaultEvent:
        action = rng.choice(LOSSES)
        commands = rng.choice([("SET",), ("EVALSHA", "EVAL"), ()])
        share, seconds = rng.uniform(0.1, 0.6), rng.uniform(0.5, 3.0)
        event = FaultEvent("proxy_lose", time.time(), target=f"{action.value} {'/'.join(commands) or 'any'}")
        self.proxy.faults = [
            Fault(_any_of(commands, random.Random(rng.random()), share), action, times=10**9)
        ]
        try:
            time.sleep(seconds)
        finally:
            self.proxy.faults = []
        event.detail = (
            f"{share:.0%} of matching requests for {seconds:.1f}s: {self.proxy.applied(action)} so far"
        )
        return event

    def proxy_cut_all(self, rng: random.Random) -> FaultEvent:
        times = rng.randint(1, 5)
        cut = 0
        for _ in range(times):
            cut += self.proxy.cut_all()
            time.sleep(rng.uniform(0.05, 0.5))
        return FaultEvent("proxy_cut_all", time.time(), detail=f"{cut} connections cut in {times} rounds")

    def proxy_delay(self, rng: random.Random) -> FaultEvent:
        delay, seconds = rng.uniform(0.05, 1.2), rng.uniform(0.5, 3.0)
        event = FaultEvent(
            "proxy_delay", time.time(), detail=f"each request held {delay:.2f}s for {seconds:.1f}s"
        )
        self.proxy.hold(delay)
        try:
            time.sleep(seconds)
        finally:
            self.proxy.faults = []
        return event

    def restart_while_delayed(self, rng: random.Random) -> FaultEvent:
        delay = rng.uniform(0.3, 1.2)
        event = FaultEvent("restart_while_delayed", time.time(), target=self.server.name)
        self.proxy.hold(delay)
        try:
            time.sleep(rng.uniform(0.05, delay))
            self.server.kill()
            time.sleep(rng.uniform(0.05, 0.5))
            _start(self.server)
        finally:
            self.proxy.faults = []
        event.detail = f"requests held {delay:.2f}s; kill -9 and restart meanwhile"
        return event

    def script_flush_while_delayed(self, rng: random.Random) -> FaultEvent:
        """Requests held in the proxy while SCRIPT FLUSH empties the script cache: a transition sent
        before the flush lands after it."""
        delay = rng.uniform(
            0.1, 2.5
        )  # past the 1 s socket timeout, a held request lands after its sender gave up
        event = FaultEvent("script_flush_while_delayed", time.time(), target=self.server.name)
        self.proxy.hold(delay)
        try:
            flushes = rng.randint(1, 3)
            for _ in range(flushes):
                time.sleep(rng.uniform(0.02, min(delay, 1.0)))
                with self.server.client(socket_timeout=2) as c:
                    c.script_flush()
        finally:
            self.proxy.faults = []
        event.detail = f"requests held {delay:.2f}s; SCRIPT FLUSH x{flushes} meanwhile"
        return event

    def lost_begin_reply_oom(self, rng: random.Random) -> FaultEvent:
        """A begin's SET lands and its reply is lost; the server then refuses writes (OOM), so the
        re-sent begin and the guard's release are refused too."""
        oom = rng.uniform(1.5, 3.0)
        event = FaultEvent("lost_begin_reply_oom", time.time(), target=self.server.name)
        before = self.proxy.applied(Action.DROP_REPLY)
        match = _any_of(("SET",), random.Random(rng.random()), 1.0)
        self.proxy.faults = [Fault(match, Action.DROP_REPLY, times=10**9)]
        try:
            with contextlib.suppress(TopologyError):
                wait_until(
                    "a begin's reply to be dropped",
                    lambda: self.proxy.applied(Action.DROP_REPLY) > before,
                    3.0,
                )
            with _out_of_memory([self.server]):
                self.proxy.faults = []
                time.sleep(oom)
        finally:
            self.proxy.faults = []
        dropped = self.proxy.applied(Action.DROP_REPLY) - before
        event.detail = f"{dropped} begin replies dropped, then OOM for {oom:.1f}s"
        return event

    def lost_begin_reply_refused(self, rng: random.Random) -> FaultEvent:
        """A begin's SET lands, its reply is lost, and the re-sends find the port refusing."""
        refused_for = rng.uniform(1.0, 3.0)
        event = FaultEvent("lost_begin_reply_refused", time.time())
        before = self.proxy.applied(Action.DROP_REPLY)
        self.proxy.faults = [
            Fault(_any_of(("SET",), random.Random(rng.random()), 1.0), Action.DROP_REPLY, times=10**9)
        ]
        try:
            with contextlib.suppress(TopologyError):
                wait_until(
                    "a begin's reply to be dropped",
                    lambda: self.proxy.applied(Action.DROP_REPLY) > before,
                    3.0,
                )
            time.sleep(0.05)
            self.proxy.refuse()
            self.proxy.faults = []
            time.sleep(refused_for)
        finally:
            self.proxy.faults = []
            self.proxy.reopen()
        dropped = self.proxy.applied(Action.DROP_REPLY) - before
        event.detail = f"{dropped} begin replies dropped, then connections refused for {refused_for:.1f}s"
        return event

    def heal_all(self) -> None:
        super().heal_all()
        self.proxy.faults = []
        if not self.server.alive:
            _start(self.server)

    def settle(self) -> None:
        with self.server.client(socket_timeout=2) as c:
            wait_until("the server to answer", c.ping, 30)


class SentinelNemesis(Nemesis):
    """A primary, a replica and three sentinels, without persistence: the killed or demoted primary
    comes back through the safe restore (tests/faults.py: restore_sentinel_replica)."""

    def __init__(self, seed: int, topology: SentinelTopology) -> None:
        super().__init__(seed)
        self.t = topology
        self.menu = {
            "kill9_primary": self.kill9_primary,
            "pause_primary_short": self.pause_primary_short,
            "demoted_primary_answers": self.demoted_primary_answers,
            "sentinel_failover": self.sentinel_failover,
            "kill9_replica": self.kill9_replica,
            "pause_replica": self.pause_replica,
            "kill9_sentinel": self.kill9_sentinel,
            "pause_sentinel": self.pause_sentinel,
            "oom_while_replica_paused": lambda rng: _oom_while_replica_paused(
                "oom_while_replica_paused", self._pair, self, rng
            ),
            "client_kill": lambda rng: FaultEvent(
                "client_kill", time.time(), detail=_client_kill([self.t.current_primary()], rng)
            ),
            "script_flush": lambda rng: FaultEvent(
                "script_flush", time.time(), detail=_script_flush(self.t.data_nodes, rng)
            ),
            "maxmemory": lambda rng: FaultEvent(
                "maxmemory", time.time(), detail=_maxmemory([self.t.current_primary()], rng)
            ),
        }

    def _pair(self, _rng: random.Random) -> tuple[RedisProcess, RedisProcess]:
        primary = self.t.current_primary()
        return primary, self.t.other(primary)

    def kill9_primary(self, rng: random.Random) -> FaultEvent:
        old = self.t.current_primary()
        event = FaultEvent("kill9_primary", time.time(), target=old.name, loses=True)
        old.kill()
        new = self.t.wait_for_failover(old, timeout=60)
        time.sleep(rng.uniform(0.0, 1.0))
        restore_sentinel_replica(self.t, old, new)
        event.detail = f"{new.name} promoted; {old.name} back as its replica"
        return event

    def pause_primary_short(self, rng: random.Random) -> FaultEvent:
        old = self.t.current_primary()
        seconds = rng.uniform(0.2, 0.6)
        event = FaultEvent(
            "pause_primary_short", time.time(), target=old.name, detail=f"SIGSTOP {seconds:.2f}s"
        )
        self.pause(old)
        time.sleep(seconds)
        self.resume(old)
        if self.t.current_primary() is not old:  # the sentinels were quicker: a demotion after all
            event.loses = True
            new = self.t.wait_for_failover(old, timeout=60)
            finish_returning_replica(self.t, old, new)
            event.detail += "; the sentinels failed over meanwhile"
        return event

    def demoted_primary_answers(self, rng: random.Random) -> FaultEvent:
        """Pause the primary until the replica is promoted, resume it: it answers as a primary until
        it is demoted (its writes then die with the demotion)."""
        old = self.t.current_primary()
        event = FaultEvent("demoted_primary_answers", time.time(), target=old.name, loses=True)
        self.pause(old)
        new = self.t.wait_for_failover(old, timeout=60)
        self.resume(old)
        with old.client(socket_timeout=2) as c:
            c.config_set("replica-priority", "0")  # not promotable before it has synced from the new one
        answering = rng.uniform(0.2, 1.5)
        time.sleep(answering)
        finish_returning_replica(self.t, old, new)
        event.detail = f"{new.name} promoted; {old.name} resumed and left {answering:.1f}s before REPLICAOF"
        return event

    def sentinel_failover(self, rng: random.Random) -> FaultEvent:
        old = self.t.current_primary()
        event = FaultEvent("sentinel_failover", time.time(), target=old.name, loses=True)
        sentinel = self.t.sentinels[rng.randrange(len(self.t.sentinels))]
        for attempt in range(1, 4):
            with sentinel.client(socket_timeout=5) as c, contextlib.suppress(redis.ResponseError):
                c.execute_command("SENTINEL", "FAILOVER", self.t.service)  # INPROG: one is under way
            try:
                new = self.t.wait_for_failover(old, timeout=20)
                break
            except TopologyError:
                # a sentinel whose view lagged (one just restarted) can turn the node being promoted
                # back into a replica: the failover aborts (-failover-abort-slave-timeout) and the old
                # primary stays; ask again, a bounded number of times
                if attempt == 3 or self.t.current_primary() is not old:
                    raise
        finish_returning_replica(self.t, old, new)
        event.detail = f"SENTINEL FAILOVER via {sentinel.name} (asked {attempt}x): {new.name} promoted"
        return event

    def kill9_replica(self, rng: random.Random) -> FaultEvent:
        primary = self.t.current_primary()
        replica = self.t.other(primary)
        down = rng.uniform(0.2, 2.0)
        event = FaultEvent("kill9_replica", time.time(), target=replica.name, detail=f"down {down:.1f}s")
        replica.kill()
        time.sleep(down)
        restore_sentinel_replica(self.t, replica, primary)
        return event

    def pause_replica(self, rng: random.Random) -> FaultEvent:
        replica = self.t.other(self.t.current_primary())
        seconds = rng.uniform(0.3, 3.0)
        event = FaultEvent(
            "pause_replica", time.time(), target=replica.name, detail=f"SIGSTOP {seconds:.1f}s"
        )
        self.pause(replica)
        time.sleep(seconds)
        self.resume(replica)
        return event

    def kill9_sentinel(self, rng: random.Random) -> FaultEvent:
        sentinel = self.t.sentinels[rng.randrange(len(self.t.sentinels))]
        down = rng.uniform(0.3, 2.5)
        event = FaultEvent("kill9_sentinel", time.time(), target=sentinel.name, detail=f"down {down:.1f}s")
        sentinel.kill()
        time.sleep(down)
        _start(sentinel)
        return event

    def pause_sentinel(self, rng: random.Random) -> FaultEvent:
        sentinel = self.t.sentinels[rng.randrange(len(self.t.sentinels))]
        seconds = rng.uniform(0.3, 2.5)
        event = FaultEvent(
            "pause_sentinel", time.time(), target=sentinel.name, detail=f"SIGSTOP {seconds:.1f}s"
        )
        self.pause(sentinel)
        time.sleep(seconds)
        self.resume(sentinel)
        return event

    def heal_all(self) -> None:
        super().heal_all()
        for sentinel in self.t.sentinels:
            if not sentinel.alive:
                _start(sentinel)
        for node in self.t.data_nodes:
            with node.client(socket_timeout=2) as c:
                c.config_set("maxmemory", "0")

    def settle(self) -> None:
        primary = self.t.current_primary()
        wait_synced_replica(self.t.other(primary), primary, timeout=30, on_fail=self.t.logs())
        self.t.wait_writable(timeout=30)


class ClusterNemesis(Nemesis):
    """3 primaries and 3 replicas without persistence. A returning node starts with
    ``cluster-replica-no-failover yes`` until it has synced (the Cluster form of the safe restore)."""

    def __init__(self, seed: int, cluster: ClusterTopology, namespace: str) -> None:
        super().__init__(seed)
        self.c = cluster
        self.namespace = namespace
        self.menu = {
            "kill9_primary_mid_call": self.kill9_primary,
            "demoted_primary_answers": self.demoted_primary_answers,
            "cluster_failover": self.cluster_failover,
            "kill9_replica": self.kill9_replica,
            "pause_replica": self.pause_replica,
            "slot_migration": self.slot_migration,
            "oom_while_replica_paused": lambda rng: _oom_while_replica_paused(
                "oom_while_replica_paused", self._pair, self, rng
            ),
            "client_kill": lambda rng: FaultEvent(
                "client_kill", time.time(), detail=_client_kill(self.live(), rng)
            ),
            "script_flush": lambda rng: FaultEvent(
                "script_flush", time.time(), detail=_script_flush(self.live(), rng)
            ),
            "maxmemory": lambda rng: FaultEvent(
                "maxmemory", time.time(), detail=_maxmemory(self.c.primaries(), rng)
            ),
        }

    def live(self) -> list[RedisProcess]:
        return [p for p in self.c.nodes if p.alive]

    def _primary(self, rng: random.Random) -> RedisProcess:
        primaries = sorted(self.c.primaries(), key=lambda p: p.port)
        return primaries[rng.randrange(len(primaries))]

    def _pair(self, rng: random.Random) -> tuple[RedisProcess, RedisProcess]:
        primary = self._primary(rng)
        return primary, self.c.replicas_of(primary)[0]

    def _return_as_replica(self, node: RedisProcess, primary: RedisProcess) -> None:
        """Start ``node`` again, never promotable before its first sync from ``primary`` lands."""
        extra = ["--cluster-replica-no-failover", "yes"]
        node.args += extra
        try:
            _start(node)
        finally:
            del node.args[-len(extra) :]  # the next start is an ordinary one
        wait_synced_replica(node, primary, timeout=60, on_fail=self.c.logs())
        with node.client(socket_timeout=2) as c:
            c.config_set("cluster-replica-no-failover", "no")

    def kill9_primary(self, rng: random.Random) -> FaultEvent:
        target = self._primary(rng)
        candidates = self.c.replicas_of(target)
        slot = slots_served_by(self.c, target)[0][0]
        event = FaultEvent("kill9_primary_mid_call", time.time(), target=target.name, loses=True)
        target.kill()
        new = wait_cluster_takeover(self.c, target, candidates, slot, timeout=60)
        self._return_as_replica(target, new)
        event.detail = f"{new.name} took over; {target.name} back as its replica"
        return event

    def demoted_primary_answers(self, rng: random.Random) -> FaultEvent:
        target = self._primary(rng)
        candidates = self.c.replicas_of(target)
        slot = slots_served_by(self.c, target)[0][0]
        event = FaultEvent("demoted_primary_answers", time.time(), target=target.name, loses=True)
        self.pause(target)
        new = wait_cluster_takeover(self.c, target, candidates, slot, timeout=60)
        time.sleep(rng.uniform(0.0, 0.5))
        self.resume(target)
        wait_synced_replica(target, new, timeout=60, on_fail=self.c.logs())
        event.detail = f"paused until {new.name} took over, then resumed"
        return event

    def cluster_failover(self, rng: random.Random) -> FaultEvent:
        target = self._primary(rng)
        replica = self.c.replicas_of(target)[0]
        event = FaultEvent("cluster_failover", time.time(), target=replica.name)
        # A manual failover needs the primary to know the replica as its own (gossip): a replica that
        # attached a moment ago (after the fault before this one) is ignored by the primary, and the
        # failover times out after 5 s on the replica's side. Wait for the pair, and ask again when
        # a request timed out anyway.
        wait_until(
            f"{target.name} to list {replica.name} as its replica",
            lambda: self._knows_replica(target, replica),
            30,
            on_fail=self.c.logs(),
        )
        asked: list[float] = []  # when each CLUSTER FAILOVER was sent

        def promoted() -> bool:
            if self.c.role(replica) == "master":
                return True
            if not asked or time.monotonic() - asked[-1] > 7.0:
                with replica.client(socket_timeout=5) as c:
                    c.execute_command("CLUSTER", "FAILOVER")
                asked.append(time.monotonic())
            return False

        wait_until(f"{replica.name} to become a primary", promoted, 40, on_fail=self.c.logs())
        wait_synced_replica(target, replica, timeout=60, on_fail=self.c.logs())
        event.detail = f"CLUSTER FAILOVER on {replica.name} (replica of {target.name}), asked {len(asked)}x"
        return event

    def _knows_replica(self, primary: RedisProcess, replica: RedisProcess) -> bool:
        with replica.client(socket_timeout=2) as c:
            replica_id = c.execute_command("CLUSTER", "MYID")
        with primary.client(socket_timeout=2) as c:
            primary_id = c.execute_command("CLUSTER", "MYID")
            nodes = c.execute_command("CLUSTER", "NODES")
        for line in _text(nodes).splitlines():
            fields = line.split()
            if len(fields) > 3 and fields[0] == _text(replica_id):
                return "slave" in fields[2] and fields[3] == _text(primary_id)
        return False

    def kill9_replica(self, rng: random.Random) -> FaultEvent:
        primary = self._primary(rng)
        replica = self.c.replicas_of(primary)[0]
        down = rng.uniform(0.2, 2.0)
        event = FaultEvent("kill9_replica", time.time(), target=replica.name, detail=f"down {down:.1f}s")
        replica.kill()
        time.sleep(down)
        self._return_as_replica(replica, primary)
        return event

    def pause_replica(self, rng: random.Random) -> FaultEvent:
        replica = self.c.replicas_of(self._primary(rng))[0]
        seconds = rng.uniform(0.3, 1.5)  # below the node timeout: a longer pause marks it failed
        event = FaultEvent(
            "pause_replica", time.time(), target=replica.name, detail=f"SIGSTOP {seconds:.1f}s"
        )
        self.pause(replica)
        time.sleep(seconds)
        self.resume(replica)
        return event

    def slot_migration(self, rng: random.Random) -> FaultEvent:
        """Move a run of slots that starts at one holding records from its primary to another, key by
        key (MIGRATE), while the calls go on (they follow ASK and MOVED redirections)."""
        primaries = sorted(self.c.primaries(), key=lambda p: p.port)
        source = primaries[rng.randrange(len(primaries))]
        dest = rng.choice([p for p in primaries if p is not source])
        first = self._busy_slot(source, rng)
        served = slots_served_by(self.c, source)
        wanted = range(first, first + rng.randint(4, 48))
        slots = [s for s in wanted if any(lo <= s <= hi for lo, hi in served)]
        event = FaultEvent("slot_migration", time.time(), target=f"{source.name} -> {dest.name}")
        moved = sum(self._migrate(slot, source, dest, primaries, rng) for slot in slots)
        event.detail = f"slots {slots[0]}..{slots[-1]} ({len(slots)}): {moved} keys moved"
        return event

    def _migrate(
        self,
        slot: int,
        source: RedisProcess,
        dest: RedisProcess,
        primaries: list[RedisProcess],
        rng: random.Random,
    ) -> int:
        src_id, dst_id = self.c.ids[source.port], self.c.ids[dest.port]
        moved = 0
        with source.client(socket_timeout=10) as src, dest.client(socket_timeout=10) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 50):
                src.execute_command("MIGRATE", HOST, dest.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(rng.uniform(0.0, 0.02))
            dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for other in primaries:
            if other not in (source, dest):
                with other.client(socket_timeout=5) as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return moved

    def _busy_slot(self, source: RedisProcess, rng: random.Random) -> int:
        with source.client(socket_timeout=5) as c:
            keys = [
                k
                for _, k in zip(range(200), c.scan_iter(match=f"{self.namespace}:*", count=200), strict=False)
            ]
            if keys:
                return int(c.execute_command("CLUSTER", "KEYSLOT", rng.choice(keys)))
        ranges = slots_served_by(self.c, source)
        first, last = ranges[rng.randrange(len(ranges))]
        return rng.randint(first, last)

    def heal_all(self) -> None:
        super().heal_all()
        for node in self.c.nodes:
            if node.alive:
                with node.client(socket_timeout=2) as c:
                    c.config_set("maxmemory", "0")

    def settle(self) -> None:
        self.c.wait_healthy(timeout=60)


# -- one run ---------------------------------------------------------------------------------------
@dataclass
class RunConfig:
    topology: str = "single"
    seconds: float = 25.0
    seed: int | None = None
    workers: int = 2
    results: Path | None = None  # where a failing run is saved (None: a new temporary folder)
    save_always: bool = False
    quiet_tail: float = 2.0  # seconds of load without faults after the last fault
    faults: tuple[str, ...] = ()  # draw from these faults only (default: the topology's whole menu)

    def resolved_seed(self) -> int:
        if self.seed is None:
            self.seed = random.SystemRandom().randrange(1, 2**31)
        return self.seed


@dataclass
class RunResult:
    config: RunConfig
    seed: int
    server: str
    verdict: history_checker.Verdict
    faults: list[FaultEvent]
    harness_error: str = ""
    saved: Path | None = None
    seconds: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.harness_error

    def replay_command(self) -> str:
        c = self.config
        return (
            f"AIRLOCK_REDIS_SERVER={self.server.split(' (')[-1].rstrip(')')} python -m benchmarks.fault_run "
            f"--topology {c.topology} --seconds {c.seconds:g} --workers {c.workers} --seed {self.seed}"
            + (f" --faults {','.join(c.faults)}" if c.faults else "")
        )

    def summary(self) -> str:
        faults: dict[str, int] = {}
        for f in self.faults:
            faults[f.name] = faults.get(f.name, 0) + 1
        head = (
            f"fault run: topology={self.config.topology} seed={self.seed} server={self.server} "
            f"{self.seconds:.0f}s faults={faults}"
        )
        lines = [head, self.verdict.report()]
        if self.harness_error:
            lines.append(f"HARNESS ERROR (not a product finding): {self.harness_error}")
        if self.saved is not None:
            lines.append(f"history, records, verdict and server logs saved in {self.saved}")
        lines.append(f"replay the fault schedule: {self.replay_command()}")
        return "\n".join(lines)


class _Deployment:
    """The topology of one run, its URLs, its nemesis and its logs."""

    def __init__(self, topology: str, seed: int, namespace: str) -> None:
        self.kind = topology
        self.proxy: FaultProxy | None = None
        self.root = Path(tempfile.mkdtemp(prefix="airlock-fault-run-"))
        self.single: RedisProcess | None = None
        self.sentinel: SentinelTopology | None = None
        self.cluster: ClusterTopology | None = None
        self.nemesis: Nemesis
        self.replicas = 0
        try:
            self._start(topology, seed, namespace)
        except BaseException:
            self.stop()
            raise

    def _start(self, topology: str, seed: int, namespace: str) -> None:
        if topology == "single":
            (port,) = free_ports(1)
            args = ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
            self.single = RedisProcess(f"single:{port}", self.root / "single", port, args).start()
            self.proxy = FaultProxy((HOST, port))
            self.proxy.start()
            self.nemesis = SingleNemesis(seed, self.single, self.proxy)
            self.nemesis.check_menu(topology)
            self.direct_url = f"redis://{HOST}:{port}/0"
            self.url = self.proxy.url
        elif topology == "sentinel":
            self.sentinel = SentinelTopology().start()
            self.nemesis = SentinelNemesis(seed, self.sentinel)
            self.nemesis.check_menu(topology)
            self.direct_url = self.url = self.sentinel.url
            self.replicas = 1
        elif topology == "cluster":
            self.cluster = ClusterTopology().start()
            self.nemesis = ClusterNemesis(seed, self.cluster, namespace)
            self.nemesis.check_menu(topology)
            self.direct_url = self.url = self.cluster.url
            self.replicas = 1
        else:
            raise ValueError(f"topology must be one of {TOPOLOGIES}")

    @property
    def processes(self) -> list[RedisProcess]:
        if self.single is not None:
            return [self.single]
        if self.sentinel is not None:
            return self.sentinel.processes
        assert self.cluster is not None
        return self.cluster.processes

    def worker_url(self, worker: int) -> str:
        """Single server: worker 1 has a pool of one connection, worker 2 of two (the URL's
        max_connections); the others an unbounded pool."""
        if self.kind == "single" and worker in (1, 2):
            return f"{self.url}?max_connections={worker}"
        return self.url

    def error_stats(self) -> dict[str, int]:
        """The error replies the data nodes sent since they last started (INFO errorstats): a late
        request that failed with NOSCRIPT or OOM after its sender gave up shows only here."""
        totals: dict[str, int] = {}
        for p in self.processes:
            if p.sentinel or not p.alive:
                continue
            with contextlib.suppress(redis.RedisError, OSError), p.client(socket_timeout=2) as c:
                for name, stats in c.info("errorstats").items():
                    count = int(stats["count"]) if isinstance(stats, dict) else 0
                    totals[name.removeprefix("errorstat_")] = (
                        totals.get(name.removeprefix("errorstat_"), 0) + count
                    )
        return totals

    def copy_logs(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for p in self.processes:
            with contextlib.suppress(OSError):
                shutil.copy(p.log_path, folder / f"{p.name.replace(':', '-')}.log")

    def heal(self) -> None:
        self.nemesis.heal_all()
        self.nemesis.settle()

    def stop(self) -> None:
        for p in self.processes:
            with contextlib.suppress(Exception):
                p.resume()
        if self.proxy is not None:
            with contextlib.suppress(Exception):
                self.proxy.close()
        for topology in (self.sentinel, self.cluster):
            if topology is not None:
                topology.stop()
        if self.single is not None:
            self.single.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def run(config: RunConfig) -> RunResult:
    """One fault run: start the topology, the workers and the nemesis, heal, sweep, check. Every
    process it started is stopped when it returns or raises (Ctrl-C included)."""
    redis_binary()
    seed = config.resolved_seed()
    server = str(identify_server(redis_binary()))
    t0 = time.monotonic()
    namespace = f"fault-run-{seed}"
    work = Path(tempfile.mkdtemp(prefix="airlock-fault-history-"))
    try:
        deployment = _Deployment(config.topology, seed, namespace)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    unknown = set(config.faults) - set(MENUS[config.topology])
    if unknown:
        raise ValueError(f"no such faults for {config.topology}: {sorted(unknown)}")
    deployment.nemesis.only = config.faults
    try:
        events, harness_error = _load(config, deployment, namespace, seed, work)
        try:
            deployment.heal()
        except (TopologyError, redis.RedisError, OSError) as exc:
            harness_error = harness_error or f"final heal: {type(exc).__name__}: {exc}"[:2000]
        events += sweep(deployment, namespace, seed, events)
        ids = {str(e["id"]) for e in events if e["type"] == "call"}
        records = read_records(deployment.direct_url, namespace, ids)
        faults = list(deployment.nemesis.faults)
        meta = {
            "type": "meta",
            "topology": config.topology,
            "seed": seed,
            "server": server,
            "workers": config.workers,
            "seconds": config.seconds,
            "replicas": deployment.replicas,
        }
        events = [meta, *[f.as_event() for f in faults], *events]
        verdict = history_checker.check(events, records)
        verdict.counts["server_errors"] = deployment.error_stats()
        verdict.counts["restarts_tried_again"] = list(RESTARTS)
        RESTARTS.clear()
        elapsed = time.monotonic() - t0
        result = RunResult(config, seed, server, verdict, faults, harness_error, None, elapsed, events)
        if not result.ok or config.save_always:
            result.saved = save(result, records, deployment, work)
        return result
    finally:
        deployment.stop()
        shutil.rmtree(work, ignore_errors=True)


def _load(
    config: RunConfig, deployment: _Deployment, namespace: str, seed: int, work: Path
) -> tuple[list[dict[str, Any]], str]:
    """The workers' calls while the nemesis draws faults; returns their events and any harness error."""
    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    waits = (0, deployment.replicas) if deployment.replicas else (0,)
    outs = [work / f"worker-{w}.jsonl" for w in range(config.workers)]
    plans = [
        WorkerPlan(
            deployment.worker_url(w),
            namespace,
            w,
            config.workers,
            seed,
            config.seconds,
            waits,
            deployment.replicas,
            str(outs[w]),
        )
        for w in range(config.workers)
    ]
    workers = [ctx.Process(target=worker_main, args=(plan, go, stop), daemon=True) for plan in plans]
    harness_error = ""
    try:
        for process in workers:
            process.start()
        go.set()
        time.sleep(1.0)  # load before the first fault
        deployment.nemesis.run(config.seconds)
        harness_error = deployment.nemesis.error
        time.sleep(config.quiet_tail)
        stop.set()
        for process in workers:
            process.join(timeout=WORKER_GRACE)
        if any(p.is_alive() or p.exitcode != 0 for p in workers):
            harness_error = harness_error or f"workers did not end cleanly: {[p.exitcode for p in workers]}"
    finally:
        stop.set()
        for process in workers:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    events: list[dict[str, Any]] = []
    for out in outs:
        if out.exists():
            events += history_checker.read_history(out)
    return events, harness_error


def sweep(
    deployment: _Deployment, namespace: str, seed: int, events: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """After the run (the deployment healed): retry each id once (a sample of SWEEP_IDS), sync, and
    return those calls' events (worker number 99)."""
    ids = sorted({str(e["id"]) for e in events if e["type"] == "call"})
    rng = random.Random(f"{seed}:sweep")
    if len(ids) > SWEEP_IDS:
        ids = sorted(rng.sample(ids, SWEEP_IDS))
    waits = (0, deployment.replicas) if deployment.replicas else (0,)
    plan = WorkerPlan(deployment.direct_url, namespace, 99, 1, seed, 0, waits, deployment.replicas, "")
    found: list[dict[str, Any]] = []
    workload = Workload(99, make_stores(plan), deployment.replicas, found.append, lambda _: "ok")
    try:
        for tool_call_id in ids:
            workload.call(tool_call_id, "sync")
    finally:
        workload.close()
    return found


def read_records(url: str, namespace: str, ids: set[str]) -> dict[str, dict[str, Any] | None]:
    """Each id's record as the store's ``get`` reads it after the run."""
    store = RedisEffectStore(url, namespace=namespace, socket_timeout=5.0)
    found: dict[str, dict[str, Any] | None] = {}
    try:
        for tool_call_id in sorted(ids):
            try:
                record = store.get(tool_call_id)
            except Exception as exc:
                found[tool_call_id] = {"status": "unreadable", "error": f"{type(exc).__name__}: {exc}"[:200]}
                continue
            if record is None:
                found[tool_call_id] = None
                continue
            value_call: str | None = None
            if record.value is not None:
                try:
                    value_call = str(decode_result(record.value)["call"])
                except Exception:
                    value_call = "undecodable"
            found[tool_call_id] = {
                "status": record.status.value,
                "attempt": record.attempt,
                "owner": record.owner[:12],
                "value_call": value_call,
            }
    finally:
        store.close()
    return found


def save(result: RunResult, records: Mapping[str, Any], deployment: _Deployment, work: Path) -> Path:
    """The run's whole history (JSON lines, time order), records, verdict, summary and server logs."""
    base = result.config.results or Path(tempfile.mkdtemp(prefix="airlock-fault-run-results-"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = base / f"{result.config.topology}-seed{result.seed}-{stamp}"
    folder.mkdir(parents=True, exist_ok=True)

    def at(event: Mapping[str, Any]) -> float:
        return float(event.get("started") or event.get("sent") or event.get("at") or event.get("start") or 0)

    with (folder / "history.jsonl").open("w") as out:
        for event in sorted(result.events, key=at):
            out.write(json.dumps(event) + "\n")
    (folder / "records.json").write_text(json.dumps(records, indent=1, sort_keys=True))
    (folder / "verdict.txt").write_text(result.summary() + "\n")
    deployment.copy_logs(folder / "logs")
    for log in work.glob("*.log"):  # what the guard logged in each worker
        shutil.copy(log, folder / "logs" / log.name)
    return folder


def seed_from_env() -> int | None:
    value = os.environ.get(SEED_ENV, "").strip()
    return int(value) if value else None


def _text(reply: object) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)
