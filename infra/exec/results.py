"""What a command's result shows of its output, and the ``CommandResult`` itself: one assembly
for the executor and the bridge, so that what one redacts the other cannot leave out.

Output is taken as it comes (``Output.feed`` is, or is called by, the sandbox's ``on_output``):
each stream is redacted first (a ``StreamRedactor``: a secret split across two chunks is
caught; ``$QUILL_SECRETS``), then its first and last bytes are kept for the reply (``Kept``).
On an executor the reply holds at most ``max_output_bytes`` of a stream: past it, the first
half and the last half, each cut at a line end when one is near, and how many bytes were left
out between them and from which offset (``exec.output`` reads them: ``services/executor/
output.py``). A bridge keeps no output to page through (``head_only``): past the cap, the
beginning only, and ``stdout_truncated`` says the rest was cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts import replies as rp
from contracts import requests as rq
from core.secrets import NO_SECRETS, Secrets, StreamRedactor
from infra.exec.sandbox import Outcome

STREAMS: tuple[rq.OutputStream, ...] = ("stdout", "stderr")
_NEAR = 4
"""A head or tail is cut at a line end found within its last (first) 1/_NEAR."""


@dataclass(frozen=True)
class Shown:
    """What a reply shows of one stream."""

    head: str
    tail: str
    omitted: int
    """Bytes left out between head and tail."""
    offset: int
    """Where they start in the kept output."""
    truncated: bool = False
    """Part of the stream is not shown."""


@dataclass
class Kept:
    """One stream's first ``head_cap`` and last ``tail_cap`` bytes (none counted twice)."""

    head_cap: int
    tail_cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    def shown(self) -> Shown:
        """Head and tail as text: all of it when nothing is left out; else each cut at a
        line end when one is near, and never inside a UTF-8 character."""
        head, tail = bytes(self.head), bytes(self.tail)
        if self.total == len(head) + len(tail):
            return Shown((head + tail).decode("utf-8", "replace"), "", 0, 0)
        end = head.rfind(b"\n")
        if end >= len(head) - len(head) // _NEAR:
            head = head[: end + 1]
        else:
            head = head[: char_start(head, len(head))]
        start = tail.find(b"\n")
        if 0 <= start < len(tail) // _NEAR:
            tail = tail[start + 1 :]
        else:
            tail = tail[char_start(tail, 0) :] if tail else tail
        omitted = self.total - len(head) - len(tail)
        return Shown(
            head.decode("utf-8", "replace"),
            tail.decode("utf-8", "replace"),
            omitted,
            len(head),
            truncated=omitted > 0,
        )

    def shown_head(self) -> Shown:
        """The head only (nothing kept to page through): ``text_of`` it."""
        truncated = self.total > len(self.head)
        return Shown(text_of(bytes(self.head), truncated), "", 0, 0, truncated=truncated)


def char_start(data: bytes, i: int) -> int:
    """``i`` moved back to the start of the UTF-8 character it is in (``i`` itself when it
    starts one, or for the end: when the last character is whole)."""
    j, back = i, 0
    if i == len(data):
        j = i - 1
        while j >= 0 and back < 3 and data[j] & 0xC0 == 0x80:
            j, back = j - 1, back + 1
        if j >= 0 and data[j] >= 0xC0:
            width = 2 if data[j] < 0xE0 else 3 if data[j] < 0xF0 else 4
            return j if len(data) - j < width else i
        return i
    while j < len(data) and back < 3 and data[j] & 0xC0 == 0x80:  # a tail: skip forward
        j, back = j + 1, back + 1
    return j


def text_of(data: bytes, truncated: bool) -> str:
    """Output as text: invalid UTF-8 replaced, and a multi-byte character cut by the output
    cap dropped rather than shown as a replacement character."""
    if truncated:
        data = data[: char_start(data, len(data))]
    return data.decode("utf-8", "replace")


