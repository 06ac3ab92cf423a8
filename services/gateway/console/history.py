"""A workspace's history in pages: the timeline, the tree and a file as of any version, a
file's revisions, and the diff between two versions.

The timeline is read newest first by keyset paging on the version (``?before=``): a page is
one ``events`` query of ``PAGE`` events below it, never the whole log. With filters (actor,
run, op, path), pages of ``SCAN_BATCH`` events are scanned down, at most ``SCAN_MAX`` per
request, and the page says how far it got (``older`` goes on from there). The hash chain of
what was read is checked on the way by ``core.chain.link``, the check ``quill verify`` makes of
each event: each follows the one before it (the next version, its ``prev_hash`` that event's
hash; version 1 the zero hash), and the newest event's hash is the workspace's ``last_hash``.
``quill verify`` checks also each payload against its hash and the tree hashes: it reads the
event messages themselves, which the ``events`` query (contents left out) does not return.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from core import chain
from quill.client import Quill, Workspace
from services.gateway.console import render

if TYPE_CHECKING:
    from services.gateway.console import Console

PAGE = 50
SCAN_BATCH = 1000
SCAN_MAX = 20_000
"""Events a filtered timeline page reads at most before it answers what it found."""
TREE_PAGE = 200
DIFF_FILES_MAX = 50
"""Files shown side by side at most (the rest as the unified diff)."""


def number(request: Request, name: str, default: int | None = None) -> int | None:
    """A non-negative integer query parameter (``default`` when absent or not a number)."""
    text = request.query_params.get(name, "").strip()
    return int(text) if text.isdecimal() and len(text) < 17 else default


@dataclass
class Filters:
    actor: str = ""
    run: str = ""
    op: str = ""
    path: str = ""

    @classmethod
    def of(cls, request: Request) -> Filters:
        q = request.query_params
        return cls(*(q.get(k, "").strip()[:1024] for k in ("actor", "run", "op", "path")))

    def query(self, **more: object) -> str:
        """The filters (and ``more``) as a query string."""
        given = {k: v for k, v in asdict(self).items() if v}
        return urlencode(given | more)

    def __bool__(self) -> bool:
        return bool(self.actor or self.run or self.op or self.path)

    def match(self, e: rp.EventSummary) -> bool:
        if self.actor and (e.actor or "") != self.actor:
            return False
        if self.run and (e.run or "") != self.run:
            return False
        if self.op and self.op not in (e.op, e.type, f"cmd.{e.op}"):
            return False
        if self.path:
            prefix = self.path.strip("/") + "/"
            touched = (c.path for c in e.changes)
            return any(p == self.path.strip("/") or p.startswith(prefix) for p in touched)
        return True


@dataclass
class Chain:
    """The hash chain of the events read, each link checked by ``core.chain.link`` (the check
    ``quill verify`` makes): links checked, and the first broken one."""

    links: int = 0
    broken: chain.Broken | None = None
    newest_hash: str | None = None
    """The hash of the newest event read."""
    _newer: rp.EventSummary | None = field(default=None, repr=False)
    """The oldest event of the batch added before (newer than this batch)."""
    forks: dict[int, tuple[rp.EventSummary, tuple[int, str] | None]] = field(
        default_factory=dict, repr=False
    )
    """Fork events read (issue 33), by version, with the event read below each (its version
    and hash). A fork's event at version N continues its *source's* event N (its
    ``prev_hash`` is that event's hash, its version the same): the link is the source's to
    check (``bridge``), the events below it being the source's."""

    @property
    def broken_at(self) -> int | None:
        return None if self.broken is None else self.broken.version

    def add(self, batch: list[rp.EventSummary]) -> None:
        """A batch of events, oldest first, just below those added before."""
        if not batch:
            return
        for older, newer in zip(batch, batch[1:], strict=False):
            self._link(older.version, older.hash, newer)
        if self._newer is not None:
            self._link(batch[-1].version, batch[-1].hash, self._newer)
        if batch[0].version == 1:
            self._link(*chain.GENESIS, batch[0])
        for e in batch:
            if e.type == FORKED and e.version not in self.forks:
                self.forks[e.version] = (e, None)  # the oldest read: none below it read
        self._newer = batch[0]
        self.newest_hash = self.newest_hash or batch[-1].hash

    def _link(self, version: int, digest: str, newer: rp.EventSummary) -> None:
        if newer.type == FORKED:
            self.forks[newer.version] = (newer, (version, digest))
            return
        self.links += 1
        broken = chain.link(version, digest, newer.version, newer.prev_hash)
        if broken is not None and self.broken is None:
            self.broken = broken

    async def bridge(self, ws: Workspace, layers: list[str]) -> None:
        """Check each fork event read against its source's event at that version: the same
        hash as its ``prev_hash``, and following the event read below it. The source is the
        layer (``forked_from``, nearest first) whose event there has that hash: an event's
        hash names one event, so no other layer's can pass for it."""
        sdk = Quill.of(ws)
        for version, (fork, below) in sorted(self.forks.items(), reverse=True):
            source = None
            for name in layers:
                try:
                    page = await sdk.workspace(f"{ws.tenant}/{name}").events(
                        after=version - 1, limit=1
                    )
                except QuillError as exc:
                    if exc.code != ErrorCode.WORKSPACE_NOT_FOUND:
                        raise
                    continue
                found = [e for e in page.events if e.version == version]
                if found and found[0].hash == fork.prev_hash:
                    source = found[0]
                    break
            self.links += 1
            if source is None:
                self.broken = self.broken or chain.Broken(
                    version,
                    "Hash chain broken: the fork's event continues no event of its source "
                    f"at version {version}",
                    {"prev_hash": fork.prev_hash},
                )
                continue
            if below is not None:
                self._link(*below, source)


FORKED = "workspace_forked"


@dataclass
class Timeline:
    rows: list[rp.EventSummary]
    older: int | None
    """``before`` of the next page (None: no older events)."""
    scanned_to: int
    chain: Chain


async def read_timeline(ws: Workspace, before: int, filters: Filters) -> Timeline:
    rows: list[rp.EventSummary] = []
    chain = Chain()
    top = before - 1
    budget = SCAN_MAX if filters else PAGE
    read = 0
    older: int | None = None
    while top >= 1 and read < budget:
        n = min(SCAN_BATCH if filters else PAGE, top)
        page = await ws.events(after=top - n, limit=n)
        batch = [e for e in page.events if e.version <= top]
        if not batch:
            break
        chain.add(batch)
        read += len(batch)
        for e in reversed(batch):
            if filters.match(e):
                rows.append(e)
                if len(rows) == PAGE:
                    older = e.version
                    break
        if older is not None:
            break
        top = batch[0].version - 1
    if older is None and top >= 1 and read >= budget:
        older = top + 1
    if chain.forks:  # a fork's layers: in the tree's head (one entry asked, no content)
        head = (await ws.tree(limit=1, contents=False)).head
        await chain.bridge(ws, head.forked_from if head is not None else [])
    return Timeline(rows, older, top + 1 if older is None else older, chain)


async def timeline(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    info = await ws.info()
    latest = info.version
    before = min(number(request, "before", latest + 1) or latest + 1, latest + 1)
    filters = Filters.of(request)
    t = await read_timeline(ws, before, filters)
    head_ok = None  # the newest event's hash is the workspace's last hash
    if before == latest + 1 and t.chain.newest_hash is not None:
        head_ok = t.chain.newest_hash == info.last_hash
    context = {
        "info": info,
        "t": t,
        "filters": filters,
        "before": before,
        "latest": latest,
        "head_ok": head_ok,
        "live": before == latest + 1 and not filters,
    }
    return c.page(request, "timeline.html", context)


def _version(request: Request, latest: int) -> int:
    v = number(request, "v", latest) or latest
    return max(1, min(v, latest))


def _path(request: Request, default: str = ".") -> str:
    return request.query_params.get("path", default).strip()[:4096] or default


def crumbs(path: str) -> list[tuple[str, str]]:
    """``a/b/c`` → ``[("a", "a"), ("b", "a/b"), ("c", "a/b/c")]``."""
    parts = [p for p in path.strip("/").split("/") if p and p != "."]
    return [(p, "/".join(parts[: i + 1])) for i, p in enumerate(parts)]


async def tree(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    latest = (await ws.info()).version
    v, path = _version(request, latest), _path(request)
    after = request.query_params.get("after") or None
    listing = await ws.list(path, version=v, after=after, limit=TREE_PAGE)
    context = {"v": v, "latest": latest, "path": path, "crumbs": crumbs(path), "listing": listing}
    return c.page(request, "tree.html", context)


async def file(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    latest = (await ws.info()).version
    v, path = _version(request, latest), _path(request, "")
    if not path:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Which file? (?path=)")
    content = await ws.read(path, version=v)
    if content.kind != "file":
        raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {path}", {"path": path})
    lines = [] if content.content is None else render.highlight_lines(content.content, path)
    context = {
        "v": v,
        "latest": latest,
        "path": path,
        "crumbs": crumbs(path),
        "content": content,
        "lines": lines,
    }
    return c.page(request, "file.html", context)


async def file_history(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    path = _path(request, "")
    if not path:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Whose history? (?path=)")
    page = await ws.history(path, limit=PAGE, before=number(request, "before"), follow=True)
    older = page.revisions[-1].version if page.truncated and page.revisions else None
    context = {
        "path": path,
        "crumbs": crumbs(path),
        "page": page,
        "older": older,
        "older_path": page.next_path or path,
    }
    return c.page(request, "history.html", context)


@dataclass
class ShownFile:
    path: str
    change: str
    binary: bool
    lines: list[render.Line]
    hunks: list[list[render.Row]]


async def diff(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    latest = (await ws.info()).version
    to = max(0, min(number(request, "to", latest) or latest, latest))
    frm = max(0, min(number(request, "from", max(to - 1, 0)) or 0, to))
    path = request.query_params.get("path", "").strip()[:4096] or None
    split = request.query_params.get("mode") == "split"
    d = await ws.diff(frm, to, path)
    shown: list[ShownFile] = []
    for i, f in enumerate(d.files):
        hunks: list[list[render.Row]] = []
        if split and not f.binary and i < DIFF_FILES_MAX:
            old = "" if f.change == "added" else await ws.read_text(f.path, version=frm)
            new = "" if f.change == "deleted" else await ws.read_text(f.path, version=to)
            hunks = render.side_by_side(old, new, f.path)
        lines = [] if hunks else render.unified(f.diff)
        shown.append(ShownFile(f.path, f.change, f.binary, lines, hunks))
    context = {
        "frm": frm,
        "to": to,
        "latest": latest,
        "path": path or "",
        "split": split,
        "d": d,
        "files": shown,
    }
    return c.page(request, "diff.html", context)
