"""The examples of docs/bridge.md run, and do what the document says."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

from services.bridge.policy import Policy, Request
from tests.bridge.conftest import Attach

DOC = (Path(__file__).resolve().parents[2] / "docs" / "bridge.md").read_text()


def block(lang: str, containing: str) -> str:
    return next(b for b in re.findall(rf"```{lang}\n(.*?)```", DOC, re.S) if containing in b)


def test_the_documented_policy_file_means_what_it_says() -> None:
    policy = Policy.parse(tomllib.loads(block("toml", "[[rule]]")))
    assert policy.decide(Request("write", ["notes/today.md"])) == "allow"
    assert policy.decide(Request("edit", ["docs/deep/README.md"])) == "allow"
    assert policy.decide(Request("write", ["src/main.py"])) == "ask"
    assert policy.decide(Request("move", ["notes/a.md", "notes/b.md"])) == "deny"
    assert policy.decide(Request("run", [], "pytest -q")) == "allow"
    assert policy.decide(Request("run", [], "pytest -q; rm -rf ~")) == "ask"


async def test_the_documented_commands_start_a_bridge(
    servers: None, attach: Attach, tmp_path: Path
) -> None:
    folder = tmp_path / "app"
    folder.mkdir()
    (tmp_path / "policy.toml").write_text(block("toml", "[[rule]]"))
    for line in block("bash", "quill attach").strip().splitlines():
        argv = shlex.split(line.split("#")[0])
        assert argv[:5] == ["quill", "attach", "~/dev/app", "--as", "app"]
        args = [str(tmp_path / a) if a == "policy.toml" else a for a in argv[5:]]
        # the line's options come after the fixture's: theirs win
        bridge = await attach(folder, "app", *args, tenant="default")
        name = "acme/app" if "acme" in args else "default/app"
        trust = "full" if "full" in args else "restricted"
        trust += " with a policy" if "--policy" in args else ""
        assert bridge.lines[-1] == f"quill attach ready {name} = laptop:{folder} (trust {trust})"
        assert await bridge.stop() == 0


async def test_the_documented_sdk_example_runs(
    servers: None, attach: Attach, nats_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "app"
    (folder / "src").mkdir(parents=True)
    (folder / "README.md").write_text("# App\n")
    (folder / "src" / "main.py").write_text("retries = 3\n")
    bridge = await attach(folder, "app", tenant="default")
    code = block("python", "Quill.connect")
    env = {**os.environ, "QUILL_NATS_URL": nats_url}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stdout=asyncio.subprocess.PIPE
    )
    assert "agent-7 wants to edit src/main.py" in await bridge.prompt()
    await bridge.answer("y")
    assert "agent-7 wants to run in .: $ grep -c retries src/main.py" in await bridge.prompt()
    await bridge.answer("y")
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    assert out.decode() == "# App\n1\n"
    assert (folder / "src" / "main.py").read_text() == "retries = 5\n"
