"""The effect store shared through Redis: one hash per tool call, every transition one Lua script.

Every script is safe to re-send (redis-py re-sends a command after a timeout): the attempt's owner
token makes a second ``begin`` or ``commit`` by the same attempt a no-op, and fences off an
attempt that was superseded.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import redis
import redis.asyncio as aredis
from redis.commands.core import AsyncScript, Script

from ..core.errors import StoreError
from ..core.records import BeginOutcome, BeginRequest, Record, Settlement, Status, TransitionResult
from .base import check_verdict
from .keys import DEFAULT_NAMESPACE, check_namespace, record_key
from .replies import parse_begin, parse_record, parse_transition
from .scripts import SCRIPT_NAMES, script_source
from .ttl import DEFAULT_COMMITTED_TTL, DEFAULT_PENDING_TTL, DEFAULT_UNKNOWN_TTL, StatusTTLs

T = TypeVar("T")

DEFAULT_URL = "redis://localhost:6379/0"
_REDIS_FAILURES = (redis.RedisError, OSError)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class RedisEffectStore:
    """Records in Redis, shared by every process and machine that points at the same server.

    ``url`` picks the server (``redis://``, ``rediss://``, ``unix://``); ``client=`` takes an existing
    redis-py client instead (it must not decode responses). Coroutine operations use a
    ``redis.asyncio`` client made for the running event loop (or ``async_client=``).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        committed_ttl: float = DEFAULT_COMMITTED_TTL,
        pending_ttl: float = DEFAULT_PENDING_TTL,
        unknown_ttl: float = DEFAULT_UNKNOWN_TTL,
        client: redis.Redis | None = None,
        async_client: aredis.Redis | Callable[[], aredis.Redis] | None = None,
        socket_timeout: float | None = 5.0,
        socket_connect_timeout: float | None = 5.0,
    ) -> None:
        self.namespace = check_namespace(namespace)
        self.ttls = StatusTTLs(committed=committed_ttl, pending=pending_ttl, unknown=unknown_ttl)
        if url is None and client is None and async_client is None:
            url = DEFAULT_URL
        self.url = url
        self._timeouts: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
        }
        for given in (client, async_client):
            if given is not None and not _is_factory(given) and _decodes_responses(given):
                raise ValueError(
                    "the Redis client decodes responses to str; the effect store needs bytes "
                    "(create the client with decode_responses=False)"
                )
        self._client: redis.Redis | None = client
        self._sync_scripts: dict[str, Script] = {}
        self._async_factory = self._pick_async_factory(async_client)
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aredis.Redis] = (
            weakref.WeakKeyDictionary()
        )
        self._async_scripts: weakref.WeakKeyDictionary[aredis.Redis, dict[str, AsyncScript]] = (
            weakref.WeakKeyDictionary()
        )

    def _pick_async_factory(
        self, async_client: aredis.Redis | Callable[[], aredis.Redis] | None
    ) -> Callable[[], aredis.Redis] | None:
        if async_client is not None and not _is_factory(async_client):
            fixed = cast(aredis.Redis, async_client)
            return lambda: fixed
        if async_client is not None:
            return cast(Callable[[], aredis.Redis], async_client)
        if self.url is not None:
            url = self.url
            return lambda: aredis.Redis.from_url(url, decode_responses=False, **self._timeouts)
        if self._client is not None:
            return async_twin_factory(self._client)
        return None

    def __repr__(self) -> str:
        where = _redact(self.url) if self.url else type(self._client).__name__
        return f"RedisEffectStore({where!s}, namespace={self.namespace!r})"

    # -- clients ---------------------------------------------------------------------------------
    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            assert self.url is not None
            self._client = redis.Redis.from_url(self.url, decode_responses=False, **self._timeouts)
        return self._client

    def _script(self, name: str) -> Script:
        script = self._sync_scripts.get(name)
        if script is None:
            script = self._sync_scripts[name] = self.client.register_script(script_source(name))
        return script

    def async_client(self) -> aredis.Redis:
        """The asyncio client for the running event loop (one per loop: asyncio clients are loop-bound)."""
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            if self._async_factory is None:
                raise StoreError(
                    "this RedisEffectStore has no way to reach Redis from async code: pass a url, or "
                    "async_client= (a redis.asyncio client or a function that makes one)"
                )
            client = self._async_clients[loop] = self._async_factory()
        return client

    def _ascript(self, name: str) -> AsyncScript:
        client = self.async_client()
        scripts = self._async_scripts.setdefault(client, {})
        script = scripts.get(name)
        if script is None:
            script = scripts[name] = client.register_script(script_source(name))
        return script

    def key(self, tool_call_id: str) -> bytes:
        return record_key(self.namespace, tool_call_id)

    # -- arguments of each script (shared by both paths) -----------------------------------------
    def _begin_args(self, request: BeginRequest) -> list[Any]:
        return [
            request.idempotency_key,
            request.tool,
            request.token,
            "1" if request.reversible else "0",
            self.ttls.millis(Status.PENDING),
            _now_ms(),
        ]

    def _commit_args(self, token: str, value: bytes | None, mac: bytes | None) -> list[Any]:
        stored = value is not None
        return [
            token,
            "1" if stored else "0",
            value or b"",
            mac or b"",
            self.ttls.millis(Status.COMMITTED),
            _now_ms(),
        ]

    def _settle_args(self, token: str, settlement: Settlement) -> list[Any]:
        return [token, settlement.value, self.ttls.millis(Status.UNKNOWN)]

    def _resolve_args(
        self, verdict: Status | Settlement, expect_key: str | None, value: bytes | None, mac: bytes | None
    ) -> list[Any]:
        check_verdict(verdict)
        if verdict is Settlement.RELEASE:
            name, ttl = "release", 1
        elif verdict is Status.COMMITTED:
            name, ttl = "committed", self.ttls.millis(Status.COMMITTED)
        else:
            name, ttl = "unknown", self.ttls.millis(Status.UNKNOWN)
        owner = "operator:" + secrets.token_hex(8)
        stored = "1" if value is not None else "0"
        return [name, expect_key or "", owner, stored, value or b"", mac or b"", ttl, _now_ms()]

    # -- blocking operations ---------------------------------------------------------------------
    def _run(self, name: str, tool_call_id: str, args: list[Any]) -> Any:
        return _guarded(lambda: self._script(name)(keys=[self.key(tool_call_id)], args=args))

    def begin(self, request: BeginRequest) -> BeginOutcome:
        return parse_begin(self._run("begin", request.tool_call_id, self._begin_args(request)))

    def commit(
        self, tool_call_id: str, token: str, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        return parse_transition(self._run("commit", tool_call_id, self._commit_args(token, value, mac)))

    def settle(self, tool_call_id: str, token: str, settlement: Settlement) -> TransitionResult:
        return parse_transition(self._run("settle", tool_call_id, self._settle_args(token, settlement)))

    def resolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        expect_key: str | None = None,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        args = self._resolve_args(verdict, expect_key, value, mac)
        return parse_transition(self._run("resolve", tool_call_id, args))

    def get(self, tool_call_id: str) -> Record | None:
        key = self.key(tool_call_id)

        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(key)
            pipe.pttl(key)
            return pipe.execute()

        fields, pttl = _guarded(read)
        return parse_record(tool_call_id, fields, int(pttl))

    def ping(self) -> bool:
        return bool(_guarded(self.client.ping))

    def load_scripts(self) -> None:
        """Load every script into the server's cache now (they load on first use otherwise)."""
        for name in SCRIPT_NAMES:
            _guarded(lambda name=name: self.client.script_load(script_source(name)))  # type: ignore[misc]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    # -- coroutine operations --------------------------------------------------------------------
    async def _arun(self, name: str, tool_call_id: str, args: list[Any]) -> Any:
        return await _aguarded(lambda: self._ascript(name)(keys=[self.key(tool_call_id)], args=args))

    async def abegin(self, request: BeginRequest) -> BeginOutcome:
        return parse_begin(await self._arun("begin", request.tool_call_id, self._begin_args(request)))

    async def acommit(
        self, tool_call_id: str, token: str, value: bytes | None, mac: bytes | None
    ) -> TransitionResult:
        return parse_transition(
            await self._arun("commit", tool_call_id, self._commit_args(token, value, mac))
        )

    async def asettle(self, tool_call_id: str, token: str, settlement: Settlement) -> TransitionResult:
        return parse_transition(
            await self._arun("settle", tool_call_id, self._settle_args(token, settlement))
        )

    async def aresolve(
        self,
        tool_call_id: str,
        verdict: Status | Settlement,
        *,
        expect_key: str | None = None,
        value: bytes | None = None,
        mac: bytes | None = None,
    ) -> TransitionResult:
        args = self._resolve_args(verdict, expect_key, value, mac)
        return parse_transition(await self._arun("resolve", tool_call_id, args))

    async def aget(self, tool_call_id: str) -> Record | None:
        key = self.key(tool_call_id)

        async def read() -> list[Any]:
            pipe = self.async_client().pipeline(transaction=False)
            pipe.hgetall(key)
            pipe.pttl(key)
            return await pipe.execute()

        fields, pttl = await _aguarded(read)
        return parse_record(tool_call_id, fields, int(pttl))

    async def aclose(self) -> None:
        """Close the asyncio client of the running loop."""
        client = self._async_clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


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
    allowed = {
        "host",
        "port",
        "path",
        "db",
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
    }
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in allowed}

    def make() -> aredis.Redis:
        return aredis.Redis(connection_pool=aconnection.ConnectionPool(connection_class=twin, **kwargs))

    return make


def _is_factory(value: Any) -> bool:
    return (
        callable(value)
        and not hasattr(value, "connection_pool")
        and not hasattr(value, "get_connection_kwargs")
    )


def _decodes_responses(client: Any) -> bool:
    try:
        kwargs = client.get_connection_kwargs()
    except Exception:
        return False
    return bool(kwargs.get("decode_responses"))


def _redact(url: str) -> str:
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


def _guarded(operation: Callable[[], T]) -> T:
    try:
        return operation()
    except _REDIS_FAILURES as exc:
        raise StoreError(f"Redis did not complete the operation: {type(exc).__name__}: {exc}") from exc


async def _aguarded(operation: Callable[[], Awaitable[T]]) -> T:
    try:
        return await operation()
    except _REDIS_FAILURES as exc:
        raise StoreError(f"Redis did not complete the operation: {type(exc).__name__}: {exc}") from exc
