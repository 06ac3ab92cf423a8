"""A command's output past ``max_output_bytes``: the reply keeps its head and its tail and says
how much was left out between them; the whole output stays readable by the command's id
(``exec.output``), page by page, from any executor. And what a command's environment is: what
it left running, a read of its closed stdin, ``python``. Real sandboxes, real services, both
providers."""

from __future__ import annotations

import secrets

import pytest
import pytest_asyncio

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from quill.client import Quill, Workspace
from services.executor.output import CHUNK, OutputConfig
from tests.executor.conftest import StartExecutor
from tests.helpers import host_processes

LINES = 50_000
LOG = f"for i in $(seq 1 {LINES}); do echo \"line $i of the build\"; done; echo 'ERROR: it broke'"
"""A build log of 50,000 lines whose last line is the error."""


async def created(quill: Quill, name: str, **limits: int) -> Workspace:
    ws = quill.workspace(name)
    await ws.create(limits=LimitsPatch(**limits) if limits else None)  # type: ignore[arg-type]
    return ws


@pytest_asyncio.fixture
async def ws(stack: StartExecutor, quill: Quill, name: str) -> Workspace:
    """An executor started (the test's provider) and workspace ``name``, created."""
    await stack()
    return await created(quill, name)


async def whole(ws: Workspace, command_id: str, stream: str = "stdout", length: int = CHUNK) -> str:
    """A command's kept output, page by page."""
    text, offset = "", 0
    while True:
        page = await ws.command_output(command_id, stream=stream, offset=offset, length=length)  # type: ignore[arg-type]
        assert page.offset == offset and page.complete
        text, offset = text + page.text, offset + page.length
        if not page.more:
            return text


async def test_long_output_keeps_head_and_tail(ws: Workspace) -> None:
    r = await ws.exec(LOG)
    expected = "".join(f"line {i} of the build\n" for i in range(1, LINES + 1))
    expected += "ERROR: it broke\n"
    assert r.exit_code == 0 and r.stdout_bytes == len(expected)
    assert r.stdout_truncated and r.stdout.startswith("line 1 of the build\n")
    assert r.stdout_tail.endswith("line 50000 of the build\nERROR: it broke\n")
    # each part whole lines, at most half the cap, and the numbers add up exactly
    cap = 50 * 1024
    assert r.stdout.endswith("\n") and len(r.stdout) <= cap // 2
    assert r.stdout_tail.startswith("line ") and len(r.stdout_tail) <= cap - cap // 2
    assert r.stdout_omitted_offset == len(r.stdout)
    assert len(r.stdout) + r.stdout_omitted_bytes + len(r.stdout_tail) == r.stdout_bytes
    assert expected[r.stdout_omitted_offset :].startswith(
        expected[len(r.stdout) : len(r.stdout) + 40]
    )
    # the middle, by the command's id, exactly
    assert r.output_kept and r.command_id
    length = min(r.stdout_omitted_bytes, 1024 * 1024)  # the most one page holds
    middle = await ws.command_output(r.command_id, offset=r.stdout_omitted_offset, length=length)
    assert middle.text == expected[r.stdout_omitted_offset : r.stdout_omitted_offset + length]
    assert middle.more and middle.kept_bytes == middle.total_bytes == len(expected)
    # and the whole, in pages that never split a line's bytes wrongly
    assert await whole(ws, r.command_id, length=100_000) == expected


async def test_short_output_is_whole(ws: Workspace) -> None:
    r = await ws.exec("echo out; echo err >&2")
    assert (r.stdout, r.stdout_tail, r.stdout_truncated, r.stdout_omitted_bytes) == (
        "out\n",
        "",
        False,
        0,
    )
    assert (r.stderr, r.stderr_truncated) == ("err\n", False)
    page = await ws.command_output(r.command_id, stream="stderr")
    assert (page.text, page.more, page.complete) == ("err\n", False, True)


