"""Who an MCP call is from, when no token says: the client's ``clientInfo.name``, and its
session.

Without tokens every caller is the same principal (``ANONYMOUS``, actor ``local``), so the log
and the audit could not tell two agents apart. An MCP client names itself (``clientInfo``): a
2026-07-28 client in every request's ``_meta`` (the SDK gives it as the connection's
``client_params``); a handshake-era client only in ``initialize``, and the endpoints are
stateless. So the gateway answers ``initialize`` with an ``Mcp-Session-Id`` that carries the
name (``mcp-<unique>-<name, base64url>``, made and read here: the gateway keeps nothing, and
any worker reads it), and such a client sends it with each request after (the transport's
rule). The call's actor is then the name, and its session the ``mcp-<unique>`` part; with a
token the actor stays the token's (a client's word is not an identity) and the session is
still recorded.

A name is a client's to choose: it becomes an actor (events, audit records, ``Ws-Actor``), so
it is bounded like one. Only printable characters are kept (line breaks, controls, bidi
overrides become spaces: a name cannot forge a header or a log line), runs of spaces are one,
at most ``NAME_MAX`` characters; a name that holds a registered secret is not used (every
command named after it would be refused); what is left empty is no name (``local``). A
session id that does not read (forged, cut, too long) names nobody: the call is ``local``'s.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import replace
from typing import Any

from nats.nuid import NUID

from infra.secret_registry import secrets_from_env
from services.gateway.access import Principal

NAME_MAX = 64
"""Characters of a client's name kept as its actor."""
RAW_MAX = 4 * NAME_MAX
"""Characters of a name looked at (the rest of a huge one is never read)."""
SESSION_HEADER = "mcp-session-id"
_SESSION = re.compile(r"mcp-([A-Za-z0-9]{22})-([A-Za-z0-9_-]{1,120})\Z")
_nuid = NUID()


def bounded(raw: object) -> str | None:
    """A client's name as an actor (see the module docstring), None for no usable name."""
    if not isinstance(raw, str):
        return None
    kept = "".join(ch if ch.isprintable() else " " for ch in raw[:RAW_MAX])
    name = " ".join(kept.split())[:NAME_MAX].strip()
    if not name or secrets_from_env().find(name):
        return None
    return name


def session_id(name: object) -> str | None:
    """The ``Mcp-Session-Id`` to answer an ``initialize`` with: a new session that carries the
    client's name (None for no usable name)."""
    kept = bounded(name)
    if kept is None:
        return None
    encoded = base64.urlsafe_b64encode(kept.encode()).rstrip(b"=").decode()
    return f"mcp-{_nuid.next().decode()}-{encoded}"


def from_session(header: str | None) -> tuple[str, str] | None:
    """``(session, name)`` from an ``Mcp-Session-Id`` this gateway made, else None."""
    found = _SESSION.match(header or "")
    if found is None:
        return None
    encoded = found.group(2)
    try:
        text = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    name = bounded(text)
    return None if name is None else (f"mcp-{found.group(1)}", name)


def client_info_name(ctx: Any) -> str | None:
    """The ``clientInfo.name`` a 2026-07-28 request carried (its connection's)."""
    try:
        params = ctx.request_context.session.client_params
    except (AttributeError, LookupError, ValueError):
        return None
    info = getattr(params, "client_info", None)
    return bounded(getattr(info, "name", None))


def caller(principal: Principal, ctx: Any, headers: Any) -> Principal:
    """The principal of an MCP call: without tokens (``anywhere``), acting as the client's
    name in its session; with a token, as the token's actor (in its session)."""
    session = from_session(headers.get(SESSION_HEADER) if headers is not None else None)
    name = session[1] if session is not None else client_info_name(ctx)
    if principal.anywhere and name is not None:
        principal = replace(principal, actor=name)
    if session is not None:
        principal = replace(principal, session=session[0])
    return principal
