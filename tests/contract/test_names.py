"""One name rule at every front door (issue 11, "Names and Unicode"): a path holding a control
character, a bidi or zero-width character, or not in NFC, and a file path ending with ``/``,
get the same ``INVALID_ARGUMENT`` (naming the character by code point) from bare nats-py, MCP,
REST and the CLI, and nothing is written; a decomposed name never overwrites the composed one.
Against the suite's real ``quill up``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from tests.gateway.support import call, mcp_client, text
from tests.up import Up

NFC = "caf\u00e9.txt"
NFD = "cafe\u0301.txt"
BAD = [
    # (name, what the message must say)
    ("new\nline.txt", "U+000A is a control character"),
    ("esc\x1b[2J.txt", "U+001B is a control character"),
    ("evil\u202etxt.md", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("iso\u2067late.md", "U+2067 RIGHT-TO-LEFT ISOLATE"),
    ("zero\u200bwidth.md", "U+200B ZERO WIDTH SPACE"),
    ("bom\ufeff.md", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
    ("d\u200d/in.txt", "U+200D ZERO WIDTH JOINER"),
    (NFD, "not in Unicode NFC (U+0301 COMBINING ACUTE ACCENT"),
]
FILES = "/v1/host/workspace/files"


@pytest_asyncio.fixture
async def nc(up: Up) -> AsyncIterator[NATS]:
    client = await nats.connect(up.nats_url)
    yield client
    await client.close()


async def bus(nc: NATS, kind: str, ws: str, op: str, body: dict[str, Any]) -> dict[str, Any]:
    """One request as a bare client sends it: JSON, no headers."""
    msg = await nc.request(f"ws.{kind}.{ws}.{op}", json.dumps(body).encode(), timeout=10)
    return dict(json.loads(msg.data))


def refused(reply: dict[str, Any], says: str) -> None:
    assert not reply["ok"], reply
    error = reply["error"]
    assert error["code"] == "INVALID_ARGUMENT", error
    assert says in error["message"], error


async def fresh(nc: NATS, ws: str) -> None:
    created = await bus(nc, "cmd", ws, "create", {"exist_ok": True})
    assert created["ok"], created


async def paths(nc: NATS, ws: str, seen: int = 1) -> list[str]:
    """Every path in ``ws``, as of at least version ``seen`` (read-your-writes)."""
    body = {"path": "", "recursive": True, "min_version": seen}
    listed = await bus(nc, "qry", ws, "list", body)
    assert listed["ok"], listed
    return sorted(e["path"] for e in listed["result"]["entries"])


@pytest.mark.parametrize(("name", "says"), BAD)
async def test_the_bus_refuses_every_way_of_naming_a_bad_path(
    nc: NATS, name: str, says: str
) -> None:
    ws = "names.bus"
    await fresh(nc, ws)
    cmds: list[tuple[str, dict[str, Any]]] = [
        ("write", {"path": name, "content": "x"}),
        ("write", {"path": f"/workspace/sub/{name}", "content": "x"}),
        ("mkdir", {"path": name}),
        ("apply", {"base_version": 1, "changes": [{"type": "put", "path": name, "content": "x"}]}),
    ]
    for op, body in cmds:
        refused(await bus(nc, "cmd", ws, op, body), says)
    refused(await bus(nc, "qry", ws, "read", {"path": name}), says)
    assert await paths(nc, ws) == []


async def test_mcp_rest_and_cli_give_the_same_refusal(up: Up, nc: NATS) -> None:
    await fresh(nc, "host.workspace")
    async with (
        mcp_client(up.http_url) as mcp,
        httpx.AsyncClient(base_url=up.http_url) as http,
    ):
        for name, says in BAD:
            result = await call(mcp, "write_file", path=name, content="x")
            assert result.is_error and says in text(result), text(result)
            for method in ("PUT", "GET"):
                body = b'{"content": "x"}' if method == "PUT" else None
                reply = await http.request(method, f"{FILES}/{quote(name)}", content=body)
                assert reply.status_code == 400, (method, name, reply.text)
                assert reply.json()["error"] == "invalid_argument"
                assert says in reply.json()["message"], reply.json()
    env = {**os.environ, "QUILL_NATS_URL": up.nats_url}
    for name, says in BAD:
        done = subprocess.run(
            [sys.executable, "-m", "quill", "put", "host/workspace", name, "--text", "x"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode != 0 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert [p for p in await paths(nc, "host.workspace") if "x" in p] == []


async def test_bytes_that_are_not_utf8_are_refused_not_crashed_on(up: Up, nc: NATS) -> None:
    """A name with a byte that is not UTF-8 (as a shell passes it to the CLI) and a JSON path
    with a lone surrogate escape: INVALID_ARGUMENT, never a traceback or INTERNAL."""
    env = {**os.environ, "QUILL_NATS_URL": up.nats_url}
    done = subprocess.run(
        [sys.executable.encode(), b"-m", b"quill", b"put", b"host/workspace", b"bad\xff.txt"]
        + [b"--text", b"x"],
        capture_output=True,
        env=env,
        timeout=60,
    )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode != 0 and "not valid UTF-8 (byte 0xFF)" in stderr, stderr
    assert "Traceback" not in stderr
    ws = "names.surrogate"
    await fresh(nc, ws)
    raw = b'{"path": "lone\\udc80.txt", "content": "x"}'
    msg = await nc.request(f"ws.cmd.{ws}.write", raw, timeout=10)
    reply = json.loads(msg.data)
    assert not reply["ok"] and reply["error"]["code"] == "INVALID_ARGUMENT", reply


async def test_a_file_path_ending_with_a_slash_is_not_a_file(up: Up, nc: NATS) -> None:
    ws = "names.slash"
    await fresh(nc, ws)
    for op, body in [
        ("write", {"path": "dir/", "content": "x"}),
        ("write", {"path": "a/dir/.", "content": "x"}),
        ("edit", {"path": "dir/", "old_string": "a", "new_string": "b"}),
        ("apply", {"base_version": 1, "changes": [{"type": "put", "path": "dir/", "content": ""}]}),
    ]:
        refused(await bus(nc, "cmd", ws, op, body), "names a directory")
    assert await paths(nc, ws) == []
    written = await bus(nc, "cmd", ws, "write", {"path": "f.txt", "content": "x"})
    assert written["ok"]
    refused(await bus(nc, "cmd", ws, "move", {"path": "f.txt", "to": "d/"}), "names a directory")
    made = await bus(nc, "cmd", ws, "mkdir", {"path": "d/"})  # a directory may end with /
    assert made["ok"] and made["result"]["created"] == ["d"], made
    assert await paths(nc, ws, made["version"]) == ["d", "f.txt"]
    async with mcp_client(up.http_url) as mcp:
        result = await call(mcp, "write_file", path="mcpdir/", content="x")
        assert result.is_error and "names a directory" in text(result), text(result)
    async with httpx.AsyncClient(base_url=up.http_url) as http:
        reply = await http.put(f"{FILES}/restdir/", content=b'{"content": "x"}')
        assert reply.status_code == 400 and reply.json()["error"] == "invalid_argument"
        listed = (await http.get(FILES)).json()["files"]
        assert not {"mcpdir", "restdir"} & {f["path"] for f in listed}


async def test_a_decomposed_name_never_overwrites_the_composed_one(nc: NATS) -> None:
    ws = "names.nfc"
    await fresh(nc, ws)
    written = await bus(nc, "cmd", ws, "write", {"path": NFC, "content": "composed"})
    assert written["ok"], written
    reply = await bus(nc, "cmd", ws, "write", {"path": NFD, "content": "decomposed"})
    refused(reply, f"write it as {NFC!r}")
    move = await bus(nc, "cmd", ws, "move", {"path": NFC, "to": NFD})
    refused(move, "not in Unicode NFC")
    read = await bus(nc, "qry", ws, "read", {"path": NFC, "min_version": written["version"]})
    assert read["ok"] and read["result"]["content"] == "composed", read
    assert await paths(nc, ws, written["version"]) == [NFC]
