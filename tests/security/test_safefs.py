"""``infra.safefs`` against real files: no operation follows a link, writes through
a hard link, or walks into a directory swapped for a link after it was listed."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import safefs
from infra.safefs import Changed, Dir, open_parent, parent_of, walk
from tests.helpers import small_tree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return small_tree(tmp_path / "tree")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory with a file that must never change."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "file").write_text("host\n")
    (host / "file").chmod(0o600)
    return host


def unchanged(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["file"]
    assert (outside / "file").read_text() == "host\n"
    assert stat.S_IMODE((outside / "file").stat().st_mode) == 0o600


def test_write_replaces_a_link_and_never_writes_through_it(tree: Path, outside: Path) -> None:
    (tree / "pwn.txt").symlink_to(outside / "file")
    with Dir.open(tree) as root:
        st = root.write_file("pwn.txt", b"mine\n", 0o755)
    assert not (tree / "pwn.txt").is_symlink() and (tree / "pwn.txt").read_text() == "mine\n"
    assert st.st_ino == (tree / "pwn.txt").stat().st_ino and stat.S_IMODE(st.st_mode) == 0o755
    unchanged(outside)


def test_temporary_names_are_unpredictable_and_never_followed(
    tree: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {safefs.temp_name() for _ in range(100)}
    assert len(names) == 100
    # Were a name guessed, the link there makes the write fail: it is never followed.
    (tree / ".quill-guessed.tmp").symlink_to(outside / "file")
    monkeypatch.setattr(safefs, "temp_name", lambda: ".quill-guessed.tmp")
    with Dir.open(tree) as root, pytest.raises(FileExistsError):
        root.write_file("f.txt", b"new\n", 0o644)
    assert (tree / "f.txt").read_text() == "f\n"
    unchanged(outside)


def test_a_write_and_a_mode_change_leave_other_hard_links_alone(tree: Path) -> None:
    os.link(tree / "f.txt", tree / "other")
    with Dir.open(tree) as root:
        root.set_mode("f.txt", 0o755)
        assert stat.S_IMODE((tree / "other").stat().st_mode) == 0o644
        assert os.access(tree / "f.txt", os.X_OK) and (tree / "f.txt").read_text() == "f\n"
        root.write_file("f.txt", b"changed\n", 0o644)
    assert (tree / "other").read_text() == "f\n"
    # a file with no other name changes mode in place
    inode = (tree / "d/x.txt").stat().st_ino
    with Dir.open(tree / "d") as d:
        st = d.set_mode("x.txt", 0o700)
    assert st.st_ino == inode and stat.S_IMODE((tree / "d/x.txt").stat().st_mode) == 0o700


def test_no_read_or_mode_change_through_a_link(tree: Path, outside: Path) -> None:
    (tree / "link").symlink_to(outside / "file")
    with Dir.open(tree) as root:
        with pytest.raises(OSError) as read:
            root.read_file("link", 1024)
        assert read.value.errno == errno.ELOOP
        with pytest.raises(OSError) as chmod:
            root.set_mode("link", 0o777)
        assert chmod.value.errno == errno.ELOOP
    unchanged(outside)


def test_reads_check_what_they_opened(tree: Path) -> None:
    os.mkfifo(tree / "fifo")
    with Dir.open(tree) as root:
        with pytest.raises(Changed):  # no blocking on a FIFO: not a regular file
            root.read_file("fifo", 1024)
        with pytest.raises(Changed):
            root.read_file("f.txt", 1)  # over the limit
        listed = os.lstat(tree / "f.txt")
        os.rename(tree / "d/x.txt", tree / "f.txt")  # swapped after the listing
        with pytest.raises(Changed):
            root.read_file("f.txt", 1024, listed)
        data, st = root.read_file("f.txt", 1024)
    assert data == b"x\n" and st.st_size == 2


def test_parents_are_opened_without_following_links(tree: Path, outside: Path) -> None:
    (tree / "up").symlink_to(outside)
    (tree / "d/up").symlink_to(outside)
    with Dir.open(tree) as root:
        assert open_parent(root, "up/file") is None
        assert open_parent(root, "d/up/file") is None
        assert open_parent(root, "f.txt/x") is None
        with parent_of(root, "up/new/file.txt", create=True) as found:
            assert found is not None
            found[0].write_file(found[1], b"in\n", 0o644)
        with parent_of(root, "f.txt/y.txt", create=True) as found:  # a file on the way
            assert found is not None
            found[0].write_file(found[1], b"y\n", 0o644)
    assert (tree / "up").is_dir() and not (tree / "up").is_symlink()
    assert (tree / "up/new/file.txt").read_text() == "in\n"
    assert (tree / "f.txt/y.txt").read_text() == "y\n"
    unchanged(outside)


def test_removing_a_link_removes_the_link(tree: Path, outside: Path) -> None:
    (tree / "up").symlink_to(outside)
    with Dir.open(tree) as root:
        root.remove("up")
        root.remove("d")
        root.remove("missing")
    assert not (tree / "up").exists() and not (tree / "d").exists()
    unchanged(outside)


def test_a_walk_does_not_follow_links(tree: Path, outside: Path) -> None:
    (tree / "d/up").symlink_to(outside)
    with Dir.open(tree) as root:
        seen = {rel: stat.S_IFMT(st.st_mode) for rel, _, _, st in walk(root, lambda _: False)}
    assert seen == {
        "d": stat.S_IFDIR,
        "d/up": stat.S_IFLNK,
        "d/x.txt": stat.S_IFREG,
        "f.txt": stat.S_IFREG,
    }


def test_a_directory_swapped_after_its_listing_is_not_entered(tree: Path, outside: Path) -> None:
    (tree / "e").mkdir()
    (tree / "e/y.txt").write_text("y\n")
    seen = []
    with Dir.open(tree) as root:
        for rel, _, _, _ in walk(root, lambda _: False):
            seen.append(rel)
            if rel == "f.txt":  # listed, not entered yet: swap both directories
                os.rename(tree / "d", tree / "d.away")
                os.symlink(outside, tree / "d")
                os.rename(tree / "e", tree / "e.away")
                os.rename(tree / "d.away", tree / "e")  # a real directory, not the listed one
    assert seen == ["d", "e", "f.txt"]


def test_a_walk_prunes_and_closes_what_it_opened(tree: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    with Dir.open(tree) as root:
        assert [rel for rel, *_ in walk(root, lambda rel: rel == "d")] == ["f.txt"]
        for _ in walk(root, lambda _: False):
            break  # abandoned half-way
    assert len(os.listdir("/proc/self/fd")) == before


def test_names_are_single_names(tree: Path) -> None:
    with Dir.open(tree) as root:
        for bad in ("d/x.txt", "..", ".", ""):
            with pytest.raises(OSError):
                root.read_file(bad, 10)


# ------------------------------------------------------------------ deep trees (issue 28, item 3)

DEEP = 1200
"""Levels: past Python's recursion limit (1,000), where ``shutil.rmtree`` raised
``RecursionError``, and many times ``safefs.MAX_OPEN``."""


def chain(top: Path, levels: int) -> list[Path]:
    """``top/d/d/...`` ``levels`` deep with a file at each level; each directory, outermost
    first (made through descriptors: the path would soon be too long for the kernel)."""
    top.mkdir()
    made, fd = [], os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    path = top
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, path = child, path / "d"
            made.append(path)
    finally:
        os.close(fd)
    return made


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def deep(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, emptied afterwards by ``rm -rf`` (iterative): a tree this deep left there
    would break pytest's own clean-up of its temporary directories later (``shutil.rmtree``)."""
    try:
        yield tmp_path
    finally:
        for path in tmp_path.iterdir():
            subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


