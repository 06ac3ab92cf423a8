"""REST shells (``/v1/host/workspace/shells``) with httpx against a real gateway and executor:
a shell keeps cwd, exports and background processes from one command to the next; what its
background processes change is committed at a checkpoint and when it closes; a command runs in
a terminal of the size asked and takes a new one; a shell of another workspace is a bare 404
like one that never was; a second command while one runs is 409 naming it, unless queued."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest_asyncio

from services.executor.app import ExecutorConfig
from services.gateway.rest.commands import COMMANDS
from services.gateway.rest.openapi import document
from services.gateway.rest.shells import SHELLS
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.test_rest_commands import follow
from tests.helpers import eventually, start_executor


@pytest_asyncio.fixture
async def executor(gateway: Gateway, nats_url: str, tmp_path: Path) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield


async def opened(http: httpx.AsyncClient, **body: object) -> str:
    reply = await http.post(SHELLS, json=body)
    assert reply.status_code == 201, reply.text
    shell_id: str = reply.json()["shellId"]
    assert reply.headers["Location"] == f"{SHELLS}/{shell_id}"
    return shell_id


async def test_a_shell_keeps_what_one_command_leaves_for_the_next(
    http: httpx.AsyncClient, executor: None
) -> None:
    shell = await opened(http, env={"GREETING": "hi"})
    first = await http.post(
        f"{SHELLS}/{shell}/commands",
        json={"command": "mkdir -p sub && cd sub && export X=1 && echo $GREETING > a.txt"},
    )
    assert first.status_code == 200, first.text
    assert (first.json()["exitCode"], first.json()["changed"]) == (0, 1)
    second = await http.post(f"{SHELLS}/{shell}/commands", json={"command": "pwd; echo $X"})
    assert second.json()["stdout"].splitlines()[-1] == "1"
    assert second.json()["stdout"].splitlines()[0].endswith("/sub")
    piped = await http.post(
        f"{SHELLS}/{shell}/commands", json={"command": "read n; echo got $n", "stdin": "Ada\n"}
    )
    assert piped.json()["stdout"] == "got Ada\n"
    background = await http.post(
        f"{SHELLS}/{shell}/commands",
        json={"command": "(sleep 0.1; echo late > late.txt; sleep 600) > /dev/null 2>&1 &"},
    )
    assert background.json()["exitCode"] == 0
    listed = (await http.get(SHELLS)).json()["shells"]
    assert [s["shellId"] for s in listed] == [shell]

    async def checkpointed() -> dict[str, object] | None:
        reply = await http.post(f"{SHELLS}/{shell}/checkpoint")
        assert reply.status_code == 200, reply.text
        body: dict[str, object] = reply.json()
        return body if body["changed"] else None  # the write may land after its command

    body = await eventually(checkpointed, what="the background write committed")
    assert (body["changed"], body["kept"], body["conflicts"]) == (1, [], [])
    late = await http.get("/v1/host/workspace/files/sub/late.txt")
    assert late.json()["content"] == "late\n"
    closed = await http.delete(f"{SHELLS}/{shell}")
    assert closed.status_code == 200, closed.text
    assert set(closed.json()) == {"shellId", "killed", "changed", "version", "conflicts"}
    gone = await http.post(f"{SHELLS}/{shell}/commands", json={"command": "true"})
    assert (gone.status_code, gone.json()) == (404, {"error": "not_found"})
    assert (await http.get(SHELLS)).json() == {"shells": []}


async def test_one_command_at_a_time_and_a_terminal_of_the_size_asked(
    http: httpx.AsyncClient, executor: None
) -> None:
    shell = await opened(http)
    started = await http.post(
        f"{SHELLS}/{shell}/commands", json={"command": "sleep 1; echo slept", "yieldMs": 100}
    )
    body = started.json()
    assert body["running"], body
    busy = await http.post(f"{SHELLS}/{shell}/commands", json={"command": "true"})
    assert busy.status_code == 409 and busy.json()["error"] == "busy"
    assert body["commandId"] in busy.json()["message"]
    queued = {"command": "echo after", "queue": True}
    after = await http.post(f"{SHELLS}/{shell}/commands", json=queued)
    assert after.json()["stdout"] == "after\n"
    out, last = await follow(http, body["commandId"], body["cursor"])
    assert (out, last["exitCode"]) == ("slept\n", 0)
    await http.delete(f"{SHELLS}/{shell}")
    in_terminal = await http.post(
        COMMANDS,
        json={"command": "stty size; read line; stty size", "yieldMs": 500,
              "pty": {"rows": 30, "cols": 100}},
    )  # fmt: skip
    body = in_terminal.json()
    assert body["running"], body
    command_id = body["commandId"]
    resized = await http.post(f"{COMMANDS}/{command_id}/resize", json={"rows": 40, "cols": 120})
    assert resized.json() == {"commandId": command_id, "rows": 40, "cols": 120}
    await http.post(f"{COMMANDS}/{command_id}/input", json={"data": "go\r"})
    out, last = await follow(http, command_id, body["cursor"])
    assert "30 100" in body["stdout"] + out and "40 120" in out
    assert last["exitCode"] == 0


async def test_bad_requests_say_why_and_foreign_shells_say_nothing(
    start: StartGateway, executor: None
) -> None:
    gateway = await start({"alice": "acme/one", "mallory": "acme/two"})
    alice = httpx.AsyncClient(base_url=gateway.url, headers={"Authorization": "Bearer alice"})
    mallory = httpx.AsyncClient(base_url=gateway.url, headers={"Authorization": "Bearer mallory"})
    async with alice, mallory:
        shell = await opened(alice)
        for method, path, payload in (
            ("POST", f"{SHELLS}/{shell}/commands", {"command": "echo stolen"}),
            ("POST", f"{SHELLS}/{shell}/checkpoint", None),
            ("DELETE", f"{SHELLS}/{shell}", None),
            ("POST", f"{SHELLS}/s0123456789abMadeUp/commands", {"command": "true"}),
            ("POST", f"{SHELLS}/not-a-shell/checkpoint", None),
        ):
            reply = await mallory.request(method, path, json=payload)
            assert (reply.status_code, reply.json()) == (404, {"error": "not_found"}), path
        assert (await mallory.get(SHELLS)).json() == {"shells": []}
        escape = await alice.post(SHELLS, json={"workdir": "../out"})
        assert (escape.status_code, escape.json()["error"]) == (403, "access_denied")
        for bad in (
            {"idleTimeoutMs": 10},
            {"env": {"A": 1}},
            {"shell": "x"},
        ):
            reply = await alice.post(SHELLS, json=bad)
            assert (reply.status_code, reply.json()["error"]) == (400, "invalid_argument"), bad
        for bad_run in (
            {},
            {"command": "true", "workdir": "sub"},  # a shell's cwd is its own
            {"command": "true", "pty": {"rows": 30, "cols": 80}, "yieldMs": 100},
            {"command": "true", "stdin": 5},
        ):
            reply = await alice.post(f"{SHELLS}/{shell}/commands", json=bad_run)
            assert reply.status_code == 400, (bad_run, reply.text)
        huge = await alice.post(
            f"{SHELLS}/{shell}/commands", json={"command": "cat", "stdin": "x" * (1 << 20 | 1)}
        )
        assert huge.status_code == 413, huge.text
        still = await alice.post(f"{SHELLS}/{shell}/commands", json={"command": "echo ok"})
        assert still.json()["stdout"] == "ok\n"
        await alice.delete(f"{SHELLS}/{shell}")


def test_the_openapi_document_describes_the_shells() -> None:
    paths = document()["paths"]
    assert set(paths[SHELLS]) == {"get", "post"}
    assert set(paths[f"{SHELLS}/{{shellId}}"]) == {"parameters", "delete"}
    for tail in ("commands", "checkpoint"):
        responses = paths[f"{SHELLS}/{{shellId}}/{tail}"]["post"]["responses"]
        assert {"200", "404", "409", "410"} <= set(responses), tail
    assert "post" in paths[f"{COMMANDS}/{{commandId}}/resize"]
