"""A bridge: wiring only. ``quill attach DIR --as NAME`` runs one (``attach``).

Start: connect; ask a writer to claim ``<tenant>/<name>`` (``infra/claims.py``: it refuses a
name the log holds, a server workspace, or another live bridge holds, and counts the tenant's
quota); wait until every service that counts claims (writer, readers, executors: ``seen``)
counts one more of the tenant's than before, so that from then on the bridge's answer is the
only one; then subscribe to the workspace's ``cmd``, ``qry`` and ``exec`` subjects and renew
the claim every ``RENEW_S``. Stop: unsubscribe, answer what is in progress ``UNAVAILABLE``,
release the claim (the servers answer again, ``WORKSPACE_NOT_FOUND``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects, check_id
from infra import bridges, bus, claims
from infra.busy import Dropped
from infra.runtime import Auditor
from services.bridge.approvals import DEFAULT_TIMEOUT_S, Approver, Terminal
from services.bridge.changes import LocalChanges
from services.bridge.commands import LocalCommands
from services.bridge.folder import Folder
from services.bridge.handlers import Handlers, Local
from services.bridge.policy import Policy
from services.bridge.queries import LocalQueries

log = logging.getLogger("quill.bridge")

SEEN_TIMEOUT_S = 10.0
"""Longest the bridge waits for the services to see its claim before serving anyway."""


@dataclass(frozen=True)
class BridgeConfig:
    directory: Path
    workspace: str
    client: str
    nats_url: str
    tenant: str = "default"
    trust: str = "restricted"
    policy: Policy = field(default_factory=Policy)
    ask_timeout_s: float = DEFAULT_TIMEOUT_S
    root: str = "ws"


class Bridge:
    """Serves one folder as ``<tenant>/<workspace>``."""

    def __init__(self, config: BridgeConfig, terminal: Terminal | None = None) -> None:
        self.config = config
        self.subjects = Subjects(config.root)
        self.terminal = terminal or Terminal()
        self.instance = bus.instance_id("bridge")
        self.folder = Folder(config.directory)
        self.path = os.path.abspath(config.directory)
        """The folder as its user named it (made absolute; links not resolved)."""
        self.uri = f"{config.client}:{self.path}"
        self.lost = asyncio.Event()
        """Set when the claim was lost (another bridge took it after it lapsed)."""
        self._nc: NATS | None = None
        self._claimed = False
        self._subs: list[Subscription] = []
        self._renewer: asyncio.Task[None] | None = None
        self._handlers: Handlers | None = None

    @property
    def name(self) -> str:
        return f"{self.config.tenant}/{self.config.workspace}"

    def info(self) -> dict[str, Any]:
        return {
            "workspace": self.name,
            "uri": self.uri,
            "trust": self.config.trust,
            "version": self.folder.version,
        }

    async def start(self) -> None:
        """Claim the name and serve.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` (name, folder), ``ALREADY_EXISTS`` (a server
                workspace, or another bridge's), ``UNAVAILABLE`` (no NATS).
        """
        config = self.config
        check_id("tenant", config.tenant)
        check_id("workspace", config.workspace)
        if not self.folder.root.is_dir():
            raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Not a directory: {config.directory}")
        try:
            nc = self._nc = await bus.connect(
                config.nats_url, name="quill-bridge", on_dropped=Dropped("bridge")
            )
        except ConnectionError as exc:
            raise QuillError(ErrorCode.UNAVAILABLE, str(exc)) from None
        before = await claims.seen(nc, self.subjects, config.tenant)
        await self._claim()
        self._claimed = True
        try:
            await self._serve(nc, before)
        except BaseException:
            await self._release()
            raise
        self._renewer = asyncio.create_task(self._renew())
        log.info("bridge %s serving %s as %s", self.instance, self.uri, self.name)

    async def _claim(self) -> None:
        """Claim the name, or renew the claim (``infra/claims.py``)."""
        assert self._nc is not None
        config = self.config
        await claims.claim(
            self._nc,
            self.subjects,
            config.tenant,
            config.workspace,
            self.instance,
            config.client,
            self.path,
        )

    async def _release(self) -> None:
        assert self._nc is not None
        tenant, workspace = self.config.tenant, self.config.workspace
        await claims.release(self._nc, self.subjects, tenant, workspace, self.instance)

    async def _serve(self, nc: NATS, before: dict[str, int]) -> None:
        config, subjects = self.config, self.subjects
        auditor = Auditor(nc, subjects, "bridge", self.instance)
        local = Local(
            tenant=config.tenant,
            workspace=config.workspace,
            uri=self.uri,
            folder=self.folder,
            queries=LocalQueries(
                self.folder, config.tenant, config.workspace, config.trust, self.uri
            ),
            changes=LocalChanges(self.folder, config.tenant, config.workspace, config.trust),
            commands=LocalCommands(self.folder, self.uri),
            approver=Approver(
                config.trust, config.policy, self.terminal, self.uri, config.ask_timeout_s
            ),
        )
        handlers = self._handlers = Handlers(nc, subjects, auditor, local)
        self._subs += await bus.serve_ping(nc, subjects, "bridge", self.instance, self.info)
        await self._await_services(nc, before)
        t, w = config.tenant, config.workspace
        self.terminal.start()
        self._subs += [
            await bus.serve(nc, subjects.qry(t, w, "*"), None, handlers.on_query()),
            await bus.serve(nc, subjects.cmd(t, w, "*"), None, handlers.on_command()),
            # on a cluster the servers map commands to a partition (contracts/subjects.py)
            await bus.serve(nc, subjects.cmd_mapped(t, w), None, handlers.on_command()),
            await bus.serve(nc, subjects.exec(t, w, "*"), None, handlers.on_exec()),
        ]
        await nc.flush()

    async def _await_services(self, nc: NATS, before: dict[str, int]) -> None:
        """Wait until every service has seen our claim (``claims.await_seen``), at most
        ``SEEN_TIMEOUT_S``."""
        behind = await claims.await_seen(
            nc, self.subjects, self.config.tenant, before, SEEN_TIMEOUT_S
        )
        if behind:
            log.warning("%s have not seen the claim yet; serving anyway", behind)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(bridges.RENEW_S)
            try:
                await self._claim()
            except QuillError as exc:
                if exc.code != ErrorCode.ALREADY_EXISTS:  # no writer now: the claim lasts
                    log.warning("renewing the claim on %s failed: %s", self.name, exc.message)
                    continue  # CLAIM_TTL_S
                self.terminal.say(f"[quill] the claim on {self.name} was lost: stopping")
                self.lost.set()
                return
            except Exception as exc:  # a connection blip: the claim lasts CLAIM_TTL_S
                log.warning("renewing the claim on %s failed: %s", self.name, exc)

    async def stop(self) -> None:
        """Stop serving and release the claim."""
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self._handlers is not None:
            await self._handlers.stop()
        if self._claimed and not self.lost.is_set():
            await self._release()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()


async def attach(config: BridgeConfig) -> int:
    """Serve until SIGINT or SIGTERM (0) or until the claim is lost (1).

    Raises:
        QuillError: the bridge could not start.
    """
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before "ready": a signal after it is ours
        loop.add_signal_handler(sig, stopping.set)
    bridge = Bridge(config)
    await bridge.start()
    trust = config.trust + (" with a policy" if config.policy.rules else "")
    bridge.terminal.say(f"quill attach ready {bridge.name} = {bridge.uri} (trust {trust})")
    waiters = [asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(bridge.lost.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await bridge.stop()
    bridge.terminal.say(f"quill attach stopped: {bridge.name} released")
    return 1 if bridge.lost.is_set() else 0
