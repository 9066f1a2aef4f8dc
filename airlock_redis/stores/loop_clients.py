"""The Redis store's asyncio clients, one per event loop (an asyncio client is bound to its loop), each
with its auto-pipeline (:mod:`.autopipe`), and closed when its loop shuts down if the store made it.

A plain dict keyed by loop, not a WeakKeyDictionary: the client's connections refer to their loop, so
weak keys would never be freed. Each client the store made is closed when its loop shuts down (an
async generator parked for the loop's lifetime, which the loop's ``shutdown_asyncgens()`` finishes:
``asyncio.run`` calls it before it closes the loop); entries of loops closed some other way are dropped
the next time a loop needs a client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from ..core.errors import StoreError
from .autopipe import AutoPipeline
from .loop_steps import step
from .url import AsyncClient

NO_ASYNC_WAY = (
    "this RedisEffectStore has no way to reach Redis from async code: pass a url, or "
    "async_client= (a redis.asyncio client or a function that makes one)"
)


@dataclass(eq=False)
class LoopClient:
    """One event loop's asyncio client, its auto-pipeline, and the hook that closes it."""

    client: AsyncClient
    closer: AsyncGenerator[None, None] | None = None
    pipeline: AutoPipeline = field(init=False)

    def __post_init__(self) -> None:
        self.pipeline = AutoPipeline(self.client)

    async def aclose(self) -> None:
        await self.client.aclose()


class LoopClients:
    """The asyncio client of each event loop, made by ``factory`` on a loop's first need (None: there
    is no way to make one); ``owned`` clients are closed when their loop shuts down."""

    __slots__ = ("_factory", "_held", "_owned")

    def __init__(self, factory: Callable[[], AsyncClient] | None, *, owned: bool) -> None:
        self._factory = factory
        self._owned = owned
        self._held: dict[asyncio.AbstractEventLoop, LoopClient] = {}

    @property
    def loops(self) -> frozenset[asyncio.AbstractEventLoop]:
        return frozenset(self._held)

    def current(self) -> LoopClient:
        """The running loop's client (made now if it has none)."""
        loop = asyncio.get_running_loop()
        held = self._held.get(loop)
        if held is None:
            if self._factory is None:
                raise StoreError(NO_ASYNC_WAY)
            self._forget_closed_loops()
            held = self._held[loop] = LoopClient(self._factory())
            if self._owned:
                held.closer = self._close_with_loop(loop, held)
                step(held.closer.__anext__())  # registers it with the loop, parks it at its yield
        return held

    async def aclose_current(self) -> None:
        """Close the running loop's client now (and let it go)."""
        held = self._held.pop(asyncio.get_running_loop(), None)
        if held is None:
            return
        if held.closer is not None:
            await held.closer.aclose()
        else:
            await held.aclose()

    async def _close_with_loop(
        self, loop: asyncio.AbstractEventLoop, held: LoopClient
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if self._held.get(loop) is held:
                del self._held[loop]
            if not loop.is_closed():
                await held.aclose()

    def _forget_closed_loops(self) -> None:
        for loop, held in list(self._held.items()):
            if loop.is_closed():
                self._held.pop(loop, None)
                if held.closer is not None:
                    step(held.closer.aclose())  # the loop is gone: end the hook without awaiting
