"""``airlock-redis resolve <tool_call_id> --committed [--value JSON] | --release | --unknown``.

The operator's verdict on a call whose outcome was in doubt, after asking the backend about its
idempotency key. It shows the record, asks for confirmation (unless ``--yes``), changes the record
atomically, and only if it is still the record shown: the same idempotency key (or ``--expect-key``),
status and owner (the attempt that holds it). A record that moved on while the operator read it (the
tool committed, a retry took it over) is left alone; ``--force`` applies the verdict to whatever is
there. Each verdict is audited as one JSON entry: in the namespace's capped Redis stream (``airlock-redis
audit`` shows it), and in a JSON-lines file when ``--audit-log`` or ``$AIRLOCK_REDIS_AUDIT_LOG`` names
one; on stderr only when the stream refused it. A verdict that went through is one line on stdout
and nothing on stderr.

``--release`` of a **committed** record (the tool ran and took effect) lets the call run again, and
the effect happen twice: it is refused (exit 2) unless ``--force-release-committed`` is given, and
the confirmation question then says that the call took effect.

A **running** record (pending, its lease renewed within the lease: its attempt is alive and inside
its tool) is refused (exit 2) unless ``--even-if-running`` is given: any verdict fences that attempt
off (its commit is refused as superseded, while its tool may still take effect), and after a release
(or, for a reversible tool, an unknown verdict) a retry may run it again beside it. With the flag, a
warning saying so goes to stderr and into the question.

Exit codes: 0 resolved; 1 no such record; 2 bad arguments (an empty or blank tool_call_id, a --value
that is not JSON, a URL the store does not take, --release of a committed record without
--force-release-committed, a running record without --even-if-running, ...) or a Redis it cannot use
(no answer, authentication failed, not allowed, a Cluster node behind a plain redis:// URL); 3
refused, the record's idempotency key is not --expect-key; 4 not confirmed; 6 the audit file cannot
be written (nothing done), or the audit stream refused the entry (the verdict was applied; the entry
is on stderr); 7 refused, the record changed after it was shown (nothing done); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from ..core.codec import encode_result
from ..core.errors import ResultEncodingError, StoreError
from ..core.records import Status, TransitionResult
from ..core.signing import Signer
from ..core.verdicts import Fence
from ..guard import EffectGuard
from ..operator import (
    AUDIT_LOG_ENV,
    AuditLog,
    AuditWriteError,
    RecordView,
    audit_log_path,
    digest,
)
from ..redaction import redact
from .common import (
    EXIT_AUDIT_FAILED,
    EXIT_CHANGED,
    EXIT_NOT_CONFIRMED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    add_target_arguments,
    open_operator_store,
    operator_url,
    store_failed,
    tool_call_id_argument,
)
from .inspect_cmd import render

HELP = "record the verdict on a call in doubt: --committed [--value JSON] | --release | --unknown"

_NO_VALUE: Any = object()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "tool_call_id", type=tool_call_id_argument, help="the tool call id, as the host passed it"
    )
    add_target_arguments(parser, embedded_default=False)
    verdict = parser.add_mutually_exclusive_group(required=True)
    verdict.add_argument(
        "--committed",
        dest="verdict",
        action="store_const",
        const="committed",
        help="the effect took place (replays get --value, or are refused as result_not_stored without one)",
    )
    verdict.add_argument(
        "--release",
        dest="verdict",
        action="store_const",
        const="release",
        help="the effect did not take place: delete the record so the call may run again",
    )
    verdict.add_argument(
        "--unknown",
        dest="verdict",
        action="store_const",
        const="unknown",
        help="still in doubt: keep refusing retries",
    )
    parser.add_argument("--value", help="with --committed: the result replays return, as JSON")
    parser.add_argument("--expect-key", help="refuse unless the record's idempotency key is this one")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.add_argument(
        "--force-release-committed",
        action="store_true",
        help="with --release: release a committed record, whose call took effect, so that the call may "
        "run (and take effect) again; refused without this flag",
    )
    parser.add_argument(
        "--even-if-running",
        action="store_true",
        help="resolve a record whose attempt is running (its lease is renewed): the verdict fences off "
        "an attempt that is working, whose tool may still take effect; refused without this flag",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="apply the verdict even if the record changed after it was shown (its status or owner)",
    )
    parser.add_argument(
        "--audit-log",
        default=None,
        help=f"also append the audit entry to this JSON-lines file (default: ${AUDIT_LOG_ENV}, else no "
        "file; the entry always goes to the namespace's audit stream: see airlock-redis audit)",
    )
    parser.add_argument(
        "--signing-key-env",
        metavar="NAME",
        help="sign the --value with the key in this environment variable (the guards' signing_key)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.epilog = (
        "exit codes: 0 resolved, 1 no such record, 2 bad arguments (also --release of a committed "
        "record without --force-release-committed, a running record without --even-if-running) or "
        "a Redis it cannot use (no answer, authentication failed, not allowed, a Cluster node behind "
        "a plain redis:// URL), 3 "
        "idempotency key differs from --expect-key, 4 not confirmed, 6 audit not written, 7 the "
        "record changed after it was shown, 130 interrupted"
    )  # fmt: skip


def _fail(code: int, message: str) -> int:
    print(f"error: {redact(message)}", file=sys.stderr)
    return code


def _confirm(prompt: str) -> bool | None:
    """True/False from the operator's answer on stdin; None when stdin gives no answer."""
    stdin = sys.stdin
    if stdin is None or stdin.closed:
        return None
    print(prompt, end="", file=sys.stderr, flush=True)
    try:
        answer = stdin.readline()
    except (OSError, ValueError):
        return None
    if not answer:
        return None
    return answer.strip().lower() in ("y", "yes")