async def test_cap_split_in_halves_at_a_small_limit_with_utf8(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    """No line end near the cut: the parts are cut inside a line, never inside a character."""
    await stack()
    ws = await created(quill, name, max_output_bytes=101)
    r = await ws.exec("printf 'é%.0s' $(seq 1 500) >&2")  # 1,000 bytes, no newline
    assert r.stderr_truncated and r.stderr_bytes == 1000
    assert set(r.stderr) == {"é"} and set(r.stderr_tail) == {"é"}
    assert len(r.stderr.encode()) == 50 and len(r.stderr_tail.encode()) == 50
    assert r.stderr_omitted_offset == 50 and r.stderr_omitted_bytes == 900
    page = await ws.command_output(r.command_id, stream="stderr", offset=50, length=901)
    assert page.text == "é" * 450 and page.length == 900 and page.more  # the tail remains


async def test_output_is_read_from_any_executor(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    first = await stack()
    ws = await created(quill, name)
    r = await ws.exec("seq 1 30000")
    await first.stop()  # the executor that ran it is gone
    await stack()
    expected = "".join(f"{i}\n" for i in range(1, 30001))
    assert await whole(ws, r.command_id) == expected


async def test_kept_output_has_a_cap(stack: StartExecutor, quill: Quill, name: str) -> None:
    await stack(output=OutputConfig(keep_bytes=CHUNK + 10))
    ws = await created(quill, name)
    r = await ws.exec("head -c 300000 /dev/zero | tr '\\0' x")
    page = await ws.command_output(r.command_id, offset=CHUNK, length=CHUNK)
    assert page.text == "x" * 10 and not page.more
    assert (page.kept_bytes, page.total_bytes) == (CHUNK + 10, 300_000)
    assert r.stdout_tail == "x" * (25 * 1024) and r.stdout_omitted_bytes == 300_000 - 50 * 1024


async def test_unknown_or_other_workspaces_command(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    await stack()
    ws = await created(quill, name)
    other = await created(quill, name + "-other")
    r = await ws.exec("echo mine")
    for where, command_id in ((ws, "no-such-command"), (other, r.command_id)):
        with pytest.raises(QuillError) as caught:
            await where.command_output(command_id)
        assert caught.value.code == ErrorCode.FILE_NOT_FOUND
        assert "No output kept for command" in caught.value.message
    with pytest.raises(QuillError) as caught:  # like any op on a workspace that is not there
        await quill.workspace(name + "-none").command_output(r.command_id)
    assert caught.value.code == ErrorCode.WORKSPACE_NOT_FOUND


# ------------------------------------------------------------------ the environment


async def test_background_processes_are_counted_and_killed(ws: Workspace) -> None:
    token = f"300.{secrets.randbelow(10**9):09d}"  # names the processes on the host
    r = await ws.exec(f"sleep {token} & sleep {token} & echo started")
    assert (r.exit_code, r.stdout, r.background_killed) == (0, "started\n", 2)
    assert not host_processes(token)
    again = await ws.exec("echo nothing left behind")
    assert again.background_killed == 0


async def test_a_read_of_the_closed_stdin_is_reported(ws: Workspace) -> None:
    r = await ws.exec('read -p "Name? " x')
    assert (r.exit_code, r.stdin_read, r.stdout, r.stderr) == (1, True, "", "")
    py = await ws.exec('python3 -c "input()"')
    assert py.exit_code == 1 and py.stdin_read and "EOFError" in py.stderr
    quiet = await ws.exec("echo no input needed")
    assert not quiet.stdin_read
    piped = await ws.exec('echo Ada | { read -p "Name? " x; echo "hi $x"; }')
    assert piped.stdout == "hi Ada\n" and not piped.stdin_read


async def test_python_is_python3(ws: Workspace) -> None:
    r = await ws.exec("python -c 'import sys; print(sys.version_info[0])'")
    assert (r.exit_code, r.stdout) == (0, "3\n"), r.stderr


async def test_kept_output_says_what_the_command_was(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    """``exec.output`` answers, once the command ended, its facts: the command line, where and
    by whom it ran, how long, its exit code, and the version its changes became."""
    await stack()
    ws = await created(quill, name)
    await ws.mkdir("sub")
    base = ws.last_version
    view = quill.as_actor("alice", session="s-1").workspace(name)
    r = await view.exec("echo hi > made.txt; exit 3", workdir="sub")
    facts = (await ws.command_output(r.command_id)).command
    assert facts is not None
    assert (facts.command, facts.workdir, facts.actor, facts.session) == (
        "echo hi > made.txt; exit 3",
        "sub",
        "alice",
        "s-1",
    )
    assert (facts.exit_code, facts.timed_out, facts.base_version) == (3, False, base)
    assert facts.version == r.changes.version == base + 1 and facts.changed == 1
    assert facts.duration_ms == r.duration_ms and facts.error is None
    nothing = await ws.exec("sleep 5", timeout_ms=200)
    quiet = (await ws.command_output(nothing.command_id, stream="stderr")).command
    assert quiet is not None and quiet.timed_out and quiet.version is None and quiet.changed == 0
