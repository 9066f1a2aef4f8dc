"""The fault run's checker: reads a whole history and the final records, and names every violation.

Pure: no I/O, no server. ``check(events, records)`` takes the events a fault run wrote (JSON lines; see
:data:`EVENT_TYPES`) and the record of each tool_call_id as read after the run, and returns a
:class:`Verdict`: the violations, the documented losses (counted apart) and counts.

The events (every time is unix seconds, from one machine's clock):

- ``call``: one guarded call. ``w``/``n`` (worker, call number: the call's key), ``id``, ``tool``,
  ``kind`` (sync/async), ``wait`` (the store's ``wait_replicas``; ``covers``: it covers every replica),
  ``behind`` (the store is ``write_behind``),
  ``started``, ``ended``, ``result`` (``executed`` | ``replayed`` | ``refused:<reason>`` |
  ``error:<type>``), ``nonce`` (this call's), ``value_call`` (the nonce inside the value the caller got:
  its own when the tool ran, the first execution's when replayed).
- ``exec``: one execution of a tool body: ``w``/``n``, ``id``, ``at``, ``nonce``, ``ending`` (``ok``: it
  returned; ``plain``: it raised a plain error, the guard releases; ``ambiguous``: it raised an error
  that leaves its effect in doubt, the guard marks it unknown).
- ``store``: one store step of a call: ``w``/``n``, ``id``, ``op`` (``begin``, ``durable``, ``commit``,
  ``settle:release``, ``settle:unknown``), ``result`` (the store's answer, or ``error:<type>``; a
  write-behind store's commit and settle to unknown answer at once and are written ``queued``),
  ``maybe_applied`` (for errors), ``sent``, ``done``. A queued write's landing is a step of its own,
  ``commit:landed`` (or ``settle:unknown:landed``): ``result`` the server's answer (``ok``,
  ``superseded``, ...) or ``error:<type>`` (given up), ``sent`` when it was queued, ``done`` when the
  store's sender had the answer (none when the history holds no landings: the checker then goes by
  the evidence below).
- ``fault``: one fault the nemesis drew: ``name``, ``start``, ``end`` (when it was healed), ``loses``
  (it may discard writes a replica did not hold: a primary killed without persistence, a failover, a
  demoted primary).

The rules (docs/faults.md, "The checker"):

1. ``executed_twice``: a tool that is not reversible ran again for one id, although an earlier
   execution of that id should have blocked it (it returned or raised in doubt, or its plain error's
   release had not been sent yet). A documented loss when the id's calls ran without ``wait_replicas``
   covering every replica and a fault that loses unreplicated writes fell between the two.
2. ``commit_not_replayed``: after a call's commit was confirmed, a later call of that id ran the tool
   again or replayed another value (or a value no execution returned), or the final record is not that
   commit. Documented when a fault that loses writes fell between the commit and what was seen (commits
   are not waited for: a commit that a replica did not hold dies with its primary).
   A write-behind commit (``queued``) is not a confirmed commit: the caller got its value before the
   commit was sent, and one that never lands leaves the record pending (retries refused, never run;
   README, write-behind), which is no violation. It counts as confirmed from the moment it is known to
   have landed, the earliest of: its ``commit:landed`` step answered ``ok`` (or ``recreated``), and the
   end of the begin of another call that replayed its value (that read found it). From then on rule 2
   holds it like any other commit (and its doubt, rule 4, ends there); a call of the same worker (the
   process that queued it, whose store waits for a record's queued writes before it reads the record)
   is held to it from the moment it was queued, once it is known to have landed. A queued commit with
   neither is judged by the final record alone: if the record is that commit it landed, if not it may
   never have (counted in ``write_behind``), and rule 1 still forbids a second run of a tool that is
   not reversible.
3. ``left_in_doubt``: the final record is ``pending`` or ``unknown`` although the guard knew the call
   never took effect: no execution of the id returned or raised in doubt (every attempt was refused
   before running, failed its begin, or its tool raised a plain error). Counted apart (conservative)
   when a fault that loses writes fell after the release was sent (the release died with its
   primary), or when every attempt that may hold the record sent its release and each try of it
   failed to reach the server (a connection refused, cut or timed out: docs/faults.md documents that
   the record then stays). An attempt that sent no release, or whose release the server refused
   (OOM, NOSCRIPT, ...), or was answered yet left the record, is a violation.
4. ``unjustified_refusal``: a refusal the history does not explain: ``effect_status_unknown`` (or
   ``effect_in_progress``, under a lease) while no other attempt of the id could hold a pending or
   unknown record (every earlier one was released, or the record was committed), or a
   ``policy_violation`` / ``result_not_stored`` / ``record_corrupt`` (the workload never gives one id
   other arguments nor an unstorable result). Conservative and counted apart
   when a fault that loses writes fell between the commit or release and the refusal.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENT_TYPES = ("meta", "call", "exec", "store", "fault")
RULES = ("executed_twice", "commit_not_replayed", "left_in_doubt", "unjustified_refusal")
REVERSIBLE = frozenset({"refresh"})
_DOUBT_FOREVER = float("inf")
_CONFIRMED = ("ok", "recreated")
_QUEUED = "queued"  # a write-behind store's commit or settle to unknown: OK at once, sent later
_RELEASED = ("ok", "missing", "superseded")  # superseded: another attempt's record, not this one's
_ALWAYS_WRONG = ("refused:policy_violation", "refused:result_not_stored", "refused:record_corrupt")
# refusals that need another attempt holding the record: in doubt (or abandoned), or running (a lease)
_IN_DOUBT_OR_RUNNING = ("refused:effect_status_unknown", "refused:effect_in_progress")


@dataclass(frozen=True)
class Violation:
    rule: str
    tool_call_id: str
    what: str
    excuse: str = ""  # non-empty: a documented loss (or a conservative refusal), counted apart


@dataclass
class Attempt:
    """One call and everything it did: its store steps and its execution, if the tool ran."""

    call: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    execution: dict[str, Any] | None = None
    # a queued (write-behind) commit: when it is known to have landed (None: it is not); see rule 2
    landed_at: float | None = None

    @property
    def key(self) -> tuple[int, int]:
        return int(self.call["w"]), int(self.call["n"])

    def _steps(self, op: str) -> list[dict[str, Any]]:
        return [s for s in self.steps if s["op"] == op]

    @property
    def begin_sent(self) -> float:
        begins = self._steps("begin")
        return float(begins[0]["sent"]) if begins else float(self.call["started"])

    @property
    def begin_done(self) -> float:
        begins = self._steps("begin")
        return float(begins[-1]["done"]) if begins else float(self.call["ended"])

    @property
    def took_record(self) -> bool:
        """Its begin said started, or failed in a way that may have written the pending record."""
        for step in self._steps("begin"):
            if step["result"] == "started":
                return True
            if str(step["result"]).startswith("error") and step.get("maybe_applied") is not False:
                return True
        return False

    @property
    def took_over_unrun(self) -> bool:
        """A reversible take-over of an earlier attempt's record whose tool did not run."""
        return self.execution is None and any(
            s["op"] == "begin" and s["result"] == "started" and int(s.get("attempt") or 1) > 1
            for s in self.steps
        )

    def confirmed(self, op: str, answers: tuple[str, ...]) -> float | None:
        """When ``op`` was answered with one of ``answers`` (None: it never was)."""
        for step in self._steps(op):
            if step["result"] in answers:
                return float(step["done"])
        return None

    @property
    def commit_queued(self) -> bool:
        """Its commit went to a write-behind store: answered at once, only queued."""
        return any(s["result"] == _QUEUED for s in self._steps("commit"))

    def commit_confirmed(self) -> float | None:
        """When its commit was confirmed: answered ``ok``/``recreated``; for a queued commit, when it
        is known to have landed (None: never, or not known)."""
        if self.commit_queued:
            return self.landed_at
        return self.confirmed("commit", _CONFIRMED)

    def sent(self, op: str) -> float | None:
        steps = self._steps(op)
        return float(steps[0]["sent"]) if steps else None

    @property
    def ending(self) -> str:
        return str(self.execution["ending"]) if self.execution is not None else ""

    def doubt(self) -> tuple[float, float] | None:
        """When the record this attempt wrote may be pending or unknown: (from, until); None if it
        never wrote one. ``until`` is the confirmed commit or release, or infinity."""
        if not self.took_record:
            return None
        if self.execution is None or self.ending == "plain":
            released = self.confirmed("settle:release", _RELEASED)
            return self.begin_sent, released if released is not None else _DOUBT_FOREVER
        if self.ending == "ok":
            committed = self.commit_confirmed()
            return self.begin_sent, committed if committed is not None else _DOUBT_FOREVER
        return self.begin_sent, _DOUBT_FOREVER  # in doubt: unknown for good

    def settled_at(self) -> float | None:
        """When its commit or release was confirmed (the moment its doubt ended)."""
        window = self.doubt()
        return window[1] if window is not None and window[1] != _DOUBT_FOREVER else None


