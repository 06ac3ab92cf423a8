"""Approvals: before each mutation or command on a restricted local workspace, the bridge's
user says yes or no at its terminal, unless its policy file decides (``policy``).

One question at a time, in the order the requests arrived; a question not answered within
``timeout_s`` is a no, and so is every question once the terminal's input has ended (nobody
is left to answer). A question names who asks (actor, session), the op and its paths or
command; control characters are shown escaped (``\\x1b``, ``\\n``), so that a request cannot
redraw the terminal to disguise what it asks. Lines typed before a question is shown (late
answers to a question that timed out) are dropped, never taken as its answer. A refusal is
``DENIED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from typing import TextIO

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.paths import display, normalize
from contracts.subjects import Origin
from services.bridge.policy import Policy, Request

DEFAULT_TIMEOUT_S = 30.0
"""How long a question waits for its answer (the SDK retries a command for about 40 s)."""
YES = frozenset({"y", "yes"})


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``, ``\\u202e``)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _shown(path: str) -> str:
    try:
        return display(normalize(path))
    except QuillError:
        return path


def describe(req: rq.Request) -> str:
    """What ``req`` would do, in words (for a question and a refusal)."""
    if isinstance(req, rq.WriteFile):
        size = len(req.content.encode()) if req.content is not None else len(req.data or b"")
        verb = "append to" if req.mode == "append" else "write"
        return f"{verb} {_shown(req.path)} ({size} bytes)"
    if isinstance(req, rq.EditFile):
        return f"edit {_shown(req.path)}"
    if isinstance(req, rq.ModifyFile):
        return f"modify {_shown(req.path)} ({len(req.operations)} operations)"
    if isinstance(req, rq.MakeDirectory):
        return f"create the directory {_shown(req.path)}"
    if isinstance(req, rq.MovePath):
        return f"move {_shown(req.path)} to {_shown(req.to)}"
    if isinstance(req, rq.DeletePath):
        return f"delete {_shown(req.path)}" + (" with everything in it" if req.recursive else "")
    if isinstance(req, rq.ApplyChanges):
        named = ", ".join(_shown(c.path) for c in req.changes[:5])
        more = f" and {len(req.changes) - 5} more" if len(req.changes) > 5 else ""
        return f"apply {len(req.changes)} changes ({named}{more})"
    if isinstance(req, rq.RunCommand):
        fed = f" < stdin ({len(req.stdin)} bytes)" if req.stdin is not None else ""
        return f"run in {_shown(req.workdir)}: $ {req.command}{fed}"
    if isinstance(req, rq.GitCommand):
        return f"git {req.action} in {_shown(req.workdir)}"
    return type(req).__name__


def asking(op: str, req: rq.Request) -> Request:
    """``req`` as a policy sees it."""
    if isinstance(req, rq.RunCommand):
        return Request("run", [], req.command)
    if isinstance(req, rq.GitCommand):
        return Request("git", [])
    named = [c.path for c in req.changes] if isinstance(req, rq.ApplyChanges) else []
    if isinstance(req, rq.MovePath):
        named = [req.path, req.to]
    elif hasattr(req, "path"):
        named = [req.path]
    paths = []
    for path in named:
        with contextlib.suppress(QuillError):
            paths.append(normalize(path))
    return Request(op, paths)


def who(origin: Origin | None) -> str:
    actor = origin.actor if origin is not None and origin.actor else "an unnamed client"
    if origin is not None and origin.session:
        return f"{printable(actor)} (session {printable(origin.session)})"
    return printable(actor)


class Terminal:
    """The bridge's terminal: lines typed on its standard input (file descriptor ``stdin``),
    lines printed on its output."""

    def __init__(self, stdin: int | None = None, stdout: TextIO | None = None) -> None:
        self._stdin = stdin if stdin is not None else sys.stdin.fileno()
        self._stdout = stdout if stdout is not None else sys.stdout
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self.closed = False
        """True once the input has ended: no answer will ever come."""
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start reading the input (in a thread: a terminal cannot be read without blocking)."""
        loop = asyncio.get_running_loop()

        def pump() -> None:
            # os.read, not sys.stdin: a thread blocked in a buffered read holds its lock, and
            # the interpreter aborts when it finds that lock held at exit.
            pending = b""
            try:
                while chunk := os.read(self._stdin, 4096):
                    *lines, pending = (pending + chunk).split(b"\n")
                    for raw in lines:
                        line = raw.decode("utf-8", "replace")
                        loop.call_soon_threadsafe(self._lines.put_nowait, line)
            except OSError:
                pass
            finally:
                try:
                    loop.call_soon_threadsafe(self._lines.put_nowait, None)
                except RuntimeError:
                    pass  # the loop is closed: nobody is waiting

        self._thread = threading.Thread(target=pump, name="quill-terminal", daemon=True)
        self._thread.start()

    def say(self, line: str) -> None:
        self._stdout.write(line + "\n")
        self._stdout.flush()

    def discard_typed(self) -> None:
        """Drop what was typed before now (answers to questions no longer asked)."""
        while not self._lines.empty():
            if self._lines.get_nowait() is None:
                self.closed = True

    async def answer(self, timeout_s: float) -> str | None:
        """The next line typed within ``timeout_s``; None when none was, or input ended."""
        if self.closed:
            return None
        try:
            line = await asyncio.wait_for(self._lines.get(), timeout_s)
        except TimeoutError:
            return None
        if line is None:
            self.closed = True
        return line


class Approver:
    """Decides whether a mutation or a command may go ahead."""

    def __init__(
        self,
        trust: str,
        policy: Policy,
        terminal: Terminal,
        uri: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.trust, self.policy, self.terminal = trust, policy, terminal
        self.uri, self.timeout_s = uri, timeout_s
        self._turn = asyncio.Lock()  # waiters are served in arrival order
        self.asked = 0

    async def approve(self, request: Request, summary: str, origin: Origin | None) -> str:
        """How ``request`` (described by ``summary``) was approved: ``trust``, ``policy`` or
        ``user``.

        Raises:
            QuillError: ``DENIED`` by the policy, the user, or for want of an answer.
        """
        if self.trust == "full":
            return "trust"
        verdict = self.policy.decide(request)
        shown = printable(summary)
        if verdict == "allow":
            self.terminal.say(f"[quill] allowed by policy: {who(origin)}: {shown}")
            return "policy"
        if verdict == "deny":
            self.terminal.say(f"[quill] denied by policy: {who(origin)}: {shown}")
            raise self._denied(f"The policy of {self.uri} denies this: {summary}", "policy")
        async with self._turn:
            self.asked += 1
            number = self.asked
            self.terminal.discard_typed()
            if self.terminal.closed:
                raise self._denied(
                    f"Nobody can approve at {self.uri} (its terminal input has ended): {summary}",
                    "no_terminal",
                )
            self.terminal.say(f"[quill] #{number} {who(origin)} wants to {shown} - allow? [y/N]")
            line = await self.terminal.answer(self.timeout_s)
            if line is not None and line.strip().lower() in YES:
                self.terminal.say(f"[quill] #{number} allowed")
                return "user"
            if line is None:
                self.terminal.say(f"[quill] #{number} denied (no answer)")
                raise self._denied(
                    f"No answer from the user of {self.uri} within {self.timeout_s:g} s: {summary}",
                    "no_answer",
                )
            self.terminal.say(f"[quill] #{number} denied")
            raise self._denied(f"The user of {self.uri} denied this: {summary}", "user")

    def _denied(self, message: str, by: str) -> QuillError:
        return QuillError(ErrorCode.DENIED, message, {"uri": self.uri, "denied_by": by})
