"""An executor: runs commands and git actions against its checkouts, commits what they change.

Executors form one queue group on ``ws.exec.*.*.*``. Each answers at most ``max_runs`` requests
at once, shared fairly between tenants; more wait in a bounded queue per tenant, and past it
are refused with ``UNAVAILABLE`` (the SDK retries it, maybe on another executor): ``slots``.
Commands on one workspace run one at a time on an executor (its checkout is one directory); a
waiting command holds its slot. A checkout holds at most ``max_checkout_bytes`` (``quota``); the
executor keeps its checkouts within a byte budget and refuses commands when its data disk is
short of free space (``disk``). While a request is in hand, the executor publishes its live
output, and a heartbeat, on ``ws.execout.<t>.<w>.<request id>``, ending with ``eof`` just
before the reply (``infra.exec.answer``).

This module is the wiring: subscriptions, slots, the answer. ``checkouts`` keeps the checkouts
on disk, ``commands`` runs ``exec.run`` and ``exec.git`` in them, ``output`` keeps what
commands print for ``exec.output``; the sandbox, git, the checkout itself, the commit and the
result are ``infra.exec``'s (shared with the bridge).

Run it with ``quill executor --nats-url URL --data DIR [--sandbox bwrap|local]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sized
from typing import IO, Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts import codec
from contracts import ops as registry
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import EXECUTOR_MAX_OUTPUT_READS, RETRY_AFTER_MS
from contracts.subjects import QUEUE_EXECUTOR, STREAM_OUTPUT, Address, Origin
from infra import approvals, assets, bus, claims, metrics, safefs, storage
from infra.blobs import Blobs
from infra.bridges import Bridges
from infra.bus import respond
from infra.busy import refused
from infra.entry import Incoming, parse, reject, reply_headers
from infra.exec import checkout, sandbox, watch
from infra.exec.answer import Job, answer_exec, received
from infra.exec.git import Credentials
from infra.exec.sandbox import common
from infra.private import tighten_logged
from infra.runtime import (
    Auditor,
    Running,
    Settings,
    connect_service,
    lock_directory,
    started,
)
from infra.secret_registry import secrets_from_env
from quill.client import Quill
from services.executor.checkouts import Checkouts
from services.executor.commands import Commands
from services.executor.config import ExecutorConfig
from services.executor.egress import Egress
from services.executor.live import FORWARD_S, LIVE_OPS, LiveCommands, route_of
from services.executor.output import ensure_stream, read_page
from services.executor.ports import PortRelay
from services.executor.portws import SocketRelay
from services.executor.shells import SHELL_ID, Shells
from services.executor.slots import Slots, Ticket

__all__ = ["Executor", "ExecutorConfig", "start_executor"]

log = logging.getLogger("quill.executor")


class Executor:
    def __init__(self, settings: Settings, nc: NATS, config: ExecutorConfig) -> None:
        self.settings, self.config = settings, config
        self.subjects = settings.subjects
        self.instance = settings.instance or bus.instance_id("executor")
        self.nc, self.js = nc, nc.jetstream()
        self.provider = sandbox.provider(config.sandbox)
        self.blobs = Blobs(self.js)
        # A command's changes go to the writer as one apply, idempotent by request id: wait a
        # while for a big one, but not a whole minute for a writer killed with it in hand
        # (a retry reaches the writer that took its partition over, or joins the one running).
        self.quill = Quill(nc, actor="executor", root=self.subjects.root, timeout=15, retries=4)
        self.auditor = Auditor(nc, self.subjects, "executor", self.instance)
        self.bridges = Bridges(self.js)
        self.tasks: set[asyncio.Task[None]] = set()
        self.output_reads = 0
        """``exec.output`` reads being answered (at most ``EXECUTOR_MAX_OUTPUT_READS``)."""
        self.live = LiveCommands(
            nc, self.js, self.subjects, self.instance, per_tenant=config.tenant_live
        )
        """Commands running on past their answer (``live``)."""
        self.live_ops = 0
        """``exec.poll``/``input``/``signal``/``list`` being answered (bounded as reads)."""
        self.slots = Slots(config.max_runs, config.tenant_runs, config.queue, config.queue_wait_s)
        self.checkouts = Checkouts(
            settings.data_dir,
            self.js,
            self.subjects,
            self.blobs,
            self.quill,
            budget=config.checkouts_budget,
            reserve=config.disk_reserve,
            ceiling=config.max_checkout_bytes,
            background=self._background,
            gone=self.provider.discard,
            owner=self.provider.owner,
            links=lambda: self.provider.overlays,
        )
        self.commands = Commands(
            config,
            self.provider,
            self.checkouts,
            self.quill,
            self.blobs,
            self.js,
            self.subjects,
            credentials=(
                Credentials.load(config.credentials) if config.credentials else Credentials()
            ).allowing(config.git_allow),
            secrets=secrets_from_env(),
            scratch=settings.data_dir / "scratch",
            live=self.live,
        )
        self.commands.egress = Egress.of(config, settings.data_dir, self.auditor)
        self.shells = Shells(self.commands, settings.data_dir)
        """The shells this executor holds (``shells``)."""
        self.commands.in_shell = self.shells.run
        self.ports = PortRelay(self.shells, self.auditor)
        """HTTP to the shells' ports, from the gateway (``ports``)."""
        self.sockets = SocketRelay(nc, self.shells, self.auditor)
        """Websockets to the shells' ports, from the gateway (``portws``)."""
        self.live.shells = self.shells.listed
        self.ops: dict[str, Callable[[Address, Origin, Any, Job, dict[str, Any]], Awaitable[Any]]]
        self.ops = registry.table(
            "exec",
            {
                "run": self.commands.run,
                "git": self.commands.git,
                "shell_open": self._shell_op(self.shells.open),
                "checkpoint": self._shell_op(self.shells.checkpoint),
                "shell_close": self._shell_op(self.shells.close),
            },
            # a read of kept output, ops on a live command: no slot, no checkout
            served_elsewhere=("output", *LIVE_OPS),
        )
        """The ops that run in a checkout, by name (``contracts/ops.py`` checks the table)."""
        self._subs: list[Subscription] = []
        self._lock: IO[str] | None = None
        self._gauges = metrics.Sources()
        self.runs = 0

    def info(self) -> dict[str, Any]:
        return {
            "sandbox": self.provider.name,
            "cgroups": self.provider.cgroups,
            "overlays": self.provider.overlays,
            "running": self.slots.running,
            "max_runs": self.config.max_runs,
            "checkouts": len(self.checkouts),
            "waiting": self.slots.waiting,
            **self.checkouts.info(),
            "local_workspaces": len(self.bridges),
            "io": {**safefs.COUNTS, **checkout.COUNTS, **watch.io()},
            **storage.state("executor").info(),
        }

    async def start(self) -> None:
        reset = common.default_signals()
        if reset:
            log.info("%s were ignored by this process: reset, for the commands", ", ".join(reset))
        await self.bridges.start()
        # Only the executor may enter: files commands create belong to the sandbox's host uid.
        for private in (self.settings.data_dir, self.settings.data_dir / "checkouts"):
            private.mkdir(parents=True, exist_ok=True)
            private.chmod(0o700)
        # and what an earlier version left readable in it (the sandbox's trees stay as they are)
        tighten_logged(self.settings.data_dir, "executor")
        # One executor per data directory: its checkouts are one process's, and the sweep
        # below takes every sandbox over them for a dead predecessor's.
        self._lock = lock_directory(self.settings.data_dir, "another executor")
        killed = await self.provider.sweep(self.settings.data_dir / "checkouts")
        if killed:
            log.warning("killed %d sandbox processes an earlier executor left running", killed)
        await self.checkouts.found()
        await self.shells.start()
        if self.config.overlay:
            await asyncio.to_thread(self.provider.layers, self.settings.data_dir / "checkouts")
        if not self.provider.overlays:
            log.info(
                "commands run on their checkouts (walked after): %s", self.provider.no_overlays
            )
        slots, budget = self.slots, self.checkouts.budget
        self._gauges.add(metrics.EXECUTOR_SLOTS_BUSY, lambda: per_tenant(slots.held))
        self._gauges.add(metrics.EXECUTOR_QUEUED, lambda: per_tenant(slots.queues))
        live, shells = self.live.held, self.shells.held
        self._gauges.add(metrics.EXECUTOR_LIVE_COMMANDS, lambda: per_tenant(tenants(live)))
        self._gauges.add(metrics.EXECUTOR_SHELLS, lambda: per_tenant(tenants(shells)))
        self._gauges.add(metrics.EXECUTOR_CHECKOUT_BYTES, lambda: sum(tuple(budget.sizes.values())))
        output, replicas = self.config.output, self.settings.replicas
        await assets.patiently(
            f"creating {STREAM_OUTPUT}",
            lambda: ensure_stream(self.js, self.subjects, output, replicas),
        )
        await assets.patiently(
            "creating WS_APPROVALS",
            lambda: approvals.ensure_stream(self.js, self.subjects, replicas),
        )
        self._subs.append(
            await bus.serve(self.nc, self.subjects.all_exec, QUEUE_EXECUTOR, self.on_request)
        )
        self._subs.append(await self.nc.subscribe(self.subjects.all_purged, cb=self.on_purged))
        holder = self.subjects.all_exec_holder(self.live.route)
        self._subs.append(await self.nc.subscribe(holder, cb=self._on_forwarded))
        self._subs.append(
            await self.nc.subscribe(self.subjects.all_exec_list, cb=self.live.on_list)
        )
        self._subs += await bus.serve_ping(
            self.nc, self.subjects, "executor", self.instance, self.info
        )
        self._subs += await claims.serve(
            self.nc, self.subjects, self.bridges, "executor", self.instance
        )
        await self.nc.flush()
        log.info(
            "executor %s serving %s with the %s sandbox",
            self.instance,
            self.subjects.all_exec,
            self.provider.name,
        )

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self.shells.stop()  # their sandboxes end; what they left is not committed
        for task in list(self.tasks):  # commands are killed; their callers get an error
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=sandbox.GRACE_S + 5)
        await self.checkouts.close()  # no removal goes on in a thread after it
        await self.bridges.stop()
        await self.provider.close()
        if self._lock is not None:
            self._lock.close()
        self._gauges.remove()

    # ------------------------------------------------------------------ requests
    async def on_purged(self, msg: Msg) -> None:
        """``ws.purged.<t>.<w>``: the writer purged a workspace; its checkout goes."""
        self._background(self.checkouts.purged(self.subjects.parse_workspace_subject(msg.subject)))

    async def on_request(self, msg: Msg) -> None:
        """An exec request, its subject parsed once, here: a local workspace's is its bridge's,
        a read of kept output is answered apart (no slot, no checkout), the rest takes a slot
        (or is refused, busy) and is answered on a task of its own."""
        incoming = Incoming(msg)
        try:
            address = self.subjects.parse_request(msg.subject)
        except QuillError as exc:  # a bad subject: refused as parse() would
            await reject(incoming, exc, self.auditor)
            return
        if self.bridges.claims(address.tenant, address.workspace):
            return  # a local workspace: its bridge answers
        shell = _shell_of(address, msg.data)
        if shell is not None and not self.shells.held_here(shell):
            await self._to_holder(incoming, address, shell)
            return
        await self._take(incoming, address)

    async def _take(self, incoming: Incoming, address: Address) -> None:
        """A request to answer here (sent here, or forwarded by another executor: its shell is
        held here)."""
        if address.op in LIVE_OPS:  # an op on a live command: no slot, no checkout
            if self.live_ops >= EXECUTOR_MAX_OUTPUT_READS:
                limit = EXECUTOR_MAX_OUTPUT_READS
                error = refused("executor", "live_ops", "The executor", RETRY_AFTER_MS, limit=limit)
                await reject(incoming, error, self.auditor)
                return
            self.live_ops += 1
            self._background(self._live_op(incoming, address))
            return
        if address.op == "output":  # a read of kept output: no slot, no checkout
            if self.output_reads >= EXECUTOR_MAX_OUTPUT_READS:
                limit = EXECUTOR_MAX_OUTPUT_READS
                error = refused(
                    "executor", "output_reads", "The executor", RETRY_AFTER_MS, limit=limit
                )
                await reject(incoming, error, self.auditor)
                return
            self.output_reads += 1
            self._background(self._read_output(incoming, address))
            return
        try:
            ticket = self.slots.join(address.tenant)
        except QuillError as exc:
            await reject(incoming, exc, self.auditor)
            return
        task = asyncio.create_task(self.answer(incoming, address, ticket))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def answer(self, incoming: Incoming, address: Address, ticket: Ticket) -> None:
        try:
            await self._answer(incoming, address, ticket)
        finally:
            self.slots.leave(ticket)

    async def _answer(self, incoming: Incoming, subject: Address, ticket: Ticket) -> None:
        secrets = self.commands.secrets
        taken = await received(incoming, self.nc, self.subjects, self.auditor, secrets, subject)
        if taken is None:
            return
        address, origin, request, job = taken
        details: dict[str, Any] = {}

        async def work() -> tuple[int, rp.CommandResult | rp.GitResult]:
            await self.checkouts.room()  # a disk short of its reserve refuses at once (once)
            await self.slots.wait(ticket)  # heartbeats go on meanwhile
            run = self.ops[registry.of_request(request).name]
            result: tuple[int, rp.CommandResult | rp.GitResult]
            result = await run(address, origin, request, job, details)
            return result

        await answer_exec(
            incoming, job, self.auditor, address, origin, work, details,
            stopping="The executor is stopping; retry",
        )  # fmt: skip

    async def answer_output(self, incoming: Incoming, subject: Address | None = None) -> None:
        """``exec.output``: a page of a command's kept output (``output``), of the tenant
        and workspace the request was sent to only (``subject``: its subject, parsed)."""
        try:
            address, _, origin, request = parse(incoming, self.subjects, "exec", address=subject)
            assert isinstance(request, rq.CommandOutputQuery)
            try:
                page = await read_page(
                    self.js, self.subjects, address.tenant, address.workspace, request
                )
            except QuillError as exc:  # nothing kept: said as for any op if no workspace
                if exc.code == ErrorCode.FILE_NOT_FOUND:
                    await self.quill.workspace(f"{address.tenant}/{address.workspace}").info()
                raise
        except Exception as exc:
            await self._refuse(incoming, exc)
            return
        await respond(incoming.msg, codec.ok_reply(None, page))
        summary = f"output of {request.command_id} ({request.stream} from {request.offset})"
        await self.auditor.record(address, origin, incoming.started, summary=summary)

    async def _refuse(self, incoming: Incoming, exc: Exception) -> None:
        """Answer ``incoming`` with what went wrong (called in its ``except``): a
        ``QuillError`` as it is, anything else as ``INTERNAL`` (logged with its traceback)."""
        if not isinstance(exc, QuillError):
            log.exception("exec %s failed", incoming.msg.subject)
            exc = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
        await reject(incoming, exc, self.auditor)

    async def _read_output(self, incoming: Incoming, address: Address) -> None:
        try:
            await self.answer_output(incoming, address)
        finally:
            self.output_reads -= 1

    async def _live_op(self, incoming: Incoming, subject: Address) -> None:
        """``exec.poll``, ``exec.input``, ``exec.signal`` or ``exec.list`` (``live``), for the
        tenant and workspace the request was sent to only."""
        try:
            try:
                address, _, origin, request = parse(
                    incoming, self.subjects, "exec", address=subject
                )
                if isinstance(request, rq.CommandPoll) and origin.timeout_ms:
                    # answered before the caller gives up (a second for the way back)
                    most = max(0, origin.timeout_ms - 1000)
                    request = msgspec.structs.replace(request, wait_ms=min(request.wait_ms, most))
                result = await self.live.operate(address, request)
            except Exception as exc:
                await self._refuse(incoming, exc)
                return
            await respond(incoming.msg, codec.ok_reply(None, result), reply_headers(origin))
            handle = getattr(request, "command_id", "")
            summary = f"{address.op} {handle}".strip()
            if isinstance(request, rq.CommandSignal):
                summary += f" {request.signal}"
            await self.auditor.record(address, origin, incoming.started, summary=summary)
        finally:
            self.live_ops -= 1

    async def _on_forwarded(self, msg: Msg) -> None:
        parts = msg.subject.split(".")
        tenant, workspace, op = parts[-3], parts[-2], parts[-1]
        if op == "shellalive":
            address = Address("exec", tenant, workspace, op)
            held = self.shells.find(address, msg.data.decode(errors="replace")) is not None
            await respond(msg, b"1" if held else b"0")
            return
        if op == "port":  # an HTTP request to a port of a shell held here (the gateway's)
            self._background(self.ports.on_request(msg, tenant, workspace))
            return
        if op == "portws":  # a websocket to a port of a shell held here, relayed until closed
            self._background(self.sockets.on_open(msg, tenant, workspace))
            return
        if op in SHELL_FORWARDED:  # the client's request, as it came: answered to its inbox
            await self._take(Incoming(msg), Address("exec", tenant, workspace, op))
            return
        self._background(self.live.on_forwarded(msg))

    async def _to_holder(self, incoming: Incoming, address: Address, shell: str) -> None:
        """A request on a shell another executor holds: forwarded to it as it came (it answers
        the client), or refused ``SHELL_LOST``/``SHELL_NOT_FOUND`` when it holds none."""
        route = route_of(shell)
        t, w = address.tenant, address.workspace
        alive = self.subjects.exec_holder(route, t, w, "shellalive")
        try:
            answer = await self.nc.request(alive, shell.encode(), timeout=FORWARD_S)
            held = answer.data == b"1"
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            held = False
        if not held:
            await reject(incoming, await self.shells.why_not(address, shell), self.auditor)
            return
        msg = incoming.msg
        await self.nc.publish(
            self.subjects.exec_holder(route, t, w, address.op),
            msg.data,
            reply=msg.reply,
            headers=msg.headers,
        )

    def _shell_op(
        self, op: Callable[[Address, Origin, Any, dict[str, Any]], Awaitable[Any]]
    ) -> Callable[[Address, Origin, Any, Job, dict[str, Any]], Awaitable[Any]]:
        """A shell op as an exec op (it streams no output)."""

        async def run(
            address: Address, origin: Origin, req: Any, _job: Job, details: dict[str, Any]
        ) -> Any:
            return await op(address, origin, req, details)

        return run

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


