"""Commands that outlive their request (``exec.run`` with ``yield_ms``), and the ops on them.

A yielded command is an ordinary ``exec.run`` (``commands``) that answers early: past
``yield_ms`` it replies ``running`` with the command's id, its output so far and a cursor, and
runs on in the same task, holding its slot and its checkout as any command does, until it
ends; then its changes are captured and committed, attributed to it, exactly as a one-shot
command's. Its output goes to ``WS_OUTPUT`` as it comes (``output.Recorder`` with ``live``),
with a ``start`` record when it starts and the ``end`` record (exit status, timed out, the
version committed) when it ended, so that any executor answers ``exec.poll``, the holder's
restart included.

The command's id (``new_handle``) is ``c`` + the holder's route (12 random hex digits, new at
each start of the executor) + a random part: opaque to clients, it names the executor that holds
the process. ``exec.poll`` is answered by whichever executor takes it, from ``WS_OUTPUT``
(waiting for more by subscribing to the command's ``cmdout`` subjects: an idle wait costs no
CPU). ``exec.input`` and ``exec.signal`` must reach the holder: the queue member that takes
one forwards it on ``<root>.exechold.<route>.<t>.<w>.<op>``, which only services may publish
(a tenant's NATS user publishes its own ``cmd``/``qry``/``exec`` subjects only:
``quill_cli/tenants.py``); no holder there means it is gone (``COMMAND_LOST``). Every lookup
is under the tenant and workspace of the request's own subject, so another tenant's id is
answered as a made-up one (``COMMAND_NOT_FOUND``): no oracle.

``exec.list`` asks every executor (``<root>.execlist.<t>.<w>``, services only) and gathers
their answers for as many executors as answer a ping (``bus.ping_all``), at most
``LIST_WAIT_S``: the live commands are the processes themselves, on the executors that hold
them, so asking them is never stale (a KV of them would list a dead executor's commands until
some sweep noticed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.nuid import NUID

from contracts import codec
from contracts import ops as registry
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Address, Subjects
from infra import bus
from infra.bus import respond
from infra.exec.sandbox import GRACE_S, Live, terminal
from services.executor.output import CHUNK, first_chunk, kept_part, read_page

log = logging.getLogger("quill.executor.live")

INPUT_WAIT_S = 5.0
"""How long ``exec.input`` waits for the command to read what does not fit in its pipe."""
FORWARD_S = 10.0
"""How long a forwarded op waits for the holder's answer."""
LIST_WAIT_S = 1.0
"""The longest ``exec.list`` waits for the executors' answers."""
LIVE_OPS = ("poll", "input", "signal", "resize", "list")
"""The exec ops on live commands (no slot, no checkout)."""
SIGNALS = {
    "INT": signal.SIGINT,
    "TERM": signal.SIGTERM,
    "KILL": signal.SIGKILL,
    "HUP": signal.SIGHUP,
}

_nuid = NUID()


def new_route() -> str:
    """An executor's route: 12 random hex digits (a subject token), new at each start, so a
    restarted executor (or two in one process) never answers for another's commands."""
    return secrets.token_hex(6)


def new_handle(route: str) -> str:
    """A new command id held by the executor of ``route``."""
    return f"c{route}{_nuid.next().decode()}"


def route_of(handle: str) -> str:
    return handle[1:13]


@runtime_checkable
class Relayed(Protocol):
    """A live command whose signals go through a program in its sandbox, which answers how
    many processes got one (a shell's server: ``shell_runs.InShell``)."""

    async def relay_signal(self, signum: int) -> int: ...


