"""``quill scrub``: take leaked secrets out of a workspace's history (docs/replay.md).

Why one module of ~550 lines: it is one procedure, ``scrub``, whose steps (below: the whole
docstring is its specification) share the rewrite's state (``_Rewrite``); redaction
(``scrub_redact.py``) and the stores beside the log (``scrub_stores.py``) are apart already.

A secret that reached the log (before redaction covered where it leaked, or before it was
registered) cannot be redacted in place: the log is a hash chain. Scrubbing rewrites it:

1. The whole log is read and checked (hash chain, tree hashes) like ``quill verify``. A log
   that starts at a compaction (``max_versions``) starts from its manifest, which is
   redacted too (``scrub_redact.py``).
2. Every event is redacted with the registry (``core.secrets``: each occurrence
   becomes ``[REDACTED:<id>]``): every string it holds (paths, messages, actors, sessions,
   runs, results...) and every content, inline or in WS_BLOBS. A content that changes gets a
   new sha256 and size (and a new blob); a path that changes must still be a valid path and
   must not become another path. Then each event is re-chained: ``tree_hash`` recomputed
   from the rebuilt tree, ``prev_hash`` the new hash of the event before.
3. A ``history_compacted`` event with op ``scrub`` closes the new log: its manifest (in
   WS_BLOBS) is the whole scrubbed workspace, every revision and event kept (no floor). Every
   projection replaces the workspace with a compaction's manifest when it folds one (writer,
   readers, executor checkouts), so live replicas drop what they held and new ones build the
   same rows. Earlier ``scrub`` markers in the log get manifests rebuilt for the new chain.
4. The new log is appended after the old one as **one** JetStream atomic batch conditioned
   on the workspace's last sequence (``Nats-Expected-Last-Subject-Sequence``): the writer
   appends with the same condition, so either the scrub commits whole and any command the
   writer had decided on the old log is refused (it reloads from the log and decides again),
   or a command got in first and the scrub is refused (``CONFLICT``: run it again). No one
   ever sees half of the new log. When the new log does not fit in one batch (nats-server's
   ``jetstream.limits.batch.max_msgs``, 1000 by default), only the closing event is
   appended: the scrubbed history is then kept in its manifest, as a compaction keeps it.
5. The old events are purged from WS_EVENTS, the WS_BLOBS objects that held a secret and
   that the new log does not name are deleted: those of the workspace's own namespace
   (``<tenant>/<workspace>/<sha256>``) always; a legacy one (named by the bare sha256, shared by
   every workspace that wrote it before workspaces had their own) unless another workspace (of
   any tenant) still names it (``referrers`` reads every other log once): that one is kept,
   and the result names the workspaces (``shared_with``: they hold the same content, scrub
   them too; scrubbing the last of them deletes it). Audit records (WS_AUDIT) that carry a secret
   are re-published redacted and the originals deleted, KV values that carry one are
   replaced by their redacted form (their history purged); keys that carry one are removed;
   the kept output (WS_OUTPUT) of a command that printed one is purged whole; a request parked
   for approval (WS_APPROVALS) that holds one is deleted, an outcome re-published redacted.
6. The new log is replayed and checked, WS_EVENTS/WS_AUDIT/WS_OUTPUT/WS_APPROVALS are scanned
   for the secrets again, and an audit record ``scrub`` (the secret ids, never the values; the
   old and new head hashes) is published.

Forks (issue 33) are refused, naming them (``CONFLICT``): a fork's history up to its fork
point *is* its source's (read through the source's rows and blobs, its chain continuing the
source's hash at that point), so scrubbing a source with forks would leave the secret in what
they read and break their chains, and scrubbing a fork cannot reach what it inherited.
Cleaning every fork along would be a rewrite of each fork's log and rows over a new base (its
``workspace_forked`` re-chained to the scrubbed source): a scrub of every workspace of the
lineage at once, which one batch condition per log cannot make atomic. So: purge the forks
(merge what they should keep first), then scrub the source. The forks are those the readers
know (``qry.forks``) and those of the record every writer keeps (WS_FORKS,
``infra/fork_registry.py``): the scrub marks the source ``scrubbing`` there by compare-and-set
only while no fork stands on it, renews the mark while it runs and clears it when it ends; a
fork of the source asked meanwhile is refused (``CONFLICT``, retry), on whichever writer. A
mark left by a scrub that crashed runs out (``MARK_TTL_S``); a scrub whose mark ran out
is refused before it appends. A dry run only checks.

Failures are ``QuillError``: ``WORKSPACE_NOT_FOUND``, ``NO_MATCH`` (no secret occurs),
``INVALID_ARGUMENT`` (a redaction would make an invalid or colliding path, a secret in the
workspace's own name), ``CONFLICT`` (the workspace was written meanwhile; a fork, or one
with forks),
``INTERNAL`` (the log does not verify, or the secret is still found afterwards),
``UNAVAILABLE`` (NATS failing; or the old log could not be purged after the new one was
appended: the message says how to purge it).
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from contracts import codec, hashing
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    SCRUB_OP,
    AuditRecord,
    ChangesCommitted,
    CompactionManifest,
    HistoryCompacted,
    WorkspaceEvent,
    WorkspaceUpdated,
)
from contracts.subjects import (
    STREAM_APPROVALS,
    STREAM_AUDIT,
    STREAM_EVENTS,
    STREAM_OUTPUT,
    Subjects,
)
from core.evolve import WorkspaceState, evolve, restore
from core.plan import Committed
from core.secrets import Secrets
from core.tree import apply_change
from infra import compaction
from infra import log as eventlog
from infra.blobs import Blobs, WorkspaceBlobs
from infra.fork_registry import Registry
from infra.store import Store
from quill_cli.tools import replay as rpl
from quill_cli.tools import scrub_blobs, scrub_forks
from quill_cli.tools import scrub_stores as stores
from quill_cli.tools.scrub_redact import Redactor

MAX_BATCH = 1000
"""Messages one atomic batch may hold (nats-server's default ``batch.max_msgs``)."""
MAX_BATCH_BYTES = 32 * 1024 * 1024
KEEP_ALL = 2**62
"""``max_versions`` for the manifest: every revision is kept."""


class Scrubbed(msgspec.Struct, kw_only=True):
    """What ``quill scrub`` did (or, with ``dry_run``, would do)."""

    tenant: str
    workspace: str
    secret_ids: list[str]
    """The registry's ids found (never the values)."""
    dry_run: bool
    events_changed: int
    """Events that carried a secret."""
    contents_changed: int
    """Distinct contents (inline or in WS_BLOBS) that carried a secret."""
    paths_changed: list[str]
    """Paths renamed by redaction, in their redacted form."""
    audit_records: int
    """Audit records that carried a secret (re-published redacted)."""
    kv_entries: int
    """KV values or keys that carried a secret."""
    outputs_purged: int = 0
    """Commands whose kept output (WS_OUTPUT) carried a secret: their output is purged."""
    approvals: int = 0
    """Messages of WS_APPROVALS (parked requests, outcomes) that carried a secret: a request
    is deleted, an outcome re-published redacted."""
    old_version: int
    old_head: str
    version: int = 0
    """The new head's version (the ``scrub`` event)."""
    head: str = ""
    """The new head hash."""
    tree_hash: str = ""
    form: str = ""
    """``events``: the whole log re-chained; ``manifest``: history kept in the manifest."""
    blobs_deleted: int = 0
    blobs_kept: int = 0
    """WS_BLOBS objects that held a secret, kept because another workspace names them."""
    shared_with: list[str] = msgspec.field(default_factory=list)
    """The other workspaces (``tenant/workspace``) that name a blob that held a secret: they
    hold the same content, so the same secret: scrub them too."""
    replicas: list[str] = msgspec.field(default_factory=list)
    """The live reader replicas that answer the scrubbed workspace (``quill scrub`` checks
    them as ``quill verify`` does)."""


# ---------------------------------------------------------------- the scrub


class _Rewrite:
    """The new log being built: payloads, hashes, and a projection of it for manifests."""

    def __init__(self, store: Store, tenant: str, workspace: str) -> None:
        self.store, self.tenant, self.workspace = store, tenant, workspace
        self.state = WorkspaceState(tenant, workspace)
        """The new log folded (``core.evolve``): its tree hashes into each new event."""
        self.payloads: list[tuple[bytes, str, int]] = []
        """``(payload, hash, version)`` of every new event."""
        self.manifests: dict[str, bytes] = {}
        self._pending: list[Committed] = []

    async def add(self, body: dict[str, Any]) -> WorkspaceEvent:
        event = codec.decode_event(msgspec.json.encode(body))
        more: dict[str, Any] = {}
        match event:  # as a decider does: its changes on the tree, whose hash it then records
            case ChangesCommitted(changes=changes, version=version, at=at):
                for change in changes:
                    apply_change(self.state.tree, change, version, at)
        manifest = None
        if isinstance(event, HistoryCompacted):  # a new manifest: the new log's workspace
            manifest, manifest_body = await self.manifest()
            digest = hashing.content_sha256(manifest_body)
            self.manifests[digest] = manifest_body
            more.update(manifest=digest, manifest_size=len(manifest_body), floor=manifest.floor)
        event = msgspec.structs.replace(
            event,
            prev_hash=self.state.last_hash,
            tree_hash=hashing.tree_hex(self.state.tree.hash),
            **more,
        )
        payload = codec.encode(event)
        digest = hashing.event_hash(payload)
        self.payloads.append((payload, digest, event.version))
        self._pending.append(Committed(event, digest, event.version, manifest))
        if manifest is not None:
            await self._flush()
        evolve(self.state, event, digest, tree=False, manifest=manifest)
        return event

    async def start(self, body: dict[str, Any], manifest: CompactionManifest) -> None:
        """Start from the compaction the log starts at, with its (redacted) manifest: it
        still chains to the manifest's rows, whose hashes are kept."""
        event = codec.decode_event(msgspec.json.encode(body))
        assert isinstance(event, HistoryCompacted)
        restore(self.state, event, manifest)  # the tree it starts at hashes into it
        manifest_body = compaction.encode_manifest(manifest)
        digest_m = hashing.content_sha256(manifest_body)
        self.manifests[digest_m] = manifest_body
        event = msgspec.structs.replace(
            event,
            manifest=digest_m,
            manifest_size=len(manifest_body),
            tree_hash=hashing.tree_hex(self.state.tree.hash),
        )
        payload = codec.encode(event)
        digest = hashing.event_hash(payload)
        self.payloads.append((payload, digest, event.version))
        self._pending.append(Committed(event, digest, event.version, manifest))
        await self._flush()
        evolve(self.state, event, digest, tree=False, manifest=manifest)

    async def _flush(self) -> None:
        if self._pending:
            await self.store.apply(self._pending)
            self._pending = []

    async def manifest(self) -> tuple[Any, bytes]:
        """The workspace as rebuilt so far, every revision and event kept."""
        await self._flush()
        ws = self.store.workspace_id(self.tenant, self.workspace)
        assert ws is not None
        manifest, _, _ = await self.store.compaction(ws, KEEP_ALL)
        return manifest, compaction.encode_manifest(manifest)


async def scrub(
    nc: NATS,
    subjects: Subjects,
    tenant: str,
    workspace: str,
    secrets: Secrets,
    *,
    actor: str | None = None,
    dry_run: bool = False,
    max_batch: int = MAX_BATCH,
    kv_buckets: list[str] | None = None,
    forks: Callable[[], Awaitable[list[str]]] | None = None,
) -> Scrubbed:
    """Scrub ``secrets`` from ``tenant/workspace`` (module docstring). ``forks``: the
    workspace's forks (``qry.forks``; the CLI asks a reader), refused while it has any.

    Raises:
        QuillError: see the module docstring.
    """
    if not secrets:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "No secret to scrub: the registry is empty")
    js, name = nc.jetstream(), f"{tenant}/{workspace}"
    subject = subjects.evt(tenant, workspace)
    with rpl.nats_errors(f"Scrubbing {name}"):
        last = await rpl.last_event(js, subject)
        if last is None:
            raise QuillError(ErrorCode.WORKSPACE_NOT_FOUND, f"Workspace {name} not found")
        last_seq = await eventlog.last_seq(js, subject, fresh=True)
        await scrub_forks.not_forked(js, subject, name, last_seq, forks)
        registry = Registry(js, subjects, f"scrub@{socket.gethostname()}:{os.getpid()}")
        async with scrub_forks.marked(registry, tenant, workspace, dry_run) as still_marked:
            return await _scrub(
                nc, js, subjects, tenant, workspace, secrets, actor, dry_run, max_batch,
                kv_buckets, still_marked, last_seq,
            )  # fmt: skip
    raise AssertionError("unreachable")  # nats_errors re-raises


