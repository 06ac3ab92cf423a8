"""Keeping the children of ``quill up`` and ``quill cluster up`` running: restart with backoff.

A child that exits is started again after a delay that doubles with each exit in a row
(``Backoff``: 0.5 s, 1 s, 2 s … up to 30 s; ``QUILL_RESTART_BACKOFF=FIRST,CAP`` in seconds
changes both), and the count starts again once it has stayed up for twice the cap. It never
gives up: the other children keep serving meanwhile, and a service that cannot start (a full
disk, a bad configuration) is retried every 30 s until the cause is gone. Each change is one
line of the launcher's output (``quill: reader exited (…); restarting it in 2 s (3 exits in a
row)``, then ``quill: reader is back (pid …)``, once the new process answers its ping).

The supervisor answers ``<root>.sys.ping.launcher`` with the state of every child (``report``):
the gateway asks it every second and names the failing ones in ``/health``
(``services/gateway/health.py``). Each restart counts in ``quill_launcher_restarts_total``
(the launcher's own metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import prometheus_client as prom
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts import codec
from infra import bus
from quill.credentials import NatsAuth

log = logging.getLogger("quill_cli.supervisor")

FIRST_S = 0.5
CAP_S = 30.0
ENV = "QUILL_RESTART_BACKOFF"
TICK_S = 0.2
SERVICE = "launcher"
"""The name the supervisor answers pings as (``<root>.sys.ping.launcher``)."""
RESTARTS = prom.Counter(
    "quill_launcher_restarts_total",
    "Processes the launcher started again after they exited, by process name.",
    ["process"],
)


@dataclass
class Backoff:
    """The delay before starting a child again: ``first`` doubled with each exit in a row,
    at most ``cap``; a child that ran for ``2 * cap`` seconds starts the count again."""

    first: float = FIRST_S
    cap: float = CAP_S
    exits: int = 0
    """Exits in a row (of runs shorter than ``2 * cap``)."""

    def failed(self, ran_s: float) -> float:
        """The child exited after running ``ran_s`` seconds: the delay before the next start."""
        if ran_s >= 2 * self.cap:
            self.exits = 0
        self.exits += 1
        return float(min(self.first * 2 ** min(self.exits - 1, 62), self.cap))

    @classmethod
    def from_env(cls) -> Backoff:
        """``$QUILL_RESTART_BACKOFF`` (``FIRST,CAP`` seconds), else the defaults.

        Raises:
            ValueError: it is not two positive numbers, the first not above the second.
        """
        value = os.environ.get(ENV, "").strip()
        if not value:
            return cls()
        try:
            first, cap = (float(part) for part in value.split(","))
        except ValueError:
            raise ValueError(f"{ENV} must be FIRST,CAP in seconds (e.g. 0.5,30)") from None
        if not 0 < first <= cap:
            raise ValueError(f"{ENV}: 0 < FIRST <= CAP, not {value}")
        return cls(first, cap)


def describe_exit(code: int | None) -> str:
    """``code 3``, ``killed by SIGKILL``."""
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"code {code}"


@dataclass
class Watch:
    """What the supervisor knows of one child."""

    backoff: Backoff
    pid: int | None
    started: float
    state: str = "up"
    """``up``; ``restarting`` (down, waiting for its delay); ``starting`` (started again, not
    answering yet); ``stopped`` (on purpose)."""
    retry_at: float = 0.0
    last_exit: int | None = None
    restarts: int = 0

    def report(self, name: str, now: float) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": name,
            "state": self.state,
            "pid": self.pid if self.state != "restarting" else None,
            "exits_in_a_row": self.backoff.exits,
            "restarts": self.restarts,
            "last_exit": describe_exit(self.last_exit) if self.last_exit is not None else None,
        }
        if self.state == "restarting":
            body["restart_in_s"] = round(max(0.0, self.retry_at - now), 1)
        return body


@dataclass
class Supervisor:
    """Restarts the children of a launcher that exit: ``await open()``, then ``await close()``
    (after the tick under way, so that no child is started behind the launcher's back while it
    stops them)."""

    children: Callable[[], list[Any]]
    """The launcher's children (``quill_cli.launcher.Child``), read at every tick."""
    guard: asyncio.Lock
    """Held during a tick: the launcher's own ``kill``/``stop``/``start`` hold it too."""
    nats_url: str
    auth: NatsAuth | None
    root: str
    say: Callable[[str], None]
    """Where the restart and recovery lines go (``quill up``'s output)."""
    backoff: Backoff
    watches: dict[str, Watch] = field(default_factory=dict)
    _nc: NATS | None = None
    _answered: set[int] = field(default_factory=set)
    _inbox: str = ""
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Connect, answer ``<root>.sys.ping.launcher``, take the children as they run now,
        and supervise them.

        Raises:
            ConnectionError: NATS did not answer.
        """
        self._nc = nc = await bus.connect(self.nats_url, "quill-supervisor", auth=self.auth)
        self._inbox = nc.new_inbox()
        await nc.subscribe(self._inbox, cb=self._pong)
        await nc.subscribe(f"{self.root}.sys.ping.{SERVICE}", cb=self._ping)
        now = time.monotonic()
        for child in self.children():
            self.watches[child.name] = self._watch(child, now)
        self._task = asyncio.create_task(self._run(), name="supervisor")

    async def close(self) -> None:
        """Stop supervising (once the tick under way is done) and disconnect."""
        self._closing.set()
        if self._task is not None:
            await self._task
            self._task = None
        if self._nc is not None:
            await self._nc.close()
            self._nc = None

    async def _run(self) -> None:
        while not self._closing.is_set():
            try:
                async with self.guard:
                    await self.tick()
            except Exception:  # the supervisor itself must not stop supervising
                log.exception("supervisor tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), TICK_S)

    def report(self) -> dict[str, Any]:
        """What ``ping.launcher`` answers: this process, and each child's state."""
        now = time.monotonic()
        return {
            "service": SERVICE,
            "instance": bus.instance_id(SERVICE),
            "pid": os.getpid(),
            "children": [w.report(name, now) for name, w in self.watches.items()],
        }

    def _watch(self, child: Any, now: float) -> Watch:
        state = "up" if child.wanted else "stopped"
        return Watch(Backoff(self.backoff.first, self.backoff.cap), child.pid, now, state)

    async def tick(self) -> None:
        now = time.monotonic()
        for child in self.children():
            watch = self.watches.setdefault(child.name, self._watch(child, now))
            await self._step(child, watch, now)

    async def _step(self, child: Any, watch: Watch, now: float) -> None:
        alive = child.alive()
        if not child.wanted:
            watch.state = "stopped"
            return
        if alive and child.pid != watch.pid:  # started by the launcher's start()/restart()
            watch.pid, watch.started, watch.state = child.pid, now, "starting"
        if watch.state == "restarting":
            if now >= watch.retry_at:
                RESTARTS.labels(child.name).inc()  # counted before stack.json names the pid
                await asyncio.to_thread(child.start)
                watch.pid, watch.started, watch.state = child.pid, now, "starting"
                watch.restarts += 1
            return
        if not alive:  # up, starting, or wanted again after a stop: it exited
            delay = watch.backoff.failed(now - watch.started)
            watch.state, watch.retry_at = "restarting", now + delay
            watch.last_exit = child.exit_code
            exits = watch.backoff.exits
            self.say(
                f"quill: {child.name} exited ({describe_exit(watch.last_exit)}); restarting it "
                f"in {delay:g} s ({exits} exit{'s' if exits > 1 else ''} in a row)"
            )
            return
        if watch.state == "starting":
            if child.ping is None or child.pid in self._answered:
                watch.state = "up"
                self._answered.discard(child.pid)
                self.say(f"quill: {child.name} is back (pid {child.pid})")
            elif self._nc is not None:
                with contextlib.suppress(Exception):  # NATS away: ask again next tick
                    subject = f"{self.root}.sys.ping.{child.ping}"
                    await self._nc.publish(subject, b"", reply=self._inbox)

    async def _pong(self, msg: Msg) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self._answered.add(int(json.loads(msg.data)["pid"]))

    async def _ping(self, msg: Msg) -> None:
        await bus.respond(msg, codec.encode(self.report()))