SHELL_FORWARDED = ("run", "checkpoint", "shell_close")
"""The ops on a shell, answered by the executor holding it."""


class _ShellPeek(msgspec.Struct):
    shell: str | None = None


def _shell_of(address: Address, data: bytes) -> str | None:
    """The shell a request names, when it is an op on one (its id well formed)."""
    if address.op not in SHELL_FORWARDED:
        return None
    try:
        shell = msgspec.json.decode(data, type=_ShellPeek).shell
    except Exception:  # noqa: BLE001 - a peek: malformed (bad UTF-8, nested too deep, ...)
        return None  # is refused by the op itself, as any malformed body is
    if shell is None or not SHELL_ID.fullmatch(shell):
        return None
    return shell


def per_tenant(counts: Mapping[str, int | Sized]) -> dict[tuple[str, ...], float]:
    """A gauge's value per tenant, from a count or a queue per tenant (copied first: a
    scrape reads it from another thread)."""
    return {(t,): float(n if isinstance(n, int) else len(n)) for t, n in tuple(counts.items())}


def tenants(held: Mapping[str, Any]) -> Counter[str]:
    """How many of ``held`` (live commands, shells: each has a ``tenant``) each tenant has."""
    return Counter(item.tenant for item in tuple(held.values()))


async def start_executor(settings: Settings, config: ExecutorConfig) -> Running[Executor]:
    """Connect and start an executor; the result's ``stop`` undoes all of it."""
    nc = await connect_service(settings, "executor")
    return await started(Executor(settings, nc, config), nc)