@dataclass
class Verdict:
    violations: list[Violation]
    documented: list[Violation]
    counts: dict[str, Any]
    timelines: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_rule(self, documented: bool = False) -> dict[str, int]:
        chosen = self.documented if documented else self.violations
        return dict(Counter(v.rule for v in chosen))

    def report(self, limit: int = 20) -> str:
        lines = [
            f"checked: {json.dumps(self.counts, sort_keys=True)}",
            f"violations: {len(self.violations)} {self.by_rule()}",
            f"documented losses / conservative refusals: {len(self.documented)} {self.by_rule(True)}",
        ]
        for v in self.violations[:limit]:
            lines.append(f"  VIOLATION {v.rule} {v.tool_call_id}: {v.what}")
        for v in self.documented[:limit]:
            lines.append(f"  documented {v.rule} {v.tool_call_id}: {v.what} [{v.excuse}]")
        for tool_call_id in sorted({v.tool_call_id for v in self.violations})[:limit]:
            lines.append(self.timelines.get(tool_call_id, ""))
        return "\n".join(line for line in lines if line)


class _History:
    def __init__(self, events: Iterable[Mapping[str, Any]]) -> None:
        self.meta: dict[str, Any] = {}
        self.faults: list[dict[str, Any]] = []
        calls: dict[tuple[int, int], Attempt] = {}
        steps: list[dict[str, Any]] = []
        executions: list[dict[str, Any]] = []
        for raw in events:
            event = dict(raw)
            kind = event.get("type")
            if kind == "call":
                calls[int(event["w"]), int(event["n"])] = Attempt(event)
            elif kind == "store":
                steps.append(event)
            elif kind == "exec":
                executions.append(event)
            elif kind == "fault":
                self.faults.append(event)
            elif kind == "meta":
                self.meta.update(event)
        for step in steps:
            found = calls.get((int(step["w"]), int(step["n"])))
            if found is not None:
                found.steps.append(step)
        self.orphans = 0  # executions whose call never ended (a worker died): counted, never dropped
        for execution in executions:
            found = calls.get((int(execution["w"]), int(execution["n"])))
            if found is None:
                self.orphans += 1
                orphan = {**execution, "type": "call", "result": "lost", "started": execution["at"]}
                found = calls[int(execution["w"]), int(execution["n"])] = Attempt({**orphan, "ended": 0})
            found.execution = execution
        self.by_id: dict[str, list[Attempt]] = defaultdict(list)
        for attempt in calls.values():
            self.by_id[str(attempt.call["id"])].append(attempt)
        for attempts in self.by_id.values():
            attempts.sort(key=lambda a: a.begin_sent)
            _find_landings(attempts)

    def loss_between(self, since: float, until: float) -> dict[str, Any] | None:
        """A fault that may lose unreplicated writes and overlaps [since, until]."""
        for fault in self.faults:
            if fault.get("loses") and float(fault["start"]) <= until and float(fault["end"]) >= since:
                return fault
        return None