class Output:
    """A command's output as it comes, per stream: redacted, then its head and tail kept (half
    of ``cap`` each; ``head_only``: its first ``cap`` bytes). ``redacted``: the ids replaced."""

    def __init__(self, cap: int, secrets: Secrets = NO_SECRETS, *, head_only: bool = False):
        self.head_only = head_only
        self.secrets = secrets
        self.kept = {
            s: Kept(cap, 0) if head_only else Kept(cap // 2, cap - cap // 2) for s in STREAMS
        }
        self.raw = dict.fromkeys(STREAMS, 0)
        """Bytes the command wrote, per stream (before redaction)."""
        self.redacted: set[str] = set()
        self._redactors = {s: StreamRedactor(secrets) for s in STREAMS} if secrets else {}

    def feed(self, stream: rq.OutputStream, chunk: bytes) -> bytes:
        """Take ``chunk``; returns what of the stream can be shown now (redacted: the last
        bytes of a chunk may wait for the next one)."""
        self.raw[stream] += len(chunk)
        redactor = self._redactors.get(stream)
        if redactor is not None:
            chunk = redactor.feed(chunk)
            self.redacted.update(redactor.redacted)
        self.kept[stream].feed(chunk)
        return chunk

    def finish(self, outcome: Outcome) -> dict[rq.OutputStream, bytes]:
        """End both streams: what their redactors held back, then the bytes the provider added
        to ``outcome`` that ``feed`` never saw (the sandbox's out-of-memory note ends stderr),
        redacted. Returns per stream what was not returned by ``feed`` yet."""
        extra = added(outcome, self.raw)
        out: dict[rq.OutputStream, bytes] = {}
        for stream in STREAMS:
            data = b""
            redactor = self._redactors.get(stream)
            if redactor is not None:
                data = redactor.flush()
                self.redacted.update(redactor.redacted)
            more = extra.get(stream, b"")
            if more:
                self.raw[stream] += len(more)
                shown, ids = self.secrets.redact_bytes(more)
                self.redacted.update(ids)
                data += shown
            self.kept[stream].feed(data)
            out[stream] = data
        return out

    def shown(self) -> dict[rq.OutputStream, Shown]:
        return {
            s: self.kept[s].shown_head() if self.head_only else self.kept[s].shown()
            for s in STREAMS
        }


def added(outcome: Outcome, seen: dict[rq.OutputStream, int]) -> dict[rq.OutputStream, bytes]:
    """Per stream, the bytes the provider added to its ``Outcome`` that the command did not
    write (never handed to ``on_output``: the out-of-memory note ends stderr)."""
    out: dict[rq.OutputStream, bytes] = {}
    streams: tuple[tuple[rq.OutputStream, bytes, int], ...] = (
        ("stdout", outcome.stdout, outcome.stdout_bytes),
        ("stderr", outcome.stderr, outcome.stderr_bytes),
    )
    for stream, data, total in streams:
        more = total - seen[stream]
        if 0 < more <= len(data):
            out[stream] = data[-more:]
    return out


def command_result(
    outcome: Outcome,
    output: Output,
    changes: rp.CapturedChanges,
    *,
    command_id: str = "",
    output_kept: bool = False,
) -> rp.CommandResult:
    """The result of a command that ran, its output as ``output`` shows it (``finish``ed)."""
    shown = output.shown()
    return rp.CommandResult(
        **_fields("stdout", shown["stdout"], outcome.stdout_bytes),
        **_fields("stderr", shown["stderr"], outcome.stderr_bytes),
        exit_code=outcome.exit_code,
        duration_ms=outcome.duration_ms,
        timed_out=outcome.timed_out,
        changes=changes,
        command_id=command_id,
        output_kept=output_kept,
        background_killed=outcome.left_running,
        stdin_read=outcome.stdin_read,
    )


def _fields(stream: str, shown: Shown, written: int) -> dict[str, Any]:
    """A ``CommandResult``'s fields of one stream."""
    return {
        stream: shown.head,
        f"{stream}_tail": shown.tail,
        f"{stream}_truncated": shown.truncated,
        f"{stream}_bytes": written,
        f"{stream}_omitted_bytes": shown.omitted,
        f"{stream}_omitted_offset": shown.offset,
    }


def audited(outcome: Outcome, details: dict[str, object], redacted: set[str]) -> None:
    """What an audit record keeps of a command that ran (``details`` updated)."""
    details.update(
        exit_code=outcome.exit_code,
        timed_out=outcome.timed_out,
        command_ms=outcome.duration_ms,
        stdout_bytes=outcome.stdout_bytes,
        stderr_bytes=outcome.stderr_bytes,
    )
    if redacted:
        details["redacted"] = sorted(redacted)