async def _scrub(
    nc: NATS,
    js: JetStreamContext,
    subjects: Subjects,
    tenant: str,
    workspace: str,
    secrets: Secrets,
    actor: str | None,
    dry_run: bool,
    max_batch: int,
    kv_buckets: list[str] | None,
    still_marked: Callable[[], Awaitable[None]],
    last_seq: int,
) -> Scrubbed:
    """``scrub`` once the workspace is marked (``scrub_forks.marked``)."""
    name = f"{tenant}/{workspace}"
    subject, audit_subject = subjects.evt(tenant, workspace), subjects.audit(tenant, workspace)
    blobs = Blobs(js).of(tenant, workspace)
    old = await eventlog.read(js, subject, 0, last_seq, timeout=rpl.IDLE_S)
    old = await compaction.with_manifests(old, Blobs(js))
    fold, kept = rpl.Fold(tenant, workspace), None
    if old and isinstance(first := old[0].event, HistoryCompacted):
        kept = old[0].manifest
        assert kept is not None
        fold.start(first, old[0].hash, kept, first.version)
    for item in old[1:] if kept else old:
        fold.apply(item.event, item.hash, item.manifest)
    redactor = Redactor(secrets, blobs)
    with tempfile.TemporaryDirectory(prefix="quill-scrub-") as tmp:
        store = await Store.open(Path(tmp) / "scrub.db", role="writer")
        try:
            new = _Rewrite(store, tenant, workspace)
            changed = 0
            for n, item in enumerate(old):
                body = await redactor.event(item.event)
                if n == 0 and kept is not None:  # the log starts at a compaction
                    redacted = await redactor.manifest(kept)
                    await new.start(body, redacted)
                    changed += redacted != kept
                else:
                    await new.add(body)
                changed += body != msgspec.json.decode(codec.encode(item.event))
            audit = await stores.messages(js, STREAM_AUDIT, audit_subject)
            audit_hits = [(s, d) for s, d in audit if stores.carries(secrets, d)]
            kv_hits = await stores.kv_hits(js, secrets, kv_buckets)
            output_hits = await stores.output_hits(
                js, secrets, subjects.workspace_cmdout(tenant, workspace)
            )
            approval_hits = await stores.approval_hits(
                js, secrets, subjects.workspace_approvals(tenant, workspace)
            )
            for _, _, data in approval_hits:
                redactor.found.update(secrets.redact_bytes(data)[1])
            for found in output_hits.values():
                redactor.found.update(found)
            for _, data in audit_hits:
                redactor.found.update(secrets.redact_bytes(data)[1])
            for _, _, data in kv_hits:
                redactor.found.update(secrets.redact_bytes(data)[1])
            result = Scrubbed(
                tenant=tenant,
                workspace=workspace,
                secret_ids=sorted(redactor.found),
                dry_run=dry_run,
                events_changed=changed,
                contents_changed=len(redactor.shas),
                paths_changed=sorted(n for o, n in redactor.paths.items() if o != n),
                audit_records=len(audit_hits),
                kv_entries=len(kv_hits),
                outputs_purged=len(output_hits),
                approvals=len(approval_hits),
                old_version=fold.version,
                old_head=fold.last_hash,
            )
            if not redactor.found:
                raise QuillError(
                    ErrorCode.NO_MATCH,
                    f"No registered secret occurs in {name} (its log, contents, audit "
                    "records, kept command output, requests kept for approval or KV "
                    "buckets): nothing to scrub",
                )
            if dry_run:
                named = await scrub_blobs.shared(js, subjects, subject, set(redactor.shas), secrets)
                result.blobs_kept, result.shared_with = named
                return result
            if changed:
                await still_marked()  # no fork was made meanwhile
                await _replace_log(
                    nc, js, subjects, new, blobs, redactor, old, last_seq, actor, max_batch,
                    result,
                )  # fmt: skip
        finally:
            await store.close()
    await stores.scrub_audit(js, secrets, audit_subject, audit_hits)
    await stores.scrub_kv(js, secrets, kv_hits)
    await stores.scrub_output(js, sorted(output_hits))
    await stores.scrub_approvals(js, secrets, approval_hits)
    await _check(js, subjects, tenant, workspace, secrets, result)
    await _audit(js, subjects, result, actor)
    return result


