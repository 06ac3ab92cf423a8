"""Secret redaction (RFC 0059 WSR-1): a registered value never reaches the log, a command's
output or an audit record; it becomes ``[REDACTED:<id>]``, and audit records name the id."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from contracts.subjects import STREAM_AUDIT, STREAM_EVENTS
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.helpers import start_executor, start_reader, start_writer

SECRET = "sk-live-0123456789abcdef"
AWS = "AKIAABCDEFGHIJKLMNOP"


async def messages(nc: NATS, stream: str) -> list[bytes]:
    """The payload of every message in ``stream``."""
    js = nc.jetstream()
    last = (await js.stream_info(stream)).state.last_seq
    return [(await js.get_msg(stream, seq)).data or b"" for seq in range(1, last + 1)]


async def test_secrets_never_reach_the_log(
    nats_url: str, nc: NATS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = tmp_path / "secrets.toml"
    registry.write_text(
        f'[secrets]\nopenai = "{SECRET}"\ntiny = "abc"\n\n'
        '[[patterns]]\nid = "aws-key"\nregex = "AKIA[0-9A-Z]{16}"\n'
    )
    monkeypatch.setenv("QUILL_SECRETS", str(registry))
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "writer")
        await start_reader(stack, nats_url, tmp_path / "reader")
        await start_executor(stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        quill = await Quill.connect(nats_url, actor="agent-7")
        stack.push_async_callback(quill.close)
        ws = quill.workspace("acme/vault")
        await ws.create()

        await ws.write(".env", f"OPENAI_KEY={SECRET}\nAWS={AWS}\nabc stays\n")
        assert await ws.read_text(".env") == (
            "OPENAI_KEY=[REDACTED:openai]\nAWS=[REDACTED:aws-key]\nabc stays\n"
        )
        await ws.write("notes.md", "nothing secret\n")
        await ws.edit("notes.md", "nothing", f"the key {SECRET}")
        assert await ws.read_text("notes.md") == "the key [REDACTED:openai] secret\n"

        ran = await ws.exec("echo $KEY; echo $KEY > leak.txt; echo $KEY >&2", env={"KEY": SECRET})
        assert ran.stdout == "[REDACTED:openai]\n" and ran.stderr == "[REDACTED:openai]\n"
        assert await ws.read_text("leak.txt") == "[REDACTED:openai]\n"

        audit = await messages(nc, STREAM_AUDIT)
        details = [json.loads(raw).get("details") or {} for raw in audit]
        redacted = [d["redacted"] for d in details if "redacted" in d]
        assert ["aws-key", "openai"] in redacted and ["openai"] in redacted
        for raw in [*await messages(nc, STREAM_EVENTS), *audit]:
            assert SECRET.encode() not in raw and AWS.encode() not in raw
