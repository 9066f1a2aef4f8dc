"""The doctor's look at the calls a namespace holds: how many are running (their lease renewed),
abandoned (their lease lapsed: the worker is gone or hung) or unknown, read with SCAN on every
primary, bounded (see docs/in-doubt.md for what each means)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis

from ..core.errors import StoreError
from ..stores.operator_view import ListQuery
from ..stores.redis_operator import scan_page
from .doctor_check import Check

# the most keys the check examines (a page of SCAN on each primary, as `list` reads them)
EXAMINED = 10_000


def check_calls(client: Any, namespace: str) -> Check:
    """A warning when calls are in doubt (abandoned or unknown), naming the commands that show them;
    ok otherwise. A user that may not SCAN (a store's user needs no SCAN) is not checked: ok, said so."""
    try:
        page = scan_page(client, namespace, ListQuery(limit=EXAMINED, scan_count=1_000, max_scanned=EXAMINED))
    except StoreError as exc:
        if not isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
            return Check("calls", "warn", f"could not check: {exc}")
        return Check(
            "calls",
            "ok",
            "not checked: the Redis user may not SCAN (a store's user needs none; run doctor as the "
            "operator's user to count calls in doubt: docs/security.md)",
        )
    kinds = Counter(view.liveness or view.status or "damaged" for view in page.records)
    of = f"of {len(page.records)} records" + (f" (the first {page.scanned} keys)" if page.next_cursor else "")
    summary = (
        f"{kinds['running']} running, {kinds['abandoned']} abandoned, {kinds['unknown']} unknown, "
        f"{kinds['pending']} pending without a lease, {kinds['damaged']} damaged, {of} in namespace "
        f"{namespace!r}"
    )
    in_doubt = kinds["abandoned"] + kinds["unknown"] + kinds["damaged"]
    if not in_doubt:
        return Check("calls", "ok", summary)
    return Check(
        "calls",
        "warn",
        summary,
        "Calls in doubt are refused until a probe or an operator settles them: see them with "
        "airlock-redis list --abandoned and --status unknown, then inspect and resolve (docs/operating.md).",
    )
