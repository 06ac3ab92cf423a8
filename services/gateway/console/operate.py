"""The pages an operator acts from: the approvals queue (and its decisions, each followed by
what came of it: Quill carries an approved request out itself), the runs, and the audit
search."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.events import AuditRecord
from quill.client import Quill
from services.gateway.console.gate import PREFIX
from services.gateway.console.history import number

if TYPE_CHECKING:
    from services.gateway.console import Console

RUNS_SCAN = 2000
"""Recent events the runs page reads for runs."""
RUNS_MAX = 50
AUDIT_SCAN = 50_000
"""Audit records one search reads at most."""
AUDIT_SHOWN = 200
DECISION_ACTOR_MAX = 128


async def approvals(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    info = await ws.info()
    pending = (await ws.approvals()).pending
    decided = request.query_params.get("decided", "")[:200]
    return c.page(request, "approvals.html", {"info": info, "pending": pending, "decided": decided})


async def decide(c: Console, request: Request) -> Response:
    """Approve or deny, recorded as the logged-in principal's decision."""
    form = await c.csrf.checked_form(request)
    ws = await c.workspace(request)
    approval = request.path_params["approval"]
    choice = form.get("decision")
    if choice not in ("approve", "deny"):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "decision must be approve or deny")
    reason = form.get("reason")
    note = reason.strip()[:1000] or None if isinstance(reason, str) else None
    principal = c.principal(request)
    actor = f"{principal.actor} via console"[:DECISION_ACTOR_MAX]
    target = Quill.of(ws).as_actor(actor).workspace(f"{ws.tenant}/{ws.name}")
    where = f"{PREFIX}/w/{request.path_params['ws']}/approvals"
    try:
        if choice == "approve":
            await target.approve(approval, note)
        else:
            await target.deny(approval, note)
    except QuillError as exc:
        if exc.code not in (ErrorCode.CONFLICT, ErrorCode.FILE_NOT_FOUND):
            raise
        outcome = f"{approval}: {exc.message}"
        return RedirectResponse(f"{where}?{urlencode({'decided': outcome})}", status_code=303)
    return RedirectResponse(f"{where}/{quote(approval, safe='')}", status_code=303)


async def approval(c: Console, request: Request) -> Response:
    """One approval and what came of it: while it waits, the change it would make (a write's,
    a merge's diff); then the version its change committed, or its command's exit code and
    page, or its error; while it is carried out the page asks again."""
    ws = await c.workspace(request)
    status = await ws.approval(request.path_params["approval"])
    outcome = status.outcome
    result = outcome.result if outcome is not None and outcome.result is not None else {}
    changes = result.get("changes") if isinstance(result.get("changes"), dict) else None
    preview = None
    if status.state == "pending":  # what it would change: as the list of those waiting shows
        waiting = (await ws.approvals()).pending
        preview = next((a.preview for a in waiting if a.approval_id == status.approval_id), None)
    context = {
        "s": status,
        "preview": preview,
        "outcome": outcome,
        "command": status.op.startswith("exec."),
        "exit_code": result.get("exit_code"),
        "committed": changes.get("version") if changes and changes.get("committed") else None,
    }
    return c.page(request, "approval.html", context)


@dataclass
class RunRow:
    run: str
    events: int
    info: rp.RunInfo | None = None


async def runs(c: Console, request: Request) -> Response:
    """The runs whose events are among the last ``RUNS_SCAN`` (newest first), or one by id."""
    ws = await c.workspace(request)
    latest = (await ws.info()).version
    found: dict[str, RunRow] = {}
    top = latest
    while top >= 1 and latest - top < RUNS_SCAN and len(found) < RUNS_MAX:
        n = min(1000, top)
        page = await ws.events(after=top - n, limit=n)
        batch = [e for e in page.events if e.version <= top]
        if not batch:
            break
        for e in reversed(batch):
            if e.run and (e.run in found or len(found) < RUNS_MAX):
                found.setdefault(e.run, RunRow(e.run, 0)).events += 1
        top = batch[0].version - 1
    asked = request.query_params.get("run", "").strip()[:128]
    rows = list(found.values())
    if asked and asked not in found:
        rows.insert(0, RunRow(asked, 0))
    for row in rows:
        try:
            row.info = await ws.run_info(row.run)
        except QuillError as exc:
            if exc.code not in (ErrorCode.RUN_NOT_FOUND, ErrorCode.INVALID_ARGUMENT):
                raise
    return c.page(request, "runs.html", {"rows": rows, "asked": asked, "scanned": latest - top})


@dataclass
class AuditQuery:
    actor: str
    op: str
    outcome: str
    code: str
    since: datetime
    TEXTS = ("actor", "op", "outcome", "code")

    @classmethod
    def of(cls, request: Request) -> AuditQuery:
        q = request.query_params
        minutes = number(request, "minutes", 60) or 60
        since = datetime.now(UTC) - timedelta(minutes=min(minutes, 60 * 24 * 366))
        actor, op, outcome, code = (q.get(k, "").strip()[:200] for k in cls.TEXTS)
        return cls(actor, op, outcome, code, since)

    def text(self) -> str:
        """The search (but its time) as a query string."""
        given = {k: getattr(self, k) for k in self.TEXTS if getattr(self, k)}
        return urlencode(given)

    def match(self, r: AuditRecord) -> bool:
        return (
            (not self.actor or (r.actor or "") == self.actor)
            and (not self.op or r.op == self.op)
            and (not self.outcome or r.outcome == self.outcome)
            and (not self.code or (r.error_code or "") == self.code)
        )


async def audit(c: Console, request: Request) -> Response:
    ws = await c.workspace(request)
    query = AuditQuery.of(request)
    shown: deque[AuditRecord] = deque(maxlen=AUDIT_SHOWN)  # the newest matches
    read = 0
    async for record in ws.audit(since=query.since):
        read += 1
        if query.match(record):
            shown.append(record)
        if read >= AUDIT_SCAN:
            break
    context = {
        "records": list(reversed(shown)),
        "q": query,
        "read": read,
        "capped": read >= AUDIT_SCAN,
    }
    context["minutes"] = number(request, "minutes", 60)
    context["query"] = query.text()
    return c.page(request, "audit.html", context)
