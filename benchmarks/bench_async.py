"""Async guarded calls against a raw redis.asyncio floor, at several concurrency levels.

Each guarded call is two commands to Redis (the begin, a plain ``SET NX`` on a key that holds
nothing, then the ``commit`` script) around an async tool that returns at once. The floor makes two
round trips of the same shape with no guard at all: ``SET key value NX PX`` then
``SET key value XX PX``, with a value as large as the guarded call's stored result, over the same
connection pool, one command per round trip. The ratio guarded/floor is the share of the raw Redis
throughput the guard keeps (above 1: the store's auto-pipelining sends concurrent calls' commands
together). Both modes of the store are measured in each round: with auto-pipelining (the default)
and without (``auto_pipeline=False``, every command alone, as the floor).

    python -m benchmarks.bench_async                     # 3000 calls per level, levels 1 64 256
    python -m benchmarks.bench_async --calls 500 --json out.json
    python -m benchmarks.bench_async --without-lease     # also the guard with lease=None, to compare

The guard is the default one (``EffectGuard(store)``: a lease of 60 s on every record, see
docs/in-doubt.md); ``--without-lease`` adds a row of the same guard with ``lease=None`` in every round.

It starts a private redis-server (unix socket unless --tcp) and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from airlock_redis import EffectGuard, RedisEffectStore, tool_call_context
from airlock_redis.core.codec import DEFAULT_MAX_RESULT_BYTES, encode_result
from airlock_redis.embedded import EmbeddedRedis
from benchmarks.compare import describe_machine

DEFAULT_LEVELS = (1, 64, 256)
RESULT: dict[str, object] = {"status": "ok", "charge_id": "ch_0123456789abcdef", "cents": 2500}


@dataclass(frozen=True)
class Level:
    """One concurrency level: the medians over rounds, and the ratio guarded/floor taken round by
    round (both measured back to back, so the machine's noise hits both alike) with its median."""

    concurrency: int
    calls: int
    floor_calls_per_s: float
    guarded_calls_per_s: float
    ratios: tuple[float, ...] = ()
    unpipelined_calls_per_s: float = 0.0  # the store with auto_pipeline=False
    unpipelined_ratios: tuple[float, ...] = ()
    leaseless_calls_per_s: float = 0.0  # the default store, the guard with lease=None (--without-lease)
    leaseless_ratios: tuple[float, ...] = ()
    # this process's CPU (user + system) per call, medians over rounds: near the wall time per call
    # (concurrency / calls per second), the ratio measures client CPU; far below it, waiting for replies
    floor_cpu_us: float = 0.0
    guarded_cpu_us: float = 0.0

    @property
    def ratio(self) -> float:
        if self.ratios:
            return statistics.median(self.ratios)
        return self.guarded_calls_per_s / self.floor_calls_per_s

    @property
    def unpipelined_ratio(self) -> float:
        return statistics.median(self.unpipelined_ratios) if self.unpipelined_ratios else 0.0

    @property
    def leaseless_ratio(self) -> float:
        return statistics.median(self.leaseless_ratios) if self.leaseless_ratios else 0.0


@dataclass(frozen=True)
class Run:
    """One drive: calls per second, and this process's CPU per call in microseconds."""

    calls_per_s: float
    cpu_us: float


async def drive(calls: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> Run:
    """Run ``calls`` calls of ``one`` from ``concurrency`` workers."""
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < calls:
            index = next_index
            next_index += 1
            await one(index)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, calls))))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return Run(calls / wall, cpu / calls * 1e6)


async def measure_level(  # noqa: PLR0917
    store: RedisEffectStore,
    concurrency: int,
    calls: int,
    rounds: int,
    warmup: int,
    unpipelined: RedisEffectStore | None = None,
    without_lease: bool = False,
) -> Level:
    client = store.async_client()  # the guard's own pool, for the floor too
    value = encode_result(RESULT, DEFAULT_MAX_RESULT_BYTES)
    ttl_ms = 60_000

    async def charge(account: str, cents: int) -> dict[str, object]:
        return RESULT

    tools = {"auto": EffectGuard(store).wrap(charge)}
    if unpipelined is not None:
        tools["alone"] = EffectGuard(unpipelined).wrap(charge)
    if without_lease:
        tools["leaseless"] = EffectGuard(store, lease=None).wrap(charge)
    run = secrets.token_hex(4)

    async def floor_call(i: int) -> None:
        key = f"bench:floor:{run}:{concurrency}:{i}"
        await client.set(key, value, nx=True, px=ttl_ms)
        await client.set(key, value, xx=True, px=ttl_ms)

    def guarded_call(mode: str, prefix: str) -> Callable[[int], Awaitable[None]]:
        tool = tools[mode]

        async def one(i: int) -> None:
            with tool_call_context(f"{prefix}-{mode}-{i}"):
                await tool("acct_1", 2500)

        return one

    await drive(warmup, concurrency, floor_call)
    for mode in tools:
        await drive(warmup, concurrency, guarded_call(mode, f"warm-{run}-{concurrency}"))
    floor: list[float] = []
    guarded: dict[str, list[float]] = {mode: [] for mode in tools}
    cpu: dict[str, list[float]] = {"floor": [], **{mode: [] for mode in tools}}
    for r in range(rounds):  # interleaved: each round's ratios compare neighbours in time
        ran = await drive(calls, concurrency, floor_call)
        floor.append(ran.calls_per_s)
        cpu["floor"].append(ran.cpu_us)
        for mode, figures in guarded.items():
            ran = await drive(calls, concurrency, guarded_call(mode, f"g-{run}-{concurrency}-{r}"))
            figures.append(ran.calls_per_s)
            cpu[mode].append(ran.cpu_us)
    alone = guarded.get("alone", [])
    leaseless = guarded.get("leaseless", [])
    return Level(
        concurrency,
        calls,
        statistics.median(floor),
        statistics.median(guarded["auto"]),
        tuple(g / f for g, f in zip(guarded["auto"], floor, strict=True)),
        statistics.median(alone) if alone else 0.0,
        tuple(g / f for g, f in zip(alone, floor, strict=True)) if alone else (),
        statistics.median(leaseless) if leaseless else 0.0,
        tuple(g / f for g, f in zip(leaseless, floor, strict=True)) if leaseless else (),
        statistics.median(cpu["floor"]),
        statistics.median(cpu["auto"]),
    )


