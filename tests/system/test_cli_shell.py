"""``quill shell``: a real terminal (``pty.openpty``, the CLI its session's controlling
terminal) driving ``quill shell`` against ``quill up``: keys typed, a window resized, Ctrl-C,
the exit status, the local terminal restored; refused without a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

from tests.up import Up

SHELL = "PS1='$ ' exec bash --norc --noprofile -i"
WAIT_S = 30.0


class Terminal:
    """``quill ARGS`` in a pseudo-terminal of ``rows`` x ``cols`` (its controlling one)."""

    def __init__(self, up: Up, *args: str, rows: int = 24, cols: int = 80) -> None:
        self.master, slave = pty.openpty()
        self.resize(rows, cols)
        self.slave = slave
        self.seen = b""
        env = {**os.environ, "QUILL_NATS_URL": up.nats_url}
        self.process = subprocess.Popen(
            ["setsid", "--ctty", sys.executable, "-m", "quill", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
        )

    def resize(self, rows: int, cols: int) -> None:
        """As a window resized: the size set, SIGWINCH to the terminal's foreground group."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def expect(self, text: bytes) -> bytes:
        """Read until ``text`` has come (at most ``WAIT_S``); all read so far."""
        deadline = time.monotonic() + WAIT_S
        while text not in self.seen:
            room = deadline - time.monotonic()
            assert room > 0, f"no {text!r} in {self.seen!r}"
            if select.select([self.master], [], [], room)[0]:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the slave's last holder closed it
                    raise AssertionError(f"ended before {text!r}: {self.seen!r}") from None
        return self.seen

    def wait(self) -> int:
        code = self.process.wait(WAIT_S)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)
        os.close(self.slave)


def test_a_shell_in_a_terminal(up: Up) -> None:
    ws = "acme/terminal"
    up.cli("create", ws)
    term = Terminal(up, "shell", ws, "--", SHELL, rows=24, cols=80)
    try:
        term.expect(b"$ ")
        before = termios.tcgetattr(term.slave)
        assert not before[3] & termios.ECHO  # the local terminal is raw while it runs
        term.type(b"echo h''i > typed.txt; echo h''i\r")
        term.expect(b"\rhi\r\n")  # the remote terminal's CRLF
        term.type(b"stty size\r")
        term.expect(b"24 80\r\n")
        term.resize(30, 100)
        term.type(b"stty size\r")
        term.expect(b"30 100\r\n")
        term.type(b"sleep 100; echo slept\r")
        term.expect(b"echo slept\r\n")
        term.type(b"\x03")  # Ctrl-C: interrupts sleep there, not quill shell here
        term.type(b"echo status=$?\r")
        term.expect(b"status=130\r\n")
        assert term.process.poll() is None
        term.type(b"exit 3\r")
        assert term.wait() == 3
        restored = termios.tcgetattr(term.slave)
        assert restored[3] & termios.ECHO and restored[3] & termios.ICANON
    finally:
        term.close()
    assert up.cli("cat", ws, "typed.txt").stdout == "hi\n"


def test_refused_without_a_terminal(up: Up) -> None:
    ws = "acme/no-terminal"
    up.cli("create", ws)
    done = up.cli("shell", ws, check=False)
    assert done.returncode == 2  # INVALID_ARGUMENT
    assert "quill shell needs a terminal" in done.stderr
