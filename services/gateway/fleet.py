"""What ``/health`` tells of the executors: those that cannot give each sandbox its own cgroup.

An executor without cgroups limits memory and processes per process only, so one command can
take a multiple of its memory limit (docs/executor.md, Threat model). It says so in its log
and its ping; the gateway asks every executor in the background (every ``EVERY_S``; the first
time at start) so that ``/health`` answers at once and an operator's probe sees the risk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from nats.aio.client import Client as NATS

from contracts.subjects import Subjects
from services.common import bus

log = logging.getLogger("quill.gateway")

EVERY_S = 15.0
WAIT_S = 0.5
"""How long one round gathers the executors' answers."""


class Fleet:
    """The executors' answers of the last round of pings."""

    def __init__(self, nc: NATS, subjects: Subjects, every: float = EVERY_S) -> None:
        self._nc, self._subjects, self._every = nc, subjects, every
        self._answers: list[dict[str, Any]] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        while True:
            try:
                self._answers = await bus.ping_all(self._nc, self._subjects, "executor", WAIT_S)
            except Exception as exc:  # NATS down: /health says so by itself
                log.debug("executor pings failed: %s", exc)
            await asyncio.sleep(self._every)

    def health(self) -> dict[str, Any]:
        """``executors``: how many answered, and which run sandboxes without a cgroup each;
        ``warnings``: one line per such executor. Empty before the first round."""
        if self._answers is None:
            return {}
        without = sorted(str(a.get("instance")) for a in self._answers if a.get("cgroups") is False)
        body: dict[str, Any] = {
            "executors": {"answered": len(self._answers), "without_cgroups": without}
        }
        if without:
            body["warnings"] = [
                f"executor {name}: no cgroup per sandbox: memory and processes are limited per "
                "process only (docs/executor.md, Threat model)"
                for name in without
            ]
        return body
