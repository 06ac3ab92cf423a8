"""Committing what a command changed: one ``apply`` on the version it ran against.

Contents travel inline in the request while they fit a budget; larger ones (and the overflow)
are stored in ``WS_BLOBS`` first and named by sha256, so a change set of any size within the
workspace's limits is one event. Paths changed meanwhile by someone else are conflicts: the
writer commits the rest (``on_conflict: skip``).

With registered secrets (``core/secrets.py``), a path whose name holds one is not
committed (it is reported skipped, its name redacted), nor a loose git object whose inflated
content holds one (a commit message made in a command: zlib hides it from the writer's
redaction); the contents stored in ``WS_BLOBS`` are redacted first.

Every apply carries the paths the command's tree holds uncommitted (``uncommitted``); a
command that changed nothing sends an apply of them alone when they differ from the set the
log records, so the file tools can say why such a path is not there (``contracts.uncommitted``).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections import Counter

from contracts import hashing
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import UncommittedPath
from contracts.limits import MAX_MESSAGE_BYTES
from contracts.subjects import CHANGES_SUFFIX, Origin
from contracts.uncommitted import capped
from core.secrets import NO_SECRETS, Secrets
from infra.blobs import INLINE_MAX, Blobs, WorkspaceBlobs
from infra.concurrent import bounded_gather
from infra.exec.capture import Captured
from infra.exec.checkout import Checkout
from infra.secret_registry import secrets_from_env
from quill.client import Quill

REQUEST_BUDGET = MAX_MESSAGE_BYTES // 2
"""Content bytes (as encoded) an apply request carries inline; the rest goes by blob."""
SHOWN = 100
"""Paths listed in a result (the total says how many)."""
MAX_SKIPPED = 1000
"""Skipped paths listed in a result (a command making a million bad names gets an answer)."""
GIT_OBJECT = re.compile(r"(^|/)\.git/objects/[0-9a-f]{2}/[0-9a-f]{38}$")
INFLATE_MAX = 64 * 1024 * 1024
"""Most bytes of one loose git object inflated to look for a secret."""


def withhold(captured: Captured, secrets: Secrets) -> None:
    """Take out of ``captured`` what would carry a registered secret into the log: a path
    whose name holds one, a loose git object whose inflated content does. Each is reported
    skipped, its name redacted; ignored paths are reported redacted."""
    if not secrets:
        return
    captured.skipped = [(secrets.redact(p)[0], r) for p, r in captured.skipped]
    captured.kept = {k: (secrets.redact(p)[0], r) for k, (p, r) in captured.kept.items()}
    kept: list[rq.ApplyItem] = []
    for item in captured.changes:
        ids = secrets.find(item.path)
        if not ids and isinstance(item, rq.PutChange) and GIT_OBJECT.search(item.path):
            data = captured.contents[item.path]
            try:
                inflated = zlib.decompressobj().decompress(data, INFLATE_MAX)
            except zlib.error:
                inflated = b""
            ids = secrets.redact_bytes(inflated)[1]
        if ids:
            reason = f"holds a registered secret ({', '.join(ids)}): not committed"
            shown = secrets.redact(item.path)[0]
            captured.skipped.append((shown, reason))
            captured.kept[item.path] = (shown, reason)
            if isinstance(item, rq.PutChange):  # not tried again until it changes
                captured.local[item.path] = captured.sigs[item.path][2]
        else:
            kept.append(item)
    captured.changes = kept
    captured.ignored = [(secrets.redact(p)[0], why) for p, why in captured.ignored]
    captured.warnings = [secrets.redact(w)[0] for w in captured.warnings]


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


async def pack(
    captured: Captured, blobs: WorkspaceBlobs, secrets: Secrets = NO_SECRETS
) -> list[rq.ApplyItem]:
    """The change set with each put's content inline or stored in the workspace's namespace of
    WS_BLOBS (redacted) and named."""
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
            if secrets:  # never a secret in WS_BLOBS (the writer redacts what is inline)
                data, ids = secrets.redact_bytes(data)
                digest = hashing.content_sha256(data) if ids else digest
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
    secrets = secrets_from_env()
    withhold(captured, secrets)
    skipped = [rp.SkippedPath(path=p, reason=r) for p, r in captured.skipped[:MAX_SKIPPED]]
    ignored = [p for p, _ in captured.ignored[:SHOWN]]
    reasons = dict(Counter(why for _, why in captured.ignored))

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
            ignored_total=len(captured.ignored),
            ignored_reasons=reasons,
            warnings=captured.warnings[:SHOWN],
        )

    left = left_uncommitted(captured, checkout)
    if not captured.changes and left is None:
        checkout.committed(captured, set(), base)
        return result(False, base, [], [])
    view = quill.as_actor(origin.actor, session=origin.session, run=origin.run)
    own = blobs.of(tenant, workspace)
    request = rq.ApplyChanges(
        base_version=base,
        changes=await pack(captured, own, secrets),
        on_conflict="skip",
        message=message[:4096],
        uncommitted=left,
    )
    apply_id = changes_id(origin.request_id)
    try:
        version, applied = await view.send(tenant, workspace, request, request_id=apply_id)
    except QuillError as exc:
        checkout.reset()  # its tree holds changes the log does not: start over from the log
        if exc.code == ErrorCode.WORKSPACE_NOT_FOUND:  # purged while the command ran
            await own.remove([c.blob for c in request.changes if isinstance(c, rq.PutChange)])
        return result(False, base, [], [], error=f"{exc.code}: {exc.message}")
    checkout.committed(captured, set(applied.applied), base)
    made = applied.committed or applied.uncommitted_recorded
    committed_version = version if made and version else base
    return result(applied.committed, committed_version, applied.applied, applied.conflicts)


def left_uncommitted(captured: Captured, checkout: Checkout) -> list[UncommittedPath] | None:
    """The paths the command's tree holds uncommitted, to record with its changes (the writer
    records them when they differ from the set recorded); with no change, only when they
    differ from the set the log records (``contracts.uncommitted``)."""
    left = capped([UncommittedPath(path=p, reason=r) for p, r in captured.present])
    if captured.changes:
        return left
    recorded = {p: r.reason for p, r in checkout.manifest.uncommitted.items()}
    return None if {u.path: u.reason for u in left} == recorded else left
