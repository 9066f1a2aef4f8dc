"""Deadlines for the sends of one event loop, kept by one timer instead of one per send.

``asyncio.timeout`` arms a timer for every block it bounds and cancels it at the end: on this 2-core
machine that was about 10 us of a 100 us round trip, paid twice by every guarded call at one call
at a time (docs/performance.md). A send that ends before its deadline, which is nearly every send,
needs no timer of its own. :class:`Deadlines` keeps the sends under way in a short list and one
timer, armed for the earliest deadline among them: a send adds itself and takes itself off (a list
append and remove); when the timer fires, each send past its deadline has its task cancelled,
exactly as ``asyncio.timeout`` does, and the timer is armed again for the earliest deadline left
(or not at all). So the timer fires about once per deadline's length while sends go on, whatever
their number.

The one who started a send tells its cancellation by its deadline from any other with
:meth:`Deadlines.expired`, which mirrors ``asyncio.timeout``'s rule: a cancellation of the task
from anywhere else (the caller cancelled too) is never turned into a timeout. Python 3.11's
``Task.uncancel`` is what lets it tell: on 3.10 (:data:`SUPPORTED` is False) the caller keeps
``async_timeout``.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["SUPPORTED", "Deadlines", "Running"]

SUPPORTED = hasattr(asyncio.Task, "uncancel")
"""Whether this Python's tasks can take a cancellation back (3.11 on), which :class:`Deadlines` needs."""


class Running:
    """One send under way: the task it runs in, when its time is up (the loop's clock), how often the
    task was being cancelled when it started, and whether its deadline cancelled the task."""

    __slots__ = ("cancelling", "expired", "task", "when")

    def __init__(self, task: asyncio.Task[Any], when: float) -> None:
        self.task = task
        self.when = when
        self.cancelling = task.cancelling()
        self.expired = False


class Deadlines:
    """The deadlines of one event loop's sends (see the module docstring). Not thread-safe: like
    everything of a loop, used only from its thread."""

    __slots__ = ("_armed_for", "_loop", "_running", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._running: list[Running] = []
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = float("inf")

    @property
    def under_way(self) -> int:
        """How many sends are on their way now."""
        return len(self._running)

    def start(self, seconds: float) -> Running:
        """A send of the current task starts, to be done within ``seconds``."""
        task = asyncio.current_task(self._loop)
        if task is None:
            raise RuntimeError("a deadline is kept only for a send that runs in a task")
        running = Running(task, self._loop.time() + seconds)
        self._running.append(running)
        if running.when < self._armed_for:
            self._arm(running.when)
        return running

    def stop(self, running: Running) -> None:
        """The send is over (however it ended); its deadline no longer applies. Called again, nothing."""
        if running in self._running:
            self._running.remove(running)

    def expired(self, running: Running) -> bool:
        """Call when the send was cancelled: True when its deadline did it and nothing else cancelled
        the task meanwhile (its cancellation is then taken back: the caller raises a timeout
        instead), False when the cancellation is somebody else's and must go on."""
        self.stop(running)
        return running.expired and running.task.uncancel() <= running.cancelling

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        due, self._timer, self._armed_for = self._armed_for, None, float("inf")
        now = max(due, self._loop.time())
        later = float("inf")
        for running in self._running:
            if running.expired:
                continue
            if running.when <= now:
                running.expired = True
                running.task.cancel()
            else:
                later = min(later, running.when)
        if later != float("inf"):
            self._arm(later)
