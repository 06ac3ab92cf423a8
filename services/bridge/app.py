"""A bridge: wiring only. ``quill attach DIR --as NAME`` runs one (``attach``).

Start: connect; refuse a name the log holds (a server workspace) or another live bridge holds;
claim ``<tenant>/<name>`` in WS_BRIDGES; wait until every service that reports claims in its
ping (writer, readers, executors) counts one claim more than before, so that from then on the
bridge's answer is the only one; then subscribe to the workspace's ``cmd``, ``qry`` and
``exec`` subjects and renew the claim every ``RENEW_S``. Stop: unsubscribe, answer what is in
progress ``UNAVAILABLE``, release the claim (the servers answer again, ``WORKSPACE_NOT_FOUND``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects, check_id
from infra import bridges, bus
from infra import log as eventlog
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
PING_WINDOW_S = 0.3
"""How long the replies to one ping are gathered."""


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
        self._kv: KeyValue | None = None
        self._revision = 0
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
        js = nc.jetstream()
        await self._refuse_server_workspace()
        before = await self._pings(nc)
        kv = self._kv = await bridges.bucket(js)
        self._revision = await bridges.claim(
            kv, config.tenant, config.workspace, self.instance, config.client, self.path
        )
        try:
            await self._refuse_server_workspace()  # created just before the claim
            await self._serve(nc, before)
        except BaseException:
            await bridges.release(kv, config.tenant, config.workspace)
            raise
        self._renewer = asyncio.create_task(self._renew())
        log.info("bridge %s serving %s as %s", self.instance, self.uri, self.name)

    async def _refuse_server_workspace(self) -> None:
        assert self._nc is not None
        subject = self.subjects.evt(self.config.tenant, self.config.workspace)
        try:
            held = await eventlog.last_seq(self._nc.jetstream(), subject) > 0
        except Exception:  # no WS_EVENTS stream yet: no server workspace either
            held = False
        if held:
            raise QuillError(
                ErrorCode.ALREADY_EXISTS,
                f"{self.name} is a server workspace (its log has events): attach the folder "
                "under another name",
                {"tenant": self.config.tenant, "workspace": self.config.workspace},
            )

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

    async def _pings(self, nc: NATS) -> dict[str, int]:
        """The live claims each service counts (``local_workspaces`` in its ping), by
        instance, from the replies gathered within ``PING_WINDOW_S``."""
        counts: dict[str, int] = {}
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        try:
            await nc.publish(f"{self.subjects.root}.sys.ping", b"", reply=inbox)
            end = time.monotonic() + PING_WINDOW_S
            while (left := end - time.monotonic()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except nats.errors.TimeoutError:
                    break
                pong = json.loads(msg.data)
                if isinstance(pong.get("local_workspaces"), int):
                    counts[str(pong.get("instance"))] = pong["local_workspaces"]
        finally:
            await sub.unsubscribe()
        return counts

    async def _await_services(self, nc: NATS, before: dict[str, int]) -> None:
        """Wait until every service counts one more claim than ``before`` ours was made (a
        service started since: at least one), or ``SEEN_TIMEOUT_S``."""
        deadline = time.monotonic() + SEEN_TIMEOUT_S
        while True:
            counts = await self._pings(nc)
            behind = [i for i, n in counts.items() if n < before.get(i, 0) + 1]
            if not behind:
                return
            if time.monotonic() > deadline:
                log.warning("%s have not seen the claim yet; serving anyway", behind)
                return

    async def _renew(self) -> None:
        config, kv = self.config, self._kv
        assert kv is not None
        while True:
            await asyncio.sleep(bridges.RENEW_S)
            try:
                self._revision = await bridges.renew(
                    kv,
                    config.tenant,
                    config.workspace,
                    self.instance,
                    config.client,
                    self.path,
                    self._revision,
                )
            except KeyWrongLastSequenceError:
                entry = await kv.get(bridges.key(config.tenant, config.workspace))
                held = _claim(entry.value) if entry.value else None
                if held is not None and held.owner == self.instance:
                    self._revision = int(entry.revision or 0)  # our own renewal, unacknowledged
                    continue
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
        if self._kv is not None and not self.lost.is_set():
            await bridges.release(self._kv, self.config.tenant, self.config.workspace)
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()


def _claim(value: bytes) -> bridges.Claim:
    return msgspec.json.decode(value, type=bridges.Claim)


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
