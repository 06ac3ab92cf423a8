"""decide: every command's semantics on an in-memory state, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import MakeDir, PutFile, Remove
from contracts.limits import LimitsPatch, effective_limits
from core.decide import decide
from core.decision import Context, Decision
from core.evolve import WorkspaceState
from core.tree import Tree, apply_change

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Harness:
    """A workspace state and a store of contents, committing decisions like the writer."""

    def __init__(self, **limits: int) -> None:
        self.state = WorkspaceState("acme", "demo")
        self.blobs: dict[str, bytes] = {}
        self.run(rq.CreateWorkspace(limits=LimitsPatch(**limits) if limits else None))

    def run(self, cmd: rq.Request) -> Decision:
        ctx = Context(version=self.state.version + 1, at=T0, content=self.blobs.get)
        with self.state.tree.savepoint():
            decision = decide(self.state, cmd, ctx)
        if decision.created is not None:
            self.state.exists = True
            self.state.trust, self.state.limits = decision.created
        for change in decision.changes:
            if isinstance(change, PutFile) and change.sha256 not in self.blobs:
                self.blobs[change.sha256] = (
                    change.text.encode() if change.text is not None else change.data or b""
                )
        if decision.commits:
            self.state.version += 1
        return decision

    def fails(self, cmd: rq.Request, code: ErrorCode) -> QuillError:
        before = (self.state.version, dict(self.state.tree.files), self.state.tree.hash)
        with pytest.raises(QuillError) as info:
            self.run(cmd)
        assert info.value.code == code, info.value
        after = (self.state.version, dict(self.state.tree.files), self.state.tree.hash)
        assert after == before, "a refused command must leave no trace"
        return info.value

    def text(self, path: str) -> str:
        return self.blobs[self.state.tree.files[path].sha256].decode()


def test_commands_need_a_workspace() -> None:
    state = WorkspaceState("acme", "nope")
    ctx = Context(version=1, at=T0, content=lambda _: None)
    with pytest.raises(QuillError) as info:
        decide(state, rq.WriteFile(path="a", content="x"), ctx)
    assert info.value.code == ErrorCode.WORKSPACE_NOT_FOUND


def test_create_twice() -> None:
    h = Harness()
    h.fails(rq.CreateWorkspace(), ErrorCode.ALREADY_EXISTS)
    d = h.run(rq.CreateWorkspace(exist_ok=True))
    assert not d.commits and isinstance(d.result, rp.WorkspaceCreatedResult)
    assert d.result.created is False


def test_write_creates_parents_and_versions() -> None:
    h = Harness()
    d = h.run(rq.WriteFile(path="/workspace/a/b/c.txt", content="hello"))
    assert [type(c) for c in d.changes] == [MakeDir, MakeDir, PutFile]
    assert d.result == rp.FileWritten(
        path="a/b/c.txt",
        bytes_written=5,
        size=5,
        file_version=1,
        etag="v1",
        created=True,
        modified=T0,
    )
    d = h.run(rq.WriteFile(path="a/b/c.txt", content="bye"))
    assert isinstance(d.result, rp.FileWritten)
    assert (d.result.file_version, d.result.created, len(d.changes)) == (2, False, 1)


def test_write_modes_and_etags() -> None:
    h = Harness()
    h.run(rq.WriteFile(path="log.txt", content="one\n"))
    h.fails(rq.WriteFile(path="log.txt", content="x", mode="create"), ErrorCode.ALREADY_EXISTS)
    d = h.run(rq.WriteFile(path="log.txt", content="two\n", mode="append"))
    assert isinstance(d.result, rp.FileWritten)
    assert (d.result.bytes_written, d.result.size) == (4, 8)
    assert h.text("log.txt") == "one\ntwo\n"
    err = h.fails(rq.WriteFile(path="log.txt", content="x", if_match="v1"), ErrorCode.CONFLICT)
    assert err.details["current_etag"] == "v2"
    h.run(rq.WriteFile(path="log.txt", content="three", if_match='"v2"'))
    assert h.text("log.txt") == "three"
    h.fails(rq.WriteFile(path="new.txt", content="x", if_match="v1"), ErrorCode.CONFLICT)


def test_write_refusals() -> None:
    h = Harness(max_file_bytes=10, max_files=2)
    h.run(rq.WriteFile(path="d/f", content="x"))
    h.fails(rq.WriteFile(path="d", content="x"), ErrorCode.NOT_A_FILE)
    h.fails(rq.WriteFile(path="d/f/g", content="x"), ErrorCode.NOT_A_DIRECTORY)
    h.fails(rq.WriteFile(path="big", content="x" * 11), ErrorCode.SIZE_LIMIT_EXCEEDED)
    h.fails(rq.WriteFile(path="../x", content="x"), ErrorCode.ACCESS_DENIED)
    h.fails(rq.WriteFile(path="x"), ErrorCode.INVALID_ARGUMENT)
    h.fails(rq.WriteFile(path="x", content="a", data=b"a"), ErrorCode.INVALID_ARGUMENT)
    h.fails(rq.WriteFile(path="p/q", content="x", create_parents=False), ErrorCode.FILE_NOT_FOUND)
    h.run(rq.WriteFile(path="second", content="x"))
    h.fails(rq.WriteFile(path="third", content="x"), ErrorCode.SIZE_LIMIT_EXCEEDED)
    h.fails(rq.WriteFile(path="d/f", content="x", expected_version=1), ErrorCode.CONFLICT)


def test_binary_content_is_kept_as_bytes() -> None:
    h = Harness()
    d = h.run(rq.WriteFile(path="img.bin", data=b"\x89PNG\x00\xff"))
    put = d.changes[-1]
    assert isinstance(put, PutFile) and put.binary and put.data == b"\x89PNG\x00\xff"
    d = h.run(rq.WriteFile(path="t.txt", data="héllo".encode()))
    put = d.changes[-1]
    assert isinstance(put, PutFile) and not put.binary and put.text == "héllo"


def test_mkdir_is_idempotent_and_refuses_files() -> None:
    h = Harness()
    d = h.run(rq.MakeDirectory(path="x/y"))
    assert d.result == rp.DirectoryMade(path="x/y", created=["x", "x/y"])
    d = h.run(rq.MakeDirectory(path="x/y"))
    assert not d.commits
    h.run(rq.WriteFile(path="x/f", content=""))
    err = h.fails(rq.MakeDirectory(path="x/f/z"), ErrorCode.NOT_A_DIRECTORY)
    assert err.message == "Path exists but is not a directory: x/f"


def test_delete() -> None:
    h = Harness()
    h.run(rq.WriteFile(path="d/a", content="1"))
    h.run(rq.WriteFile(path="d/e/b", content="2"))
    h.fails(rq.DeletePath(path="d"), ErrorCode.INVALID_ARGUMENT)
    h.fails(rq.DeletePath(path="nope"), ErrorCode.FILE_NOT_FOUND)
    h.fails(rq.DeletePath(path=""), ErrorCode.INVALID_ARGUMENT)
    assert not h.run(rq.DeletePath(path="nope", missing_ok=True)).commits
    d = h.run(rq.DeletePath(path="d", recursive=True))
    assert d.result == rp.PathDeleted(path="d", kind="directory", deleted=4)
    assert d.changes == [Remove(path="d")]
    assert h.state.tree.files == {} and h.state.tree.dirs == {}
    d = h.run(rq.WriteFile(path="d/a", content="again"))
    assert isinstance(d.result, rp.FileWritten) and d.result.file_version == 2  # survives


def test_move_file_and_directory() -> None:
    h = Harness()
    h.run(rq.WriteFile(path="src/a.py", content="a"))
    h.run(rq.WriteFile(path="src/pkg/b.py", content="b"))
    h.run(rq.WriteFile(path="other.txt", content="o"))
    h.fails(rq.MovePath(path="src", to="src/inner"), ErrorCode.INVALID_ARGUMENT)
    h.fails(rq.MovePath(path="other.txt", to="src/a.py"), ErrorCode.ALREADY_EXISTS)
    h.fails(rq.MovePath(path="missing", to="x"), ErrorCode.FILE_NOT_FOUND)
    tree_before = h.state.tree.hash
    d = h.run(rq.MovePath(path="src", to="lib/src"))
    assert d.result == rp.PathMoved(path="src", to="lib/src", kind="directory", moved=4)
    assert sorted(h.state.tree.files) == ["lib/src/a.py", "lib/src/pkg/b.py", "other.txt"]
    assert h.text("lib/src/pkg/b.py") == "b"
    assert h.state.tree.hash != tree_before
    h.run(rq.MovePath(path="other.txt", to="lib/src/a.py", overwrite=True))
    assert h.text("lib/src/a.py") == "o"
    assert h.state.tree.files["lib/src/a.py"].file_version == 2


def test_apply_commits_all_or_reports_conflicts() -> None:
    h = Harness()
    h.run(rq.WriteFile(path="a.txt", content="a"))  # v2
    h.run(rq.WriteFile(path="b.txt", content="b"))  # v3
    base = h.state.version
    h.run(rq.WriteFile(path="a.txt", content="changed meanwhile"))  # v4
    changes = [
        rq.PutChange(path="a.txt", content="mine"),
        rq.PutChange(path="c/d.txt", content="new"),
        rq.DeleteChange(path="b.txt"),
        rq.MkdirChange(path="e/f"),
    ]
    err = h.fails(rq.ApplyChanges(base_version=base, changes=changes), ErrorCode.CONFLICT)
    assert err.details["conflicts"] == [{"path": "a.txt", "reason": "changed after base_version"}]
    d = h.run(rq.ApplyChanges(base_version=base, changes=changes, on_conflict="skip"))
    assert isinstance(d.result, rp.ChangesApplied)
    assert d.result.applied == ["c/d.txt", "b.txt", "e/f"]
    assert [c.path for c in d.result.conflicts] == ["a.txt"]
    assert h.text("a.txt") == "changed meanwhile"
    assert "b.txt" not in h.state.tree.files and h.text("c/d.txt") == "new"
    assert h.state.tree.kind("e/f") == "d"


def test_apply_refuses_bad_sets() -> None:
    h = Harness()
    dup = [rq.PutChange(path="a", content="1"), rq.PutChange(path="./a", content="2")]
    h.fails(rq.ApplyChanges(base_version=1, changes=dup), ErrorCode.INVALID_ARGUMENT)
    h.fails(
        rq.ApplyChanges(base_version=9, changes=[rq.DeleteChange(path="a")]),
        ErrorCode.INVALID_ARGUMENT,
    )
    h.run(rq.WriteFile(path="f", content="x"))
    bad = [rq.PutChange(path="ok", content="1"), rq.PutChange(path="f/g", content="2")]
    h.fails(rq.ApplyChanges(base_version=2, changes=bad), ErrorCode.NOT_A_DIRECTORY)


def test_apply_delete_conflicts_when_contents_changed() -> None:
    h = Harness()
    h.run(rq.WriteFile(path="d/x", content="1"))
    base = h.state.version
    h.run(rq.WriteFile(path="d/y", content="2"))
    err = h.fails(
        rq.ApplyChanges(base_version=base, changes=[rq.DeleteChange(path="d")]),
        ErrorCode.CONFLICT,
    )
    assert err.details["conflicts"][0]["reason"] == "contents changed after base_version"


def test_limits_override_has_ceilings() -> None:
    with pytest.raises(QuillError) as info:
        effective_limits(LimitsPatch(max_file_bytes=10**12))
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_tree_hash_is_order_independent() -> None:
    def build(order: list[str]) -> Tree:
        tree = Tree()
        for i, path in enumerate(order, 1):
            apply_change(tree, MakeDir(path="d"), i, T0) if tree.kind("d") is None else None
            apply_change(
                tree,
                PutFile(path=path, sha256=path * 2, size=1, file_version=1, created=T0),
                i,
                T0,
            )
        return tree

    assert build(["d/a", "d/b", "d/c"]).hash == build(["d/c", "d/a", "d/b"]).hash
    tree = build(["d/a"])
    empty_with_dir = Tree()
    apply_change(empty_with_dir, MakeDir(path="d"), 1, T0)
    apply_change(tree, Remove(path="d/a"), 5, T0)
    assert tree.hash == empty_with_dir.hash


def test_savepoints_nest_and_roll_back() -> None:
    tree = Tree()
    apply_change(tree, MakeDir(path="d"), 1, T0)
    put = PutFile(path="d/a", sha256="aa", size=3, file_version=1, created=T0)
    apply_change(tree, put, 2, T0)
    snapshot = (dict(tree.files), dict(tree.dirs), tree.hash, tree.total_bytes, dict(tree.changed))
    with pytest.raises(RuntimeError), tree.savepoint():
        apply_change(tree, Remove(path="d"), 3, T0)
        with tree.savepoint():
            apply_change(tree, MakeDir(path="z"), 3, T0)
        raise RuntimeError
    assert (dict(tree.files), dict(tree.dirs), tree.hash, tree.total_bytes, dict(tree.changed)) == (
        snapshot
    )
    assert tree.names("") == ["d"] and tree.names("d") == ["a"]


def test_a_name_from_before_the_name_rule_can_be_deleted_or_renamed_not_made() -> None:
    """A log may hold a name the rule now refuses (a zero-width space was accepted before):
    it can still be named to delete it or move it to a valid name, never to write one."""
    h = Harness()
    h.run(rq.WriteFile(path="keep.txt", content="k\n"))
    legacy = "notes\u200b.txt"
    sha = h.state.tree.files["keep.txt"].sha256
    change = PutFile(path=legacy, sha256=sha, size=2, file_version=1, created=T0)
    apply_change(h.state.tree, change, h.state.version + 1, T0)
    h.state.version += 1
    h.fails(rq.WriteFile(path=legacy, content="new\n"), ErrorCode.INVALID_ARGUMENT)
    h.fails(rq.MovePath(path="keep.txt", to="x\u200b.txt"), ErrorCode.INVALID_ARGUMENT)
    moved = h.run(rq.MovePath(path=legacy, to="notes.txt"))
    assert moved.commits and "notes.txt" in h.state.tree.files
    assert legacy not in h.state.tree.files
    h.run(rq.MovePath(path="notes.txt", to="other.txt"))
    apply_change(h.state.tree, change, h.state.version + 1, T0)
    h.state.version += 1
    assert h.run(rq.DeletePath(path=legacy)).commits and legacy not in h.state.tree.files
    h.fails(rq.DeletePath(path="gone\u200b.txt"), ErrorCode.INVALID_ARGUMENT)


def test_a_weak_etag_never_satisfies_if_match() -> None:
    """RFC 9110: If-Match uses the strong comparison, on the bus as over REST."""
    h = Harness()
    h.run(rq.WriteFile(path="a.txt", content="a\n"))
    etag = h.state.tree.files["a.txt"].etag
    error = h.fails(
        rq.WriteFile(path="a.txt", content="b\n", if_match=f'W/"{etag}"'), ErrorCode.CONFLICT
    )
    assert "weak" in error.message
    assert h.run(rq.WriteFile(path="a.txt", content="b\n", if_match=f'"{etag}"')).commits