def _inputs(args: argparse.Namespace) -> tuple[Any, str | None] | int:
    """The --value (parsed) and the signing key, or an exit code when they are not usable."""
    value: Any = _NO_VALUE
    if args.value is not None:
        if args.verdict != "committed":
            return _fail(EXIT_USAGE, "--value goes with --committed only")
        try:
            value = json.loads(args.value)
        except json.JSONDecodeError as exc:
            return _fail(EXIT_USAGE, f"--value is not valid JSON: {exc}")
        try:
            encode_result(value)
        except ResultEncodingError as exc:
            return _fail(EXIT_USAGE, f"--value cannot be stored: {exc}")
    signing_key: str | None = None
    if args.signing_key_env:
        signing_key = os.environ.get(args.signing_key_env)
        if not signing_key:
            return _fail(EXIT_USAGE, f"the environment variable {args.signing_key_env} holds no signing key")
        try:
            Signer(signing_key)
        except ValueError as exc:
            return _fail(EXIT_USAGE, f"{args.signing_key_env}: {exc}")
    return value, signing_key


@contextlib.contextmanager
def _library_log_quiet() -> Iterator[None]:
    """The guard logs each resolution as a warning; the CLI has its own line for it (and the audit
    entry). Without a handler of the user's, Python would print the warning on stderr."""
    library = logging.getLogger("airlock_redis")
    quiet = logging.NullHandler()
    library.addHandler(quiet)
    try:
        yield
    finally:
        library.removeHandler(quiet)


def _committed_release(args: argparse.Namespace, view: RecordView) -> bool:
    return args.verdict == "release" and view.status == Status.COMMITTED.value


def _running(view: RecordView, verdict: str) -> str | None:
    """What to say about a record whose attempt is running (its lease renewed within the lease);
    None for any other record."""
    if view.liveness != "running":
        return None
    since = (view.since_renewal_ms or 0) / 1000
    lease = (view.lease_ms or 0) / 1000
    return (
        f"{view.tool_call_id!r} is RUNNING: its attempt renewed its lease {since:.1f}s ago (lease "
        f"{lease:.1f}s), so it is alive and inside its tool. A verdict now fences off an attempt that is "
        "working: its commit will be refused as superseded while its tool may still take effect"
        + ("" if verdict == "committed" else ", and a retry may run it again beside it")
    )


