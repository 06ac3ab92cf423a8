"""A command inside a workspace actor, from its arrival to its answer, and where it runs.

:class:`Pending` is one command waiting for its reply; :class:`Staged` one decided into an
event, waiting for its append; :class:`Held` an answer waiting for the changes it was decided
after; :class:`Flight` a group of them handed to the appender; ``unexpected`` the answer to a
decision that failed unexpectedly. :class:`Site` is the workspace the actor's helpers
(``results.py``, ``parking.py``, ``approvals.py``, ``context.py``, ``compaction.py``,
``lifecycle.py``) work on: they are given it, never the actor (no back-reference, as
``deps.py`` has it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import nats.errors
from nats.aio.msg import Msg

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import ChangesCommitted, WorkspaceEvent
from contracts.ops import OpSpec
from contracts.subjects import Address, Origin
from core.decision import Decision
from core.evolve import WorkspaceState
from infra import storage
from infra.blobs import WorkspaceBlobs
from services.writer.append import MAX_BATCH_BYTES, Group
from services.writer.deps import Deps

log = logging.getLogger("quill.writer")


@dataclass
class Pending:
    """A command waiting for its reply."""

    address: Address
    spec: OpSpec
    request: rq.Request
    origin: Origin
    msg: Msg
    started: float = field(default_factory=time.perf_counter)
    received: float = field(default_factory=time.monotonic)
    """When it was taken in, on ``time.monotonic`` (its client's deadline: ``Ws-Timeout``)."""
    retries: list[Msg] = field(default_factory=list)
    """Messages of the same request id that arrived while this one was pending."""
    answered: bool = False
    carrying: bool = False
    """It is an approved request being carried out: its answer is kept as the approval's
    outcome (``infra/approvals.py``)."""

    @property
    def wait_until(self) -> float:
        """``perf_counter`` time until which it may wait for a lock (or an approval)."""
        return self.started + self.origin.wait_ms / 1000


class Staged(NamedTuple):
    """A command decided into an event, waiting for its append."""

    pending: Pending
    decision: Decision
    event: WorkspaceEvent
    digest: str
    payload: bytes


class Held(NamedTuple):
    """An answer that waits for the changes it was decided after to be acknowledged (a
    refusal or a no-op that follows them): sent if they are, decided again if not."""

    pending: Pending
    reply: bytes
    error: QuillError | None
    version: int | None
    paths: list[str] | None


MAX_GROUP = 256
"""Events one group may hold (an actor decides as many queued commands at once at most)."""


@dataclass(frozen=True)
class Site:
    """One workspace as its actor's helpers see it: the writer's collaborators, its names,
    its log subject and its own contents in WS_BLOBS."""

    deps: Deps
    tenant: str
    workspace: str
    subject: str
    blobs: WorkspaceBlobs


@dataclass
class Flight:
    """A group decided and handed to the appender (``group``; None: only answers held until
    the group before it is acknowledged), with what answering it needs."""

    batch: list[Pending]
    staged: list[Staged]
    group: Group | None
    state: WorkspaceState
    """The state it was decided against (and leaves)."""
    after: Flight | None
    """The group it was decided after and is chained to, while that one was in flight."""
    held: list[Held]

    @property
    def plain(self) -> bool:
        """Changes only: nothing that must be acted on after it commits."""
        return all(isinstance(s.event, ChangesCommitted) for s in self.staged)

    @property
    def settled(self) -> bool:
        """Its append is answered (or it has none): it can be answered without waiting."""
        return self.group is None or self.group.future.done()

    def open_for(self, staged: list[Staged]) -> bool:
        """Whether ``staged`` (decided after it) may join its group: the appender has not
        taken the group yet (it waits for the one before it), and it stays within
        ``MAX_GROUP`` events and the appender's ``MAX_BATCH_BYTES``."""
        group = self.group
        if group is None or group.after is None or group.future.done():
            return False
        size = group.size + sum(len(s.payload) for s in staged)
        return len(group.payloads) + len(staged) <= MAX_GROUP and size <= MAX_BATCH_BYTES

    def merge(
        self, batch: list[Pending], staged: list[Staged], held: list[Held], msg_ids: list[str]
    ) -> None:
        """Take ``batch``'s events (``staged``) and held answers into its group (``open_for``)."""
        group = self.group
        assert group is not None
        self.batch, self.staged, self.held = (
            self.batch + batch,
            self.staged + staged,
            self.held + held,
        )
        group.payloads += [s.payload for s in staged]
        group.msg_ids += msg_ids
        group.hashes += [s.digest for s in staged]
        group.context += [(s.event, s.digest) for s in staged]

    async def acknowledged(self) -> bool:
        """Whether its group was committed (waiting for the appender to say)."""
        assert self.group is not None
        await asyncio.wait([self.group.future])
        return self.group.future.exception() is None

    async def dropped(self) -> None:
        """Wait until the appender has dropped its group unsent (the group before it
        failed)."""
        if self.group is not None:
            await asyncio.wait([self.group.future])
            self.group.future.exception()  # retrieved: it was never sent

    async def release(self, answer: Callable[..., Awaitable[None]]) -> None:
        """Send the answers held for its changes (they are acknowledged)."""
        held, self.held = self.held, []
        for h in held:
            await answer(h.pending, h.reply, error=h.error, version=h.version, paths=h.paths)


def unexpected(site: Site, p: Pending, exc: Exception) -> QuillError:
    """The answer to a command whose decision raised something unexpected (its changes
    were undone by the tree's savepoint), logged with its request id."""
    if storage.is_log_full(exc):  # a blob refused by the object store
        site.deps.log_storage.mark(str(exc))
        return storage.log_full(str(exc))
    if isinstance(exc, TimeoutError | nats.errors.Error):  # NATS failing over
        log.warning(
            "%s/%s: request %s: NATS: %r",
            site.tenant,
            site.workspace,
            p.origin.request_id,
            exc,
        )
        return QuillError(ErrorCode.UNAVAILABLE, f"NATS did not answer: {exc!r}")
    log.error(
        "%s/%s: request %s (%s): unexpected failure",
        site.tenant,
        site.workspace,
        p.origin.request_id,
        p.address.op,
        exc_info=exc,
    )
    return QuillError(
        ErrorCode.INTERNAL,
        f"Internal error: {type(exc).__name__} (request {p.origin.request_id})",
        {"request_id": p.origin.request_id},
    )


def named_paths(request: rq.Request) -> list[str]:
    return [v for k in ("path", "to") if isinstance(v := getattr(request, k, None), str)]


def traced(p: Pending) -> dict[str, str]:
    """The attributes of a command's span (``infra.tracing``)."""
    address = p.address
    return {
        "quill.tenant": address.tenant,
        "quill.workspace": address.workspace,
        "quill.request_id": p.origin.request_id,
    }
