"""The tests of the pure floors (``contracts``, ``core``) need nothing below them: importing
them loads no NATS client, no SQLite, no infrastructure, no service, so they run anywhere in
about a second (``python -m pytest tests/core``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SERVER_SIDE = ("nats", "aiosqlite", "sqlite3", "infra", "services", "quill", "quill_cli")


def test_the_pure_tests_load_nothing_of_the_server() -> None:
    modules = sorted(f"tests.core.{p.stem}" for p in HERE.glob("*.py") if p.stem != "__init__")
    assert "tests.core.test_decide" in modules
    probe = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"roots = {SERVER_SIDE!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in roots)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
