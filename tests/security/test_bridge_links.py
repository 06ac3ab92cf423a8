"""The local-folder bridge against a link that appears after it looked: its confinement
(``locate``, ``locate_for_change``) checks the path, then every read, write, move and walk
opens it again from the folder's root without following any link, so a part swapped for a
link in between is refused or not found, never followed. Real files; the swap is made right
after the check, as a process racing the bridge would make it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from core.decision import Decision
from core.rows import Node
from services.bridge.changes import LocalChanges
from services.bridge.folder import Folder
from services.bridge.queries import LocalQueries
from tests.helpers import small_tree


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    host = tmp_path / "outside"
    host.mkdir()
    (host / "secret.txt").write_text("top secret\n")
    return host


@pytest.fixture
def folder(tmp_path: Path) -> Folder:
    return Folder(small_tree(tmp_path / "folder"))


def unchanged(outside: Path) -> None:
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


def swap_after(folder: Folder, method: str, swap: Callable[[], None]) -> None:
    """Make ``folder.<method>`` swap a name for a link right after it checked."""
    checked = getattr(folder, method)

    def racing(path: str) -> Path:
        found: Path = checked(path)
        swap()
        return found

    setattr(folder, method, racing)


def to_link(path: Path, target: Path) -> Callable[[], None]:
    """Swap ``path`` for a link to ``target`` (once)."""

    def swap() -> None:
        if not path.is_symlink():
            os.rename(path, path.with_name(path.name + ".away"))
            path.symlink_to(target)

    return swap


COMMANDS = [
    rq.WriteFile(path="d/new.txt", content="planted\n"),
    rq.WriteFile(path="d/x.txt", content="planted\n"),
    rq.MakeDirectory(path="d/sub"),
    rq.DeletePath(path="d/x.txt"),
    rq.MovePath(path="f.txt", to="d/moved.txt"),
]


@pytest.mark.parametrize("command", COMMANDS)
def test_no_change_goes_through_a_link_that_appears_after_the_check(
    folder: Folder, outside: Path, command: rq.Request
) -> None:
    changes = LocalChanges(folder, "acme", "laptop", "full")
    swap_after(folder, "locate_for_change", to_link(folder.root / "d", outside))
    with pytest.raises(QuillError):  # what decide makes of a link: refused either way
        changes.commit(command, {})
    unchanged(outside)


@pytest.mark.parametrize("command", COMMANDS)
def test_no_change_goes_through_a_link_that_appears_after_the_decision(
    folder: Folder, outside: Path, command: rq.Request
) -> None:
    changes = LocalChanges(folder, "acme", "laptop", "full")
    decide = changes.decide
    swap = to_link(folder.root / "d", outside)

    def racing(cmd: rq.Request, blobs: Mapping[str, bytes]) -> Decision:
        decision = decide(cmd, blobs)
        swap()
        return decision

    changes.decide = racing  # type: ignore[method-assign]
    with pytest.raises(QuillError) as refused:
        changes.commit(command, {})
    assert refused.value.code == ErrorCode.ACCESS_DENIED
    unchanged(outside)


def test_no_read_goes_through_a_link_that_appears_after_locate(
    folder: Folder, outside: Path
) -> None:
    swap_after(folder, "locate", to_link(folder.root / "f.txt", outside / "secret.txt"))
    real = folder.locate("f.txt")
    with pytest.raises(QuillError) as missing:
        folder.read("f.txt", real)
    assert missing.value.code == ErrorCode.FILE_NOT_FOUND
    with pytest.raises(FileNotFoundError):
        folder.read_range(real, 0, 100)
    with pytest.raises(FileNotFoundError):
        folder.digest(real, 11)
    assert folder.node("f.txt", real) is None  # the link is not shown either


def test_no_walk_goes_through_a_directory_swapped_for_a_link(folder: Folder, outside: Path) -> None:
    swap_after(folder, "locate", to_link(folder.root / "d", outside))
    real = folder.locate("d")
    assert folder.walk("d", real) == []
    assert [n.path for n in folder.walk("", folder.root)] == ["d.away", "d.away/x.txt", "f.txt"]


def test_grep_reads_no_file_swapped_for_a_link_after_the_walk(
    folder: Folder, outside: Path
) -> None:
    queries = LocalQueries(folder, "acme", "laptop", "full", "file:///laptop")
    walked = folder.walk
    swap = to_link(folder.root / "f.txt", outside / "secret.txt")

    def racing(*args: Any, **kwargs: Any) -> list[Node]:
        nodes: list[Node] = walked(*args, **kwargs)
        swap()
        return nodes

    folder.walk = racing  # type: ignore[method-assign]
    result = queries.grep(rq.GrepQuery(pattern="secret", literal=True))
    assert result.matches == []
