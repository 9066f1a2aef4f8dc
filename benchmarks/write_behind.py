"""Write-behind commits (issue 27, item 2): a blocking guarded call with ``write_behind=True`` against
the raw two-round-trip floor, through a proxy that adds a delay each way, and on loopback.

    python benchmarks/write_behind.py [--delay-ms 0.5] [--calls 600] [--loopback-calls 3000] [--rounds 3]

Rows (microseconds per call, sequential calls with fresh tool_call_ids, one private redis-server on
loopback TCP):

- floor: plain redis-py ``SET NX`` then ``SET XX`` per call (the two round trips a guarded call needs);
- guard, write_behind=False: the guard with ``RedisEffectStore`` as it is by default;
- guard, write_behind=True: the same with write-behind commits; the time stops when the last call
  returns (what the caller waits for); "+flush" also counts the wait for every commit to land.

Each is measured through a TCP proxy (a process of its own) that holds every chunk ``--delay-ms``
milliseconds on its way in each direction (a same-zone cloud link), and on loopback without it. Every
round measures every row back to back and the ratios are taken per round (median over rounds), so
the machine's noise hits both sides alike. Targets (issue 27): write_behind=True at most 0.65x the
floor through the proxy, and no slower than write_behind=False on loopback.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.stores.keys import record_key
from benchmarks.compare import describe_machine

TARGET_PROXY_RATIO = 0.65  # write_behind=True / floor, through the proxy
TARGET_LOOPBACK_RATIO = 1.0  # write_behind=True / write_behind=False, on loopback
TTL_MS = 24 * 3600 * 1000


# -- the delaying proxy ----------------------------------------------------------------------------
def _pump(source: socket.socket, sink: socket.socket, delay: float) -> None:
    """Forward source to sink, each chunk ``delay`` seconds after it arrived (order kept)."""
    held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def deliver() -> None:
        while True:
            due, data = held.get()
            if not data:
                break
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                sink.sendall(data)
            except OSError:
                break
        sink.close()

    threading.Thread(target=deliver, daemon=True).start()
    while True:
        try:
            data = source.recv(65536)
        except OSError:
            data = b""
        held.put((time.perf_counter() + delay, data))
        if not data:
            return


def _serve_proxy(listener: socket.socket, upstream: tuple[str, int], delay: float) -> None:
    while True:
        client, _ = listener.accept()
        server = socket.create_connection(upstream)
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pump, args=(client, server, delay), daemon=True).start()
        threading.Thread(target=_pump, args=(server, client, delay), daemon=True).start()


def start_proxy(upstream: tuple[str, int], delay: float) -> tuple[Any, int]:
    """A proxy process in front of ``upstream`` adding ``delay`` seconds each way: (process, port)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port: int = listener.getsockname()[1]
    process = multiprocessing.get_context("fork").Process(
        target=_serve_proxy, args=(listener, upstream, delay), daemon=True
    )
    process.start()
    listener.close()
    return process, port


# -- the rows --------------------------------------------------------------------------------------
def charge(account: str, cents: int) -> dict[str, Any]:
    return {"account": account, "cents": cents, "status": "ok", "payload": "x" * 200}


class Rows:
    """Each row: ``run(n, round)`` makes n sequential calls and returns seconds per call."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=5.0)
        self.stores = {
            flag: RedisEffectStore(url, namespace=f"wb:{flag}", write_behind=flag) for flag in (False, True)
        }
        self.tools = {flag: EffectGuard(store=store).wrap(charge) for flag, store in self.stores.items()}
        self.last_flush = 0.0

    def floor(self, n: int, round_id: int) -> float:
        claim, result = b"p" * 103, b"r" * 260
        client = self.client
        start = time.perf_counter()
        for i in range(n):
            key = record_key("wb:floor", f"f-{round_id}-{i}")
            client.set(key, claim, nx=True, px=TTL_MS)
            client.set(key, result, xx=True, px=TTL_MS)
        return (time.perf_counter() - start) / n

    def guard(self, write_behind: bool) -> Callable[[int, int], float]:
        tool, store = self.tools[write_behind], self.stores[write_behind]

        def run(n: int, round_id: int) -> float:
            start = time.perf_counter()
            for i in range(n):
                with tool_call_context(f"g-{round_id}-{i}"):
                    tool(account="acct_1", cents=i)
            elapsed = time.perf_counter() - start
            if not store.flush(30.0):
                raise SystemExit("the write-behind commits did not land within 30 s")
            self.last_flush = time.perf_counter() - start
            return elapsed / n

        return run

    def warm(self) -> None:
        self.floor(50, -1)
        for flag in (False, True):
            self.guard(flag)(50, -1 - int(flag))

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.client.close()


def measure(url: str, calls: int, rounds: int) -> dict[str, Any]:
    rows = Rows(url)
    rows.warm()
    per_round: list[dict[str, float]] = []
    for r in range(rounds):
        row = {"floor": rows.floor(calls, r)}
        row["write_behind_off"] = rows.guard(False)(calls, 1000 + r)
        row["write_behind_on"] = rows.guard(True)(calls, 2000 + r)
        row["write_behind_on_with_flush"] = rows.last_flush / calls
        per_round.append(row)
    rows.close()

    def median(name: str) -> float:
        return statistics.median(row[name] for row in per_round) * 1e6

    def ratio(a: str, b: str) -> dict[str, float]:
        values = [row[a] / row[b] for row in per_round]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "us_per_call": {name: median(name) for name in per_round[0]},
        "on_over_floor": ratio("write_behind_on", "floor"),
        "on_over_off": ratio("write_behind_on", "write_behind_off"),
        "off_over_floor": ratio("write_behind_off", "floor"),
        "on_with_flush_over_floor": ratio("write_behind_on_with_flush", "floor"),
    }


def report(title: str, figures: dict[str, Any], target: tuple[str, float] | None) -> None:
    print(f"\n{title}")
    for name, us in figures["us_per_call"].items():
        print(f"  {name:28s} {us:8.1f} us/call")
    for name in ("off_over_floor", "on_over_floor", "on_with_flush_over_floor", "on_over_off"):
        r = figures[name]
        print(f"  {name:28s} {r['median']:.3f}x (range {r['min']:.3f}-{r['max']:.3f})")
    if target is not None:
        name, goal = target
        met = figures[name]["median"] <= goal
        print(f"  target {name} <= {goal}: {'met' if met else 'MISSED'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, default=0.5, help="added each way by the proxy")
    parser.add_argument("--calls", type=int, default=600, help="calls per row per round, through the proxy")
    parser.add_argument("--loopback-calls", type=int, default=3000, help="calls per row per round, loopback")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    with EmbeddedRedis(unix_socket=False) as server:
        machine = describe_machine(server, "loopback TCP, through the proxy and without it")
        host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1].split("/")[0])
        proxy, proxy_port = start_proxy((host, port), args.delay_ms / 1000)
        try:
            proxied = measure(f"redis://{host}:{proxy_port}/0", args.calls, args.rounds)
        finally:
            proxy.terminate()
            proxy.join(5)
        loopback = measure(server.url, args.loopback_calls, args.rounds)
    report(
        f"through a proxy adding {args.delay_ms} ms each way ({args.calls} calls x {args.rounds} rounds)",
        proxied,
        ("on_over_floor", TARGET_PROXY_RATIO),
    )
    report(
        f"loopback ({args.loopback_calls} calls x {args.rounds} rounds)",
        loopback,
        ("on_over_off", TARGET_LOOPBACK_RATIO),
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"delay_ms": args.delay_ms, "proxied": proxied, "loopback": loopback, "machine": machine},
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
