"""Input and signals to a command running on in a shell (``exec.run`` with ``shell`` and
``yield_ms``, then ``exec.input`` and ``exec.signal``), under bwrap and the local provider,
with the same answers from both. They go through the shell's server (``shell_server``): input
to the command's stdin, a signal to the command's processes only: never the server or the
shell's bash (the next command runs, with its cwd and exports), nor what earlier commands
left running.

* ``read name`` gets what ``exec.input`` sends, and ends.
* ``sleep 100`` sent INT ends with 130; the shell runs the next command as it was.
* A command trapping TERM runs its trap; a background process of an earlier command gets
  none of it.
* Input to a command that has ended: ``COMMAND_ENDED``.
* Input meant for one shell's command never reaches another shell's (its id is the
  command's own, and each shell has its own server).
* A command that closes its own stdin: input is answered (nothing hangs), and the shell
  answers after.
* Input over 64 KiB is refused clearly (``INVALID_ARGUMENT``), before anything is written.
"""

from __future__ import annotations

import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LIVE_INPUT_MAX_BYTES
from contracts.replies import SignalSent
from contracts.requests import SignalName
from quill.client import Workspace
from quill.command import Command
from tests.executor.conftest import executor, name, provider, stack, ws  # noqa: F401
from tests.helpers import eventually

YIELD_MS = 200


async def started(ws: Workspace, shell: str, command: str) -> Command:  # noqa: F811
    """``command`` running on in ``shell``, answered at ``YIELD_MS``."""
    r = await ws.exec(command, shell=shell, yield_ms=YIELD_MS)
    assert r.running and r.command_id, r
    return ws.command(r.command_id, r.cursor or "")


async def test_read_gets_its_input_and_ends(ws: Workspace) -> None:  # noqa: F811
    async with await ws.shell() as sh:
        cmd = await started(ws, sh.id, 'read -r name; echo "hi $name"')
        written = await cmd.input("Ada\n")
        assert (written.written, written.closed) == (4, False)
        done = await cmd.wait()
        assert (done.running, done.exit_code, done.stdout) == (False, 0, "hi Ada\n")
        more = await started(ws, sh.id, "cat; echo end")  # eof ends a reader
        assert (await cmd_input(more, "a\nb\n", eof=True)).closed
        done = await more.wait()
        assert (done.exit_code, done.stdout) == (0, "a\nb\nend\n")


async def signalled(cmd: Command, which: SignalName) -> SignalSent:
    """``which`` sent until a process of ``cmd`` got it (its first may not be forked yet)."""
    sent: list[SignalSent] = []

    async def hit() -> bool:
        sent.append(await cmd.signal(which))
        return sent[-1].processes >= 1

    await eventually(hit)
    return sent[-1]


async def cmd_input(cmd: Command, data: str, eof: bool = False) -> object:
    return await cmd.input(data, eof=eof)


async def test_int_ends_the_command_not_the_shell(ws: Workspace) -> None:  # noqa: F811
    async with await ws.shell() as sh:
        r = await sh.run("mkdir -p sub && cd sub && export KEPT=yes")
        assert r.exit_code == 0
        cmd = await started(ws, sh.id, "sh -c 'echo ready; exec sleep 100'")
        watch, out = ws.command(cmd.id), ""  # its output from the start
        while "ready" not in out:  # printed by the process the signal is for, forked and run
            out += (await watch.poll(wait_ms=5000)).stdout
        sent = await signalled(cmd, "INT")
        assert (sent.signal, sent.processes) == ("INT", 1)
        done = await cmd.wait()
        assert (done.running, done.exit_code) == (False, 130)
        r = await sh.run('pwd; echo "$KEPT"')
        lines = r.stdout.splitlines()
        assert r.exit_code == 0 and lines[0].endswith("/sub") and lines[1:] == ["yes"], r


