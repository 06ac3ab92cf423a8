"""Committing what a command changed: one ``apply`` on the version it ran against.

Contents travel inline in the request while they fit a budget; larger ones (and the overflow)
are stored in ``WS_BLOBS`` first and named by sha256, so a change set of any size within the
workspace's limits is one event. Paths changed meanwhile by someone else are conflicts: the
writer commits the rest (``on_conflict: skip``).
"""

from __future__ import annotations

import hashlib

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import QuillError
from contracts.limits import MAX_MESSAGE_BYTES
from contracts.subjects import CHANGES_SUFFIX, Origin
from quill.client import Quill
from services.common.blobs import INLINE_MAX, Blobs
from services.common.runtime import bounded_gather
from services.executor.checkout import Captured, Checkout

REQUEST_BUDGET = MAX_MESSAGE_BYTES // 2
"""Content bytes (as encoded) an apply request carries inline; the rest goes by blob."""
SHOWN = 100
"""Paths listed in a result (the total says how many)."""


def changes_id(request_id: str) -> str:
    """The request id of the ``apply`` committing what request ``request_id`` changed: on a
    restricted workspace, the writer lets it through on that request's approval."""
    if len(request_id) <= 120:
        return f"{request_id}{CHANGES_SUFFIX}"
    return "x" + hashlib.sha256(request_id.encode()).hexdigest()[:40]


def _inline(path: str, data: bytes, executable: bool) -> tuple[rq.PutChange, int]:
    """A put carrying ``data``: as text when it is UTF-8, else base64; and its encoded size."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return rq.PutChange(path=path, data=data, executable=executable), len(data) * 4 // 3 + 4
    return rq.PutChange(path=path, content=text, executable=executable), len(data) + 16


async def pack(captured: Captured, blobs: Blobs) -> list[rq.ApplyItem]:
    """The change set with each put's content inline or stored in WS_BLOBS and named."""
    items: list[rq.ApplyItem] = []
    uploads: list[tuple[str, bytes]] = []
    budget = REQUEST_BUDGET
    for item in captured.changes:
        if not isinstance(item, rq.PutChange):
            items.append(item)
            continue
        data = captured.contents[item.path]
        digest, executable, _ = captured.sigs[item.path]
        put, size = _inline(item.path, data, executable)
        if len(data) > INLINE_MAX or size > budget:
            uploads.append((digest, data))
            put = rq.PutChange(path=item.path, blob=digest, executable=executable)
        else:
            budget -= size
        items.append(put)
    await bounded_gather([blobs.put(sha, data) for sha, data in uploads], 16)
    return items


async def commit(
    quill: Quill,
    origin: Origin,
    tenant: str,
    workspace: str,
    checkout: Checkout,
    captured: Captured,
    base: int,
    message: str,
    blobs: Blobs,
) -> rp.CapturedChanges:
    """Commit ``captured`` on ``base`` as ``origin`` (who ran the command); fold the outcome
    into the checkout. Nothing committed leaves the checkout to be rebuilt from the log."""
    skipped = [rp.SkippedPath(path=p, reason=r) for p, r in captured.skipped]
    ignored = captured.ignored[:SHOWN]

    def result(
        committed: bool,
        version: int,
        applied: list[str],
        conflicts: list[rp.ChangeConflict],
        error: str | None = None,
    ) -> rp.CapturedChanges:
        changed = sorted(applied)
        return rp.CapturedChanges(
            base_version=base,
            committed=committed,
            version=version,
            paths=[
                rp.ChangedPath(path=p, change=c, kind=k)  # type: ignore[arg-type]
                for p in changed[:SHOWN]
                for c, k in [captured.kinds[p]]
            ],
            total=len(changed),
            conflicts=conflicts,
            skipped=skipped,
            ignored=ignored,
            error=error,
        )

    if not captured.changes:
        checkout.committed(captured, set(), base)
        return result(False, base, [], [])
    view = quill.as_actor(origin.actor, session=origin.session, run=origin.run)
    request = rq.ApplyChanges(
        base_version=base,
        changes=await pack(captured, blobs),
        on_conflict="skip",
        message=message[:4096],
    )
    apply_id = changes_id(origin.request_id)
    try:
        version, applied = await view.request(
            "cmd", tenant, workspace, "apply", request, rp.ChangesApplied, request_id=apply_id
        )
    except QuillError as exc:
        checkout.reset()  # its tree holds changes the log does not: start over from the log
        return result(False, base, [], [], error=f"{exc.code}: {exc.message}")
    checkout.committed(captured, set(applied.applied), base)
    committed_version = version if applied.committed and version else base
    return result(applied.committed, committed_version, applied.applied, applied.conflicts)
