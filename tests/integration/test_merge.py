"""Merges through the real path (nats-server, a writer, a reader, the SDK): a fork merged
back into its source as one event naming it, line by line where both changed a text, every
strategy, dry runs decided again at commit, merging twice, the other directions (a source
into its fork, two forks of one source), contents over ``INLINE_MAX`` readable from the
target's own namespace, and refusals that leave no trace (issue 33)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from contracts import hashing
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from infra.blobs import Blobs
from quill.client import Quill, Workspace
from services.reader.app import Reader
from tests.conftest import StartReader
from tests.helpers import agent_and_human, approvals_pending, new_workspace, quill_of

TEXT = "".join(f"line {i}\n" for i in range(1, 21))
BIG = "z" * 70_000 + "\n"
"""Over ``INLINE_MAX``: in the fork's namespace of WS_BLOBS."""


def edited(text: str, line: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[line - 1] = new
    return "".join(lines)


async def pair(quill: Quill, tenant: str) -> tuple[Workspace, Workspace]:
    """A source with a text and two more files, and a fork of it."""
    src = quill.workspace(f"{tenant}/main")
    await src.create()
    await src.write("t.txt", TEXT)
    await src.write("keep.txt", "keep\n")
    await src.write("d/x.txt", "x\n")
    await quill.fork(f"{tenant}/main", "try")
    return src, quill.workspace(f"{tenant}/try")


async def wait(reader: Reader, ws: Workspace) -> None:
    assert await reader.follower.wait_for(ws.tenant, ws.name, ws.last_version, 10)


async def test_a_fork_merges_back_as_one_event(services: StartReader, quill: Quill) -> None:
    reader = await services("r1")
    src, fork = await pair(quill, "m1")
    await fork.write("t.txt", edited(TEXT, 3, "fork's line 3\n"))
    await fork.write("new/big.txt", BIG)
    await fork.delete("d/x.txt")
    await src.write("t.txt", edited(TEXT, 17, "main's line 17\n"))
    await src.write("mine.txt", "mine\n")
    before = src.last_version
    dry = await src.merge("try", dry_run=True)
    assert not dry.committed and dry.dry_run and dry.conflicts == []
    assert {(c.path, c.kind) for c in dry.changes} == {
        ("t.txt", "put"),
        ("new", "mkdir"),
        ("new/big.txt", "put"),
        ("d/x.txt", "delete"),
    }
    assert (await src.info()).version == before  # a dry run commits nothing
    merged = await src.merge("try")
    assert merged.committed and merged.merged == ["t.txt"]
    assert (merged.source, merged.base_version, merged.from_version) == ("m1/try", 4, 7)
    assert src.last_version == before + 1  # one event
    await wait(reader, src)
    text = (await src.read("t.txt")).content
    assert text == edited(edited(TEXT, 3, "fork's line 3\n"), 17, "main's line 17\n")
    assert (await src.read("new/big.txt")).content == BIG
    assert (await src.read("mine.txt")).content == "mine\n"
    with pytest.raises(QuillError) as gone:
        await src.read("d/x.txt")
    assert gone.value.code == ErrorCode.FILE_NOT_FOUND
    page = await src.history(limit=1)
    assert (page.revisions[0].op, page.revisions[0].actor) == ("merge", "tester")
    # the big content is the target's own now: its namespace holds it
    js = quill.nc.jetstream()
    sha = hashing.content_sha256(BIG.encode())
    assert await Blobs(js).of("m1", "main").has(sha)


async def test_conflicts_and_the_strategies(services: StartReader, quill: Quill) -> None:
    reader = await services("r1")
    src, fork = await pair(quill, "m2")
    await fork.write("t.txt", edited(TEXT, 5, "fork 5\n"))
    await src.write("t.txt", edited(TEXT, 5, "main 5\n"))
    before = src.last_version
    with pytest.raises(QuillError) as refused:
        await src.merge("try")
    assert refused.value.code == ErrorCode.MERGE_CONFLICT
    (conflict,) = refused.value.details["conflicts"]
    assert conflict["path"] == "t.txt" and conflict["kind"] == "content"
    assert conflict["hunks"][0]["ours"] == "main 5\n"
    assert conflict["hunks"][0]["theirs"] == "fork 5\n"
    assert (await src.info()).version == before  # nothing committed
    dry = await src.merge("try", dry_run=True, strategy="fail")
    assert dry.refused and dry.conflicts_total == 1 and not dry.committed
    marked = await src.merge("try", strategy="markers")
    assert marked.marked == ["t.txt"]
    await wait(reader, src)
    text = (await src.read("t.txt")).content
    assert "<<<<<<< main@" in text and "=======\nfork 5\n>>>>>>> try@" in text

    src3, fork3 = await pair(quill, "m3")
    await fork3.write("t.txt", edited(TEXT, 5, "fork 5\n"))
    await src3.write("t.txt", edited(TEXT, 5, "main 5\n"))
    theirs = await src3.merge("try", strategy="theirs")
    assert theirs.conflicts[0].resolution == "theirs"
    await wait(reader, src3)
    assert (await src3.read("t.txt")).content == edited(TEXT, 5, "fork 5\n")


async def test_binary_delete_modify_and_file_directory_conflict(
    services: StartReader, quill: Quill
) -> None:
    await services("r1")
    src, fork = await pair(quill, "m4")
    await src.write("bin.dat", b"\0\1\2")
    await quill.fork("m4/main", "b")
    fork = quill.workspace("m4/b")
    await fork.write("bin.dat", b"\0fork")
    await src.write("bin.dat", b"\0main")
    await fork.write("keep.txt", "fork keeps\n")
    await src.delete("keep.txt")
    await fork.delete("d", recursive=True)
    await fork.write("d", "a file now\n")
    await src.write("d/y.txt", "main adds below d\n")
    with pytest.raises(QuillError) as refused:
        await src.merge("b", strategy="markers")  # markers cannot hold these
    assert refused.value.code == ErrorCode.MERGE_CONFLICT
    kinds = {c["path"]: c["kind"] for c in refused.value.details["conflicts"]}
    assert kinds == {"bin.dat": "binary", "keep.txt": "delete_modify", "d": "file_directory"}
    ours = await src.merge("b", strategy="ours")
    # ours everywhere: no file changes, yet the decisions are recorded (the next base)
    assert ours.conflicts_total == 3 and ours.committed and ours.changes_total == 0
    again = await src.merge("b")  # decided, not asked again
    assert (again.conflicts_total, again.refused, again.committed) == (0, None, False)


async def test_merging_again_takes_only_what_changed_since(
    services: StartReader, quill: Quill
) -> None:
    reader = await services("r1")
    src, fork = await pair(quill, "m5")
    await fork.write("a.txt", "a1\n")
    first = await src.merge("try")
    assert [c.path for c in first.changes] == ["a.txt"]
    await src.write("a.txt", "main changed a after the merge\n")
    await fork.write("b.txt", "b1\n")
    again = await src.merge("try")
    assert (again.base_version, again.from_base) == (first.base_version + 1, first.from_version)
    assert [c.path for c in again.changes] == ["b.txt"]  # a.txt is not offered again
    await wait(reader, src)
    assert (await src.read("a.txt")).content == "main changed a after the merge\n"
    nothing = await src.merge("try")
    assert not nothing.committed and nothing.changes == []


async def test_a_dry_run_is_decided_again_at_commit(services: StartReader, quill: Quill) -> None:
    await services("r1")
    src, fork = await pair(quill, "m6")
    await fork.write("t.txt", edited(TEXT, 2, "fork 2\n"))
    dry = await src.merge("try", dry_run=True)
    assert dry.conflicts == [] and [c.source for c in dry.changes] == ["theirs"]
    await src.write("t.txt", edited(TEXT, 2, "main 2\n"))  # the target moves on
    with pytest.raises(QuillError) as refused:
        await src.merge("try")
    assert refused.value.code == ErrorCode.MERGE_CONFLICT


async def test_other_directions_and_unrelated(services: StartReader, quill: Quill) -> None:
    reader = await services("r1")
    src, fork = await pair(quill, "m7")
    await src.write("up.txt", "from main\n")
    into_fork = await fork.merge("main")  # the source into its fork
    assert [c.path for c in into_fork.changes] == ["up.txt"]
    await quill.fork("m7/main", "sib")
    sib = quill.workspace("m7/sib")
    await sib.write("s.txt", "sibling\n")
    siblings = await fork.merge("sib")  # two forks of one source
    assert [c.path for c in siblings.changes] == ["s.txt"]
    await quill.fork("m7/try", "deep")  # a fork's fork into its grandparent
    deep = quill.workspace("m7/deep")
    await deep.write("deep.txt", "deep\n")
    up = await src.merge("deep")
    assert {c.path for c in up.changes} == {"s.txt", "deep.txt"}
    other = quill.workspace("m7/other")
    await other.create()
    await other.write("t.txt", "unrelated\n")
    with pytest.raises(QuillError) as none:
        await src.merge("other")
    assert none.value.code == ErrorCode.NO_MERGE_BASE
    with pytest.raises(QuillError) as missing:
        await src.merge("nope")
    assert missing.value.code == ErrorCode.WORKSPACE_NOT_FOUND
    with pytest.raises(QuillError) as itself:
        await src.merge("main")
    assert itself.value.code == ErrorCode.INVALID_ARGUMENT
    await wait(reader, src)


async def test_a_merge_over_the_targets_limits_commits_nothing(
    services: StartReader, quill: Quill
) -> None:
    src = await new_workspace(services, quill, "m8/main", limits=LimitsPatch(max_files=3))
    await src.write("a.txt", "a\n")
    await src.write("b.txt", "b\n")
    await quill.fork("m8/main", "try")  # its limits too
    fork = quill.workspace("m8/try")
    await fork.write("f.txt", "f\n")
    await src.write("s.txt", "s\n")
    before = src.last_version
    with pytest.raises(QuillError) as files:
        await src.merge("try")  # four files where three fit
    assert files.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    assert (await src.info()).version == before


async def test_a_merge_into_a_restricted_workspace_waits_for_approval(
    services: StartReader, nats_url: str
) -> None:
    await services("r1")
    async with AsyncExitStack() as stack:
        ws, desk = await agent_and_human(
            stack, nats_url, "m9/main", session="s-agent", human_session="s-alice"
        )
        agent = quill_of(ws)
        await ws.create()
        await ws.write("t.txt", TEXT)
        await agent.fork("m9/main", "try")
        await agent.workspace("m9/try").write("f.txt", "from the fork\n")
        await ws.set_trust("restricted")
        dry = await ws.merge("try", dry_run=True)  # an answer: nothing to approve
        assert [c.path for c in dry.changes] == ["f.txt"]
        with pytest.raises(QuillError) as parked:
            await ws.merge("try")
        assert parked.value.code == ErrorCode.APPROVAL_REQUIRED
        approval_id = parked.value.details["approval_id"]
        await approvals_pending(desk, 1)
        [listed] = (await desk.approvals()).pending
        assert listed.op == "cmd.merge"
        assert listed.preview is not None and "+from the fork" in listed.preview
        await desk.approve(approval_id)
        status = await ws.wait_approval(approval_id, 30)
        assert status.outcome is not None and status.outcome.version is not None
        assert (await ws.read("f.txt")).content == "from the fork\n"