async def measure(  # noqa: PLR0917
    url: str, levels: Sequence[int], calls: int, rounds: int, warmup: int, without_lease: bool = False
) -> list[Level]:
    store = RedisEffectStore(url, namespace="bench", committed_ttl=120)
    unpipelined = RedisEffectStore(url, namespace="bench", committed_ttl=120, auto_pipeline=False)
    try:
        return [
            await measure_level(store, c, calls, rounds, warmup, unpipelined, without_lease) for c in levels
        ]
    finally:
        await store.aclose()
        await unpipelined.aclose()


def report(levels: Sequence[Level], out: Any = sys.stdout) -> None:
    print(
        f"{'concurrency':>11}  {'floor calls/s':>14}  {'guarded calls/s':>16}  {'guarded/floor':>13}  "
        f"{'range':>9}  {'one by one calls/s':>18}  {'one by one/floor':>16}",
        file=out,
    )
    for level in levels:
        low, high = min(level.ratios, default=level.ratio), max(level.ratios, default=level.ratio)
        leaseless = (
            f"  without lease {level.leaseless_calls_per_s:,.0f} calls/s ({level.leaseless_ratio:.2f})"
            if level.leaseless_ratios
            else ""
        )
        print(
            f"{level.concurrency:>11}  {level.floor_calls_per_s:>14,.0f}  "
            f"{level.guarded_calls_per_s:>16,.0f}  {level.ratio:>13.2f}  {low:.2f}-{high:.2f}  "
            f"{level.unpipelined_calls_per_s:>18,.0f}  {level.unpipelined_ratio:>16.2f}{leaseless}",
            file=out,
        )
    print("guarded: the store's defaults (auto-pipelining); one by one: auto_pipeline=False", file=out)
    for level in levels:
        print(
            f"client CPU per call at {level.concurrency} (its share of the time per call): "
            f"floor {level.floor_cpu_us:.0f} us ({busy(level.floor_cpu_us, level.floor_calls_per_s):.2f}), "
            f"guarded {level.guarded_cpu_us:.0f} us "
            f"({busy(level.guarded_cpu_us, level.guarded_calls_per_s):.2f})",
            file=out,
        )


def busy(cpu_us: float, calls_per_s: float) -> float:
    """The share of the time per call this process spent on the CPU: near 1, the ratio measures client
    CPU; well below it, waiting for replies (what waking a waiting process costs differs most between
    machines)."""
    return cpu_us * calls_per_s / 1e6


def figures(levels: Sequence[Level], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "benchmark": "async guarded calls vs raw redis.asyncio floor (2 round trips each)",
        "calls_per_level": args.calls,
        "rounds": args.rounds,
        "transport": "tcp" if args.tcp else "unix",
        "python": platform.python_version(),
        "levels": [
            {
                **asdict(level),
                "ratio": level.ratio,
                "unpipelined_ratio": level.unpipelined_ratio,
                "leaseless_ratio": level.leaseless_ratio,
            }
            for level in levels
        ],
        "how": "medians over rounds; the ratio is guarded/floor per round, its median reported",
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=3000, help="calls per level and round (default 3000)")
    parser.add_argument(
        "--levels", type=int, nargs="+", default=list(DEFAULT_LEVELS), help="concurrency levels"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds per level: medians, ratios taken round by round (default 5)",
    )
    parser.add_argument("--warmup", type=int, default=200, help="warm-up calls per level")
    parser.add_argument("--tcp", action="store_true", help="loopback TCP instead of a unix socket")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--without-lease", action="store_true", help="also measure the guard with lease=None in every round"
    )
    args = parser.parse_args(argv)
    if args.calls <= 0 or args.rounds <= 0 or args.warmup < 0 or min(args.levels) <= 0:
        parser.error("--calls, --rounds and --levels must be positive, --warmup not negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with EmbeddedRedis(unix_socket=not args.tcp) as server:
        machine = describe_machine(server, "loopback TCP" if args.tcp else "unix socket")
        levels = asyncio.run(
            measure(server.url, args.levels, args.calls, args.rounds, args.warmup, args.without_lease)
        )
    report(levels)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {**figures(levels, args), "redis_server": machine["redis_server"], "machine": machine},
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
