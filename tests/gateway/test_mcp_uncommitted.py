"""A file a command made that Quill did not commit, as a model reads it over MCP (the official
client): ``execute_command`` lists it, and ``read_file``/``get_file_info``/``edit_file`` say it
is in the sandbox, not committed, and why; the tool descriptions say only committed files are
visible to the file tools. REST's GET says it too."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import httpx

from contracts.limits import LimitsPatch
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.gateway.conftest import StartGateway
from tests.gateway.support import call, mcp_client, model_view
from tests.helpers import need_bwrap, start_executor

WHY = "exists in the sandbox but was not committed"
TOKEN = "t-small"


async def test_the_model_is_told_why(start: StartGateway, nats_url: str, tmp_path: Path) -> None:
    need_bwrap()
    client = await Quill.connect(nats_url)
    try:  # before the gateway, which creates its principals' workspaces with default limits
        await client.workspace("acme/small").create(limits=LimitsPatch(max_file_bytes=4096))
    finally:
        await client.close()
    gateway = await start(tokens={TOKEN: "acme/small"})
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with AsyncExitStack() as stack:
        config = ExecutorConfig(sandbox="bwrap")
        await start_executor(stack, nats_url, tmp_path / "executor", config)
        http = await stack.enter_async_context(
            httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=30)
        )
        async with mcp_client(gateway.url, token=TOKEN) as mcp:
            tools = {t.name: t.description or "" for t in (await mcp.list_tools()).tools}
            assert "Only committed files are visible to the file tools" in tools["execute_command"]
            told = mcp.instructions or ""
            assert "The file tools see committed files only" in told  # said once to every tool

            made = await call(
                mcp, "execute_command", command="head -c 10000 /dev/zero > big.bin && ln -s x l"
            )
            view = model_view(made)
            assert "Not committed: big.bin (over max_file_bytes (9.8 KiB > 4 KiB))" in view
            assert "Not committed: l (symlink)" in view

            read = model_view(await call(mcp, "read_file", path="big.bin"))
            assert read == (
                f"Error: File not found: big.bin: it {WHY}: over max_file_bytes (9.8 KiB > 4 KiB)."
                " Only committed files are visible to the file tools; use execute_command to "
                "work with it there"
            )
            info = model_view(await call(mcp, "get_file_info", path="/workspace/big.bin"))
            assert info.startswith("Error: Path not found: /workspace/big.bin: it " + WHY)
            edit = model_view(
                await call(mcp, "edit_file", path="l", old_string="a", new_string="b")
            )
            assert edit.startswith(f"Error: File not found: l: it {WHY}: symlink.")
            assert "use execute_command" in edit

            got = await http.get("/v1/host/workspace/files/big.bin")
            assert got.status_code == 404 and WHY in got.json()["message"]

            await call(mcp, "execute_command", command="rm big.bin l")  # gone: plain again
            assert model_view(await call(mcp, "read_file", path="big.bin")) == (
                "Error: File not found: big.bin"
            )
            assert (await http.get("/v1/host/workspace/files/big.bin")).json() == {
                "error": "not_found"
            }