async def _replace_log(
    nc: NATS,
    js: JetStreamContext,
    subjects: Subjects,
    new: _Rewrite,
    blobs: WorkspaceBlobs,
    redactor: Redactor,
    old: list[Committed],
    last_seq: int,
    actor: str | None,
    max_batch: int,
    result: Scrubbed,
) -> None:
    tenant, workspace = new.tenant, new.workspace
    version = old[-1].event.version + 1
    manifest, body = await new.manifest()
    digest_m = hashing.content_sha256(body)
    new.manifests[digest_m] = body
    closing = HistoryCompacted(
        tenant=tenant,
        workspace=workspace,
        version=version,
        at=datetime.now(UTC),
        op=SCRUB_OP,
        request_id=f"scrub-{version}-{digest_m[:16]}",
        actor=actor or "quill",
        prev_hash=new.state.last_hash,
        tree_hash=hashing.tree_hex(new.state.tree.hash),
        manifest=digest_m,
        manifest_size=len(body),
        floor=manifest.floor,
        max_versions=manifest.limits.max_versions or 0,
        revisions_kept=len(manifest.revisions),
        revisions_dropped=0,
        events_dropped=0,
    )
    payload = codec.encode(closing)
    head = hashing.event_hash(payload)
    # Every content a manifest names is in WS_BLOBS (replicas that skip the new events, as
    # they already have their versions, fetch them from there), and every manifest.
    named = {str(r[5]) for r in manifest.revisions if r[4] == "f"}
    for sha, _, data in redactor.contents.values():
        if sha in named:
            await blobs.put(sha, data)
    for sha, data in new.manifests.items():
        await blobs.put(sha, data)
    tag = os.urandom(6).hex()
    batch = [(p, subjects.msg_id(tenant, workspace, f"scrub-{tag}-{v}"), h)
             for p, h, v in new.payloads]  # fmt: skip
    batch.append((payload, subjects.msg_id(tenant, workspace, closing.request_id), head))
    whole = len(batch) <= max_batch and sum(len(p) for p, _, _ in batch) <= MAX_BATCH_BYTES
    if not whole:
        batch = batch[-1:]
    subject = subjects.evt(tenant, workspace)
    try:
        await rpl.append_batch(nc, subject, last_seq, batch, version)
    except QuillError as exc:
        raise QuillError(
            ErrorCode.CONFLICT,
            f"{tenant}/{workspace} was written while it was being scrubbed: nothing was "
            "changed; run quill scrub again",
        ) from exc
    # every old event is at or below last_seq, every new one above it
    try:
        await js.purge_stream(STREAM_EVENTS, subject=subject, seq=last_seq + 1)
    except Exception as exc:
        raise QuillError(
            ErrorCode.UNAVAILABLE,
            f"The scrubbed log of {tenant}/{workspace} is appended (version {version}) but the "
            f"old one could not be purged ({exc}): replicas already serve the scrubbed "
            f"workspace; purge it by hand: nats stream purge {STREAM_EVENTS} --subject "
            f"{subject} --seq {last_seq + 1} (quill verify fails until then)",
        ) from None
    # Never delete what the new log names (its contents, its manifests, what they name).
    referenced = {c for c, _, _ in redactor.contents.values()} | set(new.manifests) | named
    gone = set(redactor.shas) - referenced
    for item in old:
        if isinstance(item.event, HistoryCompacted) and item.event.manifest not in referenced:
            gone.add(item.event.manifest)
    result.blobs_deleted, result.blobs_kept, result.shared_with = await scrub_blobs.delete(
        js, subjects, subject, gone, redactor
    )
    result.version, result.head, result.tree_hash = version, head, closing.tree_hash
    result.form = "events" if whole else "manifest"
    update = WorkspaceUpdated(
        tenant=tenant,
        workspace=workspace,
        version=version,
        op=SCRUB_OP,
        actor=closing.actor,
        request_id=closing.request_id,
        at=closing.at,
        paths=result.paths_changed[:100],
        paths_total=len(result.paths_changed),
        tree_hash=closing.tree_hash,
    )
    await nc.publish(subjects.updated(tenant, workspace), codec.encode(update))


