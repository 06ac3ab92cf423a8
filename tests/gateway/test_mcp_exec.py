"""Commands and git through the gateway: MCP ``execute_command`` (and ``bash``), ``git``, and
WAP's ``executeCommand``, with an executor on the bus."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from quill.client import Quill
from services.executor.app import ExecutorConfig
from services.gateway.server import Gateway
from tests.gateway.support import call, error, mcp_client, ok, wap
from tests.helpers import start_executor


async def test_commands_and_git_over_mcp(
    gateway: Gateway, sdk: Quill, nats_url: str, tmp_path: Path
) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("src/app.py", "print('hi')\n")
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        async with mcp_client(gateway.url) as mcp:
            text = await ok(mcp, "execute_command", command="python3 src/app.py; exit 2")
            assert text.startswith("Exit code: 2\n\n--- stdout ---\nhi")
            result = await call(mcp, "bash", command="echo made > out.txt", workdir="src")
            assert not result.is_error and result.structured_content is not None
            changes = result.structured_content["changes"]
            assert changes["committed"] and [p["path"] for p in changes["paths"]] == ["src/out.txt"]
            assert "Committed 1 changed path as version" in result.content[0].text  # type: ignore[union-attr]
            slow = await ok(mcp, "bash", command="echo early; sleep 30", timeout_ms=500)
            assert "Exit code: 143 (timed out)" in slow and "early" in slow
            assert await error(mcp, "bash", command="true", workdir="../etc") == (
                "Error: Access denied. Path must be within /workspace"
            )

            await ok(mcp, "bash", command="git init -q -b main")
            status = await ok(mcp, "git", action="status")
            assert status.startswith("On branch main") and "Untracked:" in status
            committed = await ok(mcp, "git", action="commit", message="first")
            assert committed.startswith("Committed ") and "on main" in committed
            log = await ok(mcp, "git", action="log")
            assert log.endswith(": first")
        async with mcp_client(gateway.url, "/mcp/wap") as mcp:
            failed, data = await wap(
                mcp, "executeCommand", command="cat app.py; echo $X >&2", workingDirectory="src",
                environment={"X": "y"},
            )  # fmt: skip
            assert not failed
            assert (data["stdout"], data["stderr"], data["exitCode"]) == ("print('hi')\n", "y\n", 0)
            assert data["isOutputTruncated"] is False and data["durationMs"] >= 0
    assert await ws.read_text("src/out.txt") == "made\n"
