"""``airlock-redis audit``: the operators' verdicts on this namespace's records, newest first.

Every ``resolve`` adds one entry to the namespace's capped audit stream (``<namespace>:audit``, the
newest 10,000 entries or so are kept), so each operator on each machine sees the same trail.

Exit codes: 0 shown (also when there is nothing yet); 2 bad arguments (a URL the store does not
take), or a Redis it cannot use (no answer, authentication failed, not allowed, a Cluster node behind
a plain redis:// URL); 130 interrupted; 141 the reader of its output went away.
"""

from __future__ import annotations

import argparse
import json

from ..core.errors import StoreError
from .common import EXIT_OK, add_target_arguments, open_operator_store, positive_int, store_failed

HELP = "show the operators' verdicts on this namespace's records (the audit stream), newest first"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, embedded_default=False)
    parser.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="entries to show (default 20)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.epilog = (
        "exit codes: 0 shown, 2 bad arguments or a Redis it cannot use (no answer, authentication "
        "failed, not allowed, a Cluster node behind a plain redis:// URL), 130 interrupted, 141 the "
        "reader of its output went away"
    )


def run(args: argparse.Namespace) -> int:
    with open_operator_store(args) as views:
        try:
            entries = views.read_audit(limit=args.limit)
        except StoreError as exc:
            return store_failed(exc, args)
    if args.json:
        for entry in entries:
            print(json.dumps(entry, sort_keys=True, ensure_ascii=False))
        return EXIT_OK
    if not entries:
        print(f"no verdicts recorded in {views.namespace!r} yet")
        return EXIT_OK
    for entry in entries:
        before = entry.get("before") or {}
        who = f"{entry.get('operator', '?')}@{entry.get('host', '?')}"
        change = f"{before.get('status') or '-'} -> {entry.get('verdict', '?')}"
        forced = "  (forced)" if entry.get("force") else ""
        print(
            f"{entry.get('ts', '?')}  {who}  {entry.get('tool_call_id', '?')!r}  {change}  "
            f"{entry.get('result', '?')}{forced}"
        )
    return EXIT_OK
