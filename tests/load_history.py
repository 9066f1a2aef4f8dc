"""The load test's per-id histories: read the workers' JSON files and explain any id that ran twice.

Each worker of ``tests/faults.py::load_worker`` writes one file: its real executions (call number,
sync or async, first or duplicate, owner token, attempt), every call's outcome, every store step its
:class:`~tests.faults.TracedStore` took (begin, durability check, commit, settle: token, reply or
error, when it was sent and answered, the primary it last reached) and every connection failure its
client's retry policy handled (each one followed by a re-send while retries were left).

:func:`history` joins all of that for one tool_call_id into a timeline, with times relative to the
kill and to the promotion, so that a failure explains itself the first time it happens.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HISTORY_DIR_ENV = "AIRLOCK_LOAD_HISTORY_DIR"  # set (e.g. by benchmarks/stress_faults.py): save here


@dataclass
class LoadRun:
    """What every worker of one load run wrote."""

    executions: list[dict[str, Any]] = field(default_factory=list)
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    store: list[dict[str, Any]] = field(default_factory=list)
    resends: list[dict[str, Any]] = field(default_factory=list)
    pids: dict[int, int] = field(default_factory=dict)

    def runs(self) -> Counter[str]:
        return Counter(e["id"] for e in self.executions)

    def tool_of(self) -> dict[str, str]:
        return {e["id"]: e["tool"] for e in self.executions}

    def twice(self, tools: Iterable[str] | None = None) -> dict[str, int]:
        wanted = set(tools) if tools is not None else None
        tool_of = self.tool_of()
        return {i: n for i, n in self.runs().items() if n > 1 and (wanted is None or tool_of[i] in wanted)}


def load(paths: Iterable[Path]) -> LoadRun:
    run = LoadRun()
    for path in paths:
        data = json.loads(Path(path).read_text())
        worker = int(data["worker"])
        run.pids[worker] = int(data["pid"])
        run.executions += data["executions"]
        run.outcomes += data["outcomes"]
        run.store += [{**step, "worker": worker} for step in data["store"]]
        run.resends += [{**r, "worker": worker} for r in data["resends"]]
    return run


def _rel(at: float, marks: Mapping[str, float]) -> str:
    return " ".join(f"{at - t:+8.3f}s/{name}" for name, t in marks.items())


def _short(token: str) -> str:
    return token[:12] if token else "-"


def _who(event: Mapping[str, Any]) -> str:
    return f"worker={event['worker']} call#{event['call']}"


def _events(run: LoadRun, tool_call_id: str) -> list[tuple[float, str]]:
    """(time, line) of everything about one id, unsorted."""
    events: list[tuple[float, str]] = []
    calls = {(o["worker"], o["call"]) for o in run.outcomes if o["id"] == tool_call_id}
    for e in run.executions:
        if e["id"] == tool_call_id:
            events.append(
                (
                    e["at"],
                    f"EXECUTED  {_who(e)} pid={e['pid']} {e['kind']} {e['phase']} "
                    f"token={_short(e['token'])} attempt={e['attempt']}",
                )
            )
    for o in run.outcomes:
        if o["id"] == tool_call_id:
            events.append(
                (
                    o["started"],
                    f"call      {_who(o)} pid={o['pid']} {o['kind']} {o['phase']} starts",
                )
            )
            detail = f" ({o['detail']})" if o["detail"] else ""
            events.append(
                (
                    o["ended"],
                    f"outcome   {_who(o)} {o['kind']} {o['phase']}: {o['result']}{detail}",
                )
            )
    for s in run.store:
        if s["id"] == tool_call_id:
            attempt = f" attempt={s['attempt']}" if s["attempt"] is not None else ""
            detail = f" [{s['detail']}]" if s["detail"] else ""
            events.append(
                (
                    s["sent"],
                    f"store     {_who(s)} {s['op']} token={_short(s['token'])} -> {s['result']}{attempt}"
                    f"{detail} (took {s['done'] - s['sent']:.3f}s, at {s['where']})",
                )
            )
    for r in run.resends:
        if (r["worker"], r["call"]) in calls:
            what = "re-sent" if r["resent"] else "gave up"
            events.append(
                (
                    r["at"],
                    f"client    {_who(r)} {r['op'] or '?'} failure #{r['failures']}: {r['error']} -> {what}",
                )
            )
    return events


def history(run: LoadRun, tool_call_id: str, marks: Mapping[str, float], record: Any = None) -> str:
    """The whole story of one id: a timeline of calls, store steps, client re-sends and executions."""
    runs = run.runs()[tool_call_id]
    lines = [f"=== history of {tool_call_id}: the tool body ran {runs} time(s) ==="]
    for at, line in sorted(_events(run, tool_call_id), key=lambda e: e[0]):
        lines.append(f"  {_rel(at, marks)}  {line}")
    if record is not None:
        lines.append(f"  record after the run: {record}")
    return "\n".join(lines)


def explain(
    run: LoadRun, ids: Iterable[str], marks: Mapping[str, float], records: Mapping[str, Any] | None = None
) -> str:
    records = records or {}
    moments = "  ".join(f"{name}={t:.3f}" for name, t in marks.items())
    head = f"times are relative to: {moments} (unix seconds)"
    return "\n".join([head, *(history(run, i, marks, records.get(i)) for i in ids)])


def save(title: str, summary: Mapping[str, Any], text: str = "", run: LoadRun | None = None) -> Path | None:
    """With AIRLOCK_LOAD_HISTORY_DIR set: write the run's summary (always), and on a failure its
    histories (text) and everything the workers wrote (JSON)."""
    folder = os.environ.get(HISTORY_DIR_ENV)
    if not folder:
        return None
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    stem = title.replace(" ", "-")
    (out / f"{stem}.summary.json").write_text(json.dumps(summary, sort_keys=True, indent=1))
    if text:
        (out / f"{stem}.history.txt").write_text(text)
    if run is not None:
        raw = {
            "executions": run.executions,
            "outcomes": run.outcomes,
            "store": run.store,
            "resends": run.resends,
            "pids": run.pids,
        }
        (out / f"{stem}.workers.json").write_text(json.dumps(raw))
    return out