@dataclass
class LiveCommand:
    """A yielded command while it runs, on the executor holding it."""

    handle: str
    tenant: str
    workspace: str
    command: str
    workdir: str
    actor: str | None
    started: datetime
    process: Live | None = None
    stdin_open: bool = False
    pty: bool = False
    """Run in a terminal (``exec.run``'s ``pty``): its stdin carries ``terminal`` frames."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    _killing: asyncio.Task[None] | None = None

    def listed(self) -> rp.LiveCommand:
        return rp.LiveCommand(
            command_id=self.handle,
            command=self.command,
            workdir=self.workdir,
            actor=self.actor,
            started=self.started,
            stdin_open=self.stdin_open,
        )


def check_pty(req: rq.RunCommand) -> None:
    """A terminal goes with a live command only: ``yield_ms``, no ``stdin``, no ``shell``.

    Raises:
        QuillError: ``INVALID_ARGUMENT``.
    """
    if req.pty is None:
        return
    if req.yield_ms is None or req.stdin is not None or req.shell is not None:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            "pty goes with yield_ms (a live command, typed into with exec.input), without "
            "stdin or shell",
            {"field": "pty"},
        )


def not_found(handle: str) -> QuillError:
    return QuillError(
        ErrorCode.COMMAND_NOT_FOUND,
        f"No live command {handle} in this workspace (its output is kept an hour after it ended)",
        {"command_id": handle},
    )


class LiveCommands:
    """The live commands this executor holds, and the ops on any executor's (see the module
    docstring)."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        subjects: Subjects,
        instance: str,
        *,
        per_tenant: int,
    ) -> None:
        self.nc, self.js, self.subjects = nc, js, subjects
        self.route = new_route()
        self.instance = instance
        self.per_tenant = per_tenant
        self.held: dict[str, LiveCommand] = {}
        self.shells: Callable[[str, str], tuple[list[rp.LiveCommand], list[rp.LiveShell]]] = (
            lambda tenant, workspace: ([], [])
        )
        """The shells held here and the commands running in them (``shells.Shells.listed``)."""

    # ------------------------------------------------------------------ the holder's side
    def check(self, tenant: str) -> None:
        """Refuse another live command of ``tenant`` past ``per_tenant`` held here.

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED``.
        """
        count = sum(1 for c in self.held.values() if c.tenant == tenant and c.process)
        if count >= self.per_tenant:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"Tenant {tenant!r} has {count} commands running on in the background on this "
                "executor, the most it may: wait for one to end, or end one (exec.signal)",
                {"live_commands": count, "max_live_commands": self.per_tenant},
            )

    def add(self, command: LiveCommand) -> None:
        """Hold ``command`` (it started).

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED`` when its tenant holds ``per_tenant`` here.
        """
        self.check(command.tenant)
        self.held[command.handle] = command

    def remove(self, command: LiveCommand) -> None:
        """``command`` ended (its ``end`` record is kept)."""
        command.ended.set()
        command.process = None
        if command._killing is not None:
            command._killing.cancel()
        self.held.pop(command.handle, None)

    def find(self, tenant: str, workspace: str, handle: str) -> LiveCommand | None:
        command = self.held.get(handle)
        if command is None or (command.tenant, command.workspace) != (tenant, workspace):
            return None
        return command

    def listed(self, tenant: str, workspace: str) -> list[rp.LiveCommand]:
        return [
            c.listed() for c in self.held.values() if (c.tenant, c.workspace) == (tenant, workspace)
        ]

    async def act(self, address: Address, request: rq.Request) -> Any:
        """``exec.input``, ``exec.signal`` or ``exec.resize`` on a command held here.

        Raises:
            QuillError: ``COMMAND_NOT_FOUND``, ``COMMAND_ENDED``; ``INVALID_ARGUMENT`` to
                resize a command without a terminal.
        """
        assert isinstance(request, rq.CommandInput | rq.CommandSignal | rq.CommandResize)
        handle = request.command_id
        command = self.find(address.tenant, address.workspace, handle)
        if command is None:
            raise await self._why_not_held(address, handle)
        if command.process is None:  # ended; its changes are being committed
            raise QuillError(
                ErrorCode.COMMAND_ENDED,
                f"Command {handle} has ended (exec.poll says how)",
                {"command_id": handle},
            )
        process = command.process
        if isinstance(request, rq.CommandSignal):
            signum = SIGNALS[request.signal]
            if isinstance(process, Relayed):
                sent = await process.relay_signal(signum)
            else:
                sent = process.signal(signum)
            if request.signal == "TERM" and command._killing is None:
                command._killing = asyncio.ensure_future(self._kill_after_grace(command))
            return rp.SignalSent(command_id=handle, signal=request.signal, processes=sent)
        if isinstance(request, rq.CommandResize):
            return await self._resize(command, process, request)
        if not command.stdin_open:
            if request.data:
                raise QuillError(
                    ErrorCode.COMMAND_ENDED,
                    f"The standard input of command {handle} is closed",
                    {"command_id": handle, "stdin_open": False},
                )
            return rp.InputWritten(command_id=handle, written=0, closed=True)
        if command.pty:  # typed: framed, so that no input is read as a resize
            chunks = terminal.frames(request.data)
            written = await terminal.write_frames(process.write, chunks, INPUT_WAIT_S)
        else:
            written = await process.write(request.data, INPUT_WAIT_S) if request.data else 0
        if request.eof:
            process.close_stdin()
            command.stdin_open = False
        return rp.InputWritten(command_id=handle, written=written, closed=request.eof)

    async def _resize(
        self, command: LiveCommand, process: Live, request: rq.CommandResize
    ) -> rp.TerminalResized:
        handle = command.handle
        if not command.pty:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Command {handle} has no terminal to resize (exec.run with pty has)",
                {"command_id": handle},
            )
        if not command.stdin_open:
            raise QuillError(
                ErrorCode.COMMAND_ENDED,
                f"The input of command {handle} is closed: its terminal's size is fixed",
                {"command_id": handle, "stdin_open": False},
            )
        frame = [terminal.resize_frame(request.rows, request.cols)]
        if not await terminal.write_frames(process.write, frame, INPUT_WAIT_S):
            raise QuillError(
                ErrorCode.BUSY,
                f"Command {handle} did not take a new size within {INPUT_WAIT_S:g} s: its "
                "terminal holds input not yet read",
                {"command_id": handle},
            )
        return rp.TerminalResized(command_id=handle, rows=request.rows, cols=request.cols)

    async def _kill_after_grace(self, command: LiveCommand) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(command.ended.wait(), GRACE_S)
            return
        if command.process is not None:
            command.process.signal(signal.SIGKILL)

    async def on_forwarded(self, msg: Msg) -> None:
        """``<root>.exechold.<route>.<t>.<w>.<op>``: an op another executor forwarded here
        (``alive``: whether it holds the command)."""
        if msg.subject.endswith(".alive"):
            await self.on_alive(msg)
            return
        try:
            parts = msg.subject.split(".")
            tenant, workspace, op = parts[-3], parts[-2], parts[-1]
            spec = registry.find("exec", op)
            if spec is None or op not in ("input", "signal", "resize"):
                raise QuillError(ErrorCode.INVALID_ARGUMENT, f"not a forwarded op: {op}")
            request = codec.decode_request(spec, msg.data)
            address = Address("exec", tenant, workspace, op)
            reply = codec.ok_reply(None, await self.act(address, request))
        except QuillError as exc:
            reply = codec.error_reply(exc)
        except Exception as exc:
            log.exception("forwarded %s failed", msg.subject)
            reply = codec.error_reply(
                QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
            )
        await respond(msg, reply)

    async def on_list(self, msg: Msg) -> None:
        """``<root>.execlist.<t>.<w>``: this executor's live commands of the workspace."""
        parts = msg.subject.split(".")
        listed = self.listed(parts[-2], parts[-1])
        in_shells, shells = self.shells(parts[-2], parts[-1])
        mine = {c.command_id for c in in_shells}  # a yielded shell command: once, its shell's
        listed = [c for c in listed if c.command_id not in mine]
        answer = {"commands": [*listed, *in_shells], "shells": shells}
        await respond(msg, json.dumps(msgspec.to_builtins(answer)).encode())

    # ------------------------------------------------------------------ any executor's side
    async def operate(self, address: Address, request: rq.Request) -> Any:
        """``exec.poll``, ``exec.input``, ``exec.signal`` or ``exec.list``, answered here (the
        result) or by the holder (forwarded)."""
        if isinstance(request, rq.CommandPoll):
            return await self.poll(address, request)
        if isinstance(request, rq.LiveCommandsQuery):
            return await self.gather(address)
        assert isinstance(request, rq.CommandInput | rq.CommandSignal | rq.CommandResize)
        route = route_of(request.command_id)
        if route == self.route:
            return await self.act(address, request)
        subject = self.subjects.exec_holder(route, address.tenant, address.workspace, address.op)
        try:
            msg = await self.nc.request(subject, codec.encode(request), timeout=FORWARD_S)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            raise await self._why_not_held(address, request.command_id) from None
        spec = registry.of_request(request)
        return codec.decode_reply(msg.data, spec.result)[1]

    async def _why_not_held(self, address: Address, handle: str) -> QuillError:
        """The error for a command no executor holds: ended (its ``end`` record is kept),
        lost (only its ``start``: its executor died with it), or unknown."""
        start, end = await self._records(address, handle)
        if end is not None:
            return QuillError(
                ErrorCode.COMMAND_ENDED,
                f"Command {handle} has ended (exec.poll says how)",
                {"command_id": handle, **_ending(end)},
            )
        if start is not None:
            return lost(handle, start)
        return not_found(handle)

    async def _records(
        self, address: Address, handle: str
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The command's kept ``start`` and ``end`` records (None: none)."""

        async def get(part: str) -> dict[str, Any] | None:
            data = await kept_part(
                self.js, self.subjects, address.tenant, address.workspace, handle, part
            )
            if data is None:
                return None
            try:
                record = json.loads(data or b"{}")
            except ValueError:
                return None
            return record if isinstance(record, dict) else None

        return await get("start"), await get("end")

    async def _alive(self, address: Address, handle: str) -> bool:
        """Whether the executor the id names still holds the command."""
        route = route_of(handle)
        if route == self.route:
            return self.find(address.tenant, address.workspace, handle) is not None
        subject = self.subjects.exec_holder(route, address.tenant, address.workspace, "signal")
        probe = rq.CommandSignal(command_id=handle, signal="INT")
        # Never sent as a signal: ``alive`` asks only (an empty body is refused as no op).
        subject = subject.rsplit(".", 1)[0] + ".alive"
        try:
            msg = await self.nc.request(subject, codec.encode(probe), timeout=FORWARD_S)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return False
        return msg.data == b"1"

    async def on_alive(self, msg: Msg) -> None:
        """``<root>.exechold.<route>.<t>.<w>.alive``: whether the command is held here."""
        parts = msg.subject.split(".")
        try:
            handle = msgspec.json.decode(msg.data, type=rq.CommandSignal).command_id
        except msgspec.ValidationError:
            handle = ""
        held = self.find(parts[-3], parts[-2], handle) is not None
        await respond(msg, b"1" if held else b"0")

    async def poll(self, address: Address, req: rq.CommandPoll) -> rp.CommandStatus:
        """The command's output after ``req.cursor``, waiting up to ``wait_ms`` for more (woken
        by what is kept under its ``cmdout`` subjects).

        Raises:
            QuillError: ``COMMAND_NOT_FOUND``; ``COMMAND_LOST`` when it has not ended and its
                executor no longer holds it.
        """
        t, w, handle = address.tenant, address.workspace, req.command_id
        woken = asyncio.Event()

        async def wake(_: Msg) -> None:
            woken.set()

        sub = await self.nc.subscribe(self.subjects.cmdout(t, w, handle, ">"), cb=wake)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.wait_ms / 1000
        checked = False
        try:
            while True:
                woken.clear()
                status = await self.status(address, req)
                if status.running and not checked:
                    checked = True
                    if not await self._alive(address, handle):
                        status = await self.status(address, req)  # it may just have ended
                        if status.running:
                            start, _ = await self._records(address, handle)
                            raise lost(handle, start or {})
                new = status.stdout or status.stderr or status.more
                room = deadline - loop.time()
                if new or not status.running or room <= 0:
                    return status
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), room)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def status(self, address: Address, req: rq.CommandPoll) -> rp.CommandStatus:
        handle = req.command_id
        start, end = await self._records(address, handle)
        if start is None and end is None:
            raise not_found(handle)
        offsets = [int(n) for n in req.cursor.split(".")] if req.cursor else [0, 0]
        texts: list[str] = []
        more = False
        dropped = 0
        streams: tuple[rq.OutputStream, ...] = ("stdout", "stderr")
        for i, stream in enumerate(streams):
            try:
                page, skipped = await self._page(address, handle, stream, offsets[i], req)
            except QuillError as exc:
                if exc.code != ErrorCode.FILE_NOT_FOUND:
                    raise
                texts.append("")
                continue
            dropped += skipped
            offsets[i] = page.offset
            texts.append(page.text)
            offsets[i] += page.length
            if page.complete and offsets[i] == page.kept_bytes < page.total_bytes:
                dropped += page.total_bytes - page.kept_bytes  # past keep_bytes: never kept
                offsets[i] = page.total_bytes
            more = more or page.offset + page.length < page.kept_bytes
        ending = _ending(end) if end is not None else {}
        return rp.CommandStatus(
            command_id=handle,
            running=end is None,
            stdout=texts[0],
            stderr=texts[1],
            cursor=f"{offsets[0]}.{offsets[1]}",
            more=more,
            dropped=dropped,
            **ending,
        )

    async def _page(
        self, address: Address, handle: str, stream: rq.OutputStream, offset: int, req: Any
    ) -> tuple[rp.CommandOutput, int]:
        """The page of ``stream`` from ``offset``, and the bytes skipped to reach it: a page
        that comes back empty where the oldest kept chunk starts past ``offset`` (the stream's
        limits dropped the ones before) is read again from that chunk."""
        t, w = address.tenant, address.workspace

        def query(at: int) -> rq.CommandOutputQuery:
            return rq.CommandOutputQuery(
                command_id=handle, stream=stream, offset=at, length=req.max_bytes
            )

        page = await read_page(self.js, self.subjects, t, w, query(offset))
        if page.length:
            return page, 0
        first = await first_chunk(self.js, self.subjects, t, w, handle, stream)
        if first is None or first * CHUNK <= offset:
            return page, 0
        return await read_page(self.js, self.subjects, t, w, query(first * CHUNK)), (
            first * CHUNK - offset
        )

    async def gather(self, address: Address) -> rp.LiveCommands:
        """Every executor's live commands of the workspace (see the module docstring)."""
        executors = len(await bus.ping_all(self.nc, self.subjects, "executor", LIST_WAIT_S / 2))
        answers = await bus.gather(
            self.nc,
            self.subjects.exec_list(address.tenant, address.workspace),
            LIST_WAIT_S,
            expect=max(executors, 1),
        )
        listed = [c for answer in answers for c in _as_list(answer)]
        listed.sort(key=lambda c: c.started)
        shells = [s for answer in answers for s in _shells_of(answer)]
        shells.sort(key=lambda s: s.started)
        return rp.LiveCommands(commands=listed, shells=shells, executors=len(answers))