async def test_term_is_trapped_and_earlier_background_spared(ws: Workspace) -> None:  # noqa: F811
    async with await ws.shell() as sh:
        r = await sh.run("sleep 1000 & echo $! > $HOME/bg")
        assert r.exit_code == 0
        trap = (
            "bash -c 'trap \"echo caught; exit 7\" TERM; echo ready; while :; do sleep 0.05; done'"
        )
        r = await ws.exec(trap, shell=sh.id, yield_ms=YIELD_MS)
        assert r.running and r.command_id, r
        cmd = ws.command(r.command_id)  # read from the start: "ready" once its trap is set

        async def ready() -> bool:
            return "ready" in (await ws.command(cmd.id).poll(wait_ms=1000)).stdout

        await eventually(ready)
        sent = await cmd.signal("TERM")
        assert sent.processes >= 1
        done = await cmd.wait()
        assert (done.exit_code, done.stdout) == (7, "ready\ncaught\n")
        r = await sh.run('kill -0 "$(cat $HOME/bg)" && echo alive')
        assert r.stdout == "alive\n", r  # the earlier command's background process


async def test_input_to_an_ended_command_is_refused(ws: Workspace) -> None:  # noqa: F811
    async with await ws.shell() as sh:
        cmd = await started(ws, sh.id, "read -r x; echo got $x")
        await cmd.input("1\n")
        assert (await cmd.wait()).exit_code == 0
        with pytest.raises(QuillError) as err:
            await cmd.input("late\n")
        assert err.value.code == ErrorCode.COMMAND_ENDED
        r = await sh.run("echo next")  # nothing late reached the shell's next command
        assert (r.exit_code, r.stdout) == (0, "next\n")


async def test_input_reaches_only_its_own_shells_command(ws: Workspace) -> None:  # noqa: F811
    async with await ws.shell() as one, await ws.shell() as two:
        first = await started(ws, one.id, "read -r x; echo one:$x")
        second = await started(ws, two.id, "read -r x; echo two:$x")
        await second.input("for-two\n")
        assert (await second.wait()).stdout == "two:for-two\n"
        await first.input("for-one\n")
        assert (await first.wait()).stdout == "one:for-one\n"


async def test_a_command_closing_its_stdin_does_not_hang_input(ws: Workspace) -> None:  # noqa: F811
    async with await ws.shell() as sh:
        cmd = await started(ws, sh.id, "exec 0<&-; echo closed; sleep 100")
        written = await cmd.input("ignored\n")
        assert written.written in (0, len("ignored\n"))  # answered: nothing waits for a reader
        await signalled(cmd, "TERM")
        done = await ws.command(cmd.id).wait()  # from its start
        assert done.exit_code == 143 and done.stdout == "closed\n", done
        r = await sh.run("echo still")
        assert (r.exit_code, r.stdout) == (0, "still\n")


async def test_input_over_the_limit_is_refused(ws: Workspace) -> None:  # noqa: F811
    async with await ws.shell() as sh:
        cmd = await started(ws, sh.id, "wc -c")
        with pytest.raises(QuillError) as err:
            await cmd.input(b"x" * (LIVE_INPUT_MAX_BYTES + 1))
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
        written = await cmd.input(b"x" * LIVE_INPUT_MAX_BYTES, eof=True)
        assert written.written == LIVE_INPUT_MAX_BYTES
        done = await cmd.wait()
        assert (done.exit_code, done.stdout.strip()) == (0, str(LIVE_INPUT_MAX_BYTES))


async def test_kill_of_a_builtin_ends_the_shell(ws: Workspace) -> None:  # noqa: F811
    sh = await ws.shell()
    cmd = await started(ws, sh.id, "while :; do :; done")  # no process of its own to signal
    assert (await cmd.signal("INT")).processes == 0  # nothing of the shell's own is hit
    await cmd.signal("KILL")  # it runs in the shell's bash: the shell ends, as a timeout
    assert (await cmd.wait()).exit_code != 0

    async def gone() -> bool:
        return (await ws.running()).shells == []

    await eventually(gone)
