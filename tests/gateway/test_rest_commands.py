"""REST commands (``/v1/host/workspace/commands``) with httpx against a real gateway and
executor: a command that yields runs on under its id; its output is followed with the cursor
to its exit code; input answers its ``read``; a signal stops it; the list names it while it
runs; bad input is a 400 naming the problem, an unknown id a bare 404."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from services.executor.app import ExecutorConfig
from services.gateway.rest.commands import COMMANDS
from services.gateway.rest.openapi import document
from services.gateway.server import Gateway
from tests.helpers import start_executor


@pytest_asyncio.fixture
async def executor(gateway: Gateway, nats_url: str, tmp_path: Path) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield


async def follow(http: httpx.AsyncClient, command_id: str, cursor: str) -> tuple[str, Any]:
    """GET its output after each cursor until it has ended: (all output, last answer)."""
    out = ""
    for _ in range(30):
        reply = await http.get(
            f"{COMMANDS}/{command_id}/output", params={"cursor": cursor, "waitMs": 5000}
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        out += body["stdout"]
        cursor = body["cursor"]
        if not body["running"] and not body["more"]:
            return out, body
    raise AssertionError("never ended")


async def test_a_command_runs_on_and_is_driven_by_its_id(
    http: httpx.AsyncClient, executor: None
) -> None:
    line = 'echo ready; read name; echo "hi $name" > hi.txt; cat hi.txt; exit 3'
    started = await http.post(COMMANDS, json={"command": line, "yieldMs": 800})
    assert started.status_code == 200, started.text
    body = started.json()
    assert body["running"] and body["stdout"] == "ready\n" and "exitCode" not in body
    command_id = body["commandId"]
    assert started.headers["Location"] == f"{COMMANDS}/{command_id}/output"
    listed = (await http.get(COMMANDS, params={"running": "1"})).json()["commands"]
    assert [(c["commandId"], c["command"], c["stdinOpen"]) for c in listed] == [
        (command_id, line, True)
    ]
    wrote = await http.post(f"{COMMANDS}/{command_id}/input", json={"data": "Ada\n", "eof": True})
    assert wrote.json() == {"commandId": command_id, "written": 4, "closed": True}
    out, last = await follow(http, command_id, body["cursor"])
    assert out == "hi Ada\n"
    assert (last["exitCode"], last["changed"], last["commitError"]) == (3, 1, None)
    assert last["version"] >= 2
    assert (await http.get("/v1/host/workspace/files/hi.txt")).json()["content"] == "hi Ada\n"
    assert (await http.get(COMMANDS)).json() == {"commands": []}
    again = await http.post(f"{COMMANDS}/{command_id}/signal", json={"signal": "TERM"})
    assert (again.status_code, again.json()["error"]) == (409, "command_ended")


async def test_a_signal_stops_it_and_a_short_command_answers_whole(
    http: httpx.AsyncClient, executor: None
) -> None:
    command = {"command": "echo armed; exec sleep 60", "yieldMs": 300}
    started = (await http.post(COMMANDS, json=command)).json()
    out, cursor = started["stdout"], started["cursor"]
    while "armed" not in out:  # its process runs: the signal has something to stop
        reply = await http.get(
            f"{COMMANDS}/{started['commandId']}/output", params={"cursor": cursor, "waitMs": 5000}
        )
        out, cursor = out + reply.json()["stdout"], reply.json()["cursor"]
    sent = await http.post(f"{COMMANDS}/{started['commandId']}/signal", json={"signal": "INT"})
    assert sent.status_code == 200 and sent.json()["signal"] == "INT"
    _, last = await follow(http, started["commandId"], cursor)
    assert last["exitCode"] == 130
    whole = (await http.post(COMMANDS, json={"command": "echo hi"})).json()
    assert (whole["running"], whole["exitCode"], whole["stdout"]) == (False, 0, "hi\n")


async def test_bad_requests_say_why_and_unknown_ids_say_nothing(
    http: httpx.AsyncClient, executor: None
) -> None:
    for bad in (
        {},
        {"command": ""},
        {"command": "true", "yieldMs": 60_001},
        {"command": "true", "yieldMs": -1},
        {"command": "true", "shell": "x"},
        {"command": "true", "env": {"A": 1}},
    ):
        reply = await http.post(COMMANDS, json=bad)
        assert (reply.status_code, reply.json()["error"]) == (400, "invalid_argument"), bad
    made_up = "c0123456789abMadeUp"
    for method, path, payload in (
        ("GET", f"{COMMANDS}/{made_up}/output", None),
        ("GET", f"{COMMANDS}/not-a-handle/output", None),
        ("POST", f"{COMMANDS}/{made_up}/input", {"data": "x"}),
        ("POST", f"{COMMANDS}/{made_up}/signal", {"signal": "KILL"}),
    ):
        reply = await http.request(method, path, json=payload)
        assert (reply.status_code, reply.json()) == (404, {"error": "not_found"}), path
    for params in ({"cursor": "x"}, {"waitMs": "60001"}, {"maxBytes": "0"}):
        reply = await http.get(f"{COMMANDS}/{made_up}/output", params=params)
        assert reply.status_code == 400, params
    bad_signal = await http.post(f"{COMMANDS}/{made_up}/signal", json={"signal": "STOP"})
    assert bad_signal.status_code == 400


def test_the_openapi_document_describes_the_commands() -> None:
    paths = document()["paths"]
    assert set(paths[COMMANDS]) == {"get", "post"}
    for tail in ("output", "input", "signal"):
        responses = next(iter(v for k, v in paths[f"{COMMANDS}/{{commandId}}/{tail}"].items()
                              if k in ("get", "post")))["responses"]  # fmt: skip
        assert {"200", "404", "409", "410"} <= set(responses), tail
