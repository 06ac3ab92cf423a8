"""Every example in docs/gateway.md runs against a real gateway and prints what the page says."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path

from services.gateway.access import Tokens
from tests.gateway.conftest import StartGateway

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "gateway.md").read_text()
EXAMPLES = re.findall(r"```bash\n(curl .*?)```\s*```(json|text)\n(.*?)```", PAGE, re.S)
STAMPS = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z| UTC)")


def masked(text: str) -> str:
    return STAMPS.sub("<time>", text)


def test_the_tokens_example_is_a_valid_tokens_file(tmp_path: Path) -> None:
    example = re.search(r"```toml\n(.*?)```", PAGE, re.S)
    assert example is not None
    (tmp_path / "tokens.toml").write_text(example.group(1))
    tokens = Tokens.load(tmp_path / "tokens.toml")
    assert [p.name for p in tokens.principals()] == ["acme/agents", "acme/ci"]


async def test_every_curl_example_prints_what_the_page_shows(start: StartGateway) -> None:
    assert len(EXAMPLES) >= 12
    gateway = await start({"demo-token-123": "acme/agents"})
    env = {**os.environ, "QUILL_HTTP": gateway.url, "TOKEN": "demo-token-123"}
    for command, kind, shown in EXAMPLES:  # in page order: each builds on the ones before
        done = await asyncio.to_thread(
            subprocess.run, ["bash", "-c", command], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, (command, done.stderr)
        if kind == "json":
            assert json.loads(masked(done.stdout)) == json.loads(masked(shown)), command
        else:
            assert done.stdout == shown, command
