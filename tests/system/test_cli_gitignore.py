"""Tool caches stay out of history (issue 30: a test run committed 22 paths of
``.hypothesis/``): ``quill exec`` against ``quill up`` runs a Python command that leaves what
hypothesis leaves (``.hypothesis/`` with its own ``.gitignore`` of ``*``) and a project's
nested ``.gitignore`` with a negation; what git would ignore is not committed, the CLI says how
many paths were left out and why, the next command still finds them; ``quill create
--no-gitignore`` turns it off."""

from __future__ import annotations

import json

from tests.helpers import PUT_FILES
from tests.up import Up

TOOLS = (
    PUT_FILES
    + """put(".hypothesis/.gitignore", "# automatically created by hypothesis\\n*\\n")
for i in range(22):
    put(f".hypothesis/examples/{i:02x}{i:02x}/{i}", "example")
put(".gitignore", "*.pyc\\n")
put("app/__init__.py", "")
put("app/cache.pyc")
put("app/data/.gitignore", "*\\n!.gitignore\\n!seed.csv\\n")
put("app/data/seed.csv", "a,b\\n")
put("app/data/dump.csv", "big\\n")
"""
)


def test_exec_leaves_what_gitignore_files_ignore_out_of_history(up: Up) -> None:
    ws = "acme/tool-caches"
    up.cli("create", ws)
    ran = up.cli("exec", ws, "--", "python3", "-c", TOOLS)
    assert "quill: committed 4 paths as version 2" in ran.stderr
    assert "quill: left out 4 ignored paths (4 gitignored): " in ran.stderr
    listing = up.cli("ls", ws, "-R").stdout.split()
    assert ".hypothesis/" not in listing and "app/cache.pyc" not in " ".join(listing)
    tree = json.loads(up.cli("--json", "ls", ws, "app/data").stdout)
    assert sorted(e["path"] for e in tree["entries"]) == [
        "app/data/.gitignore",
        "app/data/seed.csv",
    ]
    again = up.cli("--json", "exec", ws, "--", "ls .hypothesis/examples | wc -l; cat app/cache.pyc")
    result = json.loads(again.stdout)
    assert result["stdout"] == "22\nx" and not result["changes"]["committed"]
    changes = json.loads(up.cli("--json", "exec", ws, "--", "echo y > app/other.pyc").stdout)
    assert changes["changes"]["ignored"] == ["app/other.pyc"]
    assert changes["changes"]["ignored_reasons"] == {"gitignored": 1}


def test_create_no_gitignore_commits_what_gitignore_files_ignore(up: Up) -> None:
    ws = "acme/no-gitignore"
    up.cli("create", ws, "--no-gitignore")
    assert json.loads(up.cli("--json", "info", ws).stdout)["limits"]["gitignore"] is False
    ran = up.cli("exec", ws, "--", "python3", "-c", TOOLS)
    assert "quill: committed 29 paths" in ran.stderr and "left out" not in ran.stderr
