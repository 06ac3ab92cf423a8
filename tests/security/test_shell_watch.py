"""A shell's checkout is watched, not walked (issue 32: ``infra.exec.watch``), under attack:
each hostile sequence of commands runs in a shell whose checkout is watched and, beside it, in
one whose checkout is walked whole at every capture (``Shells.watching`` off: what every shell
did before), and both commit the very same changes, command by command (and what background
processes left before each), and end with the same files.

* A command making thousands of files in new nested directories at once (files made in a
  directory before its watch exists; ``-m slow``: 9,500).
* A directory with files renamed inside the tree, moved out of it, and one copied in.
* A write through a hard link (the other name changed too, unseen by inotify), and through a
  descriptor opened by an earlier command.
* A file rewritten at its size with a forged old mtime; a file replaced by a symlink; a
  watched directory removed and made again with files.
* Each fallback forced: an event-queue overflow (injected: a tiny queue cannot be set
  unprivileged) and a cap on watches: the next capture walks, nothing is missed.
* A background process filling the checkout past its quota while the shell is idle is stopped
  by the guard's running total, as by its walks before.
"""

from __future__ import annotations

import errno

import pytest

from contracts.errors import ErrorCode
from contracts.limits import LimitsPatch
from contracts.requests import PutChange
from infra.exec import watch as watch_module
from quill.client import Quill, Workspace
from services.executor.app import Executor
from tests.executor.conftest import (  # noqa: F401
    StartExecutor,
    executor,
    name,
    provider,
    stack,
)
from tests.helpers import eventually

MIB = 1024**2
LISTING = "find . -path ./.git -prune -o -printf '%y %p %s %m\\n' | LC_ALL=C sort"
BURST = (
    "python3 -c 'import os,sys\n"
    "for d in range(int(sys.argv[1])):\n"
    ' p=f"burst/{d}/a/b"; os.makedirs(p)\n'
    ' [open(f"{p}/{f}","w").write(str(f)) for f in range(100)]\' {n}'
)


async def seeded(quill: Quill, label: str) -> Workspace:
    ws = quill.workspace(label)
    await ws.create(limits=LimitsPatch(max_files=200_000, max_exec_ms=300_000))
    puts = [PutChange(path=f"src/m{n:03}.txt", content=f"m{n}\n") for n in range(50)]
    puts += [PutChange(path="keep/a.txt", content="aaaa\n")]
    puts += [PutChange(path="top.txt", content="t\n")]
    await ws.apply(puts)
    return ws


Seen = list[tuple[object, ...]]


async def replay(ex: Executor, ws: Workspace, watched: bool, steps: list[str]) -> Seen:
    """Run ``steps`` in a new shell of ``ws`` (its checkout watched or walked); what each
    committed (and what background processes had, before it), then the files."""
    ex.shells.watching = watched
    seen: Seen = []
    async with await ws.shell() as sh:
        state = ex.shells.held[sh.id]
        assert (state.checkout.watch is not None) == watched
        for step in steps:
            result = await sh.run(step, timeout_ms=300_000)  # thousands of files, walked, loaded
            assert result.exit_code == 0, (step, result.stderr)
            bg = result.background
            seen.append(
                (
                    step,
                    result.changes.total,
                    sorted((p.path, p.change, p.kind) for p in result.changes.paths),
                    (bg.total, sorted((p.path, p.change, p.kind) for p in bg.paths)) if bg else 0,
                    sorted(result.changes.skipped),
                )
            )
    listing = await ws.exec(LISTING)
    seen.append(("files", listing.stdout))
    return seen


async def twins(ex: Executor, quill: Quill, label: str, steps: list[str]) -> Seen:
    """``steps`` watched and walked, in two workspaces seeded alike: the same everywhere."""
    watched = await replay(ex, await seeded(quill, label + "-w"), True, steps)
    walked = await replay(ex, await seeded(quill, label + "-x"), False, steps)
    for mine, theirs in zip(watched, walked, strict=True):
        assert mine == theirs
    return watched


@pytest.mark.parametrize(
    "directories",
    [50, pytest.param(95, marks=[pytest.mark.slow, pytest.mark.timeout(600)], id="9500-files")],
)
async def test_a_burst_of_new_nested_directories_is_all_committed(
    executor: Executor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
    directories: int,
) -> None:
    """100 files in each new nested directory (``-m slow``: 9,500, under the 10,000 changes
    a change set may hold; the watch reads its queue as it fills: no overflow here, which
    ``test_each_fallback_misses_nothing`` injects): every one committed, as a walk finds them."""
    steps = [BURST.replace("{n}", str(directories)), "true"]
    seen = await twins(executor, quill, name, steps)
    assert seen[0][1] == directories * 100  # every file (their directories made with them)


