"""The tenants file, the permissions it becomes, credentials, and which replies services send."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.bus import reply_allowed
from quill.credentials import NatsAuth
from quill_cli import tenants
from services.gateway.access import Principal, Tokens

NKEY = "UACRSXBF4BEWKK76Q5QP6M2RHIJ2ZDM6YKZWQLDYHEE7O6M3VMJHUORF"
GOOD = f"""
[tenants.acme]
password = "acme-nats-password"

[tenants.acme.tokens."acme-agents-token-1"]
workspace = "agents"
actor = "research-agent"

[tenants.globex]
nkey = "{NKEY}"
bridges = true
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    return path


def test_a_tenants_file_names_users_and_tokens(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert tenants.load(path) == [
        tenants.Tenant("acme", password="acme-nats-password"),
        tenants.Tenant("globex", nkey=NKEY, bridges=True),
    ]
    tokens = Tokens.load(path)
    assert tokens.find("acme-agents-token-1") == Principal("acme", "agents", actor="research-agent")
    assert tokens.principals() == [Principal("acme", "agents", actor="research-agent")]


def test_a_tenants_file_without_tokens_admits_no_one_at_the_gateway(tmp_path: Path) -> None:
    assert (
        Tokens.load(write(tmp_path, '[tenants.a]\npassword = "123456789012"\n')).principals() == []
    )


BAD = {
    "": "no [tenants.<tenant>] tables",
    "[x": "cannot read tenants file",
    "tenants = 1": "no [tenants.<tenant>] tables",
    '[other]\n[tenants.a]\npassword = "123456789012"': "unknown top-level keys ['other']",
    '[tenants.Acme]\npassword = "123456789012"': "Invalid tenant id 'Acme'",
    '[tenants.quill-system]\npassword = "123456789012"': "quill-system is the services' user",
    "[tenants.a]": "needs password = or nkey = (one of them)",
    f'[tenants.a]\npassword = "123456789012"\nnkey = "{NKEY}"': "needs password = or nkey =",
    '[tenants.a]\npassword = "short"': "password must be at least 12 printable ASCII",
    '[tenants.a]\npassword = "tab\\tinside-password"': "printable ASCII",
    '[tenants.a]\npassword = "café-password-123"': "printable ASCII",
    '[tenants.a]\nnkey = "SUAxxx"': "nkey must be a user's public nkey",
    '[tenants.a]\npassword = "123456789012"\nbridges = "yes"': "bridges must be true or false",
    '[tenants.a]\npassword = "123456789012"\nuser = "x"': "takes password or nkey, bridges",
}


@pytest.mark.parametrize("text", BAD)
def test_a_bad_tenants_file_is_one_line(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as refused:
        tenants.load(path)
    assert BAD[text] in str(refused.value)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


def test_tokens_of_a_tenant_name_no_other_tenant(tmp_path: Path) -> None:
    text = GOOD + '\n[tenants.globex.tokens."globex-token-1"]\ntenant = "acme"\nworkspace = "x"\n'
    with pytest.raises(ValueError, match="the tenant is globex: drop tenant ="):
        Tokens.load(write(tmp_path, text))


def test_a_tenant_may_use_only_its_own_subjects() -> None:
    perms = tenants.permissions(tenants.Tenant("acme", password="x" * 12))
    assert perms == {
        # ws.cmdp: a command after a cluster's servers mapped it to its partition
        "publish": {
            "allow": ["ws.cmd.acme.>", "ws.qry.acme.>", "ws.exec.acme.>", "ws.cmdp.*.acme.>"],
            # what an approver is shown of a command is the executors' to ask
            "deny": ["ws.cmd.acme.*.request_approval", "ws.cmdp.*.acme.*.request_approval"],
        },
        "subscribe": {
            "allow": ["_INBOX_acme.>", "ws.updated.acme.>", "ws.audit.acme.>", "ws.execout.acme.>"]
        },
    }


def test_a_bridge_tenant_also_serves_its_own_requests() -> None:
    perms = tenants.permissions(tenants.Tenant("g", nkey=NKEY, bridges=True), root="r")
    # its answers go into its own inbox only; its claims are a writer's to store
    # (infra/claims.py): no $KV, no JetStream, no ping of the services (issue 28)
    assert perms["publish"]["allow"][3:] == [
        "r.cmdp.*.g.>",
        "_INBOX_g.>",
        "r.updated.g.>",
        "r.execout.g.>",
        "r.bridge.g.*",
    ]
    assert perms["subscribe"]["allow"][4:] == [
        "r.cmd.g.>",
        "r.qry.g.>",
        "r.exec.g.>",
        "r.cmdp.*.g.>",
    ]
    assert perms["subscribe"]["deny"] == [
        "r.cmd.g.> quill-writer",
        "r.qry.g.> quill-reader",
        "r.exec.g.> quill-executor",
        "r.cmdp.*.g.> quill-writer",
    ]
    assert "allow_responses" not in perms  # an answer to its own request went anywhere


def test_the_authorization_block_quotes_what_it_must() -> None:
    block = tenants.authorization(
        [tenants.Tenant("a", password='pa"ss\\word$HOME'), tenants.Tenant("g", nkey=NKEY)],
        "system-password",
    )
    assert block.startswith("authorization {\n  users = [\n")
    assert '{user: "quill-system", password: "system-password"}' in block
    assert '{user: "a", password: "pa\\"ss\\\\word$HOME", permissions: {' in block
    assert f'{{nkey: "{NKEY}", permissions: {{' in block
    assert block.count("permissions:") == 2


def test_credentials_default_to_the_users_own_inbox() -> None:
    assert NatsAuth().inbox == "_INBOX" and NatsAuth().options() == {"inbox_prefix": "_INBOX"}
    acme = NatsAuth("acme", "pw")
    assert acme.options() == {"inbox_prefix": "_INBOX_acme", "user": "acme", "password": "pw"}
    assert NatsAuth("a.b c", "pw").inbox == "_INBOX"  # not a subject token
    assert NatsAuth(nkey_seed="/k", inbox_prefix="_INBOX_g").options() == {
        "inbox_prefix": "_INBOX_g",
        "nkeys_seed": "/k",
    }
    env = {"QUILL_NATS_USER": "acme", "QUILL_NATS_PASSWORD": "pw", "QUILL_NATS_INBOX": "_I"}
    assert NatsAuth.from_env(env) == NatsAuth("acme", "pw", None, "_I")
    assert NatsAuth.from_env(env).environ() == env
    for incomplete in (NatsAuth("acme"), NatsAuth(password="pw"), NatsAuth("a", "p", "/k")):
        with pytest.raises(ValueError):
            incomplete.options()


REPLIES = [
    ("_INBOX_acme.abc.def", True, True),
    ("_INBOX.abc.def", True, False),
    ("my-app.replies.1", True, False),
    ("_INBOX_acme", True, False),
    ("$JS.API.STREAM.DELETE.WS_EVENTS", False, False),
    ("$KV.WS_BRIDGES.a.w", False, False),
    ("$SYS.REQ.SERVER.PING", False, False),
    ("ws.evt.other.w", False, False),
    ("ws.cmd.other.w.write", False, False),
    ("_INBOX_globex.abc.def", False, False),  # another tenant's inbox
    ("_INBOX_acme-x.abc.def", False, False),  # another tenant's, the same start
    ("_INBOX_quill-system.abc", True, False),  # the services' own: not acme's to name
]


@pytest.mark.parametrize(("reply", "open_server", "tenants"), REPLIES)
def test_services_reply_only_to_the_tenants_inbox(
    reply: str, open_server: bool, tenants: bool
) -> None:
    """Without tenants (a service of an open server), any inbox but another tenant's; under
    ``--tenants`` (the services' user), acme's request is answered into acme's inbox only."""
    for subject in ("ws.qry.acme.w.read", "ws.cmdp.3.acme.w.write", "ws.bridge.acme.claim"):
        assert reply_allowed(subject, reply, "_INBOX") is open_server, subject
        assert reply_allowed(subject, reply, "_INBOX_quill-system") is tenants, subject


def test_the_services_own_subjects_are_answered_in_any_inbox() -> None:
    """A ping, a replica's query: no tenant may publish them (only the services' user)."""
    assert reply_allowed("ws.sys.ping", "_INBOX_quill-system.x", "_INBOX_quill-system")
    services = "_INBOX_quill-system"
    assert reply_allowed("ws.replica.r1.acme.w.read", f"{services}.x", services)
    assert not reply_allowed("ws.sys.ping", "$JS.API.STREAM.DELETE.WS_EVENTS", None)
