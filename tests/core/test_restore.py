"""restore: a path or the whole workspace back to an earlier version, as a new event."""

from __future__ import annotations

import pytest

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.replies import Restored
from core.decide import decide
from core.decision import Context
from tests.core.build import T0, LogBuilder


def files(b: LogBuilder) -> dict[str, str]:
    return {p: b.contents[n.sha256].decode() for p, n in b.state.tree.files.items()}


def build() -> LogBuilder:
    b = LogBuilder()
    b.run(rq.CreateWorkspace(), "create")  # v1
    b.run(rq.WriteFile(path="notes/a.md", content="a1"))  # v2
    b.run(rq.WriteFile(path="notes/b.md", content="b1"))  # v3
    b.run(rq.WriteFile(path="src/x.py", content="x1"))  # v4
    b.run(rq.WriteFile(path="notes/a.md", content="a2"))  # v5
    b.run(rq.DeletePath(path="notes/b.md"), "delete")  # v6
    b.run(rq.WriteFile(path="notes/c.md", content="c1"))  # v7
    b.run(rq.DeletePath(path="src", recursive=True), "delete")  # v8
    return b


def test_restore_the_whole_workspace() -> None:
    b = build()
    b.run(rq.RestorePath(version=4), "restore")  # v9
    assert files(b) == {"notes/a.md": "a1", "notes/b.md": "b1", "src/x.py": "x1"}
    assert b.state.tree.hash == b.replay(4).tree.hash  # identical tree
    assert b.state.tree.files["notes/a.md"].file_version == 3  # versions keep counting
    event = b.log[-1].event
    assert event.version == 9 and event.op == "restore"


def test_restore_one_directory_leaves_the_rest() -> None:
    b = build()
    b.run(rq.RestorePath(version=3, path="notes"), "restore")
    assert files(b) == {"notes/a.md": "a1", "notes/b.md": "b1"}  # c.md removed, src untouched
    b.run(rq.RestorePath(version=7, path="src/x.py"), "restore")
    assert files(b)["src/x.py"] == "x1"


def test_restore_a_path_that_did_not_exist_deletes_it() -> None:
    b = build()
    b.run(rq.RestorePath(version=2, path="notes/c.md"), "restore")
    assert "notes/c.md" not in b.state.tree.files


def test_restore_refusals() -> None:
    b = build()
    with pytest.raises(QuillError) as info:
        b.run(rq.RestorePath(version=99), "restore")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    ctx = Context(version=9, at=T0, content=b.contents.get, past=b.replay(8).tree)
    with b.state.tree.savepoint():
        decision = decide(b.state, rq.RestorePath(version=8), ctx)
    assert not decision.commits  # already as it was at version 8: no event
    assert isinstance(decision.result, Restored) and decision.result.committed is False


@pytest.mark.parametrize("path", ["../etc", "/etc/passwd", "notes/../../x"])
def test_restore_outside_the_workspace_is_access_denied(path: str) -> None:
    """``needs`` names no past tree for a path that leaves the workspace; ``decide`` refuses
    it like every other op (it was an AssertionError, INTERNAL, failing the whole group)."""
    from core.decide import needs

    b = build()
    cmd = rq.RestorePath(version=3, path=path)
    assert needs(b.state, cmd).past is None
    ctx = Context(version=b.state.version + 1, at=T0, content=b.contents.get, past=None)
    with pytest.raises(QuillError) as info:
        decide(b.state, cmd, ctx)
    assert info.value.code == ErrorCode.ACCESS_DENIED
