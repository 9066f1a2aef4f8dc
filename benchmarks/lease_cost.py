"""What leases and waiting (issue 25) cost a quick call, and a duplicate that waits.

    python -m benchmarks.lease_cost [--calls 2000] [--rounds 7] [--json out.json]

Starts its own redis-server on loopback TCP ($AIRLOCK_REDIS_SERVER, else the one on PATH, default
configuration) and measures, for a guard with ``lease=None, wait_for_running=0`` (the spec's table:
"today") against one with the defaults (``lease=60``, ``renew_every=20``, ``wait_for_running=5``):

- **latency** of a quick guarded call (a unique tool_call_id, a tool that returns at once, blocking),
  on RedisEffectStore and on InMemoryEffectStore: ``--rounds`` rounds of ``--calls`` calls per guard,
  the two guards alternating every ``--block`` calls within each round (the order swapped every
  round), medians per variant and the ratio taken round by round (median and range), and the
  server's time inside commands per call;
- **server commands per call** (``INFO commandstats`` deltas, commands the scripts call included)
  and the server time inside commands; the renewals the keeper sent (the store's ``renew_leases``,
  counted): a quick call must send none;
- **memory per record**: ``MEMORY USAGE <key> SAMPLES 0`` and ``STRLEN`` of a pending record (layout a
  without a lease, b with one) and of the committed record (layout a either way);
- **a duplicate of a running call**: the commands of one owner call (its tool holds 0.2 s) plus one
  duplicate, the duplicate refused at once (``wait_for_running=0``) against one that waits and
  replays the value when the owner commits;
- **traces** (MONITOR) of one quick call of each guard and of each duplicate case: the commands sent
  (round trips) apart from those the scripts ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from airlock_redis import EffectGuard, EffectInProgress, EffectStore, InMemoryEffectStore, RedisEffectStore
from airlock_redis.core.records import BeginRequest
from airlock_redis.embedded import EmbeddedRedis
from airlock_redis.lease import KEEPER

OWN = {"info", "config", "memory", "strlen", "ping", "hello", "client", "command", "flushall", "scan"}


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000, help="calls per variant per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    parser.add_argument(
        "--block", type=int, default=100, help="calls in a row of one variant before the other's (100)"
    )
    parser.add_argument("--records", type=int, default=200, help="records read for memory (default 200)")
    parser.add_argument("--duplicates", type=int, default=20, help="owner+duplicate pairs per case (20)")
    parser.add_argument("--json", help="write the figures to this file")
    return parser.parse_args(argv)


def charge(cents: int) -> dict[str, Any]:
    return {"charged": cents}


def guards(store: EffectStore) -> dict[str, EffectGuard]:
    return {
        "lease=None": EffectGuard(store=store, lease=None, wait_for_running=0),
        "default lease": EffectGuard(store=store),
    }


# -- latency ---------------------------------------------------------------------------------------
def latency(
    make_store: Callable[[], EffectStore],
    calls: int,
    rounds: int,
    block: int,
    admin: redis.Redis | None = None,
) -> dict[str, Any]:
    """Per call, each variant: ``rounds`` rounds of ``calls`` calls, sent in blocks of ``block`` calls
    that alternate between the variants (ABAB..., BABA... the next round), so that the machine's
    noise hits both alike; the ratio is taken round by round. ``admin``: the server's client, to take
    its time inside commands per call (INFO commandstats, read before and after each round)."""
    store = make_store()
    variants = guards(store)
    names = list(variants)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    server_us: dict[str, list[float]] = {name: [] for name in names}
    ratios: list[float] = []
    for name, guard in variants.items():  # warm up: scripts loaded, connections made
        for i in range(200):
            guard.call(f"warm-{name}-{i}", charge, i)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        spent = dict.fromkeys(names, 0.0)
        usec = dict.fromkeys(names, 0)
        prefix = f"r{r}-{secrets.token_hex(3)}-"
        for b in range(max(1, calls // block)):
            for name in order:
                guard = variants[name]
                before = commandstats(admin) if admin is not None else {}
                start = time.perf_counter()
                for i in range(block):
                    guard.call(f"{prefix}{name}-{b}-{i}", charge, i)
                spent[name] += time.perf_counter() - start
                if admin is not None:
                    usec[name] += sum(u for _, u in delta(before, commandstats(admin)).values())
        done = max(1, calls // block) * block
        for name in names:
            per_call[name].append(spent[name] / done * 1e6)
            server_us[name].append(usec[name] / done)
        ratios.append(spent["default lease"] / spent["lease=None"])
    close = getattr(store, "close", None)
    if close is not None:
        close()
    figures: dict[str, Any] = {
        "us_per_call_median": {name: round(statistics.median(v), 1) for name, v in per_call.items()},
        "us_per_call_rounds": {name: [round(x, 1) for x in v] for name, v in per_call.items()},
        "ratio_lease_over_none": {
            "median": round(statistics.median(ratios), 3),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
        },
    }
    if admin is not None:
        figures["server_us_per_call_median"] = {
            name: round(statistics.median(v), 2) for name, v in server_us.items()
        }
    return figures


# -- commands per call ------------------------------------------------------------------------------
def commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in stats.items()
        if name.removeprefix("cmdstat_").split("|")[0] not in OWN
    }


def delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    out = {}
    for name, (calls, usec) in after.items():
        was = before.get(name, (0, 0))
        if calls - was[0]:
            out[name] = (calls - was[0], usec - was[1])
    return out


class CountingRedisStore(RedisEffectStore):
    """Counts the renewals the keeper sends."""

    renewals = 0

    def renew_leases(self, requests: Any) -> Any:
        CountingRedisStore.renewals += len(requests)
        return super().renew_leases(requests)


def commands_per_call(url: str, admin: redis.Redis, calls: int) -> dict[str, Any]:
    store = CountingRedisStore(url, namespace=f"cmd:{secrets.token_hex(3)}")
    out: dict[str, Any] = {}
    for name, guard in guards(store).items():
        for i in range(50):
            guard.call(f"warm-{name}-{i}", charge, i)
        before = commandstats(admin)
        renewals_before = CountingRedisStore.renewals
        for i in range(calls):
            guard.call(f"{name}-{i}", charge, i)
        got = delta(before, commandstats(admin))
        out[name] = {
            "commands_per_call": {k: round(c / calls, 3) for k, (c, _) in sorted(got.items())},
            "all_commands_per_call": round(sum(c for c, _ in got.values()) / calls, 3),
            "renewals_sent": CountingRedisStore.renewals - renewals_before,
            "leases_held_after": KEEPER.held,  # 0: nothing is left for the keeper to renew later
        }
    store.close()
    return out


# -- memory per record ------------------------------------------------------------------------------
def memory(url: str, admin: redis.Redis, records: int) -> dict[str, Any]:
    store = RedisEffectStore(url, namespace="mem")
    out: dict[str, Any] = {}
    for label, lease_ms in (("layout a (lease=None)", None), ("layout b (lease 60 s)", 60_000)):
        pending, committed, pending_len, committed_len = [], [], [], []
        for i in range(records):
            tool_call_id = f"call-{lease_ms}-{i:06d}"
            request = BeginRequest(
                tool_call_id, secrets.token_hex(32), "charge", secrets.token_hex(16), False, lease_ms
            )
            store.begin(request)
            key = store.key(tool_call_id)
            pending.append(int(admin.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")))
            pending_len.append(int(admin.strlen(key)))
            store.commit(request, 1, secrets.token_bytes(200), None)
            committed.append(int(admin.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")))
            committed_len.append(int(admin.strlen(key)))
            admin.delete(key)
        out[label] = {
            "pending_memory_usage": statistics.mean(pending),
            "pending_strlen": statistics.mean(pending_len),
            "committed_200B_memory_usage": statistics.mean(committed),
            "committed_200B_strlen": statistics.mean(committed_len),
        }
    store.close()
    return out


# -- a duplicate of a running call ------------------------------------------------------------------
def holding(started: threading.Event, seconds: float) -> Callable[[int], dict[str, Any]]:
    """The owner's ``charge``: says it started, holds ``seconds``, returns a value of its own."""

    def charge(cents: int) -> dict[str, Any]:
        started.set()
        time.sleep(seconds)
        return {"charged": cents, "by": "owner"}

    return charge


