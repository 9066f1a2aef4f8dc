"""Child processes that a terminal's Ctrl-C does not reach, started without a Ctrl-C cutting the
start in half.

A terminal sends SIGINT to its whole foreground process group: the command, and every process it
started. A ``spawn`` child of Python would print its own ``KeyboardInterrupt`` traceback, and a
private redis-server would stop before the command has removed what it wrote. The command alone
handles Ctrl-C: it stops its children, removes what the run wrote, and exits 130 with one line.

:func:`sigint_deferred` covers the start of child processes and of the multiprocessing objects they
share (locks, queues, and the resource tracker that unlinks their semaphores):

- SIGINT is blocked in this thread: a child inherits the signal mask across ``exec``, and Python never
  unblocks it, so the child never sees SIGINT;
- a SIGINT that arrives meanwhile is held, and raised as ``KeyboardInterrupt`` when the block ends: a
  ``KeyboardInterrupt`` in the middle of multiprocessing's set-up would leave a semaphore that no one
  unlinks (one created but not yet registered for clean-up), or a resource tracker started but not
  recorded. The resource tracker is started first, outside the mask: its own start unblocks SIGINT
  when it is done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from types import FrameType


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Start child processes and their shared objects meanwhile; a Ctrl-C is raised when it ends."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        resource_tracker.ensure_running()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a held SIGINT goes to hold() here
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if held:
        raise KeyboardInterrupt