def run(args: argparse.Namespace) -> int:
    with _library_log_quiet():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    inputs = _inputs(args)
    if isinstance(inputs, int):
        return inputs
    value, signing_key = inputs
    with open_operator_store(args) as views:
        try:
            view = views.read_record(args.tool_call_id)
        except StoreError as exc:
            return store_failed(exc, args)
        if view is None:
            return _fail(
                EXIT_NOT_FOUND, f"no record for tool_call_id {args.tool_call_id!r} in {args.namespace!r}"
            )
        if args.expect_key is not None and view.idempotency_key != args.expect_key:
            return _fail(
                EXIT_REFUSED,
                f"refused: the record's idempotency key is {view.idempotency_key}, not --expect-key "
                f"{args.expect_key}; nothing was changed",
            )
        if _committed_release(args, view) and not args.force_release_committed:
            return _fail(
                EXIT_USAGE,
                f"refused: {args.tool_call_id!r} is committed: the call took effect, and releasing it lets "
                "the tool run (and take effect) again; pass --force-release-committed to release it anyway",
            )
        running = _running(view, args.verdict)
        if running is not None and not args.even_if_running:
            return _fail(
                EXIT_USAGE,
                f"refused: {running}. Wait for it to end (airlock-redis inspect "
                f"{args.tool_call_id}), or pass --even-if-running to resolve it anyway",
            )
        if running is not None:
            print(f"warning: {redact(running)}", file=sys.stderr)
        if not args.yes:
            declined = _ask(args, view, value)
            if declined is not None:
                return declined
        try:
            echo = io.StringIO()  # the entry goes on stderr only if the stream refuses it
            audit = AuditLog(audit_log_path(args.audit_log), trail=views, echo=echo)
        except OSError as exc:
            return _fail(EXIT_AUDIT_FAILED, f"cannot write the audit log, so nothing was done: {exc}")
        with audit:
            # the guard encodes and signs the value and fences the verdict; it lands through the
            # store's resolve transition, as OperatorStore.resolve does
            guard = EffectGuard(views.store, signing_key=signing_key)
            expect = view.idempotency_key if view.idempotency_key else args.expect_key
            fence = shown_fence(view, expect)
            entry = _audit_entry(args, views.namespace, view, expect, value, signed=bool(signing_key))
            try:
                target: dict[str, Any] = (
                    {"force": True, "expect_key": expect} if args.force else {"seen": fence}
                )
                if value is not _NO_VALUE:
                    target["value"] = value
                result = guard.resolve(args.tool_call_id, args.verdict, **target)
            except StoreError as exc:
                with contextlib.suppress(AuditWriteError):
                    audit.write({**entry, "result": "error", "error": str(exc)})
                return store_failed(exc, args)
            try:
                audit.write({**entry, "result": result.value})
            except AuditWriteError as exc:
                print(echo.getvalue(), end="", file=sys.stderr)
                return _fail(
                    EXIT_AUDIT_FAILED,
                    f"the verdict was applied ({result.value}), but its audit entry could not be added "
                    f"to the namespace's audit stream ({exc}); the entry is above",
                )
    if args.json:
        print(
            json.dumps({"tool_call_id": args.tool_call_id, "verdict": args.verdict, "result": result.value})
        )
    else:
        note = ""
        if result is TransitionResult.OK and args.verdict == "committed" and value is _NO_VALUE:
            note = " (no --value: replays of this call are refused as result_not_stored)"
        print(f"{args.tool_call_id!r}: {args.verdict} -> {result.value}{note}")
    if result is TransitionResult.OK:
        return EXIT_OK
    if result is TransitionResult.MISSING:
        return _fail(
            EXIT_NOT_FOUND, "the record disappeared before it could be resolved (expired or released)"
        )
    if result is TransitionResult.CHANGED:
        return _fail(
            EXIT_CHANGED,
            "refused: the record changed after it was shown (it committed, or another attempt or "
            "operator took it); nothing was changed. Inspect it again, or pass --force",
        )
    return _fail(EXIT_REFUSED, "refused: the record was replaced by another call since it was shown")


def _ask(args: argparse.Namespace, view: RecordView, value: Any) -> int | None:
    """Show the record and ask the operator: None when they said yes, else the exit code."""
    print(render(view, 200), file=sys.stderr)
    if args.verdict == "committed" and value is _NO_VALUE:
        print(
            "note: no --value: replays of this call will be refused (result_not_stored)",
            file=sys.stderr,
        )
    question = f"resolve {args.tool_call_id!r} as {args.verdict}?"
    if view.liveness == "running":
        question = (
            f"resolve {args.tool_call_id!r} as {args.verdict}? It is RUNNING: this fences off an "
            "attempt that is working."
        )
    if _committed_release(args, view):
        question = (
            f"release {args.tool_call_id!r}? It is COMMITTED: the call took effect, and releasing "
            "it lets the tool run (and take effect) again."
        )
    answer = _confirm(f"{question} [y/N] ")
    if answer is None:
        return _fail(
            EXIT_NOT_CONFIRMED,
            "not confirmed: no answer on stdin (not interactive); pass --yes to resolve without asking",
        )
    if not answer:
        return _fail(EXIT_NOT_CONFIRMED, "not confirmed: nothing was changed")
    return None


def _audit_entry(
    args: argparse.Namespace,
    namespace: str,
    view: RecordView,
    expect: str | None,
    value: Any,
    *,
    signed: bool,
) -> dict[str, Any]:
    """The audit entry of a verdict, before its result is known."""
    return {
        "action": "resolve",
        "tool_call_id": args.tool_call_id,
        "verdict": args.verdict,
        "namespace": namespace,
        "url": redact(operator_url(args)),
        "expect_key": expect,
        "before": {
            "status": view.status,
            "tool": view.tool,
            "idempotency_key": view.idempotency_key,
            "attempt": view.attempt,
            "owner": view.owner,
            "liveness": view.liveness,  # "running": the verdict fenced off a working attempt
            "problems": list(view.problems),
        },
        "force": bool(args.force),
        "value_sha256": digest(json.dumps(value, sort_keys=True).encode())
        if value is not _NO_VALUE
        else None,
        "signed": signed and value is not _NO_VALUE,
    }


def shown_fence(view: RecordView, expect_key: str | None) -> Fence:
    """What the record must still be for the verdict to apply: what the operator was shown."""
    status = Status(view.status) if view.status in {s.value for s in Status} else None
    return Fence(key=expect_key, status=status, owner=view.owner or None)
