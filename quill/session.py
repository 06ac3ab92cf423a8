"""Sessions (seed 003): a conversation's primary workspace and the workspaces attached to it,
and which of them a tool call goes to.

The session is its primary workspace: attaching and detaching are events in that
workspace's log (``cmd.attach``/``cmd.detach``), so who attached what, when, is kept like
everything else. Resolution follows the seed's flowchart: a call that names a workspace goes
there; one that names none goes to the primary if it offers the op, else to the first
attached workspace that does, else it fails with ``Tool not found``.

    session = await Session.open(quill, "acme")          # creates acme/s-<id>
    await session.attach("server:/acme/shared-notes")
    await session.attach("macbook:~/dev/app")            # a folder served by `quill attach`
    ws = await session.resolve("exec.run")                # where a command would run
"""

from __future__ import annotations

import hashlib
import re
import time

from contracts import replies as rp
from contracts import requests as rq
from contracts import uris
from contracts.errors import ErrorCode, QuillError
from quill.client import Quill, Workspace

CAPABILITIES_TTL_S = 30.0
"""How long a workspace's offered ops are remembered for resolution."""


class Session:
    def __init__(self, quill: Quill, primary: Workspace) -> None:
        self.quill, self.primary = quill, primary
        self.id = primary.name
        self._offers: dict[str, tuple[float, frozenset[str]]] = {}

    @classmethod
    async def open(cls, quill: Quill, tenant: str, session_id: str | None = None) -> Session:
        """The session ``session_id`` of ``tenant`` (its primary workspace is created if it
        does not exist; a new id is made when none is given)."""
        name = session_id or "s-" + quill._nuid.next().decode().lower()[:20]
        primary = quill.workspace(f"{tenant}/{name}")
        await primary.create(exist_ok=True)
        return cls(quill, primary)

    async def attach(self, uri: str) -> rp.Attached:
        """Attach a workspace: ``server:/<tenant>/<workspace>``, a bridge's
        ``<client>:<path>``, or ``git:<url>`` (cloned first into a new restricted workspace
        of the tenant, through an executor)."""
        parsed = uris.parse(uri)
        target = None
        if parsed.kind == "git":
            target = await self._clone(parsed)
        body = rq.Attach(uri=uri, target=target)
        return await self.primary._cmd(body)

    async def detach(self, uri: str) -> rp.Attached:
        return await self.primary._cmd(rq.Detach(uri=uri))

    async def workspaces(self) -> rp.Attached:
        return await self.primary._qry(rq.AttachedQuery())

    async def resolve(self, op: str, workspace: str | None = None) -> Workspace:
        """The workspace a call of ``op`` (``qry.read``, ``exec.run``...) goes to.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` "Tool not found" when no workspace of the session
                offers it; ``FILE_NOT_FOUND`` for a ``workspace`` the session does not have.
        """
        if workspace:
            return self._named(await self.workspaces(), workspace)
        if op in await self._offered(self.primary):  # the common case: no listing needed
            return self.primary
        for attached in (await self.workspaces()).attached:
            ws = self.quill.workspace(attached.target)
            if op in await self._offered(ws):
                return ws
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Tool not found: no workspace of session {self.id} offers {op}",
            {"op": op, "session": self.id},
        )

    def refresh(self) -> None:
        """Forget what the workspaces offered (after a trust change, say)."""
        self._offers.clear()

    def _named(self, listing: rp.Attached, workspace: str) -> Workspace:
        tenant = self.primary.tenant
        for attached in listing.attached:
            if workspace in (attached.uri, attached.target, attached.target.split("/")[1]):
                return self.quill.workspace(attached.target)
        if workspace in (listing.primary, self.primary.name):
            return self.primary
        if ":" in workspace:
            raise QuillError(
                ErrorCode.FILE_NOT_FOUND,
                f"{workspace} is not attached to session {self.id}",
                {"workspace": workspace},
            )
        name = workspace if "/" in workspace else f"{tenant}/{workspace}"
        return self.quill.workspace(name)

    async def _offered(self, ws: Workspace) -> frozenset[str]:
        key = f"{ws.tenant}/{ws.name}"
        cached = self._offers.get(key)
        if cached is not None and time.monotonic() - cached[0] < CAPABILITIES_TTL_S:
            return cached[1]
        try:
            offers = frozenset((await ws.info()).capabilities)
        except QuillError as exc:
            if exc.retriable:
                raise
            offers = frozenset()  # gone, or not reachable: it offers nothing
        self._offers[key] = (time.monotonic(), offers)
        return offers

    async def _clone(self, uri: uris.Uri) -> str:
        repo = re.sub(r"[^a-z0-9]+", "-", uri.path.lower().rsplit("/", 1)[-1]).strip("-")
        digest = hashlib.sha256(uri.git_url.encode()).hexdigest()[:8]
        name = f"{self.primary.tenant}/git-{repo[:40] or 'repo'}-{digest}"
        ws = self.quill.workspace(name)
        created = await ws.create(exist_ok=True)
        if created.created:
            await ws.git("clone", url=uri.git_url, timeout_ms=600_000)
            await ws.set_trust("restricted")  # seed 003: cloned repositories are untrusted
        return name
