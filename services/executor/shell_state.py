"""An open shell as the executor holding it keeps it (``Shell``): its own module so that the
registry (``shells``) and the per-command flow (``shell_runs``) both name it without naming
each other."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from contracts import replies as rp
from infra.exec import sandbox
from infra.exec.checkout import Checkout
from infra.exec.sandbox.ports import Ports
from infra.exec.sandbox.shell_server import SERVER_PROCESSES, Running
from services.executor import quota


@dataclass
class Shell:
    """An open shell, on the executor holding it."""

    id: str
    tenant: str
    workspace: str
    actor: str | None
    session: str | None
    run: str | None
    checkout: Checkout
    idle_s: float
    started: datetime
    expires: datetime
    process: sandbox.Live | None = None
    ended: asyncio.Task[sandbox.Outcome] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: Running | None = None
    last_used: float = field(default_factory=time.monotonic)
    last_used_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    background_commits: int = 0
    recorded: int = -1
    """The version its ``start`` record in ``WS_OUTPUT`` says it is at (``Shells._record``)."""
    dropped: int = 0
    """Bytes background processes wrote while no command ran (dropped)."""
    closing: bool = False
    ports: Ports | None = None
    """Its loopback ports, as the gateway reaches them (``services.executor.ports``)."""
    own: int = SERVER_PROCESSES
    """Processes of its sandbox that are not the user's: the server's and the provider's
    around it (``Provider.wrappers``), left out of what a close reports killed."""

    def touch(self) -> None:
        self.last_used, self.last_used_at = time.monotonic(), datetime.now(UTC)

    @property
    def stopped(self) -> quota.Stopped | None:
        """Why its sandbox was stopped over its quota or the disk's reserve, if it was."""
        ended = self.ended
        if ended is None or not ended.done() or ended.cancelled():
            return None
        exc = ended.exception()
        return exc if isinstance(exc, quota.Stopped) else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.ended is not None and not self.ended.done()

    async def on_output(self, stream: sandbox.StreamName, chunk: bytes) -> None:
        running = self.running
        if running is None:
            self.dropped += len(chunk)
            return
        await running.feed(stream, chunk)

    def listed(self) -> rp.LiveShell:
        return rp.LiveShell(
            shell=self.id,
            actor=self.actor,
            started=self.started,
            last_used=self.last_used_at,
            version=self.checkout.known,
            running=self.running.handle if self.running is not None else None,
        )


def now_utc() -> datetime:
    return datetime.now(UTC)
