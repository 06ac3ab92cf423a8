"""``quill exec`` says what its live output left out and what the command left running or
tried to read; ``quill output`` prints a command's kept output by its id."""

from __future__ import annotations

import json
import re

from tests.up import Up

LIVE_MAX_BYTES = 8 * 1024 * 1024
"""What ``quill exec`` streams of each stream (``infra.exec.answer.LIVE_MAX_BYTES``)."""


def test_exec_notes_and_quill_output(up: Up) -> None:
    ws = "acme/output"
    up.cli("create", ws)
    done = up.cli("exec", ws, "--", "sleep 300 & read -p 'Name? ' x; echo done", check=False)
    assert (done.returncode, done.stdout) == (0, "done\n")
    assert "quill: the command left 1 process running in the background, killed" in done.stderr
    assert "quill: the command read its standard input, which is closed" in done.stderr

    r = json.loads(up.cli("--json", "exec", ws, "--", "seq 1 30000").stdout)
    expected = "".join(f"{i}\n" for i in range(1, 30001))
    assert r["stdout_truncated"] and r["command_id"]
    assert up.cli("output", ws, r["command_id"]).stdout == expected
    part = up.cli("output", ws, r["command_id"], "--offset", "6", "--length", "4")
    assert part.stdout == expected[6:10]
    page = json.loads(up.cli("--json", "output", ws, r["command_id"], "--length", "2").stdout)
    assert (page["text"], page["more"], page["complete"]) == ("1\n", True, True)
    missing = up.cli("output", ws, "no-such-command", check=False)
    assert missing.returncode != 0 and "No output kept for command" in missing.stderr


def test_exec_says_how_to_get_what_it_did_not_stream(up: Up) -> None:
    ws = "acme/big-output"
    up.cli("create", ws)
    size = LIVE_MAX_BYTES + 1000
    done = up.cli("exec", ws, "--", f"head -c {size} /dev/zero | tr '\\0' x")
    assert len(done.stdout) == LIVE_MAX_BYTES
    note = re.search(r"quill output (\S+) (\S+) --stream stdout --offset (\d+)", done.stderr)
    assert note and note[1] == ws and int(note[3]) == LIVE_MAX_BYTES, done.stderr
    assert "1000 bytes past the first" in done.stderr
    rest = up.cli("output", ws, note[2], "--offset", note[3])
    assert rest.stdout == "x" * 1000
