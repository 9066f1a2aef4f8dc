"""The redis-py clients a Redis store works with, apart from the store: the asyncio twin of a blocking
client passed in, and the URL a client connects to (what an operator's command line needs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import redis
import redis.asyncio as aredis
from redis.cluster import RedisCluster

from .tries import RETRIES
from .url import (
    NODE_KWARGS,
    AsyncClient,
    RedisURL,
    SyncClient,
    async_retry_options,
    async_twin_of_cluster,
)
from .url import async_client as url_async_client


def async_twin_factory(client: redis.Redis) -> Callable[[], aredis.Redis] | None:
    """A maker of asyncio clients that reach the same server as a blocking redis-py client."""
    from redis import connection as sconnection
    from redis.asyncio import connection as aconnection

    pool = client.connection_pool
    twins: dict[type[Any], type[Any]] = {
        sconnection.Connection: aconnection.Connection,
        sconnection.UnixDomainSocketConnection: aconnection.UnixDomainSocketConnection,
        sconnection.SSLConnection: aconnection.SSLConnection,
    }
    twin = twins.get(pool.connection_class)
    if twin is None:
        return None
    allowed = {"host", "port", "path", "db", *NODE_KWARGS}
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in allowed}

    def make() -> aredis.Redis:
        twin_pool = aconnection.BlockingConnectionPool(
            connection_class=twin,
            max_connections=pool.max_connections,
            timeout=kwargs.get("socket_timeout"),
            **kwargs,
        )
        return aredis.Redis.from_pool(twin_pool)  # owns the pool: aclose() disconnects it

    return make


def is_factory(value: Any) -> bool:
    return (
        callable(value)
        and not hasattr(value, "connection_pool")
        and not hasattr(value, "get_connection_kwargs")
    )


def decodes_responses(client: Any) -> bool:
    try:
        kwargs = client.get_connection_kwargs()
    except Exception:
        return False
    return bool(kwargs.get("decode_responses"))


def url_of_client(client: Any) -> str | None:
    """The Redis URL a redis-py client connects to, without its password (the user is kept), for
    what an operator pastes: ``redis://host:port/db``, ``rediss://...``, ``unix://path[?db=N]``,
    ``redis+cluster://h:p,h:p``, ``redis+sentinel://h:p,h:p/<service>[/db]``. None for a client
    whose connection is not one of redis-py's own (a fake, a custom connection class)."""
    from redis import connection as sconnection
    from redis import sentinel as ssentinel

    if isinstance(client, RedisCluster):
        nodes = client.nodes_manager.startup_nodes.values()
        given = client.nodes_manager.connection_kwargs
        tls = "SSL" in getattr(given.get("connection_class"), "__name__", "")
        hosts = ",".join(_host_text(str(node.host), int(node.port)) for node in nodes)
        return f"{'rediss' if tls else 'redis'}+cluster://{_user_at(given)}{hosts}" if hosts else None
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return None
    kind, kwargs = pool.connection_class, pool.connection_kwargs
    db = int(kwargs.get("db") or 0)
    if isinstance(pool, ssentinel.SentinelConnectionPool):
        manager = pool.sentinel_manager
        seeds = [s.connection_pool.connection_kwargs for s in manager.sentinels]
        hosts = ",".join(_host_text(str(k.get("host")), int(k.get("port", 26379))) for k in seeds)
        tls = issubclass(kind, ssentinel.SentinelManagedSSLConnection)
        scheme = "rediss+sentinel" if tls else "redis+sentinel"
        tail = f"/{db}" if db else ""
        return f"{scheme}://{_user_at(kwargs)}{hosts}/{pool.service_name}{tail}" if hosts else None
    if kind is sconnection.UnixDomainSocketConnection:
        return f"unix://{_user_at(kwargs)}{kwargs['path']}" + (f"?db={db}" if db else "")
    if kind in (sconnection.Connection, sconnection.SSLConnection):
        scheme = "rediss" if kind is sconnection.SSLConnection else "redis"
        where = _host_text(str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379)))
        return f"{scheme}://{_user_at(kwargs)}{where}/{db}"
    return None


def _host_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _user_at(kwargs: dict[str, Any]) -> str:
    from urllib.parse import quote

    user = kwargs.get("username")
    return f"{quote(str(user), safe='')}@" if user else ""


def async_factory(
    async_client: AsyncClient | Callable[[], AsyncClient] | None,
    parsed: RedisURL | None,
    timeouts: dict[str, Any],
    client: SyncClient | None,
) -> Callable[[], AsyncClient] | None:
    """How a store makes the asyncio client of each event loop: the ``async_client=`` it was given
    (a client, or a function that makes one), else one made from its URL, else the twin of the
    blocking ``client=``; None when there is no way."""
    if async_client is not None and not is_factory(async_client):
        fixed = cast(AsyncClient, async_client)
        return lambda: fixed
    if async_client is not None:
        return cast(Callable[[], AsyncClient], async_client)
    if parsed is not None and parsed.kind != "single":
        options = dict(timeouts)
        retries = 0 if parsed.kind == "sentinel" else RETRIES  # Cluster: redis-py's own policy
        return lambda: url_async_client(parsed, retries=retries, **options)
    if parsed is not None:
        url = parsed.url

        def make() -> aredis.Redis:
            # A blocking pool: past max_connections concurrent calls wait for a connection
            # (up to the socket timeout) instead of failing with "Too many connections".
            pool = aredis.BlockingConnectionPool.from_url(
                url,
                decode_responses=False,
                timeout=timeouts["socket_timeout"],
                **async_retry_options(0),
                **timeouts,
            )
            return aredis.Redis.from_pool(pool)

        return make
    if isinstance(client, RedisCluster):
        return async_twin_of_cluster(client)
    if client is not None:
        return async_twin_factory(client)
    return None
