"""Item 5 of issue 28: no reply reaches another principal, and no tenant publishes past its own
inbox by naming a reply subject.

``quill up --tenants`` with tenant ``acme`` and a bridge tenant ``evil`` (``bridges = true``),
each with its own NATS user and gateway token; the attacker is a bare nats-py client with
evil's credentials. The gateway acts for both as the services' user.

Before the fix a bridge tenant saw the gateway's reply subjects on its own request subjects
(``_INBOX_quill-system.<mux>.<nuid><4 hex>``: one mux for every tenant, a counter and 16
random bits), the services answered evil's pings and queries into that inbox, and evil could
publish anything anywhere through NATS' ``allow_responses`` and JetStream's replies (an
in-flight ``execute_command`` of acme resolved with evil's text; evil's bytes landed in acme's
log). Now the gateway's requests for a tenant reply on that tenant's own inbox with 128 random
bits per request, services answer a tenant's request only into that tenant's inbox, and a
bridge tenant publishes only into its inbox and its own subjects.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NoKeysError

from quill.client import Quill
from tests.gateway.support import error, mcp_client, ok, text
from tests.helpers import Gate, Refusals
from tests.up import Up, bare_as

PASSWORDS = {"acme": "acme-nats-password", "evil": "evil-nats-password"}
TOKENS = {"acme": "acme-gateway-token", "evil": "evil-gateway-token"}
TENANTS = f"""
[tenants.acme]
password = "{PASSWORDS["acme"]}"

[tenants.acme.tokens."{TOKENS["acme"]}"]
workspace = "app"

[tenants.evil]
password = "{PASSWORDS["evil"]}"
bridges = true

[tenants.evil.tokens."{TOKENS["evil"]}"]
workspace = "shared"
scope = "tenant"
"""
FORGED = b'{"ok":false,"error":{"code":"DENIED","message":"PWNED: forged by evil"}}'


pytestmark = pytest.mark.up(tenants=TENANTS)


def system_password(up: Up) -> str:
    conf = (up.data / "nats" / "nats-server.conf").read_text()
    found = re.search(r'user: "quill-system", password: "([^"]+)"', conf)
    assert found is not None
    return found.group(1)


@asynccontextmanager
async def connections(up: Up) -> AsyncIterator[tuple[NATS, NATS, Refusals]]:
    """The services' user (a spy that sees every subject) and the attacker, evil."""
    refusals = Refusals(whole=True)
    system = await nats.connect(up.nats_url, user="quill-system", password=system_password(up))
    evil = await bare_as(up, "evil", PASSWORDS["evil"], error_cb=refusals.on_error)
    try:
        yield system, evil, refusals
    finally:
        await evil.close()
        await system.close()


async def workspace_of(up: Up, tenant: str, name: str) -> None:
    async with await Quill.connect(
        up.nats_url, user=tenant, password=PASSWORDS[tenant], actor=tenant
    ) as quill:
        ws = quill.workspace(f"{tenant}/{name}")
        await ws.create(exist_ok=True)
        await ws.write("README.md", f"{tenant}'s {name}\n")


async def forge(evil: NATS, reply: str) -> None:
    """Every way a bridge tenant had to publish ``FORGED`` (or a service's answer it chose)
    on ``reply``: a ping and a query the services answer there, its own request answered by
    itself (``allow_responses``), a JetStream direct get of a value it stored."""
    await evil.publish("ws.sys.ping", b"", reply=reply)
    path = json.dumps({"path": "PWNED-forged-by-evil.txt"}).encode()
    await evil.publish("ws.qry.evil.shared.read", path, reply=reply)
    await evil.publish("ws.exec.evil.forge.run", b'{"command": "true"}', reply=reply)
    await evil.publish("$KV.WS_BRIDGES.evil.forged", FORGED)
    await evil.flush()
    await evil.publish(
        "$JS.API.DIRECT.GET.KV_WS_BRIDGES.$KV.WS_BRIDGES.evil.forged", b"", reply=reply
    )
    await evil.flush()


async def test_a_forged_reply_never_resolves_another_tenants_request(up: Up) -> None:
    """acme's ``execute_command`` waits on a file while evil, told the exact reply subject
    the gateway uses (better than any guess), sends its forgeries there; then the command is
    released and acme gets its own output."""
    await workspace_of(up, "acme", "app")
    await workspace_of(up, "evil", "shared")
    gate = Gate()
    command = f"{gate.wait}; echo real-output"
    async with connections(up) as (system, evil, _):
        asked: asyncio.Queue[str] = asyncio.Queue()

        async def spy(msg: Msg) -> None:
            await asked.put(msg.reply)

        await system.subscribe("ws.exec.acme.app.run", cb=spy)

        async def answer_myself(msg: Msg) -> None:  # evil's "bridge" answers its own request
            await msg.respond(FORGED)

        await evil.subscribe("ws.exec.evil.forge.*", cb=answer_myself)
        await system.flush()
        await evil.flush()
        async with mcp_client(up.http_url, token=TOKENS["acme"]) as acme:
            call = asyncio.ensure_future(
                acme.call_tool("execute_command", {"command": command, "timeout_ms": 60_000})
            )
            reply = await asyncio.wait_for(asked.get(), 30)
            await forge(evil, reply)
            await system.flush()
            await gate.open()  # the command is running: release it
            result = await asyncio.wait_for(call, 60)
    shown = text(result)
    assert "PWNED" not in shown and "real-output" in shown, shown
    assert not result.is_error, shown


