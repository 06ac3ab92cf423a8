"""The CLI as an operator meets it (issue 13, "The CLI, as an operator uses it"): its own
words in errors, ``--json`` anywhere and JSON errors, waiting said aloud, a missing server
said fast, a grouped help, output without Python reprs."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from contracts.errors import ErrorCode
from quill_cli.common import EXIT_CODES, SECTIONS
from tests.up import Up

ROOT = Path(__file__).resolve().parents[2]
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
"""The one time format of the CLI's text output."""


def quill(
    *args: str, env: dict[str, str] | None = None, **kw: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quill", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        **kw,  # type: ignore[call-overload]
    )


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the CLI keeps requests held for approval (``quill resume``)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "quill" / "pending"


def test_errors_speak_the_cli_s_words(up: Up) -> None:
    ws = "acme/words"
    up.cli("create", ws)
    up.cli("put", ws, "a.txt", "--text", "x\nx\n")
    many = up.cli("edit", ws, "a.txt", "x", "y", check=False)
    assert many.returncode == 1 and "MULTIPLE_MATCHES" in many.stderr
    assert "--all" in many.stderr
    none = up.cli("edit", ws, "a.txt", "zzz", "y", check=False)
    assert none.stderr.startswith("quill: NO_MATCH: OLD not found")
    up.cli("mkdir", ws, "d/e")
    full = up.cli("rm", ws, "d", check=False)
    assert "(use -r to delete it with its contents)" in full.stderr
    for out in (many.stderr, none.stderr, full.stderr):
        for wire in ("oldString", "replace_all", "recursive", "Ws-Request-Id"):
            assert wire not in out, out


def test_json_before_or_after_the_subcommand_and_json_errors(up: Up) -> None:
    ws = "acme/jsonish"
    up.cli("create", ws)
    up.cli("put", ws, "a.txt", "--text", "hi")
    before = json.loads(up.cli("--json", "stat", ws, "a.txt").stdout)
    after = json.loads(up.cli("stat", ws, "a.txt", "--json").stdout)
    assert before == after and after["size"] == 2
    assert json.loads(up.cli("run", "start", ws, "--id", "r1", "--json").stdout)["run"] == "r1"

    missing = up.cli("cat", ws, "nope.txt", "--json", check=False)
    assert missing.returncode == 3 and missing.stdout == ""
    error = json.loads(missing.stderr)
    assert (error["code"], error["exit_status"]) == ("FILE_NOT_FOUND", 3)
    assert error["message"] == "File not found: nope.txt"

    usage = up.cli("ls", ws, "--bogus", "--json", check=False)
    assert usage.returncode == 2
    assert json.loads(usage.stderr)["code"] == "INVALID_ARGUMENT"
    text = up.cli("ls", ws, "--bogus", check=False)  # without --json: click's own text
    assert text.returncode == 2 and "No such option" in text.stderr


def test_every_exit_status_is_documented_per_code() -> None:
    doc = (ROOT / "docs" / "cli.md").read_text()
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| (\d+) \|", doc, re.M))
    assert documented == {str(c): str(EXIT_CODES.get(c, 1)) for c in ErrorCode}


