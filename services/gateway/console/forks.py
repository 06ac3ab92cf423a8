"""A workspace's forks page (issue 33): what it was forked from, the forks made of it (the
version each was forked at, how far each side has moved since, a link to each), and a form
that forks it through the op every door uses (``reach.fork``: the same rules as REST and
MCP, a pinned token neither forks nor lists forks); a form like the console's others (CSRF,
same origin). Each fork's row links to its merge preview (``merges.py``: a dry run, its
conflicts, a Merge button through approvals).

What a fork was forked from: its layers' names are the tree head's ``forked_from`` (the first
page of ``qry.tree``, without contents); the version of the nearest is read from that
source's forks listing (``FORKS_READ`` of them at most: past that it is left unsaid).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from services.gateway.console.gate import PREFIX
from services.gateway.reach import fork, forks

if TYPE_CHECKING:
    from services.gateway.console import Console

FORKS_SHOWN = 200
"""Forks the page lists at most (``truncated`` says there are more)."""
FORKS_READ = 1000
"""A source's forks read at most to find the version a fork was forked at."""


@dataclass
class Base:
    """A workspace this one stands on: its console link and the version forked at (None:
    not read)."""

    name: str
    link: str
    version: int | None


def link_of(ws_param: str, name: str) -> str:
    """``name`` (a workspace of the same tenant) as the console's URLs name it: ``tenant:name``
    where the page's own was so named."""
    tenant, sep, _ = ws_param.partition(":")
    return f"{tenant}:{name}" if sep else name


async def lineage(ws: Quill, tenant: str, name: str, ws_param: str) -> list[Base]:
    """What ``tenant/name`` was forked from, nearest first (empty: it is no fork)."""
    head = (await ws.workspace(f"{tenant}/{name}").tree(limit=1, contents=False)).head
    names = head.forked_from if head is not None else []
    bases = [Base(n, link_of(ws_param, n), None) for n in names]
    if bases:
        listed = await ws.workspace(f"{tenant}/{bases[0].name}").forks(limit=FORKS_READ)
        bases[0].version = next((f.version for f in listed.forks if f.workspace == name), None)
    return bases


async def page(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    principal = c.principal(request)
    param = request.path_params["ws"]
    listed: rp.ForkList | None = None
    bases: list[Base] = []
    if not principal.pinned:
        named = f"{ws.tenant}/{ws.name}" if principal.anywhere else ws.name
        listed = await forks(c.access, principal, named, FORKS_SHOWN)
        bases = await lineage(Quill.of(ws), ws.tenant, ws.name, param)
    info = await ws.info()
    context = {
        "info": info,
        "listed": listed,
        "links": {
            f.workspace: link_of(param, f.workspace) for f in (listed.forks if listed else [])
        },
        "bases": bases,
        "may_fork": not principal.pinned,
        "forked": request.query_params.get("forked", "")[:200],
    }
    return c.page(request, "forks.html", context)


async def make(c: Console, request: Request) -> Response:
    """The Fork form: this workspace forked as the form's ``name`` at its ``version`` (empty:
    the latest), then the fork's own forks page."""
    form = await c.csrf.checked_form(request)
    principal = c.principal(request)
    name, version = form.get("name"), form.get("version")
    if not isinstance(name, str) or not isinstance(version, str | None):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "The form is name= and version=")
    version = (version or "").strip()
    if version and not (version.isascii() and version.isdecimal() and len(version) < 17):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "version must be a number (or empty)")
    param = request.path_params["ws"]
    source = param.replace(":", "/", 1)
    done = await fork(c.access, principal, source, name.strip(), int(version) if version else None)
    new = done.workspace.split("/", 1)[1]
    said = f"Forked {done.source} at version {done.version} as {done.workspace}"
    where = f"{PREFIX}/w/{link_of(param, new)}/forks"
    return RedirectResponse(f"{where}?{urlencode({'forked': said})}", status_code=303)
