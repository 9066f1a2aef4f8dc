"""``airlock-redis demo``: the lost-response story, told by two replicas of an agent host.

Each replica is its own process; they share nothing but Redis. The tools count their real
executions in Redis (standing in for the payment backend), so the table shows what ran.

``--url`` takes every URL ``RedisEffectStore`` takes (``redis://``, ``rediss://``, ``unix://``,
``redis+cluster://`` with one seed node or several, ``rediss+cluster://``, ``redis+sentinel://``); the
scheme decides the topology, and the side channel (the execution counters) gets its client through
the same URL handling. Every key a run writes (the records, and the counters: each INCR and its
EXPIRE run as one script) expires within ``DEMO_TTL`` even if the run is killed; the run removes its
keys when it ends, also when it ends early (an error, Ctrl-C, a reader that went away as in
``airlock-redis demo | head -2``). The counters of one run share one Cluster slot (a hash tag), so
one DEL removes them. Each line is flushed as it is told, so a pipe shows the story as it happens.

``--framework langchain`` / ``--framework openai-agents`` tells a shorter story with a real agent of
that framework instead, in this one process: a scripted model (no network, no API key) asks for the
tool calls, and the integration (``EffectGuardMiddleware`` / ``guard_tools``) guards them. The
framework is imported only then; without it the command says which extra to install (exit 2). What
both stories share (the execution counters, ``DEMO_TTL``, the clean-up) is in :mod:`.demo_common`.

Exit codes: 0 the story went as the spec says; 1 it did not; 2 bad arguments (a URL the store does
not take, a --namespace it does not take, a --framework that is not installed) or a Redis it cannot
use (no answer, authentication failed, not allowed, a Cluster node behind a plain redis:// URL, no
redis-server to start); 130 interrupted (Ctrl-C; the keys are removed and the private server stopped
first); 141 the reader of its output went away (the keys are removed first).

The private redis-server runs in a session of its own, and the replica processes are started with
SIGINT blocked: a terminal's Ctrl-C reaches this process alone, which then cleans up.
"""

from __future__ import annotations

import argparse
import multiprocessing
import secrets
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..core.errors import EffectRefused
from ..core.reversibility import reversibility
from ..loadgen.interrupts import sigint_deferred
from .common import add_target_arguments, check_given_url, embedded_or_given
from .demo_common import DEMO_TTL, FRAMEWORKS, backend_client, clean, count_execution, execution_count, say

__all__ = ["DEMO_TTL", "HELP", "TOOLS", "Step", "add_arguments", "run"]  # DEMO_TTL is demo_common's

HELP = "narrate the lost-response story end to end against a Redis (embedded by default)"

TOOLS = ("charge", "read_balance")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(
        parser,
        embedded_default=True,
        namespace_help="the demo writes its records under <namespace>:demo:<random hex>, and removes "
        "them when it ends (default namespace: %(default)s)",
    )
    parser.add_argument(
        "--framework",
        choices=sorted(FRAMEWORKS),
        default=None,
        help="tell the story with a real agent of this framework (a scripted model: no network, no API "
        "key), guarded by its integration; needs the framework's extra",
    )
    parser.epilog = (
        "exit codes: 0 the story went as the spec says, 1 it did not, 2 a bad command line (a URL or "
        "--namespace the store does not take, a --framework that is not installed) or a Redis it "
        "cannot use (no answer, authentication failed, not allowed, a Cluster node behind a plain "
        "redis:// URL, no redis-server to start), 130 interrupted (Ctrl-C), 141 the reader of its "
        "output went away (| head). Every key it writes expires within "
        f"{DEMO_TTL:g} s, and it removes them when it ends."
    )


@dataclass(frozen=True)
class Step:
    replica: str
    tool_call_id: str
    tool: str
    kwargs: dict[str, Any]
    lose_response: bool  # the backend acts, then its answer is lost (the tool raises TimeoutError)
    story: str
    expect: str  # executed | lost | replayed | refused:<reason>


def _scenario() -> list[Step]:
    return [
        Step("A", "call_1", "charge", {"account": "acct_1", "cents": 500}, True,
             "charge runs; the payment API takes the money, but its answer is lost", "lost"),
        Step("B", "call_1", "charge", {"account": "acct_1", "cents": 500}, False,
             "the host retries on another replica: charge is irreversible", "refused:effect_status_unknown"),
        Step("A", "call_2", "charge", {"account": "acct_2", "cents": 700}, False,
             "a second charge runs and its answer arrives", "executed"),
        Step("B", "call_2", "charge", {"account": "acct_2", "cents": 700}, False,
             "a duplicate delivery of call_2 reaches replica B", "replayed"),
        Step("A", "call_3", "read_balance", {"account": "acct_1"}, True,
             "read_balance times out", "lost"),
        Step("B", "call_3", "read_balance", {"account": "acct_1"}, False,
             "retry of a reversible tool", "executed"),
        Step("B", "call_2", "charge", {"account": "acct_2", "cents": 900}, False,
             "the same tool_call_id with other arguments", "refused:policy_violation"),
    ]  # fmt: skip


