"""What the Redis store holds per event loop: its asyncio client (an asyncio client is bound to its
loop) with the client's auto-pipeline (:mod:`.autopipe`), and the plain clients to a Cluster's nodes
(:mod:`.asking`), each closed when its loop shuts down if the store made it.

:class:`PerLoop` is the pattern, written once: a plain dict keyed by loop, not a WeakKeyDictionary
(a client's connections refer to their loop, so weak keys would never be freed). A value is closed
when its loop shuts down by an async generator parked for the loop's lifetime, which the loop's
``shutdown_asyncgens()`` finishes (``asyncio.run`` calls it before it closes the loop); entries of
loops closed some other way are dropped the next time a loop needs a value.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..core.errors import StoreError
from .autopipe import AutoPipeline
from .loop_steps import step
from .url import AsyncClient

T = TypeVar("T")

NO_ASYNC_WAY = (
    "this RedisEffectStore has no way to reach Redis from async code: pass a url, or "
    "async_client= (a redis.asyncio client or a function that makes one)"
)


@dataclass(eq=False)
class _Held(Generic[T]):
    """One loop's value, and the hook that closes it with the loop (None: it is not closed so)."""

    value: T
    closer: AsyncGenerator[None, None] | None = None


class PerLoop(Generic[T]):
    """One value per event loop, made by ``make()`` on a loop's first need; with ``close``, closed
    (``await close(value)``) when its loop shuts down."""

    __slots__ = ("_close", "_held", "_last", "_make")

    def __init__(self, make: Callable[[], T], close: Callable[[T], Awaitable[None]] | None = None) -> None:
        self._make = make
        self._close = close
        self._held: dict[asyncio.AbstractEventLoop, _Held[T]] = {}
        # the last loop asked for and its value: every command of a call asks, nearly always from the
        # same loop (the loop is held here, as in _held, so it cannot be another loop at its address)
        self._last: tuple[asyncio.AbstractEventLoop, T] | None = None

    @property
    def loops(self) -> frozenset[asyncio.AbstractEventLoop]:
        """The loops that hold a value now."""
        return frozenset(self._held)

    def current(self) -> T:
        """The running loop's value (made now if it has none)."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] is loop:
            return last[1]
        held = self._held.get(loop)
        if held is None:
            value = self._make()
            self._forget_closed_loops()
            held = self._held[loop] = _Held(value)
            if self._close is not None:
                held.closer = self._close_with_loop(loop, held)
                step(held.closer.__anext__())  # registers it with the loop, parks it at its yield
        self._last = (loop, held.value)
        return held.value

    async def aclose_current(self, close: Callable[[T], Awaitable[None]] | None = None) -> None:
        """Let the running loop's value go now, closed as it would be with its loop (or, when it is
        not closed with its loop, by ``close``)."""
        self._last = None
        held = self._held.pop(asyncio.get_running_loop(), None)
        if held is None:
            return
        if held.closer is not None:
            await held.closer.aclose()
        elif close is not None:
            await close(held.value)

    async def _close_with_loop(
        self, loop: asyncio.AbstractEventLoop, held: _Held[T]
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            self._last = None
            if self._held.get(loop) is held:
                del self._held[loop]
            if not loop.is_closed() and self._close is not None:
                await self._close(held.value)

    def _forget_closed_loops(self) -> None:
        self._last = None
        for loop, held in list(self._held.items()):
            if loop.is_closed():
                self._held.pop(loop, None)
                if held.closer is not None:
                    step(held.closer.aclose())  # the loop is gone: end the hook without awaiting


@dataclass(eq=False)
class LoopClient:
    """One event loop's asyncio client and its auto-pipeline: ``direct``, it sends on the client's
    connections itself (see :mod:`.exchange`), else through redis-py's commands and pipelines."""

    client: AsyncClient
    direct: bool = False
    pipeline: AutoPipeline = field(init=False)

    def __post_init__(self) -> None:
        self.pipeline = AutoPipeline(self.client, direct=self.direct)

    async def aclose(self) -> None:
        await self.pipeline.aclose()
        await self.client.aclose()


class LoopClients:
    """The asyncio client of each event loop, made by ``factory`` on a loop's first need (None: there
    is no way to make one); ``owned`` clients are closed when their loop shuts down; ``direct``: the
    store built them to make one try per command, so their commands may skip redis-py's command
    layer (see :mod:`.exchange`: a client with a retry policy of its own keeps it)."""

    __slots__ = ("_direct", "_factory", "_per_loop")

    def __init__(
        self, factory: Callable[[], AsyncClient] | None, *, owned: bool, direct: bool = False
    ) -> None:
        self._factory = factory
        self._direct = direct
        self._per_loop: PerLoop[LoopClient] = PerLoop(self._make, LoopClient.aclose if owned else None)

    @property
    def loops(self) -> frozenset[asyncio.AbstractEventLoop]:
        return self._per_loop.loops

    def current(self) -> LoopClient:
        """The running loop's client (made now if it has none)."""
        return self._per_loop.current()

    async def aclose_current(self) -> None:
        """Close the running loop's client now (and let it go)."""
        await self._per_loop.aclose_current(LoopClient.aclose)

    def _make(self) -> LoopClient:
        if self._factory is None:
            raise StoreError(NO_ASYNC_WAY)
        return LoopClient(self._factory(), self._direct)
