"""An edit that cannot be applied, on the bus: the error's ``details`` say where an ambiguous
oldString occurs and what text is closest to a missing one (SDK and a bare nats-py client);
nothing is committed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from quill.client import Quill
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader

TEXT = "[server]\nport = 8080\nhost = 'a'\n\n[client]\nport = 8080\nretries = 3\n"


async def bus_edit(nc: NATS, workspace: str, **body: Any) -> dict[str, Any]:
    """A bare ``edit`` on the bus: the reply as JSON."""
    msg = await nc.request(Subjects().cmd("acme", workspace, "edit"), json.dumps(body).encode(), 5)
    reply: dict[str, Any] = json.loads(msg.data)
    return reply


async def test_the_details_name_the_matches_and_the_closest(
    services: StartReader, quill: Quill, nc: NATS
) -> None:
    ws = await new_workspace(services, quill, "acme/edits")
    await ws.write("app.toml", TEXT)

    twice = await bus_edit(nc, "edits", path="app.toml", old_string="port = 8080", new_string="x")
    assert twice["ok"] is False
    error = twice["error"]
    assert error["code"] == "MULTIPLE_MATCHES"
    assert error["message"].startswith("Found multiple matches for oldString")
    assert error["details"] == {
        "path": "app.toml",
        "occurrences": 2,
        "matches": [{"line": 2, "excerpt": "port = 8080"}, {"line": 6, "excerpt": "port = 8080"}],
    }

    near = await bus_edit(nc, "edits", path="app.toml", old_string="retries = 5", new_string="x")
    error = near["error"]
    assert error["code"] == "NO_MATCH"
    assert error["message"].startswith("oldString not found in content. The closest text")
    assert error["details"] == {
        "path": "app.toml",
        "closest": {
            "line": 7,
            "end_line": 7,
            "text": "retries = 3",
            "difference": "differs: oldString has 'retries = 5' where the file has 'retries = 3'",
            "similarity": 0.909,
        },
    }

    with pytest.raises(QuillError) as info:  # the SDK gives the same details
        await ws.edit("app.toml", "[Client]\nport = 8080", "x")
    assert info.value.code == ErrorCode.NO_MATCH
    closest = info.value.details["closest"]
    assert (closest["line"], closest["end_line"], closest["text"]) == (
        5,
        6,
        "[client]\nport = 8080",
    )
    assert closest["difference"] == (
        "differs only in letter case: line 1 of oldString is '[Client]' where the file has "
        "'[client]'"
    )
    with pytest.raises(QuillError) as info:
        await ws.edit("app.toml", "nothing like it at all", "x")
    assert info.value.details == {"path": "app.toml", "closest": None}
    assert info.value.message.startswith("oldString not found in content. Nothing in app.toml")

    assert (await ws.info()).version == 2  # create, write: nothing committed since
    assert await ws.read_text("app.toml") == TEXT