def _listener() -> tuple[socket.socket, list[int]]:
    """A TCP port that accepts and hangs up at once (not NATS), counting connections."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted = [0]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted[0] += 1
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, accepted


def test_no_server_says_how_to_start_one_and_does_not_retry(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = quill("--nats-url", f"nats://127.0.0.1:{port}", "ls", "acme/x", cwd=tmp_path)
    assert refused.returncode == 6
    assert refused.stderr.startswith("quill: UNAVAILABLE: Cannot connect to NATS")
    assert "Start it with `quill up`" in refused.stderr

    # The client used to retry its first connection for 5 s (25 attempts); now: one look, one
    # connect (and the client's single reconnect).
    server, accepted = _listener()
    try:
        url = f"nats://127.0.0.1:{server.getsockname()[1]}"
        hung_up = quill("--nats-url", url, "ls", "acme/x", cwd=tmp_path)
    finally:
        server.close()
    assert hung_up.returncode == 6 and "`quill up`" in hung_up.stderr
    assert accepted[0] <= 3


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_url_that_is_not_nats_is_refused_by_name(how: str) -> None:
    url = "http://127.0.0.1:8080"
    if how == "option":
        r = quill("--nats-url", url, "ls", "acme/x")
        named = "--nats-url"
    else:
        r = quill("ls", "acme/x", env={"QUILL_NATS_URL": url})
        named = "$QUILL_NATS_URL"
    assert r.returncode == 2
    assert r.stderr.startswith(f"quill: INVALID_ARGUMENT: {named} {url}: not a NATS URL")
    assert "nats://" in r.stderr


def test_help_groups_the_commands_with_whole_descriptions() -> None:
    out = quill("--help", env={"COLUMNS": "200"}).stdout
    headings = [line[:-1] for line in out.splitlines() if line.endswith(":") and line[0] != " "]
    assert headings[-len(SECTIONS) :] == list(SECTIONS.values())
    listed = re.findall(r"^  ([a-z][a-z-]*)  +(.*)$", out.split("\n" + SECTIONS["files"])[1], re.M)
    names = [name for name, _ in listed]
    assert {"cat", "exec", "run", "session", "up", "history", "scrub", "resume"} <= set(names)
    assert len(names) == len(set(names)) >= 44
    for name, text in listed:
        assert not text.endswith("..."), (name, text)
    files = out.split(SECTIONS["files"] + ":")[1].split(SECTIONS["history"] + ":")[0]
    assert "  cat " in files and "  exec " not in files


def test_output_has_no_python_reprs_and_one_time_format(up: Up) -> None:
    ws = "acme/shown"
    up.cli("create", ws)
    up.cli("put", ws, "a.txt", "--text", "one")
    up.cli("put", ws, "b.txt", "--text", "two")
    texts = {
        "info": up.cli("info", ws).stdout,
        "stat": up.cli("stat", ws, "a.txt").stdout,
        "ls": up.cli("ls", "-l", ws).stdout,
        "history": up.cli("history", ws).stdout,
        "log": up.cli("log", ws).stdout,
        "audit": up.cli("audit", ws).stdout,
    }
    for name, text in texts.items():
        for repr_ in ("True", "False", "None", "+00:00", "datetime"):
            assert repr_ not in text, (name, text)
        assert re.search(TIME, text), (name, text)
        assert not re.search(r"\d\d:\d\d:\d\d\.\d", text), (name, text)  # no microseconds
    assert "binary:           no" in texts["stat"]
    for name in ("log", "history", "ls"):  # aligned columns: each time at the same place
        starts = {
            re.search(TIME, line).start()  # type: ignore[union-attr]
            for line in texts[name].splitlines()
        }
        assert len(starts) == 1, texts[name]
    assert ": 1 byte," in up.cli("put", ws, "c.txt", "--text", "x").stdout
    assert ": 3 bytes," in up.cli("put", ws, "c.txt", "--text", "xyz").stdout


def test_cat_of_a_directory_is_an_error(up: Up) -> None:
    ws = "acme/catdir"
    up.cli("create", ws)
    up.cli("mkdir", ws, "docs")
    r = up.cli("cat", ws, "docs", check=False)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("quill: NOT_A_FILE: Not a file: docs")


def _first_line(stream: object) -> str:
    line = stream.readline()  # type: ignore[attr-defined]
    assert isinstance(line, str)
    return line


def test_wait_says_whose_lock_it_waits_for(up: Up) -> None:
    ws = "acme/waitlock"
    up.cli("create", ws)
    up.cli("--session", "alice", "lock", ws, "--ttl", "5m")
    bob = up.spawn("--session", "bob", "--wait", "2m", "put", ws, "b.txt", "--text", "b")
    said = _first_line(bob.stderr)
    assert said.startswith(f"quill: waiting (up to 120s) for session alice's lock on {ws}")
    assert re.search(rf"it expires {TIME}\)$", said.strip()), said
    up.cli("--session", "alice", "unlock", ws)
    out, err = bob.communicate(timeout=60)
    assert bob.returncode == 0, err
    assert out.startswith("wrote b.txt: 1 byte,")


def test_approval_id_is_said_and_resume_finishes_the_request(up: Up, state: Path) -> None:
    ws = "acme/resumable"
    up.cli("create", ws)
    up.cli("trust", ws, "restricted", "--commands")
    at_once = up.cli("put", ws, "plan.md", "--text", "v1", check=False)
    assert at_once.returncode == 7
    found = re.search(rf"waits for approval (\S+)\. .*quill resume {ws} \1", at_once.stderr)
    assert found, at_once.stderr
    approval = found[1]
    assert (state / f"{approval}.json").stat().st_mode & 0o777 == 0o600
    assert "v1" not in (state / f"{approval}.json").read_text()  # Quill keeps the request
    early = up.cli("resume", approval, check=False)
    assert early.returncode == 7 and "still pending" in early.stderr
    up.cli("approve", ws, approval)  # Quill makes the change: nobody sends it again
    done = up.cli("--wait", "30s", "resume", approval)
    assert done.stdout.startswith(f"done: cmd.write on {ws} (approval {approval})")
    assert up.cli("cat", ws, "plan.md").stdout == "v1"
    assert not (state / f"{approval}.json").exists()
    again = up.cli("resume", approval, check=False)
    assert again.returncode == 3 and f"quill resume WORKSPACE {approval}" in again.stderr
    assert up.cli("resume", ws, approval).stdout.startswith("done: cmd.write")  # kept
    assert up.cli("resume", "../../etc/passwd", check=False).returncode == 2

    # a command, likewise: resume prints its output and exits with its exit code
    ran = up.cli("exec", ws, "--", "echo made > made.txt; echo out; exit 5", check=False)
    assert ran.returncode == 7, ran.stderr
    command = re.search(r"waits for approval (\S+)\.", ran.stderr)
    assert command, ran.stderr
    up.cli("approve", ws, command[1])
    finished = up.cli("--wait", "60s", "resume", command[1], check=False)
    assert (finished.returncode, finished.stdout) == (5, "out\n"), finished.stderr
    assert up.cli("cat", ws, "made.txt").stdout == "made\n"
    denied = up.cli("exec", ws, "--", "rm -rf .", check=False)
    other = re.search(r"waits for approval (\S+)\.", denied.stderr)
    assert other, denied.stderr
    up.cli("deny", ws, other[1], "--reason", "no")
    refused = up.cli("resume", ws, other[1], check=False)
    assert refused.returncode == 8 and "denied by" in refused.stderr

    waiter = up.spawn("--wait", "2m", "rm", ws, "plan.md")
    said = _first_line(waiter.stderr)
    ids = re.search(rf"for approval (\S+) on {ws}: quill approve {ws} \1", said)
    assert ids, said
    up.cli("deny", ws, ids[1], "--reason", "keep it")
    _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 8 and "keep it" in err


def test_spinner_only_on_a_terminal(up: Up) -> None:
    ws = "acme/spin"
    up.cli("create", ws)
    up.cli("--session", "alice", "lock", ws, "--ttl", "5m")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "quill", "--session", "bob", "--wait", "2m"]
        + ["put", ws, "b.txt", "--text", "b"],
        stdout=follower,
        stderr=follower,
        env={**os.environ, "QUILL_NATS_URL": up.nats_url, "TERM": "xterm"},
    )
    os.close(follower)
    seen = b""
    try:
        while b"waiting" not in seen.split(b"lock on")[-1]:  # the spinner's own text
            ready, _, _ = select.select([leader], [], [], 30)
            assert ready, seen
            seen += os.read(leader, 4096)
    finally:
        up.cli("--session", "alice", "unlock", ws)
        proc.wait(60)
        os.close(leader)
    assert b"\x1b[" in seen  # drawn (and redrawn) on the terminal


def test_a_change_to_a_bridge_says_it_waits_for_the_bridge_s_user(up: Up, tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    bridge = subprocess.Popen(
        [sys.executable, "-m", "quill", "attach", str(folder), "--as", "bridged"]
        + ["--tenant", "acme", "--client", "laptop", "--trust", "restricted"]
        + ["--ask-timeout", "60", "--nats-url", up.nats_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert bridge.stdin is not None and bridge.stdout is not None
    try:
        while "quill attach ready" not in (line := bridge.stdout.readline()):
            assert line, "quill attach ended"
        put = up.spawn("put", "acme/bridged", "todo.md", "--text", "- milk\n")
        said = _first_line(put.stderr)
        assert said.startswith(
            "quill: waiting for the user of the bridge serving acme/bridged "
            f"(laptop:{folder}, quill attach) to answer"
        ), said
        while "allow?" not in (line := bridge.stdout.readline()):
            assert line, "quill attach ended"
        bridge.stdin.write("y\n")
        bridge.stdin.flush()
        out, err = put.communicate(timeout=60)
        assert put.returncode == 0, err
        assert out.startswith("wrote todo.md: 7 bytes")
        assert (folder / "todo.md").read_text() == "- milk\n"
    finally:
        bridge.terminate()
        bridge.communicate(timeout=30)
