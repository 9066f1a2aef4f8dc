"""The store contract: what a store of your own implements, and the types it takes and answers.

A store keeps :class:`EffectStore` (the guard's calls: ``begin``, ``commit``, ``settle``, ``get``,
``resolve`` and their ``a``-prefixed coroutine forms); :class:`RemoteEffectStore` and
:class:`DurableEffectStore` are the optional parts (an ``airlock-redis`` target, durable pending
records). ``begin`` takes a :class:`BeginRequest` and answers a :class:`BeginOutcome` whose
:class:`BeginKind` says what it found. ``commit``, ``settle`` and ``resolve`` answer a
:class:`TransitionResult`; ``get`` a :class:`Record` with its :class:`Status`; ``settle`` takes a
:class:`Settlement`.

The stores themselves (``InMemoryEffectStore``, ``RedisEffectStore``) and the names a tool author or
operator uses (``EffectStore``, ``Record``, ``Status``, ``Settlement``, ``TransitionResult`` among
them) are imported from :mod:`airlock_redis`; the ``Begin*`` types and the optional protocols are
not in the package face (``airlock_redis.__all__``), only here.
"""

from __future__ import annotations

from ..core.records import BeginKind, BeginOutcome, BeginRequest, Record, Settlement, Status, TransitionResult
from .base import DurableEffectStore, EffectStore, RemoteEffectStore

__all__ = [
    "BeginKind",
    "BeginOutcome",
    "BeginRequest",
    "DurableEffectStore",
    "EffectStore",
    "Record",
    "RemoteEffectStore",
    "Settlement",
    "Status",
    "TransitionResult",
]
