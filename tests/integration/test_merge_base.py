"""The merge base across directions, through the real path (nats-server, a writer, a reader,
the SDK): a fork that took its source's changes (fork ← source) and is then merged back
(source ← fork) is merged against that merge, not the fork point, so what the fork took is
not seen again as the fork's change; a dry run says the same; merges back and forth converge
with no conflict either side did not make (issue 33: "merging again later takes only what
changed since the last merge")."""

from __future__ import annotations

from quill.client import Quill, Workspace
from services.reader.app import Reader
from tests.conftest import StartReader
from tests.integration.test_merge import TEXT, edited, pair


async def wait(reader: Reader, ws: Workspace) -> None:
    assert await reader.follower.wait_for(ws.tenant, ws.name, ws.last_version, 10)


async def took_and_moved_on(quill: Quill, tenant: str) -> tuple[Workspace, Workspace, int, int]:
    """A source and its fork: each changes, the fork takes the source's changes (its merge's
    version, and the source's version it took), then both change more, the source again on
    the paths the fork took."""
    src, fork = await pair(quill, tenant)
    await src.write("a.txt", "a by main\n")
    await src.write("t.txt", edited(TEXT, 3, "main 3\n"))
    await fork.write("b.txt", "b by the fork\n")
    took = await fork.merge("main")
    assert took.committed and {c.path for c in took.changes} == {"a.txt", "t.txt"}
    merge_version, took_version = fork.last_version, took.from_version
    await fork.write("c.txt", "c by the fork\n")
    await fork.write("t.txt", edited(edited(TEXT, 3, "main 3\n"), 15, "fork 15\n"))
    await src.write("a.txt", "a by main, again\n")  # after the fork took it
    await src.write("t.txt", edited(TEXT, 3, "main 3, again\n"))
    return src, fork, merge_version, took_version


async def test_merging_back_takes_only_what_the_fork_did(
    services: StartReader, quill: Quill
) -> None:
    """Against the fork point, a.txt would be added on both sides (an ``add_add`` conflict)
    and line 3 of t.txt changed on both (a ``content`` conflict): changes of the source's
    own the fork took. Against the fork's merge they are the source's alone."""
    reader = await services("r1")
    src, fork, merge_version, took_version = await took_and_moved_on(quill, "mb1")
    before = src.last_version
    dry = await src.merge("try", dry_run=True)
    assert dry.conflicts == [] and dry.refused is None and not dry.committed
    assert (dry.base_version, dry.from_base) == (took_version, merge_version)
    assert {(c.path, c.kind, c.source) for c in dry.changes} == {
        ("b.txt", "put", "theirs"),  # before the fork took the source's: never in the source
        ("c.txt", "put", "theirs"),
        ("t.txt", "put", "merged"),
    }
    assert dry.changes_total == 3 and dry.merged == ["t.txt"]
    assert (await src.info()).version == before  # a dry run commits nothing
    merged = await src.merge("try")
    assert merged.committed and merged.conflicts_total == 0
    assert (merged.base_version, merged.from_base) == (took_version, merge_version)
    assert {(c.path, c.kind, c.source) for c in merged.changes} == {
        (c.path, c.kind, c.source) for c in dry.changes
    }
    assert merged.changes_total == 3 and merged.merged == ["t.txt"]
    await wait(reader, src)
    assert (await src.read("a.txt")).content == "a by main, again\n"  # the source's, kept
    assert (await src.read("b.txt")).content == "b by the fork\n"
    assert (await src.read("c.txt")).content == "c by the fork\n"
    both = edited(edited(TEXT, 3, "main 3, again\n"), 15, "fork 15\n")
    assert (await src.read("t.txt")).content == both


async def test_merges_back_and_forth_converge(services: StartReader, quill: Quill) -> None:
    """source ← fork, fork ← source, source ← fork, with changes on both sides between:
    each takes only what the other changed since the last merge either way, none conflicts,
    and both end with the same files."""
    reader = await services("r1")
    src, fork, _, _ = await took_and_moved_on(quill, "mb2")
    back = await src.merge("try")
    assert back.conflicts_total == 0 and {c.path for c in back.changes} == {
        "b.txt",
        "c.txt",
        "t.txt",
    }
    await src.write("t.txt", edited((await _text(reader, src)), 10, "main 10\n"))
    await fork.write("b.txt", "b by the fork, again\n")
    forth = await fork.merge("main")
    assert forth.conflicts_total == 0 and forth.committed
    assert (forth.base_version, forth.from_base) == (back.from_version, src.last_version - 1)
    assert {c.path for c in forth.changes} == {"a.txt", "t.txt"}  # the source's since
    await fork.write("t.txt", edited((await _text(reader, fork)), 20, "fork 20\n"))
    await src.write("a.txt", "a by main, a third time\n")
    again = await src.merge("try")
    assert again.conflicts_total == 0 and again.committed
    assert {(c.path, c.source) for c in again.changes} == {("b.txt", "theirs"), ("t.txt", "theirs")}
    last = await fork.merge("main")
    assert last.conflicts_total == 0 and [c.path for c in last.changes] == ["a.txt"]
    nothing = await src.merge("try")
    assert not nothing.committed and nothing.changes == [] and nothing.conflicts_total == 0
    await wait(reader, src)
    await wait(reader, fork)
    final = edited(edited(edited(edited(TEXT, 3, "main 3, again\n"), 10, "main 10\n"), 15,
                          "fork 15\n"), 20, "fork 20\n")  # fmt: skip
    for ws in (src, fork):
        assert (await ws.read("t.txt")).content == final
        assert (await ws.read("a.txt")).content == "a by main, a third time\n"
        assert (await ws.read("b.txt")).content == "b by the fork, again\n"
        assert (await ws.read("c.txt")).content == "c by the fork\n"


async def _text(reader: Reader, ws: Workspace) -> str:
    await wait(reader, ws)
    return (await ws.read("t.txt")).content


async def test_a_merge_that_keeps_ours_everywhere_is_recorded_and_not_asked_again(
    services: StartReader, quill: Quill
) -> None:
    """Every conflict decided for ours, no file changed: the merge is still one event (its
    ``merged_from`` names what it took), so the next merge's base is it and the conflict it
    decided does not come back (as git records a merge commit); merged again with nothing
    new, nothing is recorded."""
    await services("r1")
    src, fork = await pair(quill, "mb4")
    await src.write("t.txt", edited(TEXT, 5, "main 5\n"))
    await fork.write("t.txt", edited(TEXT, 5, "fork 5\n"))
    before = fork.last_version
    kept = await fork.merge("main", strategy="ours")
    assert kept.committed and kept.conflicts_total == 1 and kept.changes_total == 0
    assert fork.last_version == before + 1
    page = await fork.events(after=before)
    [event] = page.events
    assert (event.type, event.changes, event.message) == ("changes_committed", [], "merge main@5")
    assert (await fork.read("t.txt")).content == edited(TEXT, 5, "fork 5\n")

    again = await fork.merge("main")  # "fail": the conflict was decided, not left
    assert (again.conflicts_total, again.refused, again.committed) == (0, None, False)
    assert fork.last_version == before + 1  # nothing new since: nothing recorded
    await src.write("other.txt", "new\n")
    taken = await fork.merge("main")
    assert taken.committed and [c.path for c in taken.changes] == ["other.txt"]