def _find_landings(attempts: list[Attempt]) -> None:
    """When each queued (write-behind) commit of one id is known to have landed (rule 2): its own
    ``commit:landed`` step, or the end of the begin of a call that replayed its value."""
    for a in attempts:
        if a.execution is None or a.ending != "ok" or not a.commit_queued:
            continue
        nonce = str(a.execution["nonce"])
        seen = [float(s["done"]) for s in a.steps if s["op"] == "commit:landed" and s["result"] in _CONFIRMED]
        seen += [
            b.begin_done
            for b in attempts
            if b is not a and b.call["result"] == "replayed" and str(b.call.get("value_call")) == nonce
        ]
        a.landed_at = min(seen, default=None)


def _write_behind_counts(history: _History) -> dict[str, int]:
    """The queued commits of the run and what became of them."""
    counts: Counter[str] = Counter()
    for attempts in history.by_id.values():
        for a in attempts:
            if not a.commit_queued:
                continue
            counts["queued"] += 1
            landings = [str(s["result"]) for s in a.steps if s["op"] == "commit:landed"]
            if not landings:
                counts["landing_unseen"] += 1
            elif landings[-1].startswith("error"):
                counts["given_up"] += 1
            else:
                counts[f"landed_{landings[-1]}"] += 1
            if a.landed_at is not None:
                counts["known_landed"] += 1
    return dict(sorted(counts.items()))


