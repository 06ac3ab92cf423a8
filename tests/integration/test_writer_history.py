"""A writer that loads a workspace's live tree decides as one that folded its whole log
(issue 29: the load no longer groups every revision ever made; the history of the paths a
decision reads is looked up in the projection, as ``needs`` names it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts import requests as rq
from contracts.errors import QuillError
from core.decide import decide, needs
from core.decision import Context, Decision
from core.evolve import WorkspaceState
from core.tree import Tree, place
from infra.store import Store
from tests.core.build import T0, LogBuilder


def history() -> LogBuilder:
    """Paths that were files, then moved, deleted, made directories, made again."""
    b = LogBuilder()
    b.run(rq.CreateWorkspace(), "create")  # v1
    b.run(rq.WriteFile(path="a/b.txt", content="one"))  # v2
    b.run(rq.WriteFile(path="a/b.txt", content="two"))  # v3
    b.run(rq.WriteFile(path="a/c/d.txt", content="dee"))  # v4
    b.run(rq.MovePath(path="a/c", to="z"), "move")  # v5: a/c/d.txt -> z/d.txt
    b.run(rq.DeletePath(path="a", recursive=True), "delete")  # v6
    b.run(rq.WriteFile(path="a/b.txt", content="three"))  # v7
    b.run(rq.WriteFile(path="x", content="a file"))  # v8
    b.run(rq.DeletePath(path="x"), "delete")  # v9
    b.run(rq.MakeDirectory(path="x"), "mkdir")  # v10: a directory where a file was
    b.run(rq.WriteFile(path="gone/deep/f.txt", content="deep"))  # v11
    b.run(rq.DeletePath(path="gone", recursive=True), "delete")  # v12
    b.run(rq.WriteFile(path="keep/k.txt", content="k"))  # v13
    b.run(rq.WriteFile(path="keep/tmp.txt", content="t"))  # v14
    b.run(rq.DeletePath(path="keep/tmp.txt"), "delete")  # v15
    return b


COMMANDS: dict[str, rq.Request] = {
    "write a deleted file again": rq.WriteFile(path="a/c/d.txt", content="again"),
    "write where a deleted file was a directory's": rq.WriteFile(
        path="gone/deep/f.txt", content="x"
    ),
    "move onto a path that had files": rq.MovePath(path="z", to="a/c"),
    "a file where a directory replaced one": rq.ApplyChanges(
        base_version=13,
        changes=[rq.DeleteChange(path="x"), rq.PutChange(path="x", content="file again")],
    ),
    "apply on an old base, a path changed since": rq.ApplyChanges(
        base_version=4,
        changes=[rq.PutChange(path="a/c/d.txt", content="stale")],
        on_conflict="skip",
    ),
    "apply on an old base, a parent changed since": rq.ApplyChanges(
        base_version=10,
        changes=[rq.PutChange(path="gone/new.txt", content="n")],
        on_conflict="skip",
    ),
    "delete a directory whose deleted contents changed since": rq.ApplyChanges(
        base_version=3, changes=[rq.DeleteChange(path="a")], on_conflict="skip"
    ),
    "delete a directory only a deleted file of changed in since": rq.ApplyChanges(
        base_version=13, changes=[rq.DeleteChange(path="keep")], on_conflict="skip"
    ),
    "delete a directory unchanged since": rq.ApplyChanges(
        base_version=15, changes=[rq.DeleteChange(path="keep")]
    ),
    "restore a version whose files were deleted": rq.RestorePath(version=4),
    "restore one deleted file": rq.RestorePath(version=11, path="gone/deep/f.txt"),
}


async def decided(store: Store, state: WorkspaceState, cmd: rq.Request, b: LogBuilder) -> Decision:
    """``cmd`` decided on ``state`` as the writer does: what ``needs`` names is looked up in
    the projection first (the past tree of a restore, then its files' history)."""
    ws = store.workspace_id(state.tenant, state.workspace)
    wanted = needs(state, cmd)
    await store.look_up(state.tree, ws, wanted)
    past = None
    if wanted.past is not None:
        assert ws is not None
        past = Tree()
        for node in await store.entries_at(ws, *wanted.past, with_scope=True):
            place(past, node)
        await store.look_up(state.tree, ws, needs(state, cmd, past))
    ctx = Context(version=state.version + 1, at=T0, content=b.contents.get, past=past)
    return decide(state, cmd, ctx)


@pytest.mark.parametrize("name", list(COMMANDS))
async def test_a_loaded_state_decides_as_the_fold(tmp_path: Path, name: str) -> None:
    b = history()
    cmd = COMMANDS[name]
    store = await Store.open(tmp_path / "w.db", role="writer")
    try:
        await store.apply(b.log)
        loaded = await store.load_state("acme", "demo")
        assert loaded.tree.partial
        folded = b.replay()
        outcomes = []
        for state in (loaded, folded):
            try:
                outcomes.append(await decided(store, state, cmd, b))
            except QuillError as exc:
                outcomes.append(exc)
    finally:
        await store.close()
    mine, truth = outcomes
    assert type(mine) is type(truth)
    if isinstance(truth, QuillError):
        assert isinstance(mine, QuillError) and (mine.code, mine.message) == (
            truth.code,
            truth.message,
        )
    else:
        assert isinstance(mine, Decision)
        assert mine.result == truth.result and mine.changes == truth.changes


async def test_a_history_not_looked_up_is_never_guessed(tmp_path: Path) -> None:
    """A decision that reads a path's history without ``needs`` naming it fails loudly
    (``LookupError``), never reusing a file version (an etag) the path had."""
    b = history()
    store = await Store.open(tmp_path / "w.db", role="writer")
    try:
        await store.apply(b.log)
        loaded = await store.load_state("acme", "demo")
    finally:
        await store.close()
    ctx = Context(version=loaded.version + 1, at=T0, content=b.contents.get)
    with pytest.raises(LookupError):
        decide(loaded, rq.WriteFile(path="a/c/d.txt", content="again"), ctx)
