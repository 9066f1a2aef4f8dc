"""The comparison harness: the guard against the raw-Redis floor and two rival store designs.

One run, one private redis-server on loopback TCP, sequential calls on one connection each:

    python benchmarks/compare.py --json benchmarks/results/<name>.json

Rows (microseconds per call, median over rounds): a bare function call; the guard with the
in-memory store; the floor (the two raw round trips a guarded call needs, SET NX then SET XX,
with values of the same sizes); the store alone (begin + commit, no guard); the guard with
RedisEffectStore; the guard with a WATCH/MULTI/EXEC store and with a Powertools-style store.
Every round measures every row back to back, so the ratios are taken per round (the machine's
noise hits both sides alike) and reported as median and range. Then the race: many attempts on
one tool_call_id from several processes at once, which must execute exactly once.

The async rows (concurrency 1/64/256) are measured by ``benchmarks/bench_async.py``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from airlock_redis import EffectGuard, InMemoryEffectStore, RedisEffectStore, tool_call_context
from airlock_redis.core.codec import encode_result
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.base import EffectStore
from airlock_redis.stores.keys import record_key
from benchmarks.rivals import PowertoolsStyleStore, WatchMultiStore

# the goals of issue 12; each figure's line says met or MISSED
GOAL_GUARD_FLOOR_RATIO = 1.15  # guard + RedisEffectStore / floor
GOAL_STORE_FLOOR_RATIO = 1.08  # RedisEffectStore alone / floor
GOAL_GUARD_PYTHON_US = 25.0  # guard + RedisEffectStore minus the store alone
GOAL_MEMORY_OVERHEAD_US = 10.0  # guard + InMemoryEffectStore over a bare call
TARGET_WATCH_SPEEDUP = 1.5
ROWS = (
    "bare",
    "guard_memory",
    "floor",
    "floor_held",
    "store_only",
    "guard_redis",
    "guard_watch_multi",
    "guard_powertools",
)
ROW_TITLES = {
    "bare": "bare function call",
    "guard_memory": "guard + InMemoryEffectStore",
    "floor": "floor: SET NX + SET XX (raw redis-py)",
    "floor_held": "the same two SETs on one held connection (no client bookkeeping)",
    "store_only": "RedisEffectStore begin + commit (no guard)",
    "guard_redis": "guard + RedisEffectStore",
    "guard_watch_multi": "guard + WATCH/MULTI/EXEC store (rival)",
    "guard_powertools": "guard + Powertools-style store (rival)",
}


def _tool_factory(value_bytes: int) -> Callable[..., dict[str, Any]]:
    payload = "x" * value_bytes

    def charge(account: str, cents: int) -> dict[str, Any]:
        return {"account": account, "cents": cents, "status": "ok", "payload": payload}

    return charge


@dataclass
class Bench:
    """The workloads, each ``run(n)`` making n sequential calls with fresh tool_call_ids."""

    url: str
    value_bytes: int
    round_id: int = 0

    def __post_init__(self) -> None:
        self.tool = _tool_factory(self.value_bytes)
        self.result_bytes = len(encode_result(self.tool(account="acct_1", cents=500)))
        self.clients: list[Any] = []  # redis.Redis, or RedisCluster from a cluster URL
        self.workloads: dict[str, Callable[[int], None]] = {
            "bare": self._bare,
            "guard_memory": self._guarded(InMemoryEffectStore()),
            "floor": self._floor(),
            "floor_held": self._floor_held(),
            "store_only": self._store_only(),
            "guard_redis": self._guarded(self._own(RedisEffectStore(self.url, namespace="cmp:ours"))),
            "guard_watch_multi": self._guarded(WatchMultiStore(self._client(), "cmp:watch")),
            "guard_powertools": self._guarded(PowertoolsStyleStore(self._client(), "cmp:pt")),
        }

    def _client(self) -> redis.Redis:
        client = redis.Redis.from_url(self.url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self.clients.append(client)
        return client

    def _own(self, store: RedisEffectStore) -> RedisEffectStore:
        self.clients.append(store.client)
        return store

    def _ids(self, row: str, n: int) -> list[str]:
        self.round_id += 1
        return [f"{row}-{self.round_id}-{i}" for i in range(n)]

    def _bare(self, n: int) -> None:
        tool = self.tool
        for i in range(n):
            tool(account="acct_1", cents=i)

    def _guarded(self, store: EffectStore) -> Callable[[int], None]:
        charge = EffectGuard(store=store).wrap(self.tool)

        def run(n: int) -> None:
            for i, tool_call_id in enumerate(self._ids("g", n)):
                with tool_call_context(tool_call_id):
                    charge(account="acct_1", cents=i)

        return run

    def _floor(self) -> Callable[[int], None]:
        client = self._client()
        # begin writes the idempotency key, the tool, the owner token and the attempt; commit the result
        claim = b"p" * (64 + len("charge") + 32 + 1)
        result = b"r" * self.result_bytes
        ttl = 24 * 3600 * 1000

        def run(n: int) -> None:
            for tool_call_id in self._ids("f", n):
                key = record_key("cmp:floor", tool_call_id)
                client.set(key, claim, nx=True, px=ttl)
                client.set(key, result, xx=True, px=ttl)

        return run

    def _floor_held(self) -> Callable[[int], None]:
        """The floor's two commands sent on one connection kept out of the pool: what is left of a
        round trip once redis-py's per-command bookkeeping is gone (the store's lane does the same)."""
        client = self._client()
        conn: Any = client.connection_pool.get_connection()
        claim = b"p" * (64 + len("charge") + 32 + 1)
        result = b"r" * self.result_bytes
        ttl = 24 * 3600 * 1000

        def run(n: int) -> None:
            for tool_call_id in self._ids("h", n):
                key = record_key("cmp:held", tool_call_id)
                conn.send_packed_command(conn.pack_command("SET", key, claim, "NX", "PX", ttl))
                conn.read_response()
                conn.send_packed_command(conn.pack_command("SET", key, result, "XX", "PX", ttl))
                conn.read_response()

        return run

    def _store_only(self) -> Callable[[int], None]:
        from airlock_redis.core.records import BeginRequest

        store = self._own(RedisEffectStore(self.url, namespace="cmp:store"))
        result = encode_result(self.tool(account="acct_1", cents=1))
        key = "k" * 64

        def run(n: int) -> None:
            for tool_call_id in self._ids("s", n):
                request = BeginRequest(tool_call_id, key, "charge", secrets.token_hex(16), False)
                store.begin(request)
                store.commit(request, 1, result, None)

        return run

    def close(self) -> None:
        for client in self.clients:
            client.close()


def measure(bench: Bench, calls: int, repeats: int, warmup: int, flush: Callable[[], None]) -> dict[str, Any]:
    for run in bench.workloads.values():  # warm up: connections, script cache, code paths
        run(warmup)
    per_call: dict[str, list[float]] = {row: [] for row in ROWS}
    for _ in range(repeats):
        flush()
        for row in ROWS:
            n = calls * 10 if row in ("bare", "guard_memory") else calls
            started = time.perf_counter()
            bench.workloads[row](n)
            per_call[row].append((time.perf_counter() - started) / n * 1e6)
    rows = {
        row: {
            "title": ROW_TITLES[row],
            "median_us": statistics.median(values),
            "min_us": min(values),
            "max_us": max(values),
            "rounds_us": values,
        }
        for row, values in per_call.items()
    }
    ratios = {
        "guard_redis/floor": _paired(per_call["guard_redis"], per_call["floor"]),
        "store_only/floor": _paired(per_call["store_only"], per_call["floor"]),
        "store_only/floor_held": _paired(per_call["store_only"], per_call["floor_held"]),
        "guard_redis/floor_held": _paired(per_call["guard_redis"], per_call["floor_held"]),
        "guard_watch_multi/guard_redis": _paired(per_call["guard_watch_multi"], per_call["guard_redis"]),
        "guard_powertools/guard_redis": _paired(per_call["guard_powertools"], per_call["guard_redis"]),
    }
    overhead = [m - b for m, b in zip(per_call["guard_memory"], per_call["bare"], strict=True)]
    guard_cost = [g - s for g, s in zip(per_call["guard_redis"], per_call["store_only"], strict=True)]
    return {
        "rows": rows,
        "ratios": ratios,
        "memory_overhead_us": _spread(overhead),
        "guard_python_us": _spread(guard_cost),
        "result_bytes": bench.result_bytes,
    }


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def _paired(a: list[float], b: list[float]) -> dict[str, Any]:
    return _spread([x / y for x, y in zip(a, b, strict=True)])


# -- racing duplicates ---------------------------------------------------------------------------
def _racer(url: str, namespace: str, *, tool_call_id: str, attempts: int, barrier: Any, out: Any) -> None:
    from airlock_redis.core.errors import EffectRefused

    counter = redis.Redis.from_url(url)
    guard = EffectGuard(store=RedisEffectStore(url, namespace=namespace))
    ran = [0]

    @guard.wrap
    def transfer(account: str, cents: int) -> dict[str, Any]:
        ran[0] += 1
        counter.incr(f"{namespace}:executions")
        return {"account": account, "cents": cents}

    tally = {"executed": 0, "replayed": 0, "refused": 0, "errors": 0}
    counter.ping()
    barrier.wait(timeout=120)
    started = time.time()
    for _ in range(attempts):
        before = ran[0]
        try:
            with tool_call_context(tool_call_id):
                transfer(account="acct_race", cents=100)
            tally["executed" if ran[0] > before else "replayed"] += 1
        except EffectRefused:
            tally["refused"] += 1
        except Exception:
            tally["errors"] += 1
    finished = time.time()
    counter.close()
    out.put({"started": started, "finished": finished, **tally})


def race(url: str, attempts: int, processes: int) -> dict[str, Any]:
    """``attempts`` calls with one tool_call_id, spread over ``processes`` processes at once."""
    context = multiprocessing.get_context("spawn")
    namespace = f"cmp:race:{secrets.token_hex(4)}"
    tool_call_id = "race-call"
    barrier = context.Barrier(processes)
    out = context.Queue()
    shares = [attempts // processes + (1 if p < attempts % processes else 0) for p in range(processes)]
    procs = [
        context.Process(
            target=_racer,
            args=(url, namespace),
            kwargs={"tool_call_id": tool_call_id, "attempts": share, "barrier": barrier, "out": out},
            daemon=True,
        )
        for share in shares
    ]
    for proc in procs:
        proc.start()
    reports = [out.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    with redis.Redis.from_url(url) as client:
        executions = int(client.get(f"{namespace}:executions") or 0)
    return {
        "attempts": attempts,
        "processes": processes,
        "executions": executions,
        "executed": sum(r["executed"] for r in reports),
        "replayed": sum(r["replayed"] for r in reports),
        "refused": sum(r["refused"] for r in reports),
        "errors": sum(r["errors"] for r in reports),
        "wall_s": max(r["finished"] for r in reports) - min(r["started"] for r in reports),
        "ok": executions == 1,
    }


# -- the machine, the report ---------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


SEQUENTIAL_TCP = "TCP loopback (127.0.0.1), one connection per row, sequential calls"


def describe_machine(server: EmbeddedRedis, transport: str = SEQUENTIAL_TCP) -> dict[str, Any]:
    """The machine, its load and the versions a benchmark ran on: ratios differ between machines
    (the cost of waking a process that waits for a reply differs most), so every result says where."""
    with server.client() as client:
        info = client.info("server")
    version = subprocess.run(
        [server.binary, "--version"], check=False, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "redis_server": info.get("redis_version"),
        "redis_server_build": version,
        "redis_py": redis.__version__,
        "kernel": platform.release(),
        "transport": transport,
    }


def markdown(report: dict[str, Any]) -> str:
    machine, m, r = report["machine"], report["measurements"], report["race"]
    p = report["parameters"]
    out = [
        f"# Guarded call cost: {report['name']}",
        "",
        f"Run {report['when']} with `python benchmarks/compare.py` ({p['repeats']} rounds of {p['calls']} "
        f"sequential calls per Redis row, x10 for the in-process rows; {p['warmup']} warm-up calls; "
        f"results of {m['result_bytes']} B).",
        "",
        "| machine | |",
        "|---|---|",
    ]
    shown = ("cpu", "cores", "load_average_at_start", "os", "python", "redis_server", "redis_py", "transport")
    for key in shown:
        out.append(f"| {key} | {machine.get(key)} |")
    out += ["", "| row | median us/call | min | max |", "|---|---:|---:|---:|"]
    for row in ROWS:
        data = m["rows"][row]
        low, mid, high = data["min_us"], data["median_us"], data["max_us"]
        out.append(f"| {data['title']} | {mid:.2f} | {low:.2f} | {high:.2f} |")
    ratios = m["ratios"]

    def ratio_line(name: str, target: str, met: bool) -> str:
        v = ratios[name]
        return (
            f"| {name} | {v['median']:.2f} | {v['min']:.2f} to {v['max']:.2f} | {target} | "
            f"{'' if target.startswith('(') else 'met' if met else 'MISSED'} |"
        )

    floor = ratios["guard_redis/floor"]["median"]
    store = ratios["store_only/floor"]["median"]
    watch = ratios["guard_watch_multi/guard_redis"]["median"]
    over = m["memory_overhead_us"]
    python_us = m["guard_python_us"]["median"]

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    out += [
        "",
        "Ratios are taken round by round (both sides measured back to back), then the median.",
        "",
        "| ratio | median | range | target | |",
        "|---|---:|---|---|---|",
        ratio_line("guard_redis/floor", f"<= {GOAL_GUARD_FLOOR_RATIO}", floor <= GOAL_GUARD_FLOOR_RATIO),
        ratio_line("store_only/floor", f"<= {GOAL_STORE_FLOOR_RATIO}", store <= GOAL_STORE_FLOOR_RATIO),
        ratio_line("guard_watch_multi/guard_redis", f">= {TARGET_WATCH_SPEEDUP}",
                   watch >= TARGET_WATCH_SPEEDUP),
        ratio_line("guard_powertools/guard_redis", "(for reference)", True),
        ratio_line("store_only/floor_held", "(for reference)", True),
        ratio_line("guard_redis/floor_held", "(for reference)", True),
        "",
        f"- Guard overhead with InMemoryEffectStore: {over['median']:.1f} us per call "
        f"(range {over['min']:.1f} to {over['max']:.1f}) over a bare call "
        f"(goal <= {GOAL_MEMORY_OVERHEAD_US:.0f} us: {verdict(over['median'] <= GOAL_MEMORY_OVERHEAD_US)}).",
        f"- Guard's own Python on the Redis path (guard + RedisEffectStore minus the store alone): "
        f"{python_us:.1f} us per call "
        f"(goal <= {GOAL_GUARD_PYTHON_US:.0f} us: {verdict(python_us <= GOAL_GUARD_PYTHON_US)}).",
        f"- Racing duplicates: {r['attempts']} attempts on one tool_call_id from {r['processes']} processes: "
        f"{r['executions']} execution(s), {r['replayed']} replays, {r['refused']} refusals, "
        f"{r['errors']} errors, "
        f"wall time {r['wall_s']:.3f} s ({'ok' if r['ok'] else 'FAILED'}).",
        "",
    ]  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", default=None, help="write the figures here (default: print only)")
    parser.add_argument("--markdown", default=None, help="summary path (default: the --json path with .md)")
    parser.add_argument("--name", default=None, help="name of the run (default: the --json file stem)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per Redis row per round")
    parser.add_argument("--repeats", type=int, default=7, help="rounds")
    parser.add_argument("--warmup", type=int, default=500, help="warm-up calls per row")
    parser.add_argument("--value-bytes", type=int, default=64, help="payload size in the tool's result")
    parser.add_argument("--race-attempts", type=int, default=1000)
    parser.add_argument("--race-processes", type=int, default=8)
    args = parser.parse_args(argv)
    name = args.name or (Path(args.json).stem if args.json else "adhoc")
    with EmbeddedRedis(unix_socket=False) as server:
        machine = describe_machine(server)
        bench = Bench(server.url, args.value_bytes)
        admin = server.client()

        def flush() -> None:
            admin.flushall()

        try:
            measurements = measure(bench, args.calls, args.repeats, args.warmup, flush)
            admin.flushall()
            raced = race(server.url, args.race_attempts, args.race_processes)
        finally:
            bench.close()
            admin.close()
    report = {
        "name": name,
        "when": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine,
        "parameters": {
            "calls": args.calls,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "value_bytes": args.value_bytes,
        },
        "targets": {
            "guard_redis/floor": GOAL_GUARD_FLOOR_RATIO,
            "store_only/floor": GOAL_STORE_FLOOR_RATIO,
            "guard_python_us": GOAL_GUARD_PYTHON_US,
            "memory_overhead_us": GOAL_MEMORY_OVERHEAD_US,
            "guard_watch_multi/guard_redis": TARGET_WATCH_SPEEDUP,
        },
        "measurements": measurements,
        "race": raced,
        "async": "measured by benchmarks/bench_async.py",
    }
    text = markdown(report)
    print(text)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        md = Path(args.markdown) if args.markdown else path.with_suffix(".md")
        md.write_text(text, encoding="utf-8")
        print(f"written: {path} and {md}", file=sys.stderr)
    return 0 if raced["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
