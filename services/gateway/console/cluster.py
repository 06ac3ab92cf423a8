"""The cluster page: each service instance that answers its ping (``<root>.sys.ping``, what
``/health`` and ``quill status`` ask), its state, each reader replica's lag behind the event
log, the writers' command partitions and who holds each, and the launcher's processes (when
``quill up`` or ``quill cluster up`` runs them, as ``/health`` reports them).

One round of pings gathers answers for ``WAIT_S``; a round is kept ``FRESH_S`` so that many
viewers cost one round. A replica's lag is the event stream's last sequence minus the position
the replica has applied. Nothing on the page is a tenant's: no workspace, no content.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from contracts.subjects import STREAM_EVENTS
from infra import bus

if TYPE_CHECKING:
    from services.gateway.console import Console

WAIT_S = 0.3
FRESH_S = 2.0
ORDER = ("gateway", "writer", "reader", "executor", "bridge")


@dataclass
class Instance:
    service: str
    instance: str
    state: str
    facts: dict[str, Any]
    lag: int | None = None


@dataclass
class Round:
    at: float
    instances: list[Instance]
    partitions: dict[int, list[str]] = field(default_factory=dict)
    """Each partition's holders (one, unless a lease is changing hands; none: unheld)."""
    partition_count: int = 0
    processes: list[dict[str, Any]] = field(default_factory=list)
    last_seq: int | None = None


def _state(answer: dict[str, Any]) -> str:
    if answer.get("service") == "reader":
        if answer.get("caught_up"):
            return "serving"
        return "serving, catching up" if answer.get("serving") else "catching up"
    if answer.get("service") == "executor" and answer.get("cgroups") is False:
        return "serving (no cgroup per sandbox)"
    return "serving"


class Cluster:
    """The last round of pings, asked again when older than ``FRESH_S``."""

    def __init__(self) -> None:
        self.last: Round | None = None
        self._lock = asyncio.Lock()

    async def round(self, c: Console) -> Round:
        async with self._lock:
            if self.last is None or time.monotonic() - self.last.at > FRESH_S:
                self.last = await self._ask(c)
            return self.last

    async def _ask(self, c: Console) -> Round:
        quill = c.access.quill
        nc, subjects = quill.nc, quill.subjects
        answers, launcher, last_seq = await asyncio.gather(
            bus.ping_all(nc, subjects, None, WAIT_S), _launcher(c), _last_seq(c)
        )
        found = Round(time.monotonic(), [], last_seq=last_seq)
        for a in answers:
            if a.get("service") == "launcher":
                continue
            facts = {k: v for k, v in a.items() if k not in ("service", "instance")}
            one = Instance(str(a.get("service")), str(a.get("instance")), _state(a), facts)
            if one.service == "reader" and last_seq is not None:
                one.lag = max(0, last_seq - int(a.get("position") or 0))
            found.instances.append(one)
            parts = a.get("partitions")
            if one.service == "writer" and isinstance(parts, dict):
                found.partition_count = max(found.partition_count, int(parts.get("partitions", 0)))
                for p in parts.get("held", []):
                    found.partitions.setdefault(int(p), []).append(one.instance)
        rank = {s: i for i, s in enumerate(ORDER)}
        found.instances.sort(key=lambda i: (rank.get(i.service, len(ORDER)), i.instance))
        for p in range(found.partition_count):
            found.partitions.setdefault(p, [])
        if launcher is not None:
            found.processes = [x for x in launcher.get("children", []) if isinstance(x, dict)]
        return found


async def _launcher(c: Console) -> dict[str, Any] | None:
    quill = c.access.quill
    try:
        reply = await quill.nc.request(f"{quill.subjects.root}.sys.ping.launcher", b"", WAIT_S)
        answer = json.loads(reply.data)
    except Exception:  # no launcher (compose, systemd, tests): nothing to add
        return None
    return answer if isinstance(answer, dict) else None


async def _last_seq(c: Console) -> int | None:
    try:
        info = await c.access.quill.nc.jetstream().stream_info(STREAM_EVENTS)
    except Exception:  # the stream is not there (yet), or JetStream does not answer
        return None
    return int(info.state.last_seq)


async def page(c: Console, request: Request) -> Response:
    found = await c.cluster.round(c)
    template = "cluster_body.html" if request.headers.get("hx-request") else "cluster.html"
    return c.page(request, template, {"r": found, "fresh_s": FRESH_S})
