"""Tenants isolated by NATS itself (RFC 0059 WCT-1): the tenants file, and the server
authorization it becomes.

One TOML file configures each tenant: its NATS credentials, and the gateway's bearer tokens
that reach its workspaces (read by ``services/gateway/access.py: Tokens``)::

    [tenants.acme]
    password = "acme-nats-password"     # NATS user "acme"

    [tenants.acme.tokens."acme-agents-token-1"]
    workspace = "agents"

    [tenants.globex]
    nkey = "UD..."                      # an nkey user instead: globex keeps the seed
    bridges = true                      # may serve local workspaces (quill attach)

``authorization()`` writes the server's ``authorization`` block: a system user for the
services, with every right, and one user per tenant with ``permissions()``. All users share
one account (the server's global one): the streams, their data and the services' view of every
tenant stay as they are without ``--tenants``, and bridges answer on the same subjects the
services use. Isolation comes from the permissions, each tenant's own inbox prefix, and
services that never reply outside an inbox (``infra.bus.reply_allowed``).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.errors import QuillError
from contracts.subjects import (
    QUEUE_EXECUTOR,
    QUEUE_READER,
    QUEUE_WRITER,
    check_id,
)
from quill.credentials import DEFAULT_INBOX, SYSTEM_USER

MIN_PASSWORD = 12
_NKEY_USER = re.compile(r"U[A-Z2-7]{55}\Z")
_PRINTABLE = re.compile(r"[\x20-\x7e]+\Z")
_KEYS = {"password", "nkey", "bridges", "tokens"}


@dataclass(frozen=True)
class Tenant:
    """One tenant's NATS identity: a user named after it with a password, or an nkey."""

    name: str
    password: str | None = None
    nkey: str | None = None
    """The public nkey (``U...``) of an nkey user."""
    bridges: bool = False
    """May serve local workspaces: answer its own requests, have names claimed for them."""

    @property
    def inbox(self) -> str:
        """The only inbox prefix the tenant may subscribe to."""
        return f"{DEFAULT_INBOX}_{self.name}"


def load(path: Path) -> list[Tenant]:
    """Read a tenants file (its ``tokens`` tables are the gateway's business).

    Raises:
        ValueError: the file is missing, not TOML, or a table is malformed (one line).
    """
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read tenants file {path}: {exc}") from None
    tables = data.get("tenants")
    if not isinstance(tables, dict) or not tables:
        raise ValueError(f"{path}: no [tenants.<tenant>] tables")
    unknown = sorted(set(data) - {"tenants", "tokens"})
    if unknown:
        raise ValueError(f"{path}: unknown top-level keys {unknown}")
    return [_tenant(f"{path}: [tenants.{name}]", name, table) for name, table in tables.items()]


def _tenant(where: str, name: str, table: Any) -> Tenant:
    try:
        check_id("tenant", name)
    except QuillError as exc:
        raise ValueError(f"{where}: {exc.message}") from None
    if name == SYSTEM_USER:
        raise ValueError(f"{where}: {SYSTEM_USER} is the services' user, not a tenant")
    if not isinstance(table, dict) or set(table) - _KEYS:
        raise ValueError(f"{where}: takes password or nkey, bridges, and tokens tables")
    password, nkey = table.get("password"), table.get("nkey")
    if (password is None) == (nkey is None):
        raise ValueError(f"{where}: needs password = or nkey = (one of them)")
    if password is not None and not (
        isinstance(password, str) and len(password) >= MIN_PASSWORD and _PRINTABLE.match(password)
    ):
        raise ValueError(
            f"{where}: password must be at least {MIN_PASSWORD} printable ASCII characters"
        )
    if nkey is not None and not (isinstance(nkey, str) and _NKEY_USER.match(nkey)):
        raise ValueError(f"{where}: nkey must be a user's public nkey (U and 55 more characters)")
    bridges = table.get("bridges", False)
    if not isinstance(bridges, bool):
        raise ValueError(f"{where}: bridges must be true or false")
    return Tenant(name, password=password, nkey=nkey, bridges=bridges)


