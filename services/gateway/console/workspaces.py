"""The workspaces page: a tenant's workspaces from ``qry.workspaces`` (the listing REST's
``GET /v1/workspaces`` makes, ``services/gateway/access.py: listing``), filtered by a name prefix,
sorted, keyset paged, and kept up to date by server-sent events.

Which tenant: the principal's own; a principal that reaches ``anywhere`` (no tokens: loopback
only) names any tenant (``?tenant=``; without it, ``/ui/`` opens on the one tenant that has
workspaces, or lists them to pick one: ``tenants.py``), and its workspaces link as ``tenant:name``
(``Console.workspace``). Sorted by name, a page is one ``qry.workspaces`` page after the last
name shown. Sorted by anything else (version, files, size, last change), up to ``SORT_MAX``
workspaces are read and sorted, and the next page starts after the last ``(key, name)`` shown
(the cursor ``after``), so a page is still a key, never an offset. Pending approvals are
counted for restricted workspaces only (no other has any): one ``approvals`` query each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from nats.aio.msg import Msg
from starlette.requests import Request
from starlette.responses import Response

from contracts import codec
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import WorkspaceUpdated
from contracts.subjects import check_id
from quill.client import Workspace
from services.gateway.access import Principal
from services.gateway.console import tenants
from services.gateway.console.gate import PREFIX
from services.gateway.console.live import Heard, follow, message, sse
from services.gateway.reach import listing

if TYPE_CHECKING:
    from services.gateway.console import Console

PAGE = 50
SORT_MAX = 5000
"""Workspaces read at most to sort by anything but the name."""
SORTS: dict[str, Any] = {
    "name": None,
    "version": lambda w: w.version,
    "files": lambda w: w.files,
    "size": lambda w: w.total_bytes,
    "updated": lambda w: w.updated.timestamp(),
}


@dataclass
class Row:
    w: rp.WorkspaceSummary
    link: str
    """The workspace as the console's URLs name it (``name``, or ``tenant:name``)."""
    pending: int | None
    """Waiting approvals (None: not restricted, so none)."""


@dataclass
class Query:
    tenant: str
    prefix: str
    sort: str
    after: str
    """The last row of the previous page: its name, or ``key|name`` when not sorted by name."""

    @classmethod
    def of(cls, principal: Principal, request: Request, tenant: str | None = None) -> Query:
        """The page's query (``tenant``: the one to show when the URL names none)."""
        q = request.query_params
        tenant = tenant or principal.tenant
        if principal.anywhere and q.get("tenant", "").strip():
            tenant = check_id("tenant", q.get("tenant", "").strip())
        prefix = q.get("prefix", "").strip()[:64]
        sort = q.get("sort", "name")
        return cls(tenant, prefix, sort if sort in SORTS else "name", q.get("after", "")[:200])

    def url(self, **more: str) -> str:
        given = {"tenant": self.tenant, "prefix": self.prefix, "sort": self.sort} | more
        return urlencode({k: v for k, v in given.items() if v and (k, v) != ("sort", "name")})


@dataclass
class Listing:
    rows: list[Row]
    next: str | None
    capped: bool
    """Sorted by other than the name, and only the first ``SORT_MAX`` were read."""


async def read(c: Console, principal: Principal, q: Query) -> Listing:
    """A page of the query's workspaces, as ``principal`` may list them."""
    as_tenant = dataclasses.replace(principal, tenant=q.tenant)  # anywhere only (Query.of)
    prefix = q.prefix or None
    capped = False
    if q.sort == "name":
        page = await listing(c.access, as_tenant, q.after or None, PAGE, prefix)
        found, more = page.workspaces, page.next
    else:
        key = SORTS[q.sort]
        every: list[rp.WorkspaceSummary] = []
        after: str | None = None
        while len(every) < SORT_MAX:
            page = await listing(c.access, as_tenant, after, 1000, prefix)
            every += page.workspaces
            if (after := page.next) is None:
                break
        capped = after is not None
        every.sort(key=lambda w: (-key(w), w.workspace))  # largest, newest first
        if q.after:
            k, _, name = q.after.partition("|")
            cut = (-float(k), name) if _is_number(k) else None
            every = [w for w in every if cut is None or (-key(w), w.workspace) > cut]
        found = every[:PAGE]
        more = f"{key(found[-1])}|{found[-1].workspace}" if len(every) > PAGE else None
    rows = [
        Row(w, w.workspace if q.tenant == principal.tenant else f"{q.tenant}:{w.workspace}", None)
        for w in found
    ]
    for row in rows:
        if row.w.trust != "full":
            row.pending = len((await _listed(c, principal, q, row.w.workspace).approvals()).pending)
    return Listing(rows, more, capped)


def _listed(c: Console, principal: Principal, q: Query, name: str) -> Workspace:
    """A workspace the listing of ``q`` named (so ``principal`` reaches it), never created
    on the way (``Access.workspace`` creates: a purged one would come back)."""
    return c.access.quill.as_actor(principal.actor).workspace(f"{q.tenant}/{name}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _context(principal: Principal, q: Query, found: Listing) -> dict[str, Any]:
    sorts = {"sorts": list(SORTS), "sort_max": SORT_MAX}
    return {"q": q, "found": found, "anywhere": principal.anywhere, "tenant": q.tenant} | sorts


async def page(c: Console, request: Request) -> Response:
    principal = c.principal(request)
    only = None
    if principal.anywhere and not request.query_params.get("tenant", "").strip():
        quill = c.access.quill
        known = await tenants.with_workspaces(quill.nc, quill.subjects, principal.name)
        if known is not None and len(known) > 1:  # which one? (tenants.py)
            context = {"tenants": known, "tenant": None, "shown_max": tenants.SHOWN_MAX}
            return c.page(request, "tenants.html", context)
        only = known[0].name if known else None  # the one tenant with workspaces
    q = Query.of(principal, request, only)
    found = await read(c, principal, q)
    return c.page(request, "workspaces.html", _context(principal, q, found))


async def live(c: Console, request: Request) -> Response:
    """The page's rows again after each change to a workspace of the tenant (a pinned
    principal's own workspace only)."""
    principal = c.principal(request)
    q = Query.of(principal, request)
    nc = c.access.quill.nc
    subjects = c.access.quill.subjects
    watched = principal.workspace if principal.pinned else "*"
    rows = c.templates.get_template("workspaces_rows.html")

    async def render() -> str:
        found = await read(c, principal, q)
        html = rows.render(_context(principal, q, found), prefix=PREFIX)
        return message("rows", html)

    async def now() -> AsyncIterator[str]:
        yield await render()  # what changed between the page and the subscription

    async def each(msg: Msg, heard: Heard) -> AsyncIterator[str]:
        update = codec.decode(msg.data, WorkspaceUpdated)
        name = msg.subject.rsplit(".", 1)[-1]
        try:  # the listing's replica has applied at least this version
            body = rq.WorkspaceInfoQuery(min_version=update.version)
            await _listed(c, principal, q, name).call(body)
        except QuillError as exc:
            if exc.code != ErrorCode.WORKSPACE_NOT_FOUND:
                raise
        while not heard.queue.empty():  # one page for a burst of changes
            heard.queue.get_nowait()
        yield await render()

    return sse(follow(nc, [subjects.updated(q.tenant, watched)], each, now))