def _who(a: Attempt) -> str:
    return f"w{a.key[0]}#{a.key[1]}"


def _covered(attempts: list[Attempt]) -> bool:
    """Every call of the id waited for every replica (the workload gives one id one configuration)."""
    return all(bool(a.call.get("covers")) for a in attempts)


def _excuse(fault: dict[str, Any] | None, what: str) -> str:
    if fault is None:
        return ""
    return f"{what}: {fault['name']} ({fault.get('target', '')}) {fault['start']:.3f}..{fault['end']:.3f}"


def check(
    events: Iterable[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any] | None],
    *,
    reversible: Iterable[str] = REVERSIBLE,
) -> Verdict:
    """Every violation of the four rules (module docstring) in one run's history and final records."""
    history = _History(events)
    may_rerun = frozenset(reversible)
    found: list[Violation] = []
    for tool_call_id, attempts in sorted(history.by_id.items()):
        tool = str(attempts[0].call["tool"])
        if tool not in may_rerun:
            found += _executed_twice(history, tool_call_id, attempts)
        found += _commit_not_replayed(history, tool_call_id, attempts, records.get(tool_call_id))
        found += _left_in_doubt(history, tool_call_id, attempts, records.get(tool_call_id))
        found += _unjustified_refusals(history, tool_call_id, attempts)
    violations = [v for v in found if not v.excuse]
    documented = [v for v in found if v.excuse]
    results = Counter(
        str(a.call["result"]).split(" ")[0] for attempts in history.by_id.values() for a in attempts
    )
    counts: dict[str, Any] = {
        "calls": sum(results.values()),
        "ids": len(history.by_id),
        "executions": sum(1 for ats in history.by_id.values() for a in ats if a.execution is not None),
        "results": dict(sorted(results.items())),
        "faults": dict(Counter(str(f["name"]) for f in history.faults)),
        "records": dict(Counter(str((r or {}).get("status", "none")) for r in records.values())),
        "orphan_executions": history.orphans,
    }
    if behind := _write_behind_counts(history):
        counts["write_behind"] = behind
    timelines = {v.tool_call_id: timeline(history, v.tool_call_id) for v in violations}
    return Verdict(violations, documented, counts, timelines)


