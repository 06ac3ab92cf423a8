"""A command's output kept a while in WS_OUTPUT, for ``exec.output``.

The reply to ``exec.run`` holds at most ``max_output_bytes`` of each stream: past it, the first
half and the last half, and how many bytes were left out between them and from which offset
(``infra/exec/results.py``). The whole stream (up to
``OutputConfig.keep_bytes``) goes to the JetStream stream ``WS_OUTPUT`` as it comes, so that
any executor can answer ``exec.output`` (a page by byte offset) for ``OutputConfig.ttl_s``
(``max_age``; the stream's ``max_bytes`` drops the oldest first). Subjects
(``Subjects.cmdout``): ``ws.cmdout.<t>.<w>.<id>.stdout.<n>`` is the n-th ``CHUNK`` bytes of
stdout (so a page is a direct get of each chunk it spans, by subject), ``….end`` says what was
kept once the command has ended. Tenants cannot read the stream: a tenant's NATS user has no
``$JS.API`` (``quill_cli/tenants.py``), and ``exec.output`` reads under the tenant and workspace of
its own subject only.

Everything is counted after secrets are redacted (``StreamRedactor``): the offsets in a reply
are offsets in the kept output. Keeping is best effort: a publish JetStream refuses or does not
acknowledge stops the keeping of that command (logged; ``output_kept`` false), never the
command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, PersistMode
from nats.js.errors import NotFoundError

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import STREAM_OUTPUT, Subjects
from infra import assets, storage
from infra.exec.results import STREAMS, Output, char_start
from infra.exec.sandbox import Outcome

log = logging.getLogger("quill.executor.output")

CHUNK = 64 * 1024
"""Bytes of one kept message (the last of a stream may be shorter)."""
FLUSH_S = 0.05
"""A live command's partial chunk is kept again at most this often (``Recorder.live``)."""


@dataclass(frozen=True)
class OutputConfig:
    ttl_s: float = 3600.0
    """How long a command's output can be read after it ended (the stream's ``max_age``)."""
    keep_bytes: int = 32 * 1024**2
    """Bytes kept of each stream of one command; the rest is counted only."""
    stream_bytes: int = 1024**3
    """Bytes the whole ``WS_OUTPUT`` stream holds; past it, the oldest output goes first."""


async def ensure_stream(
    js: JetStreamContext, subjects: Subjects, config: OutputConfig, replicas: int = 1
) -> None:
    """Create ``WS_OUTPUT`` if missing, else bring its age, size and subjects to ``config``
    (a create lost to another executor is a success: ``assets``). A stream reserves its
    ``max_bytes`` from JetStream's storage limit: on a small disk (``infra/storage.py``) the
    size is halved until the server accepts it (``storage.fitted``), rather than
    the executor exiting at every start.

    Raises:
        nats.js.errors.APIError: JetStream refused the create or the update.
    """
    await storage.fitted(
        STREAM_OUTPUT,
        config.stream_bytes,
        lambda size: _ensure(js, subjects, config, replicas, size),
    )


async def _ensure(
    js: JetStreamContext, subjects: Subjects, config: OutputConfig, replicas: int, size: int
) -> None:
    wanted = assets.file_stream(
        STREAM_OUTPUT,
        "Quill: commands' output, kept a while (exec.output)",
        [subjects.all_cmdout],
        replicas,
        max_age=config.ttl_s,
        max_bytes=size,
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=1,  # a live command's last chunk is kept again as it grows
        persist_mode=PersistMode.ASYNC if replicas == 1 else None,
    )
    kept = ("subjects", "max_age", "max_bytes", "allow_direct", "max_msgs_per_subject")
    await assets.stream(js, wanted, kept)


