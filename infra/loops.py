"""A service's background loop that ends when told, whatever its step raised.

Why one helper: nats-py can turn a cancellation into another error (a ``TimeoutError``, a
connection error) inside a step; a loop whose ``except Exception`` logs a failed step and
goes on then never ends, and its service's stop hangs (a reader's stop hung 120 s in a full
run: the indexer, ``cancelling`` yet waiting for its next change). A ``Loop`` ends by its
flag as well as by the cancellation, and its ``stop`` waits a bounded time for it.

One turn is: wait (``every`` seconds, or until ``wake()``, whichever comes first; not before
the first turn unless ``wait_first``), then the step. A step that raises is reported to
``failed`` (inside the ``except``: ``log.exception`` works there) and the loop goes on,
unless it is stopping.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0
"""How long ``stop`` waits for the loop's task to end (it is cancelled and flagged)."""


class Loop:
    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[object]],
        *,
        every: float | None = None,
        woken: bool = False,
        wait_first: bool = False,
        failed: Callable[[Exception], None],
    ) -> None:
        """``every``: seconds between turns (None: only when woken); ``woken``: ``wake()``
        starts the next turn at once; ``failed``: told a step's error."""
        if every is None and not woken:
            raise ValueError(f"loop {name}: neither a period nor a wake-up")
        self.name, self._step, self._every = name, step, every
        self._wake: asyncio.Event | None = asyncio.Event() if woken else None
        self._wait_first, self._failed = wait_first, failed
        self.stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.stopping = False
        self._task = asyncio.create_task(self._run(), name=self.name)

    def wake(self) -> None:
        """Start the next turn now (a loop made ``woken``)."""
        if self._wake is not None:
            self._wake.set()

    @property
    def woken(self) -> bool:
        """Whether a wake-up came since the current turn began."""
        return self._wake is not None and self._wake.is_set()

    async def stop(self, timeout: float = STOP_WAIT_S) -> None:
        """Flag it, cancel it, and wait at most ``timeout`` for it to end (a second call
        waits the same way)."""
        self.stopping = True
        task = self._task
        if task is None:
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            log.warning("loop %s did not end within %.0f s of its stop", self.name, timeout)

    async def _pause(self) -> None:
        if self._wake is None:
            await asyncio.sleep(self._every or 0)
            return
        # asyncio.wait, not wait_for/timeout: on 3.11 those can swallow a cancellation that
        # comes as the timeout fires
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({woken}, timeout=self._every)
        finally:
            woken.cancel()
        self._wake.clear()

    async def _run(self) -> None:
        first = not self._wait_first
        while not self.stopping:
            if not first:
                await self._pause()
                if self.stopping:
                    return
            first = False
            try:
                await self._step()
            except Exception as exc:
                if self.stopping:
                    return
                self._failed(exc)