def _as_list(answer: Any) -> list[rp.LiveCommand]:
    if isinstance(answer, dict):  # with its shells
        answer = answer.get("commands")
    try:
        return msgspec.convert(answer, list[rp.LiveCommand])
    except msgspec.ValidationError:
        return []


def _shells_of(answer: Any) -> list[rp.LiveShell]:
    if not isinstance(answer, dict):
        return []
    try:
        return msgspec.convert(answer.get("shells") or [], list[rp.LiveShell])
    except msgspec.ValidationError:
        return []


def _ending(end: dict[str, Any]) -> dict[str, Any]:
    """What a kept ``end`` record says of how the command ended (``CommandStatus``' fields)."""
    facts = end.get("command")
    if not isinstance(facts, dict):
        return {}
    return {
        "exit_code": facts.get("exit_code"),
        "timed_out": bool(facts.get("timed_out")),
        "version": facts.get("version"),
        "changed": facts.get("changed") or 0,
        "error": facts.get("error"),
        "duration_ms": facts.get("duration_ms"),
    }


def lost(handle: str, start: dict[str, Any]) -> QuillError:
    facts = start.get("command") if isinstance(start.get("command"), dict) else {}
    assert isinstance(facts, dict)
    return QuillError(
        ErrorCode.COMMAND_LOST,
        f"Command {handle} is lost: the executor holding it is gone, and the command with it "
        "(its changes were not committed; what was committed before stays)",
        {"command_id": handle, "base_version": facts.get("base_version")},
    )
