"""Spare sandboxes: a bwrap sandbox started for a checkout before its next command arrives.

Only ``bwrap`` uses this module. Starting a sandbox (a cgroup, bwrap's namespaces and mounts,
``setpriv``, the first process) is most of what a short command costs; a spare has all of that
done, its first process waiting for the command (``shim.SHIM``). A spare is never reused: it
runs one command and ends with it, as a sandbox started for that command would; what it saves
is only the wait. So nothing of one command can reach the next through it: each command still
gets new namespaces, a new /tmp, a new PID namespace and cgroup.

A spare belongs to one checkout directory and one set of sandbox-wide limits (its key): the
executor asks for one (``warm``) when a command on a checkout has ended, and the next command on
that checkout takes it. At most ``most`` are kept, the oldest dropped first, each at most
``TTL_S`` unused; one whose checkout was evicted or purged is dropped (``discard``). Before a
spare is used, the provider checks that its /workspace is still the checkout's directory (a
reset replaces it); if not, or if it failed to start, it is dropped and a sandbox is started as
usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

TTL_S = 60.0
"""How long a spare waits for a command before it is dropped."""

Key = tuple[str, int, int, int | None]
"""(checkout directory, memory_bytes, processes, overlay generation or None): what a sandbox
is started with."""


class Box(Protocol):
    async def close(self) -> int: ...


B = TypeVar("B", bound=Box)


class Spares(Generic[B]):
    """The spare sandboxes of one provider, by key (see the module docstring)."""

    def __init__(self) -> None:
        self._spares: dict[Key, tuple[asyncio.Task[B], asyncio.TimerHandle]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __contains__(self, key: Key) -> bool:
        return key in self._spares

    def __len__(self) -> int:
        return len(self._spares)

    def put(self, key: Key, start: Coroutine[Any, Any, B], most: int) -> None:
        """Start a spare for ``key`` (``start`` makes it), dropping the oldest past ``most``."""
        if key in self._spares:
            start.close()
            return
        while self._spares and len(self._spares) >= most:
            self._drop(next(iter(self._spares)))
        task = asyncio.ensure_future(start)
        timer = asyncio.get_running_loop().call_later(TTL_S, self._drop, key)
        self._spares[key] = (task, timer)

    async def take(self, key: Key, usable: Callable[[B], Awaitable[bool]]) -> B | None:
        """The spare for ``key``, once started, if ``usable`` says so (else it is dropped);
        None if there is none. It is the caller's from then on."""
        entry = self._spares.pop(key, None)
        if entry is None:
            return None
        task, timer = entry
        timer.cancel()
        try:
            box = await asyncio.shield(task)
        except asyncio.CancelledError:
            self._end(task)  # the caller was cancelled: the spare goes with it
            raise
        except Exception as exc:
            log.info("spare sandbox for %s failed to start: %r", key[0], exc)
            return None
        try:
            ok = await usable(box)
        except BaseException:
            self._end(task)
            raise
        if not ok:
            log.info("spare sandbox for %s not usable: dropped", key[0])
            self._end(task)
            return None
        return box

    async def started(self, checkout: str) -> list[B]:
        """The spares over ``checkout`` once started (those that started)."""
        tasks = [task for key, (task, _) in self._spares.items() if key[0] == checkout]
        done = await asyncio.gather(*(asyncio.shield(t) for t in tasks), return_exceptions=True)
        return [box for box in done if not isinstance(box, BaseException)]

    def discard(self, checkout: str, but: Key | None = None) -> None:
        """Drop the spares over ``checkout`` (``but`` that one)."""
        for key in [k for k in self._spares if k[0] == checkout and k != but]:
            self._drop(key)

    async def close(self) -> None:
        """Drop every spare and wait until they are gone."""
        for key in list(self._spares):
            self._drop(key)
        while self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _drop(self, key: Key) -> None:
        entry = self._spares.pop(key, None)
        if entry is not None:
            entry[1].cancel()
            self._end(entry[0])

    def _end(self, task: asyncio.Task[B]) -> None:
        async def end() -> None:
            with contextlib.suppress(Exception):
                box = await task
                await box.close()

        closing = asyncio.ensure_future(end())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
