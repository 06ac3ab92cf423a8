"""``quill pull`` and ``quill push``: a workspace's tree into a folder, and a folder into a
workspace as one commit, as a user (or a hostile folder) would use them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from contracts.errors import QuillError
from quill_cli.commands.transfer import _parts
from tests.up import Up


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under ``root``, by relative path."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        out[rel] = path.read_bytes() if path.is_file() else None
    return out


def test_push_then_pull_round_trips_byte_for_byte(up: Up, tmp_path: Path) -> None:
    ws = "acme/transfer"
    up.cli("create", ws)
    src = tmp_path / "src"
    (src / "docs" / "deep").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "docs" / "deep" / "a.md").write_text("# a\n")
    (src / "blob.bin").write_bytes(bytes(range(256)) * 40)
    (src / "odd name - é ü.txt").write_text("odd\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref: x\n")
    (src / "passwd").symlink_to("/etc/passwd")

    pushed = up.cli("push", str(src), ws, "-m", "first")
    assert pushed.stdout.startswith(f"pushed {src} to {ws}: 5 paths changed")
    assert "quill: not pushed: passwd (a symbolic link)" in pushed.stderr
    events = json.loads(up.cli("--json", "log", ws).stdout)["events"]
    assert len(events) == 2  # created, then the whole folder as one commit
    assert up.cli("push", str(src), ws).stdout.startswith(f"unchanged: {ws} version 2")

    out = tmp_path / "out"
    pulled = up.cli("pull", ws, str(out))
    assert pulled.stdout.startswith(f"pulled {ws} version 2 into {out}: 4 files, 3 directories")
    expected = {k: v for k, v in tree(src).items() if not k.startswith((".git", "passwd"))}
    assert tree(out) == expected
    assert os.stat(out / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(out / "blob.bin").st_mode & 0o777 == 0o644

    (src / "blob.bin").unlink()
    (src / "docs" / "new.txt").write_text("new\n")
    assert "2 paths changed" in up.cli("push", str(src), ws, "--delete").stdout
    up.cli("pull", ws, str(tmp_path / "now"))
    now = tree(tmp_path / "now")
    assert "blob.bin" not in now and now["docs/new.txt"] == b"new\n"
    old = tmp_path / "old"
    up.cli("pull", ws, str(old), "--version", "2")
    assert (old / "blob.bin").read_bytes() == bytes(range(256)) * 40

    again = up.cli("pull", ws, str(out), check=False)
    assert again.returncode == 1 and "not empty" in again.stderr


def test_pull_never_writes_through_a_link_in_the_directory(up: Up, tmp_path: Path) -> None:
    ws = "acme/hostile-pull"
    up.cli("create", ws)
    up.cli("put", ws, "docs/secret.txt", "--text", "mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "docs").symlink_to(elsewhere)
    r = up.cli("pull", ws, str(out), "--force", check=False)
    assert r.returncode == 5 and "symbolic link" in r.stderr
    assert list(elsewhere.iterdir()) == []
    (out / "docs").unlink()
    (out / "docs").mkdir()
    (out / "docs" / "secret.txt").symlink_to(elsewhere / "target")
    up.cli("pull", ws, str(out), "--force")
    assert not (out / "docs" / "secret.txt").is_symlink()  # the link replaced, not followed
    assert (out / "docs" / "secret.txt").read_text() == "mine"
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\0b", ""])
def test_pull_refuses_a_path_that_leaves_the_directory(path: str) -> None:
    with pytest.raises(QuillError) as caught:
        _parts(path)
    assert caught.value.code == "ACCESS_DENIED"


def test_push_respects_the_workspace_s_limits(up: Up, tmp_path: Path) -> None:
    ws = "acme/small"
    up.cli("create", ws, "--max-file-bytes", "1000")
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(b"x" * 1001)
    r = up.cli("push", str(src), ws, check=False)
    assert r.returncode == 1 and "SIZE_LIMIT_EXCEEDED" in r.stderr and "max_file_bytes" in r.stderr
    (src / "big.bin").unlink()
    for i in range(3):
        (src / f"f{i}.txt").write_text(str(i))
    bad = src / "bad\\name"
    bad.write_text("z")
    done = up.cli("push", str(src), ws)
    assert "3 paths changed" in done.stdout and "not a workspace path" in done.stderr
