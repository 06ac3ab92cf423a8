"""``quill token add/list/revoke`` on the tokens file of a running gateway, which follows
the file without a restart."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from quill_cli.commands.tokens import token_id
from tests.up import Up


def quill(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "quill", *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 or not check, r.stderr
    return r


def add(tokens: Path, workspace: str, *more: str) -> tuple[str, str]:
    """A new token and its id."""
    made = json.loads(
        quill("token", "add", "--file", str(tokens), workspace, *more, "--json").stdout
    )
    return made["token"], made["id"]


def status(up: Up, token: str) -> int:
    request = urllib.request.Request(
        f"{up.http_url}/v1/host/workspace/files", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def test_tokens_added_and_revoked_while_the_gateway_runs(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    first, first_id = add(tokens, "acme/demo")
    assert tokens.stat().st_mode & 0o777 == 0o600
    up = Up(tmp_path / ".quill", args=("--tokens", str(tokens))).start()
    try:
        assert status(up, first) == 200
        second, second_id = add(tokens, "acme/other", "--scope", "tenant", "--actor", "bot")
        assert status(up, second) == 200  # no restart
        listed = quill("token", "list", "--file", str(tokens)).stdout
        assert first not in listed and second not in listed
        assert first_id in listed and f"{second_id}  acme/other  tenant     bot" in listed

        done = quill("token", "revoke", "--file", str(tokens), first_id)
        assert done.stdout == f"revoked 1 token ({first_id}) in {tokens}\n"
        assert status(up, first) == 401
        assert status(up, second) == 200

        last = quill("token", "revoke", "--file", str(tokens), second_id, check=False)
        assert last.returncode == 2 and "without tokens" in last.stderr
        tokens.write_text(tokens.read_text() + "[tokens.broken\n")  # a bad hand edit
        assert status(up, second) == 200  # the tokens read last stay
        assert tokens.stat().st_mode & 0o777 == 0o600
    finally:
        up.stop()


def test_token_commands_refuse_what_the_gateway_would(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    bad = quill("token", "add", "--file", str(tokens), "Acme/../x", check=False)
    assert bad.returncode == 2 and not tokens.exists()
    _, one = add(tokens, "acme/demo")
    for wrong in ("zz", "../../etc", "0" * 64):
        assert quill("token", "revoke", "--file", str(tokens), wrong, check=False).returncode == 2
    inline = tmp_path / "inline.toml"
    inline.write_text('tokens = { "an-inline-token" = { tenant = "a", workspace = "b" } }\n')
    before = inline.read_text()
    refused = quill("token", "add", "--file", str(inline), "acme/demo", check=False)
    assert refused.returncode == 2 and "twice" in refused.stderr  # checked as the gateway reads
    r = quill("token", "revoke", "--file", str(inline), token_id("an-inline-token"), check=False)
    assert r.returncode == 2 and "edit it by hand" in r.stderr
    assert inline.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inline.toml", "tokens.toml"]
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\npassword = "acme-nats-password"\n')
    quill("token", "add", "--file", str(tenants), "acme/agents")
    assert "[tenants.acme.tokens." in tenants.read_text()
    assert quill("token", "add", "--file", str(tenants), "globex/x", check=False).returncode == 2
    assert one
