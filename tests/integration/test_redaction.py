"""Secret redaction (RFC 0059 WSR-1): a registered value never reaches the log, a command's
output or an audit record; it becomes ``[REDACTED:<id>]``, and audit records name the id."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import STREAM_AUDIT, STREAM_EVENTS
from quill.client import Quill, Workspace
from services.executor.app import ExecutorConfig
from tests.helpers import start_executor, start_writer_and_reader

SECRET = "sk-live-0123456789abcdef"
AWS = "AKIAABCDEFGHIJKLMNOP"


async def messages(nc: NATS, stream: str) -> list[bytes]:
    """The payload of every message in ``stream``."""
    js = nc.jetstream()
    last = (await js.stream_info(stream)).state.last_seq
    return [(await js.get_msg(stream, seq)).data or b"" for seq in range(1, last + 1)]


@asynccontextmanager
async def vault(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: str, name: str
) -> AsyncIterator[tuple[Quill, Workspace]]:
    """A writer, a reader and an executor (local provider) that know the secrets of
    ``registry`` (a secrets.toml's text), and workspace ``name`` created by ``agent-7``:
    ``(that client, the workspace)``, all stopped when the block ends."""
    path = tmp_path / "secrets.toml"
    path.write_text(registry)
    monkeypatch.setenv("QUILL_SECRETS", str(path))
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
        await start_executor(stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        quill = await Quill.connect(nats_url, actor="agent-7")
        stack.push_async_callback(quill.close)
        ws = quill.workspace(name)
        await ws.create()
        yield quill, ws


async def test_secrets_never_reach_the_log(
    nats_url: str, nc: NATS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = (
        f'[secrets]\nopenai = "{SECRET}"\ntiny = "abc"\n\n'
        '[[patterns]]\nid = "aws-key"\nregex = "AKIA[0-9A-Z]{16}"\n'
    )
    async with vault(nats_url, tmp_path, monkeypatch, registry, "acme/vault") as (_, ws):
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


async def test_names_holding_a_secret_are_refused_and_audited_redacted(
    nats_url: str, nc: NATS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10, item 6: a name holding a registered secret (a path, an actor, a session, a
    commit message) is refused with INVALID_ARGUMENT, by the writer, the reader and the
    executor alike; the refusal names the secret's id, never its value; the audit record of
    the refusal shows the actor redacted. A file a command names with it is not committed."""
    registry = f'[secrets]\nopenai = "{SECRET}"\n'
    async with vault(nats_url, tmp_path, monkeypatch, registry, "acme/names") as (quill, ws):
        refusals = [
            ws.write(f"keys/{SECRET}.txt", "x"),
            ws.mkdir(f"d-{SECRET}"),
            ws.read(SECRET),
            ws.git("commit", message=f"add {SECRET}"),
            quill.as_actor(f"bot-{SECRET}").workspace("acme/names").write("a.txt", "a"),
            quill.as_actor("bot", session=SECRET).workspace("acme/names").lock(),
        ]
        for refused in refusals:
            with pytest.raises(QuillError) as info:
                await refused
            assert info.value.code == ErrorCode.INVALID_ARGUMENT, info.value
            assert "openai" in info.value.message and SECRET not in info.value.message
        ran = await ws.exec('touch "$K.txt" kept.txt', env={"K": SECRET})
        assert ran.changes is not None
        assert [p.path for p in ran.changes.paths] == ["kept.txt"]
        assert [p.path for p in ran.changes.skipped] == ["[REDACTED:openai].txt"]

        audit = [json.loads(raw) for raw in await messages(nc, STREAM_AUDIT)]
        bots = [(r["actor"], r["error_code"]) for r in audit if "bot-" in (r["actor"] or "")]
        assert bots == [("bot-[REDACTED:openai]", "INVALID_ARGUMENT")]
        for raw in [*await messages(nc, STREAM_EVENTS), *await messages(nc, STREAM_AUDIT)]:
            assert SECRET.encode() not in raw
