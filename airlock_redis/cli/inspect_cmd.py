"""``airlock-redis inspect <tool_call_id>``: one record, as an operator needs to see it.

Exit codes: 0 shown; 1 no such record; 2 bad arguments (an empty or blank tool_call_id, a URL the
store does not take), or a Redis it cannot use (no answer, authentication failed, not allowed, a
Cluster node behind a plain redis:// URL); 130 interrupted; 141 the reader of its output went away.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..core.errors import StoreError
from ..operator import RecordView, format_duration
from ..redaction import redact
from .common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    add_target_arguments,
    non_negative_int,
    open_operator_store,
    store_failed,
    tool_call_id_argument,
)

HELP = "show one tool call's record: status, tool, idempotency key, attempt, ages, TTL, value preview"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "tool_call_id", type=tool_call_id_argument, help="the tool call id, as the host passed it"
    )
    add_target_arguments(parser, embedded_default=False)
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument(
        "--preview-chars",
        type=non_negative_int,
        default=200,
        metavar="N",
        help="shorten the value preview to N characters (default 200)",
    )
    parser.epilog = (
        "exit codes: 0 shown, 1 no such record, 2 bad arguments or a Redis it cannot use (no answer, "
        "authentication failed, not allowed, a Cluster node behind a plain redis:// URL), 130 "
        "interrupted, 141 the reader of its output went away"
    )


def render(view: RecordView, preview_chars: int) -> str:
    lines = [
        f"tool_call_id     {view.tool_call_id!r}",
        f"status           {view.status or '-'}",
        f"tool             {view.tool or '-'}",
        f"idempotency key  {view.idempotency_key or '-'}",
        f"attempt          {view.attempt if view.attempt is not None else '-'}",
        f"owner            {view.owner or '-'}",
        f"age              {format_duration(view.age_ms())} (since the attempt began)",
    ]
    if view.committed_ms is not None and view.begun_ms is not None:
        lines.append(f"committed after  {format_duration(max(0, view.committed_ms - view.begun_ms))}")
    lines.append(f"expires in       {format_duration(view.ttl_ms) if view.ttl_ms is not None else 'never'}")
    if view.lease_ms is not None:
        lines.append(f"lease            {_lease(view)}")
    if view.status == "committed":
        if view.stored:
            size = f"{view.value_bytes} bytes" if view.value_bytes is not None else "?"
            signed = "signed" if view.has_mac else "not signed"
            lines.append(f"value            {size}, {signed}")
            lines.append(f"value preview    {view.preview(preview_chars)}")
        else:
            lines.append("value            not stored (replays are refused: result_not_stored)")
    for problem in view.problems:
        lines.append(f"PROBLEM          {problem} (the guard refuses this record: record_corrupt)")
    return redact("\n".join(lines))


def _lease(view: RecordView) -> str:
    lease = format_duration(view.lease_ms)
    if view.liveness == "running":
        return f"running: renewed {format_duration(view.since_renewal_ms)} ago, lease {lease}"
    if view.liveness == "abandoned":
        return (
            f"abandoned: not renewed for {format_duration(view.since_renewal_ms)}, lease {lease} "
            "(its attempt is gone or hung: the call is in doubt)"
        )
    return f"{lease}, renewal not known (the record's TTL was changed by hand)"


def run(args: argparse.Namespace) -> int:
    with open_operator_store(args) as views:
        try:
            view = views.read_record(args.tool_call_id)
        except StoreError as exc:
            return store_failed(exc, args)
    if view is None:
        print(
            f"no record for tool_call_id {args.tool_call_id!r} in namespace {args.namespace!r}",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    if args.json:
        print(redact(json.dumps(view.as_dict(preview_chars=args.preview_chars), sort_keys=True)))
    else:
        print(render(view, args.preview_chars))
    return EXIT_OK
