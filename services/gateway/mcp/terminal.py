"""Each MCP session's own shell for ``execute_command`` (and its alias ``bash``): a model's
``cd``, ``export``, functions and ``/tmp`` carry over from call to call, as in Claude Code's or
OpenHands' terminal (issue 32, item 2).

A session is what ``clients`` reads from the ``Mcp-Session-Id`` a handshake-era client sends
back (``Principal.session``). Its shell on a workspace is opened at its first command there
(``exec.shell_open``), used for every command after (``exec.run`` with ``shell``), and closed
when the session ends (the client's ``DELETE``: ``Exchange``'s ``ended``), when it is forgotten
(at most ``MOST`` shells held: the least recently used is closed first), when the gateway
stops, and by the executor after its idle timeout (30 minutes). A shell lost meanwhile (its
executor restarted, its idle timeout, a command that ran ``exit`` or timed out:
``SHELL_LOST``/``SHELL_NOT_FOUND``, answered before the command runs) is replaced by a new one,
and the answer says so once (``NEW_SHELL``).

Not in a shell, as before (a fresh sandbox per call): a call without a session (a 2026-07-28
client has none), one that gives ``workdir`` or ``env`` (a shell takes neither: the call asks
for a command of its own), a restricted workspace (shells are refused: each command needs an
approval), and a workspace whose executor has no room for another shell (said in the answer).

``yield_ms``: a shell that refuses it (``INVALID_ARGUMENT`` naming ``yield_ms``: executors
before shells could yield) is sent the command without it, and for ``NO_YIELD_S`` after no
command is sent with it: the command then answers when it ends (or at its timeout).

The map lives in the gateway process: with several workers (``--workers``), a session whose
requests reach another worker gets another shell there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.limits import GATEWAY_SESSIONS
from quill.client import Workspace
from services.gateway.access import Principal
from services.gateway.mcp.table import Args

log = logging.getLogger("quill.gateway")

NEW_SHELL = "A new shell was started: the previous one was lost; cwd and variables were reset."
NO_SHELL = "No shell could be opened for this session ({why}): this command ran on its own."
MOST = GATEWAY_SESSIONS
"""Session shells one gateway process holds at most."""
NO_YIELD_S = 300.0
"""How long after a shell refused ``yield_ms`` commands are sent to shells without it."""
CLOSE_S = 10.0
"""How long closing a shell may take when a session ends (past it: the idle timeout will)."""

Key = tuple[str, str, str, str]
"""(the caller's tenant, its session, the workspace's tenant, its name)."""


@dataclass(frozen=True)
class Ran:
    """A command's result and what the model should be told first (None: nothing)."""

    result: rp.CommandResult
    note: str | None = None


