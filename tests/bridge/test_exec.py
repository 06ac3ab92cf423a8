"""Commands and git on a local workspace run in its folder, on its user's machine."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from tests.bridge.conftest import Attach, folder_with


async def test_a_command_runs_in_the_folder_once_allowed(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    folder = folder_with(tmp_path, {"src/app.py": "print('hi')\n", "old.txt": "old\n"})
    bridge = await attach(folder, "laptop")
    ws = client.workspace("acme/laptop")
    live: list[bytes] = []

    async def on_output(stream: str, chunk: bytes) -> None:
        live.append(chunk)

    command = "pwd && ls && echo made > ../made.txt && rm ../old.txt && echo oops >&2; exit 3"
    running = asyncio.create_task(ws.exec(command, workdir="src", on_output=on_output))
    prompt = await bridge.prompt()
    assert f"tester wants to run in src: $ {command}" in prompt
    assert not running.done()
    await bridge.answer("y")
    result = await running
    assert result.exit_code == 3 and result.stderr == "oops\n"
    assert result.stdout == f"{os.path.realpath(folder / 'src')}\napp.py\n"
    assert b"".join(live).decode().startswith(os.path.realpath(folder / "src"))
    changes = {(c.path, c.change) for c in result.changes.paths}
    assert changes == {("made.txt", "created"), ("old.txt", "deleted")}
    assert not result.changes.committed
    assert (folder / "made.txt").read_text() == "made\n"
    # What a command changed, the workspace shows.
    assert await ws.read_text("made.txt") == "made\n"

    denied = asyncio.create_task(ws.exec("touch never.txt"))
    await bridge.prompt()
    await bridge.answer("n")
    with pytest.raises(QuillError) as info:
        await denied
    assert info.value.code == ErrorCode.DENIED
    assert not (folder / "never.txt").exists()

    with pytest.raises(QuillError) as info:  # refused before anybody is asked
        await ws.exec("true", workdir="missing")
    assert info.value.code == ErrorCode.FILE_NOT_FOUND


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
async def test_git_works_on_the_folder_and_leaves_the_network_to_its_user(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    folder = folder_with(tmp_path, {"a.txt": "a\n"})
    await attach(folder, "laptop", "--trust", "full")
    ws = client.as_actor("alice").workspace("acme/laptop")
    await ws.exec("git init -q -b main")
    status = await ws.git("status")
    assert status.status is not None and status.status.untracked == ["a.txt"]
    committed = await ws.git("commit", message="first")
    assert committed.commit and committed.changes is not None
    assert any(c.path.startswith(".git/") for c in committed.changes.paths)
    await ws.write("b.txt", "b\n")
    await ws.git("commit", message="second")
    log = await ws.git("log")
    assert [c.subject for c in log.log or []] == ["second", "first"]
    assert {c.author for c in log.log or []} == {"alice"}
    for action in ("push", "pull"):
        with pytest.raises(QuillError) as info:
            await ws.git(action)  # type: ignore[arg-type]
        assert info.value.code == ErrorCode.ACCESS_DENIED
        assert "not available on a local workspace" in info.value.message
