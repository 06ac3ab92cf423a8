"""Commands that outlive the call, as a model drives them over MCP (the official client, a real
gateway and executor): ``execute_command`` yields with the command's id and how to go on,
``read_command_output`` with the cursor follows it to its exit code, ``write_stdin`` answers
its ``read``, ``send_signal`` stops it, ``list_commands`` lists it while it runs; and a client
that gave a progress token hears from a call while it waits."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio
from mcp import Client

from services.executor.app import ExecutorConfig
from services.gateway.mcp import engine
from services.gateway.server import Gateway
from tests.gateway.support import call, error, mcp_client, ok
from tests.helpers import start_executor

GO_ON = re.compile(r'command_id="(?P<id>c[0-9a-f]{12}\w+)" and cursor="(?P<cursor>[0-9.]*)"')
"""The call a still-running answer tells the model to make."""


@pytest_asyncio.fixture
async def executor(gateway: Gateway, nats_url: str, tmp_path: Path) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield


def going_on(text: str) -> tuple[str, str]:
    found = GO_ON.search(text)
    assert found, f"no way on in:\n{text}"
    return found["id"], found["cursor"]


async def follow(mcp: Client, command_id: str, cursor: str) -> tuple[str, str]:
    """Read on as each answer says until the command has ended: (all output, last answer)."""
    tools = {t.name: t for t in (await mcp.list_tools()).tools}
    schema = tools["read_command_output"].output_schema
    seen: list[str] = []
    for _ in range(30):
        result = await call(
            mcp, "read_command_output", command_id=command_id, cursor=cursor, wait_ms=5000
        )
        assert not result.is_error, result
        jsonschema.validate(result.structured_content, schema)
        text = result.content[0].text  # type: ignore[union-attr]
        seen.append(text)
        if "has ended" in text:
            return "\n".join(seen), text
        command_id, cursor = going_on(text)
    raise AssertionError(f"never ended:\n{seen}")


async def test_a_command_that_waits_for_input_yields_and_is_answered(
    gateway: Gateway, executor: None
) -> None:
    line = 'echo ready; read name; echo "hi $name"; exit 3'
    async with mcp_client(gateway.url) as mcp:
        first = await ok(mcp, "execute_command", command=line, yield_ms=1000)
        assert re.match(
            r"Command c[0-9a-f]{12}\w+ is still running \(1 s\)\. Output so far:", first
        )
        assert "--- stdout ---\nready" in first
        assert "write_stdin to type into it, send_signal to stop it." in first
        command_id, cursor = going_on(first)
        listed = await ok(mcp, "list_commands")
        assert f"{command_id}: started " in listed and line in listed and "stdin open" in listed
        wrote = await ok(mcp, "write_stdin", command_id=command_id, text="Ada\n")
        assert wrote.startswith(f"Wrote 4 bytes to the standard input of command {command_id}")
        everything, last = await follow(mcp, command_id, cursor)
        assert "hi Ada" in everything and "ready" not in everything  # after the cursor only
        assert last.startswith(f"Command {command_id} has ended. Exit code: 3")
        assert "It changed no files." in last
        assert await ok(mcp, "list_commands") == "No commands are running in this workspace."
        ended = await error(mcp, "write_stdin", command_id=command_id, text="more\n")
        assert ended.startswith(f"Error: Command {command_id} has ended: read_command_output")


async def test_a_long_command_is_stopped_with_a_signal_and_its_changes_commit(
    gateway: Gateway, executor: None
) -> None:
    async with mcp_client(gateway.url) as mcp:
        first = await ok(
            mcp, "execute_command", command="echo made > made.txt; echo armed; exec sleep 60",
            yield_ms=500,
        )  # fmt: skip
        command_id, cursor = going_on(first)
        seen = first
        while "armed" not in seen:  # its process runs: the signal has something to stop
            seen = await ok(
                mcp, "read_command_output", command_id=command_id, cursor=cursor, wait_ms=5000
            )
            command_id, cursor = going_on(seen)
        sent = await ok(mcp, "send_signal", command_id=command_id, signal="INT")
        assert sent.startswith(f"Sent INT to command {command_id} (")
        _, last = await follow(mcp, command_id, cursor)
        assert f"Command {command_id} has ended. Exit code: 130" in last  # 128 + SIGINT
        assert "Committed 1 changed path as version" in last
        assert (await gateway.quill.workspace("default/default").read("made.txt")).content == (
            "made\n"
        )
        unknown = await error(mcp, "send_signal", command_id="c0123456789abMadeUp")
        assert unknown.startswith("Error: No live command c0123456789abMadeUp in this workspace")


async def test_a_command_that_ends_within_yield_reads_as_before(
    gateway: Gateway, executor: None
) -> None:
    async with mcp_client(gateway.url) as mcp:
        assert (
            await ok(mcp, "execute_command", command="echo hi")
            == "Exit code: 0\n\n--- stdout ---\nhi"
        )


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_waiting_call_sends_progress_to_a_client_that_asked(
    gateway: Gateway, executor: None, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(engine, "PROGRESS_EVERY_S", 0.2)
    heard: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        heard.append((value, message))

    async with mcp_client(gateway.url, mode=mode) as mcp:
        arguments: dict[str, Any] = {"command": "echo started; sleep 60", "yield_ms": 1500}
        result = await mcp.call_tool("execute_command", arguments, progress_callback=progress)
        text = result.content[0].text  # type: ignore[union-attr]
        assert not result.is_error and "is still running" in text
        assert heard, "no progress while execute_command waited"
        assert all(m and m.startswith("execute_command: still waiting") for _, m in heard)
        assert [v for v, _ in heard] == sorted(v for v, _ in heard)  # it only grows
        command_id, cursor = going_on(text)
        heard.clear()
        waited = await mcp.call_tool(
            "read_command_output",
            {"command_id": command_id, "cursor": cursor, "wait_ms": 1500},
            progress_callback=progress,
        )
        assert "No new output yet" in waited.content[0].text  # type: ignore[union-attr]
        assert heard and all(m and m.startswith("read_command_output") for _, m in heard)
        heard.clear()
        quiet = await mcp.call_tool(  # no progress token: JSON, nothing heard
            "read_command_output", {"command_id": command_id, "cursor": cursor, "wait_ms": 600}
        )
        assert not quiet.is_error and not heard
        await ok(mcp, "send_signal", command_id=command_id, signal="KILL")