class SessionShells:
    """The shells of this gateway's MCP sessions (see the module docstring)."""

    def __init__(self, most: int = MOST) -> None:
        self.most = most
        self._open: OrderedDict[Key, tuple[str, Workspace]] = OrderedDict()
        self._refused: OrderedDict[Key, None] = OrderedDict()
        """Workspaces that refused a session a shell (restricted): one-shot from then on."""
        self._opening: dict[Key, asyncio.Lock] = {}
        self._no_yield_until = 0.0
        self._closing: set[asyncio.Future[None]] = set()

    def held(self, tenant: str, session: str) -> list[str]:
        """The shells a session holds (tests, the console)."""
        return [s for k, (s, _) in self._open.items() if k[:2] == (tenant, session)]

    async def execute(self, principal: Principal, ws: Workspace, a: Args) -> Ran:
        """``execute_command``'s call: in the session's shell on ``ws`` where it has one (or
        one can be opened), else on its own."""
        if principal.session is None or a.workdir or a.env:
            return Ran(await one_shot(ws, a))
        key = (principal.tenant, principal.session, ws.tenant, ws.name)
        if key in self._refused:
            return Ran(await one_shot(ws, a))
        note: str | None = None
        for attempt in range(2):
            try:
                shell = await self._shell(key, ws)
            except QuillError as exc:
                if exc.code == ErrorCode.DENIED:  # restricted: each command is approved
                    self._remember_refused(key)
                    return Ran(await one_shot(ws, a))
                if exc.code in (ErrorCode.SIZE_LIMIT_EXCEEDED, ErrorCode.BUSY):
                    return Ran(await one_shot(ws, a), NO_SHELL.format(why=exc.message))
                raise
            try:
                return Ran(await self._run(ws, shell, a), note)
            except QuillError as exc:
                lost = exc.code in (ErrorCode.SHELL_LOST, ErrorCode.SHELL_NOT_FOUND)
                if not lost or attempt:
                    raise
                if self._open.get(key, ("",))[0] == shell:
                    del self._open[key]
                note = NEW_SHELL
        raise AssertionError("unreachable")

    async def _shell(self, key: Key, ws: Workspace) -> str:
        """The session's shell on ``ws``, opened if it has none."""
        lock = self._opening.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                held = self._open.get(key)
                if held is not None:
                    self._open.move_to_end(key)
                    return held[0]
                opened = await ws.shell()
                self._open[key] = (opened.id, ws)
                while len(self._open) > self.most:
                    _, (old, old_ws) = self._open.popitem(last=False)
                    self._close_soon(old_ws, old)
                return opened.id
        finally:
            if not lock.locked() and self._opening.get(key) is lock:
                del self._opening[key]

    async def _run(self, ws: Workspace, shell: str, a: Args) -> rp.CommandResult:
        if a.yield_ms is not None and time.monotonic() >= self._no_yield_until:
            try:
                return await ws.exec(
                    a.command, timeout_ms=a.timeout_ms, shell=shell, yield_ms=a.yield_ms
                )
            except QuillError as exc:
                refused = (exc.details or {}).get("field") == "yield_ms"
                if exc.code != ErrorCode.INVALID_ARGUMENT or not refused:
                    raise
                self._no_yield_until = time.monotonic() + NO_YIELD_S
        return await ws.exec(a.command, timeout_ms=a.timeout_ms, shell=shell)

    def _remember_refused(self, key: Key) -> None:
        self._refused[key] = None
        while len(self._refused) > self.most:
            self._refused.popitem(last=False)

    def _close_soon(self, ws: Workspace, shell: str) -> None:
        task = asyncio.ensure_future(close(ws, shell))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def end(self, principal: Principal, session: str) -> int:
        """The session has ended: close its shells (those of the caller's tenant only). The
        number closed."""
        keys = [k for k in self._open if k[:2] == (principal.tenant, session)]
        gone = [self._open.pop(k) for k in keys]
        for k in keys:
            self._refused.pop(k, None)
        await asyncio.gather(*(close(ws, shell) for shell, ws in gone))
        return len(gone)

    async def close_all(self) -> None:
        """The gateway stops: close every shell it holds."""
        gone = list(self._open.values())
        self._open.clear()
        await asyncio.gather(*(close(ws, shell) for shell, ws in gone), *self._closing)


async def close(ws: Workspace, shell: str) -> None:
    """Close ``shell`` (best effort: one already gone, or an executor that does not answer in
    ``CLOSE_S``, is left to the executor's idle timeout)."""
    try:
        async with asyncio.timeout(CLOSE_S):
            await ws.shell_of(shell).close()
    except (QuillError, TimeoutError) as exc:
        log.debug("session shell %s not closed: %r", shell, exc)
    except Exception:
        log.exception("session shell %s not closed", shell)


async def one_shot(ws: Workspace, a: Args) -> rp.CommandResult:
    """The command in a fresh sandbox of its own (as without a session)."""
    return await ws.exec(
        a.command, workdir=a.workdir, timeout_ms=a.timeout_ms, env=a.env, yield_ms=a.yield_ms
    )
