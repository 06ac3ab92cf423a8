"""``GET /health``: the gateway's own state (NATS reachable, its request slots: ``Health``) and
what it tells beyond itself: the executors without a cgroup per sandbox, and the services that
``quill up`` (or ``quill cluster up``) is restarting.

An executor without cgroups limits memory and processes per process only, so one command can
take a multiple of its memory limit (docs/executor.md, Threat model). It says so in its log
and its ping; the gateway asks every executor in the background (every ``EVERY_S``; the first
time at start) so that ``/health`` answers at once and an operator's probe sees the risk.

The launcher's supervisor (``quill_cli/supervisor.py``) knows which of its children exited and
when it starts them again; it answers ``<root>.sys.ping.launcher`` with that, and the gateway
asks every ``SUPERVISOR_EVERY_S``. A failing service makes ``/health`` say
``"status": "degraded"`` (still 200: the gateway serves, and the other services with it) and
name it. Services run some other way (compose, systemd) have no launcher to answer: nothing
is added then.

A full disk (``infra/storage.py``) is said in the ping answers (``storage_full``: the writer
for the log, a reader or an executor for its own disk); the gateway pings every service every
``STORAGE_EVERY_S`` and, while one says so, ``/health`` answers 503 with
``"status": "storage_full"`` and the reasons, until the state ends (docs/operations.md, Disk
full); its ``/metrics`` shows the same as ``quill_storage_full{service}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from typing import Any

from nats.aio.client import Client as NATS
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contracts.limits import GATEWAY_RETRY_AFTER_MS
from contracts.subjects import Subjects
from infra import bus
from infra.http.inflight import Slots
from infra.storage import STORAGE_FULL
from services.gateway import VERSION

log = logging.getLogger("quill.gateway")

SERVICE = "quill-gateway"
EVERY_S = 15.0
SUPERVISOR_EVERY_S = 1.0
STORAGE_EVERY_S = 2.0
WAIT_S = 0.5
"""How long one round gathers the executors' answers (and waits for the launcher's)."""
FAILING = ("restarting", "starting")
"""A child of the launcher in one of these states is failing (down, or not answering yet)."""


class Fleet:
    """The executors' answers of the last round of pings, and the launcher's last answer."""

    def __init__(
        self,
        nc: NATS,
        subjects: Subjects,
        every: float = EVERY_S,
        supervisor_every: float = SUPERVISOR_EVERY_S,
    ) -> None:
        self._nc, self._subjects, self._every = nc, subjects, every
        self._supervisor_every = supervisor_every
        self._answers: list[dict[str, Any]] | None = None
        self._launcher: dict[str, Any] | None = None
        self._full: list[dict[str, Any]] = []
        """Each service instance whose last ping answer said ``storage_full``."""
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch()),
            asyncio.create_task(self._watch_launcher()),
            asyncio.create_task(self._watch_storage()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            # Cancel until it is done: on Python 3.11 a cancellation that lands as a NATS
            # request's reply arrives is swallowed by its asyncio.wait_for, and the loop would
            # go on (stop() then hung for good).
            while not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        while True:
            try:
                self._answers = await bus.ping_all(self._nc, self._subjects, "executor", WAIT_S)
            except Exception as exc:  # NATS down: /health says so by itself
                log.debug("executor pings failed: %s", exc)
            await asyncio.sleep(self._every)

    async def _watch_launcher(self) -> None:
        subject = f"{self._subjects.root}.sys.ping.launcher"
        while True:
            try:
                reply = await self._nc.request(subject, b"", timeout=WAIT_S)
                self._launcher = json.loads(reply.data)
            except Exception as exc:  # no launcher (no responders), or NATS down
                self._launcher = None
                log.debug("launcher ping failed: %s", exc)
            await asyncio.sleep(self._supervisor_every)

    async def _watch_storage(self) -> None:
        while True:
            try:
                answers = await bus.ping_all(self._nc, self._subjects, None, WAIT_S)
                full = [
                    {
                        "service": "log" if a.get("service") == "writer" else a.get("service"),
                        "instance": a.get("instance"),
                        "reason": a["storage_full"],
                    }
                    for a in answers
                    if a.get("storage_full")
                ]
                for service in {f["service"] for f in [*self._full, *full]} | {"log"}:
                    STORAGE_FULL.labels(service).set(any(f["service"] == service for f in full))
                self._full = full
            except Exception as exc:  # NATS down: /health says so by itself
                log.debug("storage pings failed: %s", exc)
            await asyncio.sleep(STORAGE_EVERY_S)

    @property
    def storage_full(self) -> bool:
        return bool(self._full)

    def health(self) -> dict[str, Any]:
        """``executors``: how many answered, and which run sandboxes without a cgroup each;
        ``supervisor``: the launcher's children that are failing (when a launcher answers);
        ``warnings``: one line per such executor or child; ``status: degraded`` while a child
        fails (and NATS is reachable: else the gateway's own ``unavailable`` stands);
        ``status: storage_full`` and ``storage_full`` (service, instance, reason) while a disk
        is full (``/health`` then answers 503)."""
        body: dict[str, Any] = {}
        warnings: list[str] = []
        if self._answers is not None:
            without = sorted(
                str(a.get("instance")) for a in self._answers if a.get("cgroups") is False
            )
            body["executors"] = {"answered": len(self._answers), "without_cgroups": without}
            warnings += [
                f"executor {name}: no cgroup per sandbox: memory and processes are limited per "
                "process only (docs/executor.md, Threat model)"
                for name in without
            ]
        if self._launcher is not None:
            children = [c for c in self._launcher.get("children", []) if isinstance(c, dict)]
            failing = [c for c in children if c.get("state") in FAILING]
            body["supervisor"] = {"processes": len(children), "failing": failing}
            warnings += [_failing(child) for child in failing]
            if failing and self._nc.is_connected:
                body["status"] = "degraded"
        if self._full:
            body["status"] = "storage_full"
            body["storage_full"] = self._full
            warnings += [
                f"{f['service']} ({f['instance']}): storage full: {f['reason']}" for f in self._full
            ]
        if warnings:
            body["warnings"] = warnings
        return body


def _failing(child: dict[str, Any]) -> str:
    name, exits = child.get("name"), child.get("exits_in_a_row", 0)
    how = child.get("last_exit") or "exited"
    if child.get("state") == "restarting":
        when = f"restarting it in {child.get('restart_in_s', 0):g} s"
    else:
        when = "started again, not answering yet"
    return f"{name}: exited {exits} time{'s' if exits != 1 else ''} in a row ({how}); {when}"


class Health:
    """``GET /health`` (``endpoint``): ``ok`` (200), ``unavailable`` without NATS, ``busy``
    while every request slot is taken (503, ``Retry-After``), and what the ``fleet`` tells
    (``Fleet.health``)."""

    def __init__(self, nc: NATS, slots: Slots, fleet: Fleet | None = None) -> None:
        self.nc, self.slots, self.fleet = nc, slots, fleet

    async def endpoint(self, request: Request) -> Response:
        slots, fleet = self.slots, self.fleet
        up = self.nc.is_connected
        status = "ok" if up else "unavailable"
        body: dict[str, Any] = {"status": status, "service": SERVICE, "version": VERSION}
        full = False
        if fleet is not None:
            body |= fleet.health()
            full = fleet.storage_full
        body["http"] = slots.health()
        headers = None
        if slots.full:  # every request is refused busy now: say so, as they are told
            if up and not full:
                body["status"] = "busy"
            taken = f"{slots.serving} of {slots.max_inflight}"
            busy = f"http: every request slot is taken ({taken}): requests are refused busy"
            body["warnings"] = [*body.get("warnings", []), busy]
            headers = {"Retry-After": str(math.ceil(GATEWAY_RETRY_AFTER_MS / 1000))}
        ok = up and not full and not slots.full
        return JSONResponse(body, status_code=200 if ok else 503, headers=headers)
