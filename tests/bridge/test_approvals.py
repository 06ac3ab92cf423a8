"""Restricted trust: the bridge asks its user at its terminal before each mutation or command
(or follows its policy file); reads are never asked."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from tests.bridge.conftest import Attach, Attached


async def laptop(attach: Attach, tmp_path: Path, *options: str) -> Attached:
    """``quill attach`` of a new, empty ``tmp_path/dir`` as ``laptop``, with ``options``."""
    (tmp_path / "dir").mkdir()
    return await attach(tmp_path / "dir", "laptop", *options)


async def denied(asking: Awaitable[object]) -> str:
    """The message of the ``DENIED`` error that ``asking`` (an operation the user was asked
    about, or a policy decided) ends in."""
    with pytest.raises(QuillError) as info:
        await asking
    assert info.value.code == ErrorCode.DENIED, info.value
    return info.value.message


async def test_a_write_waits_for_the_user_who_allows_or_denies_it(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "todo.md").write_text("- ship\n")
    bridge = await attach(tmp_path / "dir", "laptop")
    ws = client.workspace("acme/laptop")

    assert await ws.read_text("todo.md") == "- ship\n"  # never asked: answered at once
    writing = asyncio.create_task(ws.write("notes/a.txt", "hi\n"))
    prompt = await bridge.prompt()
    assert "tester wants to write notes/a.txt (3 bytes)" in prompt
    assert not writing.done() and not (tmp_path / "dir" / "notes").exists()
    await bridge.answer("y")
    written = await writing
    assert written.created and (tmp_path / "dir" / "notes" / "a.txt").read_text() == "hi\n"
    assert await bridge.line() == "[quill] #1 allowed"

    editing = asyncio.create_task(ws.edit("todo.md", "ship", "sink"))
    assert "tester wants to edit todo.md" in await bridge.prompt()
    await bridge.answer("n")
    assert "denied this: edit todo.md" in await denied(editing)
    assert (tmp_path / "dir" / "todo.md").read_text() == "- ship\n"
    assert await bridge.line() == "[quill] #2 denied"

    # A refused command is answered without asking anybody.
    with pytest.raises(QuillError) as info:
        await ws.edit("todo.md", "absent", "x")
    assert info.value.message.startswith("oldString not found in content")
    assert (await ws.read("todo.md")).content == "- ship\n"  # and reads still are not asked


async def test_an_unanswered_question_is_a_no(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    bridge = await laptop(attach, tmp_path, "--ask-timeout", "1")
    ws = client.workspace("acme/laptop")
    deleting = asyncio.create_task(ws.mkdir("made"))
    assert "wants to create the directory made" in await bridge.prompt()
    assert (await denied(deleting)).startswith("No answer from the user of laptop:")
    assert await bridge.line() == "[quill] #1 denied (no answer)"
    assert not (tmp_path / "dir" / "made").exists()


async def test_a_retried_command_is_asked_about_once(
    servers: None, attach: Attach, nc: NATS, tmp_path: Path
) -> None:
    bridge = await laptop(attach, tmp_path)
    subject = "ws.cmd.acme.laptop.write"
    body = json.dumps({"path": "once.txt", "content": "1", "mode": "append"}).encode()
    headers = {"Ws-Request-Id": "req-1", "Ws-Actor": "agent-7"}
    with pytest.raises(nats.errors.TimeoutError):  # the user has not answered yet
        await nc.request(subject, body, timeout=0.5, headers=headers)
    retry = asyncio.create_task(nc.request(subject, body, timeout=20, headers=headers))
    assert "agent-7 wants to append to once.txt (1 bytes)" in await bridge.prompt()
    await bridge.answer("y")
    first = json.loads((await retry).data)
    assert first["ok"] and first["result"]["size"] == 1
    again = await nc.request(subject, body, timeout=5, headers=headers)  # done: replayed
    assert json.loads(again.data) == first
    assert (tmp_path / "dir" / "once.txt").read_text() == "1"  # appended once
    other = asyncio.create_task(
        nc.request(subject, body, timeout=20, headers={"Ws-Request-Id": "req-2"})
    )
    assert (await bridge.prompt()).startswith("[quill] #2 ")  # no question in between
    await bridge.answer("n")
    assert json.loads((await other).data)["error"]["code"] == "DENIED"


async def test_a_policy_file_decides_without_asking(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        """
[[rule]]
decision = "allow"
ops = ["write", "edit"]
paths = ["notes/**"]

[[rule]]
decision = "deny"
ops = ["delete"]

[[rule]]
decision = "allow"
ops = ["run"]
commands = ['echo [a-z]+']
"""
    )
    bridge = await laptop(attach, tmp_path, "--policy", str(policy))
    ws = client.workspace("acme/laptop")
    await ws.write("notes/a.md", "allowed\n")  # no question: it would wait for an answer
    assert "allowed by policy: tester: write notes/a.md" in await bridge.line()
    assert "policy" in await denied(ws.delete("notes/a.md"))
    assert (tmp_path / "dir" / "notes" / "a.md").read_text() == "allowed\n"
    ran = await ws.exec("echo fine")
    assert ran.stdout == "fine\n"

    writing = asyncio.create_task(ws.write("elsewhere.txt", "x"))  # no rule: asked
    assert "wants to write elsewhere.txt" in await bridge.prompt()
    await bridge.answer("no")
    await denied(writing)
    assert not (tmp_path / "dir" / "elsewhere.txt").exists()


async def test_a_question_cannot_disguise_itself(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    bridge = await laptop(attach, tmp_path)
    ws = client.as_actor("evil\x1b[2K").workspace("acme/laptop")
    running = asyncio.create_task(ws.exec("true\r\x1b[2Kls # harmless"))
    prompt = await bridge.prompt()
    assert "\x1b" not in prompt and "\r" not in prompt
    assert "evil\\x1b[2K wants to run in .: $ true\\r\\x1b[2Kls # harmless" in prompt
    await bridge.answer("n")
    with pytest.raises(QuillError):
        await running