def duplicates(url: str, admin: redis.Redis, pairs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cases = (("refused at once (wait_for_running=0)", 0.0), ("waits (wait_for_running=5)", 5.0))
    for case, wait in cases:
        ns = f"dup:{secrets.token_hex(3)}"
        owner_store = RedisEffectStore(url, namespace=ns)
        dup_store = RedisEffectStore(url, namespace=ns)
        owner = EffectGuard(store=owner_store)
        dup = EffectGuard(store=dup_store, wait_for_running=wait)
        owner.call("warm", charge, 1)
        dup.call("warm-dup", charge, 1)
        outcomes: dict[str, int] = {}
        waited: list[float] = []
        before = commandstats(admin)
        for i in range(pairs):
            started = threading.Event()
            thread = threading.Thread(target=owner.call, args=(f"pair-{i}", holding(started, 0.2), 7))
            thread.start()
            if not started.wait(10):
                raise RuntimeError("the owner's tool did not start")
            t0 = time.perf_counter()
            try:
                value = dup.call(f"pair-{i}", charge, 7)
                outcome = "replayed" if value.get("by") == "owner" else "ran"
            except EffectInProgress:
                outcome = "effect_in_progress"
            waited.append(time.perf_counter() - t0)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            thread.join(10)
        got = delta(before, commandstats(admin))
        out[case] = {
            "outcomes": outcomes,
            "commands_per_pair": {k: round(c / pairs, 2) for k, (c, _) in sorted(got.items())},
            "all_commands_per_pair": round(sum(c for c, _ in got.values()) / pairs, 2),
            "duplicate_ms_median": round(statistics.median(waited) * 1000, 1),
        }
        close_store(owner_store)
        close_store(dup_store)
    return out


# -- one call traced with MONITOR: which commands are round trips, which run inside a script ----------
END_OF_TRACE = "lease-cost-end-of-trace"


def traced(url: str, action: Callable[[], object]) -> dict[str, list[str]]:
    """The commands the server ran during ``action``: ``sent`` by clients (round trips, or commands
    of one pipeline) and ``in_scripts``. A command's first word, and SET's NX/XX/PX flags."""
    client = redis.Redis.from_url(url)
    seen: dict[str, list[str]] = {"sent": [], "in_scripts": []}
    ready = threading.Event()

    def listen() -> None:
        with client.monitor() as monitor:
            ready.set()
            while True:
                command = monitor.next_command()
                words = command["command"].split()
                if words and words[-1] == END_OF_TRACE:
                    return
                name = words[0].upper() if words else "?"
                if name == "SET":
                    name += "".join(
                        f" {w.upper()}" for w in words[3:] if w.upper() in ("NX", "XX", "PX", "GET")
                    )
                if name in ("MONITOR", "PING", "HELLO", "CLIENT"):  # connection set-up
                    continue
                seen["in_scripts" if command["client_type"] == "lua" else "sent"].append(name)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.2)
    action()
    time.sleep(0.1)
    client.echo(END_OF_TRACE)
    thread.join(10)
    client.close()
    return seen