def _executed_twice(history: _History, tool_call_id: str, attempts: list[Attempt]) -> list[Violation]:
    ran = sorted((a for a in attempts if a.execution is not None), key=lambda a: float(a.execution["at"]))  # type: ignore[index]
    out: list[Violation] = []
    for j, later in enumerate(ran[1:], start=1):
        for earlier in ran[:j]:
            released = earlier.sent("settle:release")
            if earlier.ending == "plain" and released is not None and released <= later.begin_done:
                continue  # a plain error gives the record back: the id may run again
            fault = None if _covered(attempts) else history.loss_between(earlier.begin_sent, later.begin_done)
            what = (
                f"ran again in call w{later.key[0]}#{later.key[1]} after call w{earlier.key[0]}#"
                f"{earlier.key[1]} ran it ({earlier.ending}) with wait={earlier.call.get('wait')}"
            )
            excuse = _excuse(fault, "documented loss: an unreplicated record died with its primary")
            out.append(Violation("executed_twice", tool_call_id, what, excuse))
            break
    return out


def _value_calls(attempts: list[Attempt]) -> set[str]:
    return {str(a.execution["nonce"]) for a in attempts if a.execution is not None and a.ending == "ok"}


def _commit_not_replayed(
    history: _History, tool_call_id: str, attempts: list[Attempt], record: Mapping[str, Any] | None
) -> list[Violation]:
    out: list[Violation] = []
    produced = _value_calls(attempts)
    for a in attempts:
        if a.call["result"] == "replayed" and str(a.call.get("value_call")) not in produced:
            what = f"call w{a.key[0]}#{a.key[1]} replayed a value no execution returned"
            out.append(Violation("commit_not_replayed", tool_call_id, what))
    for committed in attempts:
        at = committed.commit_confirmed()  # a queued commit: once it is known to have landed
        if committed.execution is None or committed.ending != "ok" or at is None:
            continue
        nonce = str(committed.execution["nonce"])
        queued = committed.sent("commit") if committed.commit_queued else None
        for later in attempts:
            # a write-behind store's own process waits for a record's queued writes before its next
            # begin of that record: a call of the same worker binds from the moment the commit was queued
            since = queued if queued is not None and later.key[0] == committed.key[0] else at
            if later is committed or later.begin_sent <= since:
                continue
            result = later.call["result"]
            if later.execution is not None:
                what = f"ran again in call {_who(later)} after the commit of {_who(committed)}"
            elif result == "replayed" and str(later.call.get("value_call")) != nonce:
                what = f"call w{later.key[0]}#{later.key[1]} replayed another execution's value"
            else:
                continue
            fault = history.loss_between(at, later.begin_done)
            excuse = _excuse(fault, "documented: a commit no replica held died with its primary")
            out.append(Violation("commit_not_replayed", tool_call_id, what, excuse))
        if record is not None and not (
            record.get("status") == "committed" and str(record.get("value_call")) == nonce
        ):
            if record.get("status") == "committed" and str(record.get("value_call")) in produced:
                continue  # another execution's commit, already named above
            fault = history.loss_between(at, float("inf"))
            what = f"the final record is {record.get('status')}, not the commit of {_who(committed)}"
            excuse = _excuse(fault, "documented: a commit no replica held died with its primary")
            out.append(Violation("commit_not_replayed", tool_call_id, what, excuse))
    return out


