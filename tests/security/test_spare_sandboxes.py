"""Spare sandboxes (``infra/exec/sandbox/spares.py``) started before the command they run:
nothing one command leaves (a background process, files in /tmp and /dev/shm, its environment,
a link in the checkout) reaches the next command through one, on the same checkout or another;
a spare whose checkout directory was replaced is not used; limits, timeouts and kills hold in a
spare as in a sandbox started for the command. Real bwrap sandboxes, and real executors."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from contracts.errors import ErrorCode, QuillError
from infra.exec import sandbox
from infra.exec.sandbox import BwrapProvider, Limits, Spawn
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.helpers import (
    host_processes,
    start_executor,
    start_writer_and_reader,
)
from tests.security.conftest import Canaries

WHY_NO_BWRAP = sandbox.probe_bwrap()
pytestmark = pytest.mark.skipif(WHY_NO_BWRAP is not None, reason=f"bwrap: {WHY_NO_BWRAP}")
LIMITS = Limits(cpu_s=20, memory_bytes=512 * 1024**2, processes=64)

PLANT = (
    "setsid sleep {token} > /dev/null 2>&1 < /dev/null & "
    "(sleep {token} &) ; "
    "echo {token} > /tmp/planted; echo {token} > /dev/shm/planted; "
    "export PLANTED={token}; ulimit -n 64; cd /tmp; "
    "ln -s /etc /workspace/link; echo {token} > /workspace/left; echo planted"
)
LOOK = (
    'set -- /proc/[0-9]*; echo "$# processes"; for d; do [ "$d" = "/proc/$$" ] || '
    "{ tr '\\0' ' ' < \"$d/cmdline\"; echo; }; done; "
    "ls -A /tmp /dev/shm; env | sort; ulimit -n; pwd; ls /proc/self/fd | wc -l"
)
"""What a command sees: the processes of its sandbox, /tmp, /dev/shm, its environment, limits,
directory and descriptors."""


def sh(command: str, **kw: object) -> Spawn:
    options: dict[str, object] = {"watch_stdin": True, "count_left": True, **kw}
    return Spawn(["bash", "-c", command], **options)  # type: ignore[arg-type]


def shown(stdout: bytes | str) -> bytes:
    """``LOOK``'s output, the descriptor numbers in the sandbox's command lines left out (they
    differ from one sandbox to the next)."""
    data = stdout.encode() if isinstance(stdout, str) else stdout
    count, first, second, rest = data.split(b"\n", 3)
    return b"\n".join([count, re.sub(rb"\d+", b"N", first), re.sub(rb"\d+", b"N", second), rest])


def own(*paths: Path) -> None:
    """Give ``paths`` to the command's uid, as an executor does a checkout's files."""
    if os.geteuid() == 0:
        for path in paths:
            os.chown(path, sandbox.HOST_UID, sandbox.HOST_UID)


@pytest.fixture
def checkouts(tmp_path: Path, canaries: Canaries) -> Iterator[tuple[Path, Path]]:
    base = tmp_path / "data" / "checkouts"
    a, b = base / "acme" / "main" / "tree", base / "other" / "main" / "tree"
    for tree in (a, b):
        tree.mkdir(parents=True)
        (tree / "whose").write_text(tree.parent.parent.name)
        own(tree, tree / "whose")
    yield a, b


@pytest_asyncio.fixture
async def provider() -> AsyncIterator[BwrapProvider]:
    made = BwrapProvider()
    yield made
    await made.close()
    assert made.waiting == 0


async def test_a_spare_sees_nothing_a_command_left(
    provider: BwrapProvider, checkouts: tuple[Path, Path]
) -> None:
    a, _ = checkouts
    token = f"400.{secrets.randbelow(10**9):09d}"
    fresh = await provider.run(a, sh(LOOK), LIMITS)  # what a sandbox of its own shows
    # a spare started BEFORE the hostile command, another after it
    provider.warm(a, LIMITS)
    planted = await provider.run(a, sh(PLANT.format(token=token), watch_stdin=False), LIMITS)
    assert planted.stdout == b"planted\n" and planted.left_running == 2, planted
    assert (provider.waiting, provider.used) == (1, 0), "the hostile command took no spare"
    assert host_processes(token) == []
    for used in (1, 2):  # the first spare started before the hostile command, the next after
        looked = await provider.run(a, sh(LOOK), LIMITS)
        assert provider.used == used, "the command ran in a spare"
        assert looked.exit_code == 0, looked.stderr
        assert token.encode() not in looked.stdout, looked.stdout
        assert b"planted" not in looked.stdout and b"PLANTED" not in looked.stdout
        assert shown(looked.stdout) == shown(fresh.stdout)
    assert (a / "left").read_text() == f"{token}\n" and (a / "link").is_symlink()


async def test_a_spare_serves_its_own_checkout_only(
    provider: BwrapProvider, checkouts: tuple[Path, Path]
) -> None:
    a, b = checkouts
    provider.warm(a, LIMITS)
    other = await provider.run(b, sh("cat whose"), LIMITS)
    assert (other.stdout, provider.waiting, provider.used) == (b"other", 1, 0)
    provider.discard(a)
    assert provider.waiting == 0
    provider.warm(a, Limits(cpu_s=20, memory_bytes=256 * 1024**2, processes=64))
    other_limits = await provider.run(a, sh("cat whose"), LIMITS)  # not that spare's limits
    assert (other_limits.stdout, provider.used, provider.waiting) == (b"acme", 0, 1)


async def test_a_spare_over_a_replaced_checkout_is_not_used(
    provider: BwrapProvider, checkouts: tuple[Path, Path]
) -> None:
    a, _ = checkouts
    provider.warm(a, LIMITS)
    ready = await provider.run(a, sh("true"), LIMITS)  # the checkout as the spare bound it
    assert ready.exit_code == 0
    provider.warm(a, LIMITS)
    assert await provider.warmed(a) == 1  # its /workspace bound: the directory as it was
    shutil.rmtree(a)  # a checkout reset: a new directory at the same path
    a.mkdir()
    (a / "whose").write_text("rebuilt")
    own(a, a / "whose")
    o = await provider.run(a, sh("cat whose; touch made"), LIMITS)
    assert (o.exit_code, o.stdout) == (0, b"rebuilt"), o.stderr
    assert (a / "made").exists() and provider.used == 1


async def test_limits_timeouts_and_kills_hold_in_a_spare(
    provider: BwrapProvider, checkouts: tuple[Path, Path]
) -> None:
    a, _ = checkouts
    limits = "ulimit -t; ulimit -d; ulimit -u; ulimit -f; ulimit -n; ulimit -c"
    fresh = await provider.run(a, sh(limits), LIMITS)
    provider.warm(a, LIMITS)
    spare = await provider.run(a, sh(limits), LIMITS)
    assert spare.stdout == fresh.stdout == b"20\n524288\n64\n1048576\n1024\n0\n"
    token = f"401.{secrets.randbelow(10**9):09d}"
    provider.warm(a, LIMITS)
    slow = await provider.run(a, sh(f"trap '' TERM; sleep {token}", timeout_s=0.5), LIMITS)
    assert slow.timed_out and provider.used == 2
    assert host_processes(token) == []
    provider.warm(a, LIMITS)
    missing = sh("true", workdir="nope")
    with pytest.raises(sandbox.SandboxError, match="nope"):
        await provider.run(a, missing, LIMITS)
    assert provider.used == 3


# ------------------------------------------------------------------ through executors


@pytest_asyncio.fixture
async def quill(nats_url: str, tmp_path: Path) -> AsyncIterator[Quill]:
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        await start_executor(es, nats_url, tmp_path / "ex", ExecutorConfig(sandbox="bwrap"))
        client = await Quill.connect(nats_url)
        es.push_async_callback(client.close)
        yield client


async def test_commands_after_a_hostile_one_see_nothing_of_it(quill: Quill) -> None:
    token = f"402.{secrets.randbelow(10**9):09d}"
    mine, theirs = quill.workspace("acme/spare-a"), quill.workspace("other/spare-b")
    for ws in (mine, theirs):
        await ws.create()
        await ws.exec("mkdir src")
    fresh = await mine.exec(LOOK)
    planted = await mine.exec(PLANT.format(token=token).replace("/workspace/link", "src2"))
    assert (planted.stdout, planted.background_killed) == ("planted\n", 2)
    await mine.exec("rm -rf src && ln -s / src")  # a link where a directory was
    assert host_processes(token) == []
    for ws in (mine, theirs, mine):
        looked = await ws.exec(LOOK)
        assert token not in looked.stdout and "PLANTED" not in looked.stdout, looked.stdout
        assert shown(looked.stdout) == shown(fresh.stdout)
    with pytest.raises(QuillError) as refused:
        await mine.exec("true", workdir="src")
    assert refused.value.code in (ErrorCode.NOT_A_DIRECTORY, ErrorCode.FILE_NOT_FOUND)
