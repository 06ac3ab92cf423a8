"""Issue 10, item 1: a command must not make the executor (root, on the host) write, chmod,
read or walk anything outside the workspace's checkout through names it planted there.

Each attack runs through the real path: a real nats-server, a writer, a reader and an executor
with the bwrap sandbox; a command plants links in its checkout, then the workspace is changed
through the SDK and another command makes the executor bring the checkout up to date. After
each test the host canaries are unchanged (content and mode), the workspace holds what the
SDK wrote, and ``quill verify`` passes.

Races. The sandbox's PID namespace is killed when its command ends, before the executor
captures, and commands of one workspace run one at a time: no sandboxed process is alive while
the executor syncs or captures its checkout. ``test_a_background_loop_does_not_outlive_its_
command`` checks that this holds; ``test_links_swapped_in_a_loop_while_the_checkout_syncs``
(tests/security, on the host) races a real process against ``Checkout`` anyway, in case it did
not.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from infra.blobs import Blobs
from infra.exec.checkout import Checkout
from quill.client import Quill, Workspace
from services.executor.app import Executor, ExecutorConfig
from tests.conftest import StartReader
from tests.helpers import Gate, start_executor, start_writer_and_reader
from tests.security.conftest import Canaries, bwrap_only
from tests.security.conftest import per_provider as nats_server  # noqa: F401 (a fixture: each provider's own nats-server)


@dataclass
class Stack:
    quill: Quill
    executor: Executor
    data: Path
    nats_url: str

    def tree(self, name: str) -> Path:
        """The host directory of ``tenant/workspace``'s checkout."""
        tenant, workspace = name.split("/")
        return self.data / "checkouts" / tenant / workspace / "tree"

    def verify(self, name: str) -> None:
        env = {**os.environ, "QUILL_NATS_URL": self.nats_url}
        result = subprocess.run(
            [sys.executable, "-m", "quill", "verify", name],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr


@pytest_asyncio.fixture
async def stack(nats_url: str, tmp_path: Path, provider: str) -> AsyncIterator[Stack]:
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        data = tmp_path / "executor"
        executor = await start_executor(es, nats_url, data, ExecutorConfig(sandbox=provider))
        quill = await Quill.connect(nats_url)
        es.push_async_callback(quill.close)
        yield Stack(quill, executor, data, nats_url)


def modes(canaries: Canaries) -> dict[str, int]:
    return {n: os.lstat(p).st_mode for n, p in canaries.files.items()}


async def new_workspace(stack: Stack, name: str) -> Workspace:
    ws = stack.quill.workspace(name)
    await ws.create()
    return ws


async def ok(ws: Workspace, command: str) -> str:
    result = await ws.exec(command)
    assert result.exit_code == 0, (command, result.stdout, result.stderr)
    return result.stdout


# ------------------------------------------------------------------ the reported attack
async def test_a_link_at_the_temporary_name_writes_nothing_outside(
    stack: Stack, canaries: Canaries
) -> None:
    target = canaries.files["host-file"]
    before = modes(canaries)
    ws = await new_workspace(stack, "acme/tmp-link")
    await ok(ws, f"ln -s {target} .pwn.txt.quill-tmp")
    await ws.write("pwn.txt", "owned\n")
    assert await ok(ws, "cat pwn.txt") == "owned\n"
    assert modes(canaries) == before
    assert await ws.read_text("pwn.txt") == "owned\n"
    # the planted link is still only a link, never committed
    assert os.path.islink(stack.tree("acme/tmp-link") / ".pwn.txt.quill-tmp")
    assert [e.path for e in (await ws.list()).entries] == ["pwn.txt"]
    stack.verify("acme/tmp-link")


async def test_every_temporary_name_a_command_could_guess_is_a_link(
    stack: Stack, canaries: Canaries
) -> None:
    """Links at every name of the old scheme and of a few guesses of a new one."""
    target = canaries.files["passwd"]
    ws = await new_workspace(stack, "acme/guesses")
    await ws.write("f.txt", "one\n")
    names = [".f.txt.quill-tmp", ".f.txt.tmp", "f.txt.tmp", ".f.txt~", ".f.txt.quill"]
    await ok(ws, "; ".join(f"ln -s {target} '{n}'" for n in names))
    await ws.write("f.txt", "two\n")
    assert await ok(ws, "cat f.txt") == "two\n"
    stack.verify("acme/guesses")


# ------------------------------------------------------------------ directories and parents
async def test_a_tracked_directory_replaced_by_a_link_is_not_written_through(
    stack: Stack, canaries: Canaries
) -> None:
    """The command swaps ``docs/`` for a link to a host directory and, while it runs, the
    agent writes ``docs/new.md`` through the SDK: the command's deletion of ``docs`` then
    conflicts and is not committed, so the log still has ``docs`` as a directory when the
    executor brings ``docs/new.md`` into the checkout."""
    before = modes(canaries)
    ws = await new_workspace(stack, "acme/dir-link")
    await ws.write("docs/a.md", "a\n")
    planted = asyncio.Event()
    gate = Gate()

    def on_output(stream: str, chunk: bytes) -> None:
        if b"planted" in chunk:
            planted.set()

    command = f"rm -rf docs && ln -s {canaries.root} docs && echo planted && {gate.wait}"
    run = asyncio.create_task(ws.exec(command, on_output=on_output))
    async with asyncio.timeout(30):
        await planted.wait()
    writer = stack.quill.workspace("acme/dir-link")
    await writer.write("docs/new.md", "new\n")  # after the command's base version
    await gate.open()  # the command may end now
    result = await run
    assert result.exit_code == 0, result.stderr
    assert [c.path for c in result.changes.conflicts] == ["docs"]
    # one more command: the executor syncs docs/new.md (and anything else) first
    await ok(ws, "true")
    assert modes(canaries) == before
    ws.last_version = writer.last_version
    assert await ws.read_text("docs/new.md") == "new\n"
    stack.verify("acme/dir-link")


async def test_a_link_as_a_parent_is_replaced_by_the_directory(
    stack: Stack, canaries: Canaries
) -> None:
    ws = await new_workspace(stack, "acme/parent-link")
    await ok(ws, f"mkdir -p a && ln -s {canaries.root} a/b")
    await ws.write("a/b/c/x.txt", "x\n")
    assert await ok(ws, "cat a/b/c/x.txt") == "x\n"
    assert not os.path.islink(stack.tree("acme/parent-link") / "a/b")
    stack.verify("acme/parent-link")


# ------------------------------------------------------------------ modes and hard links
async def test_an_executable_flag_change_reaches_no_other_name(
    stack: Stack, canaries: Canaries
) -> None:
    """``other`` is a hard link to ``run.sh``: making ``run.sh`` executable (content the
    checkout already holds) must not make ``other`` executable too (a change the agent never
    made, committed by the next command)."""
    before = modes(canaries)
    ws = await new_workspace(stack, "acme/hard-link")
    await ws.write("run.sh", "#!/bin/sh\necho hi\n")
    await ok(ws, "ln run.sh other")
    await ws.apply([rq.PutChange(path="run.sh", content="#!/bin/sh\necho hi\n", executable=True)])
    version = ws.last_version
    result = await ws.exec("test -x run.sh && ! test -x other && echo separate")
    assert result.stdout == "separate\n", result
    assert not result.changes.committed and result.changes.version == version
    assert (await ws.stat("other")).permissions == "644"
    assert modes(canaries) == before
    stack.verify("acme/hard-link")


async def test_a_rewrite_replaces_a_hard_linked_file(stack: Stack, canaries: Canaries) -> None:
    ws = await new_workspace(stack, "acme/hard-rewrite")
    await ws.write("a.txt", "first\n")
    await ok(ws, "ln a.txt b.txt")
    await ws.write("a.txt", "second\n")
    result = await ws.exec("cat a.txt b.txt")
    assert result.stdout == "second\nfirst\n"
    assert not result.changes.committed  # b.txt was not rewritten behind the agent's back
    assert await ws.read_text("b.txt") == "first\n"
    stack.verify("acme/hard-rewrite")


# ------------------------------------------------------------------ reads
async def test_a_linked_quillignore_reads_no_host_file(stack: Stack, tmp_path: Path) -> None:
    """A host file's lines must not become ignore patterns (an oracle on its content)."""
    host = tmp_path / "host-patterns"
    host.write_text("secret-name.txt\n")
    ws = await new_workspace(stack, "acme/ignore-link")
    result = await ws.exec(f"ln -s {host} .quillignore && echo x > secret-name.txt")
    assert [p.path for p in result.changes.paths] == ["secret-name.txt"]
    assert result.changes.ignored == []
    assert [s.path for s in result.changes.skipped] == [".quillignore"]
    stack.verify("acme/ignore-link")


async def test_a_linked_file_is_never_committed(stack: Stack, canaries: Canaries) -> None:
    ws = await new_workspace(stack, "acme/read-link")
    secret = canaries.files["secret.key"]
    result = await ws.exec(f"ln -s {secret} key && mkdir d && ln -s {canaries.root} d/host")
    assert not result.changes.committed or all(p.path == "d" for p in result.changes.paths), (
        result.changes
    )
    for entry in (await ws.list(recursive=True)).entries:
        if entry.kind == "file":
            assert "canary" not in await ws.read_text(entry.path)
    stack.verify("acme/read-link")


# ------------------------------------------------------------------ another workspace
async def test_a_link_into_another_workspaces_checkout_commits_nothing_there(
    stack: Stack, canaries: Canaries
) -> None:
    """With tenants, the other tenant's checkout is on the same executor's disk."""
    victim = await new_workspace(stack, "globex/main")
    await victim.write("notes.txt", "globex's own\n")
    await ok(victim, "true")  # the executor now holds globex/main's checkout
    version = victim.last_version
    theirs = stack.tree("globex/main") / "notes.txt"
    attacker = await new_workspace(stack, "acme/main")
    await ok(attacker, f"ln -s {theirs} .pwn.txt.quill-tmp && ln -s {theirs.parent} other")
    await attacker.write("pwn.txt", "acme was here\n")
    await attacker.write("other/planted.txt", "acme was here\n")
    await ok(attacker, "true")
    after = await victim.exec("cat notes.txt; ls")
    assert after.stdout == "globex's own\nnotes.txt\n"
    assert not after.changes.committed and after.changes.version == version
    page = await victim.events()
    assert page.events[-1].version == version
    stack.verify("globex/main")
    stack.verify("acme/main")


# ------------------------------------------------------------------ races
async def test_a_background_loop_does_not_outlive_its_command(
    stack: Stack, canaries: Canaries, provider: str
) -> None:
    """A loop re-creating the link, left running: the sandbox ends it with the command, and
    the link it left behind is written over nothing."""
    bwrap_only(provider, "a local command that detaches outlives it (docs/executor.md)")
    target = canaries.files["host-file"]
    ws = await new_workspace(stack, "acme/race-loop")
    loop = (
        f"(while :; do ln -sfn {target} .pwn.txt.quill-tmp; echo . >> beat; "
        f"rm -rf d; ln -sfn {canaries.root} d; done) >/dev/null 2>&1 & "
        "while [ ! -s beat ]; do :; done; echo started"
    )
    assert await ok(ws, loop) == "started\n"
    await ws.write("pwn.txt", "owned\n")
    await ws.write("d/x.txt", "x\n")
    first = await ok(ws, "cat pwn.txt d/x.txt; stat -c %s beat")
    second = await ok(ws, "stat -c %s beat")
    assert first.splitlines()[:2] == ["owned", "x"]
    assert first.splitlines()[2] == second.strip()  # nothing appends any more
    stack.verify("acme/race-loop")


# ------------------------------------------------------------------ races on the host
RACER = r"""
import os, sys
tree, outside, canary = sys.argv[1], sys.argv[2], sys.argv[3]
os.chdir(tree)


def swap(name, away, target):  # name swapped for a link to target (a host path), and back
    try:
        os.rename(name, away)
        os.symlink(target, name)
        os.unlink(name)
        os.rename(away, name)
    except OSError:
        pass


print("ready", flush=True)
i = 0
while not os.path.exists(".stop"):
    i += 1
    for name in (".f.txt.quill-tmp", "f.txt.tmp", ".quillignore"):
        try:
            os.symlink(canary, name)
        except OSError:
            pass
    swap("d", "d.away", outside)  # the directory, for a link to a host directory
    swap("f.txt", "f.away", canary)  # a file, for a link to a host file
    try:
        os.link("g.txt", f"hard{i % 4}")
    except OSError:
        pass
    if i % 50 == 0:
        for name in os.listdir("."):
            if os.path.islink(name) and name not in ("d", "f.txt"):
                os.unlink(name)
"""


@pytest.mark.parametrize(
    "seconds",
    [3, pytest.param(60, marks=[pytest.mark.slow, pytest.mark.timeout(300)], id="a-minute")],
    ids=str,
)
async def test_links_swapped_in_a_loop_while_the_checkout_syncs(
    services: StartReader,
    quill: Quill,
    nc: NATS,
    tmp_path: Path,
    canaries: Canaries,
    seconds: float,
) -> None:
    """Sync and capture a checkout, again and again, while a process swaps its names for links
    to host files as fast as it can: no round escapes, at least three get through (three
    seconds of it always; a minute with ``-m slow``), and the host's files are untouched."""
    before = modes(canaries)
    await services("r1")
    name = f"race-{int(seconds)}"
    ws = quill.workspace(f"acme/{name}")
    await ws.create()
    await ws.apply(
        [
            rq.PutChange(path="f.txt", content="f\n"),
            rq.PutChange(path="g.txt", content="g\n"),
            rq.PutChange(path="d/x.txt", content="x\n"),
        ]
    )
    js = nc.jetstream()

    async def fetch(path: str, version: int) -> bytes:
        return await ws.read_bytes(path, version=version)

    co = Checkout(tmp_path / "co", "acme", name, js, Subjects(), Blobs(js), fetch)
    await asyncio.to_thread(co.open)
    await co.sync()
    racer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RACER,
            str(co.tree),
            str(canaries.root),
            str(canaries.files["host-file"]),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    rounds = 0
    try:
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n"
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        i = 0
        while loop.time() < end or rounds < 3:
            i += 1
            await ws.apply(
                [
                    rq.PutChange(path="f.txt", content=f"f {i}\n", executable=bool(i % 2)),
                    rq.PutChange(path="d/x.txt", content=f"x {i}\n"),
                    rq.PutChange(path=f"d/new{i % 3}.txt", content=f"new {i}\n"),
                ]
            )
            try:
                await co.sync()
                captured = await asyncio.to_thread(co.capture)
            except (OSError, RuntimeError):
                continue  # the racer won this round: the checkout may refuse, never escape
            for path, data in captured.contents.items():
                assert b"canary" not in data, path
            assert ".quillignore" not in captured.contents
            rounds += 1
    finally:
        (co.tree / ".stop").touch()
        racer.wait(30)
        assert racer.stdout is not None
        racer.stdout.close()
    assert rounds >= 3
    assert modes(canaries) == before


async def test_a_workdir_through_a_link_tells_nothing_of_the_host(
    stack: Stack, canaries: Canaries
) -> None:
    """The executor checks ``workdir`` on the host: through a link, a host file that exists
    and one that does not must answer alike (no oracle on the host's files)."""
    ws = await new_workspace(stack, "acme/workdir-link")
    await ok(ws, f"ln -s {canaries.root} h")
    answers = []
    for workdir in ("h/host-file", "h/no-such-file", "h"):
        with pytest.raises(QuillError) as refused:
            await ws.exec("true", workdir=workdir)
        answers.append(refused.value.code)
    assert answers[0] == answers[1] == ErrorCode.FILE_NOT_FOUND
    assert answers[2] == ErrorCode.NOT_A_DIRECTORY  # the link itself: never entered


async def test_no_hard_link_reaches_a_host_file(
    stack: Stack, canaries: Canaries, provider: str
) -> None:
    """The host files the sandbox shows are other mounts than the checkout's: no hard link to
    one can be made in it (so none can be committed, nor rewritten by the executor)."""
    bwrap_only(provider, "a local command sees the host's files as they are")
    ws = await new_workspace(stack, "acme/hard-host")
    result = await ws.exec("ln /usr/bin/env e; ln /etc/ld.so.cache c; ls -A")
    assert result.stdout == ""
    assert result.stderr.count("Invalid cross-device link") == 2, result.stderr
    assert not result.changes.committed
