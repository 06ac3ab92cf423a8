"""Commands that outlive their request (``exec.run`` with ``yield_ms``), under both sandbox
providers: answered ``running`` with an id, polled to their end with their exit status and the
version their changes were committed as, fed input, signalled, listed; from another client.
(Their bounds and tenants: ``tests/security/test_live_commands.py``.)"""

from __future__ import annotations

import asyncio
import json
import signal

from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from quill.workspace import Workspace
from tests.executor.conftest import StartExecutor


async def test_yielded_then_polled_to_its_end(ws: Workspace) -> None:
    r = await ws.exec("echo first; read x; echo made > out.txt; echo last; exit 3", yield_ms=200)
    assert r.running and r.command_id.startswith("c") and r.exit_code == -1
    assert r.stdout == "first\n" and r.cursor
    cmd = ws.command(r.command_id, r.cursor)
    assert (await cmd.poll()).stdout == ""  # nothing after the cursor yet
    await cmd.input("go\n", eof=True)
    done = await cmd.wait()
    assert (done.running, done.exit_code, done.stdout) == (False, 3, "last\n")
    assert done.version is not None and done.changed == 1
    assert (await ws.read("out.txt")).content == "made\n"
    info = await ws.info()
    assert info.version == done.version
    # from the start again: the whole output, kept
    again = await ws.command(r.command_id).poll()
    assert again.stdout == "first\nlast\n" and not again.running


async def test_a_quick_command_answers_as_today(ws: Workspace) -> None:
    r = await ws.exec("echo quick > q.txt; echo hi", yield_ms=30_000)
    assert (r.running, r.exit_code, r.stdout) == (False, 0, "hi\n")
    assert r.changes.committed
    status = await ws.command(r.command_id).poll()  # its id polls too
    assert (status.running, status.exit_code, status.stdout) == (False, 0, "hi\n")


async def test_wait_returns_early_when_output_comes(ws: Workspace) -> None:
    r = await ws.exec("read x; echo got $x; read y", yield_ms=100)
    cmd = ws.command(r.command_id, r.cursor)
    waiting = asyncio.create_task(cmd.poll(wait_ms=60_000))
    await asyncio.sleep(0)  # the poll is on its way; its answer is due at the output, not in 60 s
    await cmd.input("ada\n")
    status = await asyncio.wait_for(waiting, 30)
    assert status.running and status.stdout == "got ada\n"
    await cmd.input(b"", eof=True)
    assert (await cmd.wait()).exit_code == 1  # ``read y`` got end of file


async def test_cat_fed_in_pieces(ws: Workspace) -> None:
    r = await ws.exec("cat > fed.txt", yield_ms=50)
    assert r.running
    cmd = ws.command(r.command_id, r.cursor)
    for piece in ("one\n", "two\n", "three"):
        assert (await cmd.input(piece)).written == len(piece)
    closed = await cmd.input(eof=True)
    assert closed.closed
    done = await cmd.wait()
    assert done.exit_code == 0 and done.version is not None
    assert (await ws.read("fed.txt")).content == "one\ntwo\nthree"


async def test_signals(ws: Workspace) -> None:
    # the trap's loop sleeps long: bash acts on an INT while it waits for a child that then
    # dies of it, and the executor signals the child a moment after bash
    trapping = "trap 'echo caught; exit 7' INT; echo ready; while :; do sleep 5; done"
    for sig, script, code in (
        ("INT", trapping, 7),
        ("TERM", "echo ready; while :; do sleep 0.02; done", 143),
        ("KILL", "echo ready; while :; do sleep 0.02; done", 137),
        ("HUP", "echo ready; while :; do sleep 0.02; done", 129),
    ):
        r = await ws.exec(script, yield_ms=300)
        cmd = ws.command(r.command_id)
        while "ready" not in (await cmd.poll(wait_ms=5000)).stdout:
            pass
        sent = await cmd.signal(sig)  # type: ignore[arg-type]
        assert sent.processes >= 1
        done = await cmd.wait()
        assert done.exit_code == code, (sig, done)


async def test_term_ignored_is_killed_after_grace(ws: Workspace) -> None:
    r = await ws.exec("trap '' TERM; echo ready; while :; do sleep 0.02; done", yield_ms=300)
    cmd = ws.command(r.command_id)
    while "ready" not in (await cmd.poll(wait_ms=5000)).stdout:
        pass
    await cmd.signal("TERM")
    assert (await cmd.poll(wait_ms=1000)).running  # ignored: still running within the grace
    done = await cmd.wait()
    assert done.exit_code == 137 and not done.running