def _replica_step(url: str, namespace: str, step: Step) -> dict[str, Any]:
    """Runs inside a replica process: build the guard and tools there, make one call."""
    from ..context import current_idempotency_key, tool_call_context
    from ..guard import EffectGuard
    from ..stores.redis_store import RedisEffectStore

    backend = backend_client(url)
    store = RedisEffectStore(
        url, namespace=namespace, committed_ttl=DEMO_TTL, pending_ttl=DEMO_TTL, unknown_ttl=DEMO_TTL
    )
    guard = EffectGuard(store=store)

    def backend_call(tool: str) -> str:
        count_execution(backend, namespace, tool)
        if step.lose_response:
            raise TimeoutError("the backend's answer was lost")
        return current_idempotency_key() or ""

    @guard.wrap
    def charge(account: str, cents: int) -> dict[str, Any]:
        key = backend_call("charge")
        return {"charged": cents, "account": account, "receipt": key[:12]}

    @reversibility("reversible")
    @guard.wrap
    def read_balance(account: str) -> int:
        backend_call("read_balance")
        return 4200

    tools: dict[str, Callable[..., Any]] = {"charge": charge, "read_balance": read_balance}
    before = execution_count(backend, namespace, step.tool)
    outcome: dict[str, Any] = {}
    with tool_call_context(step.tool_call_id, agent_id="agent-1"):
        try:
            value = tools[step.tool](**step.kwargs)
            outcome = {"result": "executed", "value": value}
        except TimeoutError:
            outcome = {"result": "lost", "value": "TimeoutError"}
        except EffectRefused as refused:
            outcome = {"result": f"refused:{refused.reason}", "value": refused.fix_hint}
    after = execution_count(backend, namespace, step.tool)
    if outcome["result"] == "executed" and after == before:
        outcome["result"] = "replayed"
    outcome["ran"] = after - before
    store.close()
    backend.close()
    return outcome


def _clean(url: str, namespace: str, tools: Sequence[str] = TOOLS) -> dict[str, int]:
    """The run's execution counts of ``tools``; then its keys are removed from every primary. The one
    clean-up of both stories: ``--framework`` gets it handed (see :func:`run`)."""
    return clean(url, namespace, tools)


def _print_table(rows: list[list[str]]) -> None:
    headers = ["#", "replica", "tool_call_id", "call", "what happened", "tool ran", "ok"]
    widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) for i in range(len(headers))]
    say("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    say("  ".join("-" * w for w in widths))
    for row in rows:
        say("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def _tell(url: str, namespace: str, *, private: bool = False) -> tuple[list[list[str]], int]:
    """Run the scenario on two replica processes, telling each step: the table's rows, and how many
    steps went other than the spec says."""
    context = multiprocessing.get_context("spawn")
    replicas: dict[str, ProcessPoolExecutor] = {}
    rows: list[list[str]] = []
    failures = 0
    try:
        with sigint_deferred():  # the pools' queues and semaphores: Ctrl-C waits until they are made
            replicas.update(
                (name, ProcessPoolExecutor(max_workers=1, mp_context=context)) for name in ("A", "B")
            )
        for number, step in enumerate(_scenario(), start=1):
            with sigint_deferred():  # a replica process starts here: it never sees SIGINT
                future = replicas[step.replica].submit(_replica_step, url, namespace, step)
            outcome = future.result()
            ok = outcome["result"] == step.expect
            failures += not ok
            call = f"{step.tool}({', '.join(f'{k}={v!r}' for k, v in step.kwargs.items())})"
            verdict = "yes" if ok else f"NO (expected {step.expect})"
            rows.append(
                [
                    str(number),
                    step.replica,
                    step.tool_call_id,
                    call,
                    outcome["result"],
                    str(outcome["ran"]),
                    verdict,
                ]
            )
            say(f"{number}. [{step.replica}] {step.story}: {outcome['result']}")
            if outcome["result"].startswith("refused"):
                say(f"   hint: {outcome['value']}")
                if private:
                    say("   (this demo's private redis-server, and the URL above, are gone once it ends)")
    finally:  # on Ctrl-C too: a replica finishes its step (it never sees SIGINT), then the keys go
        for pool in replicas.values():
            pool.shutdown(cancel_futures=True)
    return rows, failures


def run(args: argparse.Namespace) -> int:
    if args.framework is not None:
        from .demo_frameworks import run_framework  # the frameworks are imported only when asked for

        return run_framework(args, clean=_clean)
    namespace = f"{args.namespace}:demo:{secrets.token_hex(4)}"
    problem = check_given_url(args.url, namespace=namespace)
    if problem is not None:
        print(f"airlock-redis demo: {problem}", file=sys.stderr)
        return 2
    with embedded_or_given(args.url) as target:
        try:
            say(f"Redis: {target.description}")
            say("Two replicas of an agent host (separate processes) share only this Redis.\n")
            rows, failures = _tell(target.url, namespace, private=not args.url)
            say()
            _print_table(rows)
        finally:  # also when the run ends early: its keys go now, not when their TTL runs out
            counts = _clean(target.url, namespace)
    say(
        f"\nexecutions: charge {counts['charge']} (2 distinct calls), "
        f"read_balance {counts['read_balance']} (1 call, reversible, retried once)"
    )
    if failures or counts["charge"] != 2:
        print(f"DEMO FAILED: {failures} step(s) did not behave as the spec says", file=sys.stderr)
        return 1
    say("every irreversible call ran at most once.")
    return 0