def permissions(tenant: Tenant, root: str = "ws") -> dict[str, Any]:
    """What a tenant's NATS user may do: everything else is refused by the server.

    * publish requests on its own ``<root>.{cmd,qry,exec}.<tenant>.>`` (nothing else: not
      the log ``<root>.evt``, nor audit records, nor any ``$JS.API``), but
      ``cmd.request_approval``, the executors' alone;
    * subscribe to its own inboxes, ``<root>.updated/audit/execout.<tenant>.>``;
    * with ``bridges``, also serve its own requests (subscribe to them, not in the
      services' queue groups), answer them into its own inbox (``_INBOX_<tenant>.>``: the
      services answer a tenant's requests nowhere else, the gateway's for the tenant
      included, ``infra/bus.py: reply_allowed``), publish ``updated``/``execout`` for them,
      and ask the services about its claims (``<root>.bridge.<tenant>.*``,
      ``infra/claims.py``).

    Nothing else: no ``allow_responses`` (it let a bridge tenant answer its own request on
    any reply subject it named: another tenant's inbox, another tenant's log), no ``$KV``
    nor JetStream subject (JetStream answers on any reply subject it is given), no
    ``<root>.sys.ping`` (a ping names no tenant: the services' own, answered anywhere).
    """
    t = tenant.name
    requests = [f"{root}.{kind}.{t}.>" for kind in ("cmd", "qry", "exec")]
    # On a cluster the servers check a command's permission after mapping it to its
    # partition (contracts/subjects.py); writers refuse one sent to the wrong partition.
    mapped = f"{root}.cmdp.*.{t}.>"
    publish = [*requests, mapped]
    subscribe = [
        f"{tenant.inbox}.>",
        f"{root}.updated.{t}.>",
        f"{root}.audit.{t}.>",
        f"{root}.execout.{t}.>",
    ]
    # Only the executors ask for a command's approval (``cmd.request_approval``): a tenant
    # that could would name what an approver is shown (the writer also derives it from the
    # command kept, ``infra/approvals.py``).
    asks = [f"{root}.cmd.{t}.*.request_approval", f"{root}.cmdp.*.{t}.*.request_approval"]
    perms: dict[str, Any] = {
        "publish": {"allow": publish, "deny": asks},
        "subscribe": {"allow": subscribe},
    }
    if tenant.bridges:
        publish += [
            f"{tenant.inbox}.>",
            f"{root}.updated.{t}.>",
            f"{root}.execout.{t}.>",
            f"{root}.bridge.{t}.*",
        ]
        subscribe += [*requests, mapped]
        queues = (QUEUE_WRITER, QUEUE_READER, QUEUE_EXECUTOR)
        perms["subscribe"]["deny"] = [
            *(f"{s} {q}" for s, q in zip(requests, queues, strict=True)),
            f"{mapped} {QUEUE_WRITER}",
        ]
    return perms


def authorization(tenants: Sequence[Tenant], system_password: str, root: str = "ws") -> str:
    """The server configuration's ``authorization`` block for ``tenants``."""
    lines = ["authorization {", "  users = [", f"    {_system(system_password)}"]
    for tenant in tenants:
        who = (
            f"user: {_quote(tenant.name)}, password: {_quote(tenant.password)}"
            if tenant.password is not None
            else f"nkey: {_quote(tenant.nkey or '')}"
        )
        lines.append(f"    {{{who}, permissions: {{")
        for key, value in permissions(tenant, root).items():
            lines += _entry(key, value, "      ")
        lines.append("    }}")
    lines += ["  ]", "}"]
    return "".join(f"{line}\n" for line in lines)


def _system(password: str) -> str:
    return f"{{user: {_quote(SYSTEM_USER)}, password: {_quote(password)}}}"


def _entry(key: str, value: Any, indent: str) -> list[str]:
    """``key: value`` as configuration lines, a list one item a line when it is long."""
    if isinstance(value, bool):
        return [f"{indent}{key}: {'true' if value else 'false'}"]
    if isinstance(value, dict):
        inner = [line for k, v in value.items() for line in _entry(k, v, indent + "  ")]
        return [f"{indent}{key}: {{", *inner, f"{indent}}}"]
    items = [_quote(item) for item in value]
    line = f"{indent}{key}: [{', '.join(items)}]"
    if len(line) <= 96:
        return [line]
    return [f"{indent}{key}: [", *(f"{indent}  {item}," for item in items), f"{indent}]"]


def _quote(text: str) -> str:
    """A double-quoted string for nats-server's configuration (literal ``$``, escaped
    ``"`` and ``\\``; it knows no other escapes, so only printable ASCII is accepted)."""
    assert _PRINTABLE.match(text), "only printable ASCII in the server configuration"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
