"""What a team met with the CLI in its first hour (issue 30), against ``quill up``: grep of
one file, a diff that says what it compared, append and restore that say what they did,
history of a commit with many paths, and piped input reaching ``quill exec``'s command."""

from __future__ import annotations

import json

from contracts.limits import EXEC_STDIN_MAX_BYTES
from tests.up import Up


def test_grep_takes_a_file(up: Up) -> None:
    ws = "acme/grep-file"
    up.cli("create", ws)
    up.cli("put", ws, "src/a.py", "--text", "needle = 1\nother\n")
    up.cli("put", ws, "src/b.py", "--text", "needle = 2\n")
    up.cli("put", ws, ".git/config", "--text", "needle in the default exclusions\n")
    assert up.cli("grep", ws, "needle", "src/a.py").stdout == "src/a.py:1:needle = 1\n"
    named = up.cli("grep", ws, "needle", ".git/config").stdout  # named: searched all the same
    assert named == ".git/config:1:needle in the default exclusions\n"
    assert up.cli("grep", ws, "needle", "src").stdout.splitlines() == [
        "src/a.py:1:needle = 1",
        "src/b.py:1:needle = 2",
    ]
    assert up.cli("grep", ws, "absent", "src/a.py", check=False).returncode == 1
    assert up.failure("grep", ws, "needle", "src/c.py") == (
        3,
        "quill: FILE_NOT_FOUND: Path not found: src/c.py\n",
    )


def test_diff_prints_from_version_to_the_latest_and_says_when_nothing_differs(up: Up) -> None:
    ws = "acme/diffed"
    up.cli("create", ws)
    up.cli("put", ws, "a.txt", "--text", "one\n")  # version 2
    up.cli("put", ws, "a.txt", "--text", "two\n")  # version 3
    up.cli("mkdir", ws, "empty")  # version 4: no file changed
    through = up.cli("diff", ws, "2")
    assert "-one\n+two" in through.stdout and through.stderr == ""
    latest = up.cli("diff", ws, "4")
    assert (latest.returncode, latest.stdout) == (0, "")
    assert latest.stderr == (
        "quill: no file differs from version 4 to version 4, the latest (what version 4 "
        f"changed: quill diff {ws} 3 4)\n"
    )
    between = up.cli("diff", ws, "3", "4", "--path", "a.txt")
    assert between.stderr == "quill: no file differs in a.txt from version 3 to version 4\n"


def test_append_says_the_new_size_and_restore_the_version_it_restored_from(up: Up) -> None:
    ws = "acme/appended"
    up.cli("create", ws)
    up.cli("put", ws, "log.txt", "--text", "first\n")
    out = up.cli("put", ws, "log.txt", "-", "--append", input="second\n").stdout
    assert out == "appended 7 bytes to log.txt: now 13 bytes, file version 2, workspace version 3\n"
    restored = up.cli("restore", ws, "2", "log.txt").stdout
    assert restored == "restored log.txt from version 2 (log.txt): now workspace version 4\n"
    again = up.cli("restore", ws, "2", "log.txt").stdout
    assert again == "unchanged: log.txt is already as at version 2\n"
    assert up.cli("cat", ws, "log.txt").stdout == "first\n"


def test_history_summarises_a_commit_with_many_paths(up: Up) -> None:
    ws = "acme/many-paths"
    up.cli("create", ws)
    up.cli("exec", ws, "--", "mkdir d && for i in $(seq 1 140); do echo $i > d/f$i; done")
    line = up.cli("history", ws).stdout.splitlines()[0]
    assert line.startswith("v2 ") and line.endswith("changes_committed d, d/f1, d/f10 and 138 more")
    page = json.loads(up.cli("--json", "history", ws).stdout)
    assert page["revisions"][0]["changes_total"] == 141
    log = up.cli("log", ws).stdout.splitlines()[1]
    assert log.endswith("mkdir d, put d/f1, put d/f10 and 138 more")


def test_exec_gives_the_command_what_is_piped_in(up: Up) -> None:
    ws = "acme/piped"
    up.cli("create", ws)
    assert up.cli("exec", ws, "--", "tr a-z A-Z", input="shout\n").stdout == "SHOUT\n"
    kept = up.cli("exec", ws, "--", "cat > in.txt", input="kept\n")
    assert "committed 1 path" in kept.stderr
    assert up.cli("cat", ws, "in.txt").stdout == "kept\n"
    ignored = up.cli("exec", ws, "-n", "--", 'read x; echo "[$x]"', input="not read\n")
    assert ignored.stdout == "[]\n"  # -n: not read, the command's stdin closed
    assert "read its standard input, which is closed" in ignored.stderr
    closed = up.cli("exec", ws, "--", 'read x; echo "[$x]"')  # stdin /dev/null: as before
    assert closed.stdout == "[]\n" and "pipe or redirect input" in closed.stderr
    over = up.cli("exec", ws, "--", "wc -c", input="z" * (EXEC_STDIN_MAX_BYTES + 1), check=False)
    assert over.returncode == 1 and over.stdout == ""
    assert over.stderr.startswith(
        f"quill: SIZE_LIMIT_EXCEEDED: stdin is over {EXEC_STDIN_MAX_BYTES} bytes"
    )
