"""Redis memory per committed record, beyond the stored result it holds.

    python benchmarks/record_memory.py [--records 200] [--old-checkout /tmp/oldlayout] [--markdown out.md]

Starts its own redis-server ($AIRLOCK_REDIS_SERVER, else the one on PATH, default configuration),
commits ``--records`` calls through RedisEffectStore (begin + commit, a guard's hex token and sha256
key, tool "charge") with results of each size, and reads ``MEMORY USAGE <key> SAMPLES 0`` of each
record. Then it replaces each record by a plain SET of the same result bytes under the same key and
reads that too: what the result alone costs Redis, allocator rounding and the key included. The
difference is what the record costs beyond its result. A second pass stores a 32-byte MAC with
each result (a guard with a signing key).

``--old-checkout`` runs the same measurement against another checkout of the project (for example
the previous layout: ``git worktree add /tmp/oldlayout <commit>``) and adds its figures.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

SIZES = (8, 200, 1024, 4096)
MORE_SIZES = (60, 100, 500, 2000, 3000, 8192)
SWEEP = tuple(range(16, 8193, 61))  # many sizes, a few records each: the mean washes out size classes
SWEEP_RECORDS = 3
TOOL = "charge"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200, help="records per size (default 200)")
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES + MORE_SIZES)), help="result sizes in bytes"
    )
    parser.add_argument("--code", help="import airlock_redis from this checkout (default: this one)")
    parser.add_argument("--old-checkout", help="also measure the checkout at this path (its own layout)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the sweep over sizes 16 B - 8 KB")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--markdown", help="append the table to this file")
    return parser.parse_args(argv)


def measure(sizes: list[int], records: int, sweep: bool) -> dict[str, Any]:
    """Mean MEMORY USAGE (SAMPLES 0) per record and per plain string, for each size, with and
    without a MAC. Imports the package late: ``--code`` picks which checkout."""
    from airlock_redis.core.records import BeginRequest
    from airlock_redis.embedded import EmbeddedRedis
    from airlock_redis.stores.redis_store import RedisEffectStore

    rows: list[dict[str, Any]] = []
    with EmbeddedRedis() as server:
        client = server.client()
        info = client.info("server")
        name = "Valkey" if "valkey" in Path(server.binary).name else "Redis"
        version = info.get("valkey_version") or info.get("redis_version")
        store = RedisEffectStore(server.url, namespace="mem")
        for size in sizes:
            row: dict[str, Any] = {"size": size}
            for label, mac_bytes in (("", 0), ("signed_", 32)):
                record_usage, plain_usage = [], []
                for i in range(records):
                    tool_call_id = f"call-{size:05d}-{i:06d}"
                    request = BeginRequest(
                        tool_call_id, secrets.token_hex(32), TOOL, secrets.token_hex(16), reversible=False
                    )
                    value = secrets.token_bytes(size)
                    store.begin(request)
                    store.commit(request, 1, value, secrets.token_bytes(mac_bytes) if mac_bytes else None)
                    key = store.key(tool_call_id)
                    record_usage.append(_usage(client, key))
                    client.delete(key)
                    client.set(key, value)
                    plain_usage.append(_usage(client, key))
                    client.delete(key)
                record_mean, plain_mean = statistics.fmean(record_usage), statistics.fmean(plain_usage)
                row[f"{label}record"] = record_mean
                row[f"{label}plain"] = plain_mean
                row[f"{label}beyond"] = record_mean - plain_mean
            rows.append(row)
        store.close()
        client.close()
    figures = {"server": f"{name} {version}", "binary": server.binary, "records": records, "rows": rows}
    if sweep:
        swept = measure(list(SWEEP), SWEEP_RECORDS, sweep=False)["rows"]
        figures["sweep"] = {
            "sizes": len(swept),
            "beyond": statistics.fmean(r["beyond"] for r in swept),
            "max_beyond": max(r["beyond"] for r in swept),
            "signed_beyond": statistics.fmean(r["signed_beyond"] for r in swept),
        }
    return figures


def _usage(client: Any, key: bytes) -> int:
    usage = client.memory_usage(key, samples=0)
    if not isinstance(usage, int):
        raise RuntimeError(f"MEMORY USAGE of {key!r} answered {usage!r}")
    return usage


def _old_figures(checkout: str, sizes: list[int], records: int, sweep: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--code", checkout, "--json", "--records", str(records)]
    command += ["--sizes", ",".join(map(str, sizes))] + (["--no-sweep"] if not sweep else [])
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1800)
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def table(figures: dict[str, Any], old: dict[str, Any] | None) -> str:
    lines = [
        f"### {figures['server']} ({figures['records']} records per size, MEMORY USAGE SAMPLES 0, mean)",
        "",
        "| result | record | plain SET of the result | beyond the result | beyond, with a 32 B MAC |"
        + (" previous layout: record | previous layout: beyond |" if old else ""),
        "|---:|---:|---:|---:|---:|" + ("---:|---:|" if old else ""),
    ]
    old_rows = {row["size"]: row for row in old["rows"]} if old else {}
    for row in sorted(figures["rows"], key=lambda r: int(r["size"])):
        cells = [
            f"{row['size']} B",
            f"{row['record']:.0f} B",
            f"{row['plain']:.0f} B",
            f"**{row['beyond']:.0f} B**",
            f"{row['signed_beyond']:.0f} B",
        ]
        previous = old_rows.get(row["size"])
        if previous is not None:
            cells += [f"{previous['record']:.0f} B", f"{previous['beyond']:.0f} B"]
        lines.append("| " + " | ".join(cells) + " |")
    sweep = figures.get("sweep")
    if sweep:
        line = (
            f"\nOver {sweep['sizes']} result sizes from {SWEEP[0]} B to {SWEEP[-1]} B "
            f"({SWEEP_RECORDS} records each): {sweep['beyond']:.0f} B beyond the result on average "
            f"({sweep['signed_beyond']:.0f} B with a MAC), {sweep['max_beyond']:.0f} B at most"
        )
        old_sweep = old.get("sweep") if old else None
        if old_sweep:
            line += (
                f"; previous layout {old_sweep['beyond']:.0f} B on average, "
                f"{old_sweep['max_beyond']:.0f} B at most"
            )
        lines.append(line + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    code = Path(args.code).resolve() if args.code else Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(code))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    figures = measure(sizes, args.records, sweep=not args.no_sweep)
    if args.json:
        print(json.dumps(figures))
        return 0
    old = (
        _old_figures(args.old_checkout, sizes, args.records, not args.no_sweep) if args.old_checkout else None
    )
    text = table(figures, old)
    print(text)
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
