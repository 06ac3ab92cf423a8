"""Bounded concurrency: await many things at most a few at a time (``bounded_gather``),
fetch ahead of a consumer (``prefetched``), start work as it comes under a limit
(``InFlight``). Imports nothing of Quill's: any module may use it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
K = TypeVar("K")


async def bounded_gather(awaitables: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """Await all of ``awaitables``, at most ``limit`` at a time; results in order."""
    pending = list(awaitables)
    if len(pending) <= 1:  # the common case on a hot path: no semaphore, no gather
        return [await a for a in pending]
    gate = asyncio.Semaphore(limit)

    async def one(awaitable: Awaitable[T]) -> T:
        async with gate:
            return await awaitable

    return list(await asyncio.gather(*(one(a) for a in pending)))


async def prefetched(
    keys: Iterable[K], fetch: Callable[[K], Awaitable[T]], limit: int
) -> AsyncIterator[tuple[K, T]]:
    """``(key, await fetch(key))`` for each of ``keys``, in order, with up to ``limit``
    fetches in flight ahead of the one yielded (memory: ``limit`` results). What is still in
    flight when the iteration stops is cancelled."""
    ahead: deque[tuple[K, asyncio.Future[T]]] = deque()
    try:
        for key in keys:
            ahead.append((key, asyncio.ensure_future(fetch(key))))
            if len(ahead) >= limit:
                first, task = ahead.popleft()
                yield first, await task
        while ahead:
            first, task = ahead.popleft()
            yield first, await task
    finally:
        for _, task in ahead:
            task.cancel()
        if ahead:
            await asyncio.gather(*(task for _, task in ahead), return_exceptions=True)


class InFlight:
    """Up to ``limit`` awaitables run at once, started as they come (``add`` waits while
    ``limit`` run); ``drain`` waits for all. The first failure is raised by the ``add`` or
    ``drain`` that sees it, and the rest are cancelled."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._running: set[asyncio.Future[Any]] = set()

    async def add(self, awaitable: Awaitable[Any]) -> None:
        while len(self._running) >= self._limit:
            done, self._running = await asyncio.wait(
                self._running, return_when=asyncio.FIRST_COMPLETED
            )
            await self._check(done)
        self._running.add(asyncio.ensure_future(awaitable))

    async def drain(self) -> None:
        running, self._running = self._running, set()
        if running:
            await self._check((await asyncio.wait(running))[0])

    async def _check(self, done: set[asyncio.Future[Any]]) -> None:
        failed = next((t.exception() for t in done if t.exception() is not None), None)
        if failed is not None:
            for task in self._running:
                task.cancel()
            await asyncio.gather(*self._running, return_exceptions=True)
            self._running = set()
            raise failed


# ---------------------------------------------------------------- logs
