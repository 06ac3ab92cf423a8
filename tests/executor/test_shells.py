"""Shells (``exec.shell_open``, ``exec.run`` with ``shell``, ``exec.checkpoint``,
``exec.shell_close``) under both sandbox providers: what one command leaves the next finds,
background work committed as the shell's, conflicts kept, one command at a time.
(Hostile uses: ``tests/security/test_shells.py``.)"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from infra.exec.sandbox import cgroups
from quill.client import Quill
from quill.workspace import Workspace
from tests.executor.conftest import StartExecutor
from tests.helpers import eventually


async def test_state_carries_over(ws: Workspace) -> None:
    await ws.write("sub/keep.txt", "x")
    async with await ws.shell() as sh:
        r = await sh.run("cd sub && export X=1 && greet() { echo hi $1; } && echo t > /tmp/t")
        assert r.exit_code == 0 and r.shell == sh.id
        r = await sh.run('pwd; echo "$X"; greet ada; cat /tmp/t; echo made > here.txt')
        assert r.exit_code == 0
        lines = r.stdout.splitlines()
        assert lines[0].endswith("/sub") and lines[1:] == ["1", "hi ada", "t"]
        assert r.changes.committed and [p.path for p in r.changes.paths] == ["sub/here.txt"]
        assert (await ws.read("sub/here.txt")).content == "made\n"
        r = await sh.run("false")
        assert r.exit_code == 1
        r = await sh.run("echo out; echo err >&2; (exit 7)")
        assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")


async def test_loopback_server_across_commands(ws: Workspace) -> None:
    async with await ws.shell() as sh:
        r = await sh.run("python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &")
        assert r.exit_code == 0
        fetch = (
            "python3 -c 'import time,urllib.request\n"
            "for i in range(100):\n"
            "    try:\n"
            '        print(urllib.request.urlopen("http://127.0.0.1:8765/").status); break\n'
            "    except OSError: time.sleep(0.1)\n'"
        )
        r = await sh.run(fetch)
        assert r.stdout.strip() == "200", r


async def test_background_committed_on_checkpoint(ws: Workspace) -> None:
    async with await ws.shell() as sh:
        for n in range(10):  # until the job writes after the command that lets it go returned
            bg = f"bg{n}.txt"
            job = f"(while [ ! -e $HOME/go{n} ]; do sleep 0.05; done; echo x > {bg}) &"
            r = await sh.run(job)
            assert not r.changes.committed
            went = await sh.run(f"touch $HOME/go{n}")
            if bg not in [p.path for p in went.changes.paths]:  # else: written while it ran
                break
        else:
            raise AssertionError("the job always wrote while its command still ran")

        async def committed() -> bool:
            cp = await sh.checkpoint()
            if not cp.background.committed:
                return False
            assert [p.path for p in cp.background.paths] == [bg]
            return True

        await eventually(committed)
        assert (await ws.read(bg)).content == "x\n"
        history = await ws.history(bg)
        assert (history.revisions[0].request_id or "").startswith(sh.id + ".bg")  # the shell's


async def test_conflict_kept_not_overwritten(stack: StartExecutor, quill: Quill, name: str) -> None:
    executor = await stack()
    ws = quill.workspace(name)
    await ws.create()
    await ws.write("f.txt", "base\n")
    async with await ws.shell() as sh:
        tree = executor.shells.held[sh.id].checkout.tree
        # the shell changes f.txt while the workspace changes it too
        run = asyncio.create_task(
            sh.run("echo shell > f.txt; while [ ! -e gate ]; do sleep 0.05; done; rm gate")
        )
        await eventually(lambda: (tree / "f.txt").read_text() == "shell\n")
        await ws.write("f.txt", "workspace\n")
        (tree / "gate").touch()
        r = await run
        assert [c.path for c in r.changes.conflicts] == ["f.txt"]
        assert r.kept_conflicts == ["f.txt"]
        assert (await ws.read("f.txt")).content == "workspace\n"  # the workspace's stands
        r = await sh.run("cat f.txt")
        assert r.stdout == "shell\n"  # the shell's kept, uncommitted
        r = await sh.run("echo next > n.txt")
        assert [p.path for p in r.changes.paths] == ["n.txt"]  # f.txt still withheld
        assert (await ws.read("f.txt")).content == "workspace\n"


async def test_second_command_busy(ws: Workspace) -> None:
    async with await ws.shell() as sh:
        first = asyncio.create_task(sh.run("while [ ! -e $HOME/go ]; do sleep 0.05; done"))

        async def started() -> bool:  # before a second is sent (it could go first)
            return any(c.shell == sh.id for c in (await ws.running()).commands)

        await eventually(started)

        async def busy() -> bool:
            try:
                await sh.run("true")
            except QuillError as exc:
                assert exc.code == ErrorCode.BUSY
                assert "$HOME/go" in exc.details["command"]
                return True
            return False

        await eventually(busy)
        listed = await ws.running()
        assert [s.shell for s in listed.shells] == [sh.id]
        assert [c.shell for c in listed.commands] == [sh.id]
        queued = asyncio.create_task(sh.run("echo queued", queue=True))
        await ws.exec("true")  # a one-shot command runs alongside
        assert not first.done() and not queued.done()
        first.cancel()
        queued.cancel()


async def test_close_kills_background(ws: Workspace) -> None:
    sh = await ws.shell()
    await sh.run("sleep 1000 & sleep 1000 &")
    closed = await sh.close()
    assert (closed.shell, closed.killed) == (sh.id, 2)  # the two sleeps, not the server
    with pytest.raises(QuillError) as err:
        await sh.run("true")
    assert err.value.code == ErrorCode.SHELL_NOT_FOUND
    assert (await ws.running()).shells == []


async def test_idle_timeout(ws: Workspace) -> None:
    sh = await ws.shell(idle_timeout_ms=1000)
    await sh.run("true")

    async def gone() -> bool:
        return (await ws.running()).shells == []

    await eventually(gone, timeout=30)
    with pytest.raises(QuillError) as err:
        await sh.run("true")
    assert err.value.code == ErrorCode.SHELL_NOT_FOUND


async def test_tmp_is_the_shells_own(ws: Workspace) -> None:
    probe = f"quill-shell-tmp-{secrets.token_hex(6)}"
    async with await ws.shell() as sh, await ws.shell() as other:
        r = await sh.run(f"echo mine > /tmp/{probe} && cd $HOME && pwd && ls /tmp")
        assert r.exit_code == 0 and probe in r.stdout.split(), r
        assert (await sh.run(f"cat /tmp/{probe}")).stdout == "mine\n"  # kept across commands
        assert not Path("/tmp", probe).exists()  # before (local): the host's /tmp
        r = await other.run(f"cat /tmp/{probe}")
        assert r.exit_code == 1  # nor another shell's


async def test_stdin_of_a_shell_command(ws: Workspace) -> None:
    async with await ws.shell() as sh:
        await sh.run("cd /tmp && export N=1")
        r = await sh.run('read a; rest=$(cat); echo "$a|$rest|$N|$PWD"', stdin=b"first\nsecond\n")
        assert (r.stdout, r.exit_code) == ("first|second|1|/tmp\n", 0)  # before: refused
        r = await sh.run("true", stdin=b"x" * 300_000)  # unread: no hang
        assert r.exit_code == 0
        r = await sh.run("wc -c", stdin=b"y" * 300_000)
        assert r.stdout.strip() == "300000"
        r = await sh.run("cat; echo end")  # none: /dev/null
        assert r.stdout == "end\n"


async def test_a_long_shell_command_yields(stack: StartExecutor, quill: Quill, name: str) -> None:
    executor = await stack()
    ws = quill.workspace(name)
    await ws.create()
    sh = await ws.shell()
    await sh.run("export GREETING=hi")
    tree = executor.shells.held[sh.id].checkout.tree
    r = await ws.exec(
        'echo "$GREETING early"; while [ ! -e gate ]; do sleep 0.05; done; '
        "echo late > out.txt; echo done; cd /tmp",
        shell=sh.id,
        yield_ms=300,
    )  # before: INVALID_ARGUMENT (yield_ms is not taken with shell)
    assert r.running and r.command_id and r.stdout == "hi early\n", r
    listed = await ws.running()
    assert [c.command_id for c in listed.commands] == [r.command_id]
    with pytest.raises(QuillError) as busy:
        await sh.run("true")
    assert busy.value.code == ErrorCode.BUSY
    cmd = ws.command(r.command_id)
    written = await cmd.input("x\n")  # its stdin is live (it reads none of it)
    assert (written.written, written.closed) == (2, False)
    (tree / "gate").touch()
    done = await cmd.wait()
    assert (done.exit_code, done.stdout) == (0, "hi early\ndone\n")
    assert done.changed == 2 and done.version is not None  # gate and out.txt
    assert (await ws.read("out.txt")).content == "late\n"
    r = await sh.run("pwd; echo $GREETING")
    assert r.stdout == "/tmp\nhi\n"  # what the yielded command left carries over
    r = await ws.exec("sleep 30", shell=sh.id, yield_ms=100)
    assert r.running
    killed = await ws.command(r.command_id).signal("KILL")
    assert killed.processes == 1  # the sleep: not the shell's server or its bash
    assert (await ws.command(r.command_id).wait()).exit_code == 137
    r = await sh.run("echo $GREETING")
    assert r.stdout == "hi\n"  # the shell lives on
    await sh.close()


def own_cgroups() -> set[Path]:
    """The sandbox cgroups this process's executors made that exist now."""
    found, why = cgroups.detect()
    if found is None:
        pytest.skip(f"no cgroups here: {why}")
    mine = f"{cgroups.PREFIX}{cgroups.owner(os.getpid())}-"
    return {path for base in found.bases for path in base.glob(f"{mine}*")}


async def test_a_closed_shells_cgroup_is_removed(ws: Workspace, provider: str) -> None:
    """A shell's sandbox outlives the request that opened it: its cgroup was left behind when
    it ended (the removal went to that request's after-reply list, long run), 12 a file."""
    if provider != "bwrap":
        pytest.skip("local: no sandbox cgroups")
    before = own_cgroups()
    sh = await ws.shell()
    assert (await sh.run("echo in")).stdout == "in\n"
    assert own_cgroups() - before, "the shell's sandbox has no cgroup: the check could not fail"
    await sh.close()
    await eventually(lambda: not (own_cgroups() - before), 10, "the shell's cgroup removed")
