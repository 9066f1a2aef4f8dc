"""Moved: a guarded call is now :class:`airlock_redis.core.call_machine.CallMachine`, carried out by
:mod:`airlock_redis.executors`. Kept for the one name the package face imports from here."""

from __future__ import annotations

from .core.call_machine import Execution

__all__ = ["Execution"]