async def _check(
    js: JetStreamContext,
    subjects: Subjects,
    tenant: str,
    workspace: str,
    secrets: Secrets,
    result: Scrubbed,
) -> None:
    """Replay the new log and scan the workspace's log and audit for the secrets again.

    Raises:
        QuillError: ``INTERNAL`` if the log does not verify or a secret is still there.
    """
    fold = await rpl.replay(js, subjects, tenant, workspace)
    if result.head and fold.last_hash != result.head:
        raise rpl.corrupt("The scrubbed log does not end at the scrub's event", fold.version)
    if not result.head:
        result.version, result.head = fold.version, fold.last_hash
        result.tree_hash = hashing.tree_hex(fold.tree.hash)
        result.form = "unchanged"
    for stream, subject in (
        (STREAM_EVENTS, subjects.evt(tenant, workspace)),
        (STREAM_AUDIT, subjects.audit(tenant, workspace)),
        (STREAM_APPROVALS, subjects.workspace_approvals(tenant, workspace)),
    ):
        left = [
            s for s, d in await stores.messages(js, stream, subject) if stores.carries(secrets, d)
        ]
        if left:
            raise QuillError(
                ErrorCode.INTERNAL,
                f"{len(left)} messages of {stream} still carry a secret after the scrub",
            )
    if await stores.output_hits(js, secrets, subjects.workspace_cmdout(tenant, workspace)):
        raise QuillError(
            ErrorCode.INTERNAL, f"{STREAM_OUTPUT} still holds a secret after the scrub"
        )


