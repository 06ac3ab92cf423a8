"""Long command output as a model reads it over MCP (the official client): ``execute_command``
shows the head and the tail, names what is left out and gives the exact ``read_command_output``
call, which a model can follow page by page to the end; and what the answer says about the
command's environment (background processes killed, a read of the closed stdin, python)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest_asyncio
from mcp import Client

from contracts import replies as rp
from services.executor.app import ExecutorConfig
from services.gateway.mcp import command_texts
from services.gateway.server import Gateway
from tests.gateway.support import assert_names_missing, call, mcp_client, model_view, wap
from tests.helpers import start_executor

LINES = 50_000
BUILD = (
    f'for i in $(seq 1 {LINES}); do echo "line $i of the build"; done; '
    "echo 'ERROR: test_parser failed' >&2; echo 'ERROR: it broke'; exit 1"
)
EXPECTED = "".join(f"line {i} of the build\n" for i in range(1, LINES + 1)) + "ERROR: it broke\n"
CALL = re.compile(
    r'read_command_output\(command_id="(?P<id>[^"]+)"(?:, stream="(?P<stream>\w+)")?, '
    r"offset=(?P<offset>\d+)\)"
)
"""The call a text tells the model to make."""


@pytest_asyncio.fixture
async def executor(gateway: Gateway, nats_url: str, tmp_path: Path) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield


async def view_of(mcp: Client, tool: str, **arguments: Any) -> str:
    result = await call(mcp, tool, **arguments)
    assert not result.is_error, model_view(result)
    return model_view(result)


def told_call(view: str) -> dict[str, Any]:
    """The arguments of the ``read_command_output`` call ``view`` tells the model to make."""
    found = CALL.search(view)
    assert found, f"no read_command_output call in:\n{view}"
    arguments: dict[str, Any] = {"command_id": found["id"], "offset": int(found["offset"])}
    if found["stream"]:
        arguments["stream"] = found["stream"]
    return arguments


async def test_a_long_build_log_shows_its_end_and_the_way_to_its_middle(
    gateway: Gateway, executor: None
) -> None:
    async with mcp_client(gateway.url) as mcp:
        await long_build_log(mcp)


async def long_build_log(mcp: Client) -> None:
    view = await view_of(mcp, "execute_command", command=BUILD)
    assert view.startswith("Exit code: 1\n\n--- stdout (")
    assert "line 1 of the build\n" in view  # the beginning
    assert "line 50000 of the build\nERROR: it broke" in view  # the end, where the error is
    assert "--- stderr ---\nERROR: test_parser failed" in view
    head = view.split("--- stdout", 1)[1].split("\n", 1)[1].split("[...", 1)[0]
    offset = len(head.encode())
    omitted = (
        len(EXPECTED) - offset - len(view.split("...]\n", 1)[1].split("\n\n--- stderr")[0]) - 1
    )
    arguments = told_call(view)
    assert_names_missing(
        view,
        f"{len(EXPECTED)} bytes",
        f"{omitted} bytes in the middle left out",
        f"bytes {offset}-{offset + omitted - 1} of stdout",
        way_on=f'read_command_output(command_id="{arguments["command_id"]}", offset={offset})',
    )
    # a model following what each page tells it reads the whole middle, then the end
    middle, pages = b"", 0
    while True:
        page = await view_of(mcp, "read_command_output", **arguments)
        pages += 1
        first, last = map(int, re.findall(r"bytes (\d+)-(\d+) ---", page)[0])
        assert first == arguments["offset"] == offset + len(middle)
        middle += page.split("\n", 1)[1].encode()[: last - first + 1]
        if "[end of the stdout" in page:
            break
        assert_names_missing(page, "more bytes", way_on="read_command_output(")
        arguments = told_call(page)
    assert pages > 10  # 64 KB pages
    assert middle.decode() == EXPECTED[offset:]


async def test_a_long_stderr_names_its_stream(gateway: Gateway, executor: None) -> None:
    async with mcp_client(gateway.url) as mcp:
        await long_stderr(mcp)


async def long_stderr(mcp: Client) -> None:
    view = await view_of(mcp, "bash", command="seq 1 20000 >&2")
    arguments = told_call(view)
    assert arguments["stream"] == "stderr"
    assert_names_missing(view, "of stderr", way_on='stream="stderr"')
    page = await view_of(mcp, "read_command_output", **arguments, length=6)
    offset = arguments["offset"]
    assert page.startswith(f"--- stderr of command {arguments['command_id']}, bytes {offset}-")
    assert f'read_command_output(command_id="{arguments["command_id"]}", stream="stderr", ' in page


async def test_an_unknown_command_says_so(gateway: Gateway, executor: None) -> None:
    async with mcp_client(gateway.url) as mcp:
        result = await call(mcp, "read_command_output", command_id="never-ran")
    assert result.is_error
    assert model_view(result).startswith("Error: No output kept for command never-ran")


async def test_the_environment_is_told(gateway: Gateway, executor: None) -> None:
    async with mcp_client(gateway.url) as mcp:
        await environment(mcp)


async def environment(mcp: Client) -> None:
    tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    description = tools["execute_command"].description or ""
    for fact in ("cd, export, functions and /tmp carry over", "a fresh shell", "yield_ms"):
        assert fact in description
    assert "python is python3" in description and "read_command_output" in description
    assert "write_stdin" in description  # a prompt waits for input (test_mcp_live_commands)
    left = await view_of(mcp, "execute_command", command="sleep 600 & echo serving")
    assert "Note: the command left 1 process running in the background, killed" in left
    quiet = await view_of(mcp, "execute_command", command="python -c 'print(6 * 7)'")
    assert quiet == "Exit code: 0\n\n--- stdout ---\n42", quiet  # no note when there is none


def test_a_stream_cut_without_a_kept_rest_says_so() -> None:
    """A local workspace's command (a bridge keeps no output): only the beginning, and the
    text says what is missing and what to do instead."""
    r = rp.CommandResult(
        exit_code=0,
        stdout="a" * 100,
        stderr="",
        stdout_truncated=True,
        stderr_truncated=False,
        stdout_bytes=5000,
        stderr_bytes=0,
        duration_ms=1,
        timed_out=False,
        changes=rp.CapturedChanges(
            base_version=1,
            committed=False,
            version=1,
            paths=[],
            total=0,
            conflicts=[],
            skipped=[],
            ignored=[],
        ),
    )
    view = command_texts.command_text(r)
    assert_names_missing(view, "the first 100 of 5000 bytes", way_on="cmd > out.log 2>&1")


async def test_wap_execute_command_keeps_the_end(gateway: Gateway, executor: None) -> None:
    async with mcp_client(gateway.url, "/mcp/wap") as mcp:
        failed, data = await wap(mcp, "executeCommand", command="seq 1 30000; echo FAILED")
    assert not failed and data["isOutputTruncated"]
    assert data["stdout"].startswith("1\n2\n") and data["stdout"].endswith("30000\nFAILED\n")
    assert re.search(r"\n\[\.\.\. \d+ bytes left out \.\.\.\]\n", data["stdout"])


async def test_what_gitignore_files_left_out_is_told(gateway: Gateway, executor: None) -> None:
    """A model learns how many paths its command left out of history, and why (issue 30)."""
    async with mcp_client(gateway.url) as mcp:
        text = await view_of(
            mcp,
            "execute_command",
            command="mkdir -p .hypothesis/examples && printf '*\\n' > .hypothesis/.gitignore"
            " && echo e > .hypothesis/examples/1 && echo k > kept.txt",
        )
    assert "Committed 1 changed path as version" in text and "kept.txt (created)" in text
    assert (
        "Ignored (kept out of the workspace's history): 2 paths (2 gitignored): "
        ".hypothesis/.gitignore, .hypothesis/examples"
    ) in text, text