async def test_renames_links_descriptors_forged_times_and_swaps(
    executor: Executor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
) -> None:
    steps = [
        "mv src moved && mkdir -p /tmp/out/d && echo o > /tmp/out/d/o.txt && mv /tmp/out/d in",
        "mv moved/m001.txt . && mv moved /tmp/gone && ls /tmp/gone | wc -l",
        "ln keep/a.txt keep/b.txt && exec 7>>top.txt",
        "echo more >> keep/b.txt",  # a.txt changed too: the same inode
        "echo late >&7 && exec 7>&-",  # a descriptor opened by an earlier command
        "printf 'bbbb\\n' > keep/a.txt && touch -d '2001-01-01 00:00:00' keep/a.txt",
        "ln -sf top.txt m001.txt && rm -rf in && mkdir in && echo again > in/again.txt",
        "true",
    ]
    seen = await twins(executor, quill, name, steps)
    assert ("keep/a.txt", "modified", "file") in seen[3][2]


async def test_background_writes_through_a_kept_descriptor(
    executor: Executor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
) -> None:
    """A background process holding a descriptor opened by an earlier command writes through
    it while the next command runs (which waits for the write): committed with that command,
    as a walk finds it. The FIFO and the file are made by the command itself, before the job
    starts (made by the job, they raced the command's capture: the two shells then differed
    by a race of the job's own)."""
    steps = [
        "mkfifo go.fifo; exec 8>>bg.txt; (read -t 30 <> go.fifo; echo later >&8) "
        ">/dev/null 2>&1 & exec 8>&-; true",
        "echo go > go.fifo; until grep -q later bg.txt; do sleep 0.05; done; true",
        "rm -f go.fifo && true",
    ]
    seen = await twins(executor, quill, name, steps)
    assert seen[-2][0].startswith("rm")


@pytest.mark.parametrize("how", ["overflow", "watch-cap", "no-instance"])
async def test_each_fallback_misses_nothing(
    executor: Executor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ws = await seeded(quill, name)
    executor.shells.watching = True
    if how == "watch-cap":
        executor.shells.max_watches = 4  # the root, src, keep: one more directory
    if how == "no-instance":  # the user's fs.inotify.max_user_instances all taken (not for
        # real: the other tests of the run share the limit)

        def taken(**_: object) -> None:
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(watch_module, "INotify", taken)
        monkeypatch.setitem(watch_module.COUNTS, "no_instance", 0)
    async with await ws.shell() as sh:
        watch = executor.shells.held[sh.id].checkout.watch
        assert watch is not None
        await sh.run("true")
        if how == "overflow":  # what the kernel queues when it drops events
            watch._event(-1, 0x4000, "", set())
        walks = watch.walks
        result = await sh.run("mkdir -p n/e/f && echo x > n/e/f/x && echo y >> src/m001.txt")
        got = sorted(p.path for p in result.changes.paths)
        assert got == ["n/e/f/x", "src/m001.txt"]
        assert watch.walks > walks  # armed again by a walk
        if how == "overflow":  # and known again after it
            again = await sh.run("echo z > z.txt")
            assert [p.path for p in again.changes.paths] == ["z.txt"]
            assert watch.walks == walks + 1 and watch.take() == []
        if how == "no-instance":  # walked each time, and the operator told why, once
            again = await sh.run("echo z > z.txt")
            assert [p.path for p in again.changes.paths] == ["z.txt"]
            said = [
                r.getMessage() for r in caplog.records if "no inotify instance" in r.getMessage()
            ]
            assert len(said) == 1 and "max_user_instances" in said[0], said


async def test_a_background_filler_is_stopped_by_the_running_total(
    executor: Executor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
) -> None:
    ws = quill.workspace(name)
    await ws.create(limits=LimitsPatch(max_checkout_bytes=8 * MIB))
    await ws.write("a.txt", "a\n")
    executor.shells.watching = True
    sh = await ws.shell()
    state = executor.shells.held[sh.id]
    await sh.run(
        "(for n in $(seq 1 40); do head -c 1048576 /dev/zero > fill$n; sleep 0.05; done) "
        ">/dev/null 2>&1 &"
    )
    await eventually(lambda: state.stopped is not None, what="the shell stopped", timeout=30)
    assert state.stopped is not None and state.stopped.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    assert state.checkout.watch is not None and state.checkout.watch.walks == 1


MMAP_WRITER = (
    "python3 -c 'import mmap,sys,time\n"
    'f=open("mapped.txt","r+b"); m=mmap.mmap(f.fileno(),0)\n'
    'm[0:5]=b"later"; m.flush(); open("/tmp/written","w").close()\n'
    "time.sleep(600)' >/dev/null 2>&1 &"
)


async def test_a_write_through_a_shared_mapping_is_committed_at_a_checkpoint(
    executor: Executor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
) -> None:
    """A background process writes a file through a shared mapping and keeps it open (no
    inotify event until the file is closed): a checkpoint walks the whole tree, and commits
    it; closing the shell does too."""
    ws = await seeded(quill, name)
    await ws.write("mapped.txt", "early\n")
    async with await ws.shell() as sh:
        assert executor.shells.held[sh.id].checkout.watch is not None
        started = await sh.run(MMAP_WRITER)
        assert started.exit_code == 0
        waited = await sh.run("while [ ! -e /tmp/written ]; do sleep 0.05; done; true")
        assert waited.exit_code == 0

        async def committed() -> bool:
            done = await sh.checkpoint()
            return "mapped.txt" in [p.path for p in done.background.paths]

        await eventually(committed, what="the mapped write committed at a checkpoint")
        assert await ws.read_text("mapped.txt") == "later\n"
