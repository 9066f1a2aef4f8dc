"""Asking a tool's probe (see :mod:`airlock_redis.core.probes`), bounded in time, and auditing what it
said.

- A blocking probe runs on a daemon thread of its own, waited for at most the guard's
  ``probe_timeout``: a probe that hangs is given up on (counted as "can't tell") and left to finish
  by itself; being a daemon, it never holds the interpreter's exit. (Not a ``ThreadPoolExecutor``:
  ``concurrent.futures`` joins its workers at exit.) Probes run only for calls in doubt: rare.
- An ``async def`` probe is awaited under ``asyncio.wait_for`` in an asyncio call, and run with
  ``asyncio.run`` on the probe's thread in a blocking one; a blocking probe of an asyncio call runs on
  the thread, awaited without blocking the loop.
- A probe that raises, or answers anything but a verdict, counts as "can't tell" (logged).
- Every verdict is written to the store's audit trail (``airlock-redis audit``) with ``"by":
  "probe"``, from a daemon thread: the call does not wait for it, and a trail that refuses it (a Redis
  user without XADD) is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .core.probes import NeverTookEffect, Probe, ProbeCall, TookEffect, Verdict, verdict_of
from .redaction import redact
from .stores.operator_view import views_of

log = logging.getLogger("airlock_redis")


def ask_blocking(probe: Probe, call: ProbeCall, timeout: float) -> Verdict:
    """Ask ``probe`` about ``call`` from a blocking call: its verdict, or None."""
    done = threading.Event()
    answers: list[Any] = []

    def deliver(answer: Any) -> None:
        answers.append(answer)
        done.set()

    _start(probe, call, deliver)
    if not done.wait(timeout):
        _gave_up(call, timeout)
        return None
    return _counted(call, answers[0])


async def ask(probe: Probe, call: ProbeCall, timeout: float) -> Verdict:
    """Ask ``probe`` about ``call`` from a coroutine: its verdict, or None."""
    if inspect.iscoroutinefunction(probe):
        try:
            answer: Any = await asyncio.wait_for(probe(call), timeout)
        except TimeoutError:
            _gave_up(call, timeout)
            return None
        except Exception as exc:
            answer = exc
        return _counted(call, answer)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(answer: Any) -> None:
        def settle() -> None:
            if not future.done():
                future.set_result(answer)

        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for it
            loop.call_soon_threadsafe(settle)

    _start(probe, call, deliver)
    try:
        answer = await asyncio.wait_for(asyncio.shield(future), timeout)
    except TimeoutError:
        _gave_up(call, timeout)
        return None
    return _counted(call, answer)


def _start(probe: Probe, call: ProbeCall, deliver: Callable[[Any], Any]) -> None:
    def run() -> None:
        try:
            answer: Any = probe(call)
            if inspect.isawaitable(answer):
                answer = asyncio.run(_awaited(answer))
        except BaseException as exc:  # whatever it raised is "can't tell"
            answer = exc
        deliver(answer)

    threading.Thread(target=run, name=f"airlock-redis-probe-{call.tool}", daemon=True).start()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _gave_up(call: ProbeCall, timeout: float) -> None:
    log.warning(
        "airlock_redis: the probe of %s under tool_call_id=%r gave no answer within %.3g s: the call stays "
        "in doubt",
        call.tool,
        call.tool_call_id,
        timeout,
    )


def _counted(call: ProbeCall, answer: Any) -> Verdict:
    verdict = verdict_of(answer)
    if verdict is None and answer is not None:
        what = (
            f"raised {type(answer).__name__}: {answer}"
            if isinstance(answer, BaseException)
            else (f"answered {type(answer).__name__}, not TookEffect, NeverTookEffect or None")
        )
        log.warning(
            "airlock_redis: the probe of %s under tool_call_id=%r %s: counted as can't tell",
            call.tool,
            call.tool_call_id,
            redact(what),
        )
    return verdict


def said(verdict: Verdict) -> str:
    """The verdict as a word: took_effect, never_took_effect or cannot_tell."""
    if isinstance(verdict, TookEffect):
        return "took_effect"
    if isinstance(verdict, NeverTookEffect):
        return "never_took_effect"
    return "cannot_tell"


def audit(store: Any, call: ProbeCall, verdict: Verdict, seconds: float) -> None:
    """Write the probe's verdict to the store's audit trail, from a daemon thread (see the module)."""
    entry = {
        "ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
        "action": "probe",
        "by": "probe",
        "tool": call.tool,
        "tool_call_id": call.tool_call_id,
        "idempotency_key": call.idempotency_key,
        "attempt": call.attempt,
        "found": call.found,
        "verdict": said(verdict),
        "seconds": round(seconds, 3),
    }
    text = redact(json.dumps(entry, sort_keys=True, ensure_ascii=False, default=str))

    def write() -> None:
        try:
            views_of(store).append_audit(text)
        except Exception as exc:  # a store without a trail, or one that refuses it
            log.warning("airlock_redis: a probe's verdict could not be audited (%s): %s", exc, text)

    threading.Thread(target=write, name="airlock-redis-probe-audit", daemon=True).start()


def clock() -> float:
    return time.monotonic()
