"""Item 6 of issue 28 (in part): a stack's data directory is its owner's only.

``reader.db``, ``writer.db`` (every file of every workspace), the logs and ``stack.json`` were
0644 in 0755 directories: any local user read every tenant's files. The attacker here is such
a user (``nobody``, by ``cat`` run as that uid), on a real ``quill up`` whose data directory a
local user can reach; a world-readable control file beside it proves the probe reads what
it may. The executor's checkout trees keep their own modes (the sandbox's user reads and
writes them): only the directories above them are closed, and commands still work.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.up import Up, running

NOBODY = 65534
SECRET = "acme's secret plan\n"
SANDBOX_TREES = ("checkouts", "scratch")


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory any local user may enter (pytest's own temporary root is 0700)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the attacker is another local user (uid 65534)")
    path = Path(tempfile.mkdtemp(prefix="quill-perms-"))
    path.chmod(0o755)
    control = path / "control.txt"
    control.write_text("anyone may read this\n")
    control.chmod(0o644)
    assert readable_by_nobody(control), "the probe cannot read a world-readable file"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def readable_by_nobody(path: Path) -> bool:
    done = subprocess.run(["cat", str(path)], user=NOBODY, capture_output=True, timeout=30)
    return done.returncode == 0


def loose(root: Path) -> list[str]:
    """Paths under ``root`` with any group or other permission bit (links aside; the sandbox's
    trees are checked themselves, not entered)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = base / name
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode) and mode & 0o077:
                found.append(f"{stat.S_IMODE(mode):o} {path.relative_to(root)}")
        dirnames[:] = [d for d in dirnames if d not in SANDBOX_TREES]
    if root.stat().st_mode & 0o077:
        found.append(f"{stat.S_IMODE(root.stat().st_mode):o} .")
    return found


def private_files(data: Path) -> list[Path]:
    files = [
        data / "stack.json",
        data / "reader" / "reader.db",
        data / "writer" / "writer.db",
        data / "nats" / "nats-server.conf",
        data / "nats" / "nats-server.log",
        *(data / "logs").glob("*.log"),
        *(data / "reader").glob("reader.db-*"),
        *(data / "writer").glob("writer.db-*"),
    ]
    assert len(files) >= 11, files  # the four services' logs, both projections' -wal/-shm
    return files


def use(up: Up) -> None:
    """A tenant's file written, read back, and used by a command in the sandbox."""
    up.cli("create", "acme/plans")
    up.cli("put", "acme/plans", "plan.md", "--text", SECRET)
    ran = up.cli("exec", "acme/plans", "cat plan.md && mkdir -p out && echo done > out/x")
    assert SECRET.strip() in ran.stdout, ran.stdout + ran.stderr
    assert up.cli("cat", "acme/plans", "out/x").stdout == "done\n"


def test_a_local_user_reads_no_tenants_data(home: Path) -> None:
    with running(home / ".quill") as up:
        use(up)
        leaks = [str(p) for p in private_files(up.data) if readable_by_nobody(p)]
        assert leaks == [], f"another local user reads {leaks}"
        assert loose(up.data) == []
        assert not any(SECRET.strip() in line for line in up.output)


def test_an_existing_data_directory_is_made_private_at_start(home: Path) -> None:
    """A data directory an earlier version left open (directories 0755, files 0644): the next
    ``quill up`` closes it, says so, and everything, commands included, works on."""
    data = home / ".quill"
    with running(data) as up:
        use(up)
    for dirpath, dirnames, filenames in os.walk(data):  # as an earlier version left it
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                path.chmod(0o644)
        dirnames[:] = [d for d in dirnames if d not in SANDBOX_TREES]
    assert readable_by_nobody(data / "reader" / "reader.db")  # the attack, as it was
    with running(data) as up:
        said = [line for line in up.output if "owner-only" in line]
        assert said and "readable by other local users" in said[0], up.output
        leaks = [str(p) for p in private_files(data) if readable_by_nobody(p)]
        assert leaks == [], f"another local user reads {leaks}"
        assert loose(data) == []
        assert up.cli("cat", "acme/plans", "plan.md").stdout == SECRET
        ran = up.cli("exec", "acme/plans", "cat plan.md out/x && echo again >> out/x")
        assert ran.stdout == SECRET + "done\n", ran.stdout + ran.stderr
