"""Stores chosen by URL, in one registry: ``store_from_url("redis://localhost:6379/0")``.

Each URL scheme names a factory that takes the URL and the store's keyword options. Built in:

- ``memory://``: :class:`~airlock_redis.stores.memory.InMemoryEffectStore` (one process; no host,
  path or query: its options are keywords);
- ``redis://``, ``rediss://``, ``unix://``, ``redis+unix://``, ``redis+sentinel://``,
  ``rediss+sentinel://``, ``redis+cluster://``, ``rediss+cluster://``:
  :class:`~airlock_redis.stores.redis_store.RedisEffectStore` (the URL forms docs/topologies.md lists).

``EffectGuard(store="redis://...")`` and the ``airlock-redis`` commands resolve their URLs here, so a
store registered with :func:`register_scheme` works everywhere a URL does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .base import EffectStore
from .url import CLUSTER_SCHEMES, SENTINEL_SCHEMES, SINGLE_SCHEMES

StoreFactory = Callable[..., EffectStore]
"""``factory(url, **options)``: a store for ``url``."""

_lock = threading.Lock()
_factories: dict[str, StoreFactory] = {}


def register_scheme(scheme: str, factory: StoreFactory, *, replace: bool = False) -> None:
    """Make ``scheme://...`` URLs open stores made by ``factory(url, **options)``. A scheme already
    registered is refused (ValueError) unless ``replace`` is set."""
    name = scheme.lower().removesuffix("://")
    if not name or not all(c.isalnum() or c in "+-." for c in name) or not name[0].isalpha():
        raise ValueError(f"not a URL scheme: {scheme!r}")
    with _lock:
        if name in _factories and not replace:
            raise ValueError(
                f"the URL scheme {name!r} is already registered (pass replace=True to replace it)"
            )
        _factories[name] = factory


def schemes() -> tuple[str, ...]:
    """The registered URL schemes, sorted."""
    with _lock:
        return tuple(sorted(_factories))


def scheme_of(url: str) -> str:
    """The scheme of ``url``, lowercased ('' when it has none)."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep else ""


def store_from_url(url: str, **options: Any) -> EffectStore:
    """The store ``url`` names, made with ``options`` (the store class's keyword options).

    Raises ValueError for a URL whose scheme no store is registered for, naming the ones that are."""
    if not isinstance(url, str):
        raise TypeError(f"a store URL is a string, not {type(url).__name__}")
    scheme = scheme_of(url)
    with _lock:
        factory = _factories.get(scheme)
    if factory is None:
        known = ", ".join(f"{name}://" for name in schemes())
        what = f"the scheme {scheme!r}" if scheme else "a URL without a scheme"
        raise ValueError(f"no effect store is registered for {what}; the registered ones: {known}")
    return factory(url, **options)


def _memory(url: str, **options: Any) -> EffectStore:
    from .memory import InMemoryEffectStore

    rest = url.partition("://")[2]
    if rest not in ("", "/"):
        raise ValueError(
            f"memory:// takes no host, path or query (got {url!r}); pass its options as keywords: "
            "store_from_url('memory://', committed_ttl=..., pending_ttl=..., unknown_ttl=...)"
        )
    return InMemoryEffectStore(**options)


def _redis(url: str, **options: Any) -> EffectStore:
    from .redis_store import RedisEffectStore

    return RedisEffectStore(url, **options)


register_scheme("memory", _memory)
for _scheme in SINGLE_SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES:
    register_scheme(_scheme, _redis)
del _scheme