def tokens_of(replies: list[str]) -> list[str]:
    return [reply.rsplit(".", 1)[1] for reply in replies]


async def test_the_gateways_reply_subjects_are_the_tenants_own_and_unguessable(up: Up) -> None:
    """What evil sees of the gateway's requests on its own subjects is an inbox of its own,
    each request's token 128 random bits (none shares a prefix with the next, as a counter
    would), and nothing of the inbox acme's requests are answered on."""
    await workspace_of(up, "acme", "app")
    await workspace_of(up, "evil", "shared")
    async with connections(up) as (system, evil, _):
        seen_by_evil: list[str] = []
        of_acme: list[str] = []

        async def evil_sees(msg: Msg) -> None:
            seen_by_evil.append(msg.reply)

        async def spy(msg: Msg) -> None:
            of_acme.append(msg.reply)

        await evil.subscribe("ws.qry.evil.>", cb=evil_sees)
        await system.subscribe("ws.qry.acme.>", cb=spy)
        await evil.flush()
        await system.flush()
        async with httpx.AsyncClient(base_url=up.http_url, timeout=30) as http:
            for tenant in ("acme", "evil", "acme", "evil", "acme", "evil", "acme", "evil"):
                got = await http.get(
                    "/v1/host/workspace/files/README.md",
                    headers={"Authorization": f"Bearer {TOKENS[tenant]}"},
                )
                assert got.status_code == 200, got.text
        await evil.flush()
        await system.flush()
    assert len(seen_by_evil) >= 4 and len(of_acme) >= 4, (seen_by_evil, of_acme)
    assert all(r.startswith("_INBOX_evil.") for r in seen_by_evil), seen_by_evil
    assert all(r.startswith("_INBOX_acme.") for r in of_acme), of_acme
    evil_muxes = {r.rsplit(".", 1)[0] for r in seen_by_evil}
    assert not evil_muxes & {r.rsplit(".", 1)[0] for r in of_acme}
    tokens = tokens_of(seen_by_evil)
    for token in tokens:  # 22 base64url characters: 128 bits, from the OS' random source
        assert re.fullmatch(r"[A-Za-z0-9_-]{22,}", token), token
        assert len(base64.urlsafe_b64decode(token[:22] + "==")) == 16
    for one, other in zip(tokens, tokens[1:], strict=False):
        assert len(os.path.commonprefix([one, other])) < 8, (one, other)


