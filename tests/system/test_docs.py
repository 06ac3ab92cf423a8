"""Every example in README.md and docs/ runs, and gives what the documents say."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from quill_cli import docgen
from quill_cli.examples import mask, run_examples, with_stack
from tests.up import Up

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_generated_documents_are_current() -> None:
    stale = [p for p, content in docgen.generated().items() if p.read_text() != content]
    assert not stale, f"run python -m quill_cli.docgen: {stale}"


async def test_contract_examples_give_the_documented_replies() -> None:
    documented = json.loads((ROOT / "docs" / "examples.json").read_text())
    actual = await with_stack(run_examples)
    assert mask(actual) == mask(documented)


def test_readme_tour(up: Up) -> None:
    env = {**os.environ, "QUILL_NATS_URL": up.nats_url}
    quill = f"{sys.executable} -m quill"

    def run(command: str) -> str:
        done = subprocess.run(
            ["bash", "-c", command.replace(".venv/bin/quill", quill)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (command, done.stderr)
        return done.stdout

    tour = next(b for b in blocks(README, "bash") if "quill create" in b)
    for line in tour.strip().splitlines():
        run(line)
    assert run(f"{quill} cat acme/demo notes/done.md") == "# TODO\n- ship quill\n- write docs\n"

    tools = next(b for b in blocks(README, "bash") if "quill edit" in b)
    out = {line.split()[1]: run(line) for line in tools.strip().splitlines()}
    assert "notes/done.md:2:- ship quill 1.0" in out["grep"]
    assert out["glob"] == "notes/done.md\n" and out["tree"] == "notes/\n  done.md\n"
    assert "-- ship quill\n+- ship quill 1.0" in out["diff"]
    assert out["restore"].startswith("restored notes/done.md from version 4")
    assert run(f"{quill} cat acme/demo notes/done.md") == "# TODO\n- ship quill\n- write docs\n"

    shell = next(b for b in blocks(README, "bash") if "quill exec" in b)
    outputs = [run(line) for line in shell.strip().splitlines()]
    assert outputs[0].endswith("notes/done.md\n2\n") or "done.md" in outputs[0]
    assert outputs[3].split()[3:] == ["alice", "start"]

    curl = next(b for b in blocks(README, "bash") if "curl" in b)
    answer = json.loads(run(curl.replace("http://127.0.0.1:8080", up.http_url)))
    assert answer["result"]["isError"] is False
    assert answer["result"]["content"][0]["text"] == "Contents of notes:\n\n[FILE] done.md"


def test_readme_sdk_example(up: Up) -> None:
    code = next(b for b in blocks(README, "python") if "Quill.connect" in b)
    env = {**os.environ, "QUILL_NATS_URL": up.nats_url}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "1. read",
        "2. think",
        "3. write",
        "1. read",
        "2. think",
        "CONFLICT current etag: v2",
    ]