async def test_list_and_a_new_client(ws: Workspace, name: str, nats_url: str) -> None:
    r = await ws.exec("echo up; read x; echo $x", yield_ms=200)
    listed = await ws.running()
    assert [c.command_id for c in listed.commands] == [r.command_id]
    assert listed.commands[0].command.startswith("echo up") and listed.executors == 1
    other = await Quill.connect(nats_url, actor="other")  # another client, as after a reconnect
    try:
        cmd = other.workspace(name).command(r.command_id)
        assert (await cmd.poll()).stdout == "up\n"
        await cmd.input("from afar\n", eof=True)
        done = await cmd.wait()
        assert (done.exit_code, done.stdout) == (0, "from afar\n")
    finally:
        await other.close()
    assert (await ws.running()).commands == []


async def test_handles_forwarded_between_executors(ws: Workspace, stack: StartExecutor) -> None:
    """Input and signals reach the executor holding the command whichever executor takes
    them; poll is answered by any."""
    await stack()  # a second executor
    r = await ws.exec("cat", yield_ms=100)
    cmd = ws.command(r.command_id)
    for _ in range(6):  # the queue group spreads them: some are forwarded
        await cmd.input("x\n")
    await cmd.input(eof=True)
    done = await cmd.wait()
    assert done.stdout == "x\n" * 6 and done.exit_code == 0
    assert (await ws.running()).executors == 2


async def test_malformed_bodies(ws: Workspace, name: str, nats_url: str) -> None:
    nc = NATS()
    await nc.connect(nats_url)
    try:
        t, w = name.split("/")
        for op, body in (
            ("poll", b"{"),
            ("poll", b'{"command_id": "../x"}'),
            ("poll", json.dumps({"command_id": "c0123456789abXYZ", "cursor": "x"}).encode()),
            ("poll", json.dumps({"command_id": "c0123456789abXYZ", "wait_ms": 10**9}).encode()),
            ("input", json.dumps({"command_id": "c0123456789abXYZ", "data": 5}).encode()),
            ("signal", json.dumps({"command_id": "c0123456789abXYZ", "signal": "STOP"}).encode()),
            ("run", json.dumps({"command": "true", "yield_ms": -1}).encode()),
        ):
            msg = await nc.request(f"ws.exec.{t}.{w}.{op}", body, timeout=10)
            assert json.loads(msg.data)["error"]["code"] == "INVALID_ARGUMENT", (op, body)
        made_up = json.dumps({"command_id": "c0123456789abXYZ"}).encode()
        msg = await nc.request(f"ws.exec.{t}.{w}.poll", made_up, timeout=10)
        assert json.loads(msg.data)["error"]["code"] == "COMMAND_NOT_FOUND"
    finally:
        await nc.close()


async def test_input_to_an_ended_command(ws: Workspace) -> None:
    r = await ws.exec("read x; echo $x", yield_ms=100)
    cmd = ws.command(r.command_id)
    await cmd.input("bye\n", eof=True)
    await cmd.wait()
    try:
        await cmd.input("more\n")
    except QuillError as exc:
        assert exc.code == ErrorCode.COMMAND_ENDED
    else:
        raise AssertionError("input to an ended command was taken")


async def test_int_reaches_a_command_of_an_executor_started_ignoring_it(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    """A shell starts its background jobs ignoring SIGINT (``quill executor &``, ``pytest &``)
    and a command inherits what its parent ignores, which bash cannot undo: the executor
    undoes it as it starts, so an INT still ends a command (before: it ran to its timeout)."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        await stack()
        ws = quill.workspace(name)
        await ws.create()
        r = await ws.exec("echo ready; exec sleep 60", yield_ms=300, timeout_ms=30_000)
        cmd, out = ws.command(r.command_id), ""
        while "ready" not in out:
            out += (await cmd.poll(wait_ms=5000)).stdout
        assert (await cmd.signal("INT")).processes >= 1
        done = await cmd.wait()
        assert (done.exit_code, done.timed_out) == (130, False), done
    finally:
        signal.signal(signal.SIGINT, before)
