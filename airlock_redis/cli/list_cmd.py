"""``airlock-redis list``: records of a namespace, filtered, with SCAN (never KEYS), a page at a time.

On a Redis Cluster every primary is scanned. At most ``--limit`` records are printed and at most
``--max-scan`` keys examined per run; when the keyspace was not covered, the output ends with the
cursor to pass as ``--cursor`` for the next page.

Exit codes: 0 listed (possibly nothing); 2 bad arguments (an --older-than without a unit, a --cursor
that no list printed, a URL the store does not take), or a Redis it cannot use (no answer,
authentication failed, not allowed, a Cluster node behind a plain redis:// URL); 130 interrupted; 141
the reader of its output went away.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from ..core.errors import StoreError
from ..operator import ListFilter, ListQuery, format_duration, parse_duration
from ..redaction import redact
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    add_target_arguments,
    open_operator_store,
    positive_int,
    store_failed,
)

_CURSOR = re.compile(r"[0-9]+:[0-9]+:[0-9]+")
HELP = (
    "list records (SCAN on every primary, bounded and paged): --status, --tool, --older-than, "
    "--running, --abandoned"
)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cursor(text: str) -> str:
    """A cursor as a page prints it: ``<primary>:<SCAN cursor>:<records of that batch shown>``."""
    if not _CURSOR.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a cursor from a previous list: {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, embedded_default=False)
    parser.add_argument("--status", choices=("pending", "unknown", "committed"), help="only this status")
    parser.add_argument("--tool", help="only records of this tool")
    live = parser.add_mutually_exclusive_group()
    live.add_argument(
        "--running",
        action="store_const",
        const="running",
        dest="liveness",
        help="only pending records whose attempt renews its lease (it runs)",
    )
    live.add_argument(
        "--abandoned",
        action="store_const",
        const="abandoned",
        dest="liveness",
        help="only pending records whose lease lapsed (the attempt is gone or hung: in doubt)",
    )
    parser.add_argument(
        "--older-than",
        type=_duration,
        metavar="AGE",
        help="only records begun longer ago than AGE, with its unit: 90s, 10m, 2h, 1d (ms, s, m, h, d)",
    )
    parser.add_argument("--limit", type=positive_int, default=50, help="print at most N records (default 50)")
    parser.add_argument(
        "--cursor", type=_cursor, default=None, help="continue from the cursor a previous page printed"
    )
    parser.add_argument(
        "--scan-count", type=positive_int, default=500, help="COUNT hint of each SCAN (default 500)"
    )
    parser.add_argument(
        "--max-scan",
        type=positive_int,
        default=100_000,
        help="examine at most about N keys per run (default 100000)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (records, scanned, next_cursor)")
    parser.epilog = (
        "exit codes: 0 listed, 2 bad arguments or a Redis it cannot use (no answer, authentication "
        "failed, not allowed, a Cluster node behind a plain redis:// URL), 130 interrupted, 141 the "
        "reader of its output went away"
    )


def run(args: argparse.Namespace) -> int:
    where = ListFilter(
        status=args.status, tool=args.tool, older_than_s=args.older_than, liveness=args.liveness
    )
    with open_operator_store(args) as views:
        try:
            query = ListQuery(where, args.limit, args.scan_count, args.max_scan, args.cursor)
            page = views.list_records(query)
        except StoreError as exc:
            return store_failed(exc, args)
        except ValueError as exc:  # the arguments: a cursor no list printed
            print(f"error: {redact(str(exc))} (see airlock-redis list --help)", file=sys.stderr)
            return EXIT_USAGE
    records = page.records
    if args.json:
        out = {
            "records": [r.as_dict(preview_chars=None) for r in records],
            "scanned": page.scanned,
            "next_cursor": page.next_cursor,
        }
        print(redact(json.dumps(out, sort_keys=True)))
        return EXIT_OK
    header = f"{'STATUS':<10} {'TOOL':<20} {'ATTEMPT':>7} {'AGE':>8} {'TTL':>8}  TOOL_CALL_ID"
    print(header)
    for r in records:
        # newer: a newer airlock-redis's layout; a pending record under a lease: running or abandoned
        status = r.liveness or r.status or ("newer" if r.layout_version else "?")
        if r.problems:
            status += "!"
        attempt = str(r.attempt) if r.attempt is not None else "-"
        print(
            redact(
                f"{status:<10} {(r.tool or '-')[:20]:<20} {attempt:>7} {format_duration(r.age_ms()):>8} "
                f"{format_duration(r.ttl_ms):>8}  {r.tool_call_id!r}"
            )
        )
    summary = f"{len(records)} record(s), {page.scanned} key(s) examined"
    if page.next_cursor is not None:
        summary += f"; more may follow: --cursor {page.next_cursor}"
    print(summary, file=sys.stderr)
    return EXIT_OK
