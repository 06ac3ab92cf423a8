"""``quill up --tenants FILE``: two tenants, each with its NATS user and a gateway token, both
on a workspace named ``shared`` (b may also serve local workspaces: a bridge tenant). Tenant b
reaches nothing of tenant a's: not over NATS (the server refuses), not over REST or MCP (404,
the same answer as for what does not exist)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import nats
import nats.errors
import nkeys
import pytest

from quill_cli.natsserver import binary
from services.gateway.access import Principal, Tokens
from tests.gateway.support import error, mcp_client, ok
from tests.helpers import Refusals, subscribed
from tests.up import PASSWORDS, TENANTS, TOKENS, Up, bare_as, quill_as

pytestmark = pytest.mark.up(tenants=TENANTS)


def test_a_bad_tenants_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "tenants.toml"
    for text in ('[tenants.a]\npassword = "short"\n', "[tenants.a]\n", "tenants = 1\n", "[x"):
        bad.write_text(text)
        done = subprocess.run(
            [sys.executable, "-m", "quill", "up", "--data", str(tmp_path / "d"), "--tenants"]
            + [str(bad)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done
        assert done.stderr.startswith("quill: ") and done.stderr.count("\n") == 1, done.stderr
        assert not (tmp_path / "d").exists()  # refused before anything started


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_credentials_stay_off_the_command_line(up: Up) -> None:
    conf = up.data / "nats" / "nats-server.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    system = re.search(r'user: "quill-system", password: "([^"]+)"', conf.read_text())
    assert system is not None
    secrets = [system.group(1), *PASSWORDS.values(), *TOKENS.values()]
    assert up.process is not None
    processes = descendants(up.process.pid)
    assert len(processes) >= 5  # nats-server, writer, reader, executor, gateway
    services = 0
    for pid in [up.process.pid, *processes]:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert not [s for s in secrets if s.encode() in b" ".join(argv)], argv
        if pid != up.process.pid and argv[1:3] == [b"-m", b"quill"]:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"QUILL_NATS_USER=quill-system" in environ  # the services' user
            services += 1
    assert services == 4


async def test_a_tenant_uses_its_workspace_with_the_sdk_and_the_cli(up: Up) -> None:
    async with await quill_as(up, "b") as quill:
        ws = quill.workspace("b/shared")
        updates = ws.watch()
        first = asyncio.ensure_future(anext(updates))
        await subscribed(quill.nc, quill.subjects.updated("b", "shared"))  # before the write
        await ws.write("notes.md", "b's notes\n")
        assert (await asyncio.wait_for(first, 10)).version == ws.last_version
        await updates.aclose()
        assert await ws.read_text("notes.md") == "b's notes\n"
    env = {**os.environ, "QUILL_NATS_URL": up.nats_url, "QUILL_NATS_PASSWORD": PASSWORDS["b"]}
    env.pop("QUILL_NATS_USER", None)
    done = subprocess.run(
        [sys.executable, "-m", "quill", "--nats-user", "b", "cat", "b/shared", "notes.md"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "b's notes\n"), done.stderr


async def test_the_server_refuses_b_on_a(up: Up) -> None:
    refusals = Refusals(whole=True)
    nb = await bare_as(up, "b", error_cb=refusals.on_error, allow_reconnect=False)
    try:
        await nb.subscribe("ws.updated.a.>")
        await nb.subscribe("_INBOX_a.>")
        ask = nb.request("ws.qry.a.shared.read", b'{"path": "notes.md"}', timeout=2)
        asking = asyncio.ensure_future(ask)
        await refusals.wait("subscription", "ws.updated.a.>", timeout=5)
        await refusals.wait("subscription", "_INBOX_a.>", timeout=5)
        await refusals.wait("publish", "ws.qry.a.shared.read", timeout=5)
        with pytest.raises(nats.errors.TimeoutError):
            await asking
    finally:
        await nb.close()


async def test_rest_and_mcp_across_tenants_are_404(up: Up) -> None:
    async with await quill_as(up, "a") as quill:
        await quill.workspace("a/private").create(exist_ok=True)
        await quill.workspace("a/private").write("secret.txt", "a's secret\n")
    files = f"{up.http_url}/v1/host/workspace/files"
    as_a = {"Authorization": f"Bearer {TOKENS['a']}"}
    as_b = {"Authorization": f"Bearer {TOKENS['b']}"}
    async with httpx.AsyncClient(timeout=30) as http:
        put = await http.put(f"{files}/secret.txt", json={"content": "a's secret\n"}, headers=as_a)
        assert put.status_code == 200, put.text
        assert (await http.get(f"{files}/secret.txt", headers=as_a)).status_code == 200
        # b's token reaches b/shared: the same name, another tenant's workspace
        missing = await http.get(f"{files}/secret.txt", headers=as_b)
        assert (missing.status_code, missing.json()) == (404, {"error": "not_found"})
        listing = (await http.get(files, headers=as_b)).json()
        assert "secret" not in json.dumps(listing)
    async with mcp_client(up.http_url, token=TOKENS["b"]) as b:
        assert (await error(b, "read_file", path="secret.txt")).startswith("Error: File not found")
        other = await error(b, "read_file", path="secret.txt", workspace="private")  # a's name
        nowhere = await error(b, "read_file", path="secret.txt", workspace="nowhere")
        assert other.replace("private", "X") == nowhere.replace("nowhere", "X")
        assert "a's secret" not in await ok(b, "list_directory", path=".")


OPERATIONS = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
SECTION = OPERATIONS[OPERATIONS.index("## Tenants") : OPERATIONS.index("## Health and metrics")]


def fenced(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", SECTION, re.S)


def test_the_operations_examples_are_what_quill_makes(tmp_path: Path) -> None:
    """docs/operations.md, Tenants: the file is valid, ``quill nats-auth`` prints the block the
    page shows, the cluster configuration with it is one nats-server accepts, and the nkey
    one-liner makes a seed and its public key."""
    tenants_file = tmp_path / "tenants.toml"
    tenants_file.write_text(fenced("toml")[0])
    tokens = Tokens.load(tenants_file)
    assert tokens.find("acme-agents-token") == Principal("acme", "agents", actor="research-agent")
    command = next(b for b in fenced("bash") if "quill nats-auth" in b).strip()
    password = re.search(r"QUILL_NATS_PASSWORD='([^']+)'", command)
    assert password is not None
    env = {**os.environ, "QUILL_NATS_PASSWORD": password.group(1)}
    done = subprocess.run(
        [sys.executable, "-m", "quill", "nats-auth", str(tenants_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    block, server = fenced("text")[:2]
    assert (done.returncode, done.stdout) == (0, block), done.stderr
    (tmp_path / "auth.conf").write_text(block)
    (tmp_path / "n1.conf").write_text(server)
    check = subprocess.run(
        [str(binary()), "-c", "n1.conf", "-t"], cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    one_liner = next(b for b in fenced("bash") if "nkeys" in b).strip()
    made = subprocess.run(
        ["bash", "-c", one_liner.replace("python ", f"{sys.executable} ", 1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    seed = (tmp_path / "globex.nk").read_bytes()
    assert made.stdout.strip() == nkeys.from_seed(bytearray(seed)).public_key.decode()
    assert re.fullmatch(r"U[A-Z2-7]{55}", made.stdout.strip())
