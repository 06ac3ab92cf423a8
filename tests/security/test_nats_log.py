"""Issue 28, item 6 (nats-server's log): a tenant cannot fill the disk, or plant a secret in a
file, through nats-server's own log.

The attack: tenant ``a`` (``quill up --tenants --secrets``), with bare nats-py and its own
credentials, publishes 20,000 messages to a subject it may not use, the subject holding a
registered secret: nats-server writes a line for each permission violation, subject included.
Before: every line went to ``nats-server.log`` (0644) as written: 22 MB in 3.3 s in the attack
run, the secret verbatim. Now the launcher keeps at most 100 lines a second of it (then says
how many it dropped), redacted, in files of 0600, rotated and capped; the server serves on.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path

import nats
import pytest

from tests.helpers import eventually
from tests.up import PASSWORDS, TENANTS, Up, quill_as

SECRET = "sk-live-0123456789abcdef"
FLOOD = 20_000


pytestmark = pytest.mark.up(
    "--sandbox", "local", tenants=TENANTS, secrets=f'[secrets]\nopenai = "{SECRET}"\n'
)


def server_logs(up: Up) -> list[Path]:
    return sorted((up.data / "nats").glob("nats-server.log*"))


def logged(up: Up) -> bytes:
    return b"".join(path.read_bytes() for path in server_logs(up))


async def test_a_flood_of_violations_naming_a_secret_is_capped_and_redacted(up: Up) -> None:
    nc = await nats.connect(up.nats_url, user="a", password=PASSWORDS["a"])
    try:
        subject = f"ws.cmd.b.{SECRET}.write"  # tenant b's subjects: a violation each
        began = time.monotonic()
        for _ in range(FLOOD):
            await nc.publish(subject, b"x")
        await nc.flush()
        flood_s = time.monotonic() - began

        async def noted() -> bool:
            """One more violation a while later is kept, after the note of what was dropped."""
            if b"lines of nats-server's output dropped" in logged(up):
                return True
            await nc.publish("ws.cmd.b.later.write", b"x")
            await nc.flush()
            return False

        await eventually(noted, 30)
    finally:
        await nc.close()
    text = logged(up)
    print(f"{FLOOD} violations in {flood_s:.2f} s: {len(text)} bytes logged")
    assert SECRET.encode() not in text, "the secret is in nats-server's log"
    assert b"[REDACTED:openai]" in text
    assert text.count(b"Publish Violation") < FLOOD // 10, "the flood was logged whole"
    assert len(text) < 1024 * 1024
    for path in server_logs(up):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    b = await quill_as(up, "b")
    try:  # the server serves on
        ws = b.workspace("b/after-flood")
        await ws.create()
        await ws.write("a.txt", "still here\n")
        assert await ws.read_text("a.txt") == "still here\n"
    finally:
        await b.close()