async def _audit(
    js: JetStreamContext, subjects: Subjects, result: Scrubbed, actor: str | None
) -> None:
    record = AuditRecord(
        at=datetime.now(UTC),
        tenant=result.tenant,
        workspace=result.workspace,
        kind="cmd",
        op=SCRUB_OP,
        actor=actor,
        session=None,
        run=None,
        request_id=None,
        outcome="ok",
        error_code=None,
        duration_ms=0.0,
        version=result.version,
        paths=result.paths_changed[:100],
        summary=f"scrubbed {', '.join(result.secret_ids)}",
        service="cli",
        instance=f"scrub-{socket.gethostname()[:20]}-{os.getpid()}",
        details={
            "secret_ids": result.secret_ids,
            "old_version": result.old_version,
            "old_head": result.old_head,
            "new_version": result.version,
            "new_head": result.head,
            "events_changed": result.events_changed,
            "contents_changed": result.contents_changed,
            "audit_records": result.audit_records,
            "outputs_purged": result.outputs_purged,
            "approvals": result.approvals,
            "form": result.form,
            "blobs_deleted": result.blobs_deleted,
            "blobs_kept": result.blobs_kept,
            "shared_with": result.shared_with,
        },
    )
    await js.publish(
        subjects.audit(result.tenant, result.workspace), codec.encode(record), stream=STREAM_AUDIT
    )
