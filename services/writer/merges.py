"""What the writer reads for a merge (issue 33): the merge base, the paths changed on either
side since it, each side's entry there, and the contents the merge reads.

**The base.** The two workspaces share history where one's lineage meets the other's (a
fork and its source, a fork's fork and its grandparent, two forks of one source): the base
is the nearest workspace both stand on, as of the older of their two versions of it
(``core.lineage.common``, which the reader's diff between two workspaces shares). Two
workspaces that share none have no base: ``NO_MERGE_BASE`` (a merge of unrelated histories
would take every path of one as added to the other; fork first).

After that point the base is the last merge between the two, in either direction, the later
of the two in the log (``_base``: two seeks of ``events_merges``, whatever either history
holds). A merge is a common ancestor of what follows: a merge of theirs into ours (its
result names the version of theirs it took) has, as the target's version, that merge and,
as theirs, the version taken, whose content is the base; a merge of ours into theirs has,
as ours, the version of ours it took (the base's content: ours there) and, as theirs, that
merge. So after fork ← source, source ← fork takes the fork's changes since its merge, and
what the fork took of the source is the source's, not a change of the fork's to merge
again (nor to conflict with the source's changes since). The later merge is the right one:
a merge takes the other side's newest version (brought up to the log's end first), so a
merge later in the log took a version that already held the earlier one: its base descends
from the earlier's, nearer to both sides, with less changed since. Criss-cross merges (each
side merged the other before seeing the other's merge, concurrently) leave two bases
neither of which descends from the other (git's two merge bases); the later in the log is
taken, as git's ``resolve`` strategy takes one of them: what the other merge took is then
on one side a change against it, the same as the other side's where it was taken whole
(taken once), merged line by line again where it was merged (a conflict there is a real
overlap, decided by the strategy).

Against a merge of ours into theirs, theirs also differs from the base where that merge did
not take ours' version: where it kept its own (what it changed before that merge that ours
never took: its changes, to take now), merged a text line by line, wrote markers, decided a
conflict for ours, or redacted what it took. Each merge records those paths in its event
(``MergedFrom.kept``, ``core.decide_merge.kept``: of the paths it read, those where the
merged tree is not theirs; elsewhere all three sides were alike and it changed nothing), and
they are read here with a get of that event from the log (``events_merges`` gives its
sequence): the cost is what changed since the last merge, however long the two have synced.
A merge recorded without them (before the field existed, over ``MERGE_KEPT_MAX_BYTES``, or
its event no longer in the log) is read as before: the paths either side changed from the
fork point up to that merge (index ranges, as below; those both sides still have alike are
dropped by ``core.merge``), a superset. Against a merge of theirs into ours nothing more is
read: where ours kept its own there, a path theirs left alike since is ours' (nothing to
do), and one theirs changed is read as theirs' change; what that merge kept and this one
does not read is still apart, and goes into this one's record (``MergeSource.apart``; not
recorded there: this one records nothing either).

**What changed.** Ours: the target's paths changed since its base, from the projection
(``Store.changed_in``: two range seeks through its layers; events whose summaries were cut
are read from the log, ``infra.log.cut_paths``) and, when this writer has decided changes
its projection does not hold yet (pipelined appends), those from the in-memory tree.
Theirs: the same on the other workspace up to its newest projected version. Each path's
theirs is read through theirs' layers and its base through the layers of the side whose
content the base is (one seek a layer), ours from the actor's state: a merge is decided on
the target as it is when decided, never on what a dry run saw. The cost is the paths changed on
either side since the base, never the tree.

On a cluster the other workspace may be another writer's: it is brought up to the log's last
event first (as a fork's source is, ``forks.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_workspace
from contracts.events import ChangesCommitted
from core import lineage
from core.decide_merge import entry_at, file_entry
from core.decision import MergeSource, Needs
from core.evolve import WorkspaceState
from core.merge import needs as merge_needs
from core.merge_types import Dir, Entry, File, Sides, same
from core.rows import Node
from infra import log as eventlog
from infra.concurrent import bounded_gather
from infra.metrics import WRITER_MERGE_PATHS
from infra.store import TOP, Layers
from services.writer import forks
from services.writer.lifecycle import unavailable_if_failing
from services.writer.pending import Site

MAX_MERGE_PATHS = 100_000
"""Paths changed on either side since the base a merge considers at most."""


async def source(site: Site, state: WorkspaceState, cmd: rq.MergeWorkspace) -> MergeSource:
    """What merging ``cmd.source`` into this workspace reads.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` (itself), ``WORKSPACE_NOT_FOUND``,
            ``NO_MERGE_BASE``, ``SIZE_LIMIT_EXCEEDED`` (too many paths changed).
    """
    deps, tenant, name = site.deps, site.tenant, cmd.source
    if name == site.workspace:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"A workspace is not merged into itself: {tenant}/{name}",
            {"from": name},
        )
    await deps.appender.applied()  # what this writer committed is projected
    if deps.partitions is not None or not deps.projection.complete:
        await unavailable_if_failing(forks.caught_up(site, name))
    store = deps.store
    ours_row = store.workspace(tenant, site.workspace)
    theirs_row = store.workspace(tenant, name)
    if theirs_row is None:
        raise no_workspace(tenant, name)
    if ours_row is None:  # a workspace that exists is projected once applied
        raise QuillError(ErrorCode.UNAVAILABLE, f"{tenant}/{site.workspace} is not projected yet")
    theirs_version = theirs_row.version
    base = lineage.common(
        lineage.chain(site.workspace, state.version, state.lineage),
        lineage.chain(name, theirs_version, theirs_row.lineage),
    )
    if base is None:
        raise QuillError(
            ErrorCode.NO_MERGE_BASE,
            f"{tenant}/{name} and {tenant}/{site.workspace} share no history (neither was "
            "forked from the other, nor both from one workspace): nothing to merge against",
            {"from": name, "workspace": site.workspace},
        )
    ours_layers = store.layers(ours_row.id) or [(ours_row.id, TOP)]
    theirs_layers = store.layers(theirs_row.id) or [(theirs_row.id, TOP)]
    at = await _base(site, ours_row.id, theirs_row.id, name, base)
    ours_base, theirs_base = at.ours, at.theirs
    projected = ours_row.version
    ours, cut = await store.changed_in(ours_layers, ours_base, projected)
    if state.version > projected:  # decided here, not projected yet
        ours |= {p for p, v in state.tree.changed.items() if v > projected}
    theirs, cut_theirs = await store.changed_in(theirs_layers, theirs_base, theirs_version)
    if at.theirs_took and at.kept is not None:  # where theirs kept apart when it took ours
        theirs.update(at.kept)
    elif at.theirs_took:  # not recorded: all either side changed from the fork point to then
        kept, cut_kept = await store.changed_in(theirs_layers, base, theirs_base)
        kept_ours, cut_kept_ours = await store.changed_in(ours_layers, base, ours_base)
        theirs |= kept | kept_ours
        cut_theirs += cut_kept + cut_kept_ours
    base_layers, base_version = (
        (ours_layers, ours_base) if at.theirs_took else (theirs_layers, theirs_base)
    )
    paths = ours | theirs | await eventlog.cut_paths(site.deps.js, cut + cut_theirs)
    paths.discard("")
    WRITER_MERGE_PATHS.observe(len(paths))
    if len(paths) > MAX_MERGE_PATHS:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"{len(paths)} paths changed since the merge base (a merge considers at most "
            f"{MAX_MERGE_PATHS}): merge in parts, or more often",
            {"paths": len(paths), "max_paths": MAX_MERGE_PATHS},
        )
    tree = state.tree
    unknown = [p for p in sorted(paths) if not tree.knows(p)]
    if unknown:  # the file versions a put continues
        await store.look_up(tree, ours_row.id, Needs([], None, unknown))
    sides = [
        Sides(
            path,
            await _entry(site, base_layers, path, base_version),
            entry_at(state.tree, path),
            await _entry(site, theirs_layers, path, theirs_version),
        )
        for path in sorted(paths, key=lambda p: p.split("/"))
    ]
    contents = await _contents(site, name, theirs_row.lineage, sides)
    apart = [] if at.theirs_took else at.kept
    return MergeSource(name, theirs_version, ours_base, theirs_base, sides, contents, apart)


class _Base(NamedTuple):
    """The merge base as a version of each side, and whose content it is."""

    ours: int
    theirs: int
    theirs_took: bool
    """The base is a merge of ours into theirs: its content is ours as of ``ours`` (else
    theirs as of ``theirs``: the fork point, or a merge of theirs into ours)."""
    kept: list[str] | None
    """What the merge that is the base recorded of where its target differs from the
    version it took (``MergedFrom.kept``: theirs' if ``theirs_took``, else ours'); empty at
    the fork point; None: not recorded."""


async def _base(site: Site, ours: int, theirs: int, name: str, common: int) -> _Base:
    """The merge base after ``common`` (the versions where the two histories meet): the
    later in the log of ours' last merge of theirs and theirs' last merge of ours, else
    ``common`` (two seeks of ``events_merges``, and a get of that merge from the log)."""
    store, tenant, here = site.deps.store, site.tenant, site.workspace
    into_ours = await store.last_merge(ours, common, f"{tenant}/{name}")
    into_theirs = await store.last_merge(theirs, common, f"{tenant}/{here}")
    theirs_took = into_theirs is not None and (into_ours is None or into_theirs[1] > into_ours[1])
    later = into_theirs if theirs_took else into_ours
    if later is None:
        return _Base(ours=common, theirs=common, theirs_took=False, kept=[])
    version, seq, result = later
    took = msgspec.json.decode(result, type=rp.Merged).from_version
    target, source = (name, here) if theirs_took else (here, name)
    kept = await _kept(site, seq, (target, version), (source, took))
    ours_at, theirs_at = (took, version) if theirs_took else (version, took)
    return _Base(ours=ours_at, theirs=theirs_at, theirs_took=theirs_took, kept=kept)


async def _kept(
    site: Site, seq: int, merge: tuple[str, int], took: tuple[str, int]
) -> list[str] | None:
    """What the merge at log sequence ``seq`` (workspace and version ``merge``, of the
    workspace and version ``took``) recorded as kept; None: not recorded, or no longer in
    the log."""
    event = await eventlog.event_at(site.deps.js, seq)
    if not isinstance(event, ChangesCommitted) or event.merged_from is None:
        return None
    origin = event.merged_from
    if (event.workspace, event.version) != merge or (origin.workspace, origin.version) != took:
        return None
    return origin.kept


async def _entry(site: Site, layers: Layers, path: str, version: int) -> Entry:
    found = await site.deps.store.layered_node(layers, path, version)
    return _of(found[0]) if found is not None else None


def _of(node: Node) -> Entry:
    return Dir(version=node.version) if node.kind == "d" else file_entry(node)


async def _contents(
    site: Site, name: str, lineage: tuple[tuple[str, int], ...], sides: list[Sides]
) -> dict[str, bytes]:
    """The contents the merge reads: the texts both sides changed (``core.merge.needs``) and
    theirs it may put (a file theirs has otherwise than ours), from the other
    workspace's namespace (and its layers'), else this one's."""
    wanted = dict.fromkeys(merge_needs(sides))
    for row in sides:
        if isinstance(row.theirs, File) and not same(row.theirs, row.ours):
            wanted[row.theirs.sha256] = None
    theirs_blobs = site.deps.blobs.of(site.tenant, name, lineage)
    cache = site.deps.contents

    async def one(sha: str) -> bytes:
        data = cache.get(sha)
        if data is not None:
            return data
        try:
            return await theirs_blobs.get(sha)
        except QuillError as exc:
            if exc.code != ErrorCode.UNAVAILABLE:
                raise
        return await site.blobs.get(sha)

    shas = list(wanted)
    found = await bounded_gather([one(sha) for sha in shas], 32)
    return dict(zip(shas, found, strict=True))
