"""Issue 10, item 6: a registered secret never reaches WS_EVENTS, WS_AUDIT, WS_BLOBS, a KV
bucket, a reply, live output or a service log.

``quill up --secrets FILE`` runs as a real process; a bare nats-py client, a REST client and an
MCP client send a battery of operations carrying the secret in every field a client controls:
names are refused with ``INVALID_ARGUMENT`` (and a message without the secret), contents and
commands are redacted, a file a command names with the secret is skipped, a commit message
made in a command (zlib-compressed in ``.git/objects``) is kept out of the log. Then every
stream (KV buckets and object stores are streams too), every reply, the live output of each
command joined back together and every service log are scanned: the secret occurs 0 times.
The same battery runs with the secret registered as a value and as a regex pattern.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from contracts.subjects import (
    BUCKET_BLOBS,
    HEADER_ACTOR,
    HEADER_REQUEST_ID,
    HEADER_RUN,
    HEADER_SESSION,
    HEADER_STREAM,
    STREAM_AUDIT,
    STREAM_EVENTS,
)
from core.secrets import Secrets, StreamRedactor
from tests.gateway.support import call, mcp_client, text
from tests.helpers import eventually
from tests.security.conftest import Canaries, verify
from tests.up import Up

SECRET = "sk-live-0123456789abcdef"
HALF = len(SECRET) // 2
WS = ("acme", "vault")

# Write the secret's two halves as two writes that reach the executor as two reads: the
# second waits until the pipe is drained (FIONREAD on our end of it is 0), a condition, not
# a delay. Neither half alone is the secret; joined they are.
SPLIT = (
    "import fcntl, os, struct, sys, termios, time\n"
    "def drained():\n"
    "    n = fcntl.ioctl(1, termios.FIONREAD, struct.pack('i', 0))\n"
    "    return struct.unpack('i', n)[0] == 0\n"
    "os.write(1, sys.argv[1].encode())\n"
    "deadline = time.monotonic() + 20\n"
    "while not drained() and time.monotonic() < deadline:\n"
    "    pass\n"
    "os.write(1, sys.argv[2].encode() + b'\\n')\n"
)

REGISTRIES = {
    "value": f'[secrets]\nopenai = "{SECRET}"\n',
    "pattern": '[[patterns]]\nid = "openai"\nregex = "sk-live-[0-9a-f]{16}"\n',
}


class Bus:
    """A bare client that keeps every reply and every live-output message it gets."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.replies: list[bytes] = []
        self.live: dict[tuple[str, str], list[bytes]] = defaultdict(list)
        self.problems: list[str] = []

    async def watch(self) -> None:
        async def on_live(msg: Msg) -> None:
            stream = (msg.headers or {}).get(HEADER_STREAM, "")
            self.live[(msg.subject, stream)].append(msg.data)

        await self.nc.subscribe("ws.execout.>", cb=on_live)

    async def ask(
        self,
        kind: str,
        op: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        ws: tuple[str, str] = WS,
    ) -> dict[str, Any]:
        all_headers = {HEADER_REQUEST_ID: uuid.uuid4().hex, **(headers or {})}
        subject = f"ws.{kind}.{ws[0]}.{ws[1]}.{op}"
        reply = await self.nc.request(
            subject, json.dumps(body).encode(), timeout=60, headers=all_headers
        )
        self.replies.append(reply.data + json.dumps(reply.headers or {}).encode())
        answer: dict[str, Any] = json.loads(reply.data)
        return answer

    def check(self, holds: bool, what: str) -> None:
        """Note a broken promise (all are reported together at the end of the test)."""
        if not holds:
            self.problems.append(what)

    async def ok(self, kind: str, op: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        answer = await self.ask(kind, op, body, **kw)
        assert answer["ok"], answer
        result: dict[str, Any] = answer["result"]
        return result

    async def refused(self, kind: str, op: str, body: dict[str, Any], **kw: Any) -> None:
        answer = await self.ask(kind, op, body, **kw)
        code = None if answer["ok"] else answer["error"]["code"]
        said = "" if answer["ok"] else answer["error"]["message"]
        where = f"{kind}.{op} {body} {kw}"
        self.check(code == "INVALID_ARGUMENT", f"not refused ({code}): {where}")
        self.check(answer["ok"] or "openai" in said, f"refusal does not say which: {where}")


async def battery(bus: Bus, up: Up, carried: list[bytes]) -> None:
    """Every field a client controls, carrying the secret."""
    s = SECRET
    await bus.ok("cmd", "create", {})
    # names: refused (redacting would change what they name)
    await bus.refused("cmd", "write", {"path": f"notes/{s}.txt", "content": "x"})
    await bus.refused("cmd", "mkdir", {"path": f"dir-{s}"})
    await bus.ok("cmd", "write", {"path": "a.txt", "content": "a\n"})
    await bus.refused("cmd", "move", {"path": "a.txt", "to": f"b-{s}.txt"})
    await bus.refused("cmd", "delete", {"path": s})
    put = {"type": "put", "path": "c.txt", "content": "c"}
    await bus.refused("cmd", "apply", {"base_version": 1, "changes": [put], "message": s})
    bad_put = {"type": "put", "path": f"{s}/c.txt", "content": "c"}
    await bus.refused("cmd", "apply", {"base_version": 1, "changes": [bad_put]})
    await bus.refused("cmd", "write", {"path": "d.txt", "content": "d"}, headers={HEADER_ACTOR: s})
    await bus.refused("cmd", "write", {"path": "d.txt", "content": "d"}, headers={HEADER_RUN: s})
    await bus.refused(
        "cmd", "write", {"path": "d.txt", "content": "d"}, headers={HEADER_REQUEST_ID: s}
    )
    await bus.refused("cmd", "lock", {}, headers={HEADER_SESSION: s})
    await bus.ask("cmd", "unlock", {}, headers={HEADER_SESSION: s})  # if it was taken
    await bus.refused("cmd", "run_start", {"run": s})
    await bus.refused("cmd", "attach", {"uri": f"server:/acme/{s}"})
    await bus.refused("cmd", "attach", {"uri": f"git:https://{s}@example.com/r.git"})
    await bus.refused("cmd", "decide", {"approval_id": s, "approve": True})
    await bus.refused("cmd", "write", {"path": "e.txt", "content": "e"}, ws=("acme", s))
    await bus.refused("qry", "read", {"path": s})
    await bus.refused("qry", "grep", {"pattern": s})
    await bus.refused("exec", "run", {"command": "true", "workdir": s})
    await bus.refused("exec", "git", {"action": "commit", "message": f"add {s}"})
    await bus.refused("exec", "git", {"action": "checkout", "branch": s})
    await bus.refused("exec", "git", {"action": "clone", "url": f"https://{s}@example.com/r"})
    # contents: redacted
    await bus.ok("cmd", "write", {"path": "env.txt", "content": f"KEY={s}\n"})
    edited = await bus.ask("cmd", "edit", {"path": "env.txt", "old_string": s, "new_string": "k"})
    bus.check(edited["ok"], f"edit of the stored (redacted) secret: {edited}")
    # commands: the secret's halves printed as two chunks; a file named with it; a commit
    # message and a branch made with it inside the sandbox
    ran = await bus.ok(
        "exec", "run", {"command": 'python3 -c "$SPLIT" "$A" "$B"',
                        "env": {"SPLIT": SPLIT, "A": s[:HALF], "B": s[HALF:]}},
    )  # fmt: skip
    bus.check(ran["stdout"] == "[REDACTED:openai]\n", f"split output: {ran['stdout']!r}")
    ran = await bus.ok("exec", "run", {"command": 'touch "x-$K.txt" ok.txt', "env": {"K": s}})
    changes = ran["changes"]
    committed = [p["path"] for p in changes["paths"]]
    bus.check(committed == ["ok.txt"], f"a file named with the secret committed: {committed}")
    skipped = [p["path"] for p in changes["skipped"]]
    bus.check(skipped == ["x-[REDACTED:openai].txt"], f"not reported skipped: {skipped}")
    git = (
        "git init -q . && git -c user.name=a -c user.email=a@b.c commit -q --allow-empty "
        '-m "$K" && git branch "$K" && git log --format=%s'
    )
    ran = await bus.ok("exec", "run", {"command": git, "env": {"K": s}})
    bus.check(ran["stdout"] == "[REDACTED:openai]\n", f"git log output: {ran['stdout']!r}")
    skipped = [p["path"] for p in ran["changes"]["skipped"]]
    branch = ".git/refs/heads/[REDACTED:openai]"
    bus.check(branch in skipped, f"a branch named with the secret committed: {skipped}")
    made = any(p.startswith(".git/objects/") for p in skipped)
    bus.check(made, f"a commit object holding the secret committed: {skipped}")
    await bus.ok("exec", "git", {"action": "log"})
    await bus.ok("exec", "run", {"command": "ls -R; git status --short"})
    # a restricted workspace keeps what waits for approval (WS_APPROVALS) with no secret in it,
    # and carries out an approved change as it would have been committed
    careful = (WS[0], "careful")
    await bus.ok("cmd", "create", {"trust": "restricted"}, ws=careful)
    await bus.ok("cmd", "set_trust", {"trust": "restricted", "commands": True}, ws=careful)
    waits = await bus.ask("cmd", "write", {"path": "k.txt", "content": f"K={s}\n"}, ws=careful)
    bus.check(waits["error"]["code"] == "APPROVAL_REQUIRED", f"not parked: {waits}")
    run = await bus.ask("exec", "run", {"command": "true", "env": {"K": s}}, ws=careful)
    bus.check(run["error"]["code"] == "APPROVAL_REQUIRED", f"not parked: {run}")
    approval = waits["error"]["details"]["approval_id"]
    await bus.ok("cmd", "decide", {"approval_id": approval, "approve": True}, ws=careful)

    async def carried_out() -> dict[str, Any] | None:
        status = await bus.ok("qry", "approval", {"approval_id": approval}, ws=careful)
        return status if status["done"] else None

    status = await eventually(carried_out, 30, f"approval {approval} carried out")
    bus.check(status["outcome"]["error"] is None, f"not carried out: {status}")
    # a replica answers once it has applied what the approval committed
    written = {"path": "k.txt", "min_version": status["outcome"]["version"]}
    kept = await bus.ok("qry", "read", written, ws=careful)
    bus.check(kept["content"] == "K=[REDACTED:openai]\n", f"carried out as {kept}")
    # REST and MCP (the gateway's default workspace)
    files = f"{up.http_url}/v1/host/workspace/files"
    async with httpx.AsyncClient(timeout=30) as http:
        put_ok = await http.put(f"{files}/rest.txt", json={"content": f"K={s}\n"})
        assert put_ok.status_code == 200, put_ok.text
        echoed = put_ok.json()["content"]
        bus.check(echoed == "K=[REDACTED:openai]\n", f"REST PUT echoes {echoed!r}")
        named = await http.put(f"{files}/{s}.txt", json={"content": "x"})
        bus.check(named.status_code == 400, f"REST PUT of a named path: {named.status_code}")
        got = await http.get(f"{files}/{s}.txt")
        carried += [put_ok.content, named.content, got.content]
    async with mcp_client(up.http_url) as mcp:
        refused = await call(mcp, "write_file", path=f"{s}.md", content="x")
        bus.check(refused.is_error, "MCP write of a named path not refused")
        written = await call(mcp, "write_file", path="mcp.md", content=f"K={s}\n")
        assert not written.is_error, text(written)
        read = await call(mcp, "read_file", path="mcp.md")
        carried += [text(refused).encode(), text(written).encode(), text(read).encode()]


async def stored(nc: NATS) -> list[tuple[str, bytes]]:
    """Every message of every stream (KV buckets and object stores included): its stream and
    its subject, headers and data."""
    js = nc.jetstream()
    streams = await js.streams_info()
    names = {info.config.name for info in streams}
    assert {STREAM_EVENTS, STREAM_AUDIT, f"OBJ_{BUCKET_BLOBS}"} <= names, names
    found: list[tuple[str, bytes]] = []
    for info in streams:
        name = info.config.name
        assert name is not None
        for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
            try:
                msg = await js.get_msg(name, seq)
            except NotFoundError:
                continue
            raw = (msg.subject or "").encode() + json.dumps(msg.headers or {}).encode()
            found.append((name, raw + (msg.data or b"")))
    return found


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
async def test_a_secret_reaches_no_stream_reply_output_or_log(
    tmp_path: Path, canaries: Canaries, kind: str
) -> None:
    registry = tmp_path / "secrets.toml"
    registry.write_text(REGISTRIES[kind])
    data = tmp_path / ".quill"
    up = Up(data, args=("--secrets", str(registry))).start()
    try:
        nc = await nats.connect(up.nats_url)
        try:
            bus = Bus(nc)
            await bus.watch()
            carried: list[bytes] = []
            await battery(bus, up, carried)
            await nc.flush()
            secret = SECRET.encode()
            leaks = sorted({name for name, raw in await stored(nc) if secret in raw})
            bus.check(leaks == [], f"the secret is stored in {leaks}")
            replies = [r for r in [*bus.replies, *carried] if secret in r]
            bus.check(replies == [], f"{len(replies)} replies hold the secret: {replies[:3]}")
            assert bus.live, "no live output seen"
            for (subject, stream), chunks in bus.live.items():
                live = b"".join(chunks)
                bus.check(secret not in live, f"live {stream} of {subject}: {chunks}")
            assert any(b"[REDACTED:openai]" in b"".join(c) for c in bus.live.values())
        finally:
            await nc.close()
        verify(up, "/".join(WS))
    finally:
        up.stop()
    logs = [(p.name, p.read_bytes()) for p in (data / "logs").glob("*.log")]
    logs.append(("quill up", "".join(up.output).encode()))
    logged = [name for name, text in logs if SECRET.encode() in text]
    bus.check(logged == [], f"service logs hold the secret: {logged}")
    assert bus.problems == [], "\n".join(bus.problems)


LOGGING = """
import logging, sys
from infra.runtime import setup_logging
setup_logging("info", sys.argv[1])
log = logging.getLogger("quill.test")
log.warning("a message with %s", sys.argv[2])
log.warning("a message with " + sys.argv[2])
try:
    raise ValueError(f"File not found: {sys.argv[2]}")
except ValueError:
    log.exception("failed")
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_service_logs_hold_no_secret(tmp_path: Path, fmt: str) -> None:
    """The logging every service process sets up redacts a registered secret from messages,
    their arguments and tracebacks."""
    registry = tmp_path / "secrets.toml"
    registry.write_text(REGISTRIES["value"])
    env = {**os.environ, "QUILL_SECRETS": str(registry)}
    run = subprocess.run(
        [sys.executable, "-c", LOGGING, fmt, SECRET],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert run.stderr.count("[REDACTED:openai]") == 3, run.stderr
    assert SECRET not in run.stderr


def test_live_output_split_anywhere_is_redacted() -> None:
    """A ``StreamRedactor`` fed a stream cut at any two places gives what redacting the whole
    stream gives (values and patterns, a secret at the start, the end, twice)."""
    secrets = Secrets({"openai": SECRET}, {"aws": "AKIA[0-9A-Z]{16}"})
    stream = f"{SECRET}x AKIAABCDEFGHIJKLMNOP {SECRET}{SECRET}".encode()
    whole = secrets.redact_bytes(stream)[0]
    for i in range(len(stream) + 1):
        for j in range(i, len(stream) + 1):
            redactor = StreamRedactor(secrets)
            parts = [stream[:i], stream[i:j], stream[j:]]
            shown = b"".join(redactor.feed(p) for p in parts) + redactor.flush()
            assert shown == whole, (i, j, shown)
            assert redactor.redacted == {"openai", "aws"}
