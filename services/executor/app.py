"""An executor: runs commands and git actions against its checkouts, commits what they change.

Executors form one queue group on ``ws.exec.*.*.*``. Each answers at most ``max_runs`` requests
at once, shared fairly between tenants; more wait in a bounded queue per tenant, and past it
are refused with ``UNAVAILABLE`` (the SDK retries it, maybe on another executor): ``slots``.
Commands on one workspace run one at a time on an executor (its checkout is one directory); a
waiting command holds its slot. A checkout holds at most ``max_checkout_bytes`` (``quota``); the
executor keeps its checkouts within a byte budget and refuses commands when its data disk is
short of free space (``disk``). While a request is in hand,
the executor publishes its live output, and a heartbeat every ``HEARTBEAT_S``, on
``ws.execout.<t>.<w>.<request id>``, ending with ``eof`` just before the reply.

Run it with ``quill executor --nats-url URL --data DIR [--sandbox bwrap|local]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.nuid import NUID

from contracts import codec
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.paths import display, normalize
from contracts.subjects import (
    HEADER_SEQ,
    HEADER_STREAM,
    QUEUE_EXECUTOR,
    Address,
    Origin,
    new_request_id,
)
from core.controls import LockState
from core.secrets import NO_SECRETS, Secrets, StreamRedactor
from infra import bus, compaction
from infra.blobs import Blobs
from infra.bridges import Bridges
from infra.bus import respond
from infra.entry import Incoming, parse, reject
from infra.runtime import (
    Auditor,
    Running,
    Settings,
    connect_service,
    lock_directory,
)
from infra.secret_registry import secrets_from_env
from quill.client import Quill
from services.executor import disk, quota, sandbox
from services.executor.checkout import Captured, Checkout
from services.executor.commit import commit
from services.executor.git import Credentials, run_git, sandbox_runner
from services.executor.output import OutputConfig, Recorder, ensure_stream, read_page
from services.executor.slots import Slots, Ticket

log = logging.getLogger("quill.executor")
T = TypeVar("T")

HEARTBEAT_S = 2.0
"""How often a request in hand is announced alive on its output subject."""
DEFAULT_TIMEOUT_MS = 30_000
LIVE_MAX_BYTES = 8 * 1024 * 1024
"""Live output published per stream; past it, output is still counted (and the first
``max_output_bytes`` returned) but no longer streamed."""
LIVE_CHUNK_BYTES = 256 * 1024
READ_ONLY_GIT = frozenset({"status", "diff", "branch", "log"})
"""Git actions that change no file (run with GIT_OPTIONAL_LOCKS=0): nothing to capture."""


@dataclass(frozen=True)
class ExecutorConfig:
    sandbox: str | None = None
    """``bwrap``, ``local`` or None (bwrap when it works here, else local)."""
    max_runs: int = 4
    """Requests answered at once (see ``slots`` for how tenants share them)."""
    tenant_runs: int | None = None
    """Most slots one tenant may hold (None: ``max_runs - 1``, at least 1)."""
    queue: int = 16
    """Requests waiting for a slot, per tenant; more are refused with UNAVAILABLE."""
    queue_wait_s: float = 120.0
    """Longest a request waits for a slot before UNAVAILABLE."""
    checkouts_budget: int = 16 * 1024**3
    """Bytes of checkouts kept on disk; past it, idle ones are evicted (least recently used)."""
    disk_reserve: int | None = None
    """Free bytes the data disk keeps: below, new commands are refused (None: max(1 GiB, 5%))."""
    memory_bytes: int = 4 * 1024**3
    processes: int = 512
    file_bytes: int = 1024**3
    credentials: Path | None = None
    """TOML file of git credentials (see ``services/executor/git/``)."""
    git_allow: tuple[str, ...] = ()
    """More git allow-list entries, ``HOST[:PORT]`` (``services/executor/git/targets.py``)."""
    output: OutputConfig = OutputConfig()
    """How long and how much of commands' output is kept for ``exec.output`` (``output``)."""


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

    async def publish(self, stream: str, data: bytes = b"") -> None:
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

    async def output(self, stream: sandbox.StreamName, chunk: bytes) -> None:
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
    Failures are answered as errors; an unexpected one is logged and is ``INTERNAL``."""
    try:
        async with heartbeat(job):
            version, result = await work()
            await job.publish("eof")
    except QuillError as exc:
        await job.publish("eof")
        await reject(incoming, exc, auditor)
        return
    except asyncio.CancelledError:
        await reject(incoming, QuillError(ErrorCode.UNAVAILABLE, stopping), auditor)
        raise
    except (TimeoutError, nats.errors.Error) as exc:  # NATS failing over: retriable
        log.warning("exec %s: NATS did not answer: %r", incoming.msg.subject, exc)
        error = QuillError(ErrorCode.UNAVAILABLE, f"NATS did not answer in time ({exc!r}); retry")
        await reject(incoming, error, auditor)
        return
    except Exception as exc:
        log.exception("exec %s failed", incoming.msg.subject)
        error = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
        await reject(incoming, error, auditor)
        return
    await respond(incoming.msg, codec.ok_reply(version, result))
    changes = result.changes
    await auditor.record(
        address,
        origin,
        incoming.started,
        version=version,
        paths=[p.path for p in changes.paths] if changes else [],
        summary=details.pop("summary", None),
        details=details,
    )


def text_of(data: bytes, truncated: bool) -> str:
    """Output as text: invalid UTF-8 replaced, and a multi-byte character cut by the output
    cap dropped rather than shown as a replacement character."""
    if truncated:
        i, back = len(data) - 1, 0
        while i >= 0 and back < 3 and data[i] & 0xC0 == 0x80:  # continuation bytes
            i, back = i - 1, back + 1
        if i >= 0 and data[i] >= 0xC0:  # the lead byte of the last character
            width = 2 if data[i] < 0xE0 else 3 if data[i] < 0xF0 else 4
            if len(data) - i < width:
                data = data[:i]
    return data.decode("utf-8", "replace")


class Executor:
    def __init__(self, settings: Settings, nc: NATS, config: ExecutorConfig) -> None:
        self.settings, self.config = settings, config
        self.subjects = settings.subjects
        self.instance = settings.instance or bus.instance_id("executor")
        self.nc, self.js = nc, nc.jetstream()
        self.provider = sandbox.provider(config.sandbox)
        self.credentials = (
            Credentials.load(config.credentials) if config.credentials else Credentials()
        ).allowing(config.git_allow)
        self.blobs = Blobs(self.js)
        # A command's changes go to the writer as one apply, idempotent by request id: wait a
        # while for a big one, but not a whole minute for a writer killed with it in hand
        # (a retry reaches the writer that took its partition over, or joins the one running).
        self.quill = Quill(nc, actor="executor", root=self.subjects.root, timeout=15, retries=4)
        self.auditor = Auditor(nc, self.subjects, "executor", self.instance)
        self.bridges = Bridges(self.js)
        self.secrets = secrets_from_env()
        self.checkouts: dict[tuple[str, str], Checkout] = {}
        self.locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = Slots(config.max_runs, config.tenant_runs, config.queue, config.queue_wait_s)
        self.reserve = disk.Reserve(settings.data_dir, config.disk_reserve)
        self.budget = disk.Budget(config.checkouts_budget)
        self.using: Counter[tuple[str, str]] = Counter()
        """Requests in hand per checkout (one in use, or waited for, is never evicted)."""
        self.over_quota: dict[tuple[str, str], int] = {}
        """Checkouts over their quota with only what the log holds, at that version."""
        self.measured: dict[tuple[str, str], tuple[int, int]] = {}
        """Per checkout a command ended in normally: (version after it, bytes it held then),
        so that the next command at that version need not walk it again."""
        self._subs: list[Subscription] = []
        self._nuid = NUID()
        self._lock: IO[str] | None = None
        self.runs = 0

    def info(self) -> dict[str, Any]:
        return {
            "sandbox": self.provider.name,
            "cgroups": self.provider.cgroups,
            "running": self.slots.running,
            "max_runs": self.config.max_runs,
            "checkouts": len(self.checkouts),
            **self._disk_info(),
            "local_workspaces": len(self.bridges),
        }

    async def start(self) -> None:
        await self.bridges.start()
        # Only the executor may enter: files commands create belong to the sandbox's host uid.
        for private in (self.settings.data_dir, self.settings.data_dir / "checkouts"):
            private.mkdir(parents=True, exist_ok=True)
            private.chmod(0o700)
        # One executor per data directory: its checkouts are one process's, and the sweep
        # below takes every sandbox over them for a dead predecessor's.
        self._lock = lock_directory(self.settings.data_dir, "another executor")
        killed = await self.provider.sweep(self.settings.data_dir / "checkouts")
        if killed:
            log.warning("killed %d sandbox processes an earlier executor left running", killed)
        await self._found_checkouts()
        await ensure_stream(self.js, self.subjects, self.config.output, self.settings.replicas)
        self._subs.append(
            await bus.serve(self.nc, self.subjects.all_exec, QUEUE_EXECUTOR, self.on_request)
        )
        self._subs += await bus.serve_ping(
            self.nc, self.subjects, "executor", self.instance, self.info
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
        for task in list(self.tasks):  # commands are killed; their callers get an error
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=sandbox.GRACE_S + 5)
        await self.bridges.stop()
        if self._lock is not None:
            self._lock.close()

    # ------------------------------------------------------------------ requests
    async def on_request(self, msg: Msg) -> None:
        incoming = Incoming(msg)
        with contextlib.suppress(QuillError):  # a bad subject is answered by answer()
            address = self.subjects.parse_request(msg.subject)
            if self.bridges.claims(address.tenant, address.workspace):
                return  # a local workspace: its bridge answers
            if address.op == "output":  # a read of kept output: no slot, no checkout
                self._background(self.answer_output(incoming))
                return
        try:  # a bad subject is refused here, as parse() would
            ticket = self.slots.join(self.subjects.parse_request(msg.subject).tenant)
        except QuillError as exc:
            await reject(incoming, exc, self.auditor)
            return
        task = asyncio.create_task(self.answer(incoming, ticket))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def answer(self, incoming: Incoming, ticket: Ticket) -> None:
        try:
            await self._answer(incoming, ticket)
        finally:
            self.slots.leave(ticket)

    async def _answer(self, incoming: Incoming, ticket: Ticket) -> None:
        try:
            address, spec, origin, request = parse(
                incoming, self.subjects, "exec", new_id=new_request_id
            )
        except QuillError as exc:
            await reject(incoming, exc, self.auditor)
            return
        job = Job(
            self.nc,
            self.subjects.execout(address.tenant, address.workspace, origin.request_id),
            secrets=self.secrets,
        )
        details: dict[str, Any] = {}

        async def work() -> tuple[int, rp.CommandResult | rp.GitResult]:
            await self._room()  # a disk short of its reserve refuses at once, not after a wait
            await self.slots.wait(ticket)  # heartbeats go on meanwhile
            if isinstance(request, rq.RunCommand):
                return await self.run(address, origin, request, job, details)
            assert isinstance(request, rq.GitCommand)
            return await self.git(address, origin, request, details)

        await answer_exec(
            incoming, job, self.auditor, address, origin, work, details,
            stopping="The executor is stopping; retry",
        )  # fmt: skip

    async def answer_output(self, incoming: Incoming) -> None:
        """``exec.output``: a page of a command's kept output (``output``), of the tenant
        and workspace the request was sent to only."""
        try:
            address, _, origin, request = parse(incoming, self.subjects, "exec")
            assert isinstance(request, rq.CommandOutputQuery)
            try:
                page = await read_page(
                    self.js, self.subjects, address.tenant, address.workspace, request
                )
            except QuillError as exc:  # nothing kept: said as for any op if no workspace
                if exc.code == ErrorCode.FILE_NOT_FOUND:
                    await self.quill.workspace(f"{address.tenant}/{address.workspace}").info()
                raise
        except QuillError as exc:
            await reject(incoming, exc, self.auditor)
            return
        except Exception as exc:
            log.exception("exec %s failed", incoming.msg.subject)
            error = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
            await reject(incoming, error, self.auditor)
            return
        await respond(incoming.msg, codec.ok_reply(None, page))
        summary = f"output of {request.command_id} ({request.stream} from {request.offset})"
        await self.auditor.record(address, origin, incoming.started, summary=summary)

    # ------------------------------------------------------------------ checkouts
    def _new_checkout(self, home: Path, address: Address) -> Checkout:
        ws = self.quill.workspace(f"{address.tenant}/{address.workspace}")

        async def fetch(path: str, version: int) -> bytes:
            return await ws.read_bytes(path, version=version)

        return Checkout(
            home, address.tenant, address.workspace, self.js, self.subjects, self.blobs, fetch
        )

    @contextlib.asynccontextmanager
    async def _checkout(self, address: Address) -> AsyncIterator[Checkout]:
        """The workspace's checkout, synced to the latest version, within its quota, held
        exclusively; idle checkouts over the budget are evicted once it is released.

        Raises:
            QuillError: ``UNAVAILABLE`` (the log, or the disk's reserve), ``WORKSPACE_NOT_FOUND``,
                ``SIZE_LIMIT_EXCEEDED`` (the log's files alone are over the quota).
        """
        key = (address.tenant, address.workspace)
        self.using[key] += 1
        done = False
        try:
            async with self.locks.setdefault(key, asyncio.Lock()):
                await self._room()
                checkout = self.checkouts.get(key)
                if checkout is None:
                    home = self.settings.data_dir / "checkouts" / address.tenant
                    checkout = self._new_checkout(home / address.workspace, address)
                    await asyncio.to_thread(checkout.open)
                    self.checkouts[key] = checkout
                await self._sync(checkout)
                if checkout.version == 0:
                    raise QuillError(
                        ErrorCode.WORKSPACE_NOT_FOUND,
                        f"Workspace not found: {address.tenant}/{address.workspace}",
                        {"tenant": address.tenant, "workspace": address.workspace},
                    )
                await self._within_quota(key, checkout)
                yield checkout
                self.measured[key] = (checkout.version, self.budget.sizes.get(key, 0))
            done = True
        finally:
            self.using[key] -= 1
            if self.using[key] <= 0:
                del self.using[key]
            if not done:  # failed or cancelled: evict in the background
                self._background(self._evict())
        await self._evict()  # before the reply: its sender sees the budget kept

    async def _sync(self, checkout: Checkout) -> None:
        try:
            await checkout.sync()
        except Exception as exc:
            raise QuillError(ErrorCode.UNAVAILABLE, f"The log is not reachable: {exc}") from exc

    # ------------------------------------------------------------------ disk
    async def _within_quota(self, key: tuple[str, str], checkout: Checkout) -> None:
        """Before a command: a checkout over its quota drops what the log does not hold (it
        is rebuilt from the log); still over, the command is refused."""
        limit = checkout.limits.max_checkout_bytes
        known = self.measured.pop(key, None)  # kept only by a command that ended normally
        if known is not None and known[0] == checkout.version:
            used = known[1]  # nothing changed it since
        else:
            used = await quota.measure(checkout.home)
        if used > limit and self.over_quota.get(key) != checkout.version:
            log.warning("checkout %s/%s over its quota (%d bytes): rebuilt", *key, used)
            await asyncio.to_thread(checkout.reset)
            await self._sync(checkout)
            used = await quota.measure(checkout.home)
        self.budget.used(key, used)
        if used > limit:  # not rebuilt again until the log changes
            self.over_quota[key] = checkout.version
            raise quota.OverQuota(used, limit).refused()
        self.over_quota.pop(key, None)

    async def _guarded(self, checkout: Checkout, work: Awaitable[T]) -> T:
        """``work`` (a command on ``checkout``) stopped if the checkout goes over its quota:
        then its changes are discarded (the checkout is rebuilt from the log next time).

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED`` when it was stopped or ended over the quota.
        """
        key = (checkout.tenant, checkout.workspace)
        live = self.checkouts.get(key) is checkout  # not one built at an older version
        try:
            result, used = await quota.guard(
                checkout.home, checkout.limits.max_checkout_bytes, work
            )
        except quota.OverQuota as over:
            await asyncio.to_thread(checkout.reset)
            if live:
                self.budget.used(key, await quota.measure(checkout.home))
            raise over.stopped() from None
        if live:
            self.budget.used(key, used)
        return result

    async def _room(self) -> None:
        """Refuse (``UNAVAILABLE``) when the data disk is short of its reserve, after evicting
        what idle checkouts can go."""
        if not self.reserve.short():
            return
        for key in self.budget.idle(self.using.__contains__):
            if not self.reserve.short():
                return
            await self._drop(key)
        self.reserve.check()

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _evict(self) -> None:
        """Evict idle checkouts, least recently used first, until within the budget."""
        for key in self.budget.over(self.using.__contains__):
            await self._drop(key)

    async def _drop(self, key: tuple[str, str]) -> None:
        if key in self.using:  # taken since: it stays
            return
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:  # free: taken at once; a request arriving now waits for it
            checkout = self.checkouts.pop(key, None)
            self.over_quota.pop(key, None)
            self.measured.pop(key, None)
            home = self.settings.data_dir / "checkouts" / key[0] / key[1]
            await asyncio.to_thread(_remove_tree, checkout.home if checkout else home)
            self.budget.forget(key)
        log.info("checkout %s/%s evicted (idle, over the checkouts budget or disk reserve)", *key)

    async def _found_checkouts(self) -> None:
        """The checkouts an earlier executor left count against the budget (and are evicted
        first); pinned-version ones it left half-used are removed."""
        checkouts = self.settings.data_dir / "checkouts"
        await asyncio.to_thread(_remove_tree, checkouts / ".at")
        for key, home in await asyncio.to_thread(disk.found, checkouts):
            self.budget.used(key, await quota.measure(home))
        await self._evict()

    def _disk_info(self) -> dict[str, Any]:
        try:
            (free, reserve), (inodes, inode_reserve) = self.reserve.space(), self.reserve.inodes()
            short = free < reserve or inodes < inode_reserve
        except OSError:
            free = reserve = inodes = inode_reserve = -1
            short = False
        return {
            "waiting": self.slots.waiting,
            "checkouts_bytes": self.budget.total,
            "checkouts_budget": self.budget.budget,
            "disk_free_bytes": free,
            "disk_reserve_bytes": reserve,
            "disk_free_inodes": inodes,
            "disk_reserve_inodes": inode_reserve,
            "refusing": "disk_reserve" if short else None,
        }

    async def _approved(
        self, checkout: Checkout, address: Address, origin: Origin, op: str, summary: str
    ) -> None:
        """Refuse a command of another session while the workspace is locked (before it runs:
        the writer would refuse its changes); on a restricted workspace, refuse, or wait for
        the approval of what is asked.

        Raises:
            QuillError: ``DENIED``, ``APPROVAL_REQUIRED``, ``LOCKED``.
        """
        if checkout.manifest.lock is not None:
            lock = LockState(*checkout.manifest.lock)
            if lock.held_by_other(origin.session, datetime.now(UTC)):
                raise lock.refusal()
        if checkout.manifest.trust != "restricted":
            return
        if not checkout.manifest.commands:
            raise QuillError(
                ErrorCode.DENIED,
                f"Commands are not offered on restricted workspace "
                f"{address.tenant}/{address.workspace}",
                {"trust": "restricted"},
            )
        view = self.quill.as_actor(origin.actor, session=origin.session, run=origin.run)
        body = rq.RequestApproval(op=op, summary=summary[:4096])
        await view.request(
            "cmd",
            address.tenant,
            address.workspace,
            "request_approval",
            body,
            rp.ApprovalResult,
            request_id=origin.request_id,
            wait_ms=origin.wait_ms,
        )

    @contextlib.asynccontextmanager
    async def _at(
        self, checkout: Checkout, address: Address, req: rq.Execution
    ) -> AsyncIterator[Checkout]:
        """The checkout to run ``req`` in: the live one, or one built at an older version."""
        latest = checkout.version
        for wanted in (req.version, req.min_version):
            if wanted is not None and wanted > latest:
                raise QuillError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Version {wanted} does not exist (the latest is {latest})",
                    {"version": wanted, "latest_version": latest},
                )
        if req.version is None or req.version == latest:
            yield checkout
            return
        if req.version < checkout.manifest.floor:
            what = f"{address.tenant}/{address.workspace}"
            raise compaction.trimmed(what, req.version, checkout.manifest.floor)
        temp = self.settings.data_dir / "checkouts" / ".at" / self._nuid.next().decode()
        past = self._new_checkout(temp, address)
        try:
            await asyncio.to_thread(past.open)
            await past.sync(req.version)
            yield past
        finally:
            await asyncio.to_thread(_remove_tree, temp)

    def _workdir(self, checkout: Checkout, workdir: str) -> str:
        path = normalize(workdir)
        is_directory = checkout.is_directory(path)  # never through a command's links
        if is_directory is None:
            raise QuillError(
                ErrorCode.FILE_NOT_FOUND, f"Directory not found: {display(path)}", {"path": path}
            )
        if not is_directory:
            raise QuillError(
                ErrorCode.NOT_A_DIRECTORY, f"Not a directory: {display(path)}", {"path": path}
            )
        return path

    def _limits(self, timeout_s: float, checkout: Checkout) -> sandbox.Limits:
        return sandbox.Limits(
            cpu_s=int(timeout_s) + 2,
            memory_bytes=self.config.memory_bytes,
            processes=self.config.processes,
            # no one file bigger than the checkout's whole quota
            file_bytes=min(self.config.file_bytes, checkout.limits.max_checkout_bytes),
        )

    async def _sandboxed(
        self,
        checkout: Checkout,
        spawn: sandbox.Spawn,
        on_output: sandbox.OnOutput | None,
    ) -> sandbox.Outcome:
        try:
            return await self.provider.run(
                checkout.tree, spawn, self._limits(spawn.timeout_s, checkout), on_output
            )
        except sandbox.SandboxError as exc:
            raise QuillError(
                ErrorCode.EXECUTION_FAILED, f"The sandbox could not run the command: {exc}"
            ) from exc

    async def _capture_and_commit(
        self,
        address: Address,
        origin: Origin,
        checkout: Checkout,
        base: int,
        message: str,
        live: Checkout,
    ) -> rp.CapturedChanges:
        t0 = time.perf_counter()
        captured: Captured = await asyncio.to_thread(checkout.capture)
        t1 = time.perf_counter()
        changes = await commit(
            self.quill,
            origin,
            address.tenant,
            address.workspace,
            checkout,
            captured,
            base,
            message,
            self.blobs,
        )
        t2 = time.perf_counter()
        if checkout is live:
            await asyncio.to_thread(checkout.save)
            try:
                await checkout.sync()
            except Exception as exc:  # committed already; the next command syncs it
                log.warning("checkout of %s not synced after the commit: %r", address, exc)
        t3 = time.perf_counter()
        log.info(
            "capture %.1f ms, commit %.1f ms, sync %.1f ms",
            (t1 - t0) * 1e3,
            (t2 - t1) * 1e3,
            (t3 - t2) * 1e3,
        )
        return changes

    # ------------------------------------------------------------------ ops
    async def run(
        self,
        address: Address,
        origin: Origin,
        req: rq.RunCommand,
        job: Job,
        details: dict[str, Any],
    ) -> tuple[int, rp.CommandResult]:
        shown = self.secrets.redact(req.command)[0]  # as logged, audited, approved
        details.update(
            command=shown[:4096],
            workdir=req.workdir,
            env=sorted(req.env or {}),
            summary=f"$ {shown[:500]}",
        )
        async with self._checkout(address) as live, self._at(live, address, req) as checkout:
            await self._approved(live, address, origin, "exec.run", shown)
            workdir = self._workdir(checkout, req.workdir)
            limits = checkout.limits
            timeout_ms = min(req.timeout_ms or DEFAULT_TIMEOUT_MS, limits.max_exec_ms)
            spawn = sandbox.Spawn(
                argv=["bash", "-c", req.command],
                workdir=workdir,
                env=dict(req.env or {}),
                timeout_s=timeout_ms / 1000,
                output_cap=limits.max_output_bytes,
                watch_stdin=True,
                count_left=True,
            )
            recorder = Recorder(
                self.js,
                self.subjects,
                address.tenant,
                address.workspace,
                origin.request_id,
                cap=limits.max_output_bytes,
                config=self.config.output,
                secrets=self.secrets,
            )

            async def on_output(stream: sandbox.StreamName, chunk: bytes) -> None:
                await job.output(stream, chunk)
                await recorder.feed(stream, chunk)

            base = checkout.version
            await asyncio.to_thread(checkout.begin)
            outcome = await self._guarded(checkout, self._sandboxed(checkout, spawn, on_output))
            view = await recorder.finish(added(outcome, recorder.raw))
            changes = await self._capture_and_commit(
                address, origin, checkout, base, f"$ {shown}", live
            )
        details.update(
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            command_ms=outcome.duration_ms,
            stdout_bytes=outcome.stdout_bytes,
            stderr_bytes=outcome.stderr_bytes,
            committed=changes.committed,
            changed=changes.total,
        )
        details.update(background_killed=outcome.left_running, stdin_read=outcome.stdin_read)
        redacted = sorted({*recorder.redacted, *job.redacted})
        if redacted:
            details["redacted"] = redacted
        out, err = view["stdout"], view["stderr"]
        result = rp.CommandResult(
            exit_code=outcome.exit_code,
            stdout=out.head,
            stderr=err.head,
            stdout_truncated=out.omitted > 0,
            stderr_truncated=err.omitted > 0,
            stdout_bytes=outcome.stdout_bytes,
            stderr_bytes=outcome.stderr_bytes,
            duration_ms=outcome.duration_ms,
            timed_out=outcome.timed_out,
            changes=changes,
            command_id=origin.request_id,
            stdout_tail=out.tail,
            stdout_omitted_bytes=out.omitted,
            stdout_omitted_offset=out.offset,
            stderr_tail=err.tail,
            stderr_omitted_bytes=err.omitted,
            stderr_omitted_offset=err.offset,
            output_kept=recorder.ok,
            background_killed=outcome.left_running,
            stdin_read=outcome.stdin_read,
        )
        return changes.version, result

    async def git(
        self, address: Address, origin: Origin, req: rq.GitCommand, details: dict[str, Any]
    ) -> tuple[int, rp.GitResult]:
        details.update(action=req.action, workdir=req.workdir, summary=f"git {req.action}")
        if req.url is not None:
            details["url"] = without_userinfo(req.url)
        async with self._checkout(address) as live, self._at(live, address, req) as checkout:
            await self._approved(live, address, origin, "exec.git", f"git {req.action}")
            limits = checkout.limits
            timeout_ms = min(req.timeout_ms or DEFAULT_TIMEOUT_MS, limits.max_exec_ms)
            runner = sandbox_runner(self.provider, self._limits(timeout_ms / 1000, checkout))
            base = checkout.version
            mutating = req.action not in READ_ONLY_GIT
            if mutating:
                await asyncio.to_thread(checkout.begin)
            message = f"git {req.action}" + (f": {req.message}" if req.message else "")
            try:
                git = run_git(
                    msgspec.structs.replace(req, timeout_ms=timeout_ms),
                    checkout=checkout.tree,
                    run=runner,
                    actor=origin.actor,
                    credentials=self.credentials,
                    output_cap=limits.max_output_bytes,
                    scratch=self.settings.data_dir / "scratch",
                )
                result = await self._guarded(checkout, git)
            except quota.Stopped:
                raise  # nothing of it is kept
            except QuillError:
                if mutating:  # what git did before failing (an index update) is kept too
                    await self._capture_and_commit(address, origin, checkout, base, message, live)
                raise
            changes = None
            if mutating:
                changes = await self._capture_and_commit(
                    address, origin, checkout, base, message, live
                )
        details.update(committed=bool(changes and changes.committed))
        version = changes.version if changes is not None else base
        return version, msgspec.structs.replace(result, changes=changes)


def added(
    outcome: sandbox.Outcome, seen: dict[rq.OutputStream, int]
) -> dict[rq.OutputStream, bytes]:
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


def without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` masked (it is audited, and may carry a secret)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


async def start_executor(settings: Settings, config: ExecutorConfig) -> Running[Executor]:
    """Connect and start an executor; the result's ``stop`` undoes all of it."""
    nc = await connect_service(settings, "executor")
    executor = Executor(settings, nc, config)
    try:
        await executor.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await executor.stop()
        await nc.close()
        raise

    async def stop() -> None:
        await executor.stop()
        await nc.drain()

    return Running(executor, stop)
