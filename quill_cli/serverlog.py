"""nats-server's output as the launcher keeps it: redacted, rate-limited, rotated, size-capped,
and never a reason for the server to stop.

``quill up`` and ``quill cluster up`` read each nats-server's output from a pipe (``pump``) and
write it to its log file (``ServerLog``) rather than letting the server write its own
(``logfile``, with ``logfile_size_limit`` and ``logfile_max_num``, would rotate and cap it):
nats-server writes a line for every permission violation, with the subject a client used, and
a client chooses both how many (22 MB in 3.3 s, measured) and what (a secret used as a subject
appeared verbatim). So the launcher:

* redacts every line it keeps with the secrets registry (``core.secrets``; ``quill up
  --secrets``), the literal values and the patterns, as every service's own log lines are;
* keeps at most ``RATE`` lines a second (bursts of ``BURST``), then one line saying how many it
  dropped; fatal lines (``[FTL]``) always;
* writes ``MAX_BYTES`` to a file, then rotates it (``nats-server.log`` → ``.1`` → ``.2``), keeping
  ``KEEP`` old ones: at most ``(KEEP + 1) * MAX_BYTES`` on disk whatever the server says;
* creates every file 0600 (and makes an existing one 0600): what the server logs names users,
  subjects and addresses.

It never stops reading: a write that fails (a full disk, the directory gone) loses that line,
counted, and the file is opened again ``RETRY_S`` later; the pipe is drained all the while, so
the server never blocks on its own output (a thread that died on ENOSPC once left a restarted
server blocked for good, issue 28). The reader does little per line it drops: a flood costs a
``readline`` and a counter.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from core.secrets import NO_SECRETS, Secrets

log = logging.getLogger("quill_cli.serverlog")

RATE = 100.0
"""Lines a second kept on average."""
BURST = 1000
"""Lines kept at once before the rate applies (a server's start prints ~40)."""
MAX_BYTES = 8 * 1024 * 1024
"""A log file's size before it is rotated."""
KEEP = 2
"""Rotated files kept (``.1``, ``.2``)."""
RETRY_S = 1.0
"""After a failed write, how long before the file is opened again."""
FATAL = b"[FTL]"


class ServerLog:
    """One server's log file (see the module docstring). ``write`` never raises."""

    def __init__(
        self,
        path: Path,
        secrets: Secrets = NO_SECRETS,
        *,
        max_bytes: int = MAX_BYTES,
        keep: int = KEEP,
        rate: float = RATE,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path, self.secrets = path, secrets
        self.max_bytes, self.keep, self.rate, self.burst = max_bytes, keep, rate, burst
        self.clock = clock
        self.tokens = float(burst)
        self._filled = clock()
        self.dropped = 0
        """Lines over the rate not yet said (a note says how many when one is kept again)."""
        self.lost = 0
        """Lines a failed write lost, not yet said."""
        self.error: str | None = None
        self.written = 0
        """Lines written since this object was made (the notes included)."""
        self._fd: int | None = None
        self._size = 0
        self._retry_at = 0.0

    def write(self, line: bytes) -> None:
        """Keep ``line`` (one line of the server's output, with its newline), if the rate
        allows; redacted."""
        if not line.endswith(b"\n"):
            line += b"\n"
        if not self._allowed(FATAL in line):
            self.dropped += 1
            return
        if self.dropped:
            note = f"quill: {self.dropped} lines of nats-server's output dropped (over "
            note += f"{self.rate:g} a second)\n"
            if self._put(note.encode()):
                self.dropped = 0
        self._put(self.secrets.redact_bytes(line)[0] if self.secrets else line)

    def _allowed(self, fatal: bool) -> bool:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self._filled) * self.rate)
        self._filled = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return fatal

    def _put(self, data: bytes) -> bool:
        """Write ``data`` (rotating first if the file would grow past its size); whether it
        was written."""
        if self._fd is None and not self._open():
            self.lost += 1
            return False
        try:
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            if self.lost:
                note = f"quill: {self.lost} lines of nats-server's output lost: {self.error}\n"
                self._size += os.write(self._fd, note.encode())  # type: ignore[arg-type]
                self.lost, self.written, self.error = 0, self.written + 1, None
                log.warning("nats-server's log %s written again", self.path)
            self._size += os.write(self._fd, data)  # type: ignore[arg-type]
            self.written += 1
            return True
        except OSError as exc:
            self._failed(exc)
            self.lost += 1
            return False

    def _open(self) -> bool:
        if self.clock() < self._retry_at:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._failed(exc)
            return False
        try:
            os.fchmod(fd, 0o600)  # one an older Quill made 0644
            self._size = os.fstat(fd).st_size
        except OSError as exc:
            os.close(fd)
            self._failed(exc)
            return False
        self._fd = fd
        return True

    def _rotate(self) -> None:
        """``path`` → ``path.1`` → … → ``path.<keep>`` (the oldest dropped), a new ``path``.

        Raises:
            OSError: the new file cannot be opened.
        """
        self._close_fd()
        for n in range(self.keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            with contextlib.suppress(FileNotFoundError):
                os.replace(newer, older)
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
        if not self._open():
            raise OSError(self.error or "cannot open the log")

    def _failed(self, exc: OSError) -> None:
        if self.error is None:
            log.warning("nats-server's log %s not written: %s", self.path, exc)
        self.error = f"{exc.strerror or exc} ({self.path.name})"
        self._close_fd()
        self._retry_at = self.clock() + RETRY_S

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Say what was dropped, if anything, and close the file."""
        if self.dropped:
            self.tokens = max(self.tokens, 1.0)
            self.write(b"quill: end of output\n")
        self._close_fd()


def pump(stream: IO[bytes], out: ServerLog, watch: Callable[[str], bool] | None = None) -> None:
    """Every line of ``stream`` to ``out``, until its end; each line also to ``watch`` (as text,
    redacted) until it returns False (a server's start: its port, ready or fatal). Never raises
    for a write: only for a pipe that cannot be read, and then the pipe is closed."""
    try:
        for line in stream:
            if watch is not None:
                text = line.decode("utf-8", "replace")
                text = out.secrets.redact(text)[0] if out.secrets else text
                if not watch(text):
                    watch = None
            out.write(line)
    except (OSError, ValueError) as exc:  # the pipe closed under us (the server is stopping)
        log.debug("nats-server's output: %s", exc)
    finally:
        out.close()