def _left_in_doubt(
    history: _History, tool_call_id: str, attempts: list[Attempt], record: Mapping[str, Any] | None
) -> list[Violation]:
    if record is None or record.get("status") not in ("pending", "unknown"):
        return []
    if any(a.execution is not None and a.ending != "plain" for a in attempts):
        return []  # some execution returned or raised in doubt: a pending/unknown record may be right
    if any(a.call["result"] == "lost" for a in attempts):
        return []
    writers = [a for a in attempts if a.took_record]
    since = min((a.begin_sent for a in writers), default=min(a.begin_sent for a in attempts))
    fault = history.loss_between(since, float("inf"))
    ran = sum(1 for a in attempts if a.execution is not None)
    # a reversible take-over (attempt > 1) whose tool did not run marks the record unknown on purpose
    # (the attempt it took over may have run): the doubt is that earlier attempt's, judged on its own
    unreleased = [a for a in writers if a.settled_at() is None and not a.took_over_unrun]
    stories = [f"{_who(a)}:{_release_story(a)}" for a in unreleased]
    what = (
        f"final record {record.get('status')} (owner attempt {record.get('attempt')}) although no execution "
        f"took effect ({ran} ran and raised a plain error); attempts that took the record and were not "
        f"released: {', '.join(stories) or _no_writer(writers)}"
    )
    excuse = _excuse(fault, "conservative: a release no replica held died with its primary")
    if not excuse and not unreleased and _given_back_by_take_over(writers, record):
        excuse = (
            "conservative: a reversible take-over whose tool did not run gave the record back unknown for "
            "the attempt it took over, whose own release came after the take-over and was superseded "
            "(a reversible retry takes the record over again; docs/faults.md)"
        )
    if not excuse and unreleased and all(_release_unreachable(a) for a in unreleased):
        how = "refused to connect" if all(_never_connected(a) for a in unreleased) else "cut or timed out"
        excuse = f"documented: the release was sent but could not get through ({how}; docs/faults.md)"
    return [Violation("left_in_doubt", tool_call_id, what, excuse)]


def _given_back_by_take_over(writers: list[Attempt], record: Mapping[str, Any]) -> bool:
    """The final record is ``unknown`` as a reversible take-over whose tool did not run left it (it
    owns the record and its settle:unknown was answered), and every other attempt that took the record
    sent its release and was told it no longer owned it (superseded): the take-over's doubt is about
    attempts that did not run either, which it could not know."""
    if record.get("status") != "unknown":
        return False
    owner = int(record.get("attempt") or 0)
    takers = [
        a
        for a in writers
        if a.took_over_unrun
        and any(s["op"] == "begin" and int(s.get("attempt") or 1) == owner for s in a.steps)
        and a.confirmed("settle:unknown", ("ok", _QUEUED)) is not None  # queued: the record shows it landed
    ]
    others = [a for a in writers if a not in takers]
    return bool(takers) and all(a.confirmed("settle:release", ("superseded",)) is not None for a in others)


def _no_writer(writers: list[Attempt]) -> str:
    if writers:
        return "none (each one's release was answered)"
    return "none: no begin said started or may have landed (a begin reported as never sent wrote it)"


_ANSWERED = (
    "OOM",
    "NOSCRIPT",
    "OutOfMemory",
    "READONLY",
    "BusyLoading",  # LOADING: a restarted server refused it while it read its data
    "Too many connections",
    "MaxConnections",
)
_UNREACHABLE = ("ConnectionError", "TimeoutError", "Connection closed", "Connection reset", "Error 111")


def _release_unreachable(a: Attempt) -> bool:
    """The attempt sent its release and every answer was a connection failure (the server never
    answered it): what docs/faults.md documents for a release that cannot get through. A release the
    server answered with an error (OOM, NOSCRIPT, ...) does not count: the guard could have done better."""
    releases = [s for s in a.steps if s["op"] == "settle:release"]
    return bool(releases) and all(
        str(s["result"]).startswith("error")
        and any(marker in str(s.get("detail", "")) for marker in _UNREACHABLE)
        and not any(answer in str(s.get("detail", "")) for answer in _ANSWERED)
        for s in releases
    )


def _never_connected(a: Attempt) -> bool:
    """Every try of its release failed to connect: the release surely never reached the server (a cut
    or timed-out one may have reached it, and then it should have released the record)."""
    return all(
        any(m in str(s.get("detail", "")) for m in ("Error 111", "connecting", "Connection refused"))
        for s in a.steps
        if s["op"] == "settle:release"
    )


