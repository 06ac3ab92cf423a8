"""A registered secret (``$QUILL_SECRETS``) never comes back from a command on a local
workspace: its result, its live output and its audit record are redacted as an executor's are
(one assembly of the result, ``infra/exec/results.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from nats.aio.client import Client as NATS

from contracts.subjects import STREAM_AUDIT
from quill.client import Quill
from tests.bridge.conftest import Attach
from tests.helpers import eventually

SECRET = "sk-live-0123456789abcdef"


async def test_a_command_on_a_folder_returns_no_registered_secret(
    servers: None,
    attach: Attach,
    client: Quill,
    nc: NATS,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = tmp_path / "secrets.toml"
    registry.write_text(f'[secrets]\nopenai = "{SECRET}"\n')
    monkeypatch.setenv("QUILL_SECRETS", str(registry))  # the bridge's process reads it
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / ".env").write_text(f"KEY={SECRET}\n")
    await attach(folder, "laptop", "--trust", "full")
    ws = client.workspace("acme/laptop")
    live: list[bytes] = []

    async def on_output(stream: str, chunk: bytes) -> None:
        live.append(chunk)

    # From a file, from the environment, and split in two writes to each stream.
    half = len(SECRET) // 2
    command = f"cat .env; echo $KEY >&2; printf %s {SECRET[:half]}; printf '%s\\n' {SECRET[half:]}"
    ran = await ws.exec(command, env={"KEY": SECRET}, on_output=on_output)
    assert ran.exit_code == 0
    assert ran.stdout == "KEY=[REDACTED:openai]\n[REDACTED:openai]\n"
    assert ran.stderr == "[REDACTED:openai]\n"
    assert SECRET.encode() not in b"".join(live)

    # The audit record names the secret's id (it is written just after the reply).
    record = await audited(nc, ran.command_id or "", "bridge")
    assert record["details"]["redacted"] == ["openai"]
    assert SECRET not in json.dumps(record)


async def audited(nc: NATS, request_id: str, service: str) -> dict[str, Any]:
    """The audit record of ``exec.run`` ``request_id`` by ``service``, once it is written."""
    js = nc.jetstream()
    seen = 0

    async def found() -> dict[str, Any] | None:
        nonlocal seen
        last = (await js.stream_info(STREAM_AUDIT)).state.last_seq
        for seq in range(seen + 1, last + 1):
            record = json.loads((await js.get_msg(STREAM_AUDIT, seq)).data or b"{}")
            if (record.get("kind"), record.get("op"), record.get("service")) == (
                "exec",
                "run",
                service,
            ) and (not request_id or record.get("request_id") == request_id):
                return cast(dict[str, Any], record)
        seen = last
        return None

    return await eventually(found, 20, f"the audit record of {request_id} by {service}")