def test_a_deep_walk_holds_few_descriptors(deep: Path) -> None:
    tmp_path = deep
    chain(tmp_path / "tree", DEEP)
    before, most = descriptors(), 0
    with Dir.open(tmp_path / "tree") as root:
        seen, deepest = 0, 0
        for rel, parent, name, _ in walk(root, lambda _: False):
            seen, deepest = seen + 1, max(deepest, rel.count("/"))
            if seen % 50 == 0:
                most = max(most, descriptors())
            if name == "f":  # the directory an item names is open until the walk moves on
                assert parent.lstat("f") is not None
    assert (seen, deepest) == (2 * DEEP, DEEP - 1)  # every level, to the last file
    assert most <= before + safefs.MAX_OPEN + 3  # before: one descriptor per level
    assert descriptors() == before


def test_a_deep_walk_stops_where_a_closed_directory_was_moved(deep: Path, outside: Path) -> None:
    tmp_path = deep
    made = chain(tmp_path / "tree", 4 * safefs.MAX_OPEN)
    (tmp_path / "tree/side").mkdir()  # entered after d's subtree: skipped with the rest
    (tmp_path / "tree/side/x").write_text("x\n")
    seen = []
    with Dir.open(tmp_path / "tree") as root:
        for rel, _, _, _ in walk(root, lambda _: False):
            seen.append(rel)
            if rel.count("/") == 3 * safefs.MAX_OPEN and not (outside / "moved").exists():
                os.rename(made[5], outside / "moved")  # its ancestors' descriptors are closed
    assert not any(rel.startswith("side/") or "file" in rel for rel in seen)
    assert sorted(p.name for p in outside.iterdir()) == ["file", "moved"]


def test_removing_a_deep_tree_is_iterative_bounded_and_resumable(deep: Path, outside: Path) -> None:
    tmp_path = deep
    chain(tmp_path / "tree", DEEP)
    (tmp_path / "tree/d/d/up").symlink_to(outside)
    for i in range(3 * 1024):  # a directory wider than one listing batch
        (tmp_path / "tree/d" / f"sub{i}").mkdir()
    with Dir.open(tmp_path) as top:
        before, rounds = descriptors(), 0
        while not safefs.remove_tree(top, "tree", budget=500):  # at most 500 entries a call
            rounds += 1
            assert descriptors() == before
        assert rounds >= (2 * DEEP + 3 * 1024) // 500 - 1
        assert not (tmp_path / "tree").exists() and descriptors() == before
    unchanged(outside)


def test_what_a_dir_with_an_owner_makes_is_the_owners(tree: Path) -> None:
    if os.geteuid() != 0:
        print("not root: cannot give files to another uid")
        pytest.skip("not root: cannot give files to another uid")
    owner = (2_000_000_000, 2_000_000_000)
    with Dir.open(tree, owner) as root:
        made = root.ensure_dir("new")
        with made:
            made.write_file("x.txt", b"x", 0o644)
        root.write_file("f.txt", b"rewritten", 0o755)
        kept = root.ensure_dir("d")  # already there: left as it is
        kept.close()
    for path in ("new", "new/x.txt", "f.txt"):
        st = (tree / path).lstat()
        assert (st.st_uid, st.st_gid) == owner, path
    assert (tree / "d").stat().st_uid == 0
