"""Issue 17, bounded memory: what a gateway process keeps per workspace and per MCP session
(workspaces it created, their limits, sessions) stays within its budget however many a
client names, and what was forgotten is opened again when next used."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway import access as access_module
from services.gateway import server as server_module
from services.gateway.access import Access
from services.gateway.mcp import sessions as mcp_sessions
from services.gateway.rest import files as rest_files
from tests.gateway.conftest import StartGateway
from tests.gateway.support import mcp_client, ok


async def test_workspaces_and_sessions_a_gateway_keeps_are_bounded(
    start: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module, name in (
        (access_module, "GATEWAY_WORKSPACES"),
        (rest_files, "GATEWAY_WORKSPACES"),
        (mcp_sessions, "GATEWAY_SESSIONS"),
    ):
        monkeypatch.setattr(module, name, 2, raising=False)
    made: list[Any] = []

    class Recorded(Access):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    class RecordedSessions(mcp_sessions.Sessions):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(server_module, "Access", Recorded)
    monkeypatch.setattr(mcp_sessions, "Sessions", RecordedSessions)
    gateway = await start()
    access = next(m for m in made if isinstance(m, Access))
    sessions = [m for m in made if isinstance(m, mcp_sessions.Sessions)]
    names = [f"named-{i}" for i in range(5)]
    async with mcp_client(gateway.url) as mcp:
        for name in names:
            await ok(mcp, "write_file", path="a.md", content=f"{name}\n", workspace=name)
            await ok(mcp, "list_workspaces", workspace=name)  # that session's workspaces
        assert len(access._ready) <= 2
        assert sessions and all(len(s._open) <= 2 for s in sessions)
        # forgotten: created again (exist_ok, its files kept) and its session opened again
        assert await ok(mcp, "read_file", path="a.md", workspace=names[0]) == f"{names[0]}\n"
        listing = await ok(mcp, "list_workspaces", workspace=names[0])
        assert listing.startswith(f"Primary workspace: server:/default/{names[0]}")
    assert len(access._ready) <= 2 and all(len(s._open) <= 2 for s in sessions)
