"""An exec request in hand, on an executor or a bridge: its timeout, its live output and
heartbeats on ``ws.execout.<t>.<w>.<request id>`` (ending with ``eof`` just before the reply),
its answer and its audit record.

Live output is redacted as it comes (``$QUILL_SECRETS``: a ``StreamRedactor`` per stream, so a
secret split across two chunks is caught); the reply and the audit record are redacted again
on their way out (``infra.bus.respond``, ``infra.runtime.Auditor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS

from contracts import codec
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import HEADER_SEQ, HEADER_STREAM, Address, Origin, Subjects, new_request_id
from core.secrets import NO_SECRETS, Secrets, StreamRedactor
from infra import storage
from infra.bus import respond
from infra.entry import Incoming, parse, reject, reply_headers
from infra.exec.sandbox import StreamName, common
from infra.runtime import Auditor

log = logging.getLogger("quill.executor")

HEARTBEAT_S = 2.0
"""How often a request in hand is announced alive on its output subject."""
DEFAULT_TIMEOUT_MS = 30_000
LIVE_MAX_BYTES = 8 * 1024 * 1024
"""Live output published per stream; past it, output is still counted (and the first
``max_output_bytes`` returned) but no longer streamed."""
LIVE_CHUNK_BYTES = 256 * 1024


def timeout_ms(req: rq.Execution, max_exec_ms: int) -> int:
    """The request's timeout: its own (default ``DEFAULT_TIMEOUT_MS``), at most the limit's."""
    return min(req.timeout_ms or DEFAULT_TIMEOUT_MS, max_exec_ms)


@dataclass
class Job:
    """One request in hand: where its live output goes. Each stream is redacted as it comes
    (a ``StreamRedactor``: the last bytes wait for the next chunk, so a secret split across
    two chunks is caught); what is held is published just before ``eof``."""

    nc: NATS
    subject: str
    secrets: Secrets = NO_SECRETS
    seq: int = 0
    live: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    redacted: set[str] = field(default_factory=set)
    redactors: dict[str, StreamRedactor] = field(default_factory=dict)
    early: Callable[[int, rp.CommandResult], Awaitable[None]] | None = None
    """Answers the request before its work ends (``answer_exec`` sets it)."""
    answered: bool = False
    """Answered early (``answer_early``): the work's own end is audited, not answered."""

    async def answer_early(self, version: int, result: rp.CommandResult) -> None:
        """Answer now (a command that runs on: ``yield_ms``): its live output ends here (``eof``;
        ``exec.poll`` reads the rest), and the work's end is no longer answered."""
        if self.answered or self.early is None:
            return
        await self.publish("eof")
        self.answered = True
        await self.early(version, result)

    async def publish(self, stream: str, data: bytes = b"") -> None:
        if self.answered:
            return
        if stream == "eof":
            for name, redactor in list(self.redactors.items()):
                del self.redactors[name]
                await self._send(name, redactor.flush())
                self.redacted.update(redactor.redacted)
        self.seq += 1
        headers = {HEADER_STREAM: stream, HEADER_SEQ: str(self.seq)}
        try:
            await self.nc.publish(self.subject, data, headers=headers)
        except Exception as exc:  # live output is best effort; the reply has what counts
            log.debug("live output on %s dropped: %s", self.subject, exc)

    async def output(self, stream: StreamName, chunk: bytes) -> None:
        room = LIVE_MAX_BYTES - self.live[stream]
        if room <= 0:
            return
        chunk = chunk[:room]
        self.live[stream] += len(chunk)
        if self.secrets:
            redactor = self.redactors.get(stream)
            if redactor is None:
                redactor = self.redactors[stream] = StreamRedactor(self.secrets)
            chunk = redactor.feed(chunk)
            self.redacted.update(redactor.redacted)
        await self._send(stream, chunk)

    async def _send(self, stream: str, chunk: bytes) -> None:
        for i in range(0, len(chunk), LIVE_CHUNK_BYTES):
            await self.publish(stream, chunk[i : i + LIVE_CHUNK_BYTES])


