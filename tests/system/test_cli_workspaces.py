"""``quill workspaces``, ``quill archive``/``unarchive`` and ``quill purge`` against
``quill up`` (real processes: nats-server, writer, reader, executor, gateway)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.up import Up


def test_workspaces_lists_aligned_columns_and_json(up: Up) -> None:
    for name in ("cli-list/alpha", "cli-list/beta-longer-name"):
        up.cli("create", name)
    up.cli("put", "cli-list/alpha", "a.txt", "-", input="hello\n")
    up.cli("archive", "cli-list/beta-longer-name", "--reason", "old")
    up.cli("stat", "cli-list/beta-longer-name", ".")  # the one replica has the archive
    text = up.cli("workspaces", "cli-list").stdout.splitlines()
    assert text[0].split() == ["NAME", "VERSION", "FILES", "SIZE", "UPDATED", "BY", "TRUST",
                               "LOCKED", "BY", "STATE"]  # fmt: skip
    assert [line.split()[0] for line in text[1:]] == ["alpha", "beta-longer-name"]
    assert text[1].index("cli") == text[2].index("cli")  # the columns line up
    assert text[2].split()[-1] == "archived" and text[1].split()[-1] == "active"
    listing = json.loads(up.cli("--json", "workspaces", "cli-list", "--limit", "1").stdout)
    assert [w["workspace"] for w in listing["workspaces"]] == ["alpha"]
    assert listing["next"] == "alpha"
    every = json.loads(up.cli("--json", "workspaces", "cli-list", "--limit", "1", "--all").stdout)
    assert [w["workspace"] for w in every["workspaces"]] == ["alpha", "beta-longer-name"]
    refused = up.cli("put", "cli-list/beta-longer-name", "b.txt", "-", input="b\n", check=False)
    assert refused.returncode != 0 and "WORKSPACE_ARCHIVED" in refused.stderr
    assert up.cli("unarchive", "cli-list/beta-longer-name").stdout.strip() == (
        "unarchived cli-list/beta-longer-name"
    )
    assert "no workspaces in tenant nobody" in up.cli("workspaces", "nobody").stdout


def test_purge_needs_yes_exports_first_and_leaves_a_fresh_name(up: Up, tmp_path: Path) -> None:
    ws = "cli-purge/doomed"
    up.cli("create", ws)
    up.cli("put", ws, "notes.md", "-", input="keep me\n")
    refused = up.cli("purge", ws, check=False)
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert up.cli("cat", ws, "notes.md").stdout == "keep me\n"  # nothing purged
    saved = tmp_path / "doomed.jsonl.gz"
    done = up.cli("purge", ws, "--export", str(saved), "--yes", "-q")
    assert "purged cli-purge/doomed" in done.stdout
    lines = gzip.decompress(saved.read_bytes()).decode().splitlines()
    assert any("keep me" in line for line in lines)  # the export holds the content
    gone = up.cli("cat", ws, "notes.md", check=False)
    assert gone.returncode != 0 and "WORKSPACE_NOT_FOUND" in gone.stderr
    up.cli("import", str(saved), "cli-purge/restored", "-q")  # the export brings it back
    assert up.cli("cat", "cli-purge/restored", "notes.md").stdout == "keep me\n"
    up.cli("create", ws)  # the name is free again: a new workspace, version 1
    assert json.loads(up.cli("--json", "info", ws).stdout)["version"] == 1
