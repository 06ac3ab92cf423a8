"""Issue 33, item 3: a fork's first checkout is hard links to its source's checkout on the same
executor (``infra.exec.links``). Two names of one inode are one file: a command that writes a
linked file in place (``>``, ``>>``, ``truncate``, ``chmod``, ``dd conv=notrunc``, a hard
link of its own, a forged mtime) would change the other workspace's checkout, and what its
commands see and capture. It cannot: links are made only where commands run over an overlay
(the tree is the overlay's read-only lower layer; what they write is copied up and renamed
over the name), never for a shell's checkout, and an executor running commands in place wipes
a linked checkout before using it (``tests/executor/test_fork_checkouts.py``).

Each attack writes through every file of the fork's checkout (then the source's through every
file of its own): the other checkout on the host, its reads, and what a command in it sees
stay as they were. Both providers (bwrap over an overlay: links made; local: none made, the
same attack holds).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest_asyncio

from contracts.requests import DeleteChange, PutChange
from quill.client import Quill, Workspace
from services.executor.app import Executor
from services.executor.config import ExecutorConfig
from tests.helpers import start_executor, start_overlay_stack, start_writer_and_reader

ATTACK = r"""
set -u
n=0
for f in $(find . -type f -not -name '*.hl' | sort); do
  n=$((n+1))
  chmod 777 "$f"
  echo appended >> "$f"
  sed -i 's/v = /w = /' "$f"
  printf 'overwrite' | dd of="$f" conv=notrunc status=none
  ln "$f" "$f.hl" && echo via-link >> "$f.hl"
  touch -d '2001-01-01' "$f"
  case $((n % 3)) in
    0) : > "$f" ;;
    1) truncate -s 1 "$f" ;;
    2) echo replaced > "$f" ;;
  esac
  chmod 600 "$f"
