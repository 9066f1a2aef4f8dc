"""Redis URLs to redis-py clients, for every topology the store supports.

- ``redis://[user:pass@]host:port/db``, ``rediss://...`` (TLS), ``unix:///path/to.sock?db=0``: one server,
  parsed by redis-py itself (query options such as ``ssl_ca_certs=`` pass through).
  ``redis+unix:///path/to.sock[?db=N]`` (the ``limits`` library's spelling) is the same as
  ``unix:///path/to.sock[?db=N]``, and is kept as that ``unix://`` URL.
- ``redis+cluster://[user:pass@]h1:p1,h2:p2[?options]`` (``rediss+cluster://`` for TLS): a Redis Cluster,
  reached through any of the listed nodes; a node without ``:port`` is on port 6379.
- ``redis+sentinel://[user:pass@]h1:p1,h2:p2/<service>[/db][?options]`` (``rediss+sentinel://``: TLS to
  the data nodes): the primary that the sentinels name for ``<service>``, followed across failovers.

Options after ``?`` (cluster and sentinel URLs): ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_cert_reqs`` (none / optional / required), ``ssl_check_hostname`` (true / false),
``sentinel_password`` and ``sentinel_username`` (sentinel URLs: credentials of the sentinels themselves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast
from urllib.parse import parse_qsl, unquote

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from ..redaction import redact
from .tries import RETRIES, RETRY_BACKOFF

# The retry policy of the clients built here for one server or a Sentinel-managed primary: a command
# whose connection dropped or timed out is sent again, up to RETRIES more times, after a short
# randomised backoff. The effect store asks for retries=0 and re-sends by itself, so that it sees
# every try's error (see tries.py). Cluster clients keep redis-py's own cluster retry policy.


def retry_options(retries: int = RETRIES) -> dict[str, Any]:
    """``retry`` and ``retry_on_error`` for a blocking client's connections."""
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.retry import Retry

    base, cap = RETRY_BACKOFF
    return {
        "retry": Retry(ExponentialWithJitterBackoff(base=base, cap=cap), retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
    }


def async_retry_options(retries: int = RETRIES) -> dict[str, Any]:
    """The same policy for asyncio clients."""
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.backoff import ExponentialWithJitterBackoff

    base, cap = RETRY_BACKOFF
    return {
        "retry": AsyncRetry(ExponentialWithJitterBackoff(base=base, cap=cap), retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
    }


SyncClient: TypeAlias = "redis.Redis | RedisCluster"
AsyncClient: TypeAlias = "aredis.Redis | AsyncRedisCluster"
Kind = Literal["single", "cluster", "sentinel"]

SINGLE_SCHEMES = ("redis", "rediss", "unix", "redis+unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_PORT = 6379  # the port of a cluster node named without one (redis+cluster://host)
_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
_SENTINEL_OPTIONS = ("sentinel_password", "sentinel_username")


@dataclass(frozen=True)
class RedisURL:
    """What a URL names: the topology, its seed hosts and the connection options."""

    kind: Kind
    url: str
    tls: bool
    hosts: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the data-node connections (credentials, TLS)."""
        kwargs: dict[str, Any] = {k: v for k, v in self.options.items() if k in _TLS_OPTIONS}
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        if self.tls:
            kwargs["ssl"] = True
        return kwargs


def parse_url(url: str) -> RedisURL:
    """Parse ``url``; a ValueError names what is wrong with it."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"not a Redis URL: {url!r} (expected e.g. redis://host:6379/0)")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "redis+unix":  # limits' name for unix://: redis-py and the CLI take the unix:// form
        url = "unix://" + url.split("://", 1)[1]
        scheme = "unix"
    if scheme in SINGLE_SCHEMES:
        return RedisURL("single", url, tls=scheme == "rediss")
    if scheme not in CLUSTER_SCHEMES + SENTINEL_SCHEMES:
        known = ", ".join(s + "://" for s in SINGLE_SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES)
        raise ValueError(f"unsupported Redis URL scheme {scheme + '://'!r}; use one of {known}")
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, sep, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
        if not sep:  # redis://secret@host: a password alone
            password, username = username, None
    default_port = CLUSTER_PORT if scheme in CLUSTER_SCHEMES else None
    hosts = tuple(_host_port(part, url, default_port) for part in netloc.split(",") if part.strip())
    if not hosts:
        raise ValueError(f"the URL {redact(url)!r} names no host:port")
    options = _options(query, url, sentinel=scheme in SENTINEL_SCHEMES)
    tls = scheme.startswith("rediss")
    segments = [unquote(s) for s in path.split("/") if s]
    if scheme in CLUSTER_SCHEMES:
        if segments and segments != ["0"]:
            raise ValueError(f"a Redis Cluster has only database 0; the URL {redact(url)!r} names {path!r}")
        return RedisURL("cluster", url, tls, hosts, None, 0, username, password, options)
    if not segments or len(segments) > 2:
        raise ValueError(
            f"a sentinel URL names the monitored service and optionally a database: "
            f"redis+sentinel://h1:p1,h2:p2/<service>[/db], not {redact(url)!r}"
        )
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ValueError(f"the database in {redact(url)!r} must be a number, not {segments[1]!r}")
        db = int(segments[1])
    return RedisURL("sentinel", url, tls, hosts, segments[0], db, username, password, options)


@dataclass(frozen=True)
class _Style:
    """The redis-py classes of one I/O style, for :func:`_client`."""

    redis: Any
    cluster: Any
    node: Any
    sentinel: Callable[[], Any]  # imported when a Sentinel URL needs it
    retry: Callable[[int], dict[str, Any]]


def _blocking_sentinel() -> Any:
    from redis.sentinel import Sentinel

    return Sentinel


def _async_sentinel() -> Any:
    from redis.asyncio.sentinel import Sentinel

    return Sentinel


_BLOCKING = _Style(redis.Redis, RedisCluster, ClusterNode, _blocking_sentinel, retry_options)
_ASYNC = _Style(aredis.Redis, AsyncRedisCluster, AsyncClusterNode, _async_sentinel, async_retry_options)


def _client(style: _Style, url: str | RedisURL, retries: int, kwargs: dict[str, Any]) -> Any:
    parsed = url if isinstance(url, RedisURL) else parse_url(url)
    if parsed.kind == "single":
        return style.redis.from_url(parsed.url, decode_responses=False, **style.retry(retries), **kwargs)
    options = {**parsed.connection_kwargs(), **kwargs}
    if parsed.kind == "cluster":
        nodes = [style.node(host, port) for host, port in parsed.hosts]
        return style.cluster(startup_nodes=nodes, decode_responses=False, **options)
    options.update(style.retry(retries))
    sentinel = style.sentinel()(
        list(parsed.hosts),
        sentinel_kwargs=_sentinel_kwargs(parsed, kwargs),
        decode_responses=False,
        **options,
    )
    assert parsed.service is not None
    return sentinel.master_for(parsed.service, db=parsed.db)


def sync_client(url: str | RedisURL, *, retries: int = RETRIES, **kwargs: Any) -> SyncClient:
    """A blocking client for ``url``; ``kwargs`` (timeouts) apply to every data connection;
    ``retries`` is how often a single server's or a Sentinel primary's command is sent again."""
    return cast(SyncClient, _client(_BLOCKING, url, retries, kwargs))


def async_client(url: str | RedisURL, *, retries: int = RETRIES, **kwargs: Any) -> AsyncClient:
    """An asyncio client for ``url`` (bound to the event loop that first uses it)."""
    return cast(AsyncClient, _client(_ASYNC, url, retries, kwargs))


def async_factory(url: str, **kwargs: Any) -> Callable[[], AsyncClient]:
    parsed = parse_url(url)  # fail at construction, not on the first async call
    return lambda: async_client(parsed, **kwargs)


NODE_KWARGS = (
    "username",
    "password",
    "socket_timeout",
    "socket_connect_timeout",
    "client_name",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_check_hostname",
)


def async_twin_of_cluster(client: RedisCluster) -> Callable[[], AsyncClient]:
    """A maker of asyncio cluster clients that reach the same cluster as a blocking one."""
    seeds = [(n.host, int(n.port)) for n in client.nodes_manager.startup_nodes.values()]
    given = client.nodes_manager.connection_kwargs
    kwargs = {k: v for k, v in given.items() if k in NODE_KWARGS}
    if given.get("connection_class") is not None and "SSL" in given["connection_class"].__name__:
        kwargs["ssl"] = True

    def make() -> AsyncClient:
        nodes = [AsyncClusterNode(host, port) for host, port in seeds]
        return AsyncRedisCluster(startup_nodes=nodes, decode_responses=False, **kwargs)

    return make


def async_node_client(cluster: AsyncRedisCluster, node: AsyncClusterNode) -> aredis.Redis:
    """A plain asyncio client to one node of a cluster, with the cluster's credentials and TLS."""
    from redis.asyncio.connection import ConnectionPool

    kwargs = {k: v for k, v in node.connection_kwargs.items() if k in (*NODE_KWARGS, "host", "port")}
    pool = ConnectionPool(connection_class=node.connection_class, **kwargs)
    return aredis.Redis(connection_pool=pool)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster | AsyncRedisCluster)


# What a client built here raises when Redis cannot be reached or refuses it: redis-py's errors, a
# RedisCluster that finds no reachable seed node (RedisClusterException is not a RedisError), and OS
# errors that escape the connection layer.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, RedisClusterException, OSError)

TOPOLOGY_NAMES: dict[Kind, str] = {
    "single": "one Redis server",
    "cluster": "a Redis Cluster",
    "sentinel": "the primary named by Redis Sentinel",
}


def describe_url(url: str | RedisURL) -> str:
    """``url`` without its password, and the topology its scheme names (for what a command prints)."""
    parsed = url if isinstance(url, RedisURL) else parse_url(url)
    return f"{redact(parsed.url)} ({TOPOLOGY_NAMES[parsed.kind]})"


def primary_clients(client: SyncClient) -> list[tuple[str, redis.Redis]]:
    """Every primary ``client`` writes to, as (``host:port``, a plain client to that node alone).

    A cluster client gives one entry per primary (sorted by name; the node clients carry the
    cluster's credentials and TLS, and must not be closed by the caller); any other client gives
    itself, named by the address it connects to (``primary`` when a sentinel names it)."""
    if isinstance(client, RedisCluster):
        nodes = sorted(client.get_primaries(), key=lambda node: str(node.name))
        return [(str(node.name), client.get_redis_connection(node)) for node in nodes]
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    service = getattr(pool, "service_name", None)
    if service:  # a Sentinel-managed primary
        name = f"primary of {service}"
    elif "path" in kwargs:
        name = str(kwargs["path"])
    elif "host" in kwargs:
        name = f"{kwargs['host']}:{kwargs.get('port', 6379)}"
    else:
        name = "primary"
    return [(name, client)]


def slot_primaries(client: SyncClient) -> dict[int, str]:
    """The ``host:port`` of the primary that serves each hash slot, as a cluster ``client`` last learnt
    the map (empty for any other client)."""
    if not isinstance(client, RedisCluster):
        return {}
    cache: dict[int, list[ClusterNode]] = client.nodes_manager.slots_cache
    return {slot: str(nodes[0].name) for slot, nodes in cache.items() if nodes}


def _host_port(part: str, url: str, default_port: int | None = None) -> tuple[str, int]:
    part = part.strip()
    if part.startswith("["):  # [::1]:7000, or [::1] alone
        host, _, after = part[1:].partition("]")
        port = after[1:] if after.startswith(":") else after  # anything but ":port" is not a port
        named = bool(after)
    else:
        host, sep, port = part.rpartition(":")
        named = bool(sep)
        if not sep:
            host, port = part, ""
    if not named and default_port is not None:  # "h1" -> the default port; "h1:" stays an error
        port = str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{part!r} in {redact(url)!r} is not host:port")
    return host, int(port)


def _options(query: str, url: str, *, sentinel: bool) -> dict[str, Any]:
    allowed = _TLS_OPTIONS + (_SENTINEL_OPTIONS if sentinel else ())
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in allowed:
            raise ValueError(
                f"unknown option {name!r} in {redact(url)!r}; this URL kind takes: {', '.join(allowed)}"
            )
        if name == "ssl_check_hostname":
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"ssl_check_hostname takes true or false, not {value!r}")
            options[name] = value.lower() in ("true", "1", "yes")
        else:
            options[name] = value
    return options


def _sentinel_kwargs(parsed: RedisURL, kwargs: dict[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {
        k: v for k, v in kwargs.items() if k in ("socket_timeout", "socket_connect_timeout")
    }
    if "sentinel_password" in parsed.options:
        extra["password"] = parsed.options["sentinel_password"]
    if "sentinel_username" in parsed.options:
        extra["username"] = parsed.options["sentinel_username"]
    return extra