async def test_a_bridge_tenant_publishes_nothing_past_its_inbox(up: Up) -> None:
    """evil names acme's log and the services' inbox as reply subjects of its own request
    (answered by itself), of a KV put and of a direct get: the server refuses each publish,
    and acme's log is what acme wrote."""
    await workspace_of(up, "acme", "app")
    async with connections(up) as (system, evil, refusals):
        js = system.jetstream()
        before = (await js.stream_info("WS_EVENTS", subjects_filter="ws.evt.acme.app")).state

        async def answer_myself(msg: Msg) -> None:
            await msg.respond(b'{"forged": "event"}')

        await evil.subscribe("ws.cmd.evil.forge.*", cb=answer_myself)
        await evil.flush()
        await evil.publish("ws.cmd.evil.forge.mkdir", b'{"path": "d"}', reply="ws.evt.acme.app")
        await evil.publish("$KV.WS_BRIDGES.evil.forged", b'{"forged": "event"}')
        await evil.publish(
            "$JS.API.DIRECT.GET.KV_WS_BRIDGES.$KV.WS_BRIDGES.evil.forged",
            b"",
            reply="ws.evt.acme.app",
        )
        await evil.flush()
        await refusals.wait("publish", "ws.evt.acme.app")
        await refusals.wait("publish", "$KV.WS_BRIDGES.evil.forged")
        await refusals.wait(
            "publish", "$JS.API.DIRECT.GET.KV_WS_BRIDGES.$KV.WS_BRIDGES.evil.forged"
        )
        after = (await js.stream_info("WS_EVENTS", subjects_filter="ws.evt.acme.app")).state
    assert (after.messages, after.last_seq) == (before.messages, before.last_seq)
    env = {"QUILL_NATS_USER": "quill-system", "QUILL_NATS_PASSWORD": system_password(up)}
    verified = up.cli("verify", "acme/app", check=False, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_pings_are_answered_only_into_the_pinging_tenants_inbox(up: Up) -> None:
    """A bridge tenant asks the services whether they see its claims on a subject naming it,
    answered into its own inbox only; the services' ping is not a tenant's to send."""
    async with connections(up) as (system, evil, refusals):
        stolen: list[Msg] = []

        async def collect(msg: Msg) -> None:
            stolen.append(msg)

        await system.subscribe("_INBOX_acme.>", cb=collect)
        await system.subscribe("_INBOX_quill-system.stolen.>", cb=collect)
        await system.flush()
        await evil.publish("ws.sys.ping", b"", reply="_INBOX_acme.stolen.1")
        await evil.publish("ws.sys.ping.writer", b"", reply="_INBOX_quill-system.stolen.2")
        await refusals.wait("publish", "ws.sys.ping")
        await refusals.wait("publish", "ws.sys.ping.writer")
        await evil.publish("ws.bridge.evil.seen", b"", reply="_INBOX_acme.stolen.3")
        # the services answer in order: once each answered evil's own, the first was refused
        inbox = "_INBOX_evil.seen"
        answers = await evil.subscribe(inbox)
        await evil.publish("ws.bridge.evil.seen", b"", reply=inbox)
        services = set()
        async with asyncio.timeout(20):
            while services != {"writer", "reader", "executor"}:
                pong = json.loads((await answers.next_msg(timeout=20)).data)
                assert pong["local_workspaces"] == 0, pong
                services.add(pong["service"])
        await system.flush()
    assert stolen == []


async def test_bridge_claims_have_a_per_tenant_quota(up: Up) -> None:
    """20,000 claims stored 62 MB in 0.3 s: a tenant no longer writes the bucket itself, and
    the claims the services store for it are counted: past the quota, a clear error."""
    async with connections(up) as (system, evil, refusals):
        big = json.dumps({"owner": "x" * 3900, "client": "c", "path": "/", "expires": 9e9})
        puts = [
            evil.request(f"$KV.WS_BRIDGES.evil.flood-{i}", big.encode(), timeout=2)
            for i in range(200)
        ]
        answered = await asyncio.gather(*puts, return_exceptions=True)
        stored = await system.jetstream().stream_info(
            "KV_WS_BRIDGES", subjects_filter="$KV.WS_BRIDGES.evil.>"
        )
        assert stored.state.messages == 0, (stored.state, answered[:1])
        await refusals.wait("publish", "$KV.WS_BRIDGES.evil.flood-0")
        claims = []
        for i in range(200):
            body = {"workspace": f"w{i}", "owner": f"bridge-{i}", "client": "c", "path": "/x"}
            msg = await evil.request("ws.bridge.evil.claim", json.dumps(body).encode(), timeout=10)
            claims.append(json.loads(msg.data))
            if not claims[-1]["ok"]:
                break
        refused = claims[-1]
        assert not refused["ok"], "no quota on claims"
        assert refused["error"]["code"] == "SIZE_LIMIT_EXCEEDED", refused
        assert "evil" in refused["error"]["message"], refused
        limit = refused["error"]["details"]["limit"]
        assert len(claims) == limit + 1 and limit <= 100, refused
        too_long = {"workspace": "long", "owner": "b", "client": "c", "path": "/" * 5000}
        msg = await evil.request("ws.bridge.evil.claim", json.dumps(too_long).encode(), timeout=10)
        assert json.loads(msg.data)["error"]["code"] == "INVALID_ARGUMENT"
        for i in range(limit):
            body = {"workspace": f"w{i}", "owner": f"bridge-{i}"}
            msg = await evil.request(
                "ws.bridge.evil.release", json.dumps(body).encode(), timeout=10
            )
            assert json.loads(msg.data)["ok"], msg.data
        kv = await system.jetstream().key_value("WS_BRIDGES")
        try:
            held = await kv.keys(filters=["evil.>"])
        except NoKeysError:
            held = []
    assert held == []


async def test_a_bridge_tenant_serves_its_folder_to_the_gateway(up: Up, tmp_path: Path) -> None:
    """``quill attach`` with a bridge tenant's credentials: claimed through the services,
    answered on the tenant's own inbox; the gateway reads the folder for evil, not for acme."""
    folder = tmp_path / "laptop"
    folder.mkdir()
    (folder / "hello.txt").write_text("from evil's laptop\n")
    env = {
        **os.environ,
        "QUILL_NATS_USER": "evil",
        "QUILL_NATS_PASSWORD": PASSWORDS["evil"],
        "QUILL_NATS_URL": up.nats_url,
    }
    env.pop("QUILL_NATS_INBOX", None)
    argv = [sys.executable, "-m", "quill", "attach", str(folder), "--as", "laptop"]
    argv += ["--tenant", "evil", "--client", "laptop", "--trust", "full"]
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        async with asyncio.timeout(60):
            while not any("quill attach ready" in line for line in lines):
                raw = await proc.stdout.readline()
                assert raw, "".join(lines)
                lines.append(raw.decode())
        async with mcp_client(up.http_url, token=TOKENS["evil"]) as as_evil:
            shown = await ok(as_evil, "read_file", path="hello.txt", workspace="laptop")
            assert "from evil's laptop" in shown
        async with mcp_client(up.http_url, token=TOKENS["acme"]) as as_acme:
            shown = await error(as_acme, "read_file", path="hello.txt", workspace="laptop")
            assert "from evil's laptop" not in shown
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
