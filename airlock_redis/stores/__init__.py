"""The store contract: what a store of your own implements, and the types it takes and answers.

A store keeps :class:`EffectStore` (the guard's calls: ``begin``, ``commit``, ``settle``, ``get``,
``resolve`` and their ``a``-prefixed coroutine forms); :class:`RemoteEffectStore` and
:class:`DurableEffectStore` are the optional parts (an ``airlock-redis`` target, durable pending
records). :class:`OperatorStore` is what the ``airlock-redis`` operator commands read and resolve
through (:func:`views_of` gives a store's; see docs/development.md). ``begin`` takes a
:class:`BeginRequest` and answers a :class:`BeginOutcome` whose :class:`BeginKind` says what it
found. ``commit``, ``settle`` and ``resolve`` answer a :class:`TransitionResult`; ``get`` a
:class:`Record` with its :class:`Status`; ``settle`` takes a :class:`Settlement`.

The stores themselves (``InMemoryEffectStore``, ``RedisEffectStore``) and the names a tool author or
operator uses (``EffectStore``, ``Record``, ``Status``, ``Settlement``, ``TransitionResult`` among
them) are imported from :mod:`airlock_redis`; the ``Begin*`` types, the optional protocols and the
operator's types are not in the package face (``airlock_redis.__all__``), only here.
"""

from __future__ import annotations

from ..core.records import BeginKind, BeginOutcome, BeginRequest, Record, Settlement, Status, TransitionResult
from .base import DurableEffectStore, EffectStore, RemoteEffectStore
from .operator_view import ListFilter, ListPage, ListQuery, OperatorStore, RecordView, views_of

__all__ = [
    "BeginKind",
    "BeginOutcome",
    "BeginRequest",
    "DurableEffectStore",
    "EffectStore",
    "ListFilter",
    "ListPage",
    "ListQuery",
    "OperatorStore",
    "Record",
    "RecordView",
    "RemoteEffectStore",
    "Settlement",
    "Status",
    "TransitionResult",
    "views_of",
]