def traces(url: str) -> dict[str, Any]:
    ns = f"trace:{secrets.token_hex(3)}"
    plain_store, leased_store = RedisEffectStore(url, namespace=ns), RedisEffectStore(url, namespace=ns)
    plain = EffectGuard(store=plain_store, lease=None, wait_for_running=0)
    leased = EffectGuard(store=leased_store)
    for guard in (plain, leased):  # scripts loaded, connections made
        guard.call(f"warm-{id(guard)}", charge, 1)
    out: dict[str, Any] = {
        "quick call, lease=None": traced(url, lambda: plain.call("q-plain", charge, 1)),
        "quick call, default lease": traced(url, lambda: leased.call("q-leased", charge, 1)),
    }
    for case, wait in (("duplicate refused", 0.0), ("duplicate waits", 5.0)):
        dup_store = RedisEffectStore(url, namespace=ns)
        dup = EffectGuard(store=dup_store, wait_for_running=wait)
        dup.call(f"warm-dup-{case}", charge, 1)
        tool_call_id = f"pair-{case}"

        def pair(dup: EffectGuard = dup, tool_call_id: str = tool_call_id) -> None:
            started = threading.Event()
            thread = threading.Thread(target=leased.call, args=(tool_call_id, holding(started, 0.2), 7))
            thread.start()
            started.wait(10)
            with contextlib.suppress(EffectInProgress):
                dup.call(tool_call_id, charge, 7)
            thread.join(10)

        out[f"owner call + {case}"] = traced(url, pair)
        close_store(dup_store)
    close_store(plain_store)
    close_store(leased_store)
    return out


def close_store(store: RedisEffectStore) -> None:
    """Close the store, and its wake-up listener: ``RedisEffectStore.close()`` leaves the listener's
    thread and pub/sub connection open (it reconnects when the pool is closed under it)."""
    wakeups = getattr(store, "_wakeups", None)
    if wakeups is not None:
        wakeups.stop()
    store.close()


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    figures: dict[str, Any] = {
        "command": " ".join(["python", "-m", "benchmarks.lease_cost", *(argv or sys.argv[1:])])
    }
    with EmbeddedRedis(unix_socket=False) as server:
        admin = server.client()
        info = admin.info("server")
        figures["server"] = (
            f"{Path(server.binary).name} {info.get('valkey_version') or info['redis_version']}"
        )
        figures["redis_py"] = redis.__version__
        figures["cpus"] = os.cpu_count()
        figures["load_before"] = os.getloadavg()
        figures["latency_redis_tcp"] = latency(
            lambda: RedisEffectStore(server.url, namespace=f"lat:{secrets.token_hex(3)}"),
            args.calls,
            args.rounds,
            args.block,
            admin,
        )
        figures["latency_in_memory"] = latency(InMemoryEffectStore, args.calls, args.rounds, args.block)
        figures["commands"] = commands_per_call(server.url, admin, args.calls)
        figures["memory"] = memory(server.url, admin, args.records)
        figures["duplicates"] = duplicates(server.url, admin, args.duplicates)
        figures["traces"] = traces(server.url)
        figures["load_after"] = os.getloadavg()
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