class Recorder:
    """One command's output, as it comes: shown by the reply (``Output``: redacted, its head
    and tail kept) and kept in ``WS_OUTPUT`` (see the module docstring). ``feed`` is its
    ``on_output``."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        tenant: str,
        workspace: str,
        command_id: str,
        *,
        output: Output,
        config: OutputConfig,
        facts: dict[str, Any] | None = None,
        live: bool = False,
    ) -> None:
        """``facts``: what the command is (``CommandFacts``' fields known before it runs);
        ``live``: the command may outlive its request (``yield_ms``): its output is kept as it
        comes (the last, partial chunk again at most every ``FLUSH_S``), not only in whole
        chunks, for ``exec.poll``; a ``start`` record says it exists (``begin``)."""
        self.js = js
        self._where = (subjects, tenant, workspace, command_id)
        self.config = config
        self.output = output
        self.stored = dict.fromkeys(STREAMS, 0)
        self.ok = True
        self._buffers = {s: bytearray() for s in STREAMS}
        self.facts = facts
        self._outcome: Outcome | None = None
        self.live = live
        self._flushing: asyncio.Task[None] | None = None
        self._keeping = asyncio.Lock()
        """Held while a chunk is kept: a ``flush`` meanwhile would keep the buffer (a whole
        chunk and more) under the chunk's subject, or its rest under the chunk's number,
        overwriting the chunk (the stream keeps one message a subject)."""

    async def begin(self, extra: dict[str, Any]) -> None:
        """Keep the ``start`` record of a live command (its facts known so far and ``extra``):
        ``exec.poll`` knows it exists before it writes a byte."""
        start = {"command": msgspec.to_builtins({**(self.facts or {}), **extra})}
        try:
            await self.js.publish(self.subject("start"), json.dumps(start).encode(), timeout=5)
        except Exception as exc:
            log.warning("output of %s not kept: %r", self.subject("*"), exc)
            self.ok = False

    async def flush(self) -> None:
        """Keep the partial chunk of each stream now (``live``)."""
        async with self._keeping:
            await self._flush()

    async def _flush(self) -> None:
        for stream in STREAMS:
            buffer = self._buffers[stream]
            if buffer and self.ok:
                n = self.stored[stream] // CHUNK
                try:
                    await self.js.publish(self.subject(f"{stream}.{n}"), bytes(buffer), timeout=5)
                except Exception as exc:
                    log.warning("output of %s not kept: %r", self.subject("*"), exc)
                    self.ok = False

    def _flush_soon(self) -> None:
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(FLUSH_S)
        await self.flush()

    @property
    def where(self) -> tuple[Subjects, str, str, str]:
        """Its subjects, tenant, workspace and command id."""
        return self._where

    def subject(self, part: str) -> str:
        subjects, tenant, workspace, command_id = self._where
        return subjects.cmdout(tenant, workspace, command_id, part)

    async def feed(self, stream: rq.OutputStream, chunk: bytes) -> None:
        await self._keep(stream, self.output.feed(stream, chunk))

    async def _keep(self, stream: rq.OutputStream, data: bytes) -> None:
        room = self.config.keep_bytes - self.stored[stream] - len(self._buffers[stream])
        if not self.ok or room <= 0:
            return
        buffer = self._buffers[stream]
        buffer += data[:room]
        while len(buffer) >= CHUNK:
            async with self._keeping:  # the chunk kept and taken off the buffer: one step
                await self._store(stream, bytes(buffer[:CHUNK]))
                del buffer[:CHUNK]
        if self.live and buffer:
            self._flush_soon()

    async def _store(self, stream: rq.OutputStream, data: bytes) -> None:
        if not self.ok:
            return
        n = self.stored[stream] // CHUNK
        try:
            await self.js.publish(self.subject(f"{stream}.{n}"), data, timeout=5)
        except Exception as exc:  # keeping is best effort: never the command's failure
            log.warning("output of %s not kept: %r", self.subject("*"), exc)
            self.ok = False
            return
        self.stored[stream] += len(data)

    async def finish(self, outcome: Outcome) -> None:
        """End the streams (``Output.finish``: with the bytes the provider added that ``feed``
        never saw, e.g. the sandbox's out-of-memory note) and keep what is buffered (the
        ``end`` record follows: ``end``)."""
        self._outcome = outcome
        if self._flushing is not None:
            self._flushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flushing
        for stream, data in self.output.finish(outcome).items():
            await self._keep(stream, data)
            if self._buffers[stream]:
                await self._store(stream, bytes(self._buffers[stream]))
                self._buffers[stream].clear()

    async def end(
        self, changes: rp.CapturedChanges | None = None, error: str | None = None
    ) -> None:
        """Keep the ``end`` record, once the command's changes are committed (``changes``)
        or failed to be (``error``): what was kept of each stream, and the command's facts
        (``rp.CommandFacts``, ``exec.output`` answers them as ``command``)."""
        if self.ok and self._outcome is not None:
            end: dict[str, Any] = {
                s: {
                    "kept": self.stored[s],
                    "written": self.output.kept[s].total,
                    "total": self.output.raw[s],
                }
                for s in STREAMS
            }
            if self.facts is not None:
                end["command"] = facts(self.facts, self._outcome, changes, error)
            try:
                await self.js.publish(self.subject("end"), json.dumps(end).encode(), timeout=5)
            except Exception as exc:
                log.warning("output of %s not kept: %r", self.subject("*"), exc)
                self.ok = False


def facts(
    known: dict[str, Any],
    outcome: Outcome,
    changes: rp.CapturedChanges | None,
    error: str | None,
) -> dict[str, Any]:
    """A ``CommandFacts`` as JSON: ``known`` (its fields known before the command ran) and how
    it ended."""
    committed = changes is not None and changes.committed
    built: dict[str, Any] = msgspec.to_builtins(
        rp.CommandFacts(
            **known,
            duration_ms=outcome.duration_ms,
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            version=changes.version if committed and changes is not None else None,
            changed=changes.total if changes is not None else 0,
            error=error or (changes.error if changes is not None else None),
        )
    )
    return built


def _unavailable(exc: Exception) -> QuillError:
    return QuillError(ErrorCode.UNAVAILABLE, f"The kept output could not be read ({exc!r}); retry")


async def kept_part(
    js: JetStreamContext, subjects: Subjects, tenant: str, workspace: str, handle: str, part: str
) -> bytes | None:
    """A part of a command's kept output (``Subjects.cmdout``), None when none is kept.

    Raises:
        QuillError: ``UNAVAILABLE`` when JetStream does not answer.
    """
    subject = subjects.cmdout(tenant, workspace, handle, part)
    try:
        msg = await js.get_last_msg(STREAM_OUTPUT, subject, direct=True)
    except NotFoundError:
        return None
    except Exception as exc:
        raise _unavailable(exc) from None
    return msg.data or b""


async def first_chunk(
    js: JetStreamContext, subjects: Subjects, tenant: str, workspace: str, handle: str, stream: str
) -> int | None:
    """The number of the oldest chunk of ``stream`` still kept (the stream's limits drop the
    oldest first), None when none is.

    Raises:
        QuillError: ``UNAVAILABLE`` when JetStream does not answer.
    """
    subject = subjects.cmdout(tenant, workspace, handle, f"{stream}.*")
    try:
        msg = await js.get_msg(STREAM_OUTPUT, seq=1, subject=subject, next=True, direct=True)
    except NotFoundError:
        return None
    except Exception as exc:
        raise _unavailable(exc) from None
    last = (msg.subject or "").rsplit(".", 1)[-1]
    return int(last) if last.isdigit() else None


async def read_page(
    js: JetStreamContext,
    subjects: Subjects,
    tenant: str,
    workspace: str,
    req: rq.CommandOutputQuery,
) -> rp.CommandOutput:
    """A page of a command's kept output (of the workspace the request was sent to).

    Raises:
        QuillError: ``FILE_NOT_FOUND`` when nothing is kept under that id (never run here,
            another workspace's, or older than the stream keeps); ``UNAVAILABLE`` when
            JetStream does not answer.
    """

    async def get(part: str) -> bytes | None:
        return await kept_part(js, subjects, tenant, workspace, req.command_id, part)

    end_data = await get("end")
    ended = json.loads(end_data) if end_data is not None else None
    end = ended[req.stream] if ended is not None else None
    command = None
    if ended is not None and isinstance(ended.get("command"), dict):
        try:
            command = msgspec.convert(ended["command"], rp.CommandFacts)
        except msgspec.ValidationError:
            log.warning("command %s: its kept facts do not read", req.command_id)
    limit = end["kept"] if end is not None else None
    stop = req.offset + req.length if limit is None else min(req.offset + req.length, limit)
    data = bytearray()
    n = req.offset // CHUNK
    while req.offset + len(data) < stop:
        chunk = await get(f"{req.stream}.{n}")
        if chunk is None:
            break
        start = req.offset - n * CHUNK if n == req.offset // CHUNK else 0
        data += chunk[start:]
        if len(chunk) < CHUNK:
            break
        n += 1
    if end is None and not data and not [s for s in STREAMS if await get(f"{s}.0") is not None]:
        raise QuillError(
            ErrorCode.FILE_NOT_FOUND,
            f"No output kept for command {req.command_id}: not a command of this workspace, "
            "or one that ended too long ago (output is kept an hour by default)",
            {"command_id": req.command_id},
        )
    page = bytes(data[: max(stop - req.offset, 0)])
    if req.offset + len(page) < (limit if limit is not None else req.offset + len(data)):
        page = page[: char_start(page, len(page))] or page  # never split a character
    kept = limit if limit is not None else req.offset + len(data)
    return rp.CommandOutput(
        command_id=req.command_id,
        stream=req.stream,
        offset=req.offset,
        text=page.decode("utf-8", "replace"),
        length=len(page),
        kept_bytes=kept,
        total_bytes=end["total"] if end is not None else kept,
        more=req.offset + len(page) < kept or end is None,
        complete=end is not None,
        command=command,
    )