def _release_story(a: Attempt) -> str:
    begin = [str(s["result"]) for s in a.steps if s["op"] == "begin"]
    rest = [f"{s['op']}={s['result']}" for s in a.steps if s["op"] != "begin"]
    return f"begin={'/'.join(begin) or '?'} {' '.join(rest) or 'no release sent'}"


def _unjustified_refusals(history: _History, tool_call_id: str, attempts: list[Attempt]) -> list[Violation]:
    out: list[Violation] = []
    for r in attempts:
        result = str(r.call["result"])
        if result in _ALWAYS_WRONG:
            out.append(
                Violation("unjustified_refusal", tool_call_id, f"call w{r.key[0]}#{r.key[1]}: {result}")
            )
            continue
        if result not in _IN_DOUBT_OR_RUNNING:
            continue
        holders = [
            a
            for a in attempts
            if a is not r
            and (window := a.doubt()) is not None
            and window[0] < r.begin_done
            and window[1] > r.begin_sent
        ]
        if holders:
            continue
        earlier = [a for a in attempts if a is not r and a.took_record and a.begin_sent < r.begin_done]
        settled = [t for a in earlier if (t := a.settled_at()) is not None]
        # the record the refusal saw must have lost the latest confirmed commit or release
        fault = history.loss_between(max(settled), r.begin_done) if settled else None
        stories = "; ".join(
            f"w{a.key[0]}#{a.key[1]} {a.call['result']} ({_release_story(a)})" for a in earlier
        )
        stories = stories or "none took the record"
        what = f"call {_who(r)} {result}; earlier: {stories}"
        excuse = _excuse(fault, "conservative: a commit or release no replica held died with its primary")
        out.append(Violation("unjustified_refusal", tool_call_id, what, excuse))
    return out


def timeline(history: _History, tool_call_id: str) -> str:
    """Everything about one id, in time order, with the faults that overlapped it."""
    attempts = history.by_id.get(tool_call_id, [])
    rows: list[tuple[float, str]] = []
    for a in attempts:
        who = f"w{a.key[0]}#{a.key[1]}"
        c = a.call
        rows.append((float(c["started"]), f"call  {who} {c.get('kind')} wait={c.get('wait')} starts"))
        rows.append(
            (
                float(c["ended"] or c["started"]),
                f"call  {who} -> {c['result']} {str(c.get('detail', ''))[:160]}",
            )
        )
        for s in a.steps:
            extra = f" maybe_applied={s.get('maybe_applied')}" if str(s["result"]).startswith("error") else ""
            rows.append(
                (
                    float(s["sent"]),
                    f"store {who} {s['op']} -> {s['result']}{extra} "
                    f"({float(s['done']) - float(s['sent']):.3f}s) {str(s.get('detail', ''))[:120]}",
                )
            )
        if a.execution is not None:
            rows.append((float(a.execution["at"]), f"EXEC  {who} ending={a.ending}"))
    if not rows:
        return ""
    first, last = min(t for t, _ in rows), max(t for t, _ in rows)
    for f in history.faults:
        if float(f["start"]) <= last + 5 and float(f["end"]) >= first - 5:
            rows.append(
                (
                    float(f["start"]),
                    f"FAULT {f['name']} {f.get('target', '')} until {float(f['end']) - first:+.3f}",
                )
            )
    rows.sort(key=lambda r: r[0])
    body = "\n".join(f"    {t - first:+8.3f}s {line}" for t, line in rows)
    return f"  --- {tool_call_id} (t0={first:.3f}) ---\n{body}"


def read_history(path: Path) -> list[dict[str, Any]]:
    """A history saved as JSON lines."""
    with path.open() as lines:
        return [json.loads(line) for line in lines if line.strip()]