async def received(
    incoming: Incoming,
    nc: NATS,
    subjects: Subjects,
    auditor: Auditor,
    secrets: Secrets,
    address: Address | None = None,
) -> tuple[Address, Origin, rq.Request, Job] | None:
    """An exec request parsed (given a request id when it has none) and the ``Job`` of its live
    output; a request that does not parse is refused here (None). ``address``: its subject,
    when the caller parsed it already."""
    try:
        address, _, origin, request = parse(
            incoming, subjects, "exec", new_id=new_request_id, address=address
        )
    except QuillError as exc:
        await reject(incoming, exc, auditor)
        return None
    out = subjects.execout(address.tenant, address.workspace, origin.request_id)
    return address, origin, request, Job(nc, out, secrets=secrets)


@contextlib.asynccontextmanager
async def heartbeat(job: Job) -> AsyncIterator[None]:
    """Announce the request alive every ``HEARTBEAT_S`` while it waits and runs (the SDK gives
    up on a silent one)."""

    async def beat() -> None:
        while True:
            await job.publish("heartbeat")
            await asyncio.sleep(HEARTBEAT_S)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()


@contextlib.contextmanager
def _tidied_in_background() -> Iterator[None]:
    """What the sandbox leaves to tidy (``common.after_reply``) is done once the block has
    answered, in the background: the request's slot is free once it is answered."""
    later: common.Later = []
    try:
        with common.after_reply(later):
            yield
    finally:
        if later:
            tidying = asyncio.ensure_future(_tidy(later))
            _TIDYING.add(tidying)
            tidying.add_done_callback(_TIDYING.discard)


_TIDYING: set[asyncio.Future[None]] = set()


async def _tidy(later: common.Later) -> None:
    for tidy in later:
        try:
            await tidy()
        except Exception:  # a cgroup or directory left for the next sweep
            log.exception("tidying after a command failed")


async def answer_exec(
    incoming: Incoming,
    job: Job,
    auditor: Auditor,
    address: Address,
    origin: Origin,
    work: Callable[[], Awaitable[tuple[int, rp.CommandResult | rp.GitResult]]],
    details: dict[str, Any],
    *,
    stopping: str,
) -> None:
    """Run an exec request's ``work`` with heartbeats, end its live output, answer it and
    audit it (``details``: what the audit record keeps; its ``summary`` goes on the record).
    Failures are answered as errors; an unexpected one is logged and is ``INTERNAL``, but a
    full disk (``ENOSPC`` writing the checkout) is ``STORAGE_FULL`` naming the service, which
    is marked full until a command succeeds again (``infra/storage.py``). What the
    sandbox left to tidy (``common.after_reply``) is done once it is answered."""

    async def early(version: int, result: rp.CommandResult) -> None:
        await respond(incoming.msg, codec.ok_reply(version, result), reply_headers(origin))

    job.early = early
    with _tidied_in_background():
        try:
            async with heartbeat(job):
                version, result = await work()
                await job.publish("eof")
        except QuillError as exc:
            await job.publish("eof")
            if job.answered:  # it ran on after its answer: its failure is audited only
                await auditor.record(address, origin, incoming.started, error=exc)
                return
            await reject(incoming, exc, auditor)
            return
        except asyncio.CancelledError:
            if not job.answered:
                await reject(incoming, QuillError(ErrorCode.UNAVAILABLE, stopping), auditor)
            raise
        except (TimeoutError, nats.errors.Error) as exc:  # NATS failing over: retriable
            log.warning("exec %s: NATS did not answer: %r", incoming.msg.subject, exc)
            error = QuillError(
                ErrorCode.UNAVAILABLE, f"NATS did not answer in time ({exc!r}); retry"
            )
            await reject(incoming, error, auditor)
            return
        except Exception as exc:
            if storage.is_disk_full(exc):  # its checkout could not be written
                log.error("exec %s: disk full: %s", incoming.msg.subject, exc)
                storage.state(auditor.service).mark(str(exc))
                await reject(incoming, storage.disk_full(auditor.service, str(exc)), auditor)
                return
            log.exception("exec %s failed", incoming.msg.subject)
            error = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
            await reject(incoming, error, auditor)
            return
        storage.state(auditor.service).clear()
        if not job.answered:
            await respond(incoming.msg, codec.ok_reply(version, result), reply_headers(origin))
        changes = getattr(result, "changes", None) or getattr(result, "background", None)
        await auditor.record(
            address,
            origin,
            incoming.started,
            version=version,
            paths=[p.path for p in changes.paths] if changes else [],
            summary=details.pop("summary", None),
            details=details,
        )
