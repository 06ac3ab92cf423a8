"""The CLI's control commands against ``quill up``: approvals, trust, locks between sessions,
runs, sessions, and ``quill up --secrets``. Concurrent callers are real ``quill`` processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest

from tests import helpers
from tests.helpers import eventually_sync
from tests.up import Up

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-live-0123456789abcdef"
# a registered secret, redacted everywhere (test_up_secrets_*)
pytestmark = pytest.mark.up(secrets=f'[secrets]\ndemo = "{SECRET}"\n')


def pending(up: Up, ws: str, summary: str, timeout: float = 30.0) -> dict[str, Any]:
    """The approval waiting on ``ws`` for ``summary`` (``write plan.md``), once listed."""

    def listed() -> dict[str, Any] | None:
        for approval in json.loads(up.cli("--json", "approvals", ws).stdout)["pending"]:
            if approval["summary"] == summary:
                return dict(approval)
        return None

    return eventually_sync(listed, timeout, f"an approval for {summary!r} on {ws}")


def writer_waiting(up: Up, n: int) -> None:
    """Until the writer holds ``n`` commands back (for a lock or an approval)."""

    async def poll() -> None:
        nc = await nats.connect(up.nats_url)
        try:
            await helpers.writer_waiting(nc, n, 30)
        finally:
            await nc.close()

    asyncio.run(poll())


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def test_approve_and_deny_while_the_caller_waits(up: Up) -> None:
    ws = "acme/gated"
    up.cli("create", ws, "--trust", "restricted")
    at_once = up.cli("put", ws, "a.txt", "--text", "hi", check=False)
    assert at_once.returncode == 7
    assert at_once.stderr.startswith(f"quill: APPROVAL_REQUIRED: {ws} is restricted: ")
    unused = pending(up, ws, "write a.txt")
    assert up.cli("deny", ws, unused["approval_id"]).stdout == f"denied {unused['approval_id']}\n"

    agent = up.spawn("--actor", "agent", "--wait", "2m", "put", ws, "plan.md", "--text", "# plan")
    request = pending(up, ws, "write plan.md")
    listed = up.cli("approvals", ws).stdout
    assert re.fullmatch(
        rf"{request['approval_id']}  \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d  agent +cmd.write +"
        r"write plan.md\n"
        rf"\n{request['approval_id']} would change \(as of version \d+\):\n"
        r"--- /dev/null\n\+\+\+ b/plan.md\n@@ -0,0 \+1 @@\n\+# plan\n"
        r"\\ No newline at end of file\n",
        listed,
    )
    approved = up.cli("--actor", "alice", "approve", ws, request["approval_id"])
    assert approved.stdout == f"approved {request['approval_id']}\n"
    code, out, err = finish(agent)
    waited = f"quill: waiting (up to 120s) for approval {request['approval_id']} on {ws}: "
    assert code == 0 and err.startswith(waited) and len(err.splitlines()) == 1
    assert out.startswith("wrote plan.md: 6 bytes")
    assert up.cli("cat", ws, "plan.md").stdout == "# plan"

    agent = up.spawn("--actor", "agent", "--wait", "2m", "rm", ws, "plan.md")
    request = pending(up, ws, "delete plan.md")
    up.cli("--actor", "alice", "deny", ws, request["approval_id"], "--reason", "keep it")
    code, out, err = finish(agent)
    assert (code, out) == (8, "")
    assert err.endswith("\nquill: DENIED: Denied by alice: keep it\n")
    assert up.cli("cat", ws, "plan.md").stdout == "# plan"
    assert up.cli("approvals", ws).stdout == "(no pending approvals)\n"
    assert up.failure("approve", ws, request["approval_id"]) == (
        4,
        f"quill: CONFLICT: Approval {request['approval_id']} was already denied\n",
    )
    assert up.failure("deny", ws, "nope") == (
        3,
        "quill: FILE_NOT_FOUND: No approval nope is waiting\n",
    )


def test_trust_shown_and_set(up: Up) -> None:
    ws = "acme/trusty"
    up.cli("create", ws)
    assert up.cli("trust", ws).stdout == "acme/trusty: trust full\n"
    assert up.cli("trust", ws, "restricted").stdout == (
        "set acme/trusty: trust restricted (no commands)\n"
    )
    refused = up.cli("exec", ws, "--", "true", check=False)
    assert refused.returncode != 0 and "Commands are not offered" in refused.stderr
    assert up.cli("trust", ws, "restricted", "--commands").stdout == (
        "set acme/trusty: trust restricted (commands offered, each approved first)\n"
    )
    shown = json.loads(up.cli("--json", "trust", ws).stdout)
    assert shown == {"trust": "restricted", "commands": True, "changed": False}
    again = up.cli("trust", ws, "restricted", "--commands").stdout
    assert again.startswith("unchanged: acme/trusty: trust restricted")
    assert up.cli("trust", ws, "full").stdout == "set acme/trusty: trust full\n"
    assert up.cli("info", ws).stdout.splitlines()[2] == "trust: full"
    assert up.failure("trust", ws, "--commands") == (
        2,
        "quill: INVALID_ARGUMENT: --commands goes with a level: restricted\n",
    )


def test_a_lock_refuses_other_sessions_until_released(up: Up) -> None:
    ws = "acme/locked"
    up.cli("create", ws)
    anonymous = up.cli("lock", ws, check=False)
    assert anonymous.returncode == 2 and anonymous.stderr.startswith(
        "quill: INVALID_ARGUMENT: A lock belongs to a session: quill --session ID lock"
    )
    held = up.cli("--session", "alice", "lock", ws, "--ttl", "2m").stdout
    assert re.fullmatch(r"locked acme/locked for session alice until [\d: -]+\n", held)
    up.cli("--session", "alice", "put", ws, "a.txt", "--text", "alice's")

    refused = up.cli("--session", "bob", "put", ws, "b.txt", "--text", "bob's", check=False)
    assert refused.returncode == 7
    assert refused.stderr.startswith("quill: LOCKED: Workspace is locked by session alice until ")
    assert len(refused.stderr.splitlines()) == 1
    assert up.cli("--session", "bob", "unlock", ws, check=False).returncode == 7
    assert up.cli("--session", "bob", "cat", ws, "a.txt").stdout == "alice's"  # reads: never

    bob = up.spawn("--session", "bob", "--wait", "2m", "put", ws, "b.txt", "--text", "bob's")
    writer_waiting(up, 1)
    assert bob.poll() is None
    assert up.cli("--session", "alice", "unlock", ws).stdout == "unlocked acme/locked\n"
    code, out, err = finish(bob)
    assert code == 0 and out.startswith("wrote b.txt")
    assert err.startswith("quill: waiting (up to 120s) for session alice's lock on acme/locked")
    ops = [e["op"] for e in json.loads(up.cli("--json", "log", ws).stdout)["events"]]
    assert ops[-4:] == ["lock", "write", "unlock", "write"]


def test_a_run_reads_the_version_it_started_at(up: Up) -> None:
    ws = "acme/runs"
    up.cli("create", ws)
    up.cli("put", ws, "notes.md", "--text", "turn 0\n")
    started = json.loads(up.cli("--json", "run", "start", ws, "--id", "turn-1").stdout)
    assert (started["run"], started["version"], started["ended_version"]) == ("turn-1", 2, None)
    up.cli("put", ws, "notes.md", "--text", "turn 1\n")
    assert up.cli("--run", "turn-1", "cat", ws, "notes.md").stdout == "turn 0\n"
    assert up.cli("cat", ws, "notes.md").stdout == "turn 1\n"

    sub = up.cli("run", "start", ws, "--parent", "turn-1", "--id", "turn-1.a").stdout
    assert sub == "started run turn-1.a, reading version 2\n"
    shown = up.cli("run", "show", ws, "turn-1.a").stdout.splitlines()
    assert shown[:3] == ["run: turn-1.a", "parent: turn-1", "reads version: 2"]
    assert shown[-1] == "ended: no"

    assert up.cli("run", "end", ws, "turn-1").stdout == "ended run turn-1 (it read version 2)\n"
    late = up.cli("--run", "turn-1", "put", ws, "late.md", "--text", "x", check=False)
    assert late.returncode == 2 and late.stderr.startswith(
        "quill: INVALID_ARGUMENT: Run turn-1 has ended"
    )
    assert json.loads(up.cli("--json", "run", "show", ws, "turn-1").stdout)["ended_version"] > 2
    old = up.cli("run", "start", ws, "--version", "99", check=False)
    assert old.returncode == 2 and "Version 99 does not exist" in old.stderr


def test_sessions_open_attach_list_detach(up: Up) -> None:
    opened = up.cli("session", "open", "acme", "--id", "talk-1").stdout
    assert opened == "session talk-1: primary workspace acme/talk-1\n"
    fresh = json.loads(up.cli("--json", "session", "open", "acme").stdout)
    assert fresh["primary"] == f"acme/{fresh['session']}"
    up.cli("create", "acme/shared")
    up.cli("create", "acme/library")
    up.cli("session", "attach", "acme/talk-1", "server:/acme/shared")
    up.cli("session", "attach", "acme/talk-1", "server:/acme/library")
    listing = up.cli("session", "list", "acme/talk-1").stdout.splitlines()
    assert [line.split() for line in listing] == [
        ["primary", "acme/talk-1"],
        ["server", "acme/shared", "server:/acme/shared"],
        ["server", "acme/library", "server:/acme/library"],
    ]
    up.cli("session", "detach", "acme/talk-1", "server:/acme/shared")
    listed = json.loads(up.cli("--json", "session", "list", "acme/talk-1").stdout)
    assert listed == {
        "primary": "acme/talk-1",
        "attached": [{"uri": "server:/acme/library", "target": "acme/library", "kind": "server"}],
    }
    assert up.failure("session", "detach", "acme/talk-1", "server:/acme/shared") == (
        3,
        "quill: FILE_NOT_FOUND: server:/acme/shared is not attached\n",
    )
    foreign = up.cli("session", "attach", "acme/talk-1", "server:/other/x", check=False)
    assert foreign.returncode == 5 and foreign.stderr.startswith("quill: ACCESS_DENIED: ")


def test_durations_are_checked(up: Up) -> None:
    bad = up.cli("--wait", "30", "ls", "acme/any", check=False)
    assert bad.returncode == 2 and "Bad duration '30': use 500ms, 30s, 2m or 1h" in bad.stderr


def test_docs_control_examples(up: Up) -> None:
    """The control tour of docs/cli.md runs, line by line, as written."""
    text = (ROOT / "docs" / "cli.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "run start" in b)
    env = {**os.environ, "QUILL_NATS_URL": up.nats_url}
    out: list[str] = []
    for line in block.strip().splitlines():
        command = line.split("  #")[0].replace("quill ", f"{sys.executable} -m quill ", 1)
        done = subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (line, done.stderr)
        out.append(done.stdout)
    assert "turn 0\n" in out  # the run read the version it started at
    assert any(o.startswith("locked acme/plan for session alice") for o in out)
    assert any("server   acme/plan" in o for o in out)


# ---------------------------------------------------------------- quill up --secrets


def test_up_secrets_reach_the_writer_and_the_executor(up: Up) -> None:
    ws = "acme/vault"
    up.cli("create", ws)
    up.cli("put", ws, "config.env", "--text", f"KEY={SECRET}\n")
    assert up.cli("cat", ws, "config.env").stdout == "KEY=[REDACTED:demo]\n"
    ran = json.loads(up.cli("--json", "exec", ws, "--", f"echo {SECRET}").stdout)
    assert ran["stdout"] == "[REDACTED:demo]\n"


def test_up_secrets_redact_live_command_output(up: Up) -> None:
    up.cli("create", "acme/live")
    assert up.cli("exec", "acme/live", "--", f"echo {SECRET}").stdout == "[REDACTED:demo]\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read secrets file {path}: [Errno 2] No such file or directory"),
        ("x = [", "cannot read secrets file {path}: "),
        ('[secrets]\nk = { env = "QUILL_TEST_UNSET" }\n', "{path}: secret k: $QUILL_TEST_UNSET"),
        ("[other]\n", "{path}: unknown tables ['other']"),
    ],
)
def test_up_refuses_a_bad_secrets_file_at_once(
    tmp_path: Path, content: str | None, message: str
) -> None:
    registry = tmp_path / "secrets.toml"
    if content is not None:
        registry.write_text(content)
    env = {k: v for k, v in os.environ.items() if k != "QUILL_TEST_UNSET"}
    done = subprocess.run(
        [sys.executable, "-m", "quill", "up", "--data", str(tmp_path / ".quill")]
        + ["--nats-port", "0", "--http-port", "0", "--secrets", str(registry)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("quill: " + message.format(path=registry))
    assert len(done.stderr.splitlines()) == 1
    assert not (tmp_path / ".quill").exists()  # nothing was started


def test_create_sets_the_checkout_quota_that_info_answers(up: Up) -> None:
    ws = "acme/quota-cli"
    up.cli("create", ws, "--max-checkout-bytes", str(64 * 1024 * 1024))
    info = json.loads(up.cli("--json", "info", ws).stdout)
    assert info["limits"]["max_checkout_bytes"] == 64 * 1024 * 1024
    over = up.cli("create", "acme/quota-cli-2", "--max-checkout-bytes", "-1", check=False)
    assert over.returncode == 2 and "INVALID_ARGUMENT" in over.stderr
