"""quill_cli/serverlog.py: nats-server's output kept redacted, at a rate, rotated and capped, in
0600 files, and a reader that survives any write error (a full disk) and keeps draining."""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

import pytest

from core.secrets import Secrets
from quill_cli import serverlog
from quill_cli.serverlog import ServerLog, pump


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def line(n: int) -> bytes:
    return f'[1] 2026/01/01 [ERR] 127.0.0.1 - Publish Violation - Subject "s{n}"\n'.encode()


def test_lines_past_the_rate_are_dropped_and_counted_fatal_ones_kept(tmp_path: Path) -> None:
    clock = Clock()
    out = ServerLog(tmp_path / "n.log", rate=10, burst=5, clock=clock)
    for n in range(100):
        out.write(line(n))
    out.write(b"[1] [FTL] cannot start\n")  # always kept
    clock.now = 1.0  # ten more lines' worth
    out.write(line(100))
    out.close()
    text = (tmp_path / "n.log").read_text()
    assert text.count("Publish Violation") == 6 and "[FTL] cannot start" in text
    assert "quill: 95 lines of nats-server's output dropped (over 10 a second)" in text


def test_files_rotate_at_their_size_and_only_keep_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "n.log"
    out = ServerLog(path, max_bytes=1000, keep=2, rate=1e9, burst=10**9)
    for n in range(500):
        out.write(line(n))
    out.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["n.log", "n.log.1", "n.log.2"]
    assert all(f.stat().st_size <= 1000 for f in files)
    assert line(499).decode() in path.read_text()  # the newest in the current file


def test_what_is_kept_is_redacted_and_0600_even_for_an_older_file(tmp_path: Path) -> None:
    path = tmp_path / "n.log"
    path.write_text("from an older quill\n")
    path.chmod(0o644)
    secrets = Secrets({"openai": "sk-live-0123456789abcdef"}, {"aws": "AKIA[0-9A-Z]{16}"})
    out = ServerLog(path, secrets)
    out.write(b'Subject "ws.cmd.sk-live-0123456789abcdef.x" and AKIAABCDEFGHIJKLMNOP\n')
    out.close()
    text = path.read_text()
    assert "sk-live" not in text and "AKIAABCD" not in text
    assert "[REDACTED:openai]" in text and "[REDACTED:aws]" in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_full_disk_loses_lines_never_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    real_write = os.write
    full = True

    def write(fd: int, data: bytes) -> int:
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(serverlog.os, "write", write)
    lines = [line(n) for n in range(50)] + [b"[1] [INF] Server is ready\n"]
    seen: list[str] = []
    out = ServerLog(tmp_path / "n.log", clock=clock)

    def watch(text: str) -> bool:
        seen.append(text)
        if "Server is ready" in text:
            nonlocal full
            full = False  # space freed: the file is opened again after RETRY_S
            clock.now += serverlog.RETRY_S
            return False
        return True

    pump(io.BytesIO(b"".join(lines) + line(50)), out, watch)  # drained to its end
    assert len(seen) == 51 and "Server is ready" in seen[-1]
    text = (tmp_path / "n.log").read_text()
    assert text.startswith("quill: 50 lines of nats-server's output lost: No space left")
    assert text.endswith("Server is ready\n" + line(50).decode())


def test_the_pump_ends_quietly_when_its_pipe_breaks(tmp_path: Path) -> None:
    class Broken(io.BytesIO):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield line(1)
            raise OSError(errno.EIO, "Input/output error")

    out = ServerLog(tmp_path / "n.log")
    pump(Broken(), out)
    assert (tmp_path / "n.log").read_text() == line(1).decode()