done
echo "$n"
"""
"""Every file: chmod, append, ``sed -i``, a write in place, a hard link written through, a
forged mtime, a truncation (``>``, ``truncate``) or an overwrite, chmod again."""


Step = tuple[str, str | None] | tuple[str, str, bool]
"""A path and its content (None: deleted), and whether it is executable."""
AT_FORK: list[Step] = [
    ("kind/dir/inner.txt", "inner\n"),
    ("kind/file", "file\n"),
    ("mode/x.sh", "echo x\n", True),
    ("mode/y.sh", "echo y\n"),
    ("swap/a", "aaaa\n"),
    ("swap/b", "bbbb\n"),
]
SINCE: list[Step] = [  # what the source changes after the fork point
    ("kind/dir", None),
    ("kind/dir", "now a file\n"),  # a directory becomes a file
    ("kind/file", None),
    ("kind/file/below.txt", "now a directory\n"),  # and a file a directory
    ("mode/x.sh", "echo x\n"),  # modes flip, contents alike
    ("mode/y.sh", "echo y\n", True),
    ("swap/a", "bbbb\n"),  # two files of one size swap contents
    ("swap/b", "aaaa\n"),
    ("fresh/deep/er/file.txt", "new\n"),
]


def changes(steps: list[Step]) -> list[PutChange | DeleteChange]:
    out: list[PutChange | DeleteChange] = []
    for path, content, *x in steps:
        if content is None:
            out.append(DeleteChange(path=path))
        else:
            out.append(PutChange(path=path, content=content, executable=bool(x and x[0])))
    return out


@pytest_asyncio.fixture
async def executor(nats_url: str, tmp_path: Path, provider: str) -> AsyncIterator[Executor]:
    async with AsyncExitStack() as es:
        if provider == "bwrap":
            yield await start_overlay_stack(es, nats_url, tmp_path)
        else:
            await start_writer_and_reader(es, nats_url, tmp_path)
            config = ExecutorConfig(sandbox="local")
            yield await start_executor(es, nats_url, tmp_path / "executor", config)


def snapshot(tree: Path) -> dict[str, tuple[str, int]]:
    """Each file of a checkout's tree on the host: its sha256 and mode."""
    seen = {}
    for path in sorted(tree.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            seen[str(path.relative_to(tree))] = (digest, stat.S_IMODE(st.st_mode))
    return seen


async def reads(ws: Workspace, count: int) -> dict[str, str]:
    return {f"d{n % 3}/f{n}.py": await ws.read_text(f"d{n % 3}/f{n}.py") for n in range(count)}


COUNT = 12


async def test_a_command_writing_through_a_linked_checkout_changes_only_its_own(
    executor: Executor, quill: Quill, provider: str, tmp_path: Path
) -> None:
    name = f"lk-{provider}-{tmp_path.name[-10:]}"
    src = quill.workspace(f"acme/{name}")
    await src.create()
    await src.apply(
        [
            PutChange(path=f"d{n % 3}/f{n}.py", content=f"v = {n}\n", executable=n % 4 == 0)
            for n in range(COUNT)
        ]
    )
    await src.exec("true")  # the source's checkout, held by the executor
    await quill.fork(f"acme/{name}", f"{name}-f")
    fork = quill.workspace(f"acme/{name}-f")
    home = executor.checkouts.data_dir / "checkouts" / "acme"
    source_tree, fork_tree = home / name / "tree", home / f"{name}-f" / "tree"
    before = snapshot(source_tree)
    source_reads = await reads(src, COUNT)
    linked = executor.info()["io"].get("linked", 0)

    done = await fork.exec(ATTACK)
    assert done.exit_code == 0 and done.stdout.strip() == str(COUNT), (done.stdout, done.stderr)
    if provider == "bwrap":  # the fork's checkout was linked: the attack went at shared inodes
        assert executor.info()["io"].get("linked", 0) == linked + 1
    assert snapshot(source_tree) == before
    assert await reads(src, COUNT) == source_reads
    seen = await src.exec("cat d0/f0.py d1/f4.py; stat -c %a d0/f0.py d1/f1.py")
    assert seen.stdout == "v = 0\nv = 4\n755\n644\n"
    assert (await fork.read_text("d1/f1.py")) != "v = 1\n"  # the fork's own changes committed

    # the other way: the source's command through every file of its own, the fork unchanged
    fork_before = snapshot(fork_tree)
    fork_reads = await reads(fork, COUNT)
    done = await src.exec(ATTACK)
    assert done.exit_code == 0, done.stderr
    assert snapshot(fork_tree) == fork_before
    assert await reads(fork, COUNT) == fork_reads
    assert os.path.exists(fork_tree / "d0" / "f0.py.hl")  # the fork's own, committed


async def test_a_shell_in_a_fork_is_never_linked(
    executor: Executor, quill: Quill, provider: str, tmp_path: Path
) -> None:
    """A shell's commands write its checkout in place: it is built from a reader, never linked,
    and its writes through every file leave the source's checkout as it was."""
    name = f"sh-{provider}-{tmp_path.name[-10:]}"
    src = quill.workspace(f"acme/{name}")
    await src.create()
    await src.apply([PutChange(path=f"d{n % 3}/f{n}.py", content=f"v = {n}\n") for n in range(6)])
    await src.exec("true")
    await quill.fork(f"acme/{name}", f"{name}-f")
    fork = quill.workspace(f"acme/{name}-f")
    source_tree = executor.checkouts.data_dir / "checkouts" / "acme" / name / "tree"
    before = snapshot(source_tree)
    linked = executor.info()["io"].get("linked", 0)
    async with await fork.shell() as sh:
        done = await sh.run(ATTACK)
        assert done.stdout.strip() == "6", done.stdout
    assert executor.info()["io"].get("linked", 0) == linked
    assert snapshot(source_tree) == before
    assert await src.read_text("d1/f1.py") == "v = 1\n"


def entries(tree: Path) -> dict[str, tuple[str, int]]:
    """Each entry of a checkout's tree on the host: a file's sha256 and mode, a directory's."""
    seen = snapshot(tree)
    for path in tree.rglob("*"):
        if path.is_dir() and not path.is_symlink():
            seen[str(path.relative_to(tree))] = ("dir", 0)
    return seen


async def test_a_fork_linked_from_a_source_changed_since_the_fork_point_has_the_fork_points_tree(
    executor: Executor, quill: Quill, provider: str, tmp_path: Path
) -> None:
    """The source's checkout is held at a version past the fork point, where paths changed in
    ways a link could get wrong: a directory became a file and a file a directory, a file's
    mode (not its content) changed both ways, two files of one size swapped contents, a
    directory was made below a new parent. The fork's first checkout, linked from it, is
    exactly the fork point's tree (what a checkout built from a reader's tree holds), and a
    command writing through every file of it leaves the source's checkout as it was."""
    name = f"mv-{provider}-{tmp_path.name[-10:]}"
    src = quill.workspace(f"acme/{name}")
    await src.create()
    files = [PutChange(path=f"d{n % 3}/f{n}.py", content=f"v = {n}\n") for n in range(COUNT)]
    await src.apply(files + changes(AT_FORK))
    point = (await quill.fork(f"acme/{name}", f"{name}-f")).version
    await src.apply(changes(SINCE))
    await src.exec("true")  # the source's checkout is held past the fork point
    fork = quill.workspace(f"acme/{name}-f")
    home = executor.checkouts.data_dir / "checkouts" / "acme"
    source_tree, fork_tree = home / name / "tree", home / f"{name}-f" / "tree"
    linked = executor.info()["io"].get("linked", 0)
    seen = await fork.exec(
        "cat kind/dir/inner.txt kind/file swap/a swap/b; stat -c %a mode/x.sh mode/y.sh; "
        "test -e fresh || echo no-fresh"
    )
    assert seen.stdout == "inner\nfile\naaaa\nbbbb\n755\n644\nno-fresh\n", seen.stdout
    if provider == "bwrap":  # linked from the source's checkout, not built from a reader
        assert executor.info()["io"].get("linked", 0) == linked + 1
    as_linked = entries(fork_tree)
    assert as_linked["kind/dir"] == ("dir", 0) and as_linked["kind/file"][1] == 0o644

    # a command writing through every file of the fork: the source's checkout unchanged
    before, source_reads = snapshot(source_tree), await src.read_text("swap/a")
    done = await fork.exec(ATTACK)
    assert done.exit_code == 0, done.stderr
    assert snapshot(source_tree) == before and await src.read_text("swap/a") == source_reads

    # the same fork point built from a reader's tree holds what the linked checkout held
    await quill.fork(f"acme/{name}", f"{name}-g", version=point)
    for key in (name, f"{name}-g"):
        await executor.checkouts.drop(("acme", key))
    await quill.workspace(f"acme/{name}-g").exec("true")
    assert entries(home / f"{name}-g" / "tree") == as_linked
